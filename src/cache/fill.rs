//! Fetching missing slices, once for every request that needs them, and reading an answer's
//! bytes from the slices as they are complete or as they grow.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::RequestHeader;
use rangeway_middleware::ByteRange;
use tokio::sync::watch;
use tracing::Instrument as _;
use tracing::{info, warn};

use super::store::{HEADER_LEN, OpenSlice, SliceId};
use super::{Inner, Version};
use crate::config::UpstreamResume;
use crate::routes::Route;
use crate::routes::origin_client::{Exchange, FetchError, OriginClient, Pinned, Tries};

/// The most slices one origin request fetches: a request for a whole large object is answered
/// run by run, so that requests for its far parts start runs of their own rather than wait.
const RUN_SLICES: u64 = 16;

/// The most read from a slice for one chunk of an answer.
const READ_BYTES: u64 = 256 * 1024;

/// How long a fill goes on with no reader waiting on any of its slices: past it, the fill is
/// given up and its origin request dropped (the clients that wanted it went away). A reader
/// between two slices is not waiting for a moment; one that stays away this long finds the
/// slices missing and fetches them again.
const UNWANTED_AFTER: Duration = Duration::from_secs(1);

/// How often a fill looks for its readers.
const UNWANTED_POLL: Duration = Duration::from_millis(250);

/// Slices being fetched, by slice.
#[derive(Default)]
pub(super) struct Fills {
    map: Mutex<HashMap<SliceId, Arc<Fill>>>,
}

/// One slice being fetched: its file, as far as it is written, and how far that is.
pub(super) struct Fill {
    file: Arc<File>,
    progress: watch::Sender<Progress>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// This many of its bytes are written.
    Writing(u64),
    /// Complete, in the store.
    Done,
    Failed(FillFailure),
}

/// Why a slice could not be fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FillFailure {
    /// The origin did not give it, within the route's attempts and deadline.
    Origin,
    /// The origin has another version now.
    Changed,
    /// The cache could not write it: its readers get it from the origin.
    Disk,
}

/// What fetching a slice needs: the origin, the route's upstream, the request to make ranged
/// requests from, and how often to try.
#[derive(Clone)]
pub(super) struct Fetch {
    pub(super) origin: Arc<OriginClient>,
    pub(super) route: Arc<Route>,
    pub(super) base: Arc<RequestHeader>,
    pub(super) policy: UpstreamResume,
}

/// What a new answer's body set going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Started {
    /// Every slice it needs is complete.
    Nothing,
    /// A fetch of its own.
    Fill,
    /// It waits on fetches of others.
    Waits,
}

/// The body of an answer from the cache: `range` of `version`, read slice by slice.
pub(crate) struct CacheBody {
    inner: Arc<Inner>,
    version: Arc<Version>,
    /// The next byte of the object to send, and one past the last.
    at: u64,
    end: u64,
    /// The route's name, for the metrics.
    route: String,
    /// How missing slices are fetched; `None` for a representation, which is not.
    fetch: Option<Fetch>,
    /// The time its reader waited on fills, for the trace of its request.
    waits: FillWaits,
    /// Where the bytes of the slice holding `at` come from.
    current: Option<Source>,
}

enum Source {
    Complete {
        id: SliceId,
        file: Arc<File>,
    },
    Filling {
        id: SliceId,
        file: Arc<File>,
        progress: watch::Receiver<Progress>,
    },
    /// The rest of a slice the cache could not write, from the origin.
    Origin {
        exchange: Box<Exchange>,
        left: u64,
    },
}

/// The waits of one body's reader on fills, as one `cache.wait` span of its request's trace,
/// from the first wait that held it up to the body's end.
struct FillWaits {
    /// The request's span; `Span::none()` when it is not traced, and then nothing is counted.
    request: tracing::Span,
    span: Option<tracing::Span>,
    count: u64,
    waited: Duration,
}

