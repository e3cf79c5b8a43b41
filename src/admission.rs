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
//! Its wrapper is the one every client connection's bytes pass through, so it also carries what
//! pingora's stream does not do for it: body bytes sent past pingora's writer (spliced) are
//! accounted, and an HTTP/2 connection's writes are gathered (`Gather`).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::task::AtomicWaker;
use pingora_core::apps::ServerApp;
use pingora_core::listeners::tls::Acceptor;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_core::protocols::l4::stream::Stream as TcpStream;
use pingora_core::protocols::{
    ALPN, GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    Stream, UniqueID, UniqueIDType,
};
use pingora_core::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tracing::{debug, warn};

use crate::config::ClientLimits;
use crate::proxy_protocol::{self, Parsed, ProxyHeaderError};
use crate::telemetry::metrics::Metrics;

/// The answer to a connection over its address's limit, written before its request is read.
const TOO_MANY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; \
charset=utf-8\r\ncontent-length: 39\r\nretry-after: 1\r\nconnection: close\r\n\r\ntoo many \
connections from your address\n";

/// The answer to a connection past `max_connections` while none is idle.
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; \
charset=utf-8\r\ncontent-length: 28\r\nretry-after: 1\r\nconnection: close\r\n\r\ntoo many \
connections open\n";

/// What a connection cut for its slow header is told, and logged with. pingora logs such a
/// connection at ERROR, which would put the log's volume in the hands of whoever opens slow
/// connections: the binary's log drops pingora's line for them (they are counted, in
/// `rangeway_client_connections_refused_total{reason="header_timeout"}`).
pub const HEADER_TIMED_OUT: &str = "the request header took longer than client_header_timeout";

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
            connections: Arc::new(Connections {
                state: Mutex::default(),
                gauge: metrics.client_connections(),
            }),
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
        if matches!(watched.inner.selected_alpn_proto(), Some(ALPN::H2)) {
            watched.phase = Phase::Frames;
            watched.gather = Some(Gather::default());
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
struct Slot {
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

/// The client connections open on every listener, and which of them are idle (between two
/// requests), longest idle first.
#[derive(Debug)]
struct Connections {
    state: Mutex<ConnectionsState>,
    /// `rangeway_client_connections`.
    gauge: prometheus::IntGauge,
}

#[derive(Debug, Default)]
struct ConnectionsState {
    open: usize,
    /// Idle connections by when they became idle (a sequence number).
    idle: BTreeMap<u64, Arc<Presence>>,
    next_idle: u64,
}

/// What [`Connections::admit`] decided.
enum Admitted {
    Free(Place),
    /// The longest idle connection was told to close; the new one has its place.
    InPlaceOfIdle(Place),
    /// `max_connections` are open and none is idle.
    Full,
}

/// What the registry and a connection share: whether it is idle, and its being told to close.
#[derive(Debug, Default)]
struct Presence {
    /// Its key in the idle set, 0 when it is not there. Changed under the registry's lock only.
    idle_key: AtomicU64,
    /// Closed to make room: its place went to a new connection.
    evicted: AtomicBool,
    /// Its task, waiting to read its next request.
    waker: AtomicWaker,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, ConnectionsState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn admit(self: &Arc<Self>, max: usize) -> Admitted {
        let mut state = self.lock();
        let place = || Place { connections: Arc::clone(self), presence: Arc::default() };
        if state.open < max {
            state.open += 1;
            self.gauge.set(state.open as i64);
            return Admitted::Free(place());
        }
        let Some((_, idle)) = state.idle.pop_first() else { return Admitted::Full };
        idle.idle_key.store(0, Ordering::Relaxed);
        idle.evicted.store(true, Ordering::Release);
        idle.waker.wake();
        Admitted::InPlaceOfIdle(place())
    }
}

/// A connection's place among all open ones, given back when the connection ends.
#[derive(Debug)]
struct Place {
    connections: Arc<Connections>,
    presence: Arc<Presence>,
}

impl Place {
    fn idle(&self) {
        let mut state = self.connections.lock();
        if self.presence.idle_key.load(Ordering::Relaxed) != 0
            || self.presence.evicted.load(Ordering::Acquire)
        {
            return;
        }
        state.next_idle += 1;
        let key = state.next_idle;
        self.presence.idle_key.store(key, Ordering::Relaxed);
        state.idle.insert(key, Arc::clone(&self.presence));
    }

    fn busy(&self) {
        if self.presence.idle_key.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut state = self.connections.lock();
        let key = self.presence.idle_key.swap(0, Ordering::Relaxed);
        state.idle.remove(&key);
    }

    fn evicted(&self) -> bool {
        self.presence.evicted.load(Ordering::Acquire)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.connections.lock();
        let key = self.presence.idle_key.swap(0, Ordering::Relaxed);
        if key != 0 {
            state.idle.remove(&key);
        }
        // An evicted connection's place is the new connection's already.
        if !self.presence.evicted.load(Ordering::Acquire) {
            state.open -= 1;
            self.connections.gauge.set(state.open as i64);
        }
    }
}

/// Where a connection is in its request/response cycle, as seen from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for, or reading, a request header.
    Header,
    /// The header is complete; a body (if any) may follow. Nothing is timed here.
    Request,
    /// A response is being written; the next byte read begins the next request header.
    Response,
    /// HTTP/2: frames, not a text header to time (h2 bounds its own header lists and streams).
    Frames,
}

/// A client connection whose request headers must each arrive within a deadline.
pub(crate) struct ClientConnection {
    inner: Stream,
    timeout: Duration,
    phase: Phase,
    /// Whether the last byte read (ignoring `\r`) ended a line: a line end there ends the header.
    line_ended: bool,
    /// When the current header's first byte arrived, and the timer that fires at its deadline:
    /// armed only once a read leaves the header unfinished (most headers come in one read and
    /// need none), dropped with the header (a timer left armed would wake the connection later
    /// for nothing).
    started: Option<(Instant, Option<Pin<Box<tokio::time::Sleep>>>)>,
    _slot: Option<Slot>,
    /// Its place among `max_connections` (none in unit tests).
    place: Option<Place>,
    /// Set when a response has ended (the proxy's logging phase): the connection is idle until
    /// its next request's first byte.
    between_requests: AtomicBool,
    keepalive_timeout: Duration,
    /// The end of the idle wait, armed by the first read that waits after a response.
    idle_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    metrics: Arc<Metrics>,
    /// Body bytes that went to the client past pingora's writer (spliced, see proxy/splice.rs)
    /// and that it has still to be told of: its next writes are counted against them and go
    /// nowhere, so that it frames the response as complete and keeps the connection.
    sent_aside: AtomicU64,
    /// On HTTP/2: its writes, gathered (see [`Gather`]).
    gather: Option<Gather>,
    /// `client_notsent_lowat`, 0 for the system's setting.
    notsent_lowat: u32,
    /// Whether the socket's unsent bytes are bounded by `notsent_lowat` now.
    unsent_bounded: AtomicBool,
}

/// The most of HTTP/2's writes gathered before they go to the TLS stream.
const GATHER_BYTES: usize = 64 * 1024;

/// How much is gathered before a flush sends it: three 16 KiB frames, under the 64 KiB that
/// rustls takes before it writes to the socket (a fourth frame's header would go in a write of
/// its own).
const SEND_AT: usize = 48 * 1024;

/// HTTP/2's writes gathered into fewer, larger ones. The h2 crate writes each DATA frame on its
/// own (16 KiB, the size clients allow) and flushes after each; over TLS every frame became two
/// records (the frame and its 9-byte header) and a `writev`, several times HTTP/1.1's writes for
/// the same bytes (see docs/benchmarks.md, "HTTP/2 writes gathered"). Gathered, they go out as
/// full records, [`SEND_AT`] or more a write.
///
/// A flush that follows writes is answered at once while less than [`SEND_AT`] is gathered, and the
/// connection's task woken: h2 goes on to its next frame, and a flush with no write before it —
/// h2's last for now, on the wake-up if not sooner — sends what is gathered.
#[derive(Debug, Default)]
struct Gather {
    bytes: Vec<u8>,
    /// How much of `bytes` the TLS stream has taken.
    sent: usize,
    /// Whether bytes were gathered since the last flush.
    wrote: bool,
}

impl Gather {
    /// Hands all that is gathered to `inner`.
    fn poll_send<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        inner: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.sent < self.bytes.len() {
            let sent = ready!(Pin::new(&mut *inner).poll_write(cx, &self.bytes[self.sent..]))?;
            if sent == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += sent;
        }
        self.bytes.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Takes `bufs` (all of them, or as much of the first as a write of its own takes), sending
    /// what was gathered first when they do not fit.
    fn poll_write<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        inner: &mut W,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len: usize = bufs.iter().map(|buf| buf.len()).sum();
        if self.bytes.len() + len > GATHER_BYTES {
            ready!(self.poll_send(inner, cx))?;
        }
        if len > GATHER_BYTES {
            let first = bufs.iter().find(|buf| !buf.is_empty()).map_or(&[][..], |buf| &buf[..]);
            return Pin::new(inner).poll_write(cx, first);
        }
        if self.bytes.capacity() == 0 {
            self.bytes.reserve_exact(GATHER_BYTES);
        }
        for buf in bufs {
            self.bytes.extend_from_slice(buf);
        }
        self.wrote |= len > 0;
        Poll::Ready(Ok(len))
    }

    /// A flush: after writes, while less than [`SEND_AT`] is gathered, answered at once with the
    /// task woken to come back; otherwise what is gathered is sent and `inner` flushed.
    fn poll_flush<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        inner: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if std::mem::take(&mut self.wrote) && self.bytes.len() < SEND_AT {
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        if self.bytes.is_empty() {
            // Nothing gathered or written since the last send: the connection is idle, and an
            // idle HTTP/2 connection holds no buffer (the next write takes one again).
            self.bytes = Vec::new();
        }
        ready!(self.poll_send(inner, cx))?;
        Pin::new(inner).poll_flush(cx)
    }
}

