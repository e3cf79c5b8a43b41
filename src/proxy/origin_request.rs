//! The request rangeway sends an origin for a client's, which the relay sends.
//!
//! Built on `http::request::Parts`, not through `RequestHeader`'s setters: those spell every
//! name out and parse it back (allocating for a name outside the standard set), and keep a map of
//! the names' case beside the fields. Here each field is set by a ready `HeaderName`, and the
//! request goes to the origin with lower-case names (RFC 9110 §5.1: names are case-insensitive).

use http::request::Parts;
use http::{HeaderName, HeaderValue, header};
use pingora_error::{Error, ErrorType, Result};

use super::client_session::ClientSession;
use super::context::RequestCtx;
use super::hop_by_hop::VIA;
use crate::routes::Route;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// What the origin is told of the client's connection ([`client_side`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientSide<'a> {
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
    client: ClientSide<'_>,
) -> Result<()> {
    let identity = &ctx.identity;
    request.uri = identity
        .upstream_target
        .parse::<http::Uri>()
        .map_err(|e| Error::because(ErrorType::InternalError, "upstream path", e))?;
    let headers = &mut request.headers;
    // HTTP/2 names the host in the URI's authority, HTTP/1 in Host.
    let client_host = match headers.get(header::HOST) {
        Some(host) => Some(host.clone()),
        None => client.authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
    };
    headers.insert(header::HOST, route.upstream.host_header(ctx.upstream.replica).clone());
    headers.remove(header::RANGE);
    let transforms = identity.transforms();
    if identity.chain().is_some() {
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
    if let Some(spec) = &identity.sent_range {
        headers.insert(header::RANGE, value(format!("bytes={spec}"), "Range")?);
        if let Some(planned_for) = &identity.planned_for {
            // Planned for this version: another one must come whole, to be planned again.
            headers.insert(header::IF_RANGE, value(planned_for.as_str(), "If-Range")?);
        } else if let Some(etag) = identity
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
    // The hop rangeway was connected from: a trusted proxy whose list named the client (the
    // client is in that list already), else the client.
    let forwarded_by =
        ctx.client.and_then(|client| client.forwarded_by).map(super::context::ip_text);
    if let Some(ip) = forwarded_by.as_ref().or(identity.client_ip.as_ref()) {
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
pub(super) fn client_side(session: &impl ClientSession) -> ClientSide<'_> {
    ClientSide { authority: session.req_header().uri.authority(), tls: session.is_tls() }
}

fn value<T>(text: T, name: &'static str) -> Result<HeaderValue>
where
    HeaderValue: TryFrom<T, Error = http::header::InvalidHeaderValue>,
{
    HeaderValue::try_from(text).map_err(|e| Error::because(ErrorType::InvalidHTTPHeader, name, e))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use rangeway_middleware::chain::Chain;
    use rangeway_middleware::rfc9110::RangeSpec;

    use super::*;
    use crate::proxy::context::DownloadCtx;
    use crate::proxy::identify::Identified;
    use crate::routes::upstream::{Timeouts, Upstream};
    use crate::state::ObjectVersion;

    fn route() -> Arc<Route> {
        let t = Duration::from_secs(1);
        let timeouts = Timeouts { connect: t, read: t, write: t, idle: t };
        let upstream =
            Upstream::http("origin", "127.0.0.1", 1, None, "origin.internal".into(), "/", timeouts)
                .unwrap();
        Arc::new(Route::new(None, "/", false, Arc::new(upstream), Chain::default()).unwrap())
    }

    fn client(fields: &[(&'static str, &str)]) -> Parts {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        for (name, value) in fields {
            parts.headers.append(*name, HeaderValue::from_str(value).unwrap());
        }
        parts
    }

    fn field<'a>(request: &'a Parts, name: &str) -> Vec<&'a str> {
        request.headers.get_all(name).iter().map(|v| v.to_str().unwrap()).collect()
    }

    fn ctx(route: &Arc<Route>) -> RequestCtx {
        let identity = Identified {
            route: Some(Arc::clone(route)),
            upstream_target: "/objects/a.bin?v=2".to_owned(),
            client_ip: Some("192.0.2.7".to_owned()),
            ..Identified::default()
        };
        RequestCtx { identity, ..RequestCtx::default() }
    }

    #[test]
    fn the_origin_is_told_the_client_and_asked_for_the_plan_only() {
        let route = route();
        let mut request = client(&[
            ("host", "dl.example"),
            ("x-forwarded-for", "10.0.0.1"),
            ("proxy-authorization", "Basic c2VjcmV0"),
            ("range", "bytes=5-"),
            ("if-range", "\"v1\""),
            ("accept", "*/*"),
        ]);
        let plain = ClientSide { authority: None, tls: false };
        complete(&mut request, &route, &ctx(&route), plain).unwrap();
        assert_eq!(request.uri, "/objects/a.bin?v=2");
        assert_eq!(field(&request, "host"), ["origin.internal"]);
        assert_eq!(field(&request, "x-forwarded-host"), ["dl.example"]);
        assert_eq!(field(&request, "x-forwarded-for"), ["10.0.0.1, 192.0.2.7"]);
        assert_eq!(field(&request, "x-forwarded-proto"), ["http"]);
        assert_eq!(field(&request, "via"), ["1.1 rangeway"]);
        assert_eq!(field(&request, "accept"), ["*/*"]);
        // No plan, no Range (the client's is planned, not forwarded), and no If-Range without one.
        for gone in ["proxy-authorization", "range", "if-range", "if-match"] {
            assert!(field(&request, gone).is_empty(), "{gone}");
        }
    }

    /// A client named by a trusted proxy's list is in that list already: the hop added is the
    /// proxy's.
    #[test]
    fn a_forwarded_client_is_not_added_twice() {
        let route = route();
        let mut request = client(&[("host", "dl.example"), ("x-forwarded-for", "192.0.2.7")]);
        let forwarded = crate::client_address::Client {
            ip: "192.0.2.7".parse().unwrap(),
            forwarded_by: Some("127.0.0.1".parse().unwrap()),
        };
        let ctx = RequestCtx { client: Some(forwarded), ..ctx(&route) };
        complete(&mut request, &route, &ctx, ClientSide { authority: None, tls: false }).unwrap();
        assert_eq!(field(&request, "x-forwarded-for"), ["192.0.2.7, 127.0.0.1"]);
    }

    #[test]
    fn a_resume_asks_its_range_of_its_one_version() {
        let route = route();
        let mut ctx = ctx(&route);
        ctx.identity.sent_range = Some(RangeSpec::From { first: 1000 });
        let version = ObjectVersion {
            etag: Some("\"v7\"".to_owned()),
            strong: true,
            size: 4096,
            last_modified: None,
            content_type: None,
        };
        ctx.identity.download = Some(DownloadCtx {
            id: "job".to_owned(),
            object: "/|/a.bin".to_owned(),
            session: None,
            resume_version: Some(version),
            delivering: None,
            origin_version: None,
        });
        // An HTTP/2 client over TLS names its host in the target's authority.
        let authority = http::uri::Authority::from_static("dl.example:8443");
        let mut request = client(&[("range", "bytes=1000-")]);
        let h2 = ClientSide { authority: Some(&authority), tls: true };
        complete(&mut request, &route, &ctx, h2).unwrap();
        assert_eq!(field(&request, "range"), ["bytes=1000-"]);
        assert_eq!(field(&request, "if-match"), ["\"v7\""]);
        assert_eq!(field(&request, "x-forwarded-host"), ["dl.example:8443"]);
        assert_eq!(field(&request, "x-forwarded-proto"), ["https"]);
        assert_eq!(field(&request, "host"), ["origin.internal"]);
    }
}
