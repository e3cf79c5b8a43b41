//! The slice cache: an object's bytes kept on local disk in aligned slices, each fetched from its
//! origin once however many clients ask, and served from disk after.
//!
//! It sits under the relay's request to the origin (see `proxy/LIFECYCLE.md`): where the relay
//! would send its planned upstream request, it asks the cache, which answers it as the origin
//! would — the same status, validators and range — from what it holds, fetching what it lacks.
//! Everything above (the client's ranges, `If-Range`, resume safety, the stages) works on that
//! answer as on the origin's, so the cache changes where bytes come from and nothing else.
//!
//! - **What is known of an object** ([`Version`]): its strong ETag, length and the header fields
//!   of the origin's answer, learned from the one request a miss makes — the GET of the first
//!   slices it needs, whose body fills them — validated with a conditional `HEAD` once stale (or
//!   at every new download when a route asks), kept beside its slices and in memory. Only what a
//!   shared cache may keep is cached (RFC 9111 §3, plus a strong ETag, a length, no `Vary` and
//!   no `Set-Cookie`); anything else goes to the origin as without a cache — the answer to that
//!   first GET handed to the client as the origin's when it is the client's too.
//! - **Slices** ([`store`]): slice `k` of a version holds its bytes `k·S ..`; a version's slices
//!   are keyed by its ETag, so slices of two versions never meet in one answer.
//! - **Fills** ([`fill`]): a missing slice is fetched with the run of missing slices after it
//!   (up to the request's end) in one ranged origin request, `If-Match` on the version. A slice
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
mod store;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use pingora_http::{RequestHeader, ResponseHeader};
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::{
    HOP_BY_HOP, Precondition, RangeLimits, RangeRequest, Resolution, Validators,
    connection_options, evaluate_preconditions, if_range_holds, parse_range_header,
};
use rangeway_middleware::rfc9111::{self, Freshness};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{CacheConfig, Revalidate, RouteCache};
use crate::routes::Route;
use crate::routes::origin_client::{Exchange, OriginClient};
use crate::telemetry::metrics::Metrics;
use fill::Fills;
pub(crate) use fill::{CacheBody, OutputWriter, Segment};
#[cfg(test)]
pub(crate) use store::tests::Folder;
use store::{SliceId, SliceStore, VersionKey};

/// How long an object whose answers may not be cached is sent straight to its origin before
/// it is asked again: asking with the cache's own request each time would cost the object's
/// clients what the cache saves.
const UNCACHEABLE_FOR: Duration = Duration::from_secs(60);

/// No bytes.
const NOTHING: ByteRange = ByteRange::whole(0);

/// The format number of a version's stored facts.
const META_FORMAT: u32 = 1;

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
    /// Not for the cache (why, below): asked of the origin as without one.
    Bypass(Bypass),
}

/// Why a request was not served from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bypass {
    /// The request: another method, several ranges, `no-store`, `Authorization` on a route that
    /// keeps such answers apart.
    Request,
    /// The origin's answers may not be cached (status, `no-store`, `private`, no strong ETag or
    /// length, `Vary`, `Set-Cookie`).
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
    /// The origin's own answer to the cache's request, which the cache does not keep: the
    /// client's answer, as if the client's request had gone to the origin (see
    /// `handover`). `why`: for the access line.
    Origin { header: Box<ResponseHeader>, exchange: Box<Exchange>, why: Bypass },
    /// Ask the origin, as without a cache.
    Bypass(Bypass),
}

/// One version of an object, as the cache knows it.
#[derive(Debug)]
pub(crate) struct Version {
    key: VersionKey,
    upstream: String,
    /// The upstream target (path and query) of the object; for a transformed representation of
    /// it, followed by a space and the chain's identity (a target holds no space).
    target: String,
    /// Strong, quotes included.
    etag: String,
    len: u64,
    slice_size: u64,
    /// The origin's answer's end-to-end fields, without its length and range.
    headers: HeaderMap,
    freshness: Freshness,
    validators: Validators,
    /// Its origin answered a ranged request with the whole object: its fills ask for the whole
    /// object and pass over what comes before their slices.
    ignores_ranges: bool,
}

