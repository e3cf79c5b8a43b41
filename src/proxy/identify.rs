//! The second step of the pipeline: what the request asks of its route's source, which download
//! it belongs to and what the store knows of that download, and from that the plan — which
//! version a bare resume may be answered with, what to ask the source, whether the store may have
//! lost the session — or a refusal (an ambiguous resume, a download past the route's limits, an
//! authorization that ran out).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Method, StatusCode, header};
use pingora_error::Result;
use pingora_http::RequestHeader;
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::Chain;
use rangeway_middleware::rfc9110::RangeSpec;
use tracing::Instrument as _;

use super::admit::Admitted;
use super::answer::{Lapsed, respond};
use super::client_session::ClientSession;
use super::context::{DownloadCtx, LostSession, RequestCtx, ip_text};
use super::download::{self, DownloadId, continues_past_start, download_id, holding, object_key};
use super::plan::{plan_parts, plan_upstream};
use super::traced::{StoreCall, store_span};
use super::under_way::Limit;
use super::{Proxy, grace, negotiation, s3};
use crate::links::{self, Link};
use crate::range::{ClientRange, IfRangeDate};
use crate::representation::{StoredFacts, version_key};
use crate::request_path::NormalizedPath;
use crate::routes::Route;
use crate::state::{
    Delivery, Ending, Holding, Lookup, ObjectVersion, Resumable, StoreError, unix_now,
};
use crate::telemetry::metrics::ActiveDownload;

/// identify's output, the request as rangeway will answer it: its route, what the client asked,
/// what the source is asked for, and the download it belongs to.
#[derive(Debug)]
pub(super) struct Identified {
    /// Set as the request is identified: from then on it is its route's (see
    /// `Delivered::transport_taken`).
    pub(super) route: Option<Arc<Route>>,
    pub(super) upstream_target: String,
    /// The client's IP address as text, formatted once: the derived download id, the
    /// download's record and `X-Forwarded-For` all write it.
    pub(super) client_ip: Option<String>,
    pub(super) client_range: ClientRange,
    /// The Range the source is asked for.
    pub(super) sent_range: Option<RangeSpec>,
    /// The object's path on the upstream, as the stages are told it.
    pub(super) object_path: String,
    pub(super) download: Option<DownloadCtx>,
    /// On a route with middleware: what the store knows of the object and its stages.
    pub(super) known: Option<StoredFacts>,
    /// A bare resume whose session the store may have lost.
    pub(super) lost_session: Option<LostSession>,
    /// How the client's If-Range, when it is a date, goes upstream.
    pub(super) if_range_date: IfRangeDate,
    /// The ranges of a multipart answer are fetched apart, in stretches this far apart at least.
    pub(super) part_gap: Option<u64>,
    /// On a route that transforms: the origin's strong ETag the planned range was made for, sent
    /// upstream as If-Range so that a changed object comes whole.
    pub(super) planned_for: Option<String>,
    /// The route serves its output as a content coding this client does not accept: the body is
    /// passed through untouched, as on a route without middleware.
    pub(super) coding_declined: bool,
    /// The download's place under its route's concurrent-download limits, held to the end.
    pub(super) under_way: Option<super::under_way::Place>,
    pub(super) _active: Option<ActiveDownload>,
}

impl Default for Identified {
    fn default() -> Self {
        Self {
            route: None,
            upstream_target: String::new(),
            client_ip: None,
            client_range: ClientRange::Absent,
            sent_range: None,
            object_path: String::new(),
            download: None,
            known: None,
            lost_session: None,
            if_range_date: IfRangeDate::NotADate,
            part_gap: None,
            planned_for: None,
            coding_declined: false,
            under_way: None,
            _active: None,
        }
    }
}

impl Identified {
    pub(super) fn route_name(&self) -> &str {
        self.route.as_ref().map_or("-", |r| r.name.as_str())
    }

    /// The route's middleware as this request runs it: none on a passthrough route, or when the
    /// client declined the route's content coding.
    pub(super) fn chain(&self) -> Option<&Chain> {
        self.route
            .as_ref()
            .map(|route| &route.chain)
            .filter(|chain| !chain.stages().is_empty() && !self.coding_declined)
    }

