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
use tracing::{Instrument as _, info, warn};

use crate::config::{CacheConfig, Revalidate, RouteCache};
use crate::routes::Route;
use crate::routes::origin_client::{Exchange, OriginClient, Pin};
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
    /// Its name among the object's versions, by which its slices are kept: its strong ETag,
    /// quotes included — what a download pinned to it names — or, without one, a name the cache
    /// gives it (`~` and 32 hex digits), so that its slices meet no other version's whatever
    /// else the origin says of it.
    id: String,
    /// The status it answers with: 200 for an object's bytes, or another kept whole (a 404, a
    /// 301 with explicit freshness...), whose body its slices hold.
    status: StatusCode,
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
    /// What a fetch of a range of it is pinned by, when its slices can be fetched apart: its
    /// strong ETag, else its `Last-Modified` when that is a strong validator (RFC 9110 §8.8.2.2:
    /// a minute or more before its `Date`). `None` for a version nothing pins, or that is no
    /// object's bytes (another status): all of it came with the answer that learned it, and a
    /// slice of it missing means learning it again.
    fn pin(&self) -> Option<Pin<'_>> {
        if self.status != StatusCode::OK {
            return None;
        }
        if self.id.starts_with('"') {
            return Some(Pin::ETag(&self.id));
        }
        let (modified, date) = (self.validators.last_modified?, self.freshness.date?);
        let strong = date.duration_since(modified).is_ok_and(|d| d >= Duration::from_secs(60));
        let written = self.headers.get(header::LAST_MODIFIED)?.to_str().ok()?;
        strong.then_some(Pin::LastModified(written))
    }

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
            id: self.id.clone(),
            status: self.status.as_u16(),
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
            key: VersionKey::of(&meta.upstream, &meta.target, &meta.id, slice_size),
            validators: crate::range::validators(&headers),
            status: StatusCode::from_u16(meta.status).ok()?,
            upstream: meta.upstream,
            target: meta.target,
            id: meta.id,
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
    /// The version's id ([`Version::id`]), under the name it had when only strong ETags were.
    #[serde(rename = "etag")]
    id: String,
    /// Absent from what was written before other statuses were kept: 200.
    #[serde(default = "ok")]
    status: u16,
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

const fn ok() -> u16 {
    200
}

