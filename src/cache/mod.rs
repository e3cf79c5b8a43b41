//! The slice cache: an object's bytes kept on local disk in aligned slices, each fetched from its
//! origin once however many clients ask, and served from disk after.
//!
//! It sits under the relay's request to the origin (see `proxy/LIFECYCLE.md`): where the relay
//! would send its planned upstream request, it asks the cache, which answers it as the origin
//! would — the same status, validators and range — from what it holds, fetching what it lacks.
//! Everything above (the client's ranges, `If-Range`, resume safety, the stages) works on that
//! answer as on the origin's, so the cache changes where bytes come from and nothing else.
//!
//! - **What is known of an object** ([`Version`]): the status, length and header fields of the
//!   origin's answer, learned from the one request a miss makes — the GET of the first slices
//!   it needs, with the client's end-to-end fields (not those that name a host, nor `Cookie`),
//!   whose body fills them — validated once stale (or at every new download when a route asks)
//!   with the same GET made conditional on the stored ETag and `Last-Modified`, kept beside its
//!   slices and in memory. Whatever a shared cache may keep is kept (RFC 9111 §3: any validator
//!   or none, any status with explicit freshness or a heuristically cacheable one), but answers
//!   with `Vary` or `Set-Cookie`; anything else goes to the origin as without a cache — the
//!   answer to that first GET handed to the client as the origin's when it is the client's too.
//!   Stale answers are served only where `max-stale`, `stale-while-revalidate` (one validation
//!   in the background) or `stale-if-error` allow.
//! - **Slices** ([`store`]): slice `k` of a version holds its bytes `k·S ..`; a version's slices
//!   are keyed by its id — its strong ETag, or a name the cache gives a version without one —
//!   so slices of two versions never meet in one answer. A version's missing slices are fetched
//!   pinned to it ([`Version::pin`]: `If-Match` on its strong ETag, else `If-Unmodified-Since`
//!   on a strong `Last-Modified`); a version nothing pins is kept only whole from the answer
//!   that learned it, and learned again when a slice of it is gone.
//! - **Fills** ([`fill`]): a missing slice is fetched with the run of missing slices after it
//!   (up to the request's end) in one ranged origin request, pinned to the version. A slice
//!   being fetched is waited on, and read as it grows, by every request that needs it; a fill
//!   runs on its own task, so a client that goes away stops nothing others wait on. A fill that
//!   fails leaves its slice missing (its waiters' answers are cut, never ended short); a changed
//!   version drops the old one's slices.
//! - **Bounds**: what the cache keeps — slices, versions' metadata, folders — stays within
//!   `max_size` bytes on disk (as `du` counts them) and `max_entries` files and folders; the
//!   least recently used slice or version goes first (see [`store`]).
//!   A folder that cannot be written turns the cache off at start; a write that fails turns it off
//!   for that slice, whose readers get the rest of it from the origin.

mod fill;
mod mapped;
mod origin;
mod store;
mod streamed;
mod version;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, Method, StatusCode, header};
use pingora_http::{RequestHeader, ResponseHeader};
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::{
    Precondition, RangeLimits, RangeRequest, Resolution, evaluate_preconditions, if_range_holds,
    parse_range_header,
};
use rangeway_middleware::rfc9111::{self, Freshness};
use serde::Serialize;
use tokio::sync::watch;
use tracing::{Instrument as _, info, warn};

use crate::routes::origin_client::{Exchange, OriginClient};
use crate::routes::{Revalidate, Route, RouteCache};
use crate::telemetry::metrics::Metrics;
use fill::Fills;
pub(crate) use fill::{CacheBody, OutputWriter, Segment};
use origin::{
    conditional_on, handover, keyable, origin_request, partial, stored_fields, variant, varies_by,
    varies_of,
};
#[cfg(test)]
pub(crate) use store::tests::Folder;
use store::{SliceStore, VersionKey};
pub(crate) use streamed::StreamedFill;
pub(crate) use version::Version;
use version::{Meta, unpinned_id};

/// `[cache]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheConfig {
    pub dir: PathBuf,
    /// Bytes on disk, as `du` counts them.
    pub max_size: u64,
    /// Files and folders (and records of the index).
    pub max_entries: u64,
    pub slice_size: u64,
}

/// How long an object whose answers may not be cached is sent straight to its origin before
/// it is asked again: asking with the cache's own request each time would cost the object's
/// clients what the cache saves.
const UNCACHEABLE_FOR: Duration = Duration::from_secs(60);

/// No bytes.
const NOTHING: ByteRange = ByteRange::whole(0);

/// What the cache did for a request, for the access line and `rangeway_cache_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every byte was there.
    Hit,
    /// Some bytes were not: this request started fetching them.
    Miss,
    /// Some bytes were being fetched for another request: this one waited on that.
    Coalesced,
    /// The stored version was validated with the origin first.
    Revalidated,
    /// The stored version, stale, served as its directives allow: while it is validated in the
    /// background (`stale-while-revalidate`), or because its validation failed
    /// (`stale-if-error`).
    Stale,
    /// Not for the cache (why, below): asked of the origin as without one.
    Bypass(Bypass),
}

