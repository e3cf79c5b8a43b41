//! What concerns one connection and not the message (RFC 9110 §7.6.1): removed from what crosses
//! this hop, with `Via` added (§7.6.3).

use http::{HeaderName, HeaderValue, header};
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};

/// Written in `Via` on both sides (RFC 9110 §7.6.3).
pub(super) const VIA: &str = "1.1 rangeway";

/// Response fields that describe one connection, not the message (RFC 9110 §7.6.1).
/// Names, not strings: a map finds a `HeaderName` without parsing it again (every response and
/// relayed request looks for all of them).
pub(super) static HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// Hop-by-hop in a request rangeway sends itself, besides [`HOP_BY_HOP`].
pub(super) static REQUEST_HOP_BY_HOP: [HeaderName; 3] = [
    header::PROXY_AUTHENTICATE,
    header::TRANSFER_ENCODING,
    HeaderName::from_static("http2-settings"),
];

/// An upstream answer as it leaves this hop: its connection's fields dropped, `Via` added.
pub(super) fn forwarded(response: &mut ResponseHeader) -> Result<()> {
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
pub(super) fn strip_hop_by_hop(request: &mut RequestHeader) {
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

#[cfg(test)]
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
