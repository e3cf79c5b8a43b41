//! What concerns one connection and not the message (RFC 9110 §7.6.1): removed from what crosses
//! this hop, with `Via` added (§7.6.3).

use http::{HeaderMap, HeaderName, HeaderValue, header};
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use rangeway_middleware::rfc9110::{HOP_BY_HOP, connection_options};

/// Written in `Via` on both sides (RFC 9110 §7.6.3).
pub(super) const VIA: &str = "1.1 rangeway";

/// Hop-by-hop in a request rangeway sends itself, besides [`HOP_BY_HOP`].
pub(super) static REQUEST_HOP_BY_HOP: [HeaderName; 3] = [
    header::PROXY_AUTHENTICATE,
    header::TRANSFER_ENCODING,
    HeaderName::from_static("http2-settings"),
];

/// Fields rangeway may add to an answer it forwards: `Via`, `X-Download-Id`, `Accept-Ranges`,
/// the sent-prefix hint, `Vary`, `Content-Range`.
const ADDED_TO_ANSWERS: usize = 6;

/// A copy of `origin`'s answer for the relay to forward, with room for the fields it adds.
///
/// Built rather than cloned: a clone's map is the origin's exact size, so the first field added
/// grows it, and pingora's map of each name's spelling with it (the first field added cost a small
/// response much more that way than it costs this copy; see docs/benchmarks.md, "Instructions per
/// request"). The copy keeps no spelling: HTTP/1 clients get each name in pingora's usual
/// spelling (`Content-Length`) or in lower case (names are case-insensitive,
/// RFC 9110 §5.1; HTTP/2 has only lower case), and the reason phrase is the status's own.
pub(super) fn answer_to_forward(origin: &ResponseHeader) -> ResponseHeader {
    let mut headers = HeaderMap::with_capacity(origin.headers.len() + ADDED_TO_ANSWERS);
    for (name, value) in &origin.headers {
        headers.append(name.clone(), value.clone());
    }
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = origin.status;
    parts.version = origin.version;
    parts.headers = headers;
    ResponseHeader::from(parts)
}

/// An upstream answer as it leaves this hop: its connection's fields — the hop-by-hop ones and
/// those its `Connection` names — dropped, `Via` added.
pub(super) fn forwarded(response: &mut ResponseHeader) -> Result<()> {
    // One pass over the few fields an answer has finds those to remove ([`HOP_BY_HOP`], whose
    // first is `Connection`): removing by each name
    // would hash and probe the map, and pingora's map of their case, twelve times a response.
    let mut present = [false; HOP_BY_HOP.len()];
    for name in response.headers.keys() {
        if let Some(index) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            present[index] = true;
        }
    }
    // What the origin's `Connection` names is of its connection too (RFC 9110 §7.6.1): read
    // before `Connection` goes. Rare, so only then collected.
    if present[0] {
        let named: Vec<HeaderName> = connection_options(&response.headers).collect();
        for name in named {
            response.remove_header(&name);
        }
    }
    for (name, present) in HOP_BY_HOP.iter().zip(present) {
        if present {
            response.remove_header(name);
        }
    }
    // Named by a string: pingora copies the name of a `HeaderName` it has no spelling of its own
    // for (and `Via` is written so on the client's side).
    response.append_header("Via", HeaderValue::from_static(VIA))?;
    Ok(())
}

/// The request rangeway sends itself for `client`'s: its method and end-to-end fields, without
/// what concerns only the client's connection — the fields its `Connection` names (but the ones
/// rangeway sets itself) and the hop-by-hop fields (RFC 9110 §7.6.1), as pingora strips the
/// requests it proxies. A client's `Connection: close` would otherwise close the pooled origin
/// connection too. HTTP/1.1, whatever the client spoke; completed by `origin_request::complete`.
///
/// Built rather than cloned and stripped: a clone carries pingora's map of the client's header
/// case, and removing the hop-by-hop names one by one probes the map nine times.
pub(super) fn end_to_end(client: &RequestHeader) -> http::request::Parts {
    let nominated: Vec<HeaderName> = connection_options(&client.headers)
        .filter(|name| {
            !matches!(
                name.as_str(),
                "host" | "x-forwarded-for" | "x-forwarded-host" | "x-forwarded-proto" | "via"
            )
        })
        .collect();
    // Room for what origin_request::complete adds (Host, X-Forwarded-*, Via, Range...).
    let mut headers = HeaderMap::with_capacity(client.headers.len() + 6);
    for (name, value) in &client.headers {
        let hop_by_hop = HOP_BY_HOP.contains(name) || REQUEST_HOP_BY_HOP.contains(name);
        if !hop_by_hop && !nominated.contains(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = client.method.clone();
    parts.headers = headers;
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_answer_keeps_every_field_in_order_with_room_for_more() {
        let mut origin = ResponseHeader::build(206, Some(3)).unwrap();
        for (name, value) in [
            ("Content-Length", "10"),
            ("Set-Cookie", "a=1"),
            ("X-Amz-Id", "7"),
            ("Set-Cookie", "b=2"),
        ] {
            origin.append_header(name, value).unwrap();
        }
        let answer = answer_to_forward(&origin);
        assert_eq!(answer.status, 206);
        assert_eq!(answer.version, origin.version);
        assert_eq!(answer.headers, origin.headers);
        let cookies: Vec<_> = answer.headers.get_all(header::SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(!answer.has_case());
        assert!(answer.headers.capacity() >= origin.headers.len() + ADDED_TO_ANSWERS);
    }

    #[test]
    fn a_forwarded_answer_loses_the_fields_its_connection_names() {
        let mut answer = ResponseHeader::build(200, None).unwrap();
        for (name, value) in [
            ("Connection", "X-Foo, keep-alive"),
            ("Connection", "x-bar"),
            ("X-Foo", "1"),
            ("X-Bar", "2"),
            ("Keep-Alive", "timeout=5"),
            ("X-Kept", "3"),
        ] {
            answer.append_header(name, value).unwrap();
        }
        forwarded(&mut answer).unwrap();
        let mut left: Vec<&str> = answer.headers.keys().map(|name| name.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["via", "x-kept"]);
    }

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
        let request = end_to_end(&request);
        assert_eq!(request.version, http::Version::HTTP_11);
        assert_eq!(request.method, http::Method::GET);
        let mut left: Vec<&str> = request.headers.keys().map(|name| name.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "range", "x-forwarded-for"]);
    }
}
