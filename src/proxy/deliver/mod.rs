//! The deliver step of the pipeline, rangeway's one delivery engine: the client's answer written
//! — its header once, its body the one way chosen for it (`BodyWay::choose`, transport.rs):
//! spliced from the origin's socket to the client's (kernel.rs, splice.rs), sent from the cache's
//! files (kernel.rs), or read and copied through the transform step, paced on a shaped route
//! (pace.rs). What a body sent past the session's writer needs of the client connection — bytes
//! accounted, the unsent bound — is send_accounting.rs's. Every wait on the source ends when the
//! client goes.

mod kernel;
mod send_accounting;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::Method;
use pingora_error::{Error, Result};
use pingora_http::ResponseHeader;

use super::Proxy;
use super::client_session::{ClientSession, ClientWatch};
use super::context::RequestCtx;
use super::pace::Pacer;
use super::source::Sourced;
use super::source_body::{BodyReader, Piece, Pump, READ_BYTES, UpstreamBody};
use super::transport::{BodyWay, Transport};
use crate::routes::Route;

/// deliver's record of how the body went, for `record`.
#[derive(Debug, Default)]
pub(super) struct Delivered {
    /// On a route with a rate limit: how its body is paced.
    pub(super) pacer: Option<Pacer>,
    /// Body bytes that went to the client by splice(2) (pingora's writer is told of them after).
    pub(super) spliced: u64,
    /// The way the body went, once the deliver step chose it (see transport.rs).
    pub(super) transport: Option<Transport>,
    /// A stage whose stored index proved wrong, to be forgotten after the response.
    pub(super) forget_stage: Option<usize>,
}

impl Delivered {
    /// The way the answer took, for its access line and metrics: its body's, once chosen; before
    /// that, `Relay` for a request handed to its route (`routed`, as it is identified: a refusal
    /// of its download, an error of its source), `Pingora` for one answered before.
    pub(super) fn transport_taken(&self, routed: bool) -> Transport {
        match (self.transport, routed) {
            (Some(way), _) => way,
            (None, true) => Transport::Relay,
            (None, false) => Transport::Pingora,
        }
    }
}

/// The first bytes of a body the transform step has passed, held until the header goes out.
struct Held {
    chunks: Vec<Bytes>,
    /// The error the read after them failed with.
    pending: Option<Box<Error>>,
    /// They are the whole body.
    done: bool,
}

impl Proxy {
    /// Writes the client's answer, shaped in `ctx.answer`, with the source's body.
    pub(super) async fn deliver(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        route: &Arc<Route>,
        sourced: Sourced,
        watch: &ClientWatch,
    ) -> Result<()> {
        let Sourced { mut response, body, stream, continuable, base, policy, authorized } = sourced;
        let parts = std::mem::take(&mut ctx.answer.rest_parts).into();
        let mut pump = Pump::new(
            self,
            route,
            (stream, continuable, base, policy),
            parts,
            ctx.upstream.replica,
            authorized,
        );
        let head_only = session.req_header().method == Method::HEAD;
        self.pace(ctx, route, &mut response, head_only);
        if let Some(pacer) = &ctx.delivery.pacer {
            pump.read_max = pacer.step().min(READ_BYTES);
        }
        let (untouched, paced) = (ctx.answer.passes_body_untouched(), ctx.delivery.pacer.is_some());
        let way = BodyWay::choose(session, watch, untouched, paced, body.as_ref(), &response);
        ctx.delivery.transport = Some(way.transport());
        session.bound_unsent(way.by_kernel());
        match (way, body) {
            (
                BodyWay::Splice { client, len, pipe },
                Some(UpstreamBody::Origin { exchange, .. }),
            ) => {
                let spliced =
                    self.splice(session, ctx, response, (client, len, pipe), *exchange, pump);
                Box::pin(spliced).await
            }
            (BodyWay::Sendfile { client, len }, Some(UpstreamBody::Cache(cached))) => {
                Box::pin(self.send_files(session, ctx, response, (client, len), cached)).await
            }
            (_, Some(body)) if head_only => {
                session.write_header(Box::new(response), true).await?;
                body.release(&self.origin_client).await;
                Ok(())
            }
            (_, Some(body)) => self.copy(session, ctx, response, body, pump, watch).await,
            (_, None) => {
                // A cached answer without a body (HEAD, 304, 412, 416).
                let mut end = None;
                self.filter_body(&mut end, true, ctx)?;
                session.write_header(Box::new(response), end.is_none()).await?;
                if end.is_some() {
                    session.write_body(end, true).await?;
                }
                Ok(())
            }
        }
    }

    /// The route's pacer for this response, at the rate its limits and the origin's rate field
    /// allow; the origin's rate field is for rangeway, not the client.
    fn pace(
        &self,
        ctx: &mut RequestCtx,
        route: &Route,
        response: &mut ResponseHeader,
        head_only: bool,
    ) {
        let origin_header = route.rate_limit.as_ref().and_then(|l| l.origin_header.as_ref());
        let origin_rate = origin_header.and_then(|name| {
            let value = response.headers.get(name)?.to_str().ok()?.trim().parse::<u64>().ok();
            value.filter(|rate| *rate > 0)
        });
        if let Some(name) = origin_header {
            response.remove_header(name);
        }
        ctx.delivery.pacer = route.rate_limit.as_ref().filter(|_| !head_only).and_then(|limit| {
            let client = ctx.client.map(|client| client.ip);
            Pacer::new(limit, origin_rate, self.rates.of(&route.name, client, limit))
        });
    }

