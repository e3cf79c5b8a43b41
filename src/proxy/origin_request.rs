//! The request rangeway sends an origin for a client's: one builder for both ways a request
//! takes (the relay's, and pingora's own proxying in `upstream_request_filter`).
//!
//! Built on `http::request::Parts`, not through `RequestHeader`'s setters: those spell every
//! name out and parse it back (allocating for a name outside the standard set), and keep a map of
//! the names' case beside the fields. Here each field is set by a ready `HeaderName`, and the
//! request goes to the origin with lower-case names (RFC 9110 §5.1: names are case-insensitive).

use http::request::Parts;
use http::{HeaderName, HeaderValue, header};
use pingora_error::{Error, ErrorType, Result};

use super::context::RequestCtx;
use super::hop_by_hop::VIA;
use crate::routes::Route;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// What the origin is told of the client's connection ([`client_connection`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientConnection<'a> {
    /// The authority of the client's target: where an HTTP/2 client names the host it asked
    /// (an HTTP/1 client names it in `Host`, among the fields).
    pub authority: Option<&'a http::uri::Authority>,
    /// Whether the client's connection is TLS.
    pub tls: bool,
}

/// Completes `request` — the client's end-to-end fields — as the request for the route's origin:
/// the upstream target, the replica's Host, the Range the plan asks (with `If-Range` on a
/// planned version or `If-Match` on a resume's), identity coding for the stages, the forwarding
/// fields (`X-Forwarded-*`, `Via`). Not signed: [`crate::routes::Upstream::authorize`] is last.
pub(super) fn complete(
    request: &mut Parts,
    route: &Route,
    ctx: &RequestCtx,
    client: ClientConnection<'_>,
) -> Result<()> {
    request.uri = ctx
        .upstream_target
        .parse::<http::Uri>()
        .map_err(|e| Error::because(ErrorType::InternalError, "upstream path", e))?;
    let headers = &mut request.headers;
    // HTTP/2 names the host in the URI's authority, HTTP/1 in Host.
    let client_host = match headers.get(header::HOST) {
        Some(host) => Some(host.clone()),
        None => client.authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
    };
    headers.insert(header::HOST, route.upstream.host_header(ctx.replica).clone());
    headers.remove(header::RANGE);
    let transforms = ctx.transforms();
    if ctx.chain().is_some() {
        // The stages work on the object's own bytes, not on an encoding of them.
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    if transforms {
        // The client's validators are of the transformed representation, checked here against
        // its own ETag; the origin's would never match them.
        for name in [header::IF_MATCH, header::IF_NONE_MATCH, header::IF_RANGE] {
            headers.remove(name);
        }
    }
    if let Some(spec) = &ctx.sent_range {
        headers.insert(header::RANGE, value(format!("bytes={spec}"), "Range")?);
        if let Some(planned_for) = &ctx.planned_for {
            // Planned for this version: another one must come whole, to be planned again.
            headers.insert(header::IF_RANGE, value(planned_for.as_str(), "If-Range")?);
        } else if let Some(etag) = ctx
            .download
            .as_ref()
            .and_then(|d| d.resume_version.as_ref())
            .filter(|version| version.strong)
            .and_then(|version| version.etag.as_deref())
            && !transforms
        {
            // The one version this resume may be answered with: anything else comes as 412.
            headers.insert(header::IF_MATCH, value(etag, "If-Match")?);
        }
    } else {
        // If-Range only means something beside a Range.
        headers.remove(header::IF_RANGE);
    }
    headers.remove(header::PROXY_AUTHORIZATION);
    if let Some(ip) = &ctx.client_ip {
        let forwarded = match headers.get(&X_FORWARDED_FOR) {
            // An earlier proxy's list, kept as its bytes.
            Some(earlier) => {
                let mut list = Vec::with_capacity(earlier.len() + 2 + ip.len());
                list.extend_from_slice(earlier.as_bytes());
                list.extend_from_slice(b", ");
                list.extend_from_slice(ip.as_bytes());
                HeaderValue::from_maybe_shared(bytes::Bytes::from(list))
            }
            None => HeaderValue::from_str(ip),
        };
        let forwarded = forwarded
            .map_err(|e| Error::because(ErrorType::InvalidHTTPHeader, "X-Forwarded-For", e))?;
        headers.insert(X_FORWARDED_FOR, forwarded);
    }
    let scheme = if client.tls { "https" } else { "http" };
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(scheme));
    if let Some(host) = client_host {
        headers.insert(X_FORWARDED_HOST, host);
    }
    headers.append(header::VIA, HeaderValue::from_static(VIA));
    Ok(())
}

/// The client's connection, as [`complete`] tells the origin of it.
pub(super) fn client_connection(session: &pingora_proxy::Session) -> ClientConnection<'_> {
    ClientConnection {
        authority: session.req_header().uri.authority(),
        tls: session.digest().is_some_and(|d| d.ssl_digest.is_some()),
    }
}

fn value<T>(text: T, name: &'static str) -> Result<HeaderValue>
where
    HeaderValue: TryFrom<T, Error = http::header::InvalidHeaderValue>,
{
    HeaderValue::try_from(text).map_err(|e| Error::because(ErrorType::InvalidHTTPHeader, name, e))
}