/// Why a request was not served from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bypass {
    /// The request: another method, several ranges, `no-store`, `Authorization` on a route that
    /// keeps such answers apart; or one the answer being kept without a length cannot serve
    /// yet (a HEAD, a route whose stages change bytes).
    Request,
    /// The origin's answers may not be cached (status, `no-store`, `private`, `Vary: *`,
    /// `Set-Cookie`).
    Uncacheable,
    /// The origin could not be asked what the object is, or failed (5xx), or answered the cache's
    /// request with what does not answer the client's (416).
    Origin,
    /// The cache is off: its folder cannot be written.
    Off,
}

impl Outcome {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Coalesced => "coalesced",
            Self::Revalidated => "revalidated",
            Self::Stale => "stale",
            Self::Bypass(Bypass::Request) => "bypass_request",
            Self::Bypass(Bypass::Uncacheable) => "bypass_uncacheable",
            Self::Bypass(Bypass::Origin) => "bypass_origin",
            Self::Bypass(Bypass::Off) => "off",
        }
    }
}

/// What the cache answers a planned upstream request with.
pub(crate) enum CacheAnswer {
    /// The answer the origin would give: its header, and its body (none for a HEAD, a 304, a
    /// 412 or a 416).
    Served { header: Box<ResponseHeader>, body: Option<Box<CacheBody>>, outcome: Outcome },
    /// The origin's own answer to the cache's request: the client's answer, as if the client's
    /// request had gone to the origin (see `handover`). Not kept (`outcome` says why, for the
    /// access line), or, for an answer without a length, kept by `fill` as its body streams to
    /// the client.
    Origin {
        header: Box<ResponseHeader>,
        exchange: Box<Exchange>,
        outcome: Outcome,
        fill: Option<Box<StreamedFill>>,
    },
    /// Ask the origin, as without a cache.
    Bypass(Bypass),
}

/// What the cache has for a request: a version to answer from, and how it was had; or the
/// origin's answer to the request that would have learned one.
enum Found {
    Version(Arc<Version>, Had),
    Answer {
        header: Box<ResponseHeader>,
        exchange: Box<Exchange>,
        outcome: Outcome,
        fill: Option<Box<StreamedFill>>,
    },
    /// Nothing stored may answer a request that says `only-if-cached`.
    NotStored,
}

/// How a request had the version it is answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Had {
    /// Known and usable as it was, or learned a moment ago by another request.
    Known,
    /// Validated with the origin for this request.
    Validated,
    /// Learned by this request, whose answer from the origin fills the first slices.
    Learned,
    /// Known, stale, and served so (see [`Outcome::Stale`]).
    Stale,
}

/// Whether a request learns an object or waits for another that does.
enum Turn {
    Learn(watch::Sender<bool>),
    Wait(watch::Receiver<bool>),
}

/// Objects whose answers may not be cached, each sent to its origin for [`UNCACHEABLE_FOR`]
/// from when that was learned: at most `max` of them, the oldest forgotten first when there are
/// more (which costs that object's next client the cache's own request again).
#[derive(Debug)]
struct Uncacheable {
    since: HashMap<(String, String), Instant>,
    /// In the order they were learned (an object learned again is in it twice; its older place
    /// is passed over).
    order: VecDeque<((String, String), Instant)>,
    max: usize,
}

impl Uncacheable {
    fn new(max: usize) -> Self {
        Self { since: HashMap::new(), order: VecDeque::new(), max }
    }

    fn holds(&self, object: &(String, String)) -> bool {
        self.since.get(object).is_some_and(|at| at.elapsed() < UNCACHEABLE_FOR)
    }

    fn insert(&mut self, object: (String, String)) {
        let now = Instant::now();
        self.since.insert(object.clone(), now);
        self.order.push_back((object, now));
        while let Some((oldest, at)) = self.order.front() {
            let over = self.since.len() > self.max || self.order.len() > 2 * self.max;
            if !over && at.elapsed() < UNCACHEABLE_FOR {
                break;
            }
            if self.since.get(oldest) == Some(at) {
                self.since.remove(oldest);
            }
            self.order.pop_front();
        }
    }

    fn remove(&mut self, object: &(String, String)) {
        self.since.remove(object);
    }
}

/// The cache, built once from config.
pub(crate) struct SliceCache {
    inner: Arc<Inner>,
}

struct Inner {
    /// The slices, and the current version of each object (by upstream and target).
    store: SliceStore,
    slice_size: u64,
    uncacheable: Mutex<Uncacheable>,
    /// Objects being learned or validated (a request to the origin in flight): others wait for
    /// it rather than ask too.
    learning: Mutex<HashMap<(String, String), watch::Receiver<bool>>>,
    /// The request fields each object's answers vary by, lower case, where its last stored
    /// answer said `Vary`: its versions are kept apart by their values ([`variant`]).
    varies: Mutex<HashMap<(String, String), Vec<String>>>,
    fills: Fills,
    metrics: Arc<Metrics>,
    /// A write failed: logged once.
    write_failed: AtomicBool,
}

impl std::fmt::Debug for SliceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceCache")
            .field("slice_size", &self.inner.slice_size)
            .finish_non_exhaustive()
    }
}

