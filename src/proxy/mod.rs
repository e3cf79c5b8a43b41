//! The proxy: pingora's `ProxyHttp` for rangeway.
//!
//! [`Rangeway`] is built once from config (routes, upstreams, limits, metrics); [`RequestCtx`] is
//! the per-request state that pingora threads through the phases. The request flow is DESIGN.md's:
//! route and parse in `request_filter`, plan and send the upstream Range in
//! `upstream_request_filter`, check the upstream's answer and shape the client's in
//! `response_filter`, cut the body in `response_body_filter` (synchronous, no allocation on
//! passthrough), record in `logging`.

mod completion;
pub mod download;
pub mod health;
mod negotiation;
mod origin_client;
pub mod path;
mod relay;
pub(crate) mod representation;
pub mod routing;
mod s3;
mod splice;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Method, StatusCode, header};
use pingora_core::modules::http::HttpModules;
use pingora_core::protocols::http::ServerSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use rangeway_middleware::chain::{Chain, ChainError, ObjectVersion as StageObject, StageError};
use rangeway_middleware::checksum::{parse_repr_digest_sha256, want_repr_digest_sha256};
use rangeway_middleware::rfc9110::{
    ContentRange, IgnoreReason, MultipartBody, MultipartPlan, RangeLimits, RangeSpec, Resolution,
    content_range, parse_content_range, unsatisfied_content_range,
};
use rangeway_middleware::{ByteRange, Window};
use tracing::{info, warn};

use crate::admin::live::{LiveGuard, LiveResponses};
use crate::admin::metrics::{ActiveDownload, Metrics};
use crate::config::ClientLimits;
use crate::fingerprint::{FingerprintKey, fingerprint};
use crate::range::{Asked, ClientRange, IfRangeDate, Shape, shape_response};
use crate::state::{
    Delivery, DownloadSession, Ending, ObjectVersion, Resumable, StateStore, unix_now,
};
use completion::{Completions, Unfinished};
use download::{DOWNLOAD_ID, DownloadId, SENT_PREFIX, download_id, holding, object_version};
use origin_client::OriginClient;
use path::NormalizedPath;
use relay::Continuable;
use representation::{
    ChainPass, Known, ORIGIN_DIGEST_HEADERS, digest_headers, representation_etag, version_key,
};
use routing::{Route, RouteSwitch, request_host};

/// The error of a body that fails the digest its origin published.
const ORIGIN_DIGEST_MISMATCH: &str = "OriginDigestMismatch";

/// Ranges less than this apart are read through as one; farther apart, each stretch is fetched
/// on its own, so that what a multipart answer costs the origin stays within the bytes asked for
/// and a gap per stretch (a client asking for the first and the last byte of a large object
/// pulled all of it). About what a request of its own costs on a fast link.
const PART_GAP: u64 = 64 << 10;

/// `X-Rangeway-Error` of a refused resume whose client may hold any of several versions.
const AMBIGUOUS_RESUME: &str = "several versions of the object were sent under this download id; download it again from \
     the start, under an id of your own (X-Download-Id)";

/// Written in `Via` on both sides (RFC 9110 §7.6.3).
const VIA: &str = "1.1 rangeway";

/// Response fields that describe one connection, not the message (RFC 9110 §7.6.1).
/// Names, not strings: a map finds a `HeaderName` without parsing it again (every response and
/// relayed request looks for all of them).
static HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];
/// Hop-by-hop in a request rangeway sends itself, besides [`HOP_BY_HOP`].
static REQUEST_HOP_BY_HOP: [HeaderName; 3] = [
    header::PROXY_AUTHENTICATE,
    header::TRANSFER_ENCODING,
    HeaderName::from_static("http2-settings"),
];

/// The proxy, built once from config and shared by every request.
#[derive(Debug)]
pub struct Rangeway {
    routes: Arc<RouteSwitch>,
    range_limits: RangeLimits,
    metrics: Arc<Metrics>,
    store: Arc<dyn StateStore>,
    completions: Arc<Completions>,
    origin_client: Arc<OriginClient>,
    live: Arc<LiveResponses>,
    client_limits: ClientLimits,
    /// Derived download ids are keyed with it.
    id_key: FingerprintKey,
}

impl Rangeway {
    pub fn new(
        routes: Arc<RouteSwitch>,
        range_limits: RangeLimits,
        metrics: Arc<Metrics>,
        store: Arc<dyn StateStore>,
        live: Arc<LiveResponses>,
        client_limits: ClientLimits,
        id_key: FingerprintKey,
    ) -> Self {
        let origin_client = Arc::new(OriginClient::new());
        let completions = Arc::new(Completions::new(Arc::clone(&origin_client)));
        Self {
            routes,
            range_limits,
            metrics,
            store,
            completions,
            origin_client,
            live,
            client_limits,
            id_key,
        }
    }
}

/// What the proxy does to the upstream body on its way to the client.
#[derive(Debug, Default)]
enum BodyPlan {
    /// Forward every chunk as it is.
    #[default]
    Forward,
    /// Forward only the bytes inside one range.
    Window(Window),
    /// Build a multipart/byteranges body from the ranges.
    Multipart(Box<MultipartBody>),
    /// Send nothing: the answer has no content (304, 412, 416, refused upstream answers).
    Discard,
    /// Send an explanation of an S3 error in place of its XML.
    S3Error(Box<s3::ErrorBody>),
}

/// Per-request state.
#[derive(Debug)]
pub struct RequestCtx {
    started: Instant,
    route: Option<Arc<Route>>,
    upstream_target: String,
    client_range: ClientRange,
    sent_range: Option<RangeSpec>,
    body: BodyPlan,
    /// What was served, for the access log: a Content-Range, "multipart", or "-".
    served: String,
    upstream_status: Option<u16>,
    upstream_connected: Option<Instant>,
    upstream_header: Option<Duration>,
    refusal: Option<&'static str>,
    _active: Option<ActiveDownload>,
    download: Option<DownloadCtx>,
    origin_digest: Option<OriginDigestCheck>,
    /// On a route with middleware: what the store knows of the object and its stages.
    known: Option<Known>,
    /// The object's path on the upstream, as the stages are told it.
    object_path: String,
    /// On a route that transforms: the origin's strong ETag the planned range was made for, sent
    /// upstream as If-Range so that a changed object comes whole.
    planned_for: Option<String>,
    /// The route's middleware running over the upstream body.
    pass: Option<ChainPass>,
    /// A stage whose stored index proved wrong, to be forgotten after the response.
    forget_stage: Option<usize>,
    /// The route serves its output as a content coding this client does not accept: the body is
    /// passed through untouched, as on a route without middleware.
    coding_declined: bool,
    /// This response's progress, shown by the admin API while it is in flight.
    live: Option<LiveGuard>,
    /// Which replica of the route's upstream the request went to.
    replica: usize,
    /// Body bytes that went to the client by splice(2) (pingora's writer is told of them after).
    spliced: u64,
    /// How the client's If-Range, when it is a date, goes upstream.
    if_range_date: IfRangeDate,
    /// The ranges of a multipart answer are fetched apart, in stretches this far apart at least.
    part_gap: Option<u64>,
    /// The stretches of a multipart answer still to fetch after the upstream's first answer.
    rest_parts: Vec<ByteRange>,
}

/// A full pass of an upstream body checked against the digest its origin published for it.
#[derive(Debug)]
struct OriginDigestCheck {
    expected: OriginDigest,
    /// Body bytes still to come; the check is made on the chunk that brings it to zero, before
    /// that chunk goes out (the end-of-body flag may come only with a later, empty call).
    remaining: u64,
}

/// A digest an origin publishes, with the hash running over the body.
#[derive(Debug)]
enum OriginDigest {
    Sha256 { expected: [u8; 32], hasher: sha2::Sha256 },
    Crc32 { expected: u32, hasher: crc32fast::Hasher },
}

