//! Traces: OpenTelemetry spans for what a response costs, exported over OTLP/HTTP
//! (`[traces]`, off without it).
//!
//! rangeway's spans are `tracing` spans of the target [`TARGET`], bridged by
//! `tracing-opentelemetry` (`logging::init` installs the bridge only with traces on). Whether a
//! request is traced is decided once, when it arrives ([`Traces::start`]): by the client's
//! `traceparent` when it sent one (its sampled flag), else by the configured share. An untraced
//! request creates no span at all — with traces off or sampled out, the only cost is that
//! decision — so every span site below is `if let Some(..)` on the request's trace, or a macro
//! whose callsite no layer enables.
//!
//! The spans: `request` (the server span, from arrival to the access line), and under it
//! `store.lookup`, `store.record`, one `origin` span per request rangeway makes to an origin for
//! the response (pingora's, the relay's first, each continuation, each stretch, HEAD probes and
//! slice-cache fills) carrying the W3C `traceparent` it sends, `stages` (bytes in and out, the
//! time spent in them) and `cache.wait` (a reader waiting on a fill another request started).

mod export;

use std::cell::Cell;

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use pingora_http::RequestHeader;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

pub(crate) use export::{ENDPOINT_EXAMPLE, collector};
pub use export::{ExportError, Exporting, TracesConfig, flush, pipeline};

/// The target of every span rangeway makes for traces: the only spans the bridge sees.
pub const TARGET: &str = "rangeway::trace";

/// How requests are chosen for tracing: built once from `[traces]`.
#[derive(Debug, Clone, Copy)]
pub struct Traces {
    /// The share of requests without a `traceparent` that are traced.
    sampling: f64,
}

impl Traces {
    pub fn new(sampling: f64) -> Self {
        Self { sampling }
    }

    /// The `request` span of a request with these header fields, when it is traced: a child of
    /// the client's span when it sent a valid `traceparent` with its sampled flag, a new trace
    /// for the configured share of the others, `None` for the rest.
    pub(crate) fn start(&self, headers: &HeaderMap) -> Option<Span> {
        let parent = TraceContextPropagator::new().extract(&Fields(headers));
        let remote = parent.span().span_context().clone();
        let traced = match remote.is_valid() {
            true => remote.is_sampled(),
            false => chance() < self.sampling,
        };
        if !traced {
            return None;
        }
        let span = tracing::info_span!(
            target: TARGET,
            "request",
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            http.request.method = tracing::field::Empty,
            url.path = tracing::field::Empty,
            network.protocol.version = tracing::field::Empty,
            client.address = tracing::field::Empty,
            rangeway.route = tracing::field::Empty,
            rangeway.download_id = tracing::field::Empty,
            rangeway.range_asked = tracing::field::Empty,
            rangeway.range_served = tracing::field::Empty,
            rangeway.transport = tracing::field::Empty,
            rangeway.cache = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            http.response.body.size = tracing::field::Empty,
        );
        if remote.is_valid() {
            // Only fails when the bridge is not installed, and then nothing is exported anyway.
            let _ = span.set_parent(parent);
        }
        Some(span)
    }
}

/// `n` as a span attribute: OpenTelemetry's integers are signed (tracing's unsigned ones would
/// reach it as text).
pub(crate) fn int(n: impl Into<u64>) -> i64 {
    i64::try_from(n.into()).unwrap_or(i64::MAX)
}

/// Names the `request` span `name` (known only once routed, when the span may have begun: its
/// children's `traceparent` needed it) and gives its trace id in hex, for the access line; `None`
/// for a span the bridge does not know.
pub(crate) fn finish(span: &Span, name: &str) -> Option<String> {
    let context = span.context();
    let otel_span = context.span();
    otel_span.update_name(name.to_owned());
    let span_context = otel_span.span_context();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
}

/// Sets `traceparent` (and `tracestate`) of `request` to say it is made within `span`: called
/// before an S3 request is signed, and never signed itself (see `s3::sign`).
pub(crate) fn propagate(span: &Span, request: &mut RequestHeader) {
    let context = span.context();
    if context.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&context, &mut Setting(request));
    }
}

/// An `origin` span for `request`, made within `parent`, its `traceparent` set on `request`;
/// `Span::none()` when `parent` is not traced.
pub(crate) fn origin_attempt(
    parent: &Span,
    request: &mut RequestHeader,
    what: &'static str,
) -> Span {
    if parent.is_none() {
        return Span::none();
    }
    let range = request.headers.get(http::header::RANGE).and_then(|v| v.to_str().ok());
    let span = tracing::info_span!(
        target: TARGET,
        parent: parent,
        "origin",
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        rangeway.attempt = what,
        http.request.method = %request.method,
        url.path = request.uri.path(),
        http.request.header.range = range,
        http.response.status_code = tracing::field::Empty,
        rangeway.connection_reused = tracing::field::Empty,
        rangeway.connect_ms = tracing::field::Empty,
        rangeway.first_byte_ms = tracing::field::Empty,
        rangeway.bytes = tracing::field::Empty,
        rangeway.ended = tracing::field::Empty,
    );
    propagate(&span, request);
    span
}

/// The `[0, 1)` roll that decides whether a request without a `traceparent` is traced: a
/// xorshift of the thread's own, seeded once from the system's randomness (a sample needs no
/// cryptography, and the roll happens on every request).
fn chance() -> f64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut seed = [0u8; 8];
            let _ = getrandom::fill(&mut seed);
            u64::from_ne_bytes(seed) | 1
        });
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// A request's header fields, read by the propagator.
struct Fields<'a>(&'a HeaderMap);

impl Extractor for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A request being made, written by the propagator.
struct Setting<'a>(&'a mut RequestHeader);

impl Injector for Setting<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes only its own names (traceparent, tracestate) and valid values.
        let _ = self.0.insert_header(key.to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_s_sampled_flag_decides_and_the_share_decides_the_rest() {
        let none = Traces::new(0.0);
        let all = Traces::new(1.0);
        let mut headers = HeaderMap::new();
        assert!(none.start(&headers).is_none(), "none of the requests without a traceparent");
        assert!(all.start(&headers).is_some(), "all of them");
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00".parse().expect("a value"),
        );
        assert!(all.start(&headers).is_none(), "the client said not sampled");
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().expect("a value"),
        );
        assert!(none.start(&headers).is_some(), "the client said sampled");
        headers.insert("traceparent", "00-nonsense".parse().expect("a value"));
        assert!(none.start(&headers).is_none(), "an unreadable traceparent is none at all");
    }

    #[test]
    fn the_roll_is_spread_over_the_unit_interval() {
        let rolls: Vec<f64> = (0..10_000).map(|_| chance()).collect();
        assert!(rolls.iter().all(|r| (0.0..1.0).contains(r)));
        let low = rolls.iter().filter(|r| **r < 0.01).count();
        // 1 % of 10 000 is 100: a binomial's 5 standard deviations either side.
        assert!((50..=150).contains(&low), "{low} of 10 000 under 0.01");
    }
}