impl SliceCache {
    /// Opens the cache `config` describes, indexing what a previous run left. `None` (logged,
    /// counted) when its folder cannot be made or written: rangeway then serves from the
    /// origin alone.
    pub(crate) fn open(config: &CacheConfig, metrics: &Arc<Metrics>) -> Option<Self> {
        let bounds = store::Bounds { bytes: config.max_size, entries: config.max_entries };
        let parse = |key, bytes: &[u8]| {
            serde_json::from_slice::<Meta>(bytes)
                .ok()
                .and_then(|meta| Version::from_meta(meta, config.slice_size))
                .filter(|version| version.key == key)
        };
        let (store, scanned) = match SliceStore::open(&config.dir, bounds, metrics, parse) {
            Ok(opened) => opened,
            Err(e) => {
                warn!(dir = %config.dir.display(), error = %e, "the cache folder cannot be written: the cache is off, downloads come from the origin");
                metrics.cache_enabled(false);
                return None;
            }
        };
        let used = store.used();
        info!(
            dir = %config.dir.display(),
            objects = scanned.objects,
            slices = scanned.slices,
            bytes = used.bytes,
            entries = used.entries,
            removed = scanned.removed,
            evicted = scanned.evicted,
            "the cache is open"
        );
        metrics.cache_enabled(true);
        let uncacheable = usize::try_from(config.max_entries).unwrap_or(usize::MAX);
        let varies = Mutex::new(varies_of(&store));
        Some(Self {
            inner: Arc::new(Inner {
                store,
                slice_size: config.slice_size,
                uncacheable: Mutex::new(Uncacheable::new(uncacheable)),
                learning: Mutex::new(HashMap::new()),
                varies,
                fills: Fills::default(),
                metrics: Arc::clone(metrics),
                write_failed: AtomicBool::new(false),
            }),
        })
    }

    /// Answers `request` — the upstream request the relay planned for `route`, made for
    /// `replica` — as the origin would, from the cache and what it fetches. `authorized`: the
    /// client's own `Authorization` goes upstream with it (an S3 route signs with rangeway's
    /// keys instead), so the answer may be the client's alone.
    pub(crate) async fn answer(
        &self,
        route: &Arc<Route>,
        policy: RouteCache,
        (request, authorized): (&RequestHeader, bool),
        origin: &Arc<OriginClient>,
        replica: usize,
    ) -> CacheAnswer {
        let inner = &self.inner;
        let Some(asked) = Asked::of(request, authorized, policy) else {
            return CacheAnswer::Bypass(Bypass::Request);
        };
        let Some(base) = origin_request(route, request, replica, authorized) else {
            return CacheAnswer::Bypass(Bypass::Request);
        };
        let target = request.uri.path_and_query().map_or("/", |p| p.as_str());
        let object = (route.upstream.name().to_owned(), target.to_owned());
        let names = inner.varies.lock().unwrap_or_else(|p| p.into_inner()).get(&object).cloned();
        let object = match names {
            Some(names) => (object.0, variant(target, &names, &base.headers)),
            None => object,
        };
        let fetch = fill::Fetch {
            origin: Arc::clone(origin),
            route: Arc::clone(route),
            base: Arc::new(base),
            policy: route.upstream_resume.unwrap_or_default(),
        };
        let ask = Ask { route, request, fetch: &fetch, replica, object };
        let (version, had) = match inner.version(&ask, &asked).await {
            Ok(Found::Version(version, had)) => (version, had),
            Ok(Found::Answer { header, exchange, outcome, fill }) => {
                return CacheAnswer::Origin { header, exchange, outcome, fill };
            }
            Ok(Found::NotStored) => {
                let Ok(mut header) = ResponseHeader::build(StatusCode::GATEWAY_TIMEOUT, Some(1))
                else {
                    return CacheAnswer::Bypass(Bypass::Request);
                };
                let _ = header.insert_header(header::CONTENT_LENGTH, 0);
                let (header, outcome) = (Box::new(header), Outcome::Miss);
                return CacheAnswer::Served { header, body: None, outcome };
            }
            Err(bypass) => return CacheAnswer::Bypass(bypass),
        };
        let now = SystemTime::now();
        let mut header = match inner.respond(&version, request, &asked, now) {
            Ok(header) => header,
            Err(bypass) => return CacheAnswer::Bypass(bypass),
        };
        let range = match header.status.as_u16() {
            206 => crate::range::body_range(206, &header.headers).unwrap_or(NOTHING),
            _ if header.status == version.status => ByteRange::whole(version.len),
            _ => NOTHING,
        };
        let outcome = match had {
            Had::Known => Outcome::Hit,
            Had::Validated => Outcome::Revalidated,
            Had::Learned => Outcome::Miss,
            Had::Stale => Outcome::Stale,
        };
        if request.method == Method::HEAD || range.is_empty() {
            return CacheAnswer::Served { header: Box::new(header), body: None, outcome };
        }
        let (body, started) = CacheBody::new(Arc::clone(inner), version, range, fetch);
        let outcome = match started {
            // A miss, though what it waits on is filled by its own answer from the origin.
            _ if had == Had::Learned => outcome,
            fill::Started::Fill => Outcome::Miss,
            fill::Started::Waits => Outcome::Coalesced,
            fill::Started::Nothing => outcome,
        };
        let _ = header.insert_header("x-rangeway-cache", outcome.name());
        CacheAnswer::Served { header: Box::new(header), body: Some(Box::new(body)), outcome }
    }

