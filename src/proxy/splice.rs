//! Moving an untouched body from the origin's socket to the client's without it entering
//! rangeway's memory: `splice(2)` through a pipe of rangeway's own, the kernel handing the pages
//! on. Where pingora reads each chunk into a buffer, copies it into a `Bytes` and writes it out
//! again (two copies across the user boundary and one more inside the process), a spliced body
//! costs a few system calls per pipe-full and no allocation.
//!
//! Only for plain TCP or Unix sockets on both sides (TLS needs the bytes) and a body the client
//! gets exactly as the origin sends it.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pingora_core::protocols::Stream;
use pingora_core::protocols::l4::stream::Stream as L4Stream;
use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};
use tracing::debug;

use crate::client_socket::{ClientSocket, ready_within};

/// The most a pipe holds, and so what one spliced body has in flight between the origin's socket
/// and the client's; the kernel moves up to this much a call. The largest pipe an unprivileged
/// process may ask for (`fs.pipe-max-size`). Larger pipes mean fewer, larger splice calls: under
/// default TCP settings they cut rangeway's CPU per GB against 256 KiB ones, among few bodies and
/// among many (see docs/benchmarks.md, "Pipe sizes").
const PIPE_MAX_BYTES: usize = 1 << 20;

/// The least a spliced body gets: the kernel's default pipe. A body that cannot have one is
/// copied by the relay instead.
const PIPE_MIN_BYTES: usize = 64 << 10;

/// What the pipes of all bodies being spliced may hold together, and so about the most kernel
/// memory the bodies in flight hold when every client is slower than its origin. Each body's
/// pipe is an equal share of it ([`PipeBudget::share`]): 1 MiB while at most 128 bodies are
/// spliced at once, 512 KiB up to 256, 256 KiB up to 512, 128 KiB up to 1 024, 64 KiB up to
/// 2 048; past that a body is copied. Where the kernel's per-user quota binds, less
/// ([`pipes_limit`]). As much as nginx buffered in memory holds at 128 connections with the
/// harness's 16 × 64 KiB buffers.
const PIPES_MAX_BYTES: usize = 128 << 20;

