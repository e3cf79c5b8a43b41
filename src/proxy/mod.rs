//! The proxy: pingora's `ProxyHttp` for rangeway. This file holds the phases, in the order a
//! request goes through them; what they call lives beside it.
//!
//! [`Proxy`] is built once from config (routes, upstreams, limits, metrics, the store);
//! `RequestCtx` (context.rs) is the per-request state pingora threads through the phases: route
//! and parse in `request_filter`, which also chooses the way the answer takes (transport.rs) and
//! plans the upstream Range; the relay (relay.rs, from `proxy_upstream_filter`) sends it; check
//! the upstream's answer and shape the client's in `response_filter` (shaping.rs); cut the body
//! in `response_body_filter` (synchronous, no allocation on passthrough); record in `logging`.
//! Each way an answer can take — the relay, splice, sendfile — is followed step by step in
//! `LIFECYCLE.md` beside this file; `docs/architecture.md` has the whole.

mod answer;
mod completion;
mod context;
pub mod download;
mod grace;
mod hop_by_hop;
mod negotiation;
mod origin_digest;
mod origin_request;
mod pace;
mod plan;
mod relay;
mod s3;
mod shaping;
mod splice;
mod traced;
mod transport;
mod under_way;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Method, StatusCode, header};
use pingora_core::modules::http::HttpModules;
use pingora_core::protocols::http::ServerSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use rangeway_middleware::chain::{Chain, ChainError, StageError};
use rangeway_middleware::rfc9110::{RangeLimits, content_range};
use rangeway_middleware::{ByteRange, Window};
use tracing::{info, warn};

use crate::admin::live::LiveResponses;
use crate::admin::metrics::{Metrics, Unvouched};
use crate::admission::ClientConnection;
use crate::cache::{Outcome, SliceCache};
use crate::client_address::{self, Client};
use crate::config::{ClientLimits, IpNet};
use crate::fingerprint::FingerprintKey;
use crate::links;
use crate::range::{Asked, ClientRange, IfRangeDate, Shape, shape_response, validators};
use crate::representation::{StoredFacts, version_key};
use crate::request_path::NormalizedPath;
use crate::routes::RouteSwitch;
use crate::routes::origin_client::OriginClient;
use crate::s3::verify as s3_verify;
use crate::state::unix_now;
use crate::state::{DownloadSession, Holding, Resumable, StateStore};
use crate::traces::{self, Traces};
use answer::{
    ACCEPT_BYTES, Lapsed, answer_without_body, declares_body, error_answer, error_kind,
    header_over_limits, is_client_abort, refuse_changed, refuse_lost_session, respond, set_partial,
};
use completion::{Completions, Unfinished};
use context::{BodyPlan, DownloadCtx, LostSession, RequestCtx, ip_text};
use download::{
    DownloadId, continues_past_start, download_id, holding, object_key, object_version,
};
use hop_by_hop::forwarded;
use origin_digest::{ORIGIN_DIGEST_MISMATCH, OriginDigestCheck};
use plan::{plan_parts, plan_upstream};
use relay::Continuable;
use shaping::{join, off_the_event_loop, remove_whole_object_checksums, upstream_stream};
use traced::{RequestTrace, StoreCall, request_span, store_span};
use tracing::Instrument as _;
use transport::Transport;

/// The proxy, built once from config and shared by every request.
#[derive(Debug)]
pub struct Proxy {
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
    /// The slice cache, when one is configured and open.
    cache: Option<Arc<SliceCache>>,
    /// The downloads under way, for routes with concurrent-download limits.
    under_way: Arc<under_way::UnderWay>,
    /// The rates shaped responses share (per client, per route).
    rates: Arc<pace::SharedRates>,
    /// Which requests are traced, when traces are on.
    traces: Option<Traces>,
    /// `server.trusted_proxies`: peers whose `X-Forwarded-For` names the client.
    trusted_proxies: Vec<IpNet>,
}

impl Proxy {
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
        let under_way = Arc::new(under_way::UnderWay::new(Some(Arc::clone(&store))));
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
            cache: None,
            under_way,
            rates: Arc::default(),
            traces: None,
            trusted_proxies: Vec::new(),
        }
    }

    /// The proxy, believing the `X-Forwarded-For` of peers in `trusted` (`server.trusted_proxies`).
    pub(crate) fn with_trusted_proxies(mut self, trusted: Vec<IpNet>) -> Self {
        self.trusted_proxies = trusted;
        self
    }

    /// The proxy, tracing requests as `traces` says (`None`: traces are off).
    pub(crate) fn with_traces(mut self, traces: Option<Traces>) -> Self {
        self.traces = traces;
        self
    }

    /// The proxy, with the slice cache its routes use.
    pub(crate) fn with_cache(mut self, cache: Option<Arc<SliceCache>>) -> Self {
        self.cache = cache;
        self
    }
}

