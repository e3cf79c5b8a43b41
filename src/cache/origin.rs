//! What the cache asks origins with, and what of their answers it keeps or hands to a client:
//! the client's fields it sends and those it leaves out, the variants `Vary` keeps apart, the
//! fields it stores, and when the answer to its own request is the client's too.

use std::collections::HashMap;

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use pingora_http::{RequestHeader, ResponseHeader};
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::{
    HOP_BY_HOP, RangeLimits, RangeRequest, Resolution, connection_options, parse_range_header,
};

use super::store::SliceStore;
use super::{Ask, Version};
use crate::routes::Route;

/// The request the cache asks the origin with for the object `request` — the request the relay
/// planned for a client — targets, made for `replica`: the client's end-to-end fields, so that
/// the origin answers as it would have answered the client and an answer that depends on them
/// says so (`Vary`, which the cache honours: RFC 9111 §4.1); less what the cache asks itself
/// (the range, the conditions, one coding for every client), and less what would let one
/// client's request choose what others are served by fields an origin reads without naming
/// them in `Vary`: every field that names a host or a scheme (an origin that builds links from
/// `X-Forwarded-Host`, say, would have a hostile client's stored) and `Cookie` (one user's; an
/// answer to a request with one is never handed to another, [`handover`]). The upstream's
/// `Host` is its own. One exception: the client's `Authorization` (`authorized`) on a route
/// that says such answers may be shared (`cache = { authorized = true }`): the origin needs it
/// to answer at all, and the route vouches that its answer is the same for every client. An S3
/// upstream's signature is rangeway's own, made again for each request.
pub(super) fn origin_request(
    route: &Route,
    request: &RequestHeader,
    replica: usize,
    authorized: bool,
) -> Option<RequestHeader> {
    let target = request.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut base = route.upstream.request("GET", target, replica).ok()?;
    let own = request.headers.iter().filter(|(name, _)| !not_forwarded(name.as_str()));
    for (name, value) in own {
        base.append_header(name.clone(), value.clone()).ok()?;
    }
    // One representation is kept for every client: the object's own bytes, not an encoding of
    // them some client accepts (RFC 9110 §12.5.3: without the field, any coding would do).
    base.insert_header(header::ACCEPT_ENCODING, "identity").ok()?;
    if authorized && let Some(credentials) = request.headers.get(header::AUTHORIZATION) {
        base.insert_header(header::AUTHORIZATION, credentials.clone()).ok()?;
    }
    Some(base)
}

/// Makes `request` a validation of `stale` (RFC 9111 §4.3.1): `If-None-Match` with its ETag,
/// strong or weak, and `If-Modified-Since` with its `Last-Modified`, whichever it has.
pub(super) fn conditional_on(request: &mut RequestHeader, stale: &Version) -> Option<()> {
    for (validator, condition) in
        [(header::ETAG, header::IF_NONE_MATCH), (header::LAST_MODIFIED, header::IF_MODIFIED_SINCE)]
    {
        if let Some(value) = stale.headers.get(&validator) {
            request.insert_header(condition, value.clone()).ok()?;
        }
    }
    Some(())
}

/// The bytes a 206 carries and the object's length, as its `Content-Range` states them.
pub(super) fn partial(response: &ResponseHeader) -> Option<(ByteRange, u64)> {
    let (range, len) = crate::range::stated_range(&response.headers)?;
    Some((range, len?))
}

/// The origin's answer to the cache's request for `ask`'s object, as the client's answer, which
/// the pipeline shapes for the client as any origin's (the client's range cut from it, its
/// preconditions evaluated). Only when nothing of the client's request could have changed it:
/// the client sent no `Cookie` (the cache's request never carries one), and each field the
/// answer's `Vary` names is the same in both requests ([`same_fields`]; `Vary: *` too, the
/// cache's request having been made for this client's). And only when it
/// holds what the client's answer needs: any status but 304, 412 and 416 (answers to conditions
/// or a range the client did not send); on a route whose stages do not change bytes, a 200, a 206
/// of the whole object (as the 200 it is; for a HEAD any 206, whose header is what the HEAD
/// wants), or a 206 holding the one range asked for, without `If-Range`.
pub(super) fn handover(ask: &Ask<'_>, answer: &ResponseHeader) -> Option<ResponseHeader> {
    let request = ask.request;
    let same = varies_by(&answer.headers)
        .is_none_or(|names| same_fields(&names, &ask.fetch.base.headers, &request.headers));
    if request.headers.contains_key(header::COOKIE) || !same {
        return None;
    }
    match answer.status.as_u16() {
        304 | 412 | 416 => return None,
        200 | 206 if !ask.route.chain.is_observing_only() => return None,
        206 => {}
        _ => return Some(answer.clone()),
    }
    let (got, len) = partial(answer)?;
    if got == ByteRange::whole(len) || request.method == Method::HEAD {
        let mut whole = answer.clone();
        whole.set_status(StatusCode::OK).ok()?;
        whole.remove_header(&header::CONTENT_RANGE);
        whole.insert_header(header::CONTENT_LENGTH, len).ok()?;
        return Some(whole);
    }
    let holds = match parse_range_header(&request.headers, &RangeLimits::with_max_ranges(1)) {
        Some(RangeRequest::Bytes(set)) => {
            matches!(set.resolve(len), Resolution::Single(range) if got.contains_range(&range))
        }
        _ => false,
    };
    (holds && !request.headers.contains_key(header::IF_RANGE)).then(|| answer.clone())
}

