//! Conditional requests (RFC 9110 §13): the preconditions of §13.2.2 and `If-Range` (§13.1.5).

use std::time::{Duration, SystemTime};

use http::header::{
    HeaderName, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE,
};
use http::{HeaderMap, HeaderValue, Method};

use super::etag::{EntityTag, EntityTagList};
use super::syntax::trim_ows;

/// How long before "now" a `Last-Modified` must lie to count as a strong validator (§8.8.2.2).
const STRONG_DATE_AGE: Duration = Duration::from_secs(60);

/// The validators of the selected representation, as its `ETag` and `Last-Modified` would state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validators {
    pub etag: Option<EntityTag>,
    pub last_modified: Option<SystemTime>,
}

/// The outcome of a request's preconditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precondition {
    /// Carry on with the request (and then, for a GET with Range, [`if_range_holds`]).
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// Evaluates `If-Match`, `If-Unmodified-Since`, `If-None-Match` and `If-Modified-Since` in the
/// order of §13.2.2.
///
/// Call it only for a representation that exists and would otherwise get a 2xx: §13.2.1 has every
/// other response (a 404, say) ignore preconditions. Requests whose method selects no
/// representation (CONNECT, OPTIONS, TRACE) always proceed.
///
/// 1. `If-Match`, strong comparison, `*` true: false → 412. When absent, `If-Unmodified-Since`:
///    `Last-Modified` later than the date → 412.
/// 2. `If-None-Match`, weak comparison, `*` true: a match → 304 for GET and HEAD, 412 for others.
///    When absent, and only for GET and HEAD, `If-Modified-Since`: `Last-Modified` at or before
///    the date → 304.
///
/// Unreadable input never turns into a 304 or into serving what the client did not ask for:
/// an invalid `If-Match` list matches nothing (412: the client wanted one version, and we cannot
/// tell which), an invalid `If-None-Match` list matches nothing (the full response is served).
/// A date header that is not one valid HTTP-date — several lines make a list of dates — is
/// ignored, as §13.1.3 and §13.1.4 require, and so are date conditions on a representation
/// without `Last-Modified`. Dates compare at whole seconds, the precision `Last-Modified` is sent
/// with.
pub fn evaluate_preconditions(
    method: &Method,
    headers: &HeaderMap,
    validators: &Validators,
) -> Precondition {
    if matches!(*method, Method::CONNECT | Method::OPTIONS | Method::TRACE) {
        return Precondition::Proceed;
    }
    let is_get_or_head = matches!(*method, Method::GET | Method::HEAD);
    let last_modified = validators.last_modified.and_then(unix_seconds);
    let etag = validators.etag.as_ref();

    if headers.contains_key(IF_MATCH) {
        if !tag_list(headers, &IF_MATCH).is_some_and(|list| list.strong_match(etag)) {
            return Precondition::Failed;
        }
    } else if let (Some(since), Some(modified)) =
        (single_http_date(headers, &IF_UNMODIFIED_SINCE), last_modified)
        && modified > since
    {
        return Precondition::Failed;
    }

    if headers.contains_key(IF_NONE_MATCH) {
        if tag_list(headers, &IF_NONE_MATCH).is_some_and(|list| list.weak_match(etag)) {
            return if is_get_or_head { Precondition::NotModified } else { Precondition::Failed };
        }
    } else if is_get_or_head
        && let (Some(since), Some(modified)) =
            (single_http_date(headers, &IF_MODIFIED_SINCE), last_modified)
        && modified <= since
    {
        return Precondition::NotModified;
    }
    Precondition::Proceed
}

/// Whether a range request's `If-Range` lets the Range be served (§13.1.5); `true` when there is
/// no `If-Range`. `false` means: ignore Range and send the whole representation (200), which is
/// always correct, so every doubt lands here.
///
/// Only meaningful with a `Range` header (§13.1.5 has `If-Range` ignored without one).
///
/// - An entity tag holds only if it strongly matches the representation's: a weak tag, or a
///   representation with a weak tag or none, never does.
/// - An HTTP-date holds only if the representation has no entity tag, the date equals its
///   `Last-Modified` (to the second), and that `Last-Modified` is strong in the sense of
///   §8.8.2.2: at least 60 s before `now`, so that two versions within its second are unlikely.
///   §13.1.5 leaves it to the server to judge whether a date is strong, and a proxy cannot know
///   that its upstream never changed an object twice within a second (S3, for one, stamps a
///   multipart upload with the time it began, not when it finished). A client holding an entity
///   tag must send it instead of a date (§13.1.5), so when the representation has one the date is
///   not trusted; with a weak entity tag the origin says its bytes may differ under one validator,
///   and no date can promise more.
/// - Several lines, an unreadable value, or a date when there is no `Last-Modified`: false.
pub fn if_range_holds(headers: &HeaderMap, validators: &Validators, now: SystemTime) -> bool {
    let mut lines = headers.get_all(IF_RANGE).iter();
    let Some(line) = lines.next() else {
        return true;
    };
    if lines.next().is_some() {
        return false;
    }
    let value = trim_ows(line.as_bytes());
    // An HTTP-date starts with a day name, never with `"` or `W/`.
    if value.starts_with(b"\"") || value.starts_with(b"W/") {
        return match (EntityTag::parse(value), &validators.etag) {
            (Some(sent), Some(current)) => sent.strong_eq(current),
            _ => false,
        };
    }
    if validators.etag.is_some() {
        return false;
    }
    let (Some(date), Some(modified)) =
        (http_date(value), validators.last_modified.and_then(unix_seconds))
    else {
        return false;
    };
    let old_enough = modified
        .checked_add(STRONG_DATE_AGE.as_secs())
        .zip(unix_seconds(now))
        .is_some_and(|(strong_from, now)| strong_from <= now);
    date == modified && old_enough
}

