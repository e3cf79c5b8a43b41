//! rangeway's own answers: short text answers, errors, the answers without content to ranges and
//! preconditions, refusals.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode, header};
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use rangeway_middleware::rfc9110::unsatisfied_content_range;
use std::time::{Duration, UNIX_EPOCH};
use tracing::info;

use super::Proxy;
use super::client_session::ClientSession;
use super::context::{BodyPlan, RequestCtx};
use super::download::{DOWNLOAD_ID, DownloadId};
use super::hop_by_hop::VIA;
use super::origin_digest::ORIGIN_DIGEST_MISMATCH;
use super::under_way::Limit;
use crate::admission::ClientLimits;
use crate::range::Shape;
use crate::telemetry::metrics::Unvouched;

/// An authorization that ran out: served only for a resume, within the route's grace, of a
/// download that began before it expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lapsed {
    /// A signed link (`crate::links`).
    Link { expires: u64 },
    /// A presigned S3 URL (`crate::s3::verify`).
    Presigned { expires: u64 },
}

impl Lapsed {
    /// Unix seconds.
    pub(super) fn expires(self) -> u64 {
        match self {
            Self::Link { expires } | Self::Presigned { expires } => expires,
        }
    }

    /// Its name in `rangeway_resumed_past_expiry_total{by}`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Link { .. } => "link",
            Self::Presigned { .. } => "presigned",
        }
    }
}

/// When a client refused by a download limit is told to try again, in seconds: long enough
/// not to be a busy loop, short against a download's length.
const RETRY_LIMITED: &str = "5";
/// `Accept-Ranges: bytes`, from the binary rather than copied from a string on every response.
pub(super) const ACCEPT_BYTES: HeaderValue = HeaderValue::from_static("bytes");

/// `X-Rangeway-Error` of a refused resume whose client may hold any of several versions.
pub(super) const AMBIGUOUS_RESUME: &str = "several versions of the object were sent under this download id; download it again from \
     the start, under an id of your own (X-Download-Id)";

/// `X-Rangeway-Error` of a refused resume whose session the state store may have lost.
pub(super) const LOST_SESSION: &str = "the state store may have lost this download's record and the object may have \
     changed since; download it again from the start";

/// The answers without content to a range or a precondition: 416, 304, 412.
pub(super) fn answer_without_body(
    response: &mut ResponseHeader,
    ctx: &mut RequestCtx,
    shape: &Shape,
) -> Result<()> {
    match shape {
        Shape::Unsatisfiable { complete_len } => {
            empty_answer(response, StatusCode::RANGE_NOT_SATISFIABLE)?;
            response
                .insert_header(header::CONTENT_RANGE, unsatisfied_content_range(*complete_len))?;
            response.insert_header(header::ACCEPT_RANGES, ACCEPT_BYTES)?;
        }
        Shape::NotModified => {
            empty_answer(response, StatusCode::NOT_MODIFIED)?;
            response.remove_header(&header::CONTENT_LENGTH);
        }
        // PreconditionFailed; the callers pass no other shape.
        _ => empty_answer(response, StatusCode::PRECONDITION_FAILED)?,
    }
    ctx.answer.body = BodyPlan::Discard;
    Ok(())
}

/// Refuses a resume whose object changed since its download began (412).
pub(super) fn refuse_changed(
    response: &mut ResponseHeader,
    ctx: &mut RequestCtx,
    id: &str,
) -> Result<()> {
    empty_answer(response, StatusCode::PRECONDITION_FAILED)?;
    response.insert_header(
        "x-rangeway-error",
        "the object changed since this download began; download it again from the start",
    )?;
    response.insert_header(DOWNLOAD_ID, id)?;
    ctx.answer.body = BodyPlan::Discard;
    Ok(())
}

/// Refuses a bare resume whose session the store may have lost, of an object that may have
/// changed since (412), as a changed object's resume is refused.
pub(super) fn refuse_lost_session(
    response: &mut ResponseHeader,
    ctx: &mut RequestCtx,
) -> Result<()> {
    empty_answer(response, StatusCode::PRECONDITION_FAILED)?;
    response.insert_header("x-rangeway-error", LOST_SESSION)?;
    if let Some(download) = &ctx.identity.download {
        response.insert_header(DOWNLOAD_ID, download.id.as_str())?;
    }
    ctx.refusal = Some("the store may have lost this download's session");
    ctx.answer.body = BodyPlan::Discard;
    Ok(())
}

/// Why a request's header is over the client limits, if it is.
pub(super) fn header_over_limits(
    req: &RequestHeader,
    limits: &ClientLimits,
) -> Option<&'static str> {
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

/// Whether a request's header says a body follows: a `Content-Length` other than 0, or any
/// `Transfer-Encoding` (a coding pingora would not read as chunked still frames a body to an
/// origin that does). rangeway serves GET and HEAD, which have none to send: one that declares
/// a body is refused rather than forwarded, for an origin that reads no body there would take
/// it for the next request on the connection (request smuggling).
pub(super) fn declares_body(headers: &http::HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|len| len.to_str().ok().and_then(|len| len.trim().parse::<u64>().ok()) != Some(0))
}

/// Turns an upstream answer into a 206 for `range`.
pub(super) fn set_partial(
    response: &mut ResponseHeader,
    len: u64,
    content_range: &str,
) -> Result<()> {
    response.set_status(StatusCode::PARTIAL_CONTENT)?;
    response.remove_header(&header::TRANSFER_ENCODING);
    response.insert_header(header::CONTENT_RANGE, content_range)?;
    response.insert_header(header::CONTENT_LENGTH, len)?;
    response.insert_header(header::ACCEPT_RANGES, ACCEPT_BYTES)?;
    Ok(())
}