/// An origin connection's socket, lent by pingora's stream for rangeway's own reads (splice, a
/// direct body): read through tokio's registration of it, pingora's, so that none is duplicated
/// and registered for a response (four system calls).
#[derive(Clone, Copy, Debug)]
pub(super) enum OriginSocket<'s> {
    Tcp(&'s TcpStream),
    Unix(&'s UnixStream),
}

impl<'s> OriginSocket<'s> {
    /// The socket of `stream`: one of pingora's plain sockets whose buffers hold none of its bytes
    /// (a reader of the socket would skip them). None for TLS, or a stream in memory.
    pub(super) fn of(stream: Option<&'s Stream>) -> Option<Self> {
        let l4 = stream?.as_any().downcast_ref::<L4Stream>()?;
        l4.tcp_socket().map(Self::Tcp).or_else(|| l4.unix_socket().map(Self::Unix))
    }

    fn fd(self) -> BorrowedFd<'s> {
        match self {
            Self::Tcp(socket) => socket.as_fd(),
            Self::Unix(socket) => socket.as_fd(),
        }
    }

    /// `op`'s result if tokio has the socket readable; a would-block `op` returns clears that.
    fn try_read<T>(self, op: impl FnOnce(BorrowedFd<'_>) -> io::Result<T>) -> io::Result<T> {
        let fd = self.fd();
        match self {
            Self::Tcp(socket) => socket.try_io(Interest::READABLE, || op(fd)),
            Self::Unix(socket) => socket.try_io(Interest::READABLE, || op(fd)),
        }
    }

    /// Runs `op` until it does not block, waiting at most `timeout` each time for bytes: its
    /// result, and whether this task had to wait (and so let the thread's others run).
    async fn read_with<T>(
        self,
        timeout: Duration,
        mut op: impl FnMut(BorrowedFd<'_>) -> io::Result<T>,
    ) -> io::Result<(T, bool)> {
        let mut waited = false;
        loop {
            ready_within(timeout, &mut waited, |cx| match self {
                Self::Tcp(socket) => socket.poll_read_ready(cx),
                Self::Unix(socket) => socket.poll_read_ready(cx),
            })
            .await?;
            match self.try_read(&mut op) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return result.map(|value| (value, waited)),
            }
        }
    }

    /// Reads what has arrived, up to `max` bytes, into a buffer of its own, waiting at most
    /// `timeout` for the first; empty when the peer closed. The bytes are read straight into
    /// the `Bytes` handed on: no copy after the kernel's.
    pub(super) async fn read(self, max: usize, timeout: Duration) -> io::Result<Bytes> {
        let (buffer, _) = self
            .read_with(timeout, |fd| {
                // A buffer the size of what has arrived (up to `max`): a reader ahead of its origin
                // allocates no more than it reads, and nothing is shrunk or copied after.
                let arrived = usize::try_from(rustix::io::ioctl_fionread(fd)?).unwrap_or(max);
                if arrived == 0 {
                    // Nothing yet (the read would block) or the end: a byte on the stack tells
                    // which without a buffer; one that arrived in between is a chunk of one.
                    let mut byte = [0u8; 1];
                    let read = rustix::io::read(fd, &mut byte)?;
                    return Ok(byte[..read].to_vec());
                }
                let mut buffer = Vec::with_capacity(arrived.min(max.max(1)));
                rustix::io::read(fd, rustix::buffer::spare_capacity(&mut buffer))?;
                Ok(buffer)
            })
            .await?;
        Ok(Bytes::from(buffer))
    }
}

/// A pipe to splice through; counted in its budget until dropped, and then, empty, kept by the
/// budget for the next body.
#[derive(Debug)]
pub(super) struct Pipe {
    /// Taken back by `drop`, and not used after.
    ends: ManuallyDrop<PipeEnds>,
    /// Bytes in it, on their way to the client: a pipe that still holds some when its body ends
    /// (the client went away) is closed, not kept.
    holds: usize,
    /// The last size the kernel refused it (not asked again).
    refused: usize,
    budget: &'static PipeBudget,
}

/// A pipe's two ends, and what it holds at most.
#[derive(Debug)]
struct PipeEnds {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl PipeEnds {
    /// A new pipe of `share` bytes; past the user's quota (taken by other processes of the same
    /// user) the kernel refuses the size, and the pipe keeps what it made, which may be two pages.
    fn new(share: usize) -> io::Result<Self> {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let capacity = rustix::pipe::fcntl_setpipe_size(&write, share)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))?;
        Ok(Self { read, write, capacity })
    }
}

impl Pipe {
    /// A pipe of this body's share of the process's budget; none when the budget or the kernel
    /// cannot give one of at least [`PIPE_MIN_BYTES`] (the body is then copied).
    pub(super) fn take() -> Option<Self> {
        Self::take_from(&PIPES)
    }

    fn take_from(budget: &'static PipeBudget) -> Option<Self> {
        let share = budget.join()?;
        let pipe = |ends| Self { ends: ManuallyDrop::new(ends), holds: 0, refused: 0, budget };
        let pipe = match budget.idle() {
            Some(ends) => {
                let mut kept = pipe(ends);
                kept.fit(share);
                kept
            }
            None => match PipeEnds::new(share) {
                Ok(ends) => pipe(ends),
                Err(e) => {
                    budget.leave();
                    debug!(error = %e, "no pipe: the body is copied");
                    return None;
                }
            },
        };
        if pipe.ends.capacity < PIPE_MIN_BYTES {
            debug!(
                bytes = pipe.ends.capacity,
                "the kernel gave a smaller pipe: the body is copied"
            );
            return None;
        }
        Some(pipe)
    }

    /// Resizes the pipe, empty, to its share now: the bodies that came when few were spliced
    /// give up their larger pipes as more come, and take them back as those end.
    fn refit(&mut self) {
        self.fit(self.budget.share_now());
    }

    /// Resizes the pipe, empty, to `share`; a size the kernel refuses leaves it as it was.
    fn fit(&mut self, share: usize) {
        if share == self.ends.capacity || share == self.refused {
            return;
        }
        match rustix::pipe::fcntl_setpipe_size(&self.ends.write, share) {
            Ok(capacity) => self.ends.capacity = capacity,
            Err(_) => self.refused = share,
        }
    }

