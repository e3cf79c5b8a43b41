//! Content-coding negotiation (RFC 9110 §12.5.3): whether a client accepts a coding.

use http::{HeaderMap, header};

/// Whether `Accept-Encoding` in `headers` accepts `coding`: named with a non-zero weight, or
/// covered by `*` with a non-zero weight and not named with weight 0. No `Accept-Encoding` at all
/// accepts nothing but the identity here: a proxy that sends a coding the client did not ask for
/// breaks the clients that did not.
pub(super) fn accepts_coding(headers: &HeaderMap, coding: &str) -> bool {
    let mut named = None;
    let mut any = None;
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for item in value.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or_default().trim();
            let weight = parts
                .filter_map(|param| param.trim().split_once('='))
                .find(|(key, _)| key.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, q)| q.trim().parse::<f32>().ok());
            // An unreadable weight is read as "not acceptable": never send what may be refused.
            let acceptable = weight.is_some_and(|q| q > 0.0);
            if name.eq_ignore_ascii_case(coding) {
                named = Some(named.unwrap_or(false) || acceptable);
            } else if name == "*" {
                any = Some(any.unwrap_or(false) || acceptable);
            }
        }
    }
    named.or(any).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(values: &[&str]) -> bool {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(header::ACCEPT_ENCODING, value.parse().unwrap());
        }
        accepts_coding(&headers, "gzip")
    }

    #[test]
    fn weights_and_wildcards() {
        assert!(!accepts(&[]));
        assert!(accepts(&["gzip"]));
        assert!(accepts(&["deflate, GZIP;q=0.5"]));
        assert!(accepts(&["br", "gzip ; q=1"]));
        assert!(!accepts(&["gzip;q=0"]));
        assert!(!accepts(&["gzip;q=0.000"]));
        assert!(accepts(&["*"]));
        assert!(!accepts(&["*, gzip;q=0"]));
        assert!(!accepts(&["*;q=0"]));
        assert!(!accepts(&["identity"]));
        assert!(!accepts(&["gzip;q=abc"]));
        assert!(!accepts(&["x-gzip"]));
    }
}
