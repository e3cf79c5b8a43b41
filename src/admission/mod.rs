//! What a client connection may cost before the proxy sees a request: connections per address
//! and in all, how long its request header may take to arrive, and how long it may wait idle for
//! the next one.
//!
//! pingora bounds a request header's size (1 MiB) and each read (60 s), but not the time the
//! whole header takes: a client dribbling a byte every few seconds (slowloris) holds its
//! connection forever. [`Admission`] wraps the proxy's application: it counts each address's
//! connections (more than the limit are answered 503 and closed), and wraps each connection's
//! stream so that a request header not complete within `client_header_timeout` of its first byte
//! ends the connection.
//!
//! Every client connection holds a place among `max_connections` ([`Connections`]); an HTTP/1
//! connection between two requests is idle there, closed after `client_keepalive_timeout`, or
//! sooner when a new connection needs its place. (HTTP/2 connections count, and pingora closes
//! them after the same time with no stream open; they are not chosen to make room.)
//!
//! On TLS listeners it also makes the TLS handshake, after the connection was counted and within
//! the same deadline: pingora's own listeners would give a handshake 60 s, count it nowhere, and
//! log each failed one (every scanner's) at ERROR.
//!
//! With `proxy_protocol` on, each connection must begin with a PROXY protocol header
//! (`proxy_protocol.rs`), read here before anything else — before the connection is counted,
//! before TLS — within the same deadline; its source address becomes the connection's peer for
//! everything after, through the socket digest pingora hands every session. A connection without
//! one is closed unanswered.
//!
//! Its wrapper ([`ClientConnection`], client_connection.rs) is the one every client connection's
//! bytes pass through, so it also holds what the deliver step needs of the connection's writes
//! and pingora's stream does not do (`crate::client_writes`: bytes sent past pingora's writer,
//! the unsent bound, HTTP/2's writes gathered); places among `max_connections` and their idle
//! eviction are connections.rs's.
//!
//! [`ClientLimits`], which `[server]` sets, are the bounds of all of it and of what the proxy
//! lets one connection cost after: its defaults follow the descriptors the process may open.

mod client_connection;
mod connections;

pub(crate) use client_connection::ClientConnection;

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::apps::ServerApp;
use pingora_core::listeners::tls::Acceptor;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_core::protocols::l4::stream::Stream as TcpStream;
use pingora_core::protocols::{ALPN, GetSocketDigest, SocketDigest, Ssl, Stream};
use pingora_core::server::ShutdownWatch;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, warn};

use crate::proxy_protocol::{self, Parsed, ProxyHeaderError};
use crate::telemetry::metrics::Metrics;
use crate::values::{Problem, wrong};
use client_connection::Phase;
use connections::{Admitted, Connections};

/// The answer to a connection over its address's limit, written before its request is read.
const TOO_MANY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; \
charset=utf-8\r\ncontent-length: 39\r\nretry-after: 1\r\nconnection: close\r\n\r\ntoo many \
connections from your address\n";

/// Places among `max_connections` for connections of a listener beside pingora's (HTTP/3's QUIC
/// connections), which hold one while open as pingora's listeners' connections do.
#[derive(Clone)]
pub(crate) struct ConnectionPlaces {
    connections: Arc<Connections>,
    max: usize,
    metrics: Arc<Metrics>,
}

/// A connection's place among `max_connections`, given back when dropped.
pub(crate) struct ConnectionPlace {
    _place: connections::Place,
}

impl ConnectionPlaces {
    /// A place for a new connection: a free one, or an idle HTTP/1 connection's (which is told
    /// to close); `None` when all are taken and none is idle.
    pub(crate) fn take(&self) -> Option<ConnectionPlace> {
        match self.connections.admit(self.max) {
            Admitted::Free(place) => Some(ConnectionPlace { _place: place }),
            Admitted::InPlaceOfIdle(place) => {
                self.metrics.connection_refused("max_connections_idle");
                Some(ConnectionPlace { _place: place })
            }
            Admitted::Full => {
                self.metrics.connection_refused("max_connections");
                None
            }
        }
    }
}

/// The answer to a connection past `max_connections` while none is idle.
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; \
charset=utf-8\r\ncontent-length: 28\r\nretry-after: 1\r\nconnection: close\r\n\r\ntoo many \
connections open\n";

/// What a connection cut for its slow header is told, and logged with at debug only: at a higher
/// level the log's volume would be in the hands of whoever opens slow connections (they are
/// counted, in `rangeway_client_connections_refused_total{reason="header_timeout"}`).
pub(crate) const HEADER_TIMED_OUT: &str =
    "the request header took longer than client_header_timeout";

