//! The client's answer shaped from the upstream's: the transformed representation's, the observed
//! one's, multipart bodies, refusals of answers that cannot be made correct.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderValue, Method, StatusCode, header};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::{Chain, Learned, ObjectVersion as StageObject};
use rangeway_middleware::checksum::want_repr_digest_sha256;
use rangeway_middleware::rfc9110::{
    IgnoreReason, MultipartBody, MultipartPlan, RangeSet, content_range,
};
use tracing::warn;

use super::Proxy;
use super::answer::{ACCEPT_BYTES, answer_without_body, empty_answer, refuse_changed, set_partial};
use super::client_session::{ClientSession, ClientWatch};
use super::context::{BodyPlan, RequestCtx};
use super::hop_by_hop::forwarded;
use crate::cache::{CacheBody, Outcome, OutputWriter, SliceCache, Version};
use crate::client_socket::ClientSocket;
use crate::fingerprint::fingerprint;
use crate::range::{
    Asked, ClientRange, PART_GAP, Shape, body_range, covering, shape_response, validators,
};
use crate::representation::{
    ChainPass, ORIGIN_DIGEST_HEADERS, StoredFacts, digest_headers, representation_etag, version_key,
};
use crate::routes::Route;
use crate::state::{Ending, ObjectVersion};
use crate::telemetry::metrics::Unvouched;

/// The fewest bytes a response must promise to be shown in the admin API while in flight. One
/// with fewer is over about as soon as it began (the relay holds its first 64 KiB before writing
/// anything); it shows once recorded, at its end. Registering it cost every small response a
/// copy of its download's record and a place in a shared map.
const LIVE_FROM: u64 = 256 * 1024;

impl Proxy {
    /// On a route whose stages only observe: publishes what the store knows (digests), and runs
    /// the stages over the upstream body to learn more.
    pub(super) fn observe(
        &self,
        session: &impl ClientSession,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        version: Option<&crate::state::ObjectVersion>,
        upstream_stream: Option<ByteRange>,
    ) -> Result<()> {
        let Some(version) = version else { return Ok(()) };
        let known = ctx.identity.known.take().unwrap_or_default().for_version(version_key(version));
        let path = ctx.identity.object_path.clone();
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
        if matches!(ctx.answer.body, BodyPlan::Discard) {
            return Ok(());
        }
        // Every chunk passes the stages as it is (they only look), before it is cut for the
        // client: the stages see the upstream's bytes at their places in the object.
        let plan = route.chain.plan(stream, &object, &known.learned()).map_err(|e| {
            Error::because(ErrorType::InternalError, "planning the route's middleware", e)
        })?;
        ctx.answer.pass =
            Some(ChainPass::start(&route.chain, &plan, &object, known, stream.start()).map_err(
                |e| Error::because(ErrorType::InternalError, "starting the route's middleware", e),
            )?);
        Ok(())
    }