impl FillWaits {
    fn within_current() -> Self {
        Self { request: tracing::Span::current(), span: None, count: 0, waited: Duration::ZERO }
    }

    fn waited(&mut self, took: Duration) {
        // A wait for bytes already written returns at once: not a wait on the fill.
        if self.request.is_none() || took < Duration::from_micros(100) {
            return;
        }
        let request = &self.request;
        self.span.get_or_insert_with(|| {
            tracing::info_span!(
                target: crate::traces::TARGET,
                parent: request,
                "cache.wait",
                rangeway.waits = tracing::field::Empty,
                rangeway.waited_ms = tracing::field::Empty,
            )
        });
        self.count += 1;
        self.waited += took;
    }
}

impl Drop for FillWaits {
    fn drop(&mut self) {
        if let Some(span) = &self.span {
            span.record("rangeway.waits", crate::traces::int(self.count));
            span.record("rangeway.waited_ms", self.waited.as_secs_f64() * 1000.0);
        }
    }
}

/// A piece of an answer's body: bytes, or a stretch of a complete slice's file that can go to
/// the client's socket without passing through rangeway (`sendfile`).
pub(crate) enum Segment {
    Bytes(Bytes),
    File { file: Arc<File>, offset: u64, len: u64 },
}

impl std::fmt::Debug for CacheBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheBody")
            .field("at", &self.at)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl CacheBody {
    /// The body of `range` of `version`, and whether reading it fetches, waits on fetches of
    /// others, or neither. The fetches start as the body reaches the slices they are for, so that
    /// a large answer fetches at the pace it is read, and an answer not read fetches nothing.
    pub(super) fn new(
        inner: Arc<Inner>,
        version: Arc<Version>,
        range: ByteRange,
        fetch: Fetch,
    ) -> (Self, Started) {
        let first = range.start() / version.slice_size;
        let last = (range.end() - 1) / version.slice_size;
        let missing =
            (first..=last).map(|index| version.slice_id(index)).find(|id| !inner.store.has(*id));
        let started = match missing {
            None => Started::Nothing,
            Some(id)
                if inner.fills.map.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&id) =>
            {
                Started::Waits
            }
            Some(_) => Started::Fill,
        };
        let route = fetch.route.name.clone();
        let body = Self {
            inner,
            version,
            at: range.start(),
            end: range.end(),
            route,
            fetch: Some(fetch),
            waits: FillWaits::within_current(),
            current: None,
        };
        (body, started)
    }

    /// The body of `range` of `version`, every slice of which is in the store: a representation's,
    /// which nothing fetches (a slice evicted meanwhile cuts the answer).
    pub(super) fn stored(
        inner: Arc<Inner>,
        version: Arc<Version>,
        range: ByteRange,
        route: &str,
    ) -> Self {
        Self {
            inner,
            version,
            at: range.start(),
            end: range.end(),
            route: route.to_owned(),
            fetch: None,
            waits: FillWaits::within_current(),
            current: None,
        }
    }

    /// Whether every byte has been read.
    pub(crate) fn is_done(&self) -> bool {
        self.at >= self.end
    }

    /// The next chunk of the body, as bytes; `None` at its end.
    pub(crate) async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        match self.next(false).await? {
            None => Ok(None),
            Some(Segment::Bytes(bytes)) => Ok(Some(bytes)),
            Some(Segment::File { .. }) => {
                Err(Error::explain(ErrorType::InternalError, "a file segment read as bytes"))
            }
        }
    }

    /// The next segment of the body; `None` at its end. With `zero_copy`, a stretch of a complete
    /// slice is given as its file (which has been checked against its CRC since start).
    pub(crate) async fn next(&mut self, zero_copy: bool) -> Result<Option<Segment>> {
        loop {
            if self.at >= self.end {
                return Ok(None);
            }
            let index = self.at / self.version.slice_size;
            let slice = self.version.slice_range(index);
            let source = match self.current.take() {
                Some(source)
                    if source.index() == Some(index) || matches!(source, Source::Origin { .. }) =>
                {
                    source
                }
                // Boxed: once a slice, and large (it may fetch from the origin), it would
                // otherwise grow every read's future.
                _ => Box::pin(self.open(index)).await?,
            };
            let offset = self.at - slice.start();
            let rest = slice.end().min(self.end) - self.at;
            let want = rest.min(READ_BYTES);
            match source {
                Source::Complete { id, file } => {
                    // What the kernel sends needs no buffer: the rest of the slice at once.
                    let want = if zero_copy { rest } else { want };
                    let segment = if zero_copy {
                        Segment::File {
                            file: Arc::clone(&file),
                            offset: HEADER_LEN + offset,
                            len: want,
                        }
                    } else {
                        Segment::Bytes(
                            read_at(Arc::clone(&file), HEADER_LEN + offset, want).await.map_err(
                                |e| {
                                    self.inner.store.remove(id);
                                    Error::because(
                                        ErrorType::ReadError,
                                        "reading a cached slice",
                                        e,
                                    )
                                    .into_up()
                                },
                            )?,
                        )
                    };
                    self.advance(want);
                    self.current = Some(Source::Complete { id, file });
                    return Ok(Some(segment));
                }
                Source::Filling { id, file, mut progress } => {
                    let waiting = Instant::now();
                    let state = *progress
                        .wait_for(|p| !matches!(p, Progress::Writing(n) if *n <= offset))
                        .await
                        .map_err(|_| fill_failed(FillFailure::Origin))?;
                    self.waits.waited(waiting.elapsed());
                    match state {
                        Progress::Writing(written) => {
                            let want = want.min(written - offset);
                            let bytes = read_at(Arc::clone(&file), HEADER_LEN + offset, want)
                                .await
                                .map_err(|e| {
                                    Error::because(
                                        ErrorType::ReadError,
                                        "reading a slice being fetched",
                                        e,
                                    )
                                    .into_up()
                                })?;
                            self.advance(want);
                            self.current = Some(Source::Filling { id, file, progress });
                            return Ok(Some(Segment::Bytes(bytes)));
                        }
                        // Complete: read from the store from here on.
                        Progress::Done => {
                            self.current = None;
                            let bytes = read_at(Arc::clone(&file), HEADER_LEN + offset, want)
                                .await
                                .map_err(|e| {
                                    Error::because(
                                        ErrorType::ReadError,
                                        "reading a cached slice",
                                        e,
                                    )
                                    .into_up()
                                })?;
                            self.advance(want);
                            return Ok(Some(Segment::Bytes(bytes)));
                        }
                        Progress::Failed(FillFailure::Disk) => {
                            let range = ByteRange::new(self.at, slice.end().min(self.end))
                                .unwrap_or(super::NOTHING);
                            // Boxed: rare and large, as `open` above.
                            let exchange = Box::pin(self.origin_range(range)).await?;
                            self.current = Some(Source::Origin {
                                exchange,
                                left: slice.end().min(self.end) - self.at,
                            });
                        }
                        Progress::Failed(failure) => return Err(fill_failed(failure)),
                    }
                }
                Source::Origin { mut exchange, left } => {
                    if left == 0 {
                        if let Some(fetch) = &self.fetch {
                            // Boxed, as `open` above: once a slice.
                            Box::pin(fetch.origin.release(*exchange)).await;
                        }
                        continue;
                    }
                    let chunk =
                        exchange.session.read_response_body().await.map_err(|e| e.into_up())?;
                    let Some(chunk) = chunk else {
                        return Err(Error::explain(
                            ErrorType::ConnectionClosed,
                            "the origin ended a slice early",
                        )
                        .into_up());
                    };
                    let len = (chunk.len() as u64).min(left);
                    let chunk = chunk.slice(..len as usize);
                    self.advance(len);
                    self.current = Some(Source::Origin { exchange, left: left - len });
                    return Ok(Some(Segment::Bytes(chunk)));
                }
            }
        }
    }

    fn advance(&mut self, len: u64) {
        self.at += len;
        self.inner.metrics.cache_served(&self.route, len);
    }

    /// Where slice `index` is read from: its complete file (checked against its CRC the first
    /// time since start), a fetch under way, or a fetch started here.
    async fn open(&mut self, index: u64) -> Result<Source> {
        let id = self.version.slice_id(index);
        loop {
            if let Some(slice) = self.inner.store.open_slice(id) {
                if let Some(file) = self.checked(id, slice).await {
                    return Ok(Source::Complete { id, file });
                }
                continue;
            }
            let fill =
                self.inner.fills.map.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned();
            if let Some(fill) = fill {
                return Ok(Source::Filling {
                    id,
                    file: Arc::clone(&fill.file),
                    progress: fill.progress.subscribe(),
                });
            }
            let Some(fetch) = &self.fetch else {
                return Err(Error::explain(
                    ErrorType::ReadError,
                    "a slice of a cached representation was evicted while it was read",
                )
                .into_up());
            };
            let last = (self.end - 1) / self.version.slice_size;
            if !start_run(&self.inner, &self.version, index, last, fetch)
                && !self.inner.store.has(id)
            {
                let claimed = self
                    .inner
                    .fills
                    .map
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&id);
                if !claimed {
                    // The cache cannot take it (no room, a failing disk): from the origin.
                    let slice = self.version.slice_range(index);
                    let range = ByteRange::new(self.at, slice.end().min(self.end))
                        .unwrap_or(super::NOTHING);
                    let exchange = self.origin_range(range).await?;
                    return Ok(Source::Origin { exchange, left: range.len() });
                }
            }
        }
    }

    /// The file of a complete slice once its bytes are checked: `None` (the slice deleted,
    /// counted) when they do not match its CRC.
    async fn checked(&self, id: SliceId, slice: OpenSlice) -> Option<Arc<File>> {
        if !slice.unverified {
            return Some(Arc::new(slice.file));
        }
        let inner = Arc::clone(&self.inner);
        let verified = tokio::task::spawn_blocking(move || {
            let good = inner.store.verify(id, &slice);
            (good, slice)
        })
        .await
        .ok()?;
        let (good, slice) = verified;
        if good {
            Some(Arc::new(slice.file))
        } else {
            self.inner.metrics.cache_corrupt();
            warn!(slice = id.index, "a cached slice did not match its CRC: deleted, fetched again");
            None
        }
    }

    /// `range` of the version, from the origin, past the cache.
    async fn origin_range(&self, range: ByteRange) -> Result<Box<Exchange>> {
        let Some(fetch) = &self.fetch else { return Err(fill_failed(FillFailure::Disk)) };
        let pinned = Pinned { etag: &self.version.etag, len: self.version.len };
        let (upstream, once) = (&fetch.route.upstream, &UpstreamResume::ONCE);
        match fetch
            .origin
            .fetch(upstream, &fetch.base, range, pinned, once, &mut Tries::new())
            .await
        {
            Ok((exchange, _)) => Ok(Box::new(exchange)),
            Err(FetchError::Changed) => {
                self.inner.changed(&self.version);
                Err(fill_failed(FillFailure::Changed))
            }
            Err(FetchError::Failed) => Err(fill_failed(FillFailure::Origin)),
        }
    }
}