    fn capacity(&self) -> usize {
        self.ends.capacity
    }
}

impl Drop for Pipe {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        self.budget.leave();
        // SAFETY: `ends` is taken once, here, and the pipe is not used after.
        let ends = unsafe { ManuallyDrop::take(&mut self.ends) };
        if self.holds == 0 {
            self.budget.keep(ends);
        }
    }
}

/// The pipes of the bodies this process is splicing, within the pipe memory the kernel lets its
/// user hold. Past the user's quota the kernel makes new pipes of two pages and refuses to grow
/// them: a body spliced through one would take 128 round trips a MiB, where the relay's copying
/// takes 4.
static PIPES: LazyLock<PipeBudget> =
    LazyLock::new(|| PipeBudget::new(pipes_limit(user_pipe_quota())));

#[derive(Debug)]
struct PipeBudget {
    /// Bytes all pipes may hold together.
    limit: usize,
    /// The pipes out.
    pipes: AtomicUsize,
    /// Empty pipes kept for the next bodies, which then skip making one (pipe2, its size, and two
    /// closes at the end: four system calls a body); at most [`IDLE_PIPES`], holding at most
    /// [`IDLE_SHARE`] of `limit` in all.
    idle: Mutex<Vec<PipeEnds>>,
}

/// The most empty pipes a budget keeps: their descriptors come out of those the process keeps
/// aside from its connections' (`admission::RESERVED_DESCRIPTORS`).
const IDLE_PIPES: usize = 8;

/// The part of a budget its idle pipes may hold, beyond its pipes in use: the kernel counts an
/// idle pipe's size against the user's quota as it does a busy one's.
const IDLE_SHARE: usize = 16;

impl PipeBudget {
    const fn new(limit: usize) -> Self {
        Self { limit, pipes: AtomicUsize::new(0), idle: Mutex::new(Vec::new()) }
    }

    /// An empty pipe kept from a body before, if any.
    fn idle(&self) -> Option<PipeEnds> {
        self.idle.lock().ok()?.pop()
    }

    /// Keeps an empty pipe for the next body, if the idle ones leave room for it; else it closes,
    /// as does one the kernel made too small to splice through (the next would refuse it again).
    fn keep(&self, ends: PipeEnds) {
        if ends.capacity < PIPE_MIN_BYTES {
            return;
        }
        let Ok(mut idle) = self.idle.lock() else { return };
        let held: usize = idle.iter().map(|ends| ends.capacity).sum();
        if idle.len() < IDLE_PIPES && held + ends.capacity <= self.limit / IDLE_SHARE {
            idle.push(ends);
        }
    }

    /// Counts one more pipe in: its share, or none (and not counted) when the budget cannot
    /// give every pipe the least.
    fn join(&self) -> Option<usize> {
        let pipes = self.pipes.fetch_add(1, Ordering::Relaxed) + 1;
        let share = self.share(pipes);
        if share.is_none() {
            self.leave();
        }
        share
    }

    fn leave(&self) {
        self.pipes.fetch_sub(1, Ordering::Relaxed);
    }

    /// The share of each pipe out now (the caller's among them).
    fn share_now(&self) -> usize {
        self.share(self.pipes.load(Ordering::Relaxed)).unwrap_or(PIPE_MIN_BYTES)
    }

    /// Each of `pipes` pipes' share: an equal part of the limit, at most [`PIPE_MAX_BYTES`],
    /// rounded down to a power of two (the kernel rounds a pipe's size up to one); none below
    /// [`PIPE_MIN_BYTES`].
    fn share(&self, pipes: usize) -> Option<usize> {
        let share = (self.limit / pipes.max(1)).min(PIPE_MAX_BYTES);
        (share >= PIPE_MIN_BYTES).then(|| 1 << share.ilog2())
    }
}

/// What this process's pipes may hold: [`PIPES_MAX_BYTES`], or three quarters of its user's quota
/// when that is lower, the rest left to the user's other pipes (the process an upgrade replaces
/// among them).
fn pipes_limit(quota: Option<usize>) -> usize {
    quota.map_or(PIPES_MAX_BYTES, |quota| (quota / 4 * 3).min(PIPES_MAX_BYTES))
}