/// A socket that queues no more than this unsent pushes its bytes out in the call that writes
/// them rather than leaving it to the ACKs (docs/benchmarks.md, "The unsent bound"); eight times
/// what Cloudflare's edge sets, so that a fast long path stays full.
const DEFAULT_NOTSENT_LOWAT: u32 = 128 * 1024;
/// Below this a socket would wake its writer for every few segments.
const MIN_NOTSENT_LOWAT: u64 = 16 * 1024;
/// Descriptors kept aside from the clients' share: listeners, the store, logs, cache files, the
/// empty pipes kept for the next spliced bodies.
const RESERVED_DESCRIPTORS: u64 = 256;
/// What one client connection may hold: its socket and the duplicate it keeps for its requests, an
/// origin connection, a splice's pipe (two).
const DESCRIPTORS_PER_CONNECTION: u64 = 5;
/// `max_request_body` when it is not set: larger than the bodies of forms and APIs and than the
/// parts of an S3 multipart upload as SDKs cut them (8 to 64 MiB), while one request still cannot
/// tie an origin connection up for an unbounded upload; a route for larger uploads raises it.
const DEFAULT_MAX_REQUEST_BODY: u64 = 64 << 20;
/// The default when the descriptor limit is unlimited or unknown, and the most that may be set.
pub(crate) const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

/// Bounds on what one client connection may cost, whatever it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientLimits {
    pub header_timeout: Duration,
    pub write_timeout: Duration,
    /// 0 for no limit.
    pub max_connections_per_client: usize,
    pub max_header_bytes: usize,
    pub max_header_fields: usize,
    /// 0 leaves the system's setting.
    pub notsent_lowat: u32,
    pub keepalive_timeout: Duration,
    pub max_connections: usize,
    /// The most a request body passed through to an origin may hold (`max_request_body`).
    pub max_request_body: u64,
    /// How long a request body may stall between two reads (`client_body_timeout`).
    pub body_timeout: Duration,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(60),
            max_connections_per_client: 1024,
            max_header_bytes: 32 * 1024,
            max_header_fields: 100,
            notsent_lowat: DEFAULT_NOTSENT_LOWAT,
            keepalive_timeout: Duration::from_secs(60),
            max_connections: default_max_connections(descriptor_limit()),
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            body_timeout: Duration::from_secs(60),
        }
    }
}

/// The descriptors the process may open: the hard `RLIMIT_NOFILE`, which `serve` raises the soft
/// one to; `None` when unlimited.
pub(crate) fn descriptor_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum
}

/// `max_connections` when it is not set: [`DESCRIPTORS_PER_CONNECTION`] each, after
/// [`RESERVED_DESCRIPTORS`].
pub(crate) fn default_max_connections(descriptors: Option<u64>) -> usize {
    descriptors.map_or(MAX_CONNECTIONS_LIMIT, |limit| {
        let share = limit.saturating_sub(RESERVED_DESCRIPTORS) / DESCRIPTORS_PER_CONNECTION;
        usize::try_from(share).unwrap_or(MAX_CONNECTIONS_LIMIT).clamp(1, MAX_CONNECTIONS_LIMIT)
    })
}

/// `max_connections`, when the process may open that many descriptors.
pub(crate) fn fitting_connections(max: usize) -> Result<usize, Problem> {
    match descriptor_limit() {
        Some(descriptors) if max as u64 > descriptors => wrong(
            format!(
                "{max} connections cannot be open at once: the process may open {descriptors} \
                 descriptors (RLIMIT_NOFILE), and each connection needs one"
            ),
            format!(
                "use at most {descriptors}, or leave it unset ({}: room for an origin connection, \
                 a pipe and their duplicates each), or raise the limit (LimitNOFILE= in the systemd unit, ulimit -n)",
                default_max_connections(Some(descriptors))
            ),
        ),
        _ => Ok(max),
    }
}

/// `client_notsent_lowat`, within the bounds `[server]` reads it with (so that it fits a `u32`).
pub(crate) fn notsent_lowat(size: u64) -> Result<u32, Problem> {
    match size {
        0 | MIN_NOTSENT_LOWAT.. => Ok(u32::try_from(size).unwrap_or(u32::MAX)),
        _ => wrong(
            format!("{size} bytes would wake the writer for every few segments"),
            "use at least \"16KiB\" (the default is \"128KiB\"), or 0 for the system's setting",
        ),
    }
}