/// Turns an upstream answer into one with `status` and no content.
pub(super) fn empty_answer(response: &mut ResponseHeader, status: StatusCode) -> Result<()> {
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

/// A short answer of rangeway's own.
pub(super) async fn respond(
    session: &mut impl ClientSession,
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
    session.write_header(Box::new(response), head_only).await?;
    if !head_only {
        session.write_body(Some(Bytes::copy_from_slice(message.as_bytes())), true).await?;
    }
    Ok(())
}

/// The status and message for a request that failed; 0 when the client is already gone.
pub(super) fn error_answer(e: &Error) -> (u16, &'static str) {
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

pub(super) fn is_client_abort(e: &Error) -> bool {
    *e.esource() == ErrorSource::Downstream
        && matches!(
            e.etype(),
            ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed
        )
}

/// A metric label for an upstream failure.
pub(super) fn error_kind(e: &Error) -> &'static str {
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

impl Proxy {
    /// Answers a request the pipeline failed with `e`, unless its header went out already or
    /// its client is gone: whether the connection may carry the client's next request — only
    /// after a whole error answer. Cut short after its header, a response ends its connection
    /// (nothing else frames its end).
    pub(super) async fn answer_failure(
        &self,
        session: &mut impl ClientSession,
        e: &Error,
        ctx: &RequestCtx,
    ) -> bool {
        let (status, message) = error_answer(e);
        if status == 0 || session.response_written().is_some() {
            session.close_after_response();
            return false;
        }
        let status_code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        match respond(session, status_code, message, &[]).await {
            Ok(()) => true,
            Err(write_error) => {
                info!(route = ctx.identity.route_name(), error = %write_error, "could not send the error answer");
                session.close_after_response();
                false
            }
        }
    }

    /// Refuses a download past its route's concurrent-download limits (429), before the origin
    /// is asked.
    pub(super) async fn refuse_limited(
        &self,
        session: &mut impl ClientSession,
        ctx: &RequestCtx,
        limit: Limit,
    ) -> Result<bool> {
        self.metrics.download_limited(ctx.identity.route_name(), limit.name());
        let message = match limit {
            Limit::PerClient(most) => format!(
                "rangeway: your address has {most} downloads under way here, the most it may; \
                 start this one when one of them has finished\n"
            ),
            Limit::PerRoute(most) => format!(
                "rangeway: {most} downloads are under way here, the most there may be; try again \
                 in a moment\n"
            ),
        };
        let retry = [(header::RETRY_AFTER, RETRY_LIMITED)];
        respond(session, StatusCode::TOO_MANY_REQUESTS, &message, &retry).await?;
        Ok(true)
    }

    /// Refuses a genuine authorization that expired: a new download, or a resume of one that
    /// did not begin before the expiry or comes after the grace period. A signed link's is 410;
    /// a presigned URL's is S3's own answer, 403 `AccessDenied`, which SDKs know.
    pub(super) async fn refuse_lapsed(
        &self,
        session: &mut impl ClientSession,
        route: &str,
        lapse: Lapsed,
    ) -> Result<bool> {
        let expired = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(lapse.expires()));
        match lapse {
            Lapsed::Link { .. } => {
                self.metrics.link_refused(route, "expired");
                let message = format!(
                    "rangeway: this link expired on {expired}; ask whoever gave it to you for a \
                     new one. (A download begun before then may still be resumed for a while, \
                     from where it stopped.)\n"
                );
                respond(session, StatusCode::GONE, &message, &[]).await?;
            }
            Lapsed::Presigned { .. } => {
                self.metrics.s3_client_refused(route, "expired");
                let message = format!("Request has expired (on {expired})");
                let document = crate::s3::error::document("AccessDenied", &message);
                let xml = [(header::CONTENT_TYPE, "application/xml")];
                respond(session, StatusCode::FORBIDDEN, &document, &xml).await?;
            }
        }
        Ok(true)
    }

    /// Counts and logs a bare resume whose session the store may have lost, by how it was
    /// `answered`: see `LostSession`.
    pub(super) fn unvouched(&self, ctx: &RequestCtx, route: &str, answered: Unvouched) {
        self.metrics.resume_unvouched(route, answered);
        let download = ctx.identity.download.as_ref().map_or("-", |d| d.id.as_str());
        info!(
            route,
            download,
            ?answered,
            "the state store may have lost this download's session: not resuming it"
        );
    }

    /// Refuses, before asking the origin, a bare resume whose client may hold any of several
    /// versions sent under its download id (see `DownloadSession::resumable`): 412, with a body
    /// that says how to download it so that it can be resumed.
    pub(super) async fn refuse_ambiguous(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        download: &DownloadId,
    ) -> Result<()> {
        let route = ctx.identity.route_name().to_owned();
        self.metrics.resume_refused(&route);
        info!(route, download = %download.id, "several versions of the object were sent under this download id: refusing the resume");
        ctx.refusal = Some("the client may hold any of several versions");
        ctx.identity.download = None;
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
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn headers(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn a_body_is_declared_by_its_framing() {
        assert!(!declares_body(&headers(&[])));
        assert!(!declares_body(&headers(&[("content-length", "0")])));
        assert!(!declares_body(&headers(&[("content-length", "00")])));
        for declared in [
            &[("content-length", "5")][..],
            &[("content-length", "x")],
            &[("content-length", "0"), ("content-length", "5")],
            &[("transfer-encoding", "chunked")],
            &[("transfer-encoding", "gzip")],
            &[("content-length", "0"), ("transfer-encoding", "chunked")],
        ] {
            assert!(declares_body(&headers(declared)), "{declared:?}");
        }
    }
}