    /// A transformed representation of an object as the cache keeps it: `etag` (the
    /// representation's) and `len` (its output length), made by the chain `identity` from
    /// `upstream`'s `target`, answered with the fields `headers`. Known already, or recorded now.
    pub(crate) fn representation(
        &self,
        (upstream, target, identity): (&str, &str, &str),
        etag: &str,
        len: u64,
        headers: &HeaderMap,
    ) -> Arc<Version> {
        let inner = &self.inner;
        let object = (upstream.to_owned(), format!("{target} {identity}"));
        if let Some(version) = inner.store.current(&object)
            && version.id == etag
            && version.len == len
        {
            return version;
        }
        let now = SystemTime::now();
        let headers = stored_fields(headers);
        let version = Arc::new(Version {
            key: VersionKey::of(&object.0, &object.1, etag, inner.slice_size),
            upstream: object.0.clone(),
            target: object.1.clone(),
            id: etag.to_owned(),
            status: StatusCode::OK,
            len,
            slice_size: inner.slice_size,
            freshness: Freshness::of(&headers, now, now),
            validators: crate::range::validators(&headers),
            headers,
            ignores_ranges: false,
        });
        inner.keep(Arc::clone(&version));
        version
    }

    /// `range` of a representation, when every slice of it is in the cache: a body that reads
    /// them (and fetches nothing: a representation is made by its route's stages, not fetched).
    pub(crate) fn cached_output(
        &self,
        version: &Arc<Version>,
        range: ByteRange,
        route: &str,
    ) -> Option<Box<CacheBody>> {
        if range.is_empty() || range.end() > version.len {
            return None;
        }
        let first = range.start() / version.slice_size;
        let last = (range.end() - 1) / version.slice_size;
        let complete = (first..=last).all(|index| self.inner.store.has(version.slice_id(index)));
        complete.then(|| {
            Box::new(CacheBody::stored(Arc::clone(&self.inner), Arc::clone(version), range, route))
        })
    }

    /// A writer of a representation's slices, for the output bytes of a pass that starts at
    /// output byte `at`: it keeps every whole slice the pass makes.
    pub(crate) fn output_writer(&self, version: &Arc<Version>, at: u64) -> fill::OutputWriter {
        fill::OutputWriter::new(Arc::clone(&self.inner), Arc::clone(version), at)
    }

    /// What the cache holds of the objects `selected` picks: each one's version, length and
    /// complete slices.
    pub(crate) fn listing(&self, selected: &Selection) -> Vec<CachedObject> {
        let mut listed: Vec<CachedObject> = self
            .inner
            .store
            .versions()
            .into_iter()
            .filter(|v| selected.picks(&v.upstream, &v.target))
            .map(|v| CachedObject {
                upstream: v.upstream.clone(),
                target: v.target.split([' ', '\t']).next().unwrap_or_default().to_owned(),
                representation: v.target.split_once(' ').map(|(_, chain)| chain.to_owned()),
                etag: v.id.clone(),
                len: v.len,
                slice_size: v.slice_size,
                slices: self.inner.store.slices_of(v.key),
            })
            .collect();
        listed.sort_by(|a, b| (&a.upstream, &a.target).cmp(&(&b.upstream, &b.target)));
        listed
    }

    /// Drops the objects `selected` picks, their slices deleted: how many.
    pub(crate) fn purge(&self, selected: &Selection) -> usize {
        let store = &self.inner.store;
        let picked =
            store.versions().into_iter().filter(|v| selected.picks(&v.upstream, &v.target));
        picked.filter_map(|v| store.remove_object(&(v.upstream.clone(), v.target.clone()))).count()
    }
}

/// Which cached objects an admin request means.
#[derive(Debug, Clone)]
pub(crate) enum Selection {
    /// One object of an upstream, by its upstream path: with any query.
    Object { upstream: String, path: String },
    /// Every object whose upstream target starts with `prefix` (of `upstream`, or of any).
    Prefix { upstream: Option<String>, prefix: String },
}

impl Selection {
    fn picks(&self, upstream: &str, target: &str) -> bool {
        let target = target.split([' ', '\t']).next().unwrap_or_default();
        match self {
            Self::Object { upstream: u, path } => {
                u == upstream
                    && target
                        .strip_prefix(path.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('?'))
            }
            Self::Prefix { upstream: u, prefix } => {
                u.as_ref().is_none_or(|u| u == upstream) && target.starts_with(prefix.as_str())
            }
        }
    }
}

/// An object in the cache, for the admin API.
#[derive(Debug, Serialize)]
pub(crate) struct CachedObject {
    pub(crate) upstream: String,
    pub(crate) target: String,
    /// For a transformed representation, the identity of the chain that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) representation: Option<String>,
    pub(crate) etag: String,
    pub(crate) len: u64,
    pub(crate) slice_size: u64,
    /// The indexes of the complete slices.
    pub(crate) slices: Vec<u64>,
}

/// Who asks the cache, for which object: the route, the planned request, how the cache asks the
/// origin and the replica the request was made for.
struct Ask<'a> {
    route: &'a Arc<Route>,
    request: &'a RequestHeader,
    /// The origin client and the request the cache asks it with ([`origin_request`]).
    fetch: &'a fill::Fetch,
    replica: usize,
    /// (upstream, target).
    object: (String, String),
}

/// What of the planned request the cache answers by.
struct Asked {
    /// The one range asked for, when there is a `Range`.
    range: Option<RangeRequest>,
    /// The version the request is pinned to (`If-Match` or `If-Range` with one strong ETag):
    /// a download session's own, which the cache serves without validating it again.
    pinned: Option<String>,
    /// Whether the route validates every new download.
    each_download: bool,
    /// `only-if-cached`: answered from what is stored, or 504 (RFC 9111 §5.2.1.7).
    only_if_cached: bool,
}

