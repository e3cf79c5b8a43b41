//! Fetching missing slices, once for every request that needs them, and reading an answer's
//! bytes from the slices as they are complete or as they grow.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::RequestHeader;
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::{RangeRequest, RangeSpec};
use tokio::sync::watch;
use tracing::Instrument as _;
use tracing::{info, warn};

use super::store::{HEADER_LEN, OpenSlice, SliceId};
use super::{Inner, Version, mapped};
use crate::routes::Route;
use crate::routes::UpstreamResume;
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

impl Fills {
    /// Whether slice `id` is being fetched.
    pub(super) fn filling(&self, id: SliceId) -> bool {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&id)
    }
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
    /// A complete slice; `mapped`: its bytes, once a reader in user space has mapped them
    /// (`super::mapped`).
    Complete {
        id: SliceId,
        file: Arc<File>,
        mapped: Option<Bytes>,
    },
    Filling {
        id: SliceId,
        file: Arc<File>,
        progress: watch::Receiver<Progress>,
    },
    /// The rest of a slice the cache could not write, from the origin: `left` bytes, after
    /// `passing` bytes before them (the whole object is asked of an origin that ignores ranges).
    Origin {
        exchange: Box<Exchange>,
        left: u64,
        passing: u64,
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
                Source::Complete { id, file, mut mapped } => {
                    // What the kernel sends needs no buffer: the rest of the slice at once.
                    let want = if zero_copy { rest } else { want };
                    let segment = if zero_copy {
                        Segment::File {
                            file: Arc::clone(&file),
                            offset: HEADER_LEN + offset,
                            len: want,
                        }
                    } else {
                        let bytes = match mapped.take() {
                            Some(bytes) => bytes,
                            None => mapped::slice_bytes(Arc::clone(&file), slice.len())
                                .await
                                .map_err(|e| {
                                    self.inner.store.remove(id);
                                    Error::because(
                                        ErrorType::ReadError,
                                        "mapping a cached slice",
                                        e,
                                    )
                                    .into_up()
                                })?,
                        };
                        let chunk = usize::try_from(offset)
                            .ok()
                            .zip(usize::try_from(offset + want).ok())
                            .and_then(|(start, end)| bytes.get(start..end))
                            .map(|chunk| bytes.slice_ref(chunk));
                        mapped = Some(bytes);
                        Segment::Bytes(chunk.ok_or_else(|| {
                            Error::explain(ErrorType::ReadError, "a cached slice is short")
                        })?)
                    };
                    self.advance(want);
                    self.current = Some(Source::Complete { id, file, mapped });
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
                            self.current = Some(Box::pin(self.origin_range(range)).await?);
                        }
                        Progress::Failed(failure) => return Err(fill_failed(failure)),
                    }
                }
                Source::Origin { mut exchange, left, passing } => {
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
                    let passed = (chunk.len() as u64).min(passing);
                    let len = (chunk.len() as u64 - passed).min(left);
                    let chunk = chunk.slice(passed as usize..(passed + len) as usize);
                    self.advance(len);
                    let (left, passing) = (left - len, passing - passed);
                    self.current = Some(Source::Origin { exchange, left, passing });
                    if !chunk.is_empty() {
                        return Ok(Some(Segment::Bytes(chunk)));
                    }
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
                    return Ok(Source::Complete { id, file, mapped: None });
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
                    return self.origin_range(range).await;
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
    async fn origin_range(&self, range: ByteRange) -> Result<Source> {
        let Some(fetch) = &self.fetch else { return Err(fill_failed(FillFailure::Disk)) };
        let once = &UpstreamResume::ONCE;
        match fetch_version(fetch, &self.version, range, once, &mut Tries::new()).await {
            Ok((exchange, from)) => Ok(Source::Origin {
                exchange: Box::new(exchange),
                left: range.len(),
                passing: range.start() - from,
            }),
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
    let from = version.slice_range(first).start();
    let task = RunFill::new(inner, version, fetch, run.into(), from);
    // Its origin requests are in the trace of the request that started it, when it has one.
    tokio::spawn(task.run(None).in_current_span());
    true
}

/// Fills what it can of `version` from `exchange`, the answer to the request that learned it,
/// whose body is `got` of the object: the slices that lie whole in it, from the first that begins
/// in it, at most a run — claimed before this returns, so that the requests that waited for the
/// object find them being filled — written by a task of their own, as [`start_run`]'s. What the
/// body holds before that slice is passed over, what it holds after the run is left unread.
pub(super) fn fill_from(
    inner: &Arc<Inner>,
    version: &Arc<Version>,
    exchange: Exchange,
    got: ByteRange,
    fetch: &Fetch,
) {
    let first = got.start().div_ceil(version.slice_size);
    let mut run = VecDeque::new();
    {
        let mut fills = inner.fills.map.lock().unwrap_or_else(|p| p.into_inner());
        for index in (first..first.saturating_add(RUN_SLICES)).take_while(|index| {
            *index < version.slices() && version.slice_range(*index).end() <= got.end()
        }) {
            match claim(inner, &mut fills, version, index) {
                Some(claimed) => run.push_back(claimed),
                None => break,
            }
        }
    }
    let task = RunFill::new(inner, version, fetch, run, got.start());
    tokio::spawn(task.run(Some(exchange)).in_current_span());
}

/// The slices of `version`, a body without a length that ended as `staged` holds it
/// ([`super::streamed`]): each claimed — all before any is written, so that a reader finds each
/// one filling rather than the version incomplete — then written from the staged bytes. A slice
/// the cache has no room for is left out: a version nothing pins is then dropped by the next
/// request that finds it incomplete; a pinned one has that slice fetched as any missing one.
pub(super) fn from_staged(inner: &Arc<Inner>, version: &Arc<Version>, staged: &File) {
    let claimed: Vec<Claimed> = {
        let mut fills = inner.fills.map.lock().unwrap_or_else(|p| p.into_inner());
        (0..version.slices()).filter_map(|index| claim(inner, &mut fills, version, index)).collect()
    };
    for claimed in claimed {
        let range = version.slice_range(claimed.0.index);
        match copy_slice(staged, range, &claimed.1.file) {
            Ok(crc) => complete(inner, claimed, range.len(), crc),
            Err(e) => {
                inner.write_failed(&e);
                abandon(inner, claimed, range.len(), FillFailure::Disk);
            }
        }
    }
}

/// Copies the bytes `range` of `from` into a slice file after its header: their CRC32.
fn copy_slice(from: &File, range: ByteRange, to: &File) -> std::io::Result<u32> {
    let mut crc = crc32fast::Hasher::new();
    let len = range.len();
    let mut buf = vec![0; usize::try_from(len.min(READ_BYTES)).unwrap_or(0)];
    let mut copied = 0;
    while copied < len {
        let take = usize::try_from(len - copied).unwrap_or(usize::MAX).min(buf.len());
        from.read_exact_at(&mut buf[..take], range.start() + copied)?;
        to.write_all_at(&buf[..take], HEADER_LEN + copied)?;
        crc.update(&buf[..take]);
        copied += take as u64;
    }
    Ok(crc.finalize())
}

/// The `Range` the request that learns an object asks with, for a request that asks `range`
/// (`head`: a HEAD, which needs no bytes): the run of slices from the one holding the first byte
/// asked — at most [`RUN_SLICES`], none past the one holding the last byte asked; one slice for a
/// HEAD. A suffix's first byte is not known before the length is: it asks for a slice more than
/// the suffix (less one byte), which holds the slice its first byte is in, at most a run.
pub(super) fn first_run(range: Option<&RangeRequest>, head: bool, slice_size: u64) -> RangeSpec {
    let run = if head { 1 } else { RUN_SLICES };
    let spec = match range {
        Some(RangeRequest::Bytes(set)) if !head => set.specs().first().copied(),
        _ => None,
    };
    let (first, last) = match spec {
        Some(RangeSpec::Suffix { len }) => {
            let len = len.saturating_add(slice_size - 1).min(run * slice_size);
            return RangeSpec::Suffix { len };
        }
        Some(RangeSpec::Closed { first, last }) => (first, last),
        Some(RangeSpec::From { first }) => (first, u64::MAX),
        None => (0, u64::MAX),
    };
    let start = first / slice_size * slice_size;
    let run_end = start.saturating_add(run * slice_size);
    let last_slice_end = (last / slice_size).saturating_add(1).saturating_mul(slice_size);
    RangeSpec::Closed { first: start, last: run_end.min(last_slice_end) - 1 }
}

/// The `Range` a validation of `stale` asks with, for a request that asks `range` (`head`: a
/// HEAD): the run [`first_run`] would ask, from the first of its slices the cache does not hold —
/// a 304 brings no body, but an origin that ignores the condition sends the bytes, and those
/// the cache holds are not asked for again: the missing slices from there up to the next one it
/// holds — or the run's last slice when it holds them all.
pub(super) fn validation_run(
    inner: &Inner,
    stale: &Version,
    range: Option<&RangeRequest>,
    head: bool,
) -> RangeSpec {
    let run = first_run(range, head, stale.slice_size);
    let Some(asked) = run.resolve(stale.len) else { return run };
    let size = stale.slice_size;
    let (first, last) = (asked.start() / size, (asked.end() - 1) / size);
    let held = |index: &u64| inner.store.has(stale.slice_id(*index));
    let from = (first..last).find(|index| !held(index)).unwrap_or(last);
    let to = (from + 1..=last).find(held).map_or(last, |index| index - 1);
    RangeSpec::Closed { first: from * size, last: stale.slice_range(to).end() - 1 }
}

/// `range` of `version` from its origin, within `policy` and the `tries` made before: the
/// exchange, and the byte of the object its body begins at — `range`'s first, or 0 for a version
/// whose origin ignores ranges, which is asked for whole (and read from the start).
async fn fetch_version(
    fetch: &Fetch,
    version: &Version,
    range: ByteRange,
    policy: &UpstreamResume,
    tries: &mut Tries,
) -> std::result::Result<(Exchange, u64), FetchError> {
    let pinned = Pinned { by: version.pin().ok_or(FetchError::Changed)?, len: version.len };
    let (asked, from) = if version.ignores_ranges {
        (ByteRange::whole(version.len), 0)
    } else {
        (range, range.start())
    };
    let (upstream, base) = (&fetch.route.upstream, &fetch.base);
    let (exchange, _) = fetch.origin.fetch(upstream, base, asked, pinned, policy, tries).await?;
    Ok((exchange, from))
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

/// A run of claimed slices, fetched with one origin request (continued where it breaks). The
/// exchange's body may begin before the run (passed over: a suffix learned before its slice was
/// known, the whole object from an origin that ignores ranges) and go on past it (left unread,
/// its connection closed).
struct RunFill {
    inner: Arc<Inner>,
    version: Arc<Version>,
    fetch: Fetch,
    run: VecDeque<Claimed>,
    /// The byte of the object the exchange's body brings next.
    stream_at: u64,
    /// The front slice's bytes so far, and their CRC.
    written: u64,
    crc: crc32fast::Hasher,
}

impl RunFill {
    fn new(
        inner: &Arc<Inner>,
        version: &Arc<Version>,
        fetch: &Fetch,
        run: VecDeque<Claimed>,
        stream_at: u64,
    ) -> Self {
        Self {
            inner: Arc::clone(inner),
            version: Arc::clone(version),
            fetch: fetch.clone(),
            run,
            stream_at,
            written: 0,
            crc: crc32fast::Hasher::new(),
        }
    }

    /// The next byte of the object the run needs; `None` once it is written.
    fn at(&self) -> Option<u64> {
        let (front, ..) = self.run.front()?;
        Some(self.version.slice_range(front.index).start() + self.written)
    }

    /// Fills the run from `first` (the exchange that learned the version), or from the origin.
    async fn run(mut self, first: Option<Exchange>) {
        let mut tries = Tries::new();
        let mut exchange = first;
        while let Some(at) = self.at() {
            let current = match exchange.as_mut() {
                Some(current) => current,
                None => {
                    let fetched = tokio::select! {
                        fetched = self.fetch_rest(at, &mut tries) => fetched,
                        () = unwanted(&self.run) => return self.give_up(),
                    };
                    match fetched {
                        Ok((fetched, from)) => {
                            self.stream_at = from;
                            exchange.insert(fetched)
                        }
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
            if let Err(failure) = self.take(&chunk) {
                return self.fail(failure);
            }
        }
        if let Some(done) = exchange {
            self.fetch.origin.release(done).await;
        }
    }

    /// Writes `chunk`, the next bytes of the exchange's body, into the run's slices: what comes
    /// before the byte the run needs next is passed over, and a chunk may end one slice and begin
    /// the next.
    fn take(&mut self, mut chunk: &[u8]) -> std::result::Result<(), FillFailure> {
        while let (Some(at), false) = (self.at(), chunk.is_empty()) {
            let Some((id, fill, _)) = self.run.front() else { break };
            let passed = usize::try_from(at.saturating_sub(self.stream_at)).unwrap_or(usize::MAX);
            let passed = passed.min(chunk.len());
            let slice_len = self.version.slice_range(id.index).len();
            let take = usize::try_from(slice_len - self.written)
                .unwrap_or(usize::MAX)
                .min(chunk.len() - passed);
            let bytes = &chunk[passed..passed + take];
            if let Err(e) = fill.file.write_all_at(bytes, HEADER_LEN + self.written) {
                self.inner.write_failed(&e);
                return Err(FillFailure::Disk);
            }
            self.crc.update(bytes);
            self.written += take as u64;
            self.stream_at += (passed + take) as u64;
            chunk = &chunk[passed + take..];
            if self.written == slice_len {
                self.claim_ahead();
                self.complete_front();
            } else if take > 0 {
                fill.progress.send_replace(Progress::Writing(self.written));
            }
        }
        Ok(())
    }

    /// The first slice of the run is written whole: into the store, and its readers told.
    fn complete_front(&mut self) {
        let crc = std::mem::take(&mut self.crc).finalize();
        if let Some(claimed) = self.run.pop_front() {
            complete(&self.inner, claimed, self.written, crc);
        }
        self.written = 0;
    }

    /// Of a version whose origin ignores ranges, the exchange brings the rest of the object: the
    /// slice after the run is claimed before its front one is complete, so that a reader that
    /// goes on from there finds it being filled rather than asks for the whole object again. A
    /// slice that cannot be claimed (complete, being fetched, no room) ends the run there.
    fn claim_ahead(&mut self) {
        if !self.version.ignores_ranges {
            return;
        }
        let next = self.run.back().map(|(id, ..)| id.index + 1);
        let Some(next) = next.filter(|next| *next < self.version.slices()) else { return };
        let mut fills = self.inner.fills.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(claimed) = claim(&self.inner, &mut fills, &self.version, next) {
            self.run.push_back(claimed);
        }
    }

    /// The rest of the run from byte `at`, from the origin, within the route's attempts and
    /// deadline: the exchange, and the byte its body begins at.
    async fn fetch_rest(
        &self,
        at: u64,
        tries: &mut Tries,
    ) -> std::result::Result<(Exchange, u64), FillFailure> {
        let end = self.run.back().map_or(at, |(id, ..)| self.version.slice_range(id.index).end());
        let range = ByteRange::new(at, end).unwrap_or(super::NOTHING);
        match fetch_version(&self.fetch, &self.version, range, &self.fetch.policy, tries).await {
            Ok(fetched) => Ok(fetched),
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
async fn unwanted(run: &VecDeque<Claimed>) {
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

#[cfg(test)]
mod tests {
    use rangeway_middleware::rfc9110::RangeSet;

    use super::*;

    const S: u64 = 1 << 20;

    fn asked(spec: RangeSpec) -> Option<RangeRequest> {
        RangeSet::new(vec![spec]).map(RangeRequest::Bytes)
    }

    fn run_for(spec: RangeSpec) -> RangeSpec {
        first_run(asked(spec).as_ref(), false, S)
    }

    #[test]
    fn the_first_run_holds_the_slice_of_the_first_byte_asked() {
        use RangeSpec::{Closed, From, Suffix};
        // The whole object: the first run; a HEAD: the first slice.
        assert_eq!(first_run(None, false, S), Closed { first: 0, last: 16 * S - 1 });
        assert_eq!(first_run(None, true, S), Closed { first: 0, last: S - 1 });
        let head = first_run(asked(From { first: 5 * S }).as_ref(), true, S);
        assert_eq!(head, Closed { first: 0, last: S - 1 });
        // Within one slice: that slice; across some: those; further: a run.
        assert_eq!(
            run_for(Closed { first: 2 * S + 5, last: 2 * S + 9 }),
            Closed { first: 2 * S, last: 3 * S - 1 }
        );
        assert_eq!(
            run_for(Closed { first: S - 1, last: 3 * S }),
            Closed { first: 0, last: 4 * S - 1 }
        );
        assert_eq!(
            run_for(Closed { first: S, last: 40 * S }),
            Closed { first: S, last: 17 * S - 1 }
        );
        assert_eq!(run_for(From { first: 3 * S + 1 }), Closed { first: 3 * S, last: 19 * S - 1 });
        // A suffix: a slice more, less a byte, so that its first byte's slice is whole in it; at
        // most a run.
        assert_eq!(run_for(Suffix { len: 1000 }), Suffix { len: 1000 + S - 1 });
        assert_eq!(run_for(Suffix { len: 100 * S }), Suffix { len: 16 * S });
        // Positions no object reaches do not overflow.
        let far = run_for(From { first: u64::MAX - 1 });
        assert_eq!(far, Closed { first: (u64::MAX - 1) / S * S, last: u64::MAX - 1 });
    }
}