impl OriginDigestCheck {
    /// For a 200 whose origin states the SHA-256 of its bytes (`Repr-Digest`, or S3's
    /// `x-amz-checksum-sha256` when it is a whole-object checksum), else their CRC32 (S3's
    /// `x-amz-checksum-crc32`), and their length. `Content-MD5` is deprecated and ignored.
    fn for_response(headers: &http::HeaderMap) -> Option<Self> {
        use base64::Engine as _;
        // "…-N" is a checksum of part checksums (multipart upload), not of the bytes.
        let s3 = |name: &str| {
            let value = headers.get(name)?.to_str().ok()?;
            if value.contains('-') {
                return None;
            }
            base64::engine::general_purpose::STANDARD.decode(value).ok()
        };
        let expected = parse_repr_digest_sha256(
            headers.get_all("repr-digest").iter().map(http::HeaderValue::as_bytes),
        )
        .or_else(|| s3("x-amz-checksum-sha256")?.try_into().ok())
        .map(|expected| OriginDigest::Sha256 { expected, hasher: sha2::Digest::new() })
        .or_else(|| {
            let crc: [u8; 4] = s3("x-amz-checksum-crc32")?.try_into().ok()?;
            let expected = u32::from_be_bytes(crc);
            Some(OriginDigest::Crc32 { expected, hasher: crc32fast::Hasher::new() })
        })?;
        let remaining = crate::range::content_length(headers)?;
        Some(Self { expected, remaining })
    }

    /// Hashes `chunk`; `Err` when it completes the body and the digest does not match.
    fn check(&mut self, chunk: &[u8]) -> std::result::Result<(), ()> {
        use sha2::Digest as _;
        match &mut self.expected {
            OriginDigest::Sha256 { hasher, .. } => hasher.update(chunk),
            OriginDigest::Crc32 { hasher, .. } => hasher.update(chunk),
        }
        self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
        if self.remaining > 0 {
            return Ok(());
        }
        let matches = match &mut self.expected {
            OriginDigest::Sha256 { expected, hasher } => {
                let got: [u8; 32] = std::mem::take(hasher).finalize().into();
                got == *expected
            }
            OriginDigest::Crc32 { expected, hasher } => {
                std::mem::take(hasher).finalize() == *expected
            }
        };
        if matches { Ok(()) } else { Err(()) }
    }
}

/// What the request knows of its download: who it is, what the store said, what was delivered.
#[derive(Debug)]
struct DownloadCtx {
    id: String,
    object: String,
    client: String,
    /// The session as the store had it before this request; `None` when new or unknown.
    session: Option<DownloadSession>,
    /// For a bare resume, the one version it may be answered with (see
    /// `DownloadSession::resumable`); its strong ETag goes upstream as `If-Match`.
    guard: Option<ObjectVersion>,
    /// The upstream's answer is not the version the resume may have: it is refused (412).
    changed: bool,
    /// What this response delivers.
    delivering: Option<Delivering>,
    /// The origin's version behind it (the same on a route that does not transform).
    origin_version: Option<ObjectVersion>,
}

/// What a response delivers to its download.
#[derive(Debug)]
struct Delivering {
    version: ObjectVersion,
    /// The bytes of the version the response sends: one stretch, or the span of a multipart
    /// answer's parts.
    range: ByteRange,
    parts: bool,
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            route: None,
            upstream_target: String::new(),
            client_range: ClientRange::Absent,
            sent_range: None,
            body: BodyPlan::Forward,
            served: String::from("-"),
            upstream_status: None,
            upstream_connected: None,
            upstream_header: None,
            refusal: None,
            _active: None,
            download: None,
            origin_digest: None,
            known: None,
            object_path: String::new(),
            planned_for: None,
            pass: None,
            forget_stage: None,
            coding_declined: false,
            live: None,
            replica: 0,
            spliced: 0,
            if_range_date: IfRangeDate::NotADate,
            part_gap: None,
            rest_parts: Vec::new(),
        }
    }
}

impl RequestCtx {
    fn route_name(&self) -> &str {
        self.route.as_ref().map_or("-", |r| r.name.as_str())
    }

    /// The route's middleware as this request runs it: none on a passthrough route, or when the
    /// client declined the route's content coding.
    fn chain(&self) -> Option<&Chain> {
        self.route
            .as_ref()
            .map(|route| &route.chain)
            .filter(|chain| !chain.stages().is_empty() && !self.coding_declined)
    }

    /// The bytes a multipart answer is made of, when the response is one.
    fn multipart_span(&self) -> Option<ByteRange> {
        match &self.body {
            BodyPlan::Multipart(multipart) => Some(multipart.span()),
            _ => None,
        }
    }

    /// The next body chunk is byte `to` of the object: a stretch of a multipart answer fetched
    /// after a gap (see `plan_parts`).
    fn skip_to(&mut self, to: u64) -> Result<()> {
        match &mut self.body {
            BodyPlan::Multipart(multipart) => multipart
                .skip_to(to)
                .map_err(|e| Error::because(ErrorType::InternalError, "multipart body", e)),
            _ => Err(Error::explain(ErrorType::InternalError, "a gap in a body not multipart")),
        }
    }

    /// Whether the route's middleware changes the bytes for this request.
    fn transforms(&self) -> bool {
        self.chain().is_some_and(|chain| !chain.is_observing_only())
    }

    /// What this response delivered to its download, once `sent` body bytes went out (none is
    /// an empty range), `finished` when the response ended without an error.
    fn delivery(&self, sent: u64, finished: bool) -> Option<Delivery> {
        let download = self.download.as_ref()?;
        let Delivering { version, range: promised, parts } = download.delivering.as_ref()?;
        let origin_version = download.origin_version.as_ref().unwrap_or(version);
        let (range, ending) = if *parts {
            (*promised, Ending::Parts)
        } else {
            let range = ByteRange::from_len(promised.start(), sent.min(promised.len()))?;
            let whole = finished && range == *promised;
            (range, if whole { Ending::Whole } else { Ending::Cut })
        };
        Some(Delivery {
            id: download.id.clone(),
            object: download.object.clone(),
            route: self.route_name().to_owned(),
            client: download.client.clone(),
            version: version.clone(),
            origin_version: origin_version.clone(),
            range,
            ending,
            bytes: sent,
            now: unix_now(),
        })
    }
}

impl DownloadCtx {
    /// Labels the client's response with its download, and notes what it delivers: the version,
    /// and which of its bytes (`parts`: the span of a multipart answer's parts).
    fn note_response(
        &mut self,
        response: &mut ResponseHeader,
        version: Option<ObjectVersion>,
        parts: Option<ByteRange>,
    ) -> Result<()> {
        response.insert_header(DOWNLOAD_ID, self.id.as_str())?;
        // The hint speaks of the version being delivered only.
        let sent = self.session.as_ref().zip(version.as_ref()).and_then(|(s, v)| s.of_version(v));
        if let Some(sent) = sent {
            response.insert_header(SENT_PREFIX, sent.sent.contiguous_prefix_end())?;
        }
        let range = match (response.status.as_u16(), &version) {
            (200, Some(version)) => Some(ByteRange::whole(version.size)),
            (206, _) => parts.or_else(|| {
                match parse_content_range(response.headers.get(header::CONTENT_RANGE)?.as_bytes())?
                {
                    ContentRange::Satisfied { range, .. } => Some(range),
                    ContentRange::Unsatisfied { .. } => None,
                }
            }),
            _ => None,
        };
        self.delivering = version.zip(range).map(|(version, range)| Delivering {
            version,
            range,
            parts: parts.is_some(),
        });
        Ok(())
    }
}

impl Rangeway {
    /// On a route whose stages only observe: publishes what the store knows (digests), and runs
    /// the stages over the upstream body to learn more.
    fn observe(
        &self,
        session: &Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        version: Option<&crate::state::ObjectVersion>,
        upstream_stream: Option<ByteRange>,
    ) -> Result<()> {
        let Some(version) = version else { return Ok(()) };
        let known = ctx.known.take().unwrap_or_default().for_version(version_key(version));
        let path = ctx.object_path.clone();
        let object = StageObject {
            route: &route.name,
            path: &path,
            strong_etag: version.etag.as_deref().filter(|_| version.strong),
            len: version.size,
        };
        let lens = route.chain.lengths(&object, &known.learned());
        let req = session.req_header();
        let want = want_repr_digest_sha256(
            req.headers.get_all("want-repr-digest").iter().map(HeaderValue::as_bytes),
        );
        for (name, value) in digest_headers(&route.chain, &known, &lens, want) {
            response.insert_header(name, value)?;
        }
        let (Some(stream), true) = (upstream_stream, req.method == Method::GET) else {
            return Ok(());
        };
        if matches!(ctx.body, BodyPlan::Discard) {
            return Ok(());
        }
        // Every chunk passes the stages as it is (they only look), before it is cut for the
        // client: the stages see the upstream's bytes at their places in the object.
        let plan = route.chain.plan(stream, &object, &known.learned()).map_err(|e| {
            Error::because(ErrorType::InternalError, "planning the route's middleware", e)
        })?;
        ctx.pass =
            Some(ChainPass::start(&route.chain, &plan, &object, known, stream.start()).map_err(
                |e| Error::because(ErrorType::InternalError, "starting the route's middleware", e),
            )?);
        Ok(())
    }

