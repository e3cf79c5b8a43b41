//! The first step of the pipeline: whether the request is one to answer, which route takes it,
//! and whether it may be answered — the client limits of one request, HTTP's own rules (Host,
//! methods, framing), the path, the route, the route's S3 client keys and signed links.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Method, StatusCode, header};
use pingora_error::Result;
use tracing::info;

use super::Proxy;
use super::answer::{Lapsed, declares_body, header_over_limits, respond};
use super::client_session::ClientSession;
use super::context::RequestCtx;
use super::download;
use crate::client_address;
use crate::links::{self, Link};
use crate::request_path::NormalizedPath;
use crate::routes::Route;
use crate::s3::verify as s3_verify;
use crate::state::unix_now;

/// The request admitted: the route that takes it, and what authorized it.
pub(super) struct Admitted {
    pub(super) route: Arc<Route>,
    pub(super) path: NormalizedPath,
    /// An authorization that ran out, within its grace: only a resume of a download begun
    /// before it may go on (`grace`).
    pub(super) lapsed: Option<Lapsed>,
    /// The signed link the request came with, on a route that takes them.
    pub(super) link: Option<Link>,
}

/// What authorized a request on its route.
struct Authorized {
    lapsed: Option<Lapsed>,
    link: Option<Link>,
}

impl Proxy {
    /// Admits the request, or answers it (`None`).
    pub(super) async fn admit(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Admitted>> {
        let Some((route, path)) = self.route_request(session, ctx).await? else { return Ok(None) };
        let Some(Authorized { lapsed, link }) = self.authorize(session, ctx, &route, &path).await?
        else {
            return Ok(None);
        };
        Ok(Some(Admitted { route, path, lapsed, link }))
    }

    /// The request within the client limits and HTTP's rules, its path and the route that takes
    /// it; `None` once answered otherwise.
    async fn route_request(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
    ) -> Result<Option<(Arc<Route>, NormalizedPath)>> {
        // A client that takes none of the response for this long is cut, rather than holding its
        // buffers and upstream connection indefinitely.
        session.set_write_timeout(self.client_limits.write_timeout);
        if let Some(problem) = header_over_limits(session.req_header(), &self.client_limits) {
            // The connection ends with this answer: a client that sends such headers once will
            // again, and what follows them on the connection is not worth reading.
            session.close_after_response();
            let status = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
            respond(session, status, problem, &[(header::CONNECTION, "close")]).await?;
            return Ok(None);
        }
        let req = session.req_header();
        ctx.client = session
            .peer()
            .and_then(|addr| addr.as_inet())
            .map(|addr| client_address::client(addr.ip(), &req.headers, &self.trusted_proxies));
        if req.version == http::Version::HTTP_11 && !req.headers.contains_key(header::HOST) {
            // RFC 9112 §3.2. (pingora refuses two Host lines, and a Host that contradicts an
            // absolute-form target, itself.)
            let problem = "an HTTP/1.1 request must have a Host header\n";
            respond(session, StatusCode::BAD_REQUEST, problem, &[]).await?;
            return Ok(None);
        }
        let path = match NormalizedPath::parse(req.uri.path()) {
            Ok(path) => path,
            Err(e) => {
                respond(session, StatusCode::BAD_REQUEST, &format!("bad path: {e}\n"), &[]).await?;
                return Ok(None);
            }
        };
        let routes = self.routes.current();
        let Some(route) = routes.for_request(req, &path) else {
            respond(session, StatusCode::NOT_FOUND, "no route for this path\n", &[]).await?;
            return Ok(None);
        };
        let route = Arc::clone(route);
        if !route.methods.contains(&req.method) {
            refuse_method(session, &route.methods).await?;
            return Ok(None);
        }
        let passes_through = !matches!(req.method, Method::GET | Method::HEAD);
        if !passes_through && declares_body(&req.headers) {
            // What follows the header on the connection may be read as anything: it ends here.
            session.close_after_response();
            let problem = "a GET or HEAD request has no body: send it without one\n";
            let close = [(header::CONNECTION, "close")];
            respond(session, StatusCode::BAD_REQUEST, problem, &close).await?;
            return Ok(None);
        }
        Ok(Some((route, path)))
    }

    /// Whether the route's S3 client keys and signed links let the request through, and with
    /// what; `None` once refused.
    async fn authorize(
        &self,
        session: &mut impl ClientSession,
        ctx: &RequestCtx,
        route: &Route,
        path: &NormalizedPath,
    ) -> Result<Option<Authorized>> {
        let req = session.req_header();
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
                    return Ok(None);
                }
                Ok(Some(presigned)) if now > presigned.expires => {
                    let lapse = Lapsed::Presigned { expires: presigned.expires };
                    if !resume_within(presigned.expires, route.s3_presigned_grace) {
                        self.refuse_lapsed(session, &route.name, lapse).await?;
                        return Ok(None);
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
                    return Ok(None);
                }
                Ok(found) => {
                    if found.expired {
                        let lapse = Lapsed::Link { expires: found.terms.expires };
                        if !resume_within(found.terms.expires, signed.grace) {
                            self.refuse_lapsed(session, &route.name, lapse).await?;
                            return Ok(None);
                        }
                        lapsed = Some(lapse);
                    }
                    link = Some(found);
                }
            }
        }
        Ok(Some(Authorized { lapsed, link }))
    }
}

/// Answers a method the route does not take: 405, with the methods it does take (RFC 9110
/// §15.5.6). A body the request declares is not read: the connection ends with the answer, as
/// what follows the header could be read as anything (RFC 9110 §10.1.1: a server that answers
/// before the body either reads it or closes). No `100 Continue` went out for it.
async fn refuse_method(session: &mut impl ClientSession, methods: &[Method]) -> Result<()> {
    let allow = methods.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
    let message = format!("this route serves {allow} only\n");
    let mut extra = vec![(header::ALLOW, allow.as_str())];
    if declares_body(&session.req_header().headers) {
        session.close_after_response();
        extra.push((header::CONNECTION, "close"));
    }
    respond(session, StatusCode::METHOD_NOT_ALLOWED, &message, &extra).await
}
