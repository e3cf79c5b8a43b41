//! The transform step of the pipeline: each chunk of the source's body on its way to the
//! client — checked against the origin's own digest, through the route's stages, copied into the
//! cache's store of their output, cut to the client's range or parts — synchronously, and
//! without allocating on a passthrough route.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use pingora_error::{Error, ErrorType, Result};
use rangeway_middleware::chain::{ChainError, StageError};
use tracing::warn;

use super::Proxy;
use super::context::{BodyPlan, RequestCtx};
use super::origin_digest::ORIGIN_DIGEST_MISMATCH;
use super::traced::RequestTrace;
use crate::representation::ChainPass;

impl Proxy {
    /// `chunk` (or the end) through the stages: their output, or the error and the stage whose
    /// learned facts proved wrong (to be forgotten).
    fn run_stages(
        &self,
        pass: &mut ChainPass,
        chunk: Option<Bytes>,
        end_of_stream: bool,
        trace: Option<&mut RequestTrace>,
    ) -> std::result::Result<Option<Bytes>, (ChainError, Option<usize>)> {
        let stages_began =
            trace.as_ref().map(|_| (Instant::now(), chunk.as_ref().map_or(0, Bytes::len)));
        let out = off_the_event_loop(pass.blocks(), || {
            let out = match chunk {
                Some(chunk) => pass.push(chunk),
                None => Ok(None),
            };
            match (out, end_of_stream) {
                (Ok(out), true) => pass.finish().map(|tail| join(out, tail)),
                (out, _) => out,
            }
        });
        if let (Some(trace), Some((began, bytes_in))) = (trace, stages_began) {
            let bytes_out = out.as_ref().ok().and_then(Option::as_ref).map_or(0, Bytes::len);
            trace.stages_ran(bytes_in, bytes_out, began.elapsed());
        }
        out.map_err(|error| {
            let forget = match &error {
                ChainError::Stage { index, error: StageError::SegmentMismatch { .. }, .. } => {
                    Some(*index)
                }
                _ => None,
            };
            (error, forget)
        })
    }

    /// One chunk of the source's body (or its end) made into what the client gets, in place:
    /// checked against the origin's digest, through the route's stages (and into the cache's
    /// copy of their output), cut to what the client asked. An error cuts the response: the
    /// client gets a download to resume, never a wrong byte.
    pub(super) fn filter_body(
        &self,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let (Some(check), Some(chunk)) = (ctx.answer.origin_digest.as_mut(), body.as_ref())
            && check.check(chunk).is_err()
        {
            // The bytes are not the ones the origin vouched for: the last of them are withheld,
            // so the client sees a cut download to resume, never a complete wrong one.
            *body = None;
            let route = ctx.identity.route.as_ref().map_or("-", |r| r.name.as_str());
            self.metrics.origin_digest_mismatch(route);
            return Err(Error::explain(
                ErrorType::Custom(ORIGIN_DIGEST_MISMATCH),
                "the body does not match the digest its origin published",
            )
            .into_up());
        }
        if let Some(pass) = ctx.answer.pass.as_mut() {
            *body = self.run_stages(pass, body.take(), end_of_stream, ctx.trace.as_mut()).map_err(
                |(error, forget)| {
                    ctx.delivery.forget_stage = forget.or(ctx.delivery.forget_stage);
                    let route = ctx.identity.route.as_ref().map_or("-", |r| r.name.as_str());
                    self.metrics.middleware_error(route);
                    warn!(route, %error, "the route's middleware failed; cutting the response");
                    Error::because(ErrorType::InternalError, "middleware", error)
                },
            )?;
        }
        if let (Some(writer), Some(output)) = (ctx.answer.output_writer.as_mut(), body.as_ref()) {
            writer.push(output);
        }
        cut_for_client(body, end_of_stream, ctx);
        if let (Some(live), Some(chunk)) = (&ctx.answer.live, body.as_ref()) {
            live.sent(chunk.len());
        }
        Ok(())
    }
}

/// The stages' output cut as the client's answer is planned: a window of it, multipart parts,
/// nothing, or an S3 error document.
fn cut_for_client(body: &mut Option<Bytes>, end_of_stream: bool, ctx: &mut RequestCtx) {
    match &mut ctx.answer.body {
        BodyPlan::Forward => {}
        BodyPlan::Window(window) => *body = body.take().and_then(|chunk| window.cut(chunk)),
        BodyPlan::Multipart(multipart) => {
            let out = body.take().and_then(|chunk| multipart.push(chunk));
            *body = if end_of_stream { join(out, multipart.finish()) } else { out };
        }
        BodyPlan::Discard => *body = None,
        BodyPlan::S3Error(error) => {
            if let Some(chunk) = body.take() {
                error.push(&chunk);
            }
            if end_of_stream {
                let route = ctx.identity.route.as_ref().map_or("-", |r| r.name.as_str());
                let upstream = ctx.identity.route.as_ref().map_or("-", |r| r.upstream.name());
                let (text, code) = error.finish(route, upstream);
                if let Some(code) = code {
                    ctx.answer.served_range = format!("S3 {code}").into();
                }
                *body = Some(text);
            }
        }
    }
}

/// Two pieces of output as one.
fn join(first: Option<Bytes>, second: Option<Bytes>) -> Option<Bytes> {
    match (first, second) {
        (Some(first), Some(second)) => {
            let mut joined = BytesMut::with_capacity(first.len() + second.len());
            joined.extend_from_slice(&first);
            joined.extend_from_slice(&second);
            Some(joined.freeze())
        }
        (first, second) => first.or(second),
    }
}

/// Runs `work` where it may block for milliseconds without stalling the other connections of
/// this thread: `block_in_place` hands the thread's other tasks to another worker first. Only a
/// multi-threaded runtime (pingora's default) allows it; elsewhere the work runs in place.
fn off_the_event_loop<T>(blocks: bool, work: impl FnOnce() -> T) -> T {
    let multi_thread = || {
        tokio::runtime::Handle::try_current().is_ok_and(|handle| {
            handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        })
    };
    if blocks && multi_thread() { tokio::task::block_in_place(work) } else { work() }
}
