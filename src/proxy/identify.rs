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
use crate::state::{Holding, Lookup, Resumable, StoreError};

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
    /// Identifies the request and plans its answer in `ctx`, or answers it (`None`): what the
    /// source is asked, and the download's session and resume decision.
    pub(super) async fn identify(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        admitted: Admitted,
    ) -> Result<Option<()>> {
        let Admitted { route, path, lapsed, link } = admitted;
        let req = session.req_header();
        let Some(target) = upstream_target(req, &route, &path, link.as_ref()) else {
            // S3 would list the bucket's keys: nothing a download route serves.
            respond(session, StatusCode::NOT_FOUND, "no object at this path\n", &[]).await?;
            return Ok(None);
        };
        ctx.client_range = ClientRange::from_request(&req.method, &req.headers, &self.range_limits);
        ctx.sent_range = ctx.client_range.upstream_spec();
        ctx.upstream_target = target;
        ctx.client_ip = ctx.client.map(|client| ip_text(client.ip));
        ctx._active = Some(self.metrics.active_download());
        ctx.route = Some(Arc::clone(&route));
        ctx.coding_declined = route
            .chain
            .content_coding()
            .is_some_and(|coding| !negotiation::accepts_coding(&req.headers, coding));
        let has_chain = !route.chain.stages().is_empty() && !ctx.coding_declined;
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
                ctx.download = None;
                ctx.refusal = Some("too many downloads under way");
                self.refuse_limited(session, ctx, limit).await?;
                return Ok(None);
            }
            Some(Refusal::Lapsed(lapse)) => {
                ctx.download = None;
                ctx.refusal = Some("it expired, and this continues no download begun before");
                self.refuse_lapsed(session, &route.name, lapse).await?;
                return Ok(None);
            }
            None => {}
        }
        if let Some(lapse) = lapsed {
            self.metrics.resumed_past_expiry(&route.name, lapse.name());
        }
        Ok(Some(()))
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
            None => download_id(req, ctx.client_ip.as_deref(), &object, &self.id_key),
        };
        let ranged = matches!(ctx.client_range, ClientRange::Bytes(_));
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
        let limited = self.hold_place(req, ctx, route, &download, &object).await;
        // Only what began before the expiry may go on: see `grace`.
        let refused_lapse = lapsed.filter(|lapse| {
            !grace::continues_download(stored.as_ref(), lapse.expires(), &ctx.client_range)
        });
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
        let (resume_version, ambiguous) = match resumable {
            Resumable::Any => (None, None),
            Resumable::Only(version) => (Some(version.clone()), None),
            Resumable::Neither => (None, Some(download.clone())),
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
        if unvouched {
            self.unvouched_plan(req, ctx);
        }
        if req.method == Method::GET {
            ctx.download = Some(DownloadCtx {
                id: download.id,
                object,
                session: stored,
                resume_version,
                changed: false,
                delivering: None,
                origin_version: None,
            });
        }
        ambiguous
            .map(Refusal::Ambiguous)
            .or(limited.map(Refusal::Limited))
            .or(refused_lapse.map(Refusal::Lapsed))
    }

    /// The download's place under its route's concurrent-download limits, held in `ctx` to the
    /// response's end; the limit it would break when there is none.
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
                ctx.under_way = Some(place);
                None
            }
            Err(limit) => Some(limit),
        }
    }

    /// A bare resume the store cannot vouch for: a prefix client is refused unless the answer
    /// predates every session the store could have lost; any other client is asked the whole,
    /// to be answered whole unless the range may be cut from it.
    fn unvouched_plan(&self, req: &RequestHeader, ctx: &mut RequestCtx) {
        let ClientRange::Bytes(set) = &ctx.client_range else { return };
        let ttl = Duration::from_secs(self.store.losses().ttl_secs());
        let since = SystemTime::now().checked_sub(ttl).unwrap_or(SystemTime::UNIX_EPOCH);
        let refuse = matches!(holding(req, set), Holding::Prefix(_));
        if !refuse {
            ctx.sent_range = None;
            ctx.planned_for = None;
            ctx.part_gap = None;
        }
        ctx.lost_session = Some(LostSession { since, refuse });
    }
}

/// What the route's upstream is asked for (path and query), or `None` for a path that names no
/// object there.
fn upstream_target(
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