    /// On a route that transforms: the transformed representation's answer. Its length, ETag and
    /// ranges come from the chain and the origin's version; the client's range and validators
    /// are evaluated against them; the chain is started for the output range to send.
    fn transformed_response(
        &self,
        session: &Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        version: Option<crate::state::ObjectVersion>,
    ) -> Result<()> {
        let status = response.status.as_u16();
        forwarded(response)?;
        if !matches!(status, 200 | 206) {
            // Errors, 304 (If-Modified-Since holds for both representations), and refusals of
            // the planned range: nothing of the origin's bytes is sent.
            response.remove_header(&header::ETAG);
            response.remove_header(&header::CONTENT_RANGE);
            return Ok(());
        }
        let stream = upstream_stream(status, &response.headers);
        let (Some(version), Some(stream)) = (version, stream) else {
            return self.refuse(
                response,
                ctx,
                &route.name,
                "the upstream did not say the object's length, which the route's middleware needs",
            );
        };
        let known = ctx.known.take().unwrap_or_default().for_version(version_key(&version));
        let strong_etag = version.etag.as_deref().filter(|_| version.strong);
        let path = ctx.object_path.clone();
        let object =
            StageObject { route: &route.name, path: &path, strong_etag, len: version.size };
        let learned = known.learned();
        let lens = route.chain.lengths(&object, &learned);
        let output_len = lens.last().copied().flatten();
        let etag = strong_etag.map(|etag| representation_etag(etag, &route.chain));
        // The representation's own version: what a download of it is of.
        let delivered = output_len.map(|size| ObjectVersion {
            etag: etag.clone(),
            strong: etag.is_some(),
            size,
            last_modified: version.last_modified,
            content_type: version.content_type.clone(),
        });
        // Resume safety, as for the origin's own bytes: a bare resume the representation may
        // not follow is refused.
        if let Some(download) = ctx.download.as_mut()
            && let Some(guard) = download.guard.take()
            && !delivered.as_ref().is_some_and(|delivered| delivered.same_as(&guard))
        {
            download.changed = true;
            self.metrics.resume_refused(&route.name);
            let id = download.id.clone();
            return refuse_changed(response, ctx, &id);
        }
        // Ranges only of what can be made again byte for byte: a version pinned by a strong
        // ETag, of a known length; never of a content coding, which clients decode as it comes
        // and would resume at decoded offsets.
        let coding = route.chain.content_coding();
        let rangeable = etag.is_some() && output_len.is_some() && coding.is_none();
        let mut own = http::HeaderMap::new();
        if let Some(etag) = etag.as_deref().and_then(|e| HeaderValue::from_str(e).ok()) {
            own.insert(header::ETAG, etag);
        }
        if let Some(modified) = response.headers.get(header::LAST_MODIFIED) {
            own.insert(header::LAST_MODIFIED, modified.clone());
        }
        if let Some(len) = output_len {
            own.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        // Ranges far apart would make the stages produce everything between them: answered whole
        // instead, which costs what the client takes (see `plan_parts`).
        let together = |set: &rangeway_middleware::rfc9110::RangeSet| {
            output_len.is_some_and(|len| set.fetches(len, PART_GAP).len() <= 1)
        };
        let client_range = match &ctx.client_range {
            ClientRange::Bytes(set) if rangeable && !together(set) => {
                ClientRange::Ignored(IgnoreReason::Sparse)
            }
            range if rangeable => range.clone(),
            _ => ClientRange::Absent,
        };
        let req = session.req_header();
        let asked = Asked {
            method: &req.method,
            headers: &req.headers,
            range: &client_range,
            sent: None,
            if_range_date_sent: false,
            part_gap: None,
        };
        let shape = shape_response(&asked, 200, &own, SystemTime::now());
        let want = want_repr_digest_sha256(
            req.headers.get_all("want-repr-digest").iter().map(HeaderValue::as_bytes),
        );
        let is_get = req.method == Method::GET;
        for name in ORIGIN_DIGEST_HEADERS.iter().copied().chain([
            "etag",
            "content-range",
            "accept-ranges",
            "content-length",
            "transfer-encoding",
        ]) {
            response.remove_header(name);
        }
        remove_whole_object_checksums(response);
        if let Some(etag) = &etag {
            response.insert_header(header::ETAG, etag.as_str())?;
        }
        if let Some(coding) = coding {
            response.insert_header(header::CONTENT_ENCODING, coding)?;
        }
        if let Some(media_type) = route.chain.media_type() {
            response.insert_header(header::CONTENT_TYPE, media_type)?;
        }
        if let Some(disposition) = content_disposition(&path, &route.chain) {
            response.insert_header(header::CONTENT_DISPOSITION, disposition)?;
        }
        let output = match shape {
            Shape::Forward => {
                response.set_status(StatusCode::OK)?;
                match output_len {
                    Some(len) => response.insert_header(header::CONTENT_LENGTH, len)?,
                    None => response.insert_header(header::TRANSFER_ENCODING, "chunked")?,
                }
                if rangeable {
                    response.insert_header(header::ACCEPT_RANGES, "bytes")?;
                }
                output_len.map(ByteRange::whole)
            }
            Shape::Single { range, complete_len, .. } => {
                let value = content_range(range, complete_len);
                set_partial(response, range.len(), &value)?;
                ctx.served = value;
                Some(range)
            }
            Shape::Multiple { ranges, complete_len, .. } => {
                let Some(covering) = covering(&ranges) else {
                    return self.refuse(response, ctx, &route.name, "no ranges to send");
                };
                self.multipart(response, ctx, &ranges, complete_len, covering.start())?;
                Some(covering)
            }
            Shape::BadGateway(reason) => return self.refuse(response, ctx, &route.name, reason),
            shape @ (Shape::Unsatisfiable { .. }
            | Shape::NotModified
            | Shape::PreconditionFailed) => {
                answer_without_body(response, ctx, &shape)?;
                None
            }
        };
        for (name, value) in digest_headers(&route.chain, &known, &lens, want) {
            response.insert_header(name, value)?;
        }
        let parts = ctx.multipart_span();
        if let Some(download) = ctx.download.as_mut() {
            download.note_response(response, delivered, parts)?;
            download.origin_version = Some(version.clone());
        }
        if !is_get || matches!(ctx.body, BodyPlan::Discard) {
            ctx.body = BodyPlan::Discard;
            return Ok(());
        }
        let plan = match output {
            Some(output) => route.chain.plan(output, &object, &learned),
            None => Ok(route.chain.plan_whole(&object, &learned)),
        };
        let plan = match plan {
            Ok(plan) if stream.contains_range(&plan.origin()) => plan,
            Ok(_) => {
                return self.refuse(
                    response,
                    ctx,
                    &route.name,
                    "the upstream's answer does not hold the bytes the middleware needs",
                );
            }
            Err(error) => {
                warn!(route = %route.name, %error, "the route's middleware cannot plan this response");
                return self.refuse(
                    response,
                    ctx,
                    &route.name,
                    "the middleware cannot plan this range",
                );
            }
        };
        let pass = ChainPass::start(&route.chain, &plan, &object, known, stream.start())
            .map_err(|e| Error::because(ErrorType::InternalError, "starting the middleware", e))?;
        ctx.pass = Some(pass);
        Ok(())
    }

    /// Refuses, before asking the origin, a bare resume whose client may hold any of several
    /// versions sent under its download id (see `DownloadSession::resumable`): 412, with a body
    /// that says how to download it so that it can be resumed.
    async fn refuse_ambiguous(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        download: &DownloadId,
    ) -> Result<()> {
        let route = ctx.route_name().to_owned();
        self.metrics.resume_refused(&route);
        info!(route, download = %download.id, "several versions of the object were sent under this download id: refusing the resume");
        ctx.refusal = Some("the client may hold any of several versions");
        ctx.download = None;
        let message = if download.derived {
            "rangeway: this resume is refused: more than one version of the object was sent \
             under this download's id, which every client at your address with the same \
             User-Agent shares, and the bytes you hold could be of either. Download it again \
             from the start. To make that download resumable whatever other clients at your \
             address do, give it an id of your own on every request of it: the header \
             `X-Download-Id: NAME` (curl -H, wget --header, aria2c --header) or the query \
             parameter `download_id=NAME`.\n"
        } else {
            "rangeway: this resume is refused: more than one version of the object was sent \
             under this download id, and the bytes you hold could be of either. Download it \
             again from the start, under a new download id.\n"
        };
        let extra = [
            (HeaderName::from_static("x-rangeway-error"), AMBIGUOUS_RESUME),
            (HeaderName::from_static(DOWNLOAD_ID), download.id.as_str()),
        ];
        respond(session, StatusCode::PRECONDITION_FAILED, message, &extra).await
    }

    /// Shows the response in the admin API while it is in flight, when it delivers to a download.
    fn go_live(&self, ctx: &mut RequestCtx) {
        if matches!(ctx.body, BodyPlan::Discard) {
            return;
        }
        // What the response will record at its end, before any byte went out; the parts of a
        // multipart answer are not shown as they go.
        if let Some(delivery) = ctx.delivery(0, false).filter(|d| d.ending != Ending::Parts) {
            ctx.live = Some(self.live.register(delivery));
        }
    }

    /// Answers 502 for an upstream answer that cannot be made into a correct response.
    fn refuse(
        &self,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        route: &str,
        reason: &'static str,
    ) -> Result<()> {
        let status = response.status.as_u16();
        warn!(route, upstream_status = status, reason, "refusing the upstream's answer");
        self.metrics.upstream_error(route, "bad_range_answer");
        empty_answer(response, StatusCode::BAD_GATEWAY)?;
        response.insert_header("x-rangeway-error", reason)?;
        ctx.refusal = Some(reason);
        ctx.body = BodyPlan::Discard;
        Ok(())
    }

    /// Makes `response` a multipart/byteranges answer of `ranges`, cut from a stream that starts
    /// at `stream_start`.
    fn multipart(
        &self,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        ranges: &[ByteRange],
        complete_len: u64,
        stream_start: u64,
    ) -> Result<()> {
        let content_type = response.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
        let plan =
            MultipartPlan::new(ranges, complete_len, content_type, &boundary(ranges, complete_len))
                .map_err(|e| Error::because(ErrorType::InternalError, "multipart plan", e))?;
        let multipart = MultipartBody::new(plan.clone(), stream_start)
            .map_err(|e| Error::because(ErrorType::InternalError, "multipart body", e))?;
        response.set_status(StatusCode::PARTIAL_CONTENT)?;
        response.remove_header(&header::CONTENT_RANGE);
        response.remove_header(&header::TRANSFER_ENCODING);
        response.insert_header(header::CONTENT_TYPE, plan.content_type_header())?;
        response.insert_header(header::CONTENT_LENGTH, plan.total_len())?;
        response.insert_header(header::ACCEPT_RANGES, "bytes")?;
        ctx.served = format!("multipart ({} ranges)", ranges.len());
        ctx.body = BodyPlan::Multipart(Box::new(multipart));
        Ok(())
    }
}

#[async_trait]
impl ProxyHttp for Rangeway {
    type CTX = RequestCtx;

