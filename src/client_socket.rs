//! The client's socket as rangeway writes it itself — splice and sendfile send to it, the client
//! watch sees it close, the live view reads what the client took — beside pingora's stream, which
//! owns it: a duplicate of the descriptor, registered with tokio's reactor on its own, made once a
//! connection (`ClientConnection::socket`; over TLS, whose stream wraps that one, once a request).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pingora_core::protocols::Stream;
use tokio::io::unix::AsyncFd;

use crate::unless::Unless;

/// The most one sendfile(2) is asked to send, as nginx's `sendfile_max_chunk`: a call holds the
/// socket's lock while it copies, and other work of the thread waits. A larger cap saved no CPU
/// on cache hits (see docs/benchmarks.md, "The sendfile chunk").
const SENDFILE_BYTES: usize = 2 << 20;

/// A client's socket, which rangeway writes itself and watches for its close, beside the
/// connection object that owns it.
#[derive(Debug)]
pub(crate) struct ClientSocket {
    /// A duplicate of the socket, registered with tokio's reactor on its own (the original is
    /// registered by its owner, and one descriptor cannot be registered twice); shared with the
    /// live view ([`Self::shared_fd`]).
    fd: AsyncFd<Arc<OwnedFd>>,
}

/// Whether the stream is a plain socket: not TLS, and a socket at all — a stream in memory has
/// no socket digest, and its id names no descriptor of its own.
pub(crate) fn is_plain(stream: Option<&Stream>) -> bool {
    stream.is_some_and(|s| s.get_ssl_digest().is_none() && s.get_socket_digest().is_some())
}

impl ClientSocket {
    /// Takes hold of the socket `raw`, owned by a connection that outlives this value (pingora's
    /// session holds it, and the caller holds the session for longer than this call).
    #[allow(unsafe_code)]
    pub(crate) fn duplicate(raw: RawFd) -> io::Result<Self> {
        // SAFETY: `raw` is open for the length of this call (above); it is only borrowed to be
        // duplicated, and the duplicate is what this value owns.
        let owned = rustix::io::fcntl_dupfd_cloexec(unsafe { BorrowedFd::borrow_raw(raw) }, 0)?;
        // SAFETY: an `OwnedFd` is open and names the same description until it is dropped, which
        // the `AsyncFd` owning it does last.
        let fd = unsafe { AsyncFd::register(Arc::new(owned)) }.map_err(io::Error::from)?;
        Ok(Self { fd })
    }

    /// The duplicate descriptor, for a reader that outlives this value (the live view).
    pub(crate) fn shared_fd(&self) -> Arc<OwnedFd> {
        Arc::clone(self.fd.get_ref())
    }

    /// Writes all of `bytes`, each wait for the socket bounded by `timeout`.
    pub(crate) async fn write_all(&self, mut bytes: &[u8], timeout: Duration) -> io::Result<()> {
        while !bytes.is_empty() {
            let (written, _) =
                self.send(bytes.len(), timeout, |fd| Ok(rustix::io::write(fd, bytes)?)).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            bytes = &bytes[written..];
        }
        Ok(())
    }

    /// Sends `len` bytes of `file` from `offset` with sendfile(2): the pages go from the page
    /// cache to the socket without entering rangeway's memory. Each wait for the socket bounded
    /// by `timeout`; `delivered` is told of every send.
    pub(crate) async fn send_file(
        &self,
        file: &std::fs::File,
        mut offset: u64,
        len: u64,
        timeout: Duration,
        mut delivered: impl FnMut(usize),
    ) -> io::Result<()> {
        let end = offset + len;
        // Bytes sent since this task last let the thread's other tasks run: a client that takes
        // all it is sent never makes a send wait, and would otherwise hold the thread for the
        // whole file while the thread's other downloads wait (as splice, after each pipe-full).
        let mut since_yield = 0;
        while offset < end {
            if since_yield >= SENDFILE_BYTES {
                since_yield = 0;
                tokio::task::yield_now().await;
            }
            // As much as the socket takes: the kernel sends from the page cache, no buffer here.
            let want = usize::try_from(end - offset).unwrap_or(usize::MAX).min(SENDFILE_BYTES);
            let (sent, waited) = self
                .send(want, timeout, |fd| {
                    Ok(rustix::fs::sendfile(fd, file, Some(&mut offset), want)?)
                })
                .await?;
            if sent == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            since_yield = if waited { sent } else { since_yield + sent };
            delivered(sent);
        }
        Ok(())
    }

