//! The send side of a body that goes past pingora's writer: the header sent at once, the bytes
//! that went by another way accounted to pingora's writer (which the client connection's
//! `ClientWrites` swallow), the client socket's unsent bound. The state is the client
//! connection's (`crate::client_writes`, held by admission's wrapper); the deliver step owns
//! what is done with it, here.

use bytes::Bytes;
use pingora_core::protocols::http::{HttpTask, ServerSession};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

use super::super::Proxy;
use super::super::context::RequestCtx;
use crate::admission::ClientConnection;

impl Proxy {
    /// Ends a response whose body went past pingora's writer (`ctx.spliced` bytes of it, then
    /// `outcome`). pingora's writer is told of those bytes, as writes its connection swallows:
    /// it then counts them, frames the response as complete and keeps the connection, as for
    /// any other response.
    pub(super) async fn account_sent_aside(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        outcome: Result<()>,
    ) -> Result<()> {
        if !sent_aside(session, ctx.spliced) {
            return Err(Error::explain(
                ErrorType::InternalError,
                "a spliced response was not accounted",
            ));
        }
        let mut left = ctx.spliced;
        while left > 0 {
            let n = left.min(SENT_ASIDE.len() as u64) as usize;
            session.write_response_body(Some(Bytes::from_static(&SENT_ASIDE[..n])), false).await?;
            left -= n as u64;
        }
        outcome?;
        if unaccounted(session) != 0 {
            // What is left would swallow the next response's bytes: the connection must end.
            session.set_keepalive(None);
            return Err(Error::explain(
                ErrorType::InternalError,
                "a spliced body was not accounted",
            ));
        }
        session.write_response_body(None, true).await
    }
}

/// What pingora's writer is handed for the bytes that went past it: never read, never sent (see
/// `ClientWrites::note_sent_aside`); zeroed, so it costs no memory until something reads it.
static SENT_ASIDE: [u8; 1 << 20] = [0; 1 << 20];

/// Tells the client connection that `bytes` of body went out past pingora's writer. `false` when
/// it cannot be told (no admission wrapper): pingora's writes would then reach the client.
fn sent_aside(session: &Session, bytes: u64) -> bool {
    let ServerSession::H1(h1) = session.as_downstream() else { return false };
    let Some(watched) = ClientConnection::of(h1.stream()) else { return false };
    watched.note_sent_aside(bytes);
    true
}

/// Bounds the client socket's unsent bytes for a body the kernel sends, and lifts the bound for
/// one rangeway writes (see `ClientWrites::bound_unsent`).
pub(super) fn unsent_bounded(session: &Session, kernel_way: bool) {
    if let ServerSession::H1(h1) = session.as_downstream()
        && let Some(watched) = ClientConnection::of(h1.stream())
    {
        watched.bound_unsent(kernel_way);
    }
}

/// Bytes the client connection was told went past pingora's writer and it has not written since.
fn unaccounted(session: &Session) -> u64 {
    match session.as_downstream() {
        ServerSession::H1(h1) => {
            ClientConnection::of(h1.stream()).map_or(0, ClientConnection::unaccounted)
        }
        _ => 0,
    }
}

/// Writes the response header and sends it at once, before the body goes out by another way:
/// pingora buffers a header with a Content-Length until body bytes follow, and offers no flush
/// of its own. A failed task after the header is its way to one ("flush what we have and quit").
pub(super) async fn write_header_now(
    session: &mut Session,
    response: ResponseHeader,
) -> Result<()> {
    const FLUSHED: ErrorType = ErrorType::Custom("HeaderFlushed");
    let ServerSession::H1(h1) = session.as_downstream_mut() else {
        return Err(Error::explain(ErrorType::InternalError, "splicing to a client not on HTTP/1"));
    };
    let tasks =
        vec![HttpTask::Header(Box::new(response), false), HttpTask::Failed(Error::new(FLUSHED))];
    match h1.response_duplex_vec(tasks).await {
        Err(e) if *e.etype() == FLUSHED => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Err(Error::explain(ErrorType::InternalError, "the header was not flushed")),
    }
}