    fn init_downstream_modules(&self, _modules: &mut HttpModules) {
        // None: pingora's default is a compression module switched off, which rangeway (whose
        // codings are stages of a route's chain) never switches on; it cost every request a
        // box and a look at its Accept-Encoding.
    }

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        // A client that takes none of the response for this long is cut, rather than holding its
        // buffers and upstream connection indefinitely.
        session.set_write_timeout(Some(self.client_limits.write_timeout));
        if let Some(problem) = header_over_limits(session.req_header(), &self.client_limits) {
            // The connection ends with this answer: a client that sends such headers once will
            // again, and what follows them on the connection is not worth reading.
            session.set_keepalive(None);
            let status = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
            respond(session, status, problem, &[(header::CONNECTION, "close")]).await?;
            return Ok(true);
        }
        // Requests a client pipelines on its connection are answered in turn (RFC 9112 §9.3.2),
        // where pingora would close the connection after the first and drop the others.
        if let ServerSession::H1(h1) = session.as_downstream_mut() {
            h1.set_pipelining_enabled(true);
        }
        let req = session.req_header();
        if req.version == http::Version::HTTP_11 && !req.headers.contains_key(header::HOST) {
            // RFC 9112 §3.2. (pingora refuses two Host lines, and a Host that contradicts an
            // absolute-form target, itself.)
            let problem = "an HTTP/1.1 request must have a Host header\n";
            respond(session, StatusCode::BAD_REQUEST, problem, &[]).await?;
            return Ok(true);
        }
        if req.method != Method::GET && req.method != Method::HEAD {
            respond(
                session,
                StatusCode::METHOD_NOT_ALLOWED,
                "rangeway serves GET and HEAD only\n",
                &[(header::ALLOW, "GET, HEAD")],
            )
            .await?;
            return Ok(true);
        }
        let path = match NormalizedPath::parse(req.uri.path()) {
            Ok(path) => path,
            Err(e) => {
                respond(session, StatusCode::BAD_REQUEST, &format!("bad path: {e}\n"), &[]).await?;
                return Ok(true);
            }
        };
        let host = request_host(req);
        let routes = self.routes.current();
        let Some(route) = routes.find(host.as_deref(), &path) else {
            respond(session, StatusCode::NOT_FOUND, "no route for this path\n", &[]).await?;
            return Ok(true);
        };
        if let Some(keys) = &route.s3_client_keys {
            let target = req.uri.path_and_query().map_or("/", |p| p.as_str());
            let checked = crate::s3::verify::verify(
                keys,
                req.method.as_str(),
                target,
                &req.headers,
                SystemTime::now(),
            );
            if let Err(refusal) = checked {
                info!(route = %route.name, code = refusal.code(), "refused an S3 client: {refusal}");
                let document = crate::s3::error::document(refusal.code(), &refusal.to_string());
                let xml = [(header::CONTENT_TYPE, "application/xml")];
                respond(session, StatusCode::FORBIDDEN, &document, &xml).await?;
                return Ok(true);
            }
        }
        let mut target = route.upstream_path(&path);
        let query = req.uri.query().map(|query| match route.upstream.is_s3() {
            true => s3::upstream_query(query, route.s3_response_overrides),
            false => download::without_download_id(query),
        });
        if let Some(query) = query.filter(|q| !q.is_empty()) {
            target.push('?');
            target.push_str(&query);
        }
        ctx.client_range = ClientRange::from_request(&req.method, &req.headers, &self.range_limits);
        ctx.sent_range = ctx.client_range.upstream_spec();
        ctx.upstream_target = target;
        ctx._active = Some(self.metrics.active_download());
        ctx.route = Some(Arc::clone(route));
        ctx.coding_declined = route
            .chain
            .content_coding()
            .is_some_and(|coding| !negotiation::accepts_coding(&req.headers, coding));
        let has_chain = !route.chain.stages().is_empty() && !ctx.coding_declined;
        // A bare resume the client may hold any of several versions for: refused below.
        let mut ambiguous = None;
        if req.method == Method::GET || (has_chain && req.method == Method::HEAD) {
            // A content coding is another representation, with downloads of its own.
            let object = match route.chain.content_coding().filter(|_| has_chain) {
                Some(coding) => format!("{}|{path}|{coding}", route.name),
                None => format!("{}|{path}", route.name),
            };
            let client_ip = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip());
            let DownloadId { id, derived } = download_id(req, client_ip, &object, &self.id_key);
            let ranged = matches!(ctx.client_range, ClientRange::Bytes(_));
            // Resume safety only for a bare resume: explicit validators keep their RFC meaning.
            let bare_resume = ranged
                && !req.headers.contains_key(header::IF_RANGE)
                && !req.headers.contains_key(header::IF_MATCH);
            // The one store round trip before the response, for requests that continue a
            // download and on routes whose stages learn. A store outage costs resume safety,
            // the resume hint and the digests, never the response (the store reports it, once).
            let lookup = if ranged || has_chain {
                self.store.lookup(&id, &object, &route.stage_keys).await.ok()
            } else {
                None
            };
            let (stored, record, facts) =
                lookup.map_or((None, None, Vec::new()), |l| (l.session, l.object, l.facts));
            let stored = stored.filter(|_| ranged);
            if ranged && !ctx.transforms() {
                // Decided here, by the store's record of the object: see `IfRangeDate`.
                let known = record.as_ref().map(|r| download::validators_of(&r.current));
                ctx.if_range_date =
                    IfRangeDate::decide(&req.headers, known.as_ref(), SystemTime::now());
                if ctx.if_range_date == IfRangeDate::AskWhole {
                    ctx.sent_range = None;
                }
            }
            // Which version a bare resume may be answered with, by what its client may hold.
            let resumable = match (&ctx.client_range, &stored) {
                (ClientRange::Bytes(set), Some(stored)) if bare_resume => {
                    stored.resumable(holding(req, set))
                }
                _ => Resumable::Any,
            };
            let guard = match resumable {
                Resumable::Any => None,
                Resumable::Only(version) => Some(version.clone()),
                Resumable::Neither => {
                    ambiguous = Some(DownloadId { id: id.clone(), derived });
                    None
                }
            };
            if ranged && !ctx.transforms() {
                let relayed = relay::relayed(session, route);
                plan_parts(ctx, record.as_ref().map(|r| &r.current), relayed, &req.headers);
            }
            if has_chain {
                let current = record.map(|r| r.current);
                let known = Known::of(current.as_ref().and_then(version_key), facts);
                ctx.object_path = path.to_string();
                plan_upstream(ctx, route, current.as_ref(), &known, &req.headers);
                ctx.known = Some(known);
            }
            if req.method == Method::GET {
                ctx.download = Some(DownloadCtx {
                    id,
                    object,
                    client: client_ip.map(|ip| ip.to_string()).unwrap_or_default(),
                    session: stored,
                    guard,
                    changed: false,
                    delivering: None,
                    origin_version: None,
                });
            }
        }
        if let Some(download) = ambiguous {
            self.refuse_ambiguous(session, ctx, &download).await?;
            return Ok(true);
        }
        Ok(false)
    }

    async fn proxy_upstream_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool> {
        let Some(route) = ctx.route.as_ref() else { return Ok(true) };
        // rangeway relays it itself, so that a body its origin breaks off can be continued, or
        // so that its body costs fewer copies (see relay.rs); pingora proxies the rest.
        if !relay::relayed(session, route) {
            return Ok(true);
        }
        let policy = route.upstream_resume;
        self.relay(session, ctx, policy).await?;
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let route = ctx
            .route
            .as_ref()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route chosen"))?;
        ctx.replica = route.upstream.choose();
        route.upstream.peer(ctx.replica).await
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let Some(upstream) = ctx.route.as_ref().map(|route| &route.upstream)
            && upstream.replica_count() > 1
        {
            // Nothing was sent: another replica can take the request.
            upstream.failed(ctx.replica);
            e.set_retry(true);
        }
        e
    }

    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        _reused: bool,
        _peer: &HttpPeer,
        _fd: std::os::unix::io::RawFd,
        _digest: Option<&pingora_core::protocols::Digest>,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.upstream_connected = Some(Instant::now());
        Ok(())
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let route = ctx
            .route
            .as_ref()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route chosen"))?;
        let uri = ctx
            .upstream_target
            .parse::<http::Uri>()
            .map_err(|e| Error::because(ErrorType::InternalError, "upstream path", e))?;
        upstream_request.set_uri(uri);
        let original_host = upstream_request.headers.get(header::HOST).cloned();
        upstream_request.insert_header(header::HOST, route.upstream.host_header(ctx.replica))?;
        upstream_request.remove_header(&header::RANGE);
        let transforms = ctx.transforms();
        if ctx.chain().is_some() {
            // The stages work on the object's own bytes, not on an encoding of them.
            upstream_request
                .insert_header(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"))?;
        }
        if transforms {
            // The client's validators are of the transformed representation, checked here
            // against its own ETag; the origin's would never match them.
            for name in [header::IF_MATCH, header::IF_NONE_MATCH, header::IF_RANGE] {
                upstream_request.remove_header(&name);
            }
        }
        if let Some(spec) = &ctx.sent_range {
            upstream_request.insert_header(header::RANGE, format!("bytes={spec}"))?;
            if let Some(planned_for) = &ctx.planned_for {
                // Planned for this version: another one must come whole, to be planned again.
                upstream_request.insert_header(header::IF_RANGE, planned_for.as_str())?;
            } else if let Some(etag) = ctx
                .download
                .as_ref()
                .and_then(|d| d.guard.as_ref())
                .filter(|guard| guard.strong)
                .and_then(|guard| guard.etag.as_deref())
                && !transforms
            {
                // The one version this resume may be answered with: anything else comes as 412.
                upstream_request.insert_header(header::IF_MATCH, etag)?;
            }
        } else {
            // If-Range only means something beside a Range.
            upstream_request.remove_header(&header::IF_RANGE);
        }
        upstream_request.remove_header(&header::PROXY_AUTHORIZATION);
        if let Some(client) = session.client_addr().and_then(|a| a.as_inet()) {
            let ip = client.ip().to_string();
            let forwarded =
                match upstream_request.headers.get("x-forwarded-for").and_then(|v| v.to_str().ok())
                {
                    Some(earlier) => format!("{earlier}, {ip}"),
                    None => ip,
                };
            upstream_request.insert_header("x-forwarded-for", forwarded)?;
        }
        upstream_request.insert_header("x-forwarded-proto", HeaderValue::from_static("http"))?;
        if let Some(host) = original_host {
            upstream_request.insert_header("x-forwarded-host", host)?;
        }
        upstream_request.append_header(header::VIA, HeaderValue::from_static(VIA))?;
        route.upstream.authorize(upstream_request)
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if response.status.is_server_error()
            && let Some(route) = ctx.route.as_ref()
        {
            route.upstream.failed(ctx.replica);
        }
        if ctx.transforms() {
            // The guard is the transformed representation's ETag: checked in response_filter.
            return Ok(());
        }
        let Some(download) = ctx.download.as_mut() else {
            return Ok(());
        };
        let Some(guard) = download.guard.take() else {
            return Ok(());
        };
        let status = response.status.as_u16();
        let answered = object_version(status, &response.headers);
        let changed = status == 412
            || (matches!(status, 200 | 206) && !answered.is_some_and(|v| v.same_as(&guard)));
        if !changed {
            return Ok(());
        }
        // The object is not the one version the client may hold: no answer with bytes of another
        // is safe. A range of it would be spliced by every client; so would the whole object
        // (wget -c skips a 200's first bytes up to its file length and appends the rest). The
        // resume is refused: curl -C - leaves its file as it is, wget and aria2c stop with an
        // error.
        download.changed = true;
        let route = ctx.route.as_ref().map_or("-", |r| r.name.as_str());
        self.metrics.resume_refused(route);
        info!(route, download = %download.id, "the object changed since this download began: refusing the resume");
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let status = response.status.as_u16();
        ctx.upstream_status = Some(status);
        ctx.upstream_header = ctx.upstream_connected.map(|t| t.elapsed());
        let version = object_version(status, &response.headers);
        let origin_digest =
            if status == 200 { OriginDigestCheck::for_response(&response.headers) } else { None };
        if let Some(id) = ctx.download.as_ref().filter(|d| d.changed).map(|d| d.id.clone()) {
            return refuse_changed(response, ctx, &id);
        }
        // An Arc, not a copy of the name: the ctx is borrowed mutably below.
        let route_arc = ctx.route.clone();
        if route_arc.as_ref().is_some_and(|r| r.upstream.is_s3())
            && let Some(client_status) = crate::s3::error::client_status(status)
        {
            forwarded(response)?;
            ctx.served = format!("S3 error {status}");
            let xml = crate::s3::error::speaks_s3(&session.req_header().headers);
            let error = s3::ErrorBody::start(response, client_status, xml)?;
            ctx.body = BodyPlan::S3Error(Box::new(error));
            if session.req_header().method == Method::HEAD {
                response.remove_header(&header::TRANSFER_ENCODING);
            }
            return Ok(());
        }
        if status == 416
            && !ctx.transforms()
            && !response.headers.contains_key(header::CONTENT_RANGE)
        {
            // An origin that refuses a range without saying the length (S3 does): the client
            // still gets `Content-Range: bytes */LEN` (RFC 9110 §15.5.17), from a HEAD.
            // Boxed: inline, this rare exchange's state would make every call's future (which
            // async_trait boxes, per response) kilobytes larger, all of it copied.
            if let Some(route) = route_arc.as_ref()
                && let Ok(Some(complete_len)) =
                    Box::pin(self.origin_client.length(&route.upstream, &ctx.upstream_target)).await
            {
                forwarded(response)?;
                return answer_without_body(response, ctx, &Shape::Unsatisfiable { complete_len });
            }
        }
        if ctx.route.as_ref().is_some_and(|route| route.chain.content_coding().is_some()) {
            // The answer depends on Accept-Encoding, coded or not.
            response.append_header(header::VARY, "Accept-Encoding")?;
        }
        if let Some(route) = route_arc.as_ref().filter(|_| ctx.transforms()) {
            let result = self.transformed_response(session, response, ctx, route, version);
            if result.is_ok() && !matches!(ctx.body, BodyPlan::Discard) {
                ctx.origin_digest = origin_digest;
            }
            self.go_live(ctx);
            return result;
        }
        // The upstream body's place in the object, for stages that observe it.
        let upstream_stream = upstream_stream(status, &response.headers);
        forwarded(response)?;
        let req = session.req_header();
        let asked = Asked {
            method: &req.method,
            headers: &req.headers,
            range: &ctx.client_range,
            sent: ctx.sent_range.as_ref(),
            if_range_date_sent: ctx.if_range_date == IfRangeDate::Forward,
            part_gap: ctx.part_gap,
        };
        let shape = shape_response(&asked, status, &response.headers, SystemTime::now());
        let route = route_arc.as_ref().map_or("-", |r| r.name.as_str());
        match shape {
            Shape::Forward => {
                if let Some(range) = response.headers.get(header::CONTENT_RANGE) {
                    ctx.served = range.to_str().unwrap_or("?").to_owned();
                }
                if matches!(status, 200 | 206)
                    && response.headers.contains_key(header::CONTENT_LENGTH)
                {
                    // rangeway can cut any range out of a response of known length.
                    response.insert_header(header::ACCEPT_RANGES, "bytes")?;
                }
            }
            Shape::Single { range, complete_len, stream_start } => {
                if status == 200 {
                    self.metrics.upstream_ignored_range(route);
                }
                let value = content_range(range, complete_len);
                set_partial(response, range.len(), &value)?;
                ctx.served = value;
                ctx.body = BodyPlan::Window(Window::new(stream_start, range));
            }
            Shape::Multiple { ranges, complete_len, stream_start, rest } => {
                if !rest.is_empty() && Continuable::etag(&response.headers).is_none() {
                    // The stretches after the first are pinned to its version by its ETag.
                    let reason = "the upstream's answer has no strong ETag to fetch the other \
                                  ranges of the same version with";
                    self.refuse(response, ctx, route, reason)?;
                } else {
                    self.multipart(response, ctx, &ranges, complete_len, stream_start)?;
                    ctx.rest_parts = rest;
                }
            }
            Shape::BadGateway(reason) => self.refuse(response, ctx, route, reason)?,
            shape @ (Shape::Unsatisfiable { .. }
            | Shape::NotModified
            | Shape::PreconditionFailed) => {
                answer_without_body(response, ctx, &shape)?;
            }
        }
        if response.status == StatusCode::PARTIAL_CONTENT {
            // They are of the whole object (S3 sends them on a whole-object answer rangeway cut
            // a range out of), and clients check them against the part (boto3 fails).
            remove_whole_object_checksums(response);
        }
        // The stages see a body whole from where it starts: not one fetched in stretches.
        if let Some(route) = route_arc.as_ref().filter(|_| ctx.chain().is_some())
            && matches!(response.status.as_u16(), 200 | 206)
            && ctx.rest_parts.is_empty()
        {
            self.observe(session, response, ctx, route, version.as_ref(), upstream_stream)?;
        }
        let parts = ctx.multipart_span();
        if let Some(download) = ctx.download.as_mut() {
            download.note_response(response, version, parts)?;
        }
        // A whole upstream body whose bytes reach the client (whole or cut) is checked against
        // the origin's own digest when it gave one.
        if !matches!(ctx.body, BodyPlan::Discard) {
            ctx.origin_digest = origin_digest;
        }
        self.go_live(ctx);
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Duration>> {
        if let (Some(check), Some(chunk)) = (ctx.origin_digest.as_mut(), body.as_ref())
            && check.check(chunk).is_err()
        {
            // The bytes are not the ones the origin vouched for: the last of them are withheld,
            // so the client sees a cut download to resume, never a complete wrong one.
            *body = None;
            let route = ctx.route.as_ref().map_or("-", |r| r.name.as_str());
            self.metrics.origin_digest_mismatch(route);
            return Err(Error::explain(
                ErrorType::Custom(ORIGIN_DIGEST_MISMATCH),
                "the body does not match the digest its origin published",
            )
            .into_up());
        }
        if let Some(pass) = ctx.pass.as_mut() {
            let chunk = body.take();
            let out = off_the_event_loop(pass.blocks(), || {
                let out = match chunk {
                    Some(chunk) => pass.push(chunk),
                    None => Ok(None),
                };
                match (out, end_of_stream) {
                    (Ok(out), true) => pass.finish().map(|tail| join(out, tail)),
                    (out, _) => out,
                }
            });
            match out {
                Ok(out) => *body = out,
                Err(error) => {
                    if let ChainError::Stage {
                        index,
                        error: StageError::SegmentMismatch { .. },
                        ..
                    } = &error
                    {
                        ctx.forget_stage = Some(*index);
                    }
                    // Nothing but the stages' exact output goes out: the client gets a cut
                    // download to resume, never a wrong byte.
                    let route = ctx.route.as_ref().map_or("-", |r| r.name.as_str());
                    self.metrics.middleware_error(route);
                    warn!(route, %error, "the route's middleware failed; cutting the response");
                    return Err(Error::because(ErrorType::InternalError, "middleware", error));
                }
            }
        }
        match &mut ctx.body {
            BodyPlan::Forward => {}
            BodyPlan::Window(window) => *body = body.take().and_then(|chunk| window.cut(chunk)),
            BodyPlan::Multipart(multipart) => {
                let out = body.take().and_then(|chunk| multipart.push(chunk));
                *body = if end_of_stream { join(out, multipart.finish()) } else { out };
            }
            BodyPlan::Discard => *body = None,
            BodyPlan::S3Error(error) => {
                if let Some(chunk) = body.take() {
                    error.push(&chunk);
                }
                if end_of_stream {
                    let route = ctx.route.as_ref().map_or("-", |r| r.name.as_str());
                    let upstream = ctx.route.as_ref().map_or("-", |r| r.upstream.name());
                    let (text, code) = error.finish(route, upstream);
                    if let Some(code) = code {
                        ctx.served = format!("S3 {code}");
                    }
                    *body = Some(text);
                }
            }
        }
        if let (Some(live), Some(chunk)) = (&ctx.live, body.as_ref()) {
            live.sent(chunk.len());
        }
        Ok(None)
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, _error: &Error) -> bool {
        // `logging` writes one line per request, errors included, at the right level.
        true
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let (status, message) = error_answer(e);
        if status != 0 && session.response_written().is_none() {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            if let Err(write_error) = respond(session, status, message, &[]).await {
                info!(route = ctx.route_name(), error = %write_error, "could not send the error answer");
            }
        }
        FailToProxy { error_code: status, can_reuse_downstream: false }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        // What reached the client's connection, not what the body filter handed on.
        let sent = session.body_bytes_sent() as u64;
        let mut completed = None;
        if let Some(delivery) = ctx.delivery(sent, e.is_none()).filter(|_| sent > 0) {
            // A store outage is reported by the store's health, once; the response is done.
            let complete = |s: &DownloadSession| {
                s.of_version(&delivery.version).is_some_and(|sent| sent.is_complete())
            };
            let was_complete =
                ctx.download.as_ref().and_then(|d| d.session.as_ref()).is_some_and(complete);
            // Completed by pieces: one response of the whole version showed the stages all of it.
            if let Ok(session) = self.store.record(&delivery).await
                && complete(&session)
                && !was_complete
                && delivery.range != ByteRange::whole(delivery.version.size)
            {
                completed = Some(delivery.origin_version);
            }
        }
        // Recorded: the admin API shows the store's record of the response from now on.
        ctx.live = None;
        if let (Some(pass), Some(route), Some(download)) = (&ctx.pass, &ctx.route, &ctx.download) {
            // A store outage is reported by the store's health; what was learned is learned again.
            let _ = pass.record(self.store.as_ref(), &route.stage_keys, &download.object).await;
            if let Some(key) = ctx.forget_stage.and_then(|index| route.stage_keys.get(index)) {
                let _ = self.store.forget(&download.object, key).await;
            }
        }
        // A download just completed on a route whose stages only observe: if its pieces left a
        // digest unfinished, finish it from the origin (see completion.rs).
        if let (Some(version), Some(route), Some(download)) = (completed, &ctx.route, &ctx.download)
            && ctx.chain().is_some_and(Chain::is_observing_only)
            && route.chain.stages().iter().any(|stage| stage.whole_digests() > 0)
        {
            let unfinished = Unfinished {
                route: Arc::clone(route),
                object: download.object.clone(),
                path: ctx.object_path.clone(),
                target: ctx.upstream_target.clone(),
                version,
            };
            self.completions.start(Arc::clone(&self.store), unfinished);
        }
        let route = ctx.route_name();
        let elapsed = ctx.started.elapsed();
        self.metrics.request(route, status, sent, elapsed);
        if ctx.spliced > 0 {
            self.metrics.spliced(route, ctx.spliced);
        }
        let req = session.req_header();
        let asked = req.headers.get(header::RANGE).and_then(|v| v.to_str().ok()).unwrap_or("-");
        let upstream_ms = ctx.upstream_header.map(|d| d.as_secs_f64() * 1000.0);
        // Formatted only when the line is written (tracing evaluates fields of enabled events).
        let client = session.client_addr().map(tracing::field::display);
        match e {
            None => info!(
                target: "rangeway::access",
                route, method = %req.method, path = %req.uri, status,
                range_asked = asked, range_served = %ctx.served, bytes = sent,
                upstream_status = ctx.upstream_status, upstream_ms, total_ms = elapsed.as_secs_f64() * 1000.0,
                client, refused = ctx.refusal,
            ),
            Some(e) if is_client_abort(e) => info!(
                target: "rangeway::access",
                route, method = %req.method, path = %req.uri, status,
                range_asked = asked, range_served = %ctx.served, bytes = sent,
                total_ms = elapsed.as_secs_f64() * 1000.0, client,
                "client went away before the end of the response"
            ),
            Some(e) => {
                if *e.esource() == ErrorSource::Upstream {
                    self.metrics.upstream_error(route, error_kind(e));
                }
                warn!(
                    target: "rangeway::access",
                    route, method = %req.method, path = %req.uri, status,
                    range_asked = asked, range_served = %ctx.served, bytes = sent,
                    upstream_status = ctx.upstream_status, total_ms = elapsed.as_secs_f64() * 1000.0,
                    client, error = %e,
                )
            }
        }
    }
}