impl Asked {
    /// `None` when the request is not for the cache.
    fn of(request: &RequestHeader, authorized: bool, policy: RouteCache) -> Option<Self> {
        if !matches!(request.method, Method::GET | Method::HEAD) {
            return None;
        }
        let headers = &request.headers;
        if authorized && !policy.authorized {
            return None;
        }
        let control = rfc9111::CacheControl::of(headers);
        if control.no_store {
            return None;
        }
        let range = match parse_range_header(headers, &RangeLimits::with_max_ranges(1)) {
            // Several ranges (the relay plans them apart), or one unreadable: the origin's.
            Some(RangeRequest::Ignore(_)) => return None,
            parsed => parsed,
        };
        let pinned = [header::IF_MATCH, header::IF_RANGE]
            .iter()
            .filter_map(|name| headers.get(name)?.to_str().ok())
            .find(|value| value.starts_with('"') && !value.contains(','))
            .map(str::to_owned);
        let each_download = policy.revalidate == Revalidate::EachDownload;
        Some(Self { range, pinned, each_download, only_if_cached: control.only_if_cached })
    }
}

impl Inner {
    /// The version to answer with: known and usable as it is, or validated or learned first; or
    /// the origin's answer to the request that would have learned it.
    async fn version(self: &Arc<Self>, ask: &Ask<'_>, asked: &Asked) -> Result<Found, Bypass> {
        let (request, object) = (ask.request, &ask.object);
        if self.uncacheable.lock().unwrap_or_else(|p| p.into_inner()).holds(object) {
            return Err(Bypass::Uncacheable);
        }
        let now = SystemTime::now();
        let stale = match self.usable(object) {
            Some(version) => {
                let pinned = asked.pinned.as_deref() == Some(version.id.as_str());
                let freshness = &version.freshness;
                let fresh = freshness.serves_unvalidated(&request.headers, now);
                if pinned || (fresh && !asked.each_download) {
                    return Ok(Found::Version(version, Had::Known));
                }
                if !asked.each_download
                    && freshness.serves_while_revalidating(&request.headers, now)
                {
                    self.validate_behind(ask, Arc::clone(&version));
                    return Ok(Found::Version(version, Had::Stale));
                }
                Some(version)
            }
            None => None,
        };
        if asked.only_if_cached {
            return Ok(Found::NotStored);
        }
        match self.turn(object) {
            Turn::Learn(done) => {
                let found = self.learn(ask, asked, stale.as_deref()).await;
                self.learning.lock().unwrap_or_else(|p| p.into_inner()).remove(object);
                let _ = done.send(true);
                let failed = match &found {
                    Err(why) => *why == Bypass::Origin,
                    Ok(Found::Answer { header, .. }) => header.status.is_server_error(),
                    Ok(Found::Version(..) | Found::NotStored) => false,
                };
                match stale {
                    Some(stale)
                        if failed && stale.freshness.serves_on_error(&request.headers, now) =>
                    {
                        Ok(Found::Version(stale, Had::Stale))
                    }
                    _ => found,
                }
            }
            Turn::Wait(mut receiver) => {
                let _ = receiver.wait_for(|done| *done).await;
                // What it learned holds for this request too, however strict the route: it
                // was validated a moment ago.
                if let Some(version) = self.usable(object) {
                    return Ok(Found::Version(version, Had::Known));
                }
                let uncacheable =
                    self.uncacheable.lock().unwrap_or_else(|p| p.into_inner()).holds(object);
                Err(if uncacheable { Bypass::Uncacheable } else { Bypass::Origin })
            }
        }
    }

    /// Whether a request learns `object` or waits for another that does: one request learns an
    /// object at a time.
    fn turn(&self, object: &(String, String)) -> Turn {
        let mut learning = self.learning.lock().unwrap_or_else(|p| p.into_inner());
        match learning.get(object) {
            Some(receiver) => Turn::Wait(receiver.clone()),
            None => {
                let (done, receiver) = watch::channel(false);
                learning.insert(object.clone(), receiver);
                Turn::Learn(done)
            }
        }
    }

    /// Validates `stale` on a task of its own, which the request that served it stale does not
    /// wait for (`stale-while-revalidate`, RFC 5861 §3) — unless a request is learning its object
    /// already: one validation at a time.
    fn validate_behind(self: &Arc<Self>, ask: &Ask<'_>, stale: Arc<Version>) {
        let Turn::Learn(done) = self.turn(&ask.object) else { return };
        let inner = Arc::clone(self);
        let (route, request) = (Arc::clone(ask.route), ask.request.clone());
        let (fetch, replica, object) = (ask.fetch.clone(), ask.replica, ask.object.clone());
        let behind = async move {
            let ask = Ask { route: &route, request: &request, fetch: &fetch, replica, object };
            let asked =
                Asked { range: None, pinned: None, each_download: false, only_if_cached: false };
            // A body the answer brings fills slices on tasks of their own.
            let _ = inner.learn(&ask, &asked, Some(&stale)).await;
            inner.learning.lock().unwrap_or_else(|p| p.into_inner()).remove(&ask.object);
            let _ = done.send(true);
        };
        tokio::spawn(behind.in_current_span());
    }