impl Version {
    fn slices(&self) -> u64 {
        self.len.div_ceil(self.slice_size)
    }

    /// The bytes of the object slice `index` holds.
    fn slice_range(&self, index: u64) -> ByteRange {
        let start = index * self.slice_size;
        ByteRange::new(start, (start + self.slice_size).min(self.len)).unwrap_or(NOTHING)
    }

    fn slice_id(&self, index: u64) -> SliceId {
        SliceId { version: self.key, index }
    }

    fn to_meta(&self) -> Meta {
        Meta {
            v: META_FORMAT,
            upstream: self.upstream.clone(),
            target: self.target.clone(),
            etag: self.etag.clone(),
            len: self.len,
            slice_size: self.slice_size,
            headers: self
                .headers
                .iter()
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect(),
            request_time: millis(self.freshness.request_time),
            response_time: millis(self.freshness.response_time),
            ignores_ranges: self.ignores_ranges,
        }
    }

    fn from_meta(meta: Meta, slice_size: u64) -> Option<Self> {
        if meta.v != META_FORMAT || meta.slice_size != slice_size {
            return None;
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &meta.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            );
        }
        let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let freshness = Freshness::of(&headers, at(meta.request_time), at(meta.response_time));
        Some(Self {
            key: VersionKey::of(&meta.upstream, &meta.target, &meta.etag, slice_size),
            validators: crate::range::validators(&headers),
            upstream: meta.upstream,
            target: meta.target,
            etag: meta.etag,
            len: meta.len,
            slice_size,
            headers,
            freshness,
            ignores_ranges: meta.ignores_ranges,
        })
    }
}

/// What is written beside a version's slices.
#[derive(Serialize, Deserialize)]
struct Meta {
    v: u32,
    upstream: String,
    target: String,
    etag: String,
    len: u64,
    slice_size: u64,
    headers: Vec<(String, String)>,
    /// Milliseconds since the Unix epoch.
    request_time: u64,
    response_time: u64,
    /// Absent from what was written before origins that ignore ranges were kept: `false`.
    #[serde(default)]
    ignores_ranges: bool,
}

