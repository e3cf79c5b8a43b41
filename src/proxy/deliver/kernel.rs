//! The kernel ways of a body (transport.rs: `Splice`, `Sendfile`): spliced from the origin's
//! socket to the client's, or sent from the cache's files, never in rangeway's memory; the
//! session's writer is told of the bytes afterwards (send_accounting.rs).

use std::time::Duration;

use pingora_error::{Error, ErrorSource, ErrorType, OrErr, Result};
use pingora_http::ResponseHeader;

use super::super::Proxy;
use super::super::client_session::ClientSession;
use super::super::client_session::client_gone;
use super::super::context::RequestCtx;
use super::super::pace::Pacer;
use super::super::source_body::Pump;
use super::super::splice::{OriginSocket, Pipe, SpliceError, Timeouts, splice};
use crate::cache::{CacheBody, Segment};
use crate::client_socket::ClientSocket;
use crate::routes::origin_client::{Exchange, Tries};
use crate::telemetry::live::LiveGuard;

impl Proxy {
    /// Answers with `response` and splices its body from the origin's socket to the client's
    /// (see splice.rs), continuing it where the origin breaks it off as the relay does.
    pub(super) async fn splice(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        response: ResponseHeader,
        (client, len, mut pipe): (&ClientSocket, u64, Pipe),
        exchange: Exchange,
        pump: Pump,
    ) -> Result<()> {
        session.write_header_now(Box::new(response)).await?;
        let spliced = self.splice_body(ctx, client, &mut pipe, len, exchange, pump).await;
        self.account_sent_aside(session, ctx, spliced).await
    }

    /// Answers with `response` and sends its body from the cache's files to the client's socket
    /// (sendfile(2)); what is still being fetched goes out as it arrives. Accounted to pingora as
    /// a splice is.
    pub(super) async fn send_files(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        response: ResponseHeader,
        (client, len): (&ClientSocket, u64),
        mut body: Box<CacheBody>,
    ) -> Result<()> {
        session.write_header_now(Box::new(response)).await?;
        let write = self.client_limits.write_timeout;
        let live = ctx.answer.live.as_ref();
        let mut sent = 0u64;
        let outcome = async {
            while let Some(segment) =
                client.unless_closed(body.next(true)).await.map_err(|()| client_gone())??
            {
                let written = match segment {
                    Segment::File { file, offset, len } => client
                        .send_file(&file, offset, len, write, |n| {
                            live.inspect(|live| live.sent(n));
                        })
                        .await
                        .map(|()| len),
                    Segment::Bytes(bytes) => client.write_all(&bytes, write).await.map(|()| {
                        live.inspect(|live| live.sent(bytes.len()));
                        bytes.len() as u64
                    }),
                };
                sent += written
                    .or_err(ErrorType::WriteError, "writing the body")
                    .map_err(|e| e.into_down())?;
            }
            Ok::<(), Box<Error>>(())
        }
        .await;
        ctx.delivery.spliced = sent;
        let outcome = outcome.and_then(|()| {
            if sent == len {
                Ok(())
            } else {
                Err(Error::explain(ErrorType::InternalError, "a cached body was not its length"))
            }
        });
        self.account_sent_aside(session, ctx, outcome).await
    }

    /// Splices the `len` bytes of body from `exchange` (and its continuations) to `client`.
    async fn splice_body(
        &self,
        ctx: &mut RequestCtx,
        client: &ClientSocket,
        pipe: &mut Pipe,
        len: u64,
        mut exchange: Exchange,
        mut pump: Pump,
    ) -> Result<()> {
        let timeouts = Timeouts {
            // As pingora: no read timeout configured, none applied.
            read: exchange.read_timeout().unwrap_or(Duration::MAX),
            write: self.client_limits.write_timeout,
        };
        let (start, mut tries) = (pump.at, Tries::new());
        let mut sent = 0;
        // Where the body of the exchange being spliced began, in `sent`: for its span.
        let mut attempt_from = 0;
        // A shaped body is spliced in paced steps: the kernel still moves every byte.
        let mut pacer = ctx.delivery.pacer.take();
        let live = ctx.answer.live.as_ref();
        let outcome = loop {
            let result = splice_exchange(
                &mut exchange,
                client,
                pipe,
                (len, timeouts),
                pacer.as_mut(),
                live,
                &mut sent,
            )
            .await;
            match result {
                Ok(()) => {
                    exchange.ended(sent - attempt_from, "complete");
                    self.origin_client.release_read_past(exchange);
                    break Ok(());
                }
                Err(e) if *e.esource() == ErrorSource::Upstream => {
                    exchange.ended(sent - attempt_from, "cut");
                    pump.at = start + sent;
                    match pump.continued(e, &mut tries).await {
                        Ok(next) => {
                            exchange = next;
                            attempt_from = sent;
                        }
                        Err(e) => break Err(e),
                    }
                }
                Err(e) => {
                    exchange.ended(sent - attempt_from, "client_gone");
                    break Err(e);
                }
            }
        };
        ctx.delivery.pacer = pacer;
        ctx.delivery.spliced = sent;
        outcome
    }
}

/// Splices one exchange's body to `client`: the bytes that came with its header, then the rest
/// through `pipe` — in paced steps on a shaped route — until `len` bytes of the body went out in
/// all (`sent` counts them, and so does the live view).
async fn splice_exchange(
    exchange: &mut Exchange,
    client: &ClientSocket,
    pipe: &mut Pipe,
    (len, timeouts): (u64, Timeouts),
    mut pacer: Option<&mut Pacer>,
    live: Option<&LiveGuard>,
    sent: &mut u64,
) -> Result<()> {
    // The bytes that came with the header are in pingora's buffer: they go first.
    // (Without any, pingora waits for the origin's: the client is watched meanwhile.)
    let first = client.unless_closed(exchange.session.read_response_body()).await;
    if let Some(first) = first.map_err(|()| client_gone())?? {
        if let Some(pacer) = pacer.as_mut() {
            pacer.wait(first.len()).await;
        }
        client
            .write_all(&first, timeouts.write)
            .await
            .or_err(ErrorType::WriteError, "writing the body")
            .map_err(|e| e.into_down())?;
        *sent += first.len() as u64;
        live.inspect(|live| live.sent(first.len()));
    }
    let origin = OriginSocket::of(exchange.session.stream()).ok_or_else(|| {
        Error::explain(ErrorType::InternalError, "the origin connection cannot be spliced")
    })?;
    let mut left = len - *sent;
    let mut delivered = |n: usize| {
        *sent += n as u64;
        live.inspect(|live| live.sent(n));
    };
    let spliced = match pacer.as_mut() {
        None => splice(origin, client, pipe, left, timeouts, delivered).await,
        Some(pacer) => {
            let mut spliced = Ok(());
            while left > 0 && spliced.is_ok() {
                let step = left.min(pacer.step() as u64);
                pacer.wait(step as usize).await;
                spliced = splice(origin, client, pipe, step, timeouts, &mut delivered).await;
                left -= step;
            }
            spliced
        }
    };
    spliced.map_err(|e| match e {
        SpliceError::Upstream(e) => {
            Error::because(ErrorType::ReadError, "reading the body", e).into_up()
        }
        SpliceError::Downstream(e) => {
            Error::because(ErrorType::WriteError, "writing the body", e).into_down()
        }
    })
}