    /// Waits until the peer closes the connection (its FIN or a reset). Bytes it sends meanwhile
    /// (a pipelined request, a TLS alert) are left for their reader, and the watch goes on: a
    /// client that sent its next request and then hung up is gone all the same.
    pub(crate) async fn closed(&self) {
        loop {
            let Ok(mut guard) = self.fd.readable().await else { return };
            // The peer's FIN or reset is an event of its own that says the read side closed
            // (EPOLLRDHUP, EPOLLHUP): nothing need be read to tell it from bytes. Any other
            // readiness is bytes for their reader, or the connection's own request read since
            // the readiness was set (the duplicate is kept across requests): set aside without a
            // call, edge-triggered, the next wake-up is the peer's next bytes or its close.
            if guard.ready().is_read_closed() {
                return;
            }
            guard.clear_ready();
        }
    }

    /// `work`'s outcome, or `Err(())` as soon as the peer closes the connection.
    pub(crate) fn unless_closed<W: Future>(
        &self,
        work: W,
    ) -> Unless<W, impl Future<Output = ()> + '_> {
        Unless::new(work, self.closed())
    }

    /// Writes with `op` what the socket takes of `want` bytes, waiting at most `timeout` for room:
    /// the bytes written, and whether this task had to wait (and so let the thread's others
    /// run). Fewer than `want` means the socket is full: it is taken for no longer ready, and the
    /// next write waits for it to have room again rather than first try and fail (as nginx reads
    /// its events).
    pub(crate) async fn send(
        &self,
        want: usize,
        timeout: Duration,
        mut op: impl FnMut(BorrowedFd<'_>) -> io::Result<usize>,
    ) -> io::Result<(usize, bool)> {
        let mut waited = false;
        loop {
            let mut guard =
                ready_within(timeout, &mut waited, |cx| self.fd.poll_write_ready(cx)).await?;
            match guard.try_io(|fd| op(fd.get_ref().as_fd())) {
                Ok(result) => {
                    // A readiness event that came after the guard's is not cleared (tokio's ticks).
                    if result.as_ref().is_ok_and(|written| *written < want) {
                        guard.clear_ready();
                    }
                    return result.map(|written| (written, waited));
                }
                Err(_would_block) => {}
            }
        }
    }
}

/// What `poll` gives once ready, waiting at most `timeout`; `waited` is set when it had to wait
/// (and so let the thread's other tasks run).
pub(crate) async fn ready_within<T>(
    timeout: Duration,
    waited: &mut bool,
    mut poll: impl FnMut(&mut Context<'_>) -> Poll<io::Result<T>>,
) -> io::Result<T> {
    let ready = std::future::poll_fn(|cx| {
        let ready = poll(cx);
        *waited |= ready.is_pending();
        ready
    });
    tokio::time::timeout(timeout, ready)
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream, UnixStream};

    /// The watch over a TCP connection's socket, kept across its requests: bytes (a request read
    /// by its reader since, a pipelined one waiting) are not a close; the peer's FIN is, with
    /// bytes unread or not.
    #[tokio::test]
    async fn only_the_peers_close_ends_the_watch_not_its_bytes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut served, _) = listener.accept().await.unwrap();
        let watch = ClientSocket::duplicate(served.as_raw_fd()).unwrap();
        let open_for = |watch| tokio::time::timeout(Duration::from_millis(100), watch);
        // A request its reader took: the readiness it left is not a close.
        peer.write_all(b"GET /one HTTP/1.1\r\n\r\n").await.unwrap();
        let mut request = [0u8; 21];
        served.read_exact(&mut request).await.unwrap();
        assert!(open_for(watch.closed()).await.is_err(), "a read request taken for a close");
        // A pipelined request waiting for its reader is not one either.
        peer.write_all(b"GET /two HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(open_for(watch.closed()).await.is_err(), "a waiting request taken for a close");
        // The peer's FIN is, its request still unread.
        drop(peer);
        assert!(open_for(watch.closed()).await.is_ok(), "the close not seen");
    }

    #[tokio::test]
    async fn write_all_writes_everything() {
        let (downstream, mut client) = UnixStream::pair().unwrap();
        let body = (0..2 << 20).map(|i: usize| (i * 7) as u8).collect::<Vec<u8>>();
        let expected = body.clone();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        let to = ClientSocket::duplicate(downstream.as_raw_fd()).unwrap();
        to.write_all(&body, Duration::from_secs(5)).await.unwrap();
        drop((to, downstream));
        assert!(reader.await.unwrap() == expected);
    }
}