/// The pipe memory this process's user may hold before the kernel shrinks new pipes
/// (`fs.pipe-user-pages-soft`); none when no quota binds it: none is set, or the process has
/// CAP_SYS_RESOURCE or CAP_SYS_ADMIN, which the kernel exempts.
fn user_pipe_quota() -> Option<usize> {
    // The kernel's default, if the setting cannot be read.
    const DEFAULT_PAGES: usize = 16_384;
    let pages = std::fs::read_to_string("/proc/sys/fs/pipe-user-pages-soft")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(DEFAULT_PAGES);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if pages == 0 || exempt_from_pipe_quota(&status) {
        return None;
    }
    Some(pages.saturating_mul(rustix::param::page_size()))
}

/// Whether `/proc/self/status`'s effective capabilities hold one the kernel exempts from the
/// pipe quota.
fn exempt_from_pipe_quota(status: &str) -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_SYS_RESOURCE: u32 = 24;
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN | 1 << CAP_SYS_RESOURCE) != 0)
}

/// Why a spliced body stopped short.
#[derive(Debug)]
pub(super) enum SpliceError {
    /// The origin closed early, failed, or sent nothing within the read timeout. Everything
    /// that had arrived was delivered first.
    Upstream(io::Error),
    /// The client went away or stopped reading for the write timeout.
    Downstream(io::Error),
}

/// The waits of one spliced body.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timeouts {
    /// For the origin's next bytes.
    pub(super) read: Duration,
    /// For the client to take the next bytes.
    pub(super) write: Duration,
}