/// The request fields an answer with the fields `answer` varies by (its `Vary`, RFC 9111
/// §4.1), in lower case; `None` for `*` (or a line that is no text): by more than fields say.
pub(super) fn varies_by(answer: &HeaderMap) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for line in answer.get_all(header::VARY) {
        for name in line.to_str().ok()?.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return None;
            }
            names.push(name.to_ascii_lowercase());
        }
    }
    Some(names)
}

/// Whether the request field `name` (lower case) reaches the origin, in the cache's request, as the client
/// sent it — or, for `Accept-Encoding`, as identity coding, which every client takes — so that
/// answers varying by it can be kept apart by its value ([`origin_request`]).
pub(super) fn keyable(name: &str) -> bool {
    name == "accept-encoding" || !not_forwarded(name)
}

/// Whether the cache's request leaves out, or sets itself, the client's field `name` (lower
/// case): the range and the conditions, `Cookie`, `Authorization`, and every field that names a
/// host or a scheme ([`origin_request`]).
fn not_forwarded(name: &str) -> bool {
    const NOT_ASKED: [&str; 12] = [
        "host",
        "range",
        "if-range",
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
        "cookie",
        "authorization",
        "forwarded",
        "accept-encoding",
        "via",
    ];
    NOT_ASKED.contains(&name) || name.starts_with("x-forwarded-") || name.ends_with("-host")
}

/// The key of the variant of the object at `target` that a request with the fields `asked`
/// selects, by the fields `names` (lower case) its answers vary by: the target, a tab (which a
/// target never holds) and a digest of each name's values.
pub(super) fn variant(target: &str, names: &[String], asked: &HeaderMap) -> String {
    let values = names.iter().flat_map(|name| {
        let lines = asked.get_all(name.as_str()).iter().map(HeaderValue::as_bytes);
        std::iter::once(name.as_bytes()).chain(lines).chain(std::iter::once(&b"\n"[..]))
    });
    let digest = crate::fingerprint::digest(values);
    format!("{target}\t{}", crate::fingerprint::hex(&digest, 16))
}

/// The fields each object's stored answers vary by, from the versions a previous run left.
pub(super) fn varies_of(store: &SliceStore) -> HashMap<(String, String), Vec<String>> {
    let varying = store.versions().into_iter().filter_map(|version| {
        let (object, _) = version.target.split_once('\t')?;
        let names = varies_by(&version.headers)?;
        Some(((version.upstream.clone(), object.to_owned()), names))
    });
    varying.collect()
}

/// Whether each field of `names` has the same values in the requests with fields `one` and
/// `other` (absent from both included).
pub(super) fn same_fields(names: &[String], one: &HeaderMap, other: &HeaderMap) -> bool {
    names
        .iter()
        .all(|name| one.get_all(name.as_str()).iter().eq(other.get_all(name.as_str()).iter()))
}

/// The fields of an origin's answer the cache keeps: its end-to-end ones — not those of its
/// connection, the fields its `Connection` names included (RFC 9110 §7.6.1) — without those that
/// describe one message (length, range, framing). `Age` is kept, for the freshness of what is
/// stored (RFC 9111 §4.2.3); a hit sends its own.
pub(super) fn stored_fields(headers: &HeaderMap) -> HeaderMap {
    const OF_ONE_MESSAGE: [HeaderName; 6] = [
        header::CONTENT_LENGTH,
        header::CONTENT_RANGE,
        header::TRANSFER_ENCODING,
        header::SET_COOKIE,
        header::PROXY_AUTHENTICATE,
        header::VIA,
    ];
    let named: Vec<HeaderName> = connection_options(headers).collect();
    let kept = headers.iter().filter(|(name, _)| {
        !HOP_BY_HOP.contains(name) && !named.contains(name) && !OF_ONE_MESSAGE.contains(name)
    });
    kept.map(|(name, value)| (name.clone(), value.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_another_requests_when_the_fields_it_varies_by_are_the_same() {
        let fields = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, HeaderValue::from_static(value));
            }
            map
        };
        let (cache, client) = (fields(&[("host", "o")]), fields(&[("host", "o"), ("foo", "1")]));
        let same = |answer: &[(&'static str, &'static str)], one: &HeaderMap, other: &HeaderMap| {
            let answer = fields(answer);
            varies_by(&answer).map(|names| same_fields(&names, one, other))
        };
        assert_eq!(same(&[], &cache, &client), Some(true));
        assert_eq!(same(&[("vary", "Host, Bar")], &cache, &client), Some(true));
        assert_eq!(same(&[("vary", "Bar, Foo")], &cache, &client), Some(false));
        assert_eq!(same(&[("vary", "Host"), ("vary", "foo")], &cache, &client), Some(false));
        assert_eq!(same(&[("vary", "Host"), ("vary", ", *")], &cache, &cache), None);
        assert_eq!(same(&[("vary", "Foo")], &client, &client), Some(true));
    }
}