/// Runs `work` where it may block for milliseconds without stalling the other connections of
/// this thread: `block_in_place` hands the thread's other tasks to another worker first. Only a
/// multi-threaded runtime (pingora's default) allows it; elsewhere the work runs in place.
fn off_the_event_loop<T>(blocks: bool, work: impl FnOnce() -> T) -> T {
    let multi_thread = || {
        tokio::runtime::Handle::try_current().is_ok_and(|handle| {
            handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        })
    };
    if blocks && multi_thread() { tokio::task::block_in_place(work) } else { work() }
}

/// `attachment; filename="NAME.EXT"` for a chain that names its output (`.gz`): the last
/// segment of the object's path with the stages' extensions, when it is a plain name.
fn content_disposition(path: &str, chain: &Chain) -> Option<String> {
    let mut name = path.rsplit('/').next().filter(|name| !name.is_empty())?.to_owned();
    let mut extended = false;
    for extension in chain.file_extensions() {
        name.push('.');
        name.push_str(extension);
        extended = true;
    }
    let plain = name.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' && b != b'%');
    (extended && plain).then(|| format!("attachment; filename=\"{name}\""))
}

/// The one range from the first of `ranges` (sorted, as resolved) to the end of the last: what a
/// chain produces once for a multipart answer.
fn covering(ranges: &[ByteRange]) -> Option<ByteRange> {
    ByteRange::new(ranges.first()?.start(), ranges.last()?.end())
}

