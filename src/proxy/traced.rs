//! A traced request's spans as it goes through the phases (see `crate::traces`): the `request`
//! span, the first request to the origin, the stages' work, and the store's round trips.

use std::time::Duration;

use tracing::Span;
use tracing::field::Empty;

use crate::traces::{self, TARGET};

/// The spans of a request that is traced.
#[derive(Debug)]
pub(super) struct RequestTrace {
    /// The `request` span: from the request's arrival to its access line.
    pub(super) span: Span,
    stages: Option<StagesWork>,
    client_writes: Option<ClientWrites>,
}

/// The relay's writes of one response to its client: one span, from the first write to the
/// response's end.
#[derive(Debug)]
struct ClientWrites {
    span: Span,
    bytes: u64,
    blocked: Duration,
}

impl Drop for ClientWrites {
    fn drop(&mut self) {
        self.span.record("rangeway.bytes", traces::int(self.bytes));
        self.span.record("rangeway.blocked_ms", self.blocked.as_secs_f64() * 1000.0);
    }
}

/// The stages' work on one response: one span, from their first chunk to the response's end.
#[derive(Debug)]
struct StagesWork {
    span: Span,
    bytes_in: u64,
    bytes_out: u64,
    busy: Duration,
}

impl Drop for StagesWork {
    fn drop(&mut self) {
        self.span.record("rangeway.bytes_in", traces::int(self.bytes_in));
        self.span.record("rangeway.bytes_out", traces::int(self.bytes_out));
        self.span.record("rangeway.busy_ms", self.busy.as_secs_f64() * 1000.0);
    }
}

impl RequestTrace {
    pub(super) fn new(span: Span) -> Self {
        Self { span, stages: None, client_writes: None }
    }

    /// `bytes` were handed to the client's connection, which took `blocked` to take them.
    pub(super) fn client_wrote(&mut self, bytes: usize, blocked: Duration) {
        let parent = &self.span;
        let writes = self.client_writes.get_or_insert_with(|| ClientWrites {
            span: tracing::info_span!(
                target: TARGET,
                parent: parent,
                "client.write",
                rangeway.bytes = Empty,
                rangeway.blocked_ms = Empty,
            ),
            bytes: 0,
            blocked: Duration::ZERO,
        });
        writes.bytes += bytes as u64;
        writes.blocked += blocked;
    }

    /// The stages took `bytes_in`, gave `bytes_out`, and spent `busy` doing it.
    pub(super) fn stages_ran(&mut self, bytes_in: usize, bytes_out: usize, busy: Duration) {
        let parent = &self.span;
        let work = self.stages.get_or_insert_with(|| StagesWork {
            span: tracing::info_span!(
                target: TARGET,
                parent: parent,
                "stages",
                rangeway.bytes_in = Empty,
                rangeway.bytes_out = Empty,
                rangeway.busy_ms = Empty,
            ),
            bytes_in: 0,
            bytes_out: 0,
            busy: Duration::ZERO,
        });
        work.bytes_in += bytes_in as u64;
        work.bytes_out += bytes_out as u64;
        work.busy += busy;
    }
}

/// A round trip to the state store.
#[derive(Debug, Clone, Copy)]
pub(super) enum StoreCall {
    /// What the store knows of the download and the object, before the response.
    Lookup,
    /// What was sent, after it.
    Record,
}

/// A span for `call` within `trace`; `Span::none()` for a request that is not traced.
pub(super) fn store_span(trace: Option<&RequestTrace>, call: StoreCall) -> Span {
    let Some(trace) = trace else { return Span::none() };
    let name = match call {
        StoreCall::Lookup => "store.lookup",
        StoreCall::Record => "store.record",
    };
    tracing::info_span!(target: TARGET, parent: &trace.span, "store", otel.name = name)
}

/// The request span of `trace`, or `Span::none()`: what an origin request made within a phase
/// hangs under.
pub(super) fn request_span(trace: Option<&RequestTrace>) -> Span {
    trace.map_or_else(Span::none, |trace| trace.span.clone())
}
