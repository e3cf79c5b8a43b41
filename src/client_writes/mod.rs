//! What the deliver step (`proxy/deliver/`) needs of a client connection's writes that pingora's
//! stream does not do: body bytes sent past pingora's writer (spliced, or sent from the cache's
//! files) accounted, the socket's unsent bytes bounded while the kernel sends a body, and an
//! HTTP/2 connection's writes gathered ([`gather`]). The deliver step decides each
//! (`proxy/deliver/send_accounting.rs`); admission's `ClientConnection`, the wrapper every client
//! connection's bytes pass through, holds one [`ClientWrites`] and hands it its writes. It lives
//! beneath both, importing neither, so that admission does not import from the proxy above it.

mod gather;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use pingora_core::protocols::Stream;
use pingora_core::protocols::l4::stream::Stream as TcpStream;
use tokio::io::AsyncWrite;
use tracing::debug;

use gather::Gather;

/// A client connection's writes as the deliver step shapes them.
#[derive(Debug)]
pub(crate) struct ClientWrites {
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

impl ClientWrites {
    /// A connection's, its unsent bytes to be bounded by `notsent_lowat` (`client_notsent_lowat`,
    /// 0 for the system's setting) while the kernel sends a body.
    pub(crate) fn new(notsent_lowat: u32) -> Self {
        Self {
            sent_aside: AtomicU64::new(0),
            gather: None,
            notsent_lowat,
            unsent_bounded: AtomicBool::new(false),
        }
    }

    /// From now on its writes are gathered: an HTTP/2 connection's.
    pub(crate) fn gather(&mut self) {
        self.gather = Some(Gather::default());
    }

    /// Bounds the unsent bytes the kernel queues on `socket` by `client_notsent_lowat`
    /// (`TCP_NOTSENT_LOWAT`), or lets the system's setting decide again. A response the kernel
    /// sends itself (sendfile, splice) is bounded: each call then pushes what it queued out at
    /// once, where a deep queue leaves that work to whatever runs when the client's ACKs come
    /// back — on cache hits more MB/s at less of the machine's CPU per GB. One written from
    /// rangeway's buffers is not: there the bound only splits each write in two (more calls and
    /// wake-ups, worse on an aes128gcm route). Both measured: see docs/benchmarks.md, "The unsent
    /// bound". A connection keeps its setting until a response of the other way; one that the
    /// socket refuses leaves the system's.
    pub(crate) fn bound_unsent(&self, socket: &Stream, bounded: bool) {
        if self.notsent_lowat == 0
            || self.unsent_bounded.swap(bounded, Ordering::Relaxed) == bounded
        {
            return;
        }
        let Some(tcp) = socket.as_any().downcast_ref::<TcpStream>() else { return };
        // SAFETY: the descriptor belongs to `socket`, borrowed for this whole call.
        #[allow(unsafe_code)]
        let fd = unsafe { BorrowedFd::borrow_raw(tcp.as_raw_fd()) };
        // 0 is the kernel's "the system's setting".
        let lowat = if bounded { self.notsent_lowat } else { 0 };
        if let Err(e) = socket2::SockRef::from(&fd).set_tcp_notsent_lowat(lowat) {
            debug!(error = %e, "TCP_NOTSENT_LOWAT refused: the system's setting stays");
        }
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

    /// A write of `buf` to `inner`: gathered, swallowed as pingora's account of bytes sent
    /// aside, or written.
    pub(crate) fn poll_write(
        &mut self,
        inner: &mut Stream,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(gather) = self.gather.as_mut() {
            return gather.poll_write(inner, cx, &[io::IoSlice::new(buf)]);
        }
        match self.take_sent_aside(buf.len()) {
            0 => Pin::new(inner).poll_write(cx, buf),
            taken => Poll::Ready(Ok(taken)),
        }
    }

    /// A vectored write of `bufs` to `inner`, as [`Self::poll_write`].
    pub(crate) fn poll_write_vectored(
        &mut self,
        inner: &mut Stream,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(gather) = self.gather.as_mut() {
            return gather.poll_write(inner, cx, bufs);
        }
        let first = bufs.iter().find(|buf| !buf.is_empty()).map_or(0, |buf| buf.len());
        match self.take_sent_aside(first) {
            0 => Pin::new(inner).poll_write_vectored(cx, bufs),
            taken => Poll::Ready(Ok(taken)),
        }
    }

    pub(crate) fn poll_flush(
        &mut self,
        inner: &mut Stream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        match self.gather.as_mut() {
            Some(gather) => gather.poll_flush(inner, cx),
            None => Pin::new(inner).poll_flush(cx),
        }
    }

    /// What is gathered sent, before `inner` is shut down.
    pub(crate) fn poll_shutdown(
        &mut self,
        inner: &mut Stream,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(gather) = self.gather.as_mut() {
            ready!(gather.poll_send(inner, cx))?;
        }
        Pin::new(inner).poll_shutdown(cx)
    }

    /// What is gathered sent, as the connection closes: what cannot be sent is lost with it.
    pub(crate) async fn send_gathered(&mut self, inner: &mut Stream) {
        if let Some(gather) = self.gather.as_mut() {
            let _ = std::future::poll_fn(|cx| gather.poll_send(inner, cx)).await;
        }
    }

    pub(crate) fn is_write_vectored(&self, inner: &Stream) -> bool {
        // Gathered writes take a frame's header and payload in one call.
        self.gather.is_some() || inner.is_write_vectored()
    }
}