impl Source {
    fn index(&self) -> Option<u64> {
        match self {
            Self::Complete { id, .. } | Self::Filling { id, .. } => Some(id.index),
            Self::Origin { .. } => None,
        }
    }
}

fn fill_failed(failure: FillFailure) -> Box<Error> {
    let why = match failure {
        FillFailure::Origin => "the origin did not give a slice being cached",
        FillFailure::Changed => "the object changed at its origin while it was being cached",
        FillFailure::Disk => "a slice could not be cached",
    };
    Error::explain(ErrorType::ReadError, why).into_up()
}

/// `len` bytes of `file` from `offset`, read off the event loop.
async fn read_at(file: Arc<File>, offset: u64, len: u64) -> std::io::Result<Bytes> {
    tokio::task::spawn_blocking(move || {
        let mut buffer = vec![0u8; usize::try_from(len).unwrap_or(0)];
        file.read_exact_at(&mut buffer, offset)?;
        Ok(Bytes::from(buffer))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Claims slice `first` and the missing slices after it (up to `last`, at most a run), and
/// fetches them on a task of their own. `false` when `first` cannot be claimed (complete, or
/// being fetched already) or the cache has no room for it.
fn start_run(
    inner: &Arc<Inner>,
    version: &Arc<Version>,
    first: u64,
    last: u64,
    fetch: &Fetch,
) -> bool {
    let mut run = Vec::new();
    {
        let mut fills = inner.fills.map.lock().unwrap_or_else(|p| p.into_inner());
        for index in
            first..=last.min(first + RUN_SLICES - 1).min(version.slices().saturating_sub(1))
        {
            match claim(inner, &mut fills, version, index) {
                Some(claimed) => run.push(claimed),
                None => break,
            }
        }
    }
    if run.is_empty() {
        return false;
    }
    let task = RunFill {
        inner: Arc::clone(inner),
        version: Arc::clone(version),
        fetch: fetch.clone(),
        run: run.into(),
    };
    // Its origin requests are in the trace of the request that started it, when it has one.
    tokio::spawn(task.run().in_current_span());
    true
}

/// A slice being written: what it is, its readers' view of it, its `.part` file.
type Claimed = (SliceId, Arc<Fill>, PathBuf);

/// Claims slice `index` of `version` for writing (under the lock of `fills`): room reserved, its
/// `.part` file made, its readers able to find it. `None` when it is complete or claimed
/// already, or the cache cannot take it.
fn claim(
    inner: &Inner,
    fills: &mut HashMap<SliceId, Arc<Fill>>,
    version: &Version,
    index: u64,
) -> Option<Claimed> {
    let id = version.slice_id(index);
    if fills.contains_key(&id) || inner.store.has(id) {
        return None;
    }
    let len = version.slice_range(index).len();
    let (file, part) = match inner.store.claim(id, len) {
        Ok(claimed) => claimed?,
        Err(e) => {
            inner.write_failed(&e);
            return None;
        }
    };
    let (progress, _) = watch::channel(Progress::Writing(0));
    let fill = Arc::new(Fill { file: Arc::new(file), progress });
    fills.insert(id, Arc::clone(&fill));
    Some((id, fill, part))
}

/// A claimed slice written whole (`len` bytes of CRC32 `crc`): into the store, its readers told.
fn complete(inner: &Inner, (id, fill, part): Claimed, len: u64, crc: u32) {
    let completed = inner.store.complete(id, &fill.file, &part, len, crc);
    inner.fills.map.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    let progress = match completed {
        Ok(()) => Progress::Done,
        Err(e) => {
            inner.store.unclaim(id, len);
            inner.write_failed(&e);
            let _ = std::fs::remove_file(&part);
            Progress::Failed(FillFailure::Disk)
        }
    };
    fill.progress.send_replace(progress);
}

/// A claimed slice that will not be written whole: given up, its readers told why.
fn abandon(inner: &Inner, (id, fill, part): Claimed, len: u64, failure: FillFailure) {
    inner.fills.map.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    let _ = std::fs::remove_file(&part);
    inner.store.unclaim(id, len);
    fill.progress.send_replace(Progress::Failed(failure));
}

/// Keeps the whole slices of a representation that a route's stages make while they answer a
/// request: what the next request for them reads instead of running the stages again. Fed the
/// stages' output in order from output byte `at`; a slice it does not see from its first byte,
/// or that another writer or fetch has, it lets pass.
pub(crate) struct OutputWriter {
    inner: Arc<Inner>,
    version: Arc<Version>,
    at: u64,
    /// The slice being written, its bytes so far and their CRC.
    current: Option<(Claimed, u64, crc32fast::Hasher)>,
    /// A write failed: nothing more is kept.
    broken: bool,
}

impl std::fmt::Debug for OutputWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputWriter").field("at", &self.at).finish_non_exhaustive()
    }
}

impl OutputWriter {
    pub(super) fn new(inner: Arc<Inner>, version: Arc<Version>, at: u64) -> Self {
        Self { inner, version, at, current: None, broken: false }
    }

    /// The next output bytes.
    pub(crate) fn push(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() && !self.broken && self.at < self.version.len {
            let index = self.at / self.version.slice_size;
            let slice = self.version.slice_range(index);
            if self.current.is_none() && self.at == slice.start() {
                let mut fills = self.inner.fills.map.lock().unwrap_or_else(|p| p.into_inner());
                self.current = claim(&self.inner, &mut fills, &self.version, index)
                    .map(|c| (c, 0, crc32fast::Hasher::new()));
            }
            let take =
                usize::try_from(slice.end() - self.at).unwrap_or(usize::MAX).min(chunk.len());
            let (bytes, rest) = chunk.split_at(take);
            chunk = rest;
            self.at += take as u64;
            let Some((claimed, written, crc)) = self.current.as_mut() else { continue };
            if let Err(e) = claimed.1.file.write_all_at(bytes, HEADER_LEN + *written) {
                self.inner.write_failed(&e);
                self.broken = true;
                if let Some((claimed, _, _)) = self.current.take() {
                    abandon(&self.inner, claimed, slice.len(), FillFailure::Disk);
                }
                return;
            }
            crc.update(bytes);
            *written += take as u64;
            claimed.1.progress.send_replace(Progress::Writing(*written));
            if *written == slice.len()
                && let Some((claimed, len, crc)) = self.current.take()
            {
                complete(&self.inner, claimed, len, crc.finalize());
            }
        }
    }
}

impl Drop for OutputWriter {
    /// A pass that ends (or is cut) inside a slice leaves that slice unwritten.
    fn drop(&mut self) {
        if let Some((claimed, _, _)) = self.current.take() {
            let len = self.version.slice_range(claimed.0.index).len();
            abandon(&self.inner, claimed, len, FillFailure::Origin);
        }
    }
}

/// A run of claimed slices, fetched with one origin request (continued where it breaks).
struct RunFill {
    inner: Arc<Inner>,
    version: Arc<Version>,
    fetch: Fetch,
    run: std::collections::VecDeque<Claimed>,
}

impl RunFill {
    async fn run(mut self) {
        let mut tries = Tries::new();
        let Some(first) = self.run.front().map(|(id, ..)| id.index) else { return };
        let last = self.run.back().map_or(first, |(id, ..)| id.index);
        let mut at = self.version.slice_range(first).start();
        let end = self.version.slice_range(last).end();
        // The slice being written: its bytes so far, and their CRC.
        let mut written = 0u64;
        let mut crc = crc32fast::Hasher::new();
        let mut exchange: Option<Exchange> = None;
        while at < end {
            let current = match exchange.as_mut() {
                Some(current) => current,
                None => {
                    let rest = ByteRange::new(at, end).unwrap_or(super::NOTHING);
                    let fetched = tokio::select! {
                        fetched = self.fetch_rest(rest, &mut tries) => fetched,
                        () = unwanted(&self.run) => return self.give_up(),
                    };
                    match fetched {
                        Ok(fetched) => exchange.insert(fetched),
                        Err(failure) => return self.fail(failure),
                    }
                }
            };
            let read = tokio::select! {
                read = current.session.read_response_body() => read,
                () = unwanted(&self.run) => return self.give_up(),
            };
            let chunk = match read {
                Ok(Some(chunk)) if !chunk.is_empty() => chunk,
                // Ended early or broke: continued from where it stopped, of the same version.
                Ok(_) => {
                    exchange = None;
                    tries.after_failure();
                    continue;
                }
                Err(e) => {
                    info!(route = %self.fetch.route.name, at, error = %e, "a cache fill broke off: continuing it");
                    exchange = None;
                    tries.after_failure();
                    continue;
                }
            };
            self.inner.metrics.cache_origin_bytes(&self.fetch.route.name, chunk.len() as u64);
            let mut chunk = &chunk[..];
            // A chunk may end one slice and begin the next.
            while !chunk.is_empty() {
                let Some((id, fill, _)) = self.run.front().cloned() else { break };
                let slice_len = self.version.slice_range(id.index).len();
                let take =
                    usize::try_from(slice_len - written).unwrap_or(usize::MAX).min(chunk.len());
                if let Err(e) = fill.file.write_all_at(&chunk[..take], HEADER_LEN + written) {
                    self.inner.write_failed(&e);
                    return self.fail(FillFailure::Disk);
                }
                crc.update(&chunk[..take]);
                written += take as u64;
                at += take as u64;
                chunk = &chunk[take..];
                if written == slice_len {
                    self.complete_front(written, std::mem::take(&mut crc).finalize());
                    written = 0;
                } else {
                    fill.progress.send_replace(Progress::Writing(written));
                }
            }
        }
        if let Some(done) = exchange {
            self.fetch.origin.release(done).await;
        }
    }

    /// The first slice of the run is written whole: into the store, and its readers told.
    fn complete_front(&mut self, len: u64, crc: u32) {
        if let Some(claimed) = self.run.pop_front() {
            complete(&self.inner, claimed, len, crc);
        }
    }

    /// `range` of the version from the origin, within the route's attempts and deadline.
    async fn fetch_rest(
        &self,
        range: ByteRange,
        tries: &mut Tries,
    ) -> std::result::Result<Exchange, FillFailure> {
        let pinned = Pinned { etag: &self.version.etag, len: self.version.len };
        let (upstream, base) = (&self.fetch.route.upstream, &self.fetch.base);
        match self
            .fetch
            .origin
            .fetch(upstream, base, range, pinned, &self.fetch.policy, tries)
            .await
        {
            Ok((exchange, _)) => Ok(exchange),
            Err(FetchError::Changed) => Err(FillFailure::Changed),
            Err(FetchError::Failed) => Err(FillFailure::Origin),
        }
    }

    /// No one waits for the run any more: its slices are left missing, for the next request that
    /// needs them to fetch, and its origin request is dropped.
    fn give_up(self) {
        info!(route = %self.fetch.route.name, "a cache fill has no reader left: given up");
        for claimed in self.run {
            let len = self.version.slice_range(claimed.0.index).len();
            abandon(&self.inner, claimed, len, FillFailure::Origin);
        }
    }

    /// The run cannot be fetched: every slice still claimed fails (its readers see it), and is
    /// left missing for the next request to fetch.
    fn fail(self, failure: FillFailure) {
        if failure == FillFailure::Changed {
            self.inner.changed(&self.version);
        }
        if failure != FillFailure::Disk {
            warn!(route = %self.fetch.route.name, ?failure, "a cache fill failed: its slices stay missing");
        }
        self.inner.metrics.cache_fill_failed(&self.fetch.route.name);
        for claimed in self.run {
            let len = self.version.slice_range(claimed.0.index).len();
            abandon(&self.inner, claimed, len, failure);
        }
    }
}

/// Resolves once no reader has waited on any slice of `run` for [`UNWANTED_AFTER`].
async fn unwanted(run: &std::collections::VecDeque<Claimed>) {
    let mut alone_since = None;
    loop {
        tokio::time::sleep(UNWANTED_POLL).await;
        if run.iter().any(|(_, fill, _)| fill.progress.receiver_count() > 0) {
            alone_since = None;
        } else if alone_since.get_or_insert_with(Instant::now).elapsed() >= UNWANTED_AFTER {
            return;
        }
    }
}