    /// On a route that transforms: the transformed representation's answer. Its length, ETag and
    /// ranges come from the chain and the origin's version; the client's range and validators
    /// are evaluated against them; the chain is started for the output range to send — or, when
    /// the slice cache keeps that range of the representation, its bytes are returned: the
    /// answer's body in place of the source's.
    pub(super) fn transformed_response(
        &self,
        session: &impl ClientSession,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        version: Option<crate::state::ObjectVersion>,
    ) -> Result<Option<Box<CacheBody>>> {
        let status = response.status.as_u16();
        forwarded(response)?;
        if !matches!(status, 200 | 206) {
            // Errors, 304 (If-Modified-Since holds for both representations), and refusals of
            // the planned range: nothing of the origin's bytes is sent.
            response.remove_header(&header::ETAG);
            response.remove_header(&header::CONTENT_RANGE);
            return Ok(None);
        }
        let stream = body_range(status, &response.headers);
        let (Some(version), Some(stream)) = (version, stream) else {
            let reason =
                "the upstream did not say the object's length, which the route's middleware needs";
            self.refuse(response, ctx, &route.name, reason)?;
            return Ok(None);
        };
        let made = Representation::of(ctx, route, version, stream);
        // The representation's own version: what a download of it is of.
        let delivered = made.delivered();
        if self.refuse_changed_representation(response, ctx, route, &made, delivered.as_ref())? {
            return Ok(None);
        }
        let req = session.req_header();
        let coding = route.chain.content_coding();
        let shape = representation_shape(req, response, ctx, &made, coding);
        representation_fields(response, route, &made, coding)?;
        let ControlFlow::Continue(output) =
            self.cut_representation(response, ctx, route, shape, &made)?
        else {
            return Ok(None);
        };
        let want = want_repr_digest_sha256(
            req.headers.get_all("want-repr-digest").iter().map(HeaderValue::as_bytes),
        );
        for (name, value) in digest_headers(&route.chain, &made.known, &made.lens, want) {
            response.insert_header(name, value)?;
        }
        let parts = ctx.answer.multipart_span();
        if let Some(download) = ctx.identity.download.as_mut() {
            download.note_response(response, delivered, parts)?;
            download.origin_version = Some(made.version.clone());
        }
        if req.method != Method::GET || matches!(ctx.answer.body, BodyPlan::Discard) {
            ctx.answer.body = BodyPlan::Discard;
            return Ok(None);
        }
        self.start_representation(response, ctx, route, made, output)
    }

