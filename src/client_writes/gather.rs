//! An HTTP/2 connection's writes, gathered into fewer and larger ones before they reach its TLS
//! stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWrite;

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
pub(super) struct Gather {
    bytes: Vec<u8>,
    /// How much of `bytes` the TLS stream has taken.
    sent: usize,
    /// Whether bytes were gathered since the last flush.
    wrote: bool,
}

impl Gather {
    /// Hands all that is gathered to `inner`.
    pub(super) fn poll_send<W: AsyncWrite + Unpin + ?Sized>(
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
    pub(super) fn poll_write<W: AsyncWrite + Unpin + ?Sized>(
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
    pub(super) fn poll_flush<W: AsyncWrite + Unpin + ?Sized>(
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
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