impl std::fmt::Debug for ClientConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConnection")
            .field("inner", &self.inner)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl ClientConnection {
    fn new(
        inner: Stream,
        limits: &ClientLimits,
        slot: Option<Slot>,
        metrics: &Arc<Metrics>,
    ) -> Self {
        Self {
            inner,
            timeout: limits.header_timeout,
            phase: Phase::Header,
            line_ended: false,
            started: None,
            _slot: slot,
            place: None,
            between_requests: AtomicBool::new(false),
            keepalive_timeout: limits.keepalive_timeout,
            idle_timer: None,
            metrics: Arc::clone(metrics),
            sent_aside: AtomicU64::new(0),
            gather: None,
            notsent_lowat: limits.notsent_lowat,
            unsent_bounded: AtomicBool::new(false),
        }
    }

    /// Bounds the unsent bytes the kernel queues on the socket by `client_notsent_lowat`
    /// (`TCP_NOTSENT_LOWAT`), or lets the system's setting decide again. A response the kernel
    /// sends itself (sendfile, splice) is bounded: each call then pushes what it queued out at
    /// once, where a deep queue leaves that work to whatever runs when the client's ACKs come
    /// back — on cache hits more MB/s at less of the machine's CPU per GB. One written from
    /// rangeway's buffers is not: there the bound only splits each write in two (more calls and
    /// wake-ups, worse on an aes128gcm route). Both measured: see docs/benchmarks.md, "The unsent
    /// bound". A connection keeps its setting until a response of the other way; one that the
    /// socket refuses leaves the system's.
    pub(crate) fn bound_unsent(&self, bounded: bool) {
        if self.notsent_lowat == 0
            || self.unsent_bounded.swap(bounded, Ordering::Relaxed) == bounded
        {
            return;
        }
        let Some(tcp) = self.inner.as_any().downcast_ref::<TcpStream>() else { return };
        // SAFETY: the descriptor belongs to `self.inner`, borrowed for this whole call.
        #[allow(unsafe_code)]
        let fd = unsafe { BorrowedFd::borrow_raw(tcp.as_raw_fd()) };
        // 0 is the kernel's "the system's setting".
        let lowat = if bounded { self.notsent_lowat } else { 0 };
        if let Err(e) = socket2::SockRef::from(&fd).set_tcp_notsent_lowat(lowat) {
            debug!(error = %e, "TCP_NOTSENT_LOWAT refused: the system's setting stays");
        }
    }

    /// Its response has ended: until its next request begins it is idle, and may be closed (after
    /// `client_keepalive_timeout`, or to make room for a new connection).
    pub(crate) fn response_ended(&self) {
        self.between_requests.store(true, Ordering::Relaxed);
        if let Some(place) = &self.place {
            place.idle();
        }
    }

    /// Whether an idle connection is to be closed now; when not, its task is woken at its
    /// keepalive deadline or when it is told to make room.
    fn idle_over(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(place) = &self.place {
            place.presence.waker.register(cx.waker());
            if place.evicted() {
                return true;
            }
        }
        let timeout = self.keepalive_timeout;
        let timer = self.idle_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if timer.as_mut().poll(cx).is_ready() {
            self.metrics.connection_refused("keepalive_timeout");
            debug!(?timeout, "idle longer than client_keepalive_timeout: closing the connection");
            return true;
        }
        false
    }

    /// Bytes of the next request came: the connection is busy again.
    fn next_request(&mut self) {
        self.between_requests.store(false, Ordering::Relaxed);
        self.idle_timer = None;
        if let Some(place) = &self.place {
            place.busy();
        }
    }

    /// The admission wrapper of a client connection, when it has one.
    pub(crate) fn of(stream: &Stream) -> Option<&ClientConnection> {
        stream.as_any().downcast_ref()
    }

    /// `bytes` of the response body went out by another way: the next `bytes` pingora writes
    /// are its account of them (see `sent_aside`).
    pub(crate) fn note_sent_aside(&self, bytes: u64) {
        self.sent_aside.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes sent aside that pingora has not accounted for yet.
    pub(crate) fn unaccounted(&self) -> u64 {
        self.sent_aside.load(Ordering::Relaxed)
    }

    /// How much of `len` bytes being written were sent aside already: taken off the account.
    fn take_sent_aside(&mut self, len: usize) -> usize {
        let aside = self.sent_aside.get_mut();
        let taken = (*aside).min(len as u64);
        *aside -= taken;
        taken as usize
    }

    /// Follows the bytes just read: a header's first byte starts its clock, its blank line
    /// stops it.
    fn saw(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.phase == Phase::Frames {
            return;
        }
        if self.phase == Phase::Response {
            self.phase = Phase::Header;
            self.line_ended = false;
        }
        if self.phase != Phase::Header {
            return;
        }
        if self.started.is_none() {
            self.started = Some((Instant::now(), None));
        }
        // The header ends with an empty line. Lines end with CRLF, or a bare LF, which the
        // parser accepts too (RFC 9112 §2.2): a header ended so must stop the clock as well.
        for &byte in bytes {
            match byte {
                b'\n' if self.line_ended => {
                    self.phase = Phase::Request;
                    self.started = None;
                    return;
                }
                b'\n' => self.line_ended = true,
                b'\r' => {}
                _ => self.line_ended = false,
            }
        }
    }

    /// A write: whatever was read, the request has been taken and its answer is going out. (On
    /// HTTP/2 there is no header to time, ever.)
    fn answering(&mut self) {
        if self.phase != Phase::Frames {
            self.phase = Phase::Response;
        }
        self.started = None;
    }

    fn late(&self) -> io::Error {
        self.metrics.connection_refused("header_timeout");
        debug!(timeout = ?self.timeout, "{HEADER_TIMED_OUT}: closing the connection");
        io::Error::new(io::ErrorKind::TimedOut, format!("{HEADER_TIMED_OUT} ({:?})", self.timeout))
    }
}

impl AsyncRead for ClientConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = result {
            this.saw(&buf.filled()[before..]);
        }
        if *this.between_requests.get_mut() {
            match &result {
                Poll::Ready(Ok(())) if buf.filled().len() > before => this.next_request(),
                // Nothing read: the end of the stream, as the client closing would be, which
                // pingora takes quietly.
                Poll::Pending if this.idle_over(cx) => return Poll::Ready(Ok(())),
                _ => {}
            }
        }
        if this.phase == Phase::Header
            && let Some((started, timer)) = this.started.as_mut()
        {
            // Checked on every read, so that a header dribbled byte by byte, which never leaves
            // a read waiting, is cut off too.
            if started.elapsed() >= this.timeout {
                return Poll::Ready(Err(this.late()));
            }
            // The header is unfinished: the timer wakes this connection at its deadline.
            let at = tokio::time::Instant::from_std(*started + this.timeout);
            let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(this.late()));
            }
        }
        result
    }
}

