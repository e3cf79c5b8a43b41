//! The send side of a body that goes past the session's writer: the bytes that went by another
//! way accounted to the writer (which the client connection's `ClientWrites` swallow). The state
//! is the client connection's (`crate::client_writes`, held by admission's wrapper, reached
//! through `ClientSession::note_sent_aside` and `unaccounted`); the deliver step owns what is
//! done with it, here.

use bytes::Bytes;
use pingora_error::{Error, ErrorType, Result};

use super::super::Proxy;
use super::super::client_session::ClientSession;
use super::super::context::RequestCtx;

impl Proxy {
    /// Ends a response whose body went past the session's writer (`ctx.delivery.spliced` bytes of
    /// it, then `outcome`). The writer is told of those bytes, as writes its connection swallows:
    /// it then counts them, frames the response as complete and keeps the connection, as for any
    /// other response.
    pub(super) async fn account_sent_aside(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        outcome: Result<()>,
    ) -> Result<()> {
        if !session.note_sent_aside(ctx.delivery.spliced) {
            return Err(Error::explain(
                ErrorType::InternalError,
                "a spliced response was not accounted",
            ));
        }
        let mut left = ctx.delivery.spliced;
        while left > 0 {
            let n = left.min(SENT_ASIDE.len() as u64) as usize;
            session.write_body(Some(Bytes::from_static(&SENT_ASIDE[..n])), false).await?;
            left -= n as u64;
        }
        outcome?;
        if session.unaccounted() != 0 {
            // What is left would swallow the next response's bytes: the connection must end.
            session.close_after_response();
            return Err(Error::explain(
                ErrorType::InternalError,
                "a spliced body was not accounted",
            ));
        }
        session.write_body(None, true).await
    }
}

/// What the session's writer is handed for the bytes that went past it: never read, never sent
/// (see `ClientWrites::note_sent_aside`); zeroed, so it costs no memory until something reads it.
static SENT_ASIDE: [u8; 1 << 20] = [0; 1 << 20];