    /// The object's current version, when it can answer: one whose slices cannot be fetched
    /// apart ([`Version::pin`]) only while each of them is kept or being filled — else it is
    /// dropped, to be learned again.
    fn usable(&self, object: &(String, String)) -> Option<Arc<Version>> {
        let version = self.store.current(object)?;
        if version.pin().is_some() {
            return Some(version);
        }
        let whole = (0..version.slices()).all(|index| {
            let id = version.slice_id(index);
            self.fills.filling(id) || self.store.has(id)
        });
        if whole {
            return Some(version);
        }
        self.store.remove_version(version.key);
        None
    }

    /// Asks the origin for the object with one request, the GET of the first run of slices the
    /// request needs ([`fill::first_run`]) — conditional on `stale`'s validators when a stored
    /// version is validated — and records the answer. A 304 validates `stale`
    /// ([`Self::validated`]). An answer the cache may keep becomes the version, and its body fills
    /// those slices ([`fill::fill_from`]): a 206, its length from `Content-Range`; a 200 from an
    /// origin that ignores ranges, or another status kept, whole. Any other is not kept
    /// ([`Self::not_kept`]).
    async fn learn(
        self: &Arc<Self>,
        ask: &Ask<'_>,
        asked: &Asked,
        stale: Option<&Version>,
    ) -> Result<Found, Bypass> {
        let Ask { route, request, fetch, replica, object } = ask;
        let mut get = RequestHeader::clone(&fetch.base);
        let head = request.method == Method::HEAD;
        let run = match stale {
            Some(stale) => {
                conditional_on(&mut get, stale).ok_or(Bypass::Request)?;
                fill::validation_run(self, stale, asked.range.as_ref(), head)
            }
            None => fill::first_run(asked.range.as_ref(), head, self.slice_size),
        };
        get.insert_header(header::RANGE, run.header_value()).map_err(|_| Bypass::Request)?;
        let asked_at = SystemTime::now();
        let exchange = fetch
            .origin
            .send(&route.upstream, *replica, get, "range")
            .await
            .map_err(|_| Bypass::Origin)?;
        let times = (asked_at, SystemTime::now());
        let answer = exchange.session.response_header().cloned().ok_or(Bypass::Origin)?;
        if let Some(stale) = stale
            && answer.status == StatusCode::NOT_MODIFIED
        {
            fetch.origin.release(exchange).await;
            let version = self.validated(stale, &answer, times)?;
            return Ok(Found::Version(version, Had::Validated));
        }
        let got = match answer.status.as_u16() {
            206 => partial(&answer).map(|got| (got, StatusCode::OK, false)),
            204 => Some(((NOTHING, 0), answer.status, true)),
            _ => crate::range::content_length(&answer.headers)
                .map(|len| ((ByteRange::whole(len), len), answer.status, true)),
        };
        if got.is_none() && answer.status != StatusCode::PARTIAL_CONTENT {
            return self.learn_streamed(ask, &answer, exchange, times);
        }
        let kept = got.and_then(|((got, len), status, ignores_ranges)| {
            let version = self.kept_version(ask, &answer, (status, len), times, ignores_ranges)?;
            // All of a version nothing pins comes in this answer, or it is not kept.
            (version.pin().is_some() || got == ByteRange::whole(len)).then_some((got, version))
        });
        let Some((got, version)) = kept else { return self.not_kept(ask, &answer, exchange) };
        let version = Arc::new(version);
        self.uncacheable.lock().unwrap_or_else(|p| p.into_inner()).remove(object);
        self.note_varies(&version);
        self.keep(Arc::clone(&version));
        if got.is_empty() {
            fetch.origin.release(exchange).await;
        } else {
            fill::fill_from(self, &version, exchange, got, fetch);
        }
        let had = if stale.is_some_and(|stale| stale.key == version.key) {
            Had::Validated
        } else {
            Had::Learned
        };
        Ok(Found::Version(version, had))
    }

    /// The answer to the request that would have learned the object, which has no length (its
    /// body chunked, or ended by the origin's close): kept as its body streams
    /// ([`StreamedFill`]) — to this client when the answer is its answer ([`handover`]) and it
    /// reads the whole body (a GET without `Range`), else read to its end by a task while this
    /// client's own request goes to the origin. An answer the cache may not keep is
    /// [`Self::not_kept`].
    fn learn_streamed(
        self: &Arc<Self>,
        ask: &Ask<'_>,
        answer: &ResponseHeader,
        exchange: Exchange,
        times: (SystemTime, SystemTime),
    ) -> Result<Found, Bypass> {
        let Some(version) = self.kept_version(ask, answer, (answer.status, 0), times, true) else {
            return self.not_kept(ask, answer, exchange);
        };
        let Some(fill) = StreamedFill::new(self, version, ask.object.clone()) else {
            return self.not_kept(ask, answer, exchange);
        };
        // Only a client that reads the whole body: one that asks a range stops at its end.
        let request = ask.request;
        let whole = request.method == Method::GET && !request.headers.contains_key(header::RANGE);
        let handed = handover(ask, answer).filter(|_| whole);
        let Some(mut header) = handed else {
            fill.drain(exchange);
            return Err(Bypass::Request);
        };
        let _ = header.insert_header("x-rangeway-cache", Outcome::Miss.name());
        let (header, exchange, fill) = (Box::new(header), Box::new(exchange), Some(Box::new(fill)));
        Ok(Found::Answer { header, exchange, outcome: Outcome::Miss, fill })
    }