impl AsyncWrite for ClientConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.answering();
        if let Some(gather) = this.gather.as_mut() {
            return gather.poll_write(&mut this.inner, cx, &[io::IoSlice::new(buf)]);
        }
        match this.take_sent_aside(buf.len()) {
            0 => Pin::new(&mut this.inner).poll_write(cx, buf),
            taken => Poll::Ready(Ok(taken)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.gather.as_mut() {
            Some(gather) => gather.poll_flush(&mut this.inner, cx),
            None => Pin::new(&mut this.inner).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(gather) = this.gather.as_mut() {
            ready!(gather.poll_send(&mut this.inner, cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.answering();
        if let Some(gather) = this.gather.as_mut() {
            return gather.poll_write(&mut this.inner, cx, bufs);
        }
        let first = bufs.iter().find(|buf| !buf.is_empty()).map_or(0, |buf| buf.len());
        match this.take_sent_aside(first) {
            0 => Pin::new(&mut this.inner).poll_write_vectored(cx, bufs),
            taken => Poll::Ready(Ok(taken)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        // Gathered writes take a frame's header and payload in one call.
        self.gather.is_some() || self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for ClientConnection {
    async fn shutdown(&mut self) {
        if let Some(gather) = self.gather.as_mut() {
            let inner = &mut self.inner;
            // A connection being closed: what cannot be sent is lost with it.
            let _ = std::future::poll_fn(|cx| gather.poll_send(inner, cx)).await;
        }
        Shutdown::shutdown(self.inner.as_mut()).await;
    }
}

impl UniqueID for ClientConnection {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for ClientConnection {
    fn get_ssl(&self) -> Option<&pingora_core::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora_core::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<pingora_core::protocols::ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for ClientConnection {
    fn get_timing_digest(&self) -> Vec<Option<pingora_core::protocols::TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for ClientConnection {
    fn get_proxy_digest(&self) -> Option<Arc<pingora_core::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for ClientConnection {
    fn get_socket_digest(&self) -> Option<Arc<pingora_core::protocols::SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for ClientConnection {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod gather_tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use super::*;

    /// A socket's stand-in: every write it was handed, and its flushes.
    #[derive(Default)]
    struct Recorded {
        writes: Vec<Vec<u8>>,
        flushes: usize,
    }

    impl AsyncWrite for Recorded {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What h2 does with a DATA frame: its 9-byte header and payload in one vectored write,
    /// then a flush.
    fn frame(
        gather: &mut Gather,
        out: &mut Recorded,
        cx: &mut Context<'_>,
        payload: &[u8],
    ) -> Poll<io::Result<()>> {
        let header = [0u8; 9];
        let bufs = [io::IoSlice::new(&header), io::IoSlice::new(payload)];
        assert_eq!(
            gather.poll_write(out, cx, &bufs).map(Result::unwrap),
            Poll::Ready(9 + payload.len())
        );
        gather.poll_flush(out, cx)
    }

    #[test]
    fn frames_go_out_three_at_a_time_and_the_last_on_the_next_flush() {
        let wakes = Arc::new(Wakes::default());
        let waker = Arc::clone(&wakes).into();
        let mut cx = Context::from_waker(&waker);
        let (mut gather, mut out) = (Gather::default(), Recorded::default());
        let payload = vec![7u8; 16 * 1024];
        for _ in 0..2 {
            assert!(frame(&mut gather, &mut out, &mut cx, &payload).is_ready());
        }
        assert!(out.writes.is_empty(), "two frames are held");
        assert_eq!(wakes.0.load(Ordering::Relaxed), 2, "each held flush wakes the task");
        assert!(frame(&mut gather, &mut out, &mut cx, &payload).is_ready());
        assert_eq!(out.writes.len(), 1, "the third frame's flush sends all three");
        assert_eq!(out.writes[0].len(), 3 * (9 + payload.len()));
        assert_eq!(out.flushes, 1);
        // A fourth frame, then h2's last flush of the burst (held), then a flush after no write.
        assert!(frame(&mut gather, &mut out, &mut cx, &payload).is_ready());
        assert_eq!(out.writes.len(), 1);
        assert!(gather.poll_flush(&mut out, &mut cx).is_ready());
        assert_eq!(out.writes.len(), 2, "a flush with no write before it sends");
        assert_eq!(out.writes[1].len(), 9 + payload.len());
        assert_eq!(out.flushes, 2);
        // Idle: the next flush finds nothing, and the buffer is let go.
        assert!(gather.poll_flush(&mut out, &mut cx).is_ready());
        assert_eq!((gather.bytes.capacity(), out.writes.len()), (0, 2));
    }

    #[test]
    fn a_write_past_the_gathering_goes_out_after_what_was_gathered() {
        let waker = Arc::new(Wakes::default()).into();
        let mut cx = Context::from_waker(&waker);
        let (mut gather, mut out) = (Gather::default(), Recorded::default());
        assert!(frame(&mut gather, &mut out, &mut cx, b"small").is_ready());
        let large = vec![1u8; GATHER_BYTES + 1];
        let wrote = gather.poll_write(&mut out, &mut cx, &[io::IoSlice::new(&large)]);
        assert_eq!(wrote.map(Result::unwrap), Poll::Ready(large.len()));
        let sizes: Vec<usize> = out.writes.iter().map(Vec::len).collect();
        assert_eq!(sizes, [14, large.len()], "in order, the large one as it came");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn test_limits() -> ClientLimits {
        ClientLimits { header_timeout: Duration::from_secs(5), ..ClientLimits::default() }
    }

    /// The bound is the socket's own setting, read back from the kernel: set for a kernel way,
    /// lifted for the next response written from rangeway's buffers, set again after.
    #[tokio::test]
    async fn the_unsent_bound_follows_the_way_each_response_goes() {
        let bounded_at = |notsent_lowat| ClientLimits { notsent_lowat, ..test_limits() };
        let (inner, probe, _peer) = tcp_pair().await;
        let system = probe.tcp_notsent_lowat().unwrap();
        let watched =
            ClientConnection::new(inner, &bounded_at(65_536), None, &Arc::new(Metrics::new()));
        for (bounded, want) in [(true, 65_536), (true, 65_536), (false, system), (true, 65_536)] {
            watched.bound_unsent(bounded);
            assert_eq!(probe.tcp_notsent_lowat().unwrap(), want, "bounded: {bounded}");
        }
        let (inner, probe, _peer) = tcp_pair().await;
        let untouched =
            ClientConnection::new(inner, &bounded_at(0), None, &Arc::new(Metrics::new()));
        untouched.bound_unsent(true);
        assert_eq!(probe.tcp_notsent_lowat().unwrap(), system, "0 leaves the system's setting");
    }

    /// A connected TCP pair: our end as pingora's stream, a handle on its socket to read its
    /// options with, and the peer.
    async fn tcp_pair() -> (Stream, socket2::Socket, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (ours, _) = listener.accept().await.unwrap();
        let probe = socket2::SockRef::from(&ours).try_clone().unwrap();
        (Box::new(pingora_core::protocols::l4::stream::Stream::from(ours)), probe, peer)
    }

    #[tokio::test]
    async fn bytes_sent_aside_are_swallowed_and_the_rest_goes_out() {
        let (ours, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let inner: Stream = Box::new(pingora_core::protocols::l4::stream::Stream::from(ours));
        let metrics = Arc::new(Metrics::new());
        // As the relay finds it: behind pingora's stream type.
        let mut stream: Stream =
            Box::new(ClientConnection::new(inner, &test_limits(), None, &metrics));
        ClientConnection::of(&stream).expect("the wrapper behind the stream").note_sent_aside(10);
        stream.write_all(b"0123456").await.unwrap();
        stream.write_all(b"789abc").await.unwrap();
        stream.flush().await.unwrap();
        drop(stream);
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"abc", "only what was not sent aside reaches the peer");
    }

    /// The clock stops at the header's empty line, however its lines end, and only there.
    #[tokio::test]
    async fn a_header_ends_at_its_empty_line_with_crlf_or_bare_lf() {
        let (ours, _peer) = tokio::net::UnixStream::pair().unwrap();
        let inner: Stream = Box::new(pingora_core::protocols::l4::stream::Stream::from(ours));
        let mut watched =
            ClientConnection::new(inner, &test_limits(), None, &Arc::new(Metrics::new()));
        for (header, ends) in [
            (&b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..], true),
            (b"GET / HTTP/1.1\nHost: a\n\n", true),
            (b"GET / HTTP/1.1\r\nHost: a\n\r\n", true),
            (b"GET / HTTP/1.1\r\nHost: a\r\n", false),
            (b"GET / HTTP/1.1\nHost: a\r\nX: \r\r\n", false),
        ] {
            watched.phase = Phase::Response;
            // In two reads, split everywhere: where a read ends must not matter.
            for cut in 0..header.len() {
                watched.phase = Phase::Response;
                watched.saw(&header[..cut]);
                watched.saw(&header[cut..]);
                let ended = watched.phase == Phase::Request;
                assert_eq!(ended, ends, "{:?} cut at {cut}", String::from_utf8_lossy(header));
                assert_eq!(watched.started.is_none(), ends);
            }
        }
    }
}