    /// Resume safety, as for the origin's own bytes: a bare resume the representation may not
    /// follow is refused (`true`).
    fn refuse_changed_representation(
        &self,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        made: &Representation,
        delivered: Option<&ObjectVersion>,
    ) -> Result<bool> {
        if let Some(download) = ctx.identity.download.as_mut()
            && let Some(resume_version) = download.resume_version.take()
            && !delivered.is_some_and(|delivered| delivered.same_as(&resume_version))
        {
            self.metrics.resume_refused(&route.name);
            let id = download.id.clone();
            // The representation's ETag, as on its answers: the origin's is not its to show (on
            // an encrypting route it would tell what the ciphertext hides).
            response.remove_header(&header::ETAG);
            if let Some(etag) = made.etag.as_deref().and_then(|e| HeaderValue::from_str(e).ok()) {
                response.insert_header(header::ETAG, etag)?;
            }
            refuse_changed(response, ctx, &id)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// The answer as `shape` says, for the representation: whole, one range, multipart, without
    /// content — with the range of the representation to send, if any — or refused (`Break`).
    fn cut_representation(
        &self,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        shape: Shape,
        made: &Representation,
    ) -> Result<ControlFlow<(), Option<ByteRange>>> {
        let output = match shape {
            Shape::Forward => {
                if ctx.identity.lost_session.is_some()
                    && matches!(ctx.identity.client_range, ClientRange::Bytes(_))
                {
                    self.unvouched(ctx, &route.name, Unvouched::Whole);
                }
                response.set_status(StatusCode::OK)?;
                match made.output_len {
                    Some(len) => response.insert_header(header::CONTENT_LENGTH, len)?,
                    None => response.insert_header(header::TRANSFER_ENCODING, "chunked")?,
                }
                if made.rangeable(route.chain.content_coding()) {
                    response.insert_header(header::ACCEPT_RANGES, ACCEPT_BYTES)?;
                }
                made.output_len.map(ByteRange::whole)
            }
            Shape::Single { range, complete_len, .. } => {
                let value = content_range(range, complete_len);
                set_partial(response, range.len(), &value)?;
                ctx.answer.served_range = value.into();
                Some(range)
            }
            Shape::Multiple { ranges, complete_len, .. } => {
                let Some(covering) = covering(&ranges) else {
                    self.refuse(response, ctx, &route.name, "no ranges to send")?;
                    return Ok(ControlFlow::Break(()));
                };
                self.multipart(response, ctx, &ranges, complete_len, covering.start())?;
                Some(covering)
            }
            Shape::BadGateway(reason) => {
                self.refuse(response, ctx, &route.name, reason)?;
                return Ok(ControlFlow::Break(()));
            }
            shape @ (Shape::Unsatisfiable { .. }
            | Shape::NotModified
            | Shape::PreconditionFailed) => {
                answer_without_body(response, ctx, &shape)?;
                None
            }
        };
        Ok(ControlFlow::Continue(output))
    }

    /// The chain planned for the `output` range of the representation (the whole without one);
    /// then that range's bytes when the slice cache keeps them all — returned, the stages not
    /// run — or else the stages started, what they make kept by the cache for the next request
    /// where it keeps the representation.
    fn start_representation(
        &self,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        made: Representation,
        output: Option<ByteRange>,
    ) -> Result<Option<Box<CacheBody>>> {
        let Representation { version, stream, path, known, learned, output_len, etag, .. } = made;
        let object = stage_object(&route.name, &path, &version);
        let plan = match output {
            Some(output) => route.chain.plan(output, &object, &learned),
            None => Ok(route.chain.plan_whole(&object, &learned)),
        };
        let plan = match plan {
            Ok(plan) if stream.contains_range(&plan.origin()) => plan,
            Ok(_) => {
                let reason = "the upstream's answer does not hold the bytes the middleware needs";
                self.refuse(response, ctx, &route.name, reason)?;
                return Ok(None);
            }
            Err(error) => {
                warn!(route = %route.name, %error, "the route's middleware cannot plan this response");
                self.refuse(response, ctx, &route.name, "the middleware cannot plan this range")?;
                return Ok(None);
            }
        };
        // The representation's bytes, when the cache keeps them all: the stages need not run.
        if let Some(hit) = self.cached_representation(ctx, route, etag.as_deref(), output_len) {
            match hit.cached_output(plan.output(), &route.name) {
                Some(output) => {
                    ctx.upstream.cache = Some(Outcome::Hit);
                    response.insert_header("x-rangeway-cache", Outcome::Hit.name())?;
                    return Ok(Some(output));
                }
                None => ctx.answer.output_writer = Some(hit.writer(plan.output().start())),
            }
        }
        // The stages make this answer: whatever the cache did for the origin's bytes, the
        // answer's own did not come from it.
        response.remove_header("x-rangeway-cache");
        let pass = ChainPass::start(&route.chain, &plan, &object, known, stream.start())
            .map_err(|e| Error::because(ErrorType::InternalError, "starting the middleware", e))?;
        ctx.answer.pass = Some(pass);
        Ok(None)
    }

    /// The slice cache's view of a transformed representation (`etag`, `len`), on a route that
    /// transforms through the cache, of an object whose own answer the cache keeps (one an origin
    /// says a shared cache may not keep, none of its representations may either).
    fn cached_representation(
        &self,
        ctx: &RequestCtx,
        route: &Route,
        etag: Option<&str>,
        len: Option<u64>,
    ) -> Option<CachedRepresentation> {
        let (cache, etag, len) = (self.cache.as_ref()?, etag?, len?);
        let kept =
            matches!(ctx.upstream.cache, Some(outcome) if !matches!(outcome, Outcome::Bypass(_)));
        if !kept || route.cache.is_none() || route.chain.is_observing_only() {
            return None;
        }
        let made_by =
            (route.upstream.name(), ctx.identity.upstream_target.as_str(), route.chain.identity());
        let version = cache.representation(made_by, etag, len, &http::HeaderMap::new());
        Some(CachedRepresentation { cache: Arc::clone(cache), version })
    }

    /// Shows the response in the admin API while it is in flight, when it delivers to a download.
    /// On HTTP/1 the live view holds the client watch's duplicate of the client's socket, so that
    /// it counts what the client took, not what was written ahead of it (see
    /// `telemetry::live::LiveResponse`).
    pub(super) fn go_live(&self, watch: &ClientWatch, ctx: &mut RequestCtx) {
        if matches!(ctx.answer.body, BodyPlan::Discard) {
            return;
        }
        let promised = ctx.identity.download.as_ref().and_then(|d| d.delivering.as_ref());
        if promised.is_none_or(|delivering| delivering.range.len() < LIVE_FROM) {
            return;
        }
        // What the response will record at its end, before any byte went out; the parts of a
        // multipart answer are not shown as they go.
        if let Some(delivery) =
            ctx.identity.delivery(0, false).filter(|d| d.ending != Ending::Parts)
        {
            let client = watch.socket().map(ClientSocket::shared_fd);
            ctx.answer.live = Some(self.live.register(delivery, client));
        }
    }

    /// Answers 502 for an upstream answer that cannot be made into a correct response.
    pub(super) fn refuse(
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
        ctx.answer.body = BodyPlan::Discard;
        Ok(())
    }

    /// Makes `response` a multipart/byteranges answer of `ranges`, cut from a stream that starts
    /// at `stream_start`.
    pub(super) fn multipart(
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
        response.insert_header(header::ACCEPT_RANGES, ACCEPT_BYTES)?;
        ctx.answer.served_range = format!("multipart ({} ranges)", ranges.len()).into();
        ctx.answer.body = BodyPlan::Multipart(Box::new(multipart));
        Ok(())
    }
}

/// A representation the cache keeps, or will.
struct CachedRepresentation {
    cache: Arc<SliceCache>,
    version: Arc<Version>,
}

impl CachedRepresentation {
    fn cached_output(&self, range: ByteRange, route: &str) -> Option<Box<CacheBody>> {
        self.cache.cached_output(&self.version, range, route)
    }

    fn writer(&self, at: u64) -> OutputWriter {
        self.cache.output_writer(&self.version, at)
    }
}

/// What a transformed answer is made from: the origin's version, what the store knows of it,
/// and the representation the route's chain makes of it.
struct Representation {
    /// The origin's version.
    version: ObjectVersion,
    /// Which bytes of the object the upstream's body holds.
    stream: ByteRange,
    /// The object's path on the upstream, as the stages are told it.
    path: String,
    known: StoredFacts,
    learned: Learned,
    /// Each stage's output length, where known.
    lens: Vec<Option<u64>>,
    /// The representation's length, where known.
    output_len: Option<u64>,
    /// The representation's ETag, made from the origin's strong one.
    etag: Option<String>,
}

impl Representation {
    /// The representation of `version` the route's chain makes, with what the store knows.
    fn of(ctx: &mut RequestCtx, route: &Route, version: ObjectVersion, stream: ByteRange) -> Self {
        let known =
            ctx.identity.known.take().unwrap_or_default().for_version(version_key(&version));
        let path = ctx.identity.object_path.clone();
        let learned = known.learned();
        let lens = route.chain.lengths(&stage_object(&route.name, &path, &version), &learned);
        let output_len = lens.last().copied().flatten();
        let strong_etag = version.etag.as_deref().filter(|_| version.strong);
        let etag = strong_etag.map(|etag| representation_etag(etag, &route.chain));
        Self { version, stream, path, known, learned, lens, output_len, etag }
    }

    /// The representation's own version: what a download of it is of.
    fn delivered(&self) -> Option<ObjectVersion> {
        self.output_len.map(|size| ObjectVersion {
            etag: self.etag.clone(),
            strong: self.etag.is_some(),
            size,
            last_modified: self.version.last_modified,
            content_type: self.version.content_type.clone(),
        })
    }

    /// Whether it is answered in ranges: only what can be made again byte for byte — a version
    /// pinned by a strong ETag, of a known length — and never a content `coding`, which clients
    /// decode as it comes and would resume at decoded offsets.
    fn rangeable(&self, coding: Option<&str>) -> bool {
        self.etag.is_some() && self.output_len.is_some() && coding.is_none()
    }
}

/// The object version of `route` at `path` as the stages are told it.
fn stage_object<'a>(route: &'a str, path: &'a str, version: &'a ObjectVersion) -> StageObject<'a> {
    let strong_etag = version.etag.as_deref().filter(|_| version.strong);
    StageObject { route, path, strong_etag, len: version.size }
}