/// Two pieces of output as one.
fn join(first: Option<Bytes>, second: Option<Bytes>) -> Option<Bytes> {
    match (first, second) {
        (Some(first), Some(second)) => {
            let mut joined = BytesMut::with_capacity(first.len() + second.len());
            joined.extend_from_slice(&first);
            joined.extend_from_slice(&second);
            Some(joined.freeze())
        }
        (first, second) => first.or(second),
    }
}

/// The answers without content to a range or a precondition: 416, 304, 412.
fn answer_without_body(
    response: &mut ResponseHeader,
    ctx: &mut RequestCtx,
    shape: &Shape,
) -> Result<()> {
    match shape {
        Shape::Unsatisfiable { complete_len } => {
            empty_answer(response, StatusCode::RANGE_NOT_SATISFIABLE)?;
            response
                .insert_header(header::CONTENT_RANGE, unsatisfied_content_range(*complete_len))?;
            response.insert_header(header::ACCEPT_RANGES, "bytes")?;
        }
        Shape::NotModified => {
            empty_answer(response, StatusCode::NOT_MODIFIED)?;
            response.remove_header(&header::CONTENT_LENGTH);
        }
        // PreconditionFailed; the callers pass no other shape.
        _ => empty_answer(response, StatusCode::PRECONDITION_FAILED)?,
    }
    ctx.body = BodyPlan::Discard;
    Ok(())
}