/// Moves `len` bytes from `from` to `to` through `pipe`, calling `delivered` with each run of
/// bytes the client's socket took. When the origin fails, what it sent is still delivered before
/// the error is returned, so the bytes delivered are exactly the bytes received.
pub(super) async fn splice(
    from: OriginSocket<'_>,
    to: &ClientSocket,
    pipe: &mut Pipe,
    len: u64,
    timeouts: Timeouts,
    mut delivered: impl FnMut(usize),
) -> Result<(), SpliceError> {
    let mut left = len;
    let mut upstream_error = None;
    // Bytes moved since this task last let the thread's other tasks run. A body starts by
    // letting them (its origin's socket is already readable: the header came through it).
    let mut since_yield = pipe.capacity();
    while left > 0 || pipe.holds > 0 {
        // While both sockets keep up, nothing here waits: the other connections of this thread
        // get their turn after each pipe-full, as they would between pingora's reads.
        if since_yield >= pipe.capacity() {
            since_yield = 0;
            tokio::task::yield_now().await;
        }
        if upstream_error.is_none() && left > 0 {
            if pipe.holds == 0 {
                pipe.refit();
            }
            let want =
                (pipe.capacity() - pipe.holds).min(usize::try_from(left).unwrap_or(usize::MAX));
            let more = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
            let fill = |fd: BorrowedFd<'_>| {
                Ok(rustix::pipe::splice(fd, None, &pipe.ends.write, None, want, more)?)
            };
            // With bytes in the pipe, a would-block may be the pipe's (its slots are pages, not
            // bytes), the socket still holding bytes for which no new edge would come: it must
            // not clear the socket's readiness, and those in the pipe go out first. Only an empty
            // pipe waits for the origin.
            let filled = if pipe.holds == 0 {
                // Waiting for the origin, the client is watched too: one that hangs up ends the
                // body at once (and its download is recorded), not at the next bytes to send.
                tokio::select! {
                    filled = from.read_with(timeouts.read, fill) => filled.map(|(moved, waited)| (Some(moved), waited)),
                    () = to.closed() => {
                        return Err(SpliceError::Downstream(io::ErrorKind::ConnectionReset.into()));
                    }
                }
            } else {
                // Only when tokio has the socket readable: no call that would find it empty.
                from.try_read(|fd| match fill(fd) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                    moved => moved.map(Some),
                })
                .map(|moved| (moved, false))
            };
            match filled {
                Ok((None, _)) => {}
                Ok((Some(0), _)) => {
                    upstream_error = Some(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
                Ok((Some(moved), waited)) => {
                    if waited {
                        since_yield = 0;
                    }
                    pipe.holds += moved;
                    left -= moved as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => upstream_error = Some(e),
            }
        }
        if pipe.holds > 0 {
            let flags = if left > 0 {
                SpliceFlags::NONBLOCK | SpliceFlags::MOVE | SpliceFlags::MORE
            } else {
                SpliceFlags::NONBLOCK | SpliceFlags::MOVE
            };
            let drain = |fd: BorrowedFd<'_>| {
                Ok(rustix::pipe::splice(&pipe.ends.read, None, fd, None, pipe.holds, flags)?)
            };
            let (moved, waited) = to
                .send(pipe.holds, timeouts.write, drain)
                .await
                .map_err(SpliceError::Downstream)?;
            pipe.holds -= moved;
            since_yield = if waited { moved } else { since_yield + moved };
            delivered(moved);
        } else if let Some(e) = upstream_error {
            return Err(SpliceError::Upstream(e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    const TIMEOUTS: Timeouts =
        Timeouts { read: Duration::from_secs(5), write: Duration::from_secs(5) };

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// The origin's end and the client's end of two socket pairs, and rangeway's sockets between
    /// them: `upstream` (spliced from as the origin's) and `downstream`, which owns what `to`
    /// duplicates.
    struct Ends {
        origin: UnixStream,
        client: UnixStream,
        upstream: UnixStream,
        downstream: UnixStream,
        to: ClientSocket,
    }

    fn ends() -> Ends {
        let (origin, upstream) = UnixStream::pair().unwrap();
        let (downstream, client) = UnixStream::pair().unwrap();
        let to = ClientSocket::duplicate(downstream.as_raw_fd()).unwrap();
        Ends { origin, client, upstream, downstream, to }
    }

    /// An origin socket pair, a client socket pair, and the bytes the client end received.
    async fn run(
        body: Vec<u8>,
        len: u64,
        close_after: usize,
    ) -> (Result<(), SpliceError>, Vec<u8>, usize) {
        let Ends { mut origin, mut client, upstream, downstream, to } = ends();
        let sender = tokio::spawn(async move {
            origin.write_all(&body[..close_after]).await.unwrap();
            drop(origin);
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut pipe = Pipe::take().unwrap();
        let mut counted = 0;
        let from = OriginSocket::Unix(&upstream);
        let result = splice(from, &to, &mut pipe, len, TIMEOUTS, |n| counted += n).await;
        drop((to, upstream, downstream));
        sender.await.unwrap();
        (result, reader.await.unwrap(), counted)
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn pipes_share_the_budget() {
        let budget = PipeBudget::new(PIPES_MAX_BYTES);
        // Among up to 128: the most a pipe holds.
        assert_eq!(budget.share(1), Some(PIPE_MAX_BYTES));
        assert_eq!(budget.share(128), Some(PIPE_MAX_BYTES));
        // Among more: an equal part, rounded down to a power of two.
        assert_eq!(budget.share(129), Some(512 << 10));
        assert_eq!(budget.share(256), Some(512 << 10));
        assert_eq!(budget.share(257), Some(256 << 10));
        assert_eq!(budget.share(1024), Some(128 << 10));
        assert_eq!(budget.share(1025), Some(PIPE_MIN_BYTES));
        assert_eq!(budget.share(2048), Some(PIPE_MIN_BYTES));
        // Past the least, none.
        assert_eq!(budget.share(2049), None);
        // Under the user's default quota (48 MiB of it), 1 MiB for up to 48.
        let quota = PipeBudget::new(48 * MIB);
        assert_eq!(quota.share(48), Some(PIPE_MAX_BYTES));
        assert_eq!(quota.share(49), Some(512 << 10));
        assert_eq!(quota.share(200), Some(128 << 10));
    }

    #[test]
    fn a_pipe_past_the_budget_is_not_counted() {
        let budget = PipeBudget::new(2 * PIPE_MIN_BYTES);
        assert_eq!(budget.join(), Some(2 * PIPE_MIN_BYTES));
        assert_eq!(budget.join(), Some(PIPE_MIN_BYTES));
        assert_eq!(budget.join(), None);
        assert_eq!(budget.pipes.load(Ordering::Relaxed), 2);
        budget.leave();
        assert_eq!(budget.join(), Some(PIPE_MIN_BYTES));
    }

    #[test]
    fn pipes_give_up_their_size_as_more_come_and_take_it_back() {
        static BUDGET: PipeBudget = PipeBudget::new(2 * PIPE_MAX_BYTES);
        let mut first = Pipe::take_from(&BUDGET).unwrap();
        let second = Pipe::take_from(&BUDGET).unwrap();
        assert_eq!((first.capacity(), second.capacity()), (PIPE_MAX_BYTES, PIPE_MAX_BYTES));
        let third = Pipe::take_from(&BUDGET).unwrap();
        assert_eq!(third.capacity(), PIPE_MAX_BYTES / 2);
        first.refit();
        assert_eq!(first.capacity(), PIPE_MAX_BYTES / 2);
        drop((second, third));
        first.refit();
        assert_eq!(first.capacity(), PIPE_MAX_BYTES);
        drop(first);
        assert_eq!(BUDGET.pipes.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn an_empty_pipe_is_kept_for_the_next_body_and_one_holding_bytes_is_not() {
        static BUDGET: PipeBudget = PipeBudget::new(IDLE_SHARE * PIPE_MAX_BYTES);
        let idle = || BUDGET.idle.lock().unwrap().len();
        let Ends { mut origin, client: _client, upstream, downstream: _d, to } = ends();
        let from = OriginSocket::Unix(&upstream);
        let mut pipe = Pipe::take_from(&BUDGET).unwrap();
        let kept = pipe.ends.read.as_raw_fd();
        origin.write_all(&pattern(100_000)).await.unwrap();
        splice(from, &to, &mut pipe, 100_000, TIMEOUTS, |_| {}).await.unwrap();
        drop(pipe);
        assert_eq!(idle(), 1);
        // The next body gets that pipe, not a new one.
        let mut pipe = Pipe::take_from(&BUDGET).unwrap();
        assert_eq!(pipe.ends.read.as_raw_fd(), kept);
        assert_eq!(idle(), 0);
        // A client that stops reading leaves bytes in the pipe: it is closed.
        tokio::spawn(async move { origin.write_all(&pattern(4 * MIB)).await });
        let timeouts = Timeouts { read: TIMEOUTS.read, write: Duration::from_millis(100) };
        let cut = splice(from, &to, &mut pipe, 4 << 20, timeouts, |_| {}).await;
        assert!(cut.is_err() && pipe.holds > 0, "{cut:?}, {} bytes left in the pipe", pipe.holds);
        drop(pipe);
        assert_eq!(idle(), 0);
        assert_eq!(BUDGET.pipes.load(Ordering::Relaxed), 0);
    }

    /// A body whose origin is readable from the start still lets the thread's other tasks run
    /// before its first bytes: on a busy thread, each response's start is a turn for the others.
    #[tokio::test]
    async fn a_body_lets_the_threads_other_tasks_run_before_its_first_bytes() {
        let Ends { mut origin, client: _client, upstream, downstream: _d, to } = ends();
        origin.write_all(&pattern(1000)).await.unwrap();
        // Known readable, as a pooled origin's socket is after its header was read through it.
        upstream.readable().await.unwrap();
        let other_ran = Arc::new(AtomicBool::new(false));
        // Spawned, not run: a current-thread runtime runs it only when this task yields.
        tokio::spawn({
            let other_ran = Arc::clone(&other_ran);
            async move { other_ran.store(true, Ordering::Relaxed) }
        });
        static BUDGET: PipeBudget = PipeBudget::new(PIPE_MAX_BYTES);
        let mut pipe = Pipe::take_from(&BUDGET).unwrap();
        let mut ran_before_first = None;
        splice(OriginSocket::Unix(&upstream), &to, &mut pipe, 1000, TIMEOUTS, |_| {
            ran_before_first.get_or_insert(other_ran.load(Ordering::Relaxed));
        })
        .await
        .unwrap();
        assert_eq!(ran_before_first, Some(true));
    }

    #[test]
    fn a_pipe_too_small_to_splice_through_is_not_kept() {
        static BUDGET: PipeBudget = PipeBudget::new(IDLE_SHARE * PIPE_MAX_BYTES);
        let small = PipeEnds::new(PIPE_MIN_BYTES / 2).unwrap();
        assert!(small.capacity < PIPE_MIN_BYTES, "{} bytes", small.capacity);
        BUDGET.keep(small);
        assert_eq!(BUDGET.idle.lock().unwrap().len(), 0);
        BUDGET.keep(PipeEnds::new(PIPE_MIN_BYTES).unwrap());
        assert_eq!(BUDGET.idle.lock().unwrap().len(), 1);
    }

    #[test]
    fn idle_pipes_hold_at_most_their_share_of_the_budget_and_are_few() {
        static SMALL: PipeBudget = PipeBudget::new(IDLE_SHARE * 2 * PIPE_MAX_BYTES);
        let pipes: Vec<_> = (0..3).map(|_| Pipe::take_from(&SMALL).unwrap()).collect();
        drop(pipes);
        assert_eq!(SMALL.idle.lock().unwrap().len(), 2, "by their bytes");
        static LARGE: PipeBudget = PipeBudget::new(IDLE_SHARE * 64 * PIPE_MAX_BYTES);
        let pipes: Vec<_> = (0..IDLE_PIPES + 2).map(|_| Pipe::take_from(&LARGE).unwrap()).collect();
        drop(pipes);
        assert_eq!(LARGE.idle.lock().unwrap().len(), IDLE_PIPES, "by their number");
    }

    #[test]
    fn the_budget_keeps_within_the_users_quota() {
        assert_eq!(pipes_limit(None), PIPES_MAX_BYTES);
        // The kernel's default quota: three quarters of it.
        assert_eq!(pipes_limit(Some(64 * MIB)), 48 * MIB);
        assert_eq!(pipes_limit(Some(4 * MIB)), 3 * MIB);
        assert_eq!(pipes_limit(Some(1024 * MIB)), PIPES_MAX_BYTES);
    }

    #[test]
    fn the_capabilities_the_kernel_exempts_from_the_quota() {
        let status = |caps: &str| format!("Name:\trangeway\nCapInh:\t0\nCapEff:\t{caps}\n");
        assert!(exempt_from_pipe_quota(&status("000001ffffffffff")));
        assert!(exempt_from_pipe_quota(&status("0000000001000000"))); // CAP_SYS_RESOURCE
        assert!(exempt_from_pipe_quota(&status("0000000000200000"))); // CAP_SYS_ADMIN
        assert!(!exempt_from_pipe_quota(&status("0000000000001000"))); // CAP_NET_ADMIN only
        assert!(!exempt_from_pipe_quota(&status("0000000000000000")));
        assert!(!exempt_from_pipe_quota("Name:\trangeway\n"));
        assert!(!exempt_from_pipe_quota(&status("not hex")));
    }

    #[tokio::test]
    async fn a_whole_body_arrives_byte_for_byte() {
        let body = pattern(3 * 1024 * 1024 + 17);
        let (result, got, counted) = run(body.clone(), body.len() as u64, body.len()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(got.len(), body.len());
        assert!(got == body, "the client received other bytes");
        assert_eq!(counted, body.len());
    }

    #[tokio::test]
    async fn an_origin_that_closes_early_has_what_it_sent_delivered_then_fails() {
        let body = pattern(1024 * 1024);
        let (result, got, counted) = run(body.clone(), body.len() as u64, 300_001).await;
        assert!(matches!(result, Err(SpliceError::Upstream(_))), "{result:?}");
        assert_eq!(got, body[..300_001]);
        assert_eq!(counted, 300_001);
    }

    #[tokio::test]
    async fn no_more_than_the_length_is_taken_from_the_origin() {
        let body = pattern(100_000);
        let (result, got, _) = run(body.clone(), 65_537, body.len()).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(got, body[..65_537]);
    }

    #[tokio::test]
    async fn a_silent_origin_fails_at_the_read_timeout() {
        let ends = ends();
        let timeouts = Timeouts { read: Duration::from_millis(100), write: Duration::from_secs(5) };
        let from = OriginSocket::Unix(&ends.upstream);
        let result = splice(from, &ends.to, &mut Pipe::take().unwrap(), 10, timeouts, |_| {}).await;
        assert!(
            matches!(&result, Err(SpliceError::Upstream(e)) if e.kind() == io::ErrorKind::TimedOut),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_fails_at_the_write_timeout() {
        let body = pattern(8 * 1024 * 1024);
        let Ends { mut origin, client: _client, upstream, downstream: _d, to } = ends();
        tokio::spawn(async move {
            let _ = origin.write_all(&body).await;
        });
        let from = OriginSocket::Unix(&upstream);
        let timeouts = Timeouts { read: Duration::from_secs(5), write: Duration::from_millis(100) };
        let result = splice(from, &to, &mut Pipe::take().unwrap(), 8 << 20, timeouts, |_| {}).await;
        assert!(matches!(result, Err(SpliceError::Downstream(_))), "{result:?}");
    }

    #[tokio::test]
    async fn a_client_that_hangs_up_while_the_origin_is_silent_ends_it_at_once() {
        let Ends { origin: _origin, client, upstream, downstream: _d, to } = ends();
        let from = OriginSocket::Unix(&upstream);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(client);
        });
        let started = std::time::Instant::now();
        let result = splice(from, &to, &mut Pipe::take().unwrap(), 10, TIMEOUTS, |_| {}).await;
        assert!(matches!(result, Err(SpliceError::Downstream(_))), "{result:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "noticed only after {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_client_that_sends_bytes_meanwhile_is_not_taken_for_gone() {
        let body = pattern(100_000);
        let Ends { mut origin, mut client, upstream, mut downstream, to } = ends();
        let from = OriginSocket::Unix(&upstream);
        let expected = body.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            origin.write_all(&body).await.unwrap();
        });
        client.write_all(b"GET /next HTTP/1.1\r\n\r\n").await.unwrap();
        let result = splice(from, &to, &mut Pipe::take().unwrap(), 100_000, TIMEOUTS, |_| {}).await;
        assert!(result.is_ok(), "{result:?}");
        let mut got = vec![0; 100_000];
        client.read_exact(&mut got).await.unwrap();
        assert!(got == expected);
        // The pipelined request is still there for its reader.
        let mut next = [0u8; 3];
        downstream.read_exact(&mut next).await.unwrap();
        assert_eq!(&next, b"GET");
    }

    #[tokio::test]
    async fn pingora_lends_its_socket_only_while_its_buffers_hold_none_of_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let connect = || TcpStream::connect(listener.local_addr().unwrap());
        let plain: Stream = Box::new(L4Stream::from(connect().await.unwrap()));
        let lent = OriginSocket::of(Some(&plain));
        assert!(matches!(lent, Some(OriginSocket::Tcp(_))), "{lent:?}");
        // Bytes put back into the stream are not in the socket: a reader of it would skip them.
        let mut rewound = L4Stream::from(connect().await.unwrap());
        rewound.rewind(b"HTTP/1.1");
        let rewound: Stream = Box::new(rewound);
        assert!(OriginSocket::of(Some(&rewound)).is_none());
        // A stream in memory has no socket.
        let memory: Stream = Box::new(tokio::io::duplex(64).0);
        assert!(OriginSocket::of(Some(&memory)).is_none());
    }

    #[tokio::test]
    async fn read_takes_what_arrived_up_to_its_limit_then_sees_the_close() {
        let (mut origin, upstream) = UnixStream::pair().unwrap();
        let from = OriginSocket::Unix(&upstream);
        let body = pattern(100_000);
        origin.write_all(&body).await.unwrap();
        let first = from.read(64 * 1024, TIMEOUTS.read).await.unwrap();
        assert_eq!(first.len(), 64 * 1024, "no more than asked for");
        let second = from.read(64 * 1024, TIMEOUTS.read).await.unwrap();
        assert!([first, second].concat() == body, "other bytes than were sent");
        // A silent peer: the timeout; a closed one: nothing.
        let silent = from.read(10, Duration::from_millis(50)).await.unwrap_err();
        assert_eq!(silent.kind(), io::ErrorKind::TimedOut);
        drop(origin);
        assert!(from.read(10, TIMEOUTS.read).await.unwrap().is_empty());
    }
}