    /// Whether the route's middleware changes the bytes for this request.
    pub(super) fn transforms(&self) -> bool {
        self.chain().is_some_and(|chain| !chain.is_observing_only())
    }

    /// What this response delivered to its download, once `sent` body bytes went out (none is
    /// an empty range), `finished` when the response ended without an error.
    pub(super) fn delivery(&self, sent: u64, finished: bool) -> Option<Delivery> {
        let download = self.download.as_ref()?;
        let delivering = download.delivering.as_ref()?;
        let (range, ending) = delivering.ended(sent, finished)?;
        let origin_version = download.origin_version.as_ref().unwrap_or(&delivering.version);
        let versions = (delivering.version.clone(), origin_version.clone());
        let client = self.client_ip.clone().unwrap_or_default();
        self.delivered(versions, client, range, ending, sent)
    }

    /// As [`Self::delivery`], for the record made after the response: the versions and the
    /// client's address are moved out, not copied (the download is not delivering any more).
    pub(super) fn take_delivery(&mut self, sent: u64, finished: bool) -> Option<Delivery> {
        let download = self.download.as_mut()?;
        let (range, ending) = download.delivering.as_ref()?.ended(sent, finished)?;
        let version = download.delivering.take()?.version;
        let origin_version = download.origin_version.take().unwrap_or_else(|| version.clone());
        let client = self.client_ip.take().unwrap_or_default();
        self.delivered((version, origin_version), client, range, ending, sent)
    }

    fn delivered(
        &self,
        (version, origin_version): (ObjectVersion, ObjectVersion),
        client: String,
        range: ByteRange,
        ending: Ending,
        sent: u64,
    ) -> Option<Delivery> {
        let download = self.download.as_ref()?;
        Some(Delivery {
            id: download.id.clone(),
            object: download.object.clone(),
            route: self.route_name().to_owned(),
            client,
            version,
            origin_version,
            range,
            ending,
            bytes: sent,
            now: unix_now(),
        })
    }
}

/// Why an identified request is refused before its source is asked.
enum Refusal {
    /// A bare resume whose client may hold any of several versions.
    Ambiguous(DownloadId),
    /// The route's concurrent-download limits.
    Limited(Limit),
    /// An authorization that ran out, and the request continues no download begun before.
    Lapsed(Lapsed),
}

/// What the store said of a download, and how its request asks.
struct Found {
    download: DownloadId,
    object: String,
    lookup: Option<std::result::Result<Lookup, StoreError>>,
    ranged: bool,
    /// The route's stages run (and learn): the store was asked what they know.
    has_chain: bool,
    /// A Range without If-Range or If-Match: resume safety applies (explicit validators keep
    /// their RFC meaning).
    bare_resume: bool,
}