    /// The answer to the request that would have learned the object, not kept. The object is
    /// remembered as one whose answers may not be cached, and a version stored before is dropped
    /// (not after a 5xx, or a 416 to a range the cache chose: asked again next time). The answer
    /// is the client's when nothing of the client's request could have changed it
    /// ([`handover`]); else the client's own request goes to the origin.
    fn not_kept(
        &self,
        ask: &Ask<'_>,
        answer: &ResponseHeader,
        exchange: Exchange,
    ) -> Result<Found, Bypass> {
        let status = answer.status.as_u16();
        let (failed, refused) = (status >= 500, status == 416);
        if !failed && !refused {
            self.store.remove_object(&ask.object);
            let mut uncacheable = self.uncacheable.lock().unwrap_or_else(|p| p.into_inner());
            uncacheable.insert(ask.object.clone());
        }
        let why = if failed || refused { Bypass::Origin } else { Bypass::Uncacheable };
        if let Some(header) = handover(ask, answer) {
            // A 5xx's replica is passed over by whoever reads the answer, as the origin's.
            let (header, exchange) = (Box::new(header), Box::new(exchange));
            let outcome = Outcome::Bypass(why);
            return Ok(Found::Answer { header, exchange, outcome, fill: None });
        }
        if failed {
            ask.route.upstream.failed(ask.replica);
        }
        Err(why)
    }

    /// `stale`, which a 304 (`answer`, asked and received at `times`) says is still the
    /// origin's: the same version and slices with the fields the origin says now (RFC 9111
    /// §4.3.4). A 304 that names another strong ETag validates nothing: the object is dropped.
    fn validated(
        &self,
        stale: &Version,
        answer: &ResponseHeader,
        (asked_at, answered_at): (SystemTime, SystemTime),
    ) -> Result<Arc<Version>, Bypass> {
        if let Some(etag) = crate::range::strong_etag(&answer.headers)
            && stale.id.starts_with('"')
            && etag != stale.id
        {
            self.store.remove_version(stale.key);
            return Err(Bypass::Origin);
        }
        let mut headers = stale.headers.clone();
        rfc9111::update_stored(&mut headers, &stored_fields(&answer.headers));
        let version = Arc::new(Version {
            key: stale.key,
            upstream: stale.upstream.clone(),
            target: stale.target.clone(),
            id: stale.id.clone(),
            status: stale.status,
            len: stale.len,
            slice_size: stale.slice_size,
            freshness: Freshness::of(&headers, asked_at, answered_at),
            validators: crate::range::validators(&headers),
            headers,
            ignores_ranges: stale.ignores_ranges,
        });
        self.keep(Arc::clone(&version));
        Ok(version)
    }

    /// The version `answer` — the origin's to the cache's request for `ask`'s object, asked and
    /// received at `times` — describes, answering with `status` and `len` bytes long, when a
    /// shared cache may keep it (RFC 9111 §3): whatever its validators, but without `Vary` (an
    /// answer that depends on request fields the cache does not key by) or `Set-Cookie` (one
    /// client's).
    fn kept_version(
        &self,
        ask: &Ask<'_>,
        answer: &ResponseHeader,
        (status, len): (StatusCode, u64),
        (asked_at, answered_at): (SystemTime, SystemTime),
        ignores_ranges: bool,
    ) -> Option<Version> {
        // What RFC 9111 §3.5 says of answers to authorized requests was decided by `Asked::of`
        // (the route's say, or an S3 route's signature, which is rangeway's own).
        let mut asked = ask.request.headers.clone();
        asked.remove(header::AUTHORIZATION);
        let fields = &answer.headers;
        // Kept apart by the fields it varies by, when each reaches the origin as the client sent
        // it (or as identity coding, which every client takes): `*`, or a `Cookie` the cache
        // does not send, could not be told apart.
        let varies = varies_by(fields).filter(|names| names.iter().all(|n| keyable(n)))?;
        let storable = rfc9111::storable(&Method::GET, &asked, answer.status, fields).is_ok()
            && !fields.contains_key(header::SET_COOKIE);
        if !storable {
            return None;
        }
        let (upstream, target) = &ask.object;
        let object = target.split('\t').next().unwrap_or_default();
        let target = if varies.is_empty() {
            object.to_owned()
        } else {
            variant(object, &varies, &ask.fetch.base.headers)
        };
        let id = match crate::range::strong_etag(fields).filter(|_| status == StatusCode::OK) {
            Some(etag) => etag.to_owned(),
            None => unpinned_id()?,
        };
        let headers = stored_fields(fields);
        Some(Version {
            key: VersionKey::of(upstream, &target, &id, self.slice_size),
            upstream: upstream.clone(),
            target,
            id,
            status,
            len,
            slice_size: self.slice_size,
            freshness: Freshness::of(&headers, asked_at, answered_at),
            validators: crate::range::validators(&headers),
            headers,
            ignores_ranges,
        })
    }

