//! How the pipeline learns that its client went away while the source keeps it waiting.

use std::future::Future;
use std::sync::Arc;

use pingora_error::{Error, ErrorType};

use super::ClientSession;
use crate::client_socket::ClientSocket;
use crate::unless::Unless;

/// How the pipeline learns that its client went away while the origin (or the cache's fetch)
/// keeps it waiting: on HTTP/1, plain or TLS, its socket closing; on HTTP/2 and HTTP/3 (sessions
/// without a socket of their own), its stream reset or stopped or its connection gone, as the
/// session tells (`ClientSession::stream_gone`). Dropping the wait drops the origin's request with it.
pub(in crate::proxy) enum ClientWatch {
    Socket(Arc<ClientSocket>),
    Stream,
    /// The socket could not be duplicated.
    Unwatched,
}

impl ClientWatch {
    pub(in crate::proxy) fn of(session: &impl ClientSession) -> Self {
        match session.connection_socket() {
            Some(Ok(socket)) => Self::Socket(socket),
            Some(Err(_)) => Self::Unwatched,
            None => Self::Stream,
        }
    }

    /// The duplicate of the client's socket it watches, which the kernel's ways of a body send to
    /// and the live view reads: the connection's one for all three.
    pub(in crate::proxy) fn socket(&self) -> Option<&ClientSocket> {
        match self {
            Self::Socket(socket) => Some(socket.as_ref()),
            Self::Stream | Self::Unwatched => None,
        }
    }

    /// `work`'s outcome, or a client-gone error as soon as the client is gone.
    pub(in crate::proxy) fn unless_gone<'a, W: Future>(
        &'a self,
        session: &'a mut impl ClientSession,
        work: W,
    ) -> Unless<W, impl Future<Output = Box<Error>> + 'a> {
        let gone = async move {
            match self {
                Self::Socket(socket) => socket.closed().await,
                Self::Stream => session.stream_gone().await,
                Self::Unwatched => std::future::pending().await,
            }
            client_gone()
        };
        Unless::new(work, gone)
    }
}

/// The error a request ends with when its client went away.
pub(in crate::proxy) fn client_gone() -> Box<Error> {
    Error::explain(ErrorType::ConnectionClosed, "the client hung up").into_down()
}