impl Proxy {
    /// Identifies the request and plans its answer in `ctx.identity` — what the source is asked,
    /// and the download's session and resume decision — and hands it to its route; or answers it
    /// (`None`).
    pub(super) async fn identify(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        admitted: Admitted,
    ) -> Result<Option<Arc<Route>>> {
        let Admitted { route, path, lapsed, link } = admitted;
        let req = session.req_header();
        let Some(target) = upstream_target(req, &route, &path, link.as_ref()) else {
            // S3 would list the bucket's keys: nothing a download route serves.
            respond(session, StatusCode::NOT_FOUND, "no object at this path\n", &[]).await?;
            return Ok(None);
        };
        ctx.identity.client_range =
            ClientRange::from_request(&req.method, &req.headers, &self.range_limits);
        ctx.identity.sent_range = ctx.identity.client_range.upstream_spec();
        ctx.identity.upstream_target = target;
        ctx.identity.client_ip = ctx.client.map(|client| ip_text(client.ip));
        ctx.identity._active = Some(self.metrics.active_download());
        ctx.identity.route = Some(Arc::clone(&route));
        ctx.identity.coding_declined = route
            .chain
            .content_coding()
            .is_some_and(|coding| !negotiation::accepts_coding(&req.headers, coding));
        let has_chain = !route.chain.stages().is_empty() && !ctx.identity.coding_declined;
        let refusal = if req.method == Method::GET || (has_chain && req.method == Method::HEAD) {
            let found = self.look_up(req, ctx, &route, &path, link.as_ref(), has_chain).await;
            self.plan(req, ctx, &route, &path, found, lapsed).await
        } else {
            None
        };
        match refusal {
            Some(Refusal::Ambiguous(download)) => {
                self.refuse_ambiguous(session, ctx, &download).await?;
                return Ok(None);
            }
            Some(Refusal::Limited(limit)) => {
                ctx.identity.download = None;
                ctx.refusal = Some("too many downloads under way");
                self.refuse_limited(session, ctx, limit).await?;
                return Ok(None);
            }
            Some(Refusal::Lapsed(lapse)) => {
                ctx.identity.download = None;
                ctx.refusal = Some("it expired, and this continues no download begun before");
                self.refuse_lapsed(session, &route.name, lapse).await?;
                return Ok(None);
            }
            None => {}
        }
        if let Some(lapse) = lapsed {
            self.metrics.resumed_past_expiry(&route.name, lapse.name());
        }
        Ok(Some(route))
    }

    /// The download the request belongs to, and the one store round trip before the response:
    /// for requests that continue a download, and on routes whose stages learn. A store outage
    /// costs the resume hint and the digests, never the response (the store reports it, once);
    /// the resumes it cannot vouch for are refused or answered whole (`LostSession`).
    async fn look_up(
        &self,
        req: &RequestHeader,
        ctx: &RequestCtx,
        route: &Route,
        path: &NormalizedPath,
        link: Option<&Link>,
        has_chain: bool,
    ) -> Found {
        let coding = route.chain.content_coding().filter(|_| has_chain);
        let object = object_key(&route.name, path, coding);
        // A link made for one download names it: the grace of its expiry is that download's.
        let download = match link.and_then(|l| l.terms.id.clone()) {
            Some(bound) => DownloadId { id: bound, derived: false },
            None => download_id(req, ctx.identity.client_ip.as_deref(), &object, &self.id_key),
        };
        let ranged = matches!(ctx.identity.client_range, ClientRange::Bytes(_));
        let bare_resume = ranged
            && !req.headers.contains_key(header::IF_RANGE)
            && !req.headers.contains_key(header::IF_MATCH);
        let lookup = if ranged || has_chain {
            let span = store_span(ctx.trace.as_ref(), StoreCall::Lookup);
            let looked = self.store.lookup(&download.id, &object, &route.stage_keys);
            Some(looked.instrument(span).await)
        } else {
            None
        };
        Found { download, object, lookup, ranged, has_chain, bare_resume }
    }