/// What the cache has for a request: a version to answer from, and how it was had; or the
/// origin's answer to the request that would have learned one.
enum Found {
    Version(Arc<Version>, Had),
    Answer {
        header: Box<ResponseHeader>,
        exchange: Box<Exchange>,
        why: Bypass,
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
            Ok(Found::Answer { header, exchange, why }) => {
                return CacheAnswer::Origin { header, exchange, why };
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
        let kept = got.and_then(|((got, len), status, ignores_ranges)| {
            let version = self.kept_version(ask, &answer, (status, len), times, ignores_ranges)?;
            // All of a version nothing pins comes in this answer, or it is not kept.
            (version.pin().is_some() || got == ByteRange::whole(len)).then_some((got, version))
        });
        let Some((got, version)) = kept else { return self.not_kept(ask, &answer, exchange) };
        let version = Arc::new(version);
        self.uncacheable.lock().unwrap_or_else(|p| p.into_inner()).remove(object);
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
            return Ok(Found::Answer { header, exchange, why });
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
        let names: Vec<String> = varies.iter().map(|name| name.to_ascii_lowercase()).collect();
        let target = if names.is_empty() {
            object.to_owned()
        } else {
            variant(object, &names, &ask.fetch.base.headers)
        };
        let mut varying = self.varies.lock().unwrap_or_else(|p| p.into_inner());
        let base = (upstream.clone(), object.to_owned());
        match names.is_empty() {
            true => varying.remove(&base),
            false => varying.insert(base, names),
        };
        drop(varying);
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

/// The request the cache asks the origin with for the object `request` — the request the relay
/// planned for a client — targets, made for `replica`: the client's end-to-end fields, so that
/// the origin answers as it would have answered the client and an answer that depends on them
/// says so (`Vary`, which the cache honours: RFC 9111 §4.1); less what the cache asks itself
/// (the range, the conditions, one coding for every client), and less what would let one
/// client's request choose what others are served by fields an origin reads without naming
/// them in `Vary`: every field that names a host or a scheme (an origin that builds links from
/// `X-Forwarded-Host`, say, would have a hostile client's stored) and `Cookie` (one user's; an
/// answer to a request with one is never handed to another, [`handover`]). The upstream's
/// `Host` is its own. One exception: the client's `Authorization` (`authorized`) on a route
/// that says such answers may be shared (`cache = { authorized = true }`): the origin needs it
/// to answer at all, and the route vouches that its answer is the same for every client. An S3
/// upstream's signature is rangeway's own, made again for each request.
fn origin_request(
    route: &Route,
    request: &RequestHeader,
    replica: usize,
    authorized: bool,
) -> Option<RequestHeader> {
    let target = request.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut base = route.upstream.request("GET", target, replica).ok()?;
    let own = request.headers.iter().filter(|(name, _)| !not_forwarded(name.as_str()));
    for (name, value) in own {
        base.append_header(name.clone(), value.clone()).ok()?;
    }
    // One representation is kept for every client: the object's own bytes, not an encoding of
    // them some client accepts (RFC 9110 §12.5.3: without the field, any coding would do).
    base.insert_header(header::ACCEPT_ENCODING, "identity").ok()?;
    if authorized && let Some(credentials) = request.headers.get(header::AUTHORIZATION) {
        base.insert_header(header::AUTHORIZATION, credentials.clone()).ok()?;
    }
    Some(base)
}

/// Makes `request` a validation of `stale` (RFC 9111 §4.3.1): `If-None-Match` with its ETag,
/// strong or weak, and `If-Modified-Since` with its `Last-Modified`, whichever it has.
fn conditional_on(request: &mut RequestHeader, stale: &Version) -> Option<()> {
    for (validator, condition) in
        [(header::ETAG, header::IF_NONE_MATCH), (header::LAST_MODIFIED, header::IF_MODIFIED_SINCE)]
    {
        if let Some(value) = stale.headers.get(&validator) {
            request.insert_header(condition, value.clone()).ok()?;
        }
    }
    Some(())
}

/// A name for a version without a strong ETag ([`Version::id`]): new each time, so that the
/// slices of one answer are never taken for another's.
fn unpinned_id() -> Option<String> {
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).ok()?;
    Some(format!("~{}", crate::fingerprint::hex(&random, random.len())))
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
/// answer's `Vary` names is the same in both requests ([`same_fields`]; `Vary: *` too, the
/// cache's request having been made for this client's). And only when it
/// holds what the client's answer needs: any status but 304, 412 and 416 (answers to conditions
/// or a range the client did not send); on a route whose stages do not change bytes, a 200, a 206
/// of the whole object (as the 200 it is; for a HEAD any 206, whose header is what the HEAD
/// wants), or a 206 holding the one range asked for, without `If-Range`.
fn handover(ask: &Ask<'_>, answer: &ResponseHeader) -> Option<ResponseHeader> {
    let request = ask.request;
    let same = varies_by(&answer.headers)
        .is_none_or(|names| same_fields(&names, &ask.fetch.base.headers, &request.headers));
    if request.headers.contains_key(header::COOKIE) || !same {
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

/// The request fields an answer with the fields `answer` varies by (its `Vary`, RFC 9111
/// §4.1), as written; `None` for `*` (or a line that is no text): by more than fields say.
fn varies_by(answer: &HeaderMap) -> Option<Vec<&str>> {
    let mut names = Vec::new();
    for line in answer.get_all(header::VARY) {
        for name in line.to_str().ok()?.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return None;
            }
            names.push(name);
        }
    }
    Some(names)
}

/// Whether the request field `name` reaches the origin, in the cache's request, as the client
/// sent it — or, for `Accept-Encoding`, as identity coding, which every client takes — so that
/// answers varying by it can be kept apart by its value ([`origin_request`]).
fn keyable(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "accept-encoding" || !not_forwarded(&name)
}

/// Whether the cache's request leaves out, or sets itself, the client's field `name` (lower
/// case): the range and the conditions, `Cookie`, `Authorization`, and every field that names a
/// host or a scheme ([`origin_request`]).
fn not_forwarded(name: &str) -> bool {
    const NOT_ASKED: [&str; 12] = [
        "host",
        "range",
        "if-range",
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
        "cookie",
        "authorization",
        "forwarded",
        "accept-encoding",
        "via",
    ];
    NOT_ASKED.contains(&name) || name.starts_with("x-forwarded-") || name.ends_with("-host")
}

/// The key of the variant of the object at `target` that a request with the fields `asked`
/// selects, by the fields `names` (lower case) its answers vary by: the target, a tab (which a
/// target never holds) and a digest of each name's values.
fn variant(target: &str, names: &[String], asked: &HeaderMap) -> String {
    let values = names.iter().flat_map(|name| {
        let lines = asked.get_all(name.as_str()).iter().map(HeaderValue::as_bytes);
        std::iter::once(name.as_bytes()).chain(lines).chain(std::iter::once(&b"\n"[..]))
    });
    let digest = crate::fingerprint::digest(values);
    format!("{target}\t{}", crate::fingerprint::hex(&digest, 16))
}

/// The fields each object's stored answers vary by, from the versions a previous run left.
fn varies_of(store: &SliceStore) -> HashMap<(String, String), Vec<String>> {
    let varying = store.versions().into_iter().filter_map(|version| {
        let (object, _) = version.target.split_once('\t')?;
        let names = varies_by(&version.headers)?;
        let names = names.iter().map(|name| name.to_ascii_lowercase()).collect();
        Some(((version.upstream.clone(), object.to_owned()), names))
    });
    varying.collect()
}

/// Whether each field of `names` has the same values in the requests with fields `one` and
/// `other` (absent from both included).
fn same_fields(names: &[&str], one: &HeaderMap, other: &HeaderMap) -> bool {
    names.iter().all(|name| one.get_all(*name).iter().eq(other.get_all(*name).iter()))
}

/// The fields of an origin's answer the cache keeps: its end-to-end ones — not those of its
/// connection, the fields its `Connection` names included (RFC 9110 §7.6.1) — without those that
/// describe one message (length, range, framing). `Age` is kept, for the freshness of what is
/// stored (RFC 9111 §4.2.3); a hit sends its own.
fn stored_fields(headers: &HeaderMap) -> HeaderMap {
    const OF_ONE_MESSAGE: [HeaderName; 6] = [
        header::CONTENT_LENGTH,
        header::CONTENT_RANGE,
        header::TRANSFER_ENCODING,
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
        let same = |answer: &[(&'static str, &'static str)], one: &HeaderMap, other: &HeaderMap| {
            let answer = fields(answer);
            varies_by(&answer).map(|names| same_fields(&names, one, other))
        };
        assert_eq!(same(&[], &cache, &client), Some(true));
        assert_eq!(same(&[("vary", "Host, Bar")], &cache, &client), Some(true));
        assert_eq!(same(&[("vary", "Bar, Foo")], &cache, &client), Some(false));
        assert_eq!(same(&[("vary", "Host"), ("vary", "foo")], &cache, &client), Some(false));
        assert_eq!(same(&[("vary", "Host"), ("vary", ", *")], &cache, &cache), None);
        assert_eq!(same(&[("vary", "Foo")], &client, &client), Some(true));
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
