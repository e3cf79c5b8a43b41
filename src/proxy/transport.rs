//! Which way a request's answer takes from its origin (or the slice cache) to its client, chosen
//! here and nowhere else: before the request goes upstream ([`Transport::choose`]), then, once the
//! answer's header is in, whether its body can bypass rangeway's memory ([`Transport::for_body`]). `LIFECYCLE.md`, beside this
//! file, follows a request down each way.

use http::Method;
use pingora_core::protocols::Stream;
use pingora_http::ResponseHeader;

use super::client_session::ClientSession;
use super::splice::{Pipe, RawSocket};
use crate::config::UpstreamResume;
use crate::range::content_length;
use crate::routes::Route;
use crate::routes::origin_client::Exchange;

/// How a request's answer travels from its origin to its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Transport {
    /// None: rangeway answered the request itself before a way was chosen (a refusal, a 404).
    /// Named `pingora` in logs and metrics, as when requests with a body were pingora's to
    /// proxy; they are refused now.
    #[default]
    Pingora,
    /// rangeway's relay (`source.rs`, `source_body.rs`, `deliver.rs`): its own upstream client, the
    /// body read in chunks — from the origin's socket straight into the chunks
    /// the stages take, where pingora would copy each — through the body filter; continued from
    /// where the origin breaks it off when `resume` says how.
    Relay { resume: Option<UpstreamResume> },
    /// The relay, the body passed on untouched from the origin's socket to the client's with
    /// splice(2), never entering rangeway's memory (`splice.rs`); continued as the relay's.
    Splice { resume: Option<UpstreamResume> },
    /// The relay, the answer from the slice cache (`crate::cache`) and its body passed on
    /// untouched from the cache's files to the client's socket with sendfile(2).
    Sendfile,
}

/// Where a relayed answer's body comes from.
#[derive(Clone, Copy)]
pub(super) enum BodyFrom<'a> {
    /// The origin's answer on this exchange.
    Origin(&'a Exchange),
    /// The slice cache.
    Cache,
}

/// The smallest body spliced. Chosen, not measured: setting a splice up takes about a dozen
/// system calls (two duplicated descriptors and their registrations, the pipe and its size, the
/// closes), and a body below it is read in a few chunks anyway.
const SPLICE_MIN_BYTES: u64 = 256 * 1024;

impl Transport {
    /// The way of a request to `route`, before it goes upstream: the relay. (Requests reach it
    /// only as GET or HEAD without a body: other methods and bodies are refused before.)
    pub(super) fn choose(route: &Route) -> Self {
        Self::Relay { resume: route.upstream_resume }
    }

    /// The way of a relayed answer's body, once its header is in: passed on by the kernel when
    /// it goes out untouched — of known length, at least [`SPLICE_MIN_BYTES`], neither cut nor
    /// staged nor checked against a digest — to a client whose session hands the kernel its
    /// socket (`ClientSession::kernel_socket`: a plain HTTP/1 client on rangeway's
    /// `ClientConnection`, which the server puts under every proxy connection and which accounts
    /// for bytes that go past pingora's writer): spliced from a plain origin socket when a pipe
    /// can be had (`Pipe::take`), sent from the cache's files.
    pub(super) fn for_body(
        self,
        session: &impl ClientSession,
        untouched: bool,
        from: BodyFrom<'_>,
        response: &ResponseHeader,
    ) -> Option<(Self, KernelBody)> {
        let Self::Relay { resume } = self else { return None };
        if session.req_header().method != Method::GET {
            return None;
        }
        let len = content_length(&response.headers).filter(|len| *len >= SPLICE_MIN_BYTES)?;
        let way = match from {
            BodyFrom::Origin(exchange) if plain(exchange.session.stream()).is_some() => {
                Self::Splice { resume }
            }
            BodyFrom::Origin(_) => return None,
            BodyFrom::Cache => Self::Sendfile,
        };
        if !untouched {
            return None;
        }
        let client = session.kernel_socket()?;
        // Taken last: a pipe is held from here to the body's end.
        let pipe = match way {
            Self::Splice { .. } => Some(Pipe::take()?),
            _ => None,
        };
        Some((way, KernelBody { client, len, pipe }))
    }

    /// How bodies the origin breaks off are continued; `None`: they are not.
    pub(super) fn resume(self) -> Option<UpstreamResume> {
        match self {
            Self::Pingora | Self::Sendfile => None,
            Self::Relay { resume } | Self::Splice { resume } => resume,
        }
    }

    /// Its name in the access log and in `rangeway_transport_total`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Pingora => "pingora",
            Self::Relay { .. } => "relay",
            Self::Splice { .. } => "splice",
            Self::Sendfile => "sendfile",
        }
    }
}

/// What the kernel needs to pass a body on: the client's socket, the body's length and, to splice
/// it, a pipe.
pub(super) struct KernelBody {
    pub(super) client: RawSocket,
    pub(super) len: u64,
    pub(super) pipe: Option<Pipe>,
}

/// A connection's socket for rangeway's own reads and writes, unless it is TLS.
pub(super) fn plain_socket(stream: Option<&Stream>) -> Option<RawSocket> {
    RawSocket::duplicate(plain(stream)?.id()).ok()
}

/// The stream, when it is a plain socket: not TLS, and a socket at all — a stream in memory has
/// no socket digest, and its id names no descriptor of its own.
fn plain(stream: Option<&Stream>) -> Option<&Stream> {
    stream.filter(|s| s.get_ssl_digest().is_none() && s.get_socket_digest().is_some())
}