/// What the client asked, judged (RFC 9110) against the representation rather than the origin's
/// answer: its validators, its length, its ranges where it is [`Representation::rangeable`].
fn representation_shape(
    req: &RequestHeader,
    response: &ResponseHeader,
    ctx: &RequestCtx,
    made: &Representation,
    coding: Option<&str>,
) -> Shape {
    let rangeable = made.rangeable(coding);
    let mut own = http::HeaderMap::new();
    if let Some(etag) = made.etag.as_deref().and_then(|e| HeaderValue::from_str(e).ok()) {
        own.insert(header::ETAG, etag);
    }
    if let Some(modified) = response.headers.get(header::LAST_MODIFIED) {
        own.insert(header::LAST_MODIFIED, modified.clone());
    }
    if let Some(len) = made.output_len {
        own.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    // Ranges far apart would make the stages produce everything between them: answered whole
    // instead, which costs what the client takes (see `plan_parts`).
    let together =
        |set: &RangeSet| made.output_len.is_some_and(|len| set.fetches(len, PART_GAP).len() <= 1);
    let client_range = match &ctx.identity.client_range {
        ClientRange::Bytes(set) if rangeable && !together(set) => {
            ClientRange::Ignored(IgnoreReason::Sparse)
        }
        range if rangeable => range.clone(),
        _ => ClientRange::Absent,
    };
    let asked = Asked {
        method: &req.method,
        headers: &req.headers,
        range: &client_range,
        sent: None,
        if_range_date_sent: false,
        part_gap: None,
        lost_sessions_since: ctx.identity.lost_session.filter(|l| !l.refuse).map(|l| l.since),
    };
    shape_response(&asked, 200, &own, &validators(&own), SystemTime::now())
}

/// The representation's own header fields in place of the origin's: its ETag, content coding,
/// media type and file name; none of the origin's digests, checksums, range or length.
fn representation_fields(
    response: &mut ResponseHeader,
    route: &Route,
    made: &Representation,
    coding: Option<&str>,
) -> Result<()> {
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
    if let Some(etag) = &made.etag {
        response.insert_header(header::ETAG, etag.as_str())?;
    }
    if let Some(coding) = coding {
        response.insert_header(header::CONTENT_ENCODING, coding)?;
    }
    if let Some(media_type) = route.chain.media_type() {
        response.insert_header(header::CONTENT_TYPE, media_type)?;
    }
    if let Some(disposition) = content_disposition(&made.path, &route.chain) {
        response.insert_header(header::CONTENT_DISPOSITION, disposition)?;
    }
    Ok(())
}

/// `attachment; filename="NAME.EXT"` for a chain that names its output (`.gz`): the last
/// segment of the object's path with the stages' extensions, when it is a plain name.
pub(super) fn content_disposition(path: &str, chain: &Chain) -> Option<String> {
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

/// A multipart boundary that depends only on what is sent, so a repeated request gets the same
/// bytes; 64 bits of SHA-256 make a collision with content as unlikely as a random one.
pub(super) fn boundary(ranges: &[ByteRange], complete_len: u64) -> String {
    let numbers: Vec<[u8; 8]> = std::iter::once(complete_len)
        .chain(ranges.iter().flat_map(|r| [r.start(), r.end()]))
        .map(u64::to_be_bytes)
        .collect();
    format!("rangeway-{}", fingerprint(numbers.iter().map(|n| &n[..]), 8))
}

/// Removes S3's `x-amz-checksum-*` fields: digests of the origin's whole object.
pub(super) fn remove_whole_object_checksums(response: &mut ResponseHeader) {
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