/// The proxy's application behind connection admission.
pub struct Admission<A> {
    inner: Arc<A>,
    limits: ClientLimits,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    /// Every listener's connections together, for `max_connections`.
    connections: Arc<Connections>,
    metrics: Arc<Metrics>,
    /// On TLS listeners: what makes each connection's handshake.
    tls: Option<Arc<Acceptor>>,
    /// Whether each connection begins with a PROXY protocol header (`server.proxy_protocol`).
    proxy_protocol: bool,
}

impl<A> Admission<A> {
    pub fn new(inner: A, limits: ClientLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(inner),
            limits,
            open: Arc::default(),
            connections: Arc::new(Connections::new(metrics.client_connections())),
            metrics,
            tls: None,
            proxy_protocol: false,
        }
    }

    /// The same, requiring a PROXY protocol header on every connection when `required`.
    pub fn with_proxy_protocol(mut self, required: bool) -> Self {
        self.proxy_protocol = required;
        self
    }

    /// Places among `max_connections` for another listener's connections (HTTP/3's): they
    /// count with these listeners' connections in one bound.
    pub(crate) fn places(&self) -> ConnectionPlaces {
        ConnectionPlaces {
            connections: Arc::clone(&self.connections),
            max: self.limits.max_connections,
            metrics: Arc::clone(&self.metrics),
        }
    }

    /// The same application and per-address counts, for TLS listeners: each connection's
    /// handshake made with `acceptor` first.
    pub fn with_tls(&self, acceptor: Acceptor) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            limits: self.limits,
            open: Arc::clone(&self.open),
            connections: Arc::clone(&self.connections),
            metrics: Arc::clone(&self.metrics),
            tls: Some(Arc::new(acceptor)),
            proxy_protocol: self.proxy_protocol,
        }
    }

    /// Reads the connection's PROXY protocol header and makes the client it names the stream's
    /// peer. `false` (counted, logged at debug) when there is no valid header within
    /// `client_header_timeout`: the connection is then to be closed.
    async fn take_proxy_header(&self, stream: &mut Stream) -> bool {
        let peer = stream.get_socket_digest().and_then(|digest| digest.peer_addr().cloned());
        let source = match tokio::time::timeout(self.limits.header_timeout, read_preface(stream))
            .await
        {
            Ok(Ok(Preface::Header(source))) => source,
            Ok(Ok(Preface::Closed)) => {
                debug!(client = ?peer, "a connection closed before its first byte");
                return false;
            }
            Ok(Ok(Preface::Refused(e))) => {
                self.metrics.connection_refused("proxy_protocol");
                debug!(client = ?peer, error = %e, "closed a connection without a valid PROXY protocol header");
                return false;
            }
            Ok(Err(e)) => {
                self.metrics.connection_refused("proxy_protocol");
                debug!(client = ?peer, error = %e, "the connection ended inside its PROXY protocol header");
                return false;
            }
            Err(_) => {
                self.metrics.connection_refused("header_timeout");
                debug!(client = ?peer, "PROXY protocol header slower than client_header_timeout");
                return false;
            }
        };
        // LOCAL (a balancer's own health check): the peer is the client.
        let Some(source) = source else { return true };
        let Some(tcp) = stream.as_any().downcast_ref::<TcpStream>() else { return true };
        let digest = SocketDigest::from_raw_fd(tcp.as_raw_fd());
        let local = stream.get_socket_digest().and_then(|digest| digest.local_addr().cloned());
        // Both cells are new and empty: neither set can fail.
        let _ = digest.peer_addr.set(Some(SocketAddr::Inet(source)));
        let _ = digest.local_addr.set(local);
        stream.set_socket_digest(digest);
        true
    }

    /// The TLS connection over `stream`, or `None` (counted, logged at debug) when its handshake
    /// fails or takes longer than `client_header_timeout`.
    async fn handshake(&self, acceptor: &Acceptor, stream: Stream) -> Option<Stream> {
        // A TLS listener's connections are TCP streams, as pingora's listener made them.
        let tcp = match stream.into_any().downcast::<TcpStream>() {
            Ok(tcp) => *tcp,
            Err(_) => {
                warn!("a TLS listener's connection is not a TCP stream: closed");
                return None;
            }
        };
        let peer = tcp.get_socket_digest().and_then(|digest| digest.peer_addr().cloned());
        match tokio::time::timeout(self.limits.header_timeout, acceptor.tls_handshake(tcp)).await {
            Ok(Ok(tls)) => Some(Box::new(tls)),
            Ok(Err(e)) => {
                self.metrics.connection_refused("tls_handshake");
                debug!(client = ?peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                self.metrics.connection_refused("header_timeout");
                debug!(client = ?peer, "TLS handshake slower than client_header_timeout");
                None
            }
        }
    }

    /// A place for a connection from `ip`, or `None` when its address has all it may have.
    /// Ends a connection refused before its request is read, with `answer` unless it is TLS (a
    /// TLS client would read an answer in plain text as a broken handshake).
    async fn refuse(&self, mut stream: Stream, answer: &[u8]) {
        if self.tls.is_none() {
            let _ = stream.write_all(answer).await;
            let _ = stream.flush().await;
        }
        let _ = AsyncWriteExt::shutdown(&mut stream).await;
    }

    fn admit(&self, ip: IpAddr) -> Option<Slot> {
        let limit = self.limits.max_connections_per_client;
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(ip).or_insert(0);
        if limit != 0 && *count >= limit {
            return None;
        }
        *count += 1;
        Some(Slot { ip, open: Arc::clone(&self.open) })
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Admission<A> {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // A kept-alive connection comes back for its next request: admitted already.
        if stream.as_any().is::<ClientConnection>() {
            return self.inner.process_new(stream, shutdown).await;
        }
        if self.proxy_protocol && !self.take_proxy_header(&mut stream).await {
            let _ = AsyncWriteExt::shutdown(&mut stream).await;
            return None;
        }
        let ip = stream.get_socket_digest().and_then(|digest| match digest.peer_addr() {
            Some(SocketAddr::Inet(addr)) => Some(addr.ip()),
            _ => None,
        });
        let slot = match ip.map(|ip| self.admit(ip)) {
            Some(None) => {
                self.metrics.connection_refused("per_client_limit");
                // Counted, and only at debug: a client over its limit must not flood the log.
                debug!(client = ?ip, limit = self.limits.max_connections_per_client, "refused a connection: its address has as many open as max_connections_per_client allows");
                self.refuse(stream, TOO_MANY).await;
                return None;
            }
            Some(Some(slot)) => Some(slot),
            // Not over TCP (a Unix socket): one local peer, nothing to count.
            None => None,
        };
        let place = match self.connections.admit(self.limits.max_connections) {
            Admitted::Free(place) => place,
            Admitted::InPlaceOfIdle(place) => {
                self.metrics.connection_refused("max_connections_idle");
                debug!(
                    limit = self.limits.max_connections,
                    "max_connections reached: closed the longest idle connection to make room"
                );
                place
            }
            Admitted::Full => {
                self.metrics.connection_refused("max_connections");
                debug!(client = ?ip, limit = self.limits.max_connections, "refused a connection: max_connections are open and none is idle");
                self.refuse(stream, FULL).await;
                return None;
            }
        };
        let stream = match &self.tls {
            // Boxed: its state would otherwise be in the future of every request that comes
            // back on a kept-alive connection (see docs/benchmarks.md, "Boxed futures").
            Some(acceptor) => Box::pin(self.handshake(acceptor, stream)).await?,
            None => stream,
        };
        let mut watched = ClientConnection::new(stream, &self.limits, slot, &self.metrics);
        watched.place = Some(place);
        if matches!(watched.selected_alpn_proto(), Some(ALPN::H2)) {
            watched.phase = Phase::Frames;
            watched.writes.gather();
        } else {
            // A new connection waits for its first request as a kept-alive one for its next.
            watched.response_ended();
        }
        self.inner.process_new(Box::new(watched), shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await;
    }
}

/// What a connection that must begin with a PROXY protocol header began with.
enum Preface {
    /// A header naming the client (`None`: it names none, the peer is the client).
    Header(Option<std::net::SocketAddr>),
    Refused(ProxyHeaderError),
    /// Nothing: closed before its first byte, as TCP checks (`/readyz`'s, a balancer's) are.
    /// Not counted as refused, or every probe would be.
    Closed,
}

/// Reads the PROXY protocol header at the start of `stream`, and no byte past it.
async fn read_preface(stream: &mut Stream) -> io::Result<Preface> {
    let mut header = vec![0u8];
    if stream.read(&mut header).await? == 0 {
        return Ok(Preface::Closed);
    }
    loop {
        match proxy_protocol::parse(&header) {
            Ok(Parsed::Incomplete { at_least }) => {
                let have = header.len();
                header.resize(at_least, 0);
                stream.read_exact(&mut header[have..]).await?;
            }
            Ok(Parsed::Header { source, .. }) => return Ok(Preface::Header(source)),
            Err(e) => return Ok(Preface::Refused(e)),
        }
    }
}

/// A connection's place in its address's count, given back when the connection ends.
#[derive(Debug)]
pub(super) struct Slot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}