    /// Records which request fields the answers of `version`'s object vary by — its `Vary`, as
    /// its object's answer says now — for the requests that look it up after ([`variant`]).
    fn note_varies(&self, version: &Version) {
        let object = version.target.split('\t').next().unwrap_or_default();
        let base = (version.upstream.clone(), object.to_owned());
        let names = varies_by(&version.headers).unwrap_or_default();
        let mut varies = self.varies.lock().unwrap_or_else(|p| p.into_inner());
        if names.is_empty() {
            varies.remove(&base);
        } else {
            varies.insert(base, names);
        }
    }

    /// Records `version` as what its object is (written beside its slices); another version of
    /// it kept before is dropped. When it cannot be kept (no room, a failing disk) it still
    /// answers the request that learned it, and the next one learns it again.
    fn keep(&self, version: Arc<Version>) {
        let Ok(meta) = serde_json::to_vec(&version.to_meta()) else { return };
        if let Err(e) = self.store.keep(version, &meta) {
            self.write_failed(&e);
        }
    }

    /// The version turned out not to be the origin's any more (a fill's `If-Match` failed):
    /// forgotten, its slices dropped.
    fn changed(&self, version: &Version) {
        self.store.remove_version(version.key);
    }

    /// A write to the cache failed: logged once, counted each time.
    fn write_failed(&self, error: &std::io::Error) {
        self.metrics.cache_write_error();
        if !self.write_failed.swap(true, Ordering::Relaxed) {
            warn!(error = %error, "a write to the cache failed: that slice comes from the origin (logged once)");
        }
    }

    /// The origin's answer to the planned request, as it would be for `version`: the
    /// preconditions (412, 304), then `If-Range` and the range (206, 416, 200).
    fn respond(
        &self,
        version: &Version,
        request: &RequestHeader,
        asked: &Asked,
        now: SystemTime,
    ) -> Result<ResponseHeader, Bypass> {
        let build = |status: StatusCode| -> Result<ResponseHeader, Bypass> {
            let mut response = ResponseHeader::build(status, Some(version.headers.len() + 4))
                .map_err(|_| Bypass::Request)?;
            for (name, value) in &version.headers {
                response.append_header(name.clone(), value.clone()).map_err(|_| Bypass::Request)?;
            }
            response
                .insert_header(header::AGE, version.freshness.age_header(now))
                .map_err(|_| Bypass::Request)?;
            Ok(response)
        };
        if version.status != StatusCode::OK {
            // Preconditions and ranges are of a 200's representation (RFC 9110 §13.2.1, §14.2).
            let mut response = build(version.status)?;
            if version.status != StatusCode::NO_CONTENT {
                let _ = response.insert_header(header::CONTENT_LENGTH, version.len);
            }
            return Ok(response);
        }
        match evaluate_preconditions(&request.method, &request.headers, &version.validators) {
            Precondition::Failed => {
                let mut response = build(StatusCode::PRECONDITION_FAILED)?;
                let _ = response.insert_header(header::CONTENT_LENGTH, 0);
                return Ok(response);
            }
            Precondition::NotModified => return build(StatusCode::NOT_MODIFIED),
            Precondition::Proceed => {}
        }
        let len = version.len;
        let ranged = asked
            .range
            .as_ref()
            .filter(|_| if_range_holds(&request.headers, &version.validators, now));
        let range = match ranged {
            None => None,
            Some(RangeRequest::Bytes(set)) => match set.resolve(len) {
                Resolution::Single(range) => Some(range),
                Resolution::Multiple(_) => return Err(Bypass::Request),
                Resolution::Unsatisfiable => {
                    let mut response = build(StatusCode::RANGE_NOT_SATISFIABLE)?;
                    let _ = response.insert_header(header::CONTENT_RANGE, format!("bytes */{len}"));
                    let _ = response.insert_header(header::CONTENT_LENGTH, 0);
                    return Ok(response);
                }
            },
            Some(_) => None,
        };
        match range {
            Some(range) => {
                let mut response = build(StatusCode::PARTIAL_CONTENT)?;
                let last = range.last().unwrap_or(0);
                let _ = response.insert_header(
                    header::CONTENT_RANGE,
                    format!("bytes {}-{last}/{len}", range.start()),
                );
                let _ = response.insert_header(header::CONTENT_LENGTH, range.len());
                Ok(response)
            }
            None => {
                let mut response = build(StatusCode::OK)?;
                let _ = response.insert_header(header::CONTENT_LENGTH, len);
                Ok(response)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(n: usize) -> (String, String) {
        ("up".to_owned(), format!("/o{n}"))
    }

    #[test]
    fn objects_remembered_as_uncacheable_are_bounded() {
        let mut uncacheable = Uncacheable::new(100);
        for n in 0..1000 {
            uncacheable.insert(object(n));
            assert!(uncacheable.since.len() <= 100 && uncacheable.order.len() <= 200, "at {n}");
        }
        // The latest are held; the oldest were forgotten (they cost the cache's request again).
        assert!(uncacheable.holds(&object(999)) && uncacheable.holds(&object(900)));
        assert!(!uncacheable.holds(&object(0)) && !uncacheable.holds(&object(899)));
        // One object learned again and again (it turned cacheable and back) stays bounded.
        for _ in 0..1000 {
            uncacheable.insert(object(5000));
        }
        assert!(uncacheable.since.len() <= 100 && uncacheable.order.len() <= 200);
        assert!(uncacheable.holds(&object(5000)));
        uncacheable.remove(&object(5000));
        assert!(!uncacheable.holds(&object(5000)));
    }
}