    /// Reads the body through the transform step and writes it to the client: the header once
    /// the first [`HOLD_BYTES`] passed (or all of the body), then every chunk as it comes, the
    /// body continued where it breaks.
    async fn copy(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        response: ResponseHeader,
        mut body: UpstreamBody,
        mut pump: Pump,
        watch: &ClientWatch,
    ) -> Result<()> {
        let Held { chunks, pending, done } =
            self.hold(session, ctx, &mut body, &mut pump, watch).await?;
        if done {
            // Pooled before the client hears of the end: its next request may want it.
            body.release(&self.origin_client).await;
            session.write_header(Box::new(response), false).await?;
            let out = chunks.len();
            if out == 0 {
                return session.write_body(None, true).await;
            }
            for (i, chunk) in chunks.into_iter().enumerate() {
                write_out(session, ctx, Some(chunk), i + 1 == out).await?;
            }
            return Ok(());
        }
        session.write_header(Box::new(response), false).await?;
        for chunk in chunks {
            write_out(session, ctx, Some(chunk), false).await?;
        }
        // The rest is read (and continued) by this task between its writes: a download holds the
        // chunk being written and no more (a reader of its own let ahead held three more); the
        // kernel's socket buffers still take the origin's bytes while the client's are written.
        let mut reader = BodyReader::new(pump, body, pending);
        // While the origin is slow the client is watched, as pingora's proxying watches it: one
        // that hangs up ends the response at once, so that its download is recorded before the
        // client can come back to resume it.
        loop {
            let piece = watch.unless_gone(session, reader.next()).await?;
            match piece {
                Piece::Chunk(chunk) => self.forward(session, ctx, Some(chunk), false).await?,
                Piece::Skip(to) => ctx.answer.skip_to(to)?,
                Piece::End => return self.forward(session, ctx, None, true).await,
                Piece::Broken(e) => return Err(e),
            }
        }
    }

    /// The first [`HOLD_BYTES`] of the body, or all of it, through the transform step: a small
    /// body it refuses (one failing its origin's digest) is then answered with an error status
    /// rather than a cut 200 — what pingora does with the header and body it reads in one go.
    async fn hold(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        body: &mut UpstreamBody,
        pump: &mut Pump,
        watch: &ClientWatch,
    ) -> Result<Held> {
        let mut chunks = Vec::new();
        let (mut held_len, mut pending) = (0, None);
        let done = loop {
            match watch.unless_gone(session, body.next_chunk(pump.read_max)).await? {
                Ok(Some(chunk)) => {
                    held_len += chunk.len();
                    chunks.push(chunk);
                    if body.done() {
                        break true;
                    }
                    if held_len >= HOLD_BYTES {
                        break false;
                    }
                }
                Ok(None) => break true,
                Err(e) => {
                    pending = Some(e);
                    break false;
                }
            }
        };
        // This exchange's body is all there is to the answer, unless more stretches follow.
        let done = done && pump.parts.is_empty();
        // Filtered in place: what the filter passes on takes the place of what it was given.
        let (count, mut kept) = (chunks.len(), 0);
        for i in 0..count {
            let mut chunk = Some(std::mem::take(&mut chunks[i]));
            self.filter_body(&mut chunk, done && i + 1 == count, ctx)?;
            if let Some(chunk) = chunk {
                chunks[kept] = chunk;
                kept += 1;
            }
        }
        chunks.truncate(kept);
        if done && count == 0 {
            // No body: the filter still sees the end (once).
            let mut end = None;
            self.filter_body(&mut end, true, ctx)?;
            chunks.extend(end);
        }
        pump.at += held_len as u64;
        Ok(Held { chunks, pending, done })
    }

    /// One chunk (or the end) through the body filter, then to the client.
    async fn forward(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        chunk: Option<Bytes>,
        end: bool,
    ) -> Result<()> {
        let mut body = chunk;
        self.filter_body(&mut body, end, ctx)?;
        if body.is_some() || end {
            write_out(session, ctx, body, end).await?;
        }
        Ok(())
    }
}

/// Writes `body` to the client: at once, or on a shaped route paced in steps (`pace.rs`). A traced
/// request counts the time the client held the writes up (pacing not included).
async fn write_out(
    session: &mut impl ClientSession,
    ctx: &mut RequestCtx,
    body: Option<Bytes>,
    end: bool,
) -> Result<()> {
    if ctx.delivery.pacer.is_none()
        && let Some(trace) = ctx.trace.as_mut()
    {
        let (began, len) = (Instant::now(), body.as_ref().map_or(0, Bytes::len));
        let written = session.write_body(body, end).await;
        trace.client_wrote(len, began.elapsed());
        return written;
    }
    let Some(pacer) = ctx.delivery.pacer.as_mut() else {
        return session.write_body(body, end).await;
    };
    let Some(mut body) = body else {
        return session.write_body(None, end).await;
    };
    while body.len() > pacer.step() {
        let step = body.split_to(pacer.step());
        pacer.wait(step.len()).await;
        session.write_body(Some(step), false).await?;
    }
    pacer.wait(body.len()).await;
    session.write_body(Some(body), end).await
}

/// How much of a body the relay reads before it sends the header (see `relay`).
const HOLD_BYTES: usize = 64 * 1024;