/// Refuses a resume whose object changed since its download began (412).
fn refuse_changed(response: &mut ResponseHeader, ctx: &mut RequestCtx, id: &str) -> Result<()> {
    empty_answer(response, StatusCode::PRECONDITION_FAILED)?;
    response.insert_header(
        "x-rangeway-error",
        "the object changed since this download began; download it again from the start",
    )?;
    response.insert_header(DOWNLOAD_ID, id)?;
    ctx.body = BodyPlan::Discard;
    Ok(())
}

/// Why a request's header is over the client limits, if it is.
fn header_over_limits(req: &RequestHeader, limits: &ClientLimits) -> Option<&'static str> {
    if req.headers.len() > limits.max_header_fields {
        return Some("the request has more header fields than max_header_fields allows\n");
    }
    // As on the wire: `METHOD SP target SP HTTP/1.1 CRLF`, then `name: value CRLF` per field.
    let line = req.method.as_str().len() + req.raw_path().len() + 11;
    let fields: usize =
        req.headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    (line + fields > limits.max_header_bytes)
        .then_some("the request header is larger than max_header_bytes allows\n")
}

/// An upstream answer as it leaves this hop: its connection's fields dropped, `Via` added.
fn forwarded(response: &mut ResponseHeader) -> Result<()> {
    for name in &HOP_BY_HOP {
        response.remove_header(name);
    }
    response.append_header(header::VIA, HeaderValue::from_static(VIA))?;
    Ok(())
}

/// Removes from a request rangeway sends itself what concerns only the client's connection: the
/// fields its `Connection` names (but the ones rangeway sets itself) and the hop-by-hop fields
/// (RFC 9110 §7.6.1), as pingora does to the requests it proxies. A client's `Connection: close`
/// would otherwise close the pooled origin connection too.
fn strip_hop_by_hop(request: &mut RequestHeader) {
    let nominated: Vec<header::HeaderName> = request
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|byte| *byte == b','))
        .filter_map(|token| header::HeaderName::from_bytes(token.trim_ascii()).ok())
        .filter(|name| {
            !matches!(
                name.as_str(),
                "host" | "x-forwarded-for" | "x-forwarded-host" | "x-forwarded-proto" | "via"
            )
        })
        .collect();
    for name in &nominated {
        request.remove_header(name);
    }
    for name in HOP_BY_HOP.iter().chain(&REQUEST_HOP_BY_HOP) {
        request.remove_header(name);
    }
}

/// Removes S3's `x-amz-checksum-*` fields: digests of the origin's whole object.
fn remove_whole_object_checksums(response: &mut ResponseHeader) {
    let names: Vec<header::HeaderName> = response
        .headers
        .keys()
        .filter(|name| name.as_str().starts_with("x-amz-checksum-"))
        .cloned()
        .collect();
    for name in names {
        response.remove_header(&name);
    }
}

/// Which bytes of the object an upstream 200 or 206 body holds, when it says.
fn upstream_stream(status: u16, headers: &http::HeaderMap) -> Option<ByteRange> {
    match status {
        200 => crate::range::content_length(headers).map(ByteRange::whole),
        206 => match parse_content_range(headers.get(header::CONTENT_RANGE)?.as_bytes())? {
            ContentRange::Satisfied { range, .. } => Some(range),
            ContentRange::Unsatisfied { .. } => None,
        },
        _ => None,
    }
}