/// All lines of a list header as one list; `None` when it does not parse.
fn tag_list(headers: &HeaderMap, name: &HeaderName) -> Option<EntityTagList> {
    EntityTagList::parse(headers.get_all(name).iter().map(HeaderValue::as_bytes))
}

/// The header's date in whole seconds since the Unix epoch, when it is exactly one valid
/// HTTP-date.
fn single_http_date(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let mut lines = headers.get_all(name).iter();
    let line = lines.next()?;
    if lines.next().is_some() {
        return None;
    }
    http_date(trim_ows(line.as_bytes()))
}

/// Any of the three HTTP-date formats recipients must accept (§5.6.7), in seconds since the epoch.
fn http_date(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    unix_seconds(httpdate::parse_http_date(text).ok()?)
}

/// Whole seconds since the Unix epoch, the precision of an HTTP-date; `None` before 1970, which no
/// HTTP-date can state.
fn unix_seconds(time: SystemTime) -> Option<u64> {
    time.duration_since(SystemTime::UNIX_EPOCH).ok().map(|since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2024-01-01T00:00:00Z.
    const MODIFIED_SECS: u64 = 1_704_067_200;
    const MODIFIED: &str = "Mon, 01 Jan 2024 00:00:00 GMT";
    const EARLIER: &str = "Sun, 31 Dec 2023 23:59:59 GMT";
    const LATER: &str = "Mon, 01 Jan 2024 00:00:01 GMT";

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// A representation with a strong tag `"v1"`, modified at [`MODIFIED`] plus half a second
    /// (which the second-precision comparisons must not trip over).
    fn validators() -> Validators {
        Validators {
            etag: EntityTag::strong("v1"),
            last_modified: Some(at(MODIFIED_SECS) + Duration::from_millis(500)),
        }
    }

    fn headers(pairs: &[(HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn get(pairs: &[(HeaderName, &str)]) -> Precondition {
        evaluate_preconditions(&Method::GET, &headers(pairs), &validators())
    }

    use Precondition::{Failed, NotModified, Proceed};

    #[test]
    fn no_conditions_proceed() {
        assert_eq!(get(&[]), Proceed);
        assert_eq!(
            evaluate_preconditions(&Method::GET, &HeaderMap::new(), &Validators::default()),
            Proceed
        );
    }

    #[test]
    fn step_1_if_match_uses_strong_comparison() {
        assert_eq!(get(&[(IF_MATCH, "\"v1\"")]), Proceed);
        assert_eq!(get(&[(IF_MATCH, "\"v0\", \"v1\"")]), Proceed);
        assert_eq!(get(&[(IF_MATCH, "\"v0\""), (IF_MATCH, "\"v1\"")]), Proceed);
        assert_eq!(get(&[(IF_MATCH, "*")]), Proceed);
        assert_eq!(get(&[(IF_MATCH, "\"v0\"")]), Failed);
        assert_eq!(get(&[(IF_MATCH, "W/\"v1\"")]), Failed);
        // Unreadable: matches nothing.
        assert_eq!(get(&[(IF_MATCH, "v1")]), Failed);
        assert_eq!(get(&[(IF_MATCH, "*"), (IF_MATCH, "\"v1\"")]), Failed);
        assert_eq!(get(&[(IF_MATCH, "")]), Failed);
        // A weak current tag never matches strongly; `*` only asks that the representation exist.
        let weak = Validators { etag: EntityTag::weak("v1"), last_modified: None };
        let if_match =
            |value| evaluate_preconditions(&Method::GET, &headers(&[(IF_MATCH, value)]), &weak);
        assert_eq!(if_match("W/\"v1\""), Failed);
        assert_eq!(if_match("\"v1\""), Failed);
        assert_eq!(if_match("*"), Proceed);
        let untagged = Validators::default();
        let if_match =
            |value| evaluate_preconditions(&Method::GET, &headers(&[(IF_MATCH, value)]), &untagged);
        assert_eq!(if_match("\"v1\""), Failed);
        assert_eq!(if_match("*"), Proceed);
    }

    #[test]
    fn step_2_if_unmodified_since() {
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, MODIFIED)]), Proceed);
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, LATER)]), Proceed);
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, EARLIER)]), Failed);
        // The obsolete formats are read too.
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, "Sunday, 31-Dec-23 23:59:59 GMT")]), Failed);
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, "Sun Dec 31 23:59:59 2023")]), Failed);
        // Invalid, or a list of dates: ignored.
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, "yesterday")]), Proceed);
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, EARLIER), (IF_UNMODIFIED_SINCE, EARLIER)]), Proceed);
        // No Last-Modified: ignored.
        let untimed = Validators { etag: EntityTag::strong("v1"), last_modified: None };
        let headers = headers(&[(IF_UNMODIFIED_SINCE, EARLIER)]);
        assert_eq!(evaluate_preconditions(&Method::GET, &headers, &untimed), Proceed);
    }

    #[test]
    fn if_match_takes_precedence_over_if_unmodified_since() {
        assert_eq!(get(&[(IF_MATCH, "\"v1\""), (IF_UNMODIFIED_SINCE, EARLIER)]), Proceed);
        assert_eq!(get(&[(IF_MATCH, "\"v0\""), (IF_UNMODIFIED_SINCE, LATER)]), Failed);
    }

    #[test]
    fn step_3_if_none_match_uses_weak_comparison() {
        assert_eq!(get(&[(IF_NONE_MATCH, "\"v1\"")]), NotModified);
        assert_eq!(get(&[(IF_NONE_MATCH, "W/\"v1\"")]), NotModified);
        assert_eq!(get(&[(IF_NONE_MATCH, "\"v0\", W/\"v1\"")]), NotModified);
        assert_eq!(get(&[(IF_NONE_MATCH, "\"v0\""), (IF_NONE_MATCH, "\"v1\"")]), NotModified);
        assert_eq!(get(&[(IF_NONE_MATCH, "*")]), NotModified);
        assert_eq!(get(&[(IF_NONE_MATCH, "\"v0\"")]), Proceed);
        // Unreadable: matches nothing, so the full response goes out.
        assert_eq!(get(&[(IF_NONE_MATCH, "v1")]), Proceed);
        assert_eq!(get(&[(IF_NONE_MATCH, "\"v1\" garbage")]), Proceed);
        let head = evaluate_preconditions(
            &Method::HEAD,
            &headers(&[(IF_NONE_MATCH, "\"v1\"")]),
            &validators(),
        );
        assert_eq!(head, NotModified);
        let put =
            evaluate_preconditions(&Method::PUT, &headers(&[(IF_NONE_MATCH, "*")]), &validators());
        assert_eq!(put, Failed);
        let delete = evaluate_preconditions(
            &Method::DELETE,
            &headers(&[(IF_NONE_MATCH, "\"v0\"")]),
            &validators(),
        );
        assert_eq!(delete, Proceed);
    }

    #[test]
    fn step_4_if_modified_since_only_for_get_and_head() {
        assert_eq!(get(&[(IF_MODIFIED_SINCE, MODIFIED)]), NotModified);
        assert_eq!(get(&[(IF_MODIFIED_SINCE, LATER)]), NotModified);
        assert_eq!(get(&[(IF_MODIFIED_SINCE, EARLIER)]), Proceed);
        assert_eq!(get(&[(IF_MODIFIED_SINCE, "not a date")]), Proceed);
        assert_eq!(get(&[(IF_MODIFIED_SINCE, MODIFIED), (IF_MODIFIED_SINCE, MODIFIED)]), Proceed);
        let post = evaluate_preconditions(
            &Method::POST,
            &headers(&[(IF_MODIFIED_SINCE, LATER)]),
            &validators(),
        );
        assert_eq!(post, Proceed);
        let untimed = Validators { etag: EntityTag::strong("v1"), last_modified: None };
        let headers = headers(&[(IF_MODIFIED_SINCE, LATER)]);
        assert_eq!(evaluate_preconditions(&Method::HEAD, &headers, &untimed), Proceed);
    }

    #[test]
    fn if_none_match_takes_precedence_over_if_modified_since() {
        assert_eq!(get(&[(IF_NONE_MATCH, "\"v0\""), (IF_MODIFIED_SINCE, LATER)]), Proceed);
        assert_eq!(get(&[(IF_NONE_MATCH, "\"v1\""), (IF_MODIFIED_SINCE, EARLIER)]), NotModified);
        // Even an unreadable If-None-Match displaces If-Modified-Since.
        assert_eq!(get(&[(IF_NONE_MATCH, "v1"), (IF_MODIFIED_SINCE, LATER)]), Proceed);
    }

    #[test]
    fn failing_step_1_or_2_wins_over_steps_3_and_4() {
        assert_eq!(get(&[(IF_MATCH, "\"v0\""), (IF_NONE_MATCH, "\"v1\"")]), Failed);
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, EARLIER), (IF_MODIFIED_SINCE, LATER)]), Failed);
        assert_eq!(get(&[(IF_MATCH, "\"v1\""), (IF_NONE_MATCH, "\"v1\"")]), NotModified);
        assert_eq!(get(&[(IF_UNMODIFIED_SINCE, LATER), (IF_MODIFIED_SINCE, LATER)]), NotModified);
    }

    #[test]
    fn methods_without_a_representation_ignore_preconditions() {
        for method in [Method::OPTIONS, Method::TRACE, Method::CONNECT] {
            let headers = headers(&[(IF_MATCH, "\"v0\""), (IF_NONE_MATCH, "*")]);
            assert_eq!(evaluate_preconditions(&method, &headers, &validators()), Proceed);
        }
    }

    fn if_range(value: &str, validators: &Validators, now: SystemTime) -> bool {
        if_range_holds(&headers(&[(IF_RANGE, value)]), validators, now)
    }

    #[test]
    fn if_range_with_entity_tags_is_strong_only() {
        let now = at(MODIFIED_SECS + 3600);
        assert!(if_range_holds(&HeaderMap::new(), &validators(), now));
        assert!(if_range("\"v1\"", &validators(), now));
        assert!(if_range(" \"v1\" ", &validators(), now));
        assert!(!if_range("\"v0\"", &validators(), now));
        assert!(!if_range("W/\"v1\"", &validators(), now));
        let weak = Validators { etag: EntityTag::weak("v1"), ..validators() };
        assert!(!if_range("\"v1\"", &weak, now));
        assert!(!if_range("W/\"v1\"", &weak, now));
        let untagged = Validators { etag: None, ..validators() };
        assert!(!if_range("\"v1\"", &untagged, now));
        // Malformed: the Range is not honoured.
        assert!(!if_range("\"v1", &validators(), now));
        assert!(!if_range("\"v1\", \"v2\"", &validators(), now));
        assert!(!if_range("*", &validators(), now));
        let twice = headers(&[(IF_RANGE, "\"v1\""), (IF_RANGE, "\"v1\"")]);
        assert!(!if_range_holds(&twice, &validators(), now));
    }

    #[test]
    fn if_range_with_dates_needs_an_exact_strong_last_modified_and_no_tag() {
        let untagged = Validators { etag: None, ..validators() };
        let old = at(MODIFIED_SECS + 60);
        assert!(if_range(MODIFIED, &untagged, old));
        assert!(if_range("Monday, 01-Jan-24 00:00:00 GMT", &untagged, old));
        // Exact match only: not "earlier or equal".
        assert!(!if_range(LATER, &untagged, old));
        assert!(!if_range(EARLIER, &untagged, old));
        // Modified less than a minute before now: maybe twice in that second.
        assert!(!if_range(MODIFIED, &untagged, at(MODIFIED_SECS + 59)));
        assert!(!if_range(MODIFIED, &untagged, at(MODIFIED_SECS - 3600)));
        // With an entity tag, strong or weak, a date is not trusted.
        assert!(!if_range(MODIFIED, &validators(), old));
        let weak = Validators { etag: EntityTag::weak("v1"), ..validators() };
        assert!(!if_range(MODIFIED, &weak, old));
        // Without Last-Modified, or with garbage, nothing holds.
        assert!(!if_range(MODIFIED, &Validators::default(), old));
        assert!(!if_range("soon", &untagged, old));
        assert!(!if_range("", &untagged, old));
        // Times HTTP cannot write compare as absent.
        let ancient = Validators {
            etag: None,
            last_modified: SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(1)),
        };
        assert!(!if_range("Thu, 01 Jan 1970 00:00:00 GMT", &ancient, old));
        assert!(!if_range(MODIFIED, &untagged, SystemTime::UNIX_EPOCH - Duration::from_secs(1)));
    }

    #[test]
    fn values_that_are_not_utf8_are_unreadable() {
        let mut map = HeaderMap::new();
        map.insert(IF_RANGE, HeaderValue::from_bytes(b"\"v\xff\"").unwrap());
        map.insert(
            IF_MODIFIED_SINCE,
            HeaderValue::from_bytes(b"Mon, 01 Jan 2024 00:00:00 GMT\xff").unwrap(),
        );
        assert!(!if_range_holds(&map, &validators(), at(MODIFIED_SECS + 3600)));
        assert_eq!(evaluate_preconditions(&Method::GET, &map, &validators()), Proceed);
    }
}