#[async_trait]
impl ProxyHttp for Proxy {
    /// Boxed: pingora keeps the context in every response's future, which it boxes and moves
    /// (a copy of the whole future per request), and the context was a large part of it (see
    /// docs/benchmarks.md, "Boxed futures").
    type CTX = Box<RequestCtx>;

    fn init_downstream_modules(&self, _modules: &mut HttpModules) {
        // None: pingora's default is a compression module switched off, which rangeway (whose
        // codings are stages of a route's chain) never switches on; it cost every request a
        // box and a look at its Accept-Encoding.
    }

    fn new_ctx(&self) -> Self::CTX {
        Box::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        if let Some(traces) = &self.traces {
            ctx.trace = traces.start(&session.req_header().headers).map(RequestTrace::new);
        }
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
        ctx.client = session
            .client_addr()
            .and_then(|addr| addr.as_inet())
            .map(|addr| client_address::client(addr.ip(), &req.headers, &self.trusted_proxies));
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
        if declares_body(&req.headers) {
            // What follows the header on the connection may be read as anything: it ends here.
            session.set_keepalive(None);
            let problem = "a GET or HEAD request has no body: send it without one\n";
            let close = [(header::CONNECTION, "close")];
            respond(session, StatusCode::BAD_REQUEST, problem, &close).await?;
            return Ok(true);
        }
        let path = match NormalizedPath::parse(req.uri.path()) {
            Ok(path) => path,
            Err(e) => {
                respond(session, StatusCode::BAD_REQUEST, &format!("bad path: {e}\n"), &[]).await?;
                return Ok(true);
            }
        };
        let routes = self.routes.current();
        let Some(route) = routes.for_request(req, &path) else {
            respond(session, StatusCode::NOT_FOUND, "no route for this path\n", &[]).await?;
            return Ok(true);
        };
        // What runs out — a signed link, a presigned S3 URL — is refused once expired, except a
        // ranged GET within the route's grace that continues a download begun before the expiry
        // (checked against the download's session below).
        let now = unix_now();
        let resume_within = |expires: u64, grace: Duration| {
            req.method == Method::GET
                && req.headers.contains_key(header::RANGE)
                && now <= expires.saturating_add(grace.as_secs())
        };
        let mut lapsed = None;
        if let Some(keys) = &route.s3_client_keys {
            let target = req.uri.path_and_query().map_or("/", |p| p.as_str());
            let (method, headers, clock) = (req.method.as_str(), &req.headers, SystemTime::now());
            let checked = match s3_verify::is_presigned(target) {
                true => s3_verify::verify_presigned(keys, method, target, headers, clock).map(Some),
                false => s3_verify::verify(keys, method, target, headers, clock).map(|()| None),
            };
            match checked {
                Err(refusal) => {
                    info!(route = %route.name, code = refusal.code(), "refused an S3 client: {refusal}");
                    self.metrics.s3_client_refused(&route.name, refusal.reason());
                    let document = crate::s3::error::document(refusal.code(), &refusal.to_string());
                    let xml = [(header::CONTENT_TYPE, "application/xml")];
                    respond(session, StatusCode::FORBIDDEN, &document, &xml).await?;
                    return Ok(true);
                }
                Ok(Some(presigned)) if now > presigned.expires => {
                    let lapse = Lapsed::Presigned { expires: presigned.expires };
                    if !resume_within(presigned.expires, route.s3_presigned_grace) {
                        return self.refuse_lapsed(session, &route.name, lapse).await;
                    }
                    lapsed = Some(lapse);
                }
                Ok(_) => {}
            }
        }
        let client_ip = ctx.client.map(|client| client.ip);
        let mut link = None;
        if let Some(signed) = &route.signed_links {
            // Not signed: rangeway's `download_id` never reaches the origin, and a client may
            // name its download by header as well (a link binds one with `rw-id`).
            let query = req.uri.query().map(download::without_download_id);
            match links::verify(&signed.keys, &path.to_string(), query.as_deref(), client_ip, now) {
                Err(e) => {
                    self.metrics.link_refused(&route.name, e.reason());
                    let body = format!("{e}: ask whoever gave you the link for a new one\n");
                    respond(session, StatusCode::FORBIDDEN, &body, &[]).await?;
                    return Ok(true);
                }
                Ok(found) => {
                    if found.expired {
                        let lapse = Lapsed::Link { expires: found.terms.expires };
                        if !resume_within(found.terms.expires, signed.grace) {
                            return self.refuse_lapsed(session, &route.name, lapse).await;
                        }
                        lapsed = Some(lapse);
                    }
                    link = Some(found);
                }
            }
        }
        let mut target = route.upstream_path(&path);
        if route.upstream.names_no_s3_object(&target) {
            // S3 would list the bucket's keys: nothing a download route serves.
            respond(session, StatusCode::NOT_FOUND, "no object at this path\n", &[]).await?;
            return Ok(true);
        }
        let query = req.uri.query().map(|query| match route.upstream.is_s3() {
            true => s3::upstream_query(query, route.s3_response_overrides),
            false if link.is_some() => links::without_link(&download::without_download_id(query)),
            false => download::without_download_id(query),
        });
        if let Some(query) = query.filter(|q| !q.is_empty()) {
            target.push('?');
            target.push_str(&query);
        }
        ctx.client_range = ClientRange::from_request(&req.method, &req.headers, &self.range_limits);
        ctx.sent_range = ctx.client_range.upstream_spec();
        ctx.upstream_target = target;
        ctx.client_ip = client_ip.map(ip_text);
        ctx._active = Some(self.metrics.active_download());
        ctx.route = Some(Arc::clone(route));
        ctx.transport = Transport::choose(route);
        ctx.coding_declined = route
            .chain
            .content_coding()
            .is_some_and(|coding| !negotiation::accepts_coding(&req.headers, coding));
        let has_chain = !route.chain.stages().is_empty() && !ctx.coding_declined;
        // A bare resume the client may hold any of several versions for: refused below.
        let mut ambiguous = None;
        // An expired authorization whose download did not begin before it expired: refused below.
        let mut refused_lapse = None;
        // A download past the route's concurrent-download limits: refused below.
        let mut limited = None;
        if req.method == Method::GET || (has_chain && req.method == Method::HEAD) {
            let coding = route.chain.content_coding().filter(|_| has_chain);
            let object = object_key(&route.name, &path, coding);
            // A link made for one download names it: the grace of its expiry is that download's.
            let DownloadId { id, derived } = match link.as_ref().and_then(|l| l.terms.id.clone()) {
                Some(bound) => DownloadId { id: bound, derived: false },
                None => download_id(req, ctx.client_ip.as_deref(), &object, &self.id_key),
            };
            let ranged = matches!(ctx.client_range, ClientRange::Bytes(_));
            // Resume safety only for a bare resume: explicit validators keep their RFC meaning.
            let bare_resume = ranged
                && !req.headers.contains_key(header::IF_RANGE)
                && !req.headers.contains_key(header::IF_MATCH);
            // The one store round trip before the response, for requests that continue a
            // download and on routes whose stages learn. A store outage costs the resume hint
            // and the digests, never the response (the store reports it, once); the resumes it
            // cannot vouch for are refused or answered whole (`LostSession`).
            let lookup = if ranged || has_chain {
                let span = store_span(ctx.trace.as_ref(), StoreCall::Lookup);
                Some(self.store.lookup(&id, &object, &route.stage_keys).instrument(span).await)
            } else {
                None
            };
            // A bare resume past byte 0 with no session behind it continues whatever the client
            // began: safe to serve only while the store cannot have lost that session.
            let unvouched = bare_resume
                && continues_past_start(&ctx.client_range)
                && match &lookup {
                    Some(Ok(found)) => found.session_may_be_lost,
                    Some(Err(_)) | None => true,
                };
            let (stored, record, facts) = match lookup {
                Some(Ok(l)) => (l.session, l.object, l.facts),
                _ => (None, None, Vec::new()),
            };
            let stored = stored.filter(|_| ranged);
            if let (Some(limits), true) = (&route.download_limits, req.method == Method::GET) {
                match self
                    .under_way
                    .admit(&route.name, limits, client_ip, &format!("{id}|{object}"))
                    .await
                {
                    Ok(place) => ctx.under_way = Some(place),
                    Err(limit) => limited = Some(limit),
                }
            }
            if let Some(lapse) = lapsed {
                // Only what began before the expiry may go on: see `grace`.
                let expires = lapse.expires();
                if !grace::continues_download(stored.as_ref(), expires, &ctx.client_range) {
                    refused_lapse = Some(lapse);
                }
            }
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
            let resume_version = match resumable {
                Resumable::Any => None,
                Resumable::Only(version) => Some(version.clone()),
                Resumable::Neither => {
                    ambiguous = Some(DownloadId { id: id.clone(), derived });
                    None
                }
            };
            if ranged && !ctx.transforms() {
                plan_parts(ctx, record.as_ref().map(|r| &r.current), &req.headers);
            }
            if has_chain {
                let current = record.map(|r| r.current);
                let known = StoredFacts::of(current.as_ref().and_then(version_key), facts);
                ctx.object_path = path.to_string();
                plan_upstream(ctx, route, current.as_ref(), &known, &req.headers);
                ctx.known = Some(known);
            }
            if unvouched && let ClientRange::Bytes(set) = &ctx.client_range {
                let ttl = Duration::from_secs(self.store.losses().ttl_secs());
                let since = SystemTime::now().checked_sub(ttl).unwrap_or(SystemTime::UNIX_EPOCH);
                let refuse = matches!(holding(req, set), Holding::Prefix(_));
                if !refuse {
                    // Whole, to be answered whole unless the range may be cut from it.
                    ctx.sent_range = None;
                    ctx.planned_for = None;
                    ctx.part_gap = None;
                }
                ctx.lost_session = Some(LostSession { since, refuse });
            }
            if req.method == Method::GET {
                ctx.download = Some(DownloadCtx {
                    id,
                    object,
                    session: stored,
                    resume_version,
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
        if let Some(limit) = limited {
            ctx.download = None;
            ctx.refusal = Some("too many downloads under way");
            return self.refuse_limited(session, ctx, limit).await;
        }
        if let Some(lapse) = refused_lapse {
            ctx.download = None;
            ctx.refusal = Some("it expired, and this continues no download begun before");
            let route = ctx.route_name().to_owned();
            return self.refuse_lapsed(session, &route, lapse).await;
        }
        if let (Some(route), Some(lapse)) = (&ctx.route, lapsed) {
            self.metrics.resumed_past_expiry(&route.name, lapse.name());
        }
        Ok(false)
    }

    async fn proxy_upstream_filter(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<bool> {
        // Every request that gets here is relayed (see transport.rs): pingora never connects.
        let span = request_span(ctx.trace.as_ref());
        self.relay(session, ctx).instrument(span).await?;
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        // Required by pingora, never called: `proxy_upstream_filter` relays every request.
        Err(Error::explain(ErrorType::InternalError, "rangeway relays every request itself"))
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if response.status.is_server_error()
            && let Some(route) = ctx.route.as_ref()
        {
            route.upstream.failed(ctx.replica);
        }
        if ctx.transforms() {
            // The version a resume may have is the transformed representation's ETag: checked in response_filter.
            return Ok(());
        }
        let Some(download) = ctx.download.as_mut() else {
            return Ok(());
        };
        let Some(resume_version) = download.resume_version.take() else {
            return Ok(());
        };
        let status = response.status.as_u16();
        let answered = object_version(status, &response.headers, &validators(&response.headers));
        let changed = status == 412
            || (matches!(status, 200 | 206)
                && !answered.is_some_and(|v| v.same_as(&resume_version)));
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
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let status = response.status.as_u16();
        ctx.upstream_status = Some(status);
        ctx.upstream_header = ctx.upstream_asked.map(|t| t.elapsed());
        let answer_validators = validators(&response.headers);
        let version = object_version(status, &response.headers, &answer_validators);
        let origin_digest =
            if status == 200 { OriginDigestCheck::for_response(&response.headers) } else { None };
        if let Some(id) = ctx.download.as_ref().filter(|d| d.changed).map(|d| d.id.clone()) {
            return refuse_changed(response, ctx, &id);
        }
        if let Some(lost) = ctx.lost_session
            && lost.refuse
            && matches!(status, 200 | 206)
            && !lost.predated_by(&answer_validators)
        {
            let route = ctx.route_name().to_owned();
            self.unvouched(ctx, &route, Unvouched::Refused);
            return refuse_lost_session(response, ctx);
        }
        // An Arc, not a copy of the name: the ctx is borrowed mutably below.
        let route_arc = ctx.route.clone();
        if route_arc.as_ref().is_some_and(|r| r.upstream.is_s3())
            && let Some(client_status) = crate::s3::error::client_status(status)
        {
            forwarded(response)?;
            ctx.served_range = format!("S3 error {status}").into();
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
                    Box::pin(self.origin_client.length(&route.upstream, &ctx.upstream_target))
                        .instrument(request_span(ctx.trace.as_ref()))
                        .await
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
            self.go_live(session, ctx);
            return result;
        }
        // The upstream body's place in the object, for stages that observe it (read before the
        // answer is shaped, which may change its Content-Length and Content-Range).
        let upstream_stream = ctx.chain().and_then(|_| upstream_stream(status, &response.headers));
        forwarded(response)?;
        let req = session.req_header();
        let asked = Asked {
            method: &req.method,
            headers: &req.headers,
            range: &ctx.client_range,
            sent: ctx.sent_range.as_ref(),
            if_range_date_sent: ctx.if_range_date == IfRangeDate::Forward,
            part_gap: ctx.part_gap,
            lost_sessions_since: ctx.lost_session.filter(|l| !l.refuse).map(|l| l.since),
        };
        let shape = shape_response(
            &asked,
            status,
            &response.headers,
            &answer_validators,
            SystemTime::now(),
        );
        let route = route_arc.as_ref().map_or("-", |r| r.name.as_str());
        match shape {
            Shape::Forward => {
                if status == 200 && ctx.lost_session.is_some() {
                    self.unvouched(ctx, route, Unvouched::Whole);
                }
                if let Some(range) = response.headers.get(header::CONTENT_RANGE) {
                    ctx.served_range = range.to_str().unwrap_or("?").to_owned().into();
                }
                if matches!(status, 200 | 206)
                    && response.headers.contains_key(header::CONTENT_LENGTH)
                {
                    // rangeway can cut any range out of a response of known length.
                    response.insert_header(header::ACCEPT_RANGES, ACCEPT_BYTES)?;
                }
            }
            Shape::Single { range, complete_len, stream_start } => {
                if status == 200 {
                    self.metrics.upstream_ignored_range(route);
                }
                let value = content_range(range, complete_len);
                set_partial(response, range.len(), &value)?;
                ctx.served_range = value.into();
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
        self.go_live(session, ctx);
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
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
            let stages_began =
                ctx.trace.as_ref().map(|_| (Instant::now(), chunk.as_ref().map_or(0, Bytes::len)));
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
            if let (Some(trace), Some((began, bytes_in))) = (ctx.trace.as_mut(), stages_began) {
                let bytes_out = out.as_ref().ok().and_then(Option::as_ref).map_or(0, Bytes::len);
                trace.stages_ran(bytes_in, bytes_out, began.elapsed());
            }
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
        if let (Some(writer), Some(output)) = (ctx.output_writer.as_mut(), body.as_ref()) {
            writer.push(output);
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
                        ctx.served_range = format!("S3 {code}").into();
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

    fn suppress_error_log(&self, _session: &Session, _ctx: &Self::CTX, _error: &Error) -> bool {
        // `logging` writes one line per request, errors included, at the right level.
        true
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
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

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX) {
        if let ServerSession::H1(h1) = session.as_downstream()
            && let Some(connection) = ClientConnection::of(h1.stream())
        {
            connection.response_ended();
        }
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        // What reached the client's connection, not what the body filter handed on.
        let sent = session.body_bytes_sent() as u64;
        let mut completed = None;
        let delivery = if sent > 0 { ctx.take_delivery(sent, e.is_none()) } else { None };
        if let Some(delivery) = delivery {
            // A store outage is reported by the store's health, once; the response is done.
            let complete = |s: &DownloadSession| {
                s.of_version(&delivery.version).is_some_and(|sent| sent.is_complete())
            };
            let was_complete =
                ctx.download.as_ref().and_then(|d| d.session.as_ref()).is_some_and(complete);
            // Completed by pieces: one response of the whole version showed the stages all of it.
            let span = store_span(ctx.trace.as_ref(), StoreCall::Record);
            if let Ok(session) = self.store.record(&delivery).instrument(span).await
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
            // Its requests to the origin are this response's: in its trace.
            let _within = ctx.trace.as_ref().map(|trace| trace.span.enter());
            self.completions.start(Arc::clone(&self.store), unfinished);
        }
        let route = ctx.route_name();
        let elapsed = ctx.started.elapsed();
        let transport = ctx.transport.name();
        self.metrics.request(route, status, sent, elapsed, transport);
        if ctx.spliced > 0 && matches!(ctx.transport, Transport::Splice { .. }) {
            self.metrics.spliced(route, ctx.spliced);
        }
        let cache = ctx.cache.map(Outcome::name);
        if let Some(outcome) = cache {
            self.metrics.cache_request(route, outcome);
        }
        if let Some(pacer) = &ctx.pacer {
            self.metrics.shaped(route, pacer.shaped, pacer.waited);
        }
        let req = session.req_header();
        let asked = req.headers.get(header::RANGE).and_then(|v| v.to_str().ok()).unwrap_or("-");
        let upstream_ms = ctx.upstream_header.map(|d| d.as_secs_f64() * 1000.0);
        // Formatted only when the line is written (tracing evaluates fields of enabled events).
        let logged_client = LoggedClient::of(ctx.client, session.client_addr());
        let client = logged_client.as_ref().map(tracing::field::display);
        let forwarded_by =
            ctx.client.and_then(|client| client.forwarded_by).map(tracing::field::display);
        // The target as the client wrote it in HTTP/1 (HTTP/2 has the authority in the URI).
        // A signed link's signature shortened: the log must not hold a usable link.
        let path = links::redacted(req.uri.path_and_query().map_or("/", |p| p.as_str()));
        let version = tracing::field::debug(req.version);
        let trace_id = ctx.trace.as_ref().and_then(|trace| {
            let span = &trace.span;
            span.record("http.request.method", req.method.as_str());
            span.record("url.path", tracing::field::display(path));
            span.record("network.protocol.version", tracing::field::debug(req.version));
            span.record("rangeway.route", route);
            if let Some(download) = &ctx.download {
                span.record("rangeway.download_id", download.id.as_str());
            }
            span.record("rangeway.range_asked", asked);
            span.record("rangeway.range_served", &*ctx.served_range);
            span.record("rangeway.transport", transport);
            span.record("rangeway.cache", cache);
            span.record("http.response.status_code", traces::int(status));
            span.record("http.response.body.size", traces::int(sent));
            if let Some(client) = &logged_client {
                span.record("client.address", tracing::field::display(client));
            }
            if e.is_some() || status >= 500 {
                span.record("otel.status_code", "ERROR");
            }
            traces::finish(span, &format!("{} {route}", req.method))
        });
        match e {
            None => info!(
                target: "rangeway::access",
                route, method = %req.method, path = %path, version, status,
                range_asked = asked, range_served = %ctx.served_range, bytes = sent,
                upstream_status = ctx.upstream_status, upstream_ms, total_ms = elapsed.as_secs_f64() * 1000.0,
                transport, cache, client, forwarded_by, refused = ctx.refusal, trace_id,
            ),
            Some(e) if is_client_abort(e) => info!(
                target: "rangeway::access",
                route, method = %req.method, path = %path, version, status,
                range_asked = asked, range_served = %ctx.served_range, bytes = sent,
                total_ms = elapsed.as_secs_f64() * 1000.0, transport, cache, client, forwarded_by, trace_id,
                "client went away before the end of the response"
            ),
            Some(e) => {
                if *e.esource() == ErrorSource::Upstream {
                    self.metrics.upstream_error(route, error_kind(e));
                }
                warn!(
                    target: "rangeway::access",
                    route, method = %req.method, path = %path, version, status,
                    range_asked = asked, range_served = %ctx.served_range, bytes = sent,
                    upstream_status = ctx.upstream_status, total_ms = elapsed.as_secs_f64() * 1000.0,
                    transport, cache, client, forwarded_by, trace_id, error = %e,
                )
            }
        }
        // The request's spans end with its access line.
        ctx.trace = None;
    }
}

/// The access line's `client`: the connection's peer and port (the PROXY protocol's source when
/// a balancer sent one), or the address alone when a trusted proxy's `X-Forwarded-For` named it.
enum LoggedClient<'a> {
    Peer(&'a pingora_core::protocols::l4::socket::SocketAddr),
    Forwarded(std::net::IpAddr),
}

impl<'a> LoggedClient<'a> {
    fn of(
        client: Option<Client>,
        peer: Option<&'a pingora_core::protocols::l4::socket::SocketAddr>,
    ) -> Option<Self> {
        match client {
            Some(Client { ip, forwarded_by: Some(_) }) => Some(Self::Forwarded(ip)),
            _ => peer.map(Self::Peer),
        }
    }
}

impl std::fmt::Display for LoggedClient<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer(peer) => peer.fmt(f),
            Self::Forwarded(ip) => ip.fmt(f),
        }
    }
}