/// What the cache has for a request: a version to answer from, and how it was had; or the
/// origin's answer to the request that would have learned one.
enum Found {
    Version(Arc<Version>, Had),
    Answer { header: Box<ResponseHeader>, exchange: Box<Exchange>, why: Bypass },
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
        Some(Self {
            inner: Arc::new(Inner {
                store,
                slice_size: config.slice_size,
                uncacheable: Mutex::new(Uncacheable::new(uncacheable)),
                learning: Mutex::new(HashMap::new()),
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
        let target = request.uri.path_and_query().map_or("/", |p| p.as_str());
        let object = (route.upstream.name().to_owned(), target.to_owned());
        let Some(base) = origin_request(route, request, replica, authorized) else {
            return CacheAnswer::Bypass(Bypass::Request);
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
            Ok(Found::Answer { header, exchange, why }) => {
                return CacheAnswer::Origin { header, exchange, why };
            }
            Err(bypass) => return CacheAnswer::Bypass(bypass),
        };
        let now = SystemTime::now();
        let mut header = match inner.respond(&version, request, &asked, now) {
            Ok(header) => header,
            Err(bypass) => return CacheAnswer::Bypass(bypass),
        };
        let range = match header.status.as_u16() {
            200 => ByteRange::whole(version.len),
            206 => crate::range::body_range(206, &header.headers).unwrap_or(NOTHING),
            _ => NOTHING,
        };
        let outcome = match had {
            Had::Known => Outcome::Hit,
            Had::Validated => Outcome::Revalidated,
            Had::Learned => Outcome::Miss,
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
            && version.etag == etag
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
            etag: etag.to_owned(),
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
                target: v.target.split(' ').next().unwrap_or_default().to_owned(),
                representation: v.target.split_once(' ').map(|(_, chain)| chain.to_owned()),
                etag: v.etag.clone(),
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
        let target = target.split(' ').next().unwrap_or_default();
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
        if rfc9111::CacheControl::of(headers).no_store {
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
        Some(Self { range, pinned, each_download: policy.revalidate == Revalidate::EachDownload })
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
        let stale = match self.store.current(object) {
            Some(version) => {
                let pinned = asked.pinned.as_deref() == Some(version.etag.as_str());
                let fresh = version.freshness.serves_unvalidated(&request.headers, now)
                    && !asked.each_download;
                if pinned || fresh {
                    return Ok(Found::Version(version, Had::Known));
                }
                Some(version)
            }
            None => None,
        };
        // One request learns an object at a time; the others wait for it.
        let turn = {
            let mut learning = self.learning.lock().unwrap_or_else(|p| p.into_inner());
            match learning.get(object) {
                Some(receiver) => Turn::Wait(receiver.clone()),
                None => {
                    let (done, receiver) = watch::channel(false);
                    learning.insert(object.clone(), receiver);
                    Turn::Learn(done)
                }
            }
        };
        match turn {
            Turn::Learn(done) => {
                let found = match stale {
                    Some(stale) => {
                        let validated = self.validate(ask, &stale).await;
                        validated.map(|version| Found::Version(version, Had::Validated))
                    }
                    None => self.learn(ask, asked).await,
                };
                self.learning.lock().unwrap_or_else(|p| p.into_inner()).remove(object);
                let _ = done.send(true);
                found
            }
            Turn::Wait(mut receiver) => {
                let _ = receiver.wait_for(|done| *done).await;
                // What it learned holds for this request too, however strict the route: it
                // was validated a moment ago.
                if let Some(version) = self.store.current(object) {
                    return Ok(Found::Version(version, Had::Known));
                }
                let uncacheable =
                    self.uncacheable.lock().unwrap_or_else(|p| p.into_inner()).holds(object);
                Err(if uncacheable { Bypass::Uncacheable } else { Bypass::Origin })
            }
        }
    }

    /// Learns the object with one request: the GET of the first run of slices the request needs
    /// ([`fill::first_run`]). An answer the cache may keep becomes the version, and its body fills
    /// those slices ([`fill::fill_from`]): a 206, its length from `Content-Range`; a 200, the
    /// whole object from an origin that ignores ranges. Any other is not kept ([`Self::not_kept`]).
    async fn learn(self: &Arc<Self>, ask: &Ask<'_>, asked: &Asked) -> Result<Found, Bypass> {
        let Ask { route, request, fetch, replica, object } = ask;
        let mut get = RequestHeader::clone(&fetch.base);
        let head = request.method == Method::HEAD;
        let run = fill::first_run(asked.range.as_ref(), head, self.slice_size);
        get.insert_header(header::RANGE, run.header_value()).map_err(|_| Bypass::Request)?;
        let asked_at = SystemTime::now();
        let exchange = fetch
            .origin
            .send(&route.upstream, *replica, get, "range")
            .await
            .map_err(|_| Bypass::Origin)?;
        let times = (asked_at, SystemTime::now());
        let answer = exchange.session.response_header().cloned().ok_or(Bypass::Origin)?;
        let got = match answer.status.as_u16() {
            206 => partial(&answer),
            200 => crate::range::content_length(&answer.headers)
                .map(|len| (ByteRange::whole(len), len)),
            _ => None,
        };
        let ignores_ranges = answer.status == StatusCode::OK;
        let kept = got.and_then(|(got, len)| {
            Some((got, self.kept_version(ask, &answer, Some(len), times, ignores_ranges)?))
        });
        let Some((got, version)) = kept else { return self.not_kept(ask, &answer, exchange) };
        let version = Arc::new(version);
        self.uncacheable.lock().unwrap_or_else(|p| p.into_inner()).remove(object);
        self.keep(Arc::clone(&version));
        fill::fill_from(self, &version, exchange, got, fetch);
        Ok(Found::Version(version, Had::Learned))
    }

    /// The answer to the request that would have learned the object, not kept. The object is
    /// remembered as one whose answers may not be cached (not after a 5xx, or a 416 to a range
    /// the cache chose: asked again next time). The answer is the client's when nothing of the
    /// client's request could have changed it ([`handover`]); else the client's own request goes
    /// to the origin.
    fn not_kept(
        &self,
        ask: &Ask<'_>,
        answer: &ResponseHeader,
        exchange: Exchange,
    ) -> Result<Found, Bypass> {
        let status = answer.status.as_u16();
        let (failed, refused) = (status >= 500, status == 416);
        if !failed && !refused {
            let mut uncacheable = self.uncacheable.lock().unwrap_or_else(|p| p.into_inner());
            uncacheable.insert(ask.object.clone());
        }
        let why = if failed || refused { Bypass::Origin } else { Bypass::Uncacheable };
        if let Some(header) = handover(ask, answer) {
            // A 5xx's replica is passed over by whoever reads the answer, as the origin's.
            let (header, exchange) = (Box::new(header), Box::new(exchange));
            return Ok(Found::Answer { header, exchange, why });
        }
        if failed {
            ask.route.upstream.failed(ask.replica);
        }
        Err(why)
    }

    /// Validates `stale` with a conditional HEAD (`If-None-Match` on its ETag) and records the
    /// answer: the same version with the fields the origin says now, another version, or an
    /// object whose answers may not be cached.
    async fn validate(
        self: &Arc<Self>,
        ask: &Ask<'_>,
        stale: &Version,
    ) -> Result<Arc<Version>, Bypass> {
        let Ask { route, fetch, replica, object, .. } = ask;
        let replica = *replica;
        let mut head = RequestHeader::clone(&fetch.base);
        head.set_method(Method::HEAD);
        let _ = head.insert_header(header::IF_NONE_MATCH, stale.etag.as_str());
        let asked_at = SystemTime::now();
        let exchange = fetch
            .origin
            .send(&route.upstream, replica, head, "head")
            .await
            .map_err(|_| Bypass::Origin)?;
        let answered_at = SystemTime::now();
        let answer = exchange.session.response_header().cloned();
        fetch.origin.release(exchange).await;
        let answer = answer.ok_or(Bypass::Origin)?;
        let status = answer.status.as_u16();
        if status >= 500 {
            route.upstream.failed(replica);
            return Err(Bypass::Origin);
        }
        let same =
            answer.headers.get(header::ETAG).is_some_and(|v| v.as_bytes() == stale.etag.as_bytes());
        if status == 304 || (status == 200 && same) {
            // Still the same version: its fields as the origin says them now (RFC 9111 §4.3.4).
            let mut headers = stale.headers.clone();
            rfc9111::update_stored(&mut headers, &stored_fields(&answer.headers));
            let version = Arc::new(Version {
                key: stale.key,
                upstream: stale.upstream.clone(),
                target: stale.target.clone(),
                etag: stale.etag.clone(),
                len: stale.len,
                slice_size: stale.slice_size,
                freshness: Freshness::of(&headers, asked_at, answered_at),
                validators: crate::range::validators(&headers),
                headers,
                ignores_ranges: stale.ignores_ranges,
            });
            self.keep(Arc::clone(&version));
            return Ok(version);
        }
        // Another version, known from the HEAD alone: whether its origin serves ranges is what
        // it says (RFC 9110 §14.3); S3's GetObject serves them whether a store says so or not.
        let ranges = route.upstream.is_s3()
            || answer.headers.get_all(header::ACCEPT_RANGES).iter().any(|value| {
                value.to_str().is_ok_and(|units| {
                    units.split(',').any(|unit| unit.trim().eq_ignore_ascii_case("bytes"))
                })
            });
        let len = crate::range::content_length(&answer.headers);
        let times = (asked_at, answered_at);
        let kept = (status == 200).then(|| self.kept_version(ask, &answer, len, times, !ranges));
        let Some(version) = kept.flatten() else {
            self.store.remove_object(object);
            self.uncacheable.lock().unwrap_or_else(|p| p.into_inner()).insert(object.clone());
            return Err(if status == 200 { Bypass::Uncacheable } else { Bypass::Origin });
        };
        let version = Arc::new(version);
        self.keep(Arc::clone(&version));
        Ok(version)
    }

    /// The version `answer` — the origin's to the cache's request for `ask`'s object, asked and
    /// received at `times` — describes, `len` bytes long, when a shared cache may keep it (RFC
    /// 9111 §3) and the slice cache can: a strong ETag and a length, no `Vary` (an answer that
    /// depends on request fields the cache does not key by), no `Set-Cookie` (one client's).
    fn kept_version(
        &self,
        ask: &Ask<'_>,
        answer: &ResponseHeader,
        len: Option<u64>,
        (asked_at, answered_at): (SystemTime, SystemTime),
        ignores_ranges: bool,
    ) -> Option<Version> {
        // What RFC 9111 §3.5 says of answers to authorized requests was decided by `Asked::of`
        // (the route's say, or an S3 route's signature, which is rangeway's own).
        let mut asked = ask.request.headers.clone();
        asked.remove(header::AUTHORIZATION);
        let fields = &answer.headers;
        let storable = rfc9111::storable(&Method::GET, &asked, answer.status, fields).is_ok()
            && !fields.contains_key(header::SET_COOKIE)
            && !fields.contains_key(header::VARY);
        let etag = crate::range::strong_etag(fields).filter(|_| storable)?;
        let (upstream, target) = &ask.object;
        let headers = stored_fields(fields);
        Some(Version {
            key: VersionKey::of(upstream, target, etag, self.slice_size),
            upstream: upstream.clone(),
            target: target.clone(),
            etag: etag.to_owned(),
            len: len?,
            slice_size: self.slice_size,
            freshness: Freshness::of(&headers, asked_at, answered_at),
            validators: crate::range::validators(&headers),
            headers,
            ignores_ranges,
        })
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

/// The request the cache asks the origin with for the object `request` targets, made for
/// `replica`: the target and the upstream's `Host` — what its answer is kept by — and nothing of
/// the client's. An origin that answered by a client's field (`X-Forwarded-Host`, `Cookie`,
/// `User-Agent`...) would have that client's answer stored and served to every other one. One
/// exception: the client's `Authorization` (`authorized`) on a route that says such answers may
/// be shared (`cache = { authorized = true }`): the origin needs it to answer at all, and the
/// route vouches that its answer is the same for every client. An S3 upstream's signature is
/// rangeway's own, made again for each request.
fn origin_request(
    route: &Route,
    request: &RequestHeader,
    replica: usize,
    authorized: bool,
) -> Option<RequestHeader> {
    let target = request.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut base = route.upstream.request("GET", target, replica).ok()?;
    // One representation is kept for every client: the object's own bytes, not an encoding of
    // them some client accepts (RFC 9110 §12.5.3: without the field, any coding would do).
    base.insert_header(header::ACCEPT_ENCODING, "identity").ok()?;
    if authorized && let Some(credentials) = request.headers.get(header::AUTHORIZATION) {
        base.insert_header(header::AUTHORIZATION, credentials.clone()).ok()?;
    }
    Some(base)
}

/// The bytes a 206 carries and the object's length, as its `Content-Range` states them.
fn partial(response: &ResponseHeader) -> Option<(ByteRange, u64)> {
    let (range, len) = crate::range::stated_range(&response.headers)?;
    Some((range, len?))
}

/// The origin's answer to the cache's request for `ask`'s object, as the client's answer, which
/// the pipeline shapes for the client as any origin's (the client's range cut from it, its
/// preconditions evaluated). Only when nothing of the client's request could have changed it:
/// the client sent no `Cookie` (the cache's request never carries one), and each field the
/// answer's `Vary` names is the same in both requests ([`same_variant`]). And only when it
/// holds what the client's answer needs: any status but 304, 412 and 416 (answers to conditions
/// or a range the client did not send); on a route whose stages do not change bytes, a 200, a 206
/// of the whole object (as the 200 it is; for a HEAD any 206, whose header is what the HEAD
/// wants), or a 206 holding the one range asked for, without `If-Range`.
fn handover(ask: &Ask<'_>, answer: &ResponseHeader) -> Option<ResponseHeader> {
    let request = ask.request;
    if request.headers.contains_key(header::COOKIE)
        || !same_variant(&answer.headers, &ask.fetch.base.headers, &request.headers)
    {
        return None;
    }
    match answer.status.as_u16() {
        304 | 412 | 416 => return None,
        200 | 206 if !ask.route.chain.is_observing_only() => return None,
        206 => {}
        _ => return Some(answer.clone()),
    }
    let (got, len) = partial(answer)?;
    if got == ByteRange::whole(len) || request.method == Method::HEAD {
        let mut whole = answer.clone();
        whole.set_status(StatusCode::OK).ok()?;
        whole.remove_header(&header::CONTENT_RANGE);
        whole.insert_header(header::CONTENT_LENGTH, len).ok()?;
        return Some(whole);
    }
    let holds = match parse_range_header(&request.headers, &RangeLimits::with_max_ranges(1)) {
        Some(RangeRequest::Bytes(set)) => {
            matches!(set.resolve(len), Resolution::Single(range) if got.contains_range(&range))
        }
        _ => false,
    };
    (holds && !request.headers.contains_key(header::IF_RANGE)).then(|| answer.clone())
}

/// Whether an answer with the fields `answer` to a request with the fields `asked` is one to a
/// request with the fields `other` too, by its `Vary` (RFC 9111 §4.1): each field it names has
/// the same values in both (absent from both included); `*` never matches.
fn same_variant(answer: &HeaderMap, asked: &HeaderMap, other: &HeaderMap) -> bool {
    answer.get_all(header::VARY).iter().all(|line| {
        line.to_str().is_ok_and(|names| {
            names.split(',').map(str::trim).filter(|name| !name.is_empty()).all(|name| {
                name != "*" && asked.get_all(name).iter().eq(other.get_all(name).iter())
            })
        })
    })
}

/// The fields of an origin's answer the cache keeps: its end-to-end ones — not those of its
/// connection, the fields its `Connection` names included (RFC 9110 §7.6.1) — without those that
/// describe one message (length, range, framing) or that the cache recomputes (`Age`).
fn stored_fields(headers: &HeaderMap) -> HeaderMap {
    const OF_ONE_MESSAGE: [HeaderName; 7] = [
        header::CONTENT_LENGTH,
        header::CONTENT_RANGE,
        header::TRANSFER_ENCODING,
        header::AGE,
        header::SET_COOKIE,
        header::PROXY_AUTHENTICATE,
        header::VIA,
    ];
    let named: Vec<HeaderName> = connection_options(headers).collect();
    let kept = headers.iter().filter(|(name, _)| {
        !HOP_BY_HOP.contains(name) && !named.contains(name) && !OF_ONE_MESSAGE.contains(name)
    });
    kept.map(|(name, value)| (name.clone(), value.clone())).collect()
}

fn millis(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(n: usize) -> (String, String) {
        ("up".to_owned(), format!("/o{n}"))
    }

    #[test]
    fn an_answer_is_another_requests_when_the_fields_it_varies_by_are_the_same() {
        let fields = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, HeaderValue::from_static(value));
            }
            map
        };
        let (cache, client) = (fields(&[("host", "o")]), fields(&[("host", "o"), ("foo", "1")]));
        assert!(same_variant(&fields(&[]), &cache, &client));
        assert!(same_variant(&fields(&[("vary", "Host, Bar")]), &cache, &client));
        assert!(!same_variant(&fields(&[("vary", "Bar, Foo")]), &cache, &client));
        assert!(!same_variant(&fields(&[("vary", "Host"), ("vary", "foo")]), &cache, &client));
        assert!(!same_variant(&fields(&[("vary", "*")]), &cache, &cache));
        assert!(same_variant(&fields(&[("vary", "Foo")]), &client, &client));
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