    /// The answer's plan from what the store found: the download's limits and grace, the
    /// version a bare resume may have, what to ask the source; a refusal if the request cannot
    /// be served as asked.
    async fn plan(
        &self,
        req: &RequestHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        path: &NormalizedPath,
        found: Found,
        lapsed: Option<Lapsed>,
    ) -> Option<Refusal> {
        let Found { download, object, lookup, ranged, has_chain, bare_resume } = found;
        // A bare resume past byte 0 with no session behind it continues whatever the client
        // began: safe to serve only while the store cannot have lost that session.
        let unvouched = bare_resume
            && continues_past_start(&ctx.identity.client_range)
            && match &lookup {
                Some(Ok(found)) => found.session_may_be_lost,
                Some(Err(_)) | None => true,
            };
        let (stored, record, facts) = match lookup {
            Some(Ok(l)) => (l.session, l.object, l.facts),
            _ => (None, None, Vec::new()),
        };
        let stored = stored.filter(|_| ranged);
        let limited = self.hold_place(req, ctx, route, &download, &object).await;
        // Only what began before the expiry may go on: see `grace`.
        let refused_lapse = lapsed.filter(|lapse| {
            !grace::continues_download(stored.as_ref(), lapse.expires(), &ctx.identity.client_range)
        });
        if ranged && !ctx.identity.transforms() {
            // Decided here, by the store's record of the object: see `IfRangeDate`.
            let known = record.as_ref().map(|r| download::validators_of(&r.current));
            ctx.identity.if_range_date =
                IfRangeDate::decide(&req.headers, known.as_ref(), SystemTime::now());
            if ctx.identity.if_range_date == IfRangeDate::AskWhole {
                ctx.identity.sent_range = None;
            }
        }
        // Which version a bare resume may be answered with, by what its client may hold.
        let resumable = match (&ctx.identity.client_range, &stored) {
            (ClientRange::Bytes(set), Some(stored)) if bare_resume => {
                stored.resumable(holding(req, set))
            }
            _ => Resumable::Any,
        };
        let (resume_version, ambiguous) = match resumable {
            Resumable::Any => (None, None),
            Resumable::Only(version) => (Some(version.clone()), None),
            Resumable::Neither => (None, Some(download.clone())),
        };
        if ranged && !ctx.identity.transforms() {
            plan_parts(ctx, record.as_ref().map(|r| &r.current), &req.headers);
        }
        if has_chain {
            let current = record.map(|r| r.current);
            let known = StoredFacts::of(current.as_ref().and_then(version_key), facts);
            ctx.identity.object_path = path.to_string();
            plan_upstream(ctx, route, current.as_ref(), &known, &req.headers);
            ctx.identity.known = Some(known);
        }
        if unvouched {
            self.unvouched_plan(req, ctx);
        }
        if req.method == Method::GET {
            ctx.identity.download = Some(DownloadCtx {
                id: download.id,
                object,
                session: stored,
                resume_version,
                delivering: None,
                origin_version: None,
            });
        }
        ambiguous
            .map(Refusal::Ambiguous)
            .or(limited.map(Refusal::Limited))
            .or(refused_lapse.map(Refusal::Lapsed))
    }

    /// The download's place under its route's concurrent-download limits, held in `ctx.identity` to
    /// the response's end; the limit it would break when there is none.
    async fn hold_place(
        &self,
        req: &RequestHeader,
        ctx: &mut RequestCtx,
        route: &Route,
        download: &DownloadId,
        object: &str,
    ) -> Option<Limit> {
        let (Some(limits), true) = (&route.download_limits, req.method == Method::GET) else {
            return None;
        };
        let client = ctx.client.map(|client| client.ip);
        let held = format!("{}|{object}", download.id);
        match self.under_way.admit(&route.name, limits, client, &held).await {
            Ok(place) => {
                ctx.identity.under_way = Some(place);
                None
            }
            Err(limit) => Some(limit),
        }
    }

    /// A bare resume the store cannot vouch for: a prefix client is refused unless the answer
    /// predates every session the store could have lost; any other client is asked the whole,
    /// to be answered whole unless the range may be cut from it.
    fn unvouched_plan(&self, req: &RequestHeader, ctx: &mut RequestCtx) {
        let ClientRange::Bytes(set) = &ctx.identity.client_range else { return };
        let ttl = Duration::from_secs(self.store.losses().ttl_secs());
        let since = SystemTime::now().checked_sub(ttl).unwrap_or(SystemTime::UNIX_EPOCH);
        let refuse = matches!(holding(req, set), Holding::Prefix(_));
        if !refuse {
            ctx.identity.sent_range = None;
            ctx.identity.planned_for = None;
            ctx.identity.part_gap = None;
        }
        ctx.identity.lost_session = Some(LostSession { since, refuse });
    }
}

/// What the route's upstream is asked for (path and query), or `None` for a path that names no
/// object there.
pub(super) fn upstream_target(
    req: &RequestHeader,
    route: &Route,
    path: &NormalizedPath,
    link: Option<&Link>,
) -> Option<String> {
    let mut target = route.upstream_path(path);
    if route.upstream.names_no_s3_object(&target) {
        return None;
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
    Some(target)
}
