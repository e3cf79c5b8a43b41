//! Which way a request's answer takes from its origin (or the slice cache) to its client: one
//! value, [`BodyWay`], chosen in one place ([`BodyWay::choose`]) by the deliver step once the
//! answer's header is shaped, with what that way needs (the client's socket, the body's pipe from
//! the pipe budget) and the route's pacing taken into account; [`Transport`] names it in the
//! access line and the metrics. `LIFECYCLE.md`, beside this file, follows a request down each way.

use http::Method;
use pingora_http::ResponseHeader;

use super::client_session::{ClientSession, ClientWatch};
use super::source_body::UpstreamBody;
use super::splice::{OriginSocket, Pipe};
use crate::client_socket::ClientSocket;
use crate::range::content_length;
use crate::routes::origin_client::Exchange;

/// How a request's answer travelled from its origin to its client, as the access line
/// (`transport=`) and `rangeway_transport_total` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    /// None: rangeway answered the request itself before it was handed to its route (a refusal,
    /// a 404).
    /// Named `pingora` in logs and metrics, as when requests with a body were pingora's to
    /// proxy; they take `PassThrough` now.
    Pingora,
    /// rangeway's relay: its own upstream client, the body read in chunks — from the origin's
    /// socket straight into the chunks the stages take, where pingora would copy each — through
    /// the transform step ([`BodyWay::Copy`]). Also the name of a request given to its route's
    /// relay that ended before its body's way was chosen (a refusal of its download, an error of
    /// its source).
    Relay,
    /// The relay, the body passed on untouched from the origin's socket to the client's with
    /// splice(2), never entering rangeway's memory ([`BodyWay::Splice`]).
    Splice,
    /// The relay, the answer from the slice cache (`crate::cache`) and its body passed on
    /// untouched from the cache's files to the client's socket with sendfile(2)
    /// ([`BodyWay::Sendfile`]).
    Sendfile,
    /// A method other than GET and HEAD that its route lets through (pass_through.rs): its body
    /// streamed to the origin, the origin's answer copied back as the relay copies.
    PassThrough,
}

/// How an answer's body goes to its client, with what that way needs: the one value the deliver
/// step chooses for it ([`BodyWay::choose`]).
pub(super) enum BodyWay<'w> {
    /// Read by rangeway and written through pingora's writer: through the transform step, in
    /// paced steps on a shaped route (pace.rs).
    Copy,
    /// Spliced from the origin's plain socket to the client's through the body's pipe (its share
    /// of the pipe budget, `Pipe::take`), in paced steps on a shaped route; continued as the
    /// relay's where the origin breaks it off.
    Splice { client: &'w ClientSocket, len: u64, pipe: Pipe },
    /// Sent from the slice cache's files to the client's socket.
    Sendfile { client: &'w ClientSocket, len: u64 },
}

/// Where a relayed answer's body comes from.
#[derive(Clone, Copy)]
enum BodyFrom<'a> {
    /// The origin's answer on this exchange.
    Origin(&'a Exchange),
    /// The slice cache.
    Cache,
}

/// The smallest body spliced. Chosen, not measured: setting a splice up takes a few system calls
/// (a pipe made and sized when none is kept, the bytes that came with the header written on their
/// own), and a body below it is read in a few chunks anyway.
const SPLICE_MIN_BYTES: u64 = 256 * 1024;

impl<'w> BodyWay<'w> {
    /// The way of an answer's `body`, once its header (`response`) is shaped: passed on by the
    /// kernel when it goes out `untouched` (no stage, digest check, cut or stretches), else
    /// copied. A `paced` body from the cache is copied too: sendfile has no steps.
    pub(super) fn choose(
        session: &impl ClientSession,
        watch: &'w ClientWatch,
        untouched: bool,
        paced: bool,
        body: Option<&UpstreamBody>,
        response: &ResponseHeader,
    ) -> Self {
        let from = match body {
            Some(UpstreamBody::Origin { exchange, .. }) => BodyFrom::Origin(exchange),
            Some(UpstreamBody::Cache(_)) if !paced => BodyFrom::Cache,
            _ => return Self::Copy,
        };
        Self::kernel_way(session, watch, untouched, from, response).unwrap_or(Self::Copy)
    }

    /// The kernel's way for a GET's body that goes out untouched — of known length, at least
    /// [`SPLICE_MIN_BYTES`] — to a client whose session hands the kernel its socket
    /// (`ClientSession::kernel_sends`: a plain HTTP/1 client on rangeway's `ClientConnection`,
    /// which the server puts under every proxy connection and which accounts for bytes that go
    /// past pingora's writer; the socket is the client watch's duplicate): spliced from a plain origin socket when a pipe can be had
    /// (`Pipe::take`), sent from the cache's files; `None` when it cannot have one.
    fn kernel_way(
        session: &impl ClientSession,
        watch: &'w ClientWatch,
        untouched: bool,
        from: BodyFrom<'_>,
        response: &ResponseHeader,
    ) -> Option<Self> {
        if session.req_header().method != Method::GET {
            return None;
        }
        let len = content_length(&response.headers).filter(|len| *len >= SPLICE_MIN_BYTES)?;
        let spliced = match from {
            BodyFrom::Origin(exchange) if OriginSocket::of(exchange.session.stream()).is_some() => {
                true
            }
            BodyFrom::Origin(_) => return None,
            BodyFrom::Cache => false,
        };
        if !untouched {
            return None;
        }
        let client = watch.socket().filter(|_| session.kernel_sends())?;
        // Taken last: a pipe is held from here to the body's end.
        Some(match spliced {
            true => Self::Splice { client, len, pipe: Pipe::take()? },
            false => Self::Sendfile { client, len },
        })
    }

    /// Whether the kernel sends the body: the client socket's unsent bytes are then bounded.
    pub(super) fn by_kernel(&self) -> bool {
        !matches!(self, Self::Copy)
    }

    /// Its name in the access log and the metrics.
    pub(super) fn transport(&self) -> Transport {
        match self {
            Self::Copy => Transport::Relay,
            Self::Splice { .. } => Transport::Splice,
            Self::Sendfile { .. } => Transport::Sendfile,
        }
    }
}

impl Transport {
    /// Its name in the access log and in `rangeway_transport_total`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Pingora => "pingora",
            Self::Relay => "relay",
            Self::Splice => "splice",
            Self::Sendfile => "sendfile",
            Self::PassThrough => "pass_through",
        }
    }
}