/// On a route with middleware, what to ask the upstream for. A route whose stages only observe
/// asks for the client's range, started earlier when that lets a hash go on from a stored state
/// (the extra bytes are not sent). A route that transforms asks for the origin bytes its chain
/// needs for the client's range, planned against the version the store knows, with If-Range on
/// it; without a known version, a plan or a plain range, it asks for the whole object.
fn plan_upstream(
    ctx: &mut RequestCtx,
    route: &Route,
    current: Option<&crate::state::ObjectVersion>,
    known: &Known,
    request: &http::HeaderMap,
) {
    let observing = route.chain.is_observing_only();
    if !observing {
        ctx.sent_range = None;
    }
    let ClientRange::Bytes(set) = &ctx.client_range else { return };
    if observing {
        if let [spec] = set.specs() {
            let size = current.map(|v| v.size);
            let widened = match *spec {
                RangeSpec::Closed { first, last } => {
                    RangeSpec::Closed { first: known.hash_start(first, size), last }
                }
                RangeSpec::From { first } => {
                    RangeSpec::From { first: known.hash_start(first, size) }
                }
                RangeSpec::Suffix { .. } => *spec,
            };
            ctx.sent_range = Some(widened);
        }
        return;
    }
    let Some(current) = current.filter(|v| v.strong) else { return };
    if request.contains_key(header::IF_RANGE) || route.chain.content_coding().is_some() {
        return;
    }
    let object = StageObject {
        route: &route.name,
        path: &ctx.object_path,
        strong_etag: current.etag.as_deref(),
        len: current.size,
    };
    let learned = known.learned();
    let Some(output_len) = route.chain.output_len(&object, &learned) else { return };
    let covering = match set.resolve(output_len) {
        Resolution::Single(range) => Some(range),
        Resolution::Multiple(ranges) => covering(&ranges),
        Resolution::Unsatisfiable => None,
    };
    let Some(covering) = covering else { return };
    let Ok(plan) = route.chain.plan(covering, &object, &learned) else { return };
    if let Some(last) = plan.origin().last() {
        ctx.sent_range = Some(RangeSpec::Closed { first: plan.origin().start(), last });
        ctx.planned_for = current.etag.clone();
    }
}

/// Ranges far apart are not read through: fetched apart where rangeway relays the body and knows
/// the object's version to pin them to (the first stretch asked for with `If-Range` on it, the
/// rest after it, see `relay`), else the Range is ignored — a 200 costs what the client takes.
fn plan_parts(
    ctx: &mut RequestCtx,
    current: Option<&ObjectVersion>,
    relayed: bool,
    request: &http::HeaderMap,
) {
    let ClientRange::Bytes(set) = &ctx.client_range else { return };
    let fetches = current.map(|version| set.fetches(version.size, PART_GAP));
    let apart = match &fetches {
        Some(fetches) => fetches.len() > 1,
        None => !set.lies_together(PART_GAP),
    };
    if !apart {
        return;
    }
    let pinned = current.filter(|v| v.strong).and_then(|v| v.etag.clone());
    let first = fetches.and_then(|fetches| fetches.first().copied());
    match (first.zip(first.and_then(|f| f.last())), pinned) {
        (Some((first, last)), Some(etag)) if relayed && !request.contains_key(header::IF_RANGE) => {
            ctx.sent_range = Some(RangeSpec::Closed { first: first.start(), last });
            ctx.planned_for = Some(etag);
            ctx.part_gap = Some(PART_GAP);
        }
        _ => {
            ctx.client_range = ClientRange::Ignored(IgnoreReason::Sparse);
            ctx.sent_range = None;
        }
    }
}

/// Turns an upstream answer into a 206 for `range`.
fn set_partial(response: &mut ResponseHeader, len: u64, content_range: &str) -> Result<()> {
    response.set_status(StatusCode::PARTIAL_CONTENT)?;
    response.remove_header(&header::TRANSFER_ENCODING);
    response.insert_header(header::CONTENT_RANGE, content_range)?;
    response.insert_header(header::CONTENT_LENGTH, len)?;
    response.insert_header(header::ACCEPT_RANGES, "bytes")?;
    Ok(())
}

/// Turns an upstream answer into one with `status` and no content.
fn empty_answer(response: &mut ResponseHeader, status: StatusCode) -> Result<()> {
    response.set_status(status)?;
    for name in [
        header::TRANSFER_ENCODING,
        header::CONTENT_RANGE,
        header::CONTENT_TYPE,
        header::CONTENT_ENCODING,
    ] {
        response.remove_header(&name);
    }
    response.insert_header(header::CONTENT_LENGTH, 0)?;
    Ok(())
}

/// A multipart boundary that depends only on what is sent, so a repeated request gets the same
/// bytes; 64 bits of SHA-256 make a collision with content as unlikely as a random one.
fn boundary(ranges: &[ByteRange], complete_len: u64) -> String {
    let numbers: Vec<[u8; 8]> = std::iter::once(complete_len)
        .chain(ranges.iter().flat_map(|r| [r.start(), r.end()]))
        .map(u64::to_be_bytes)
        .collect();
    format!("rangeway-{}", fingerprint(numbers.iter().map(|n| &n[..]), 8))
}

/// A short answer of rangeway's own.
async fn respond(
    session: &mut Session,
    status: StatusCode,
    message: &str,
    extra: &[(header::HeaderName, &str)],
) -> Result<()> {
    let mut response = ResponseHeader::build(status, Some(4 + extra.len()))?;
    response.insert_header(header::CONTENT_TYPE, "text/plain; charset=utf-8")?;
    response.insert_header(header::CONTENT_LENGTH, message.len())?;
    response.insert_header(header::VIA, VIA)?;
    for (name, value) in extra {
        response.insert_header(
            name.clone(),
            HeaderValue::from_str(value)
                .map_err(|e| Error::because(ErrorType::InternalError, "header", e))?,
        )?;
    }
    let head_only = session.req_header().method == Method::HEAD;
    session.write_response_header(Box::new(response), head_only).await?;
    if !head_only {
        session.write_response_body(Some(Bytes::copy_from_slice(message.as_bytes())), true).await?;
    }
    Ok(())
}

/// The status and message for a request that failed; 0 when the client is already gone.
fn error_answer(e: &Error) -> (u16, &'static str) {
    use ErrorType::*;
    match e.etype() {
        HTTPStatus(code) => (*code, "request failed\n"),
        Custom(ORIGIN_DIGEST_MISMATCH) => {
            (502, "rangeway: the upstream's body does not match the digest it published\n")
        }
        _ if is_client_abort(e) => (0, ""),
        InvalidCert | TLSHandshakeFailure | TLSWantX509Lookup | HandshakeError => {
            (502, "rangeway: the upstream's TLS certificate was not accepted\n")
        }
        ConnectTimedout | TLSHandshakeTimedout => {
            (504, "rangeway: connecting to the upstream timed out\n")
        }
        ReadTimedout | WriteTimedout if *e.esource() == ErrorSource::Upstream => {
            (504, "rangeway: the upstream did not answer in time\n")
        }
        ConnectRefused | ConnectNoRoute | ConnectError => {
            (502, "rangeway: cannot connect to the upstream\n")
        }
        _ => match e.esource() {
            ErrorSource::Upstream => (502, "rangeway: the upstream failed\n"),
            ErrorSource::Downstream => (400, "rangeway: bad request\n"),
            ErrorSource::Internal | ErrorSource::Unset => (500, "rangeway: internal error\n"),
        },
    }
}

fn is_client_abort(e: &Error) -> bool {
    *e.esource() == ErrorSource::Downstream
        && matches!(
            e.etype(),
            ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed
        )
}

/// A metric label for an upstream failure.
fn error_kind(e: &Error) -> &'static str {
    use ErrorType::*;
    match e.etype() {
        InvalidCert | TLSHandshakeFailure | TLSWantX509Lookup | HandshakeError
        | TLSHandshakeTimedout => "tls",
        ConnectTimedout | ConnectRefused | ConnectNoRoute | ConnectError => "connect",
        ReadTimedout | WriteTimedout => "timeout",
        ConnectionClosed | ReadError | WriteError => "io",
        _ => "protocol",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_request_loses_what_concerns_the_client_connection_only() {
        let mut request = RequestHeader::build("GET", b"/obj", None).unwrap();
        for (name, value) in [
            ("Host", "origin"),
            ("Connection", "close, X-Private, host"),
            ("Connection", "x-forwarded-for"),
            ("X-Private", "1"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Upgrade", "h2c"),
            ("Range", "bytes=0-9"),
        ] {
            request.append_header(name, value).unwrap();
        }
        strip_hop_by_hop(&mut request);
        let mut left: Vec<&str> = request.headers.keys().map(|name| name.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "range", "x-forwarded-for"]);
    }
}
