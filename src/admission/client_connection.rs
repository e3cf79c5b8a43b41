//! The wrapper every client connection's stream is given: it times each request header, closes
//! the connection idle too long or when its place is needed, and hands its writes to the
//! delivery's [`ClientWrites`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tracing::debug;

use super::connections::Place;
use super::{ClientLimits, HEADER_TIMED_OUT, Slot};
use crate::client_socket::ClientSocket;
use crate::client_writes::ClientWrites;
use crate::telemetry::metrics::Metrics;

/// Where a connection is in its request/response cycle, as seen from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
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
    pub(super) phase: Phase,
    /// Whether the last byte read (ignoring `\r`) ended a line: a line end there ends the header.
    line_ended: bool,
    /// When the current header's first byte arrived, and the timer that fires at its deadline:
    /// armed only once a read leaves the header unfinished (most headers come in one read and
    /// need none), dropped with the header (a timer left armed would wake the connection later
    /// for nothing).
    started: Option<(Instant, Option<Pin<Box<tokio::time::Sleep>>>)>,
    _slot: Option<Slot>,
    /// Its place among `max_connections` (none in unit tests).
    pub(super) place: Option<Place>,
    /// Set when a response has ended (the proxy's logging phase): the connection is idle until
    /// its next request's first byte.
    between_requests: AtomicBool,
    keepalive_timeout: Duration,
    /// The end of the idle wait, armed by the first read that waits after a response.
    idle_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    metrics: Arc<Metrics>,
    /// What the deliver step needs of its writes: bytes sent aside, the unsent bound, HTTP/2's
    /// writes gathered.
    pub(super) writes: ClientWrites,
    /// The duplicate of its socket its requests' steps use ([`Self::socket`]).
    socket: OnceLock<Arc<ClientSocket>>,
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
    pub(super) fn new(
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
            writes: ClientWrites::new(limits.notsent_lowat),
            socket: OnceLock::new(),
        }
    }

    /// A duplicate of the connection's socket, registered with the reactor on its own, for the
    /// steps of its requests: the client watch, the kernel's ways of a body, the live view. Made
    /// at the first request that asks and kept for the connection's life, so that a kept-alive
    /// connection's next requests skip making one (dup, its registration and their undoing: four
    /// system calls a request).
    pub(crate) fn socket(&self) -> io::Result<Arc<ClientSocket>> {
        if let Some(socket) = self.socket.get() {
            return Ok(Arc::clone(socket));
        }
        let socket = Arc::new(ClientSocket::duplicate(self.inner.id())?);
        Ok(Arc::clone(self.socket.get_or_init(|| socket)))
    }

    /// Bounds the socket's unsent bytes while the kernel sends a body, or lifts the bound (see
    /// `ClientWrites::bound_unsent`).
    pub(crate) fn bound_unsent(&self, bounded: bool) {
        self.writes.bound_unsent(&self.inner, bounded);
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

    /// `bytes` of the response body went out by another way (see `ClientWrites::note_sent_aside`).
    pub(crate) fn note_sent_aside(&self, bytes: u64) {
        self.writes.note_sent_aside(bytes);
    }

    /// Bytes sent aside that pingora has not accounted for yet.
    pub(crate) fn unaccounted(&self) -> u64 {
        self.writes.unaccounted()
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

    /// A write of `bytes`: whatever was read, the request has been taken and its answer is going
    /// out — unless they are an interim answer (`100 Continue`), after which the request's body
    /// comes, not the next header. (On HTTP/2 there is no header to time, ever.)
    fn answering(&mut self, bytes: &[u8]) {
        if self.phase == Phase::Request && is_interim(bytes) {
            return;
        }
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
        this.answering(buf);
        this.writes.poll_write(&mut this.inner, cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.writes.poll_flush(&mut this.inner, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.writes.poll_shutdown(&mut this.inner, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.answering(bufs.first().map_or(&[], |buf| &buf[..]));
        this.writes.poll_write_vectored(&mut this.inner, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.writes.is_write_vectored(&self.inner)
    }
}

#[async_trait]
impl Shutdown for ClientConnection {
    async fn shutdown(&mut self) {
        self.writes.send_gathered(&mut self.inner).await;
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

/// Whether `bytes`, the first written for a request, begin an interim answer's status line
/// (`HTTP/1.1 1xx`): pingora writes a header in one piece.
fn is_interim(bytes: &[u8]) -> bool {
    bytes.strip_prefix(b"HTTP/1.").and_then(|rest| rest.get(2)) == Some(&b'1')
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    /// A connection watched as a client's, and the other end of its socket.
    fn watched_pair() -> (ClientConnection, tokio::net::UnixStream) {
        let (ours, peer) = tokio::net::UnixStream::pair().unwrap();
        let inner: Stream = Box::new(pingora_core::protocols::l4::stream::Stream::from(ours));
        (ClientConnection::new(inner, &test_limits(), None, &Arc::new(Metrics::new())), peer)
    }

    /// A kept-alive connection's requests share one duplicate of its socket, which writes reach
    /// the peer through, and which closes with the connection.
    #[tokio::test]
    async fn the_requests_of_a_connection_share_one_duplicate_of_its_socket() {
        let (watched, mut peer) = watched_pair();
        let first = watched.socket().unwrap();
        let second = watched.socket().unwrap();
        assert!(Arc::ptr_eq(&first, &second), "a second duplicate");
        second.write_all(b"through the duplicate", Duration::from_secs(5)).await.unwrap();
        let mut got = [0u8; 21];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"through the duplicate");
        let shared = first.shared_fd();
        drop((first, second, watched));
        assert_eq!(Arc::strong_count(&shared), 1, "the connection kept its duplicate");
    }

    /// The clock stops at the header's empty line, however its lines end, and only there.
    #[tokio::test]
    async fn a_header_ends_at_its_empty_line_with_crlf_or_bare_lf() {
        let (mut watched, _peer) = watched_pair();
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

    /// A `100 Continue` is not the answer: the body read after it is not timed as a header, and
    /// the final answer's write ends the request as any does.
    #[tokio::test]
    async fn a_body_after_100_continue_is_not_taken_for_a_header() {
        let (mut watched, _peer) = watched_pair();
        watched.saw(b"POST / HTTP/1.1\r\nContent-Length: 9\r\nExpect: 100-continue\r\n\r\n");
        assert_eq!(watched.phase, Phase::Request);
        watched.answering(b"HTTP/1.1 100 Continue\r\n\r\n");
        watched.saw(b"the body");
        assert!(watched.phase == Phase::Request && watched.started.is_none(), "not timed");
        watched.answering(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(watched.phase, Phase::Response);
        assert!(!is_interim(b"100 bytes of a body"));
    }
}
