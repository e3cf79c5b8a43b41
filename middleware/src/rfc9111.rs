//! The parts of RFC 9111 (HTTP Caching) a shared cache needs: whether a response may be stored
//! (§3), how long it stays fresh (§4.2.1, with heuristic freshness only where §4.2.2 allows it),
//! its age (§4.2.3), what a request's own `Cache-Control` asks of a stored response (§5.2.1), and
//! how a `304` updates what is stored (§3.2, §4.3.4).
//!
//! Pure functions of header bytes and clock readings: the cache that uses them does the I/O.
//!
//! # Choices this module makes
//!
//! **Doubt means stale.** A `max-age` or `s-maxage` that is not a number, or is given twice with
//! different values, an `Expires` that is not one valid HTTP-date: the response is stale at once
//! (§1.2.2, §4.2.1 and §5.3 allow it), so it is validated before it is served again — never served
//! longer than its origin may have meant.
//!
//! **Qualified forms count whole.** `private="Set-Cookie"` and `no-cache="Set-Cookie"` name fields
//! a shared cache may not reuse without validation; this cache does not keep response fields
//! apart, so it treats them as their unqualified forms (not stored; always validated).
//!
//! **Stale is served only where a directive allows it**: the request's `max-stale` (§5.2.1.2),
//! the response's `stale-while-revalidate` and either's `stale-if-error` (RFC 5861) — and never
//! where `must-revalidate`, `proxy-revalidate`, `s-maxage` or `no-cache` forbids it (§4.2.4).
//! Otherwise a stale response is validated before use, and when validation fails the request is
//! answered as without a cache.

use std::time::{Duration, SystemTime};

use http::header::{AGE, AUTHORIZATION, CACHE_CONTROL, DATE, EXPIRES, LAST_MODIFIED, PRAGMA};
use http::{HeaderMap, HeaderName, Method, StatusCode};

/// The heuristic freshness of a response with a `Last-Modified` and no explicit expiry: this
/// fraction of the time since it was modified (§4.2.2's "typical setting" of 10 %).
const HEURISTIC_FRACTION: u32 = 10;

/// The most heuristic freshness can give: a day, so that an object modified years ago is still
/// validated daily.
const HEURISTIC_CAP: Duration = Duration::from_secs(24 * 60 * 60);

/// The statuses a response may be reused by heuristics with (RFC 9110 §15.1).
const HEURISTICALLY_CACHEABLE: [u16; 12] =
    [200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501];

/// The statuses whose semantics RFC 9110 defines: what `must-understand` asks a cache to know.
const UNDERSTOOD: [std::ops::RangeInclusive<u16>; 6] =
    [200..=206, 300..=305, 307..=308, 400..=417, 421..=422, 500..=505];

/// The directives of a `Cache-Control` field this cache acts on (§5.2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheControl {
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    /// `max-age`, seconds; `Some(0)` when it was unreadable (see the module's choices).
    pub max_age: Option<u64>,
    /// `s-maxage`, seconds, as `max_age`.
    pub s_maxage: Option<u64>,
    /// `min-fresh` of a request, seconds.
    pub min_fresh: Option<u64>,
    /// `max-stale` of a request, seconds; `Some(u64::MAX)` without a value (any staleness).
    pub max_stale: Option<u64>,
    /// `only-if-cached` of a request: answer from the cache or with 504.
    pub only_if_cached: bool,
    /// `must-understand`: stored only when the cache knows the status's semantics (§5.2.2.3).
    pub must_understand: bool,
    /// `stale-while-revalidate` (RFC 5861 §3), seconds.
    pub stale_while_revalidate: Option<u64>,
    /// `stale-if-error` (RFC 5861 §4), seconds.
    pub stale_if_error: Option<u64>,
}

impl CacheControl {
    /// The directives of every `Cache-Control` line of `headers`, as one list (§5.2).
    pub fn of(headers: &HeaderMap) -> Self {
        Self::parse(headers.get_all(CACHE_CONTROL).iter().map(|v| v.as_bytes()))
    }

    /// The directives of `lines`, each a comma-separated list of `name[=value]`, names
    /// case-insensitive, values tokens or quoted strings. Directives this cache does not know are
    /// ignored (§5.2.3).
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut control = Self::default();
        for line in lines {
            for directive in split_list(line) {
                let (name, value) = match directive.iter().position(|&b| b == b'=') {
                    Some(at) => (&directive[..at], Some(unquote(trim(&directive[at + 1..])))),
                    None => (directive, None),
                };
                let name = trim(name);
                let is = |known: &str| name.eq_ignore_ascii_case(known.as_bytes());
                if is("no-store") {
                    control.no_store = true;
                } else if is("no-cache") {
                    control.no_cache = true;
                } else if is("private") {
                    control.private = true;
                } else if is("public") {
                    control.public = true;
                } else if is("must-revalidate") {
                    control.must_revalidate = true;
                } else if is("proxy-revalidate") {
                    control.proxy_revalidate = true;
                } else if is("max-age") {
                    control.max_age = Some(merge_seconds(control.max_age, value));
                } else if is("s-maxage") {
                    control.s_maxage = Some(merge_seconds(control.s_maxage, value));
                } else if is("min-fresh") {
                    control.min_fresh = Some(merge_seconds(control.min_fresh, value));
                } else if is("max-stale") {
                    // A value that cannot be read allows no staleness rather than any.
                    control.max_stale =
                        Some(value.map_or(u64::MAX, |v| parse_seconds(v).unwrap_or(0)));
                } else if is("only-if-cached") {
                    control.only_if_cached = true;
                } else if is("must-understand") {
                    control.must_understand = true;
                } else if is("stale-while-revalidate") {
                    control.stale_while_revalidate = value.and_then(parse_seconds);
                } else if is("stale-if-error") {
                    control.stale_if_error = value.and_then(parse_seconds);
                }
            }
        }
        control
    }
}

/// Why a response may not be stored by a shared cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotStorable {
    /// A method other than GET.
    Method,
    /// A status that is not final, a `304`, one whose semantics the cache does not know while
    /// `must-understand` says it must, or one that is neither heuristically cacheable nor given
    /// an explicit freshness or `public` (§3).
    Status,
    /// `no-store` in the request or the response.
    NoStore,
    /// `private`: for one user's cache only.
    Private,
    /// The request carried `Authorization` and the response does not say a shared cache may
    /// keep it (`public`, `s-maxage` or `must-revalidate`, §3.5).
    Authorization,
}

impl NotStorable {
    /// A short name, for a metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Method => "method",
            Self::Status => "status",
            Self::NoStore => "no_store",
            Self::Private => "private",
            Self::Authorization => "authorization",
        }
    }
}

/// Whether a shared cache may store the response to a request (§3): `method` and the request's
/// `request` fields, the response's `status` and `response` fields.
pub fn storable(
    method: &Method,
    request: &HeaderMap,
    status: StatusCode,
    response: &HeaderMap,
) -> Result<(), NotStorable> {
    if method != Method::GET {
        return Err(NotStorable::Method);
    }
    let control = CacheControl::of(response);
    let code = status.as_u16();
    let understood = UNDERSTOOD.iter().any(|known| known.contains(&code));
    if code < 200 || code == 304 || (control.must_understand && !understood) {
        return Err(NotStorable::Status);
    }
    // `must-understand` with a known status overrides `no-store` (§5.2.2.3).
    let no_store = control.no_store && !control.must_understand;
    if no_store || CacheControl::of(request).no_store {
        return Err(NotStorable::NoStore);
    }
    let explicit = control.public
        || control.max_age.is_some()
        || control.s_maxage.is_some()
        || response.contains_key(EXPIRES);
    if !explicit && !HEURISTICALLY_CACHEABLE.contains(&code) {
        return Err(NotStorable::Status);
    }
    if control.private {
        return Err(NotStorable::Private);
    }
    let shared_may = control.public || control.s_maxage.is_some() || control.must_revalidate;
    if request.contains_key(AUTHORIZATION) && !shared_may {
        return Err(NotStorable::Authorization);
    }
    Ok(())
}

/// What a stored response's age and freshness are computed from: its fields and when it was
/// asked for and received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freshness {
    pub control: CacheControl,
    /// `Date`, when it was one valid HTTP-date.
    pub date: Option<SystemTime>,
    /// `Expires`: `Some(None)` when present but not one valid HTTP-date (a time in the past).
    pub expires: Option<Option<SystemTime>>,
    pub last_modified: Option<SystemTime>,
    /// `Age`, seconds.
    pub age: Option<u64>,
    /// When the request that brought the response was sent.
    pub request_time: SystemTime,
    /// When the response arrived.
    pub response_time: SystemTime,
}

impl Freshness {
    /// The facts of a response with fields `headers`, asked for at `request_time` and received at
    /// `response_time`.
    pub fn of(headers: &HeaderMap, request_time: SystemTime, response_time: SystemTime) -> Self {
        Self {
            control: CacheControl::of(headers),
            date: single_date(headers, &DATE).flatten(),
            expires: single_date(headers, &EXPIRES),
            last_modified: single_date(headers, &LAST_MODIFIED).flatten(),
            age: age(headers),
            request_time,
            response_time,
        }
    }

    /// How long after its generation the response is fresh, for a shared cache (§4.2.1):
    /// `s-maxage`, else `max-age`, else `Expires` minus `Date`, else heuristically (§4.2.2) a
    /// tenth of the time since `Last-Modified`, at most a day; zero without any of them.
    pub fn lifetime(&self) -> Duration {
        if let Some(seconds) = self.control.s_maxage.or(self.control.max_age) {
            return Duration::from_secs(seconds);
        }
        let date = self.date.unwrap_or(self.response_time);
        if let Some(expires) = self.expires {
            return expires.and_then(|e| e.duration_since(date).ok()).unwrap_or(Duration::ZERO);
        }
        // Heuristics only for a status that allows them (200 and 206 both are, §15.1 of RFC
        // 9110) and without an explicit expiry (above).
        self.last_modified
            .and_then(|modified| date.duration_since(modified).ok())
            .map_or(Duration::ZERO, |since| (since / HEURISTIC_FRACTION).min(HEURISTIC_CAP))
    }

    /// The response's current age at `now` (§4.2.3).
    pub fn age_at(&self, now: SystemTime) -> Duration {
        let date = self.date.unwrap_or(self.response_time);
        let apparent = self.response_time.duration_since(date).unwrap_or(Duration::ZERO);
        let delay = self.response_time.duration_since(self.request_time).unwrap_or(Duration::ZERO);
        let corrected = Duration::from_secs(self.age.unwrap_or(0)).saturating_add(delay);
        let initial = apparent.max(corrected);
        let resident = now.duration_since(self.response_time).unwrap_or(Duration::ZERO);
        initial.saturating_add(resident)
    }

    /// Whether the stored response may be served at `now` without validation to a request with
    /// fields `request` (§4, §5.2.1): fresh, not `no-cache`, and within what the request allows.
    pub fn serves_unvalidated(&self, request: &HeaderMap, now: SystemTime) -> bool {
        if self.control.no_cache || asks_validation(request) {
            return false;
        }
        let asked = CacheControl::of(request);
        let age = self.age_at(now);
        let lifetime = self.lifetime();
        let within_max_age = asked.max_age.is_none_or(|max| age <= Duration::from_secs(max));
        let min_fresh = Duration::from_secs(asked.min_fresh.unwrap_or(0));
        let fresh = age.saturating_add(min_fresh) < lifetime;
        // `max-stale` (§5.2.1.2), where the response lets a stale copy be served at all.
        let stale_by = age.saturating_sub(lifetime);
        let stale_allowed = asked
            .max_stale
            .is_some_and(|max| self.may_serve_stale() && stale_by <= Duration::from_secs(max));
        within_max_age && (fresh || stale_allowed)
    }

    /// Whether the response lets a shared cache serve it stale at all (§4.2.4): not with
    /// `must-revalidate`, `proxy-revalidate` or `s-maxage` (§5.2.2.2, §5.2.2.8, §5.2.2.10),
    /// nor `no-cache`.
    pub fn may_serve_stale(&self) -> bool {
        let c = &self.control;
        !(c.must_revalidate || c.proxy_revalidate || c.s_maxage.is_some() || c.no_cache)
    }

    /// Whether the response, stale at `now`, may be served to a request with fields `request`
    /// while it is validated in the background: within its `stale-while-revalidate` (RFC 5861
    /// §3), where it may be served stale at all and the request does not ask for validation.
    pub fn serves_while_revalidating(&self, request: &HeaderMap, now: SystemTime) -> bool {
        self.control.stale_while_revalidate.is_some_and(|window| {
            self.may_serve_stale()
                && !asks_validation(request)
                && self.staleness(now) <= Duration::from_secs(window)
        })
    }

    /// Whether the response, stale at `now`, may be served to a request with fields `request`
    /// when its validation failed (the origin unreachable, or a 5xx): within the response's or
    /// the request's `stale-if-error` (RFC 5861 §4), where it may be served stale at all.
    pub fn serves_on_error(&self, request: &HeaderMap, now: SystemTime) -> bool {
        let window = self.control.stale_if_error.max(CacheControl::of(request).stale_if_error);
        window.is_some_and(|window| {
            self.may_serve_stale() && self.staleness(now) <= Duration::from_secs(window)
        })
    }

    /// How long past its freshness the response is at `now`; zero while fresh.
    pub fn staleness(&self, now: SystemTime) -> Duration {
        self.age_at(now).saturating_sub(self.lifetime())
    }

    /// The `Age` to send with the stored response at `now`, in seconds.
    pub fn age_header(&self, now: SystemTime) -> u64 {
        self.age_at(now).as_secs()
    }
}

/// Whether a request with fields `request` asks that what is stored be validated before use:
/// `no-cache` (§5.2.1.4), or `Pragma: no-cache` without a `Cache-Control` (§5.4).
fn asks_validation(request: &HeaderMap) -> bool {
    let pragma_no_cache = !request.contains_key(CACHE_CONTROL)
        && request.get_all(PRAGMA).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache"));
    pragma_no_cache || CacheControl::of(request).no_cache
}

/// The stored fields `stored`, updated by the fields of a `304` (or other response that
/// validated them) `fresh` (§3.2): each field of `fresh` replaces the stored one, except the
/// fields of a connection (which are not stored) and those that describe the stored bytes
/// themselves — their length, coding, range, digests and the `ETag` they are kept by — which a
/// response without those bytes cannot change (§3.2 lets a cache omit what assures the
/// integrity of what it stored).
pub fn update_stored(stored: &mut HeaderMap, fresh: &HeaderMap) {
    const OF_THE_BYTES: [&str; 7] = [
        "content-length",
        "content-encoding",
        "content-range",
        "content-md5",
        "content-digest",
        "repr-digest",
        "etag",
    ];
    let mut replaced = std::collections::HashSet::new();
    for (name, value) in fresh {
        if OF_THE_BYTES.contains(&name.as_str()) || is_hop_by_hop(name) {
            continue;
        }
        if replaced.insert(name.clone()) {
            stored.remove(name);
        }
        stored.append(name.clone(), value.clone());
    }
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    use http::header::{CONNECTION, PROXY_AUTHENTICATE, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
    [CONNECTION, PROXY_AUTHENTICATE, TE, TRAILER, TRANSFER_ENCODING, UPGRADE].contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// A repeated seconds directive: the same value again is that value; anything else, or an
/// unreadable value, is 0 (stale).
fn merge_seconds(before: Option<u64>, value: Option<&[u8]>) -> u64 {
    match (before, value.and_then(parse_seconds)) {
        (None, Some(seconds)) => seconds,
        (Some(before), Some(seconds)) if before == seconds => seconds,
        _ => 0,
    }
}

/// delta-seconds (§1.2.2): digits only; a value past `u64` is the largest (2^31 at least, as the
/// RFC asks).
fn parse_seconds(value: &[u8]) -> Option<u64> {
    let value = trim(value);
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        value
            .iter()
            .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .unwrap_or(u64::MAX),
    )
}

/// `Age`, seconds: one line of digits; any other value — a list, a parameter, a sign, several
/// lines — the largest age, so that the response is stale (the module's "doubt means stale").
fn age(headers: &HeaderMap) -> Option<u64> {
    if !headers.contains_key(AGE) {
        return None;
    }
    Some(single_line(headers, &AGE).and_then(parse_seconds).unwrap_or(u64::MAX))
}

/// The one line of a field; `None` when absent or repeated.
fn single_line<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a [u8]> {
    let mut lines = headers.get_all(name).iter();
    let line = lines.next()?;
    lines.next().is_none().then_some(line.as_bytes())
}

/// A date field: `None` when absent, `Some(None)` when present but not exactly one valid
/// HTTP-date.
fn single_date(headers: &HeaderMap, name: &HeaderName) -> Option<Option<SystemTime>> {
    if !headers.contains_key(name) {
        return None;
    }
    Some(
        single_line(headers, name)
            .and_then(|line| std::str::from_utf8(trim(line)).ok())
            .and_then(|text| httpdate::parse_http_date(text).ok()),
    )
}

/// The elements of a comma-separated list, commas inside quoted strings kept.
fn split_list(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = line;
    std::iter::from_fn(move || {
        loop {
            if rest.is_empty() {
                return None;
            }
            let mut quoted = false;
            let mut end = rest.len();
            let mut escaped = false;
            for (i, &b) in rest.iter().enumerate() {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' if quoted => escaped = true,
                    b'"' => quoted = !quoted,
                    b',' if !quoted => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let element = trim(&rest[..end]);
            rest = if end < rest.len() { &rest[end + 1..] } else { &[] };
            if !element.is_empty() {
                return Some(element);
            }
        }
    })
}

fn unquote(value: &[u8]) -> &[u8] {
    match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    }
}

fn trim(value: &[u8]) -> &[u8] {
    let start = value.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !matches!(b, b' ' | b'\t')).map_or(start, |e| e + 1);
    &value[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    const T0: u64 = 1_800_000_000;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn date(secs: u64) -> String {
        httpdate::fmt_http_date(at(secs))
    }

    #[test]
    fn directives_are_read_case_insensitively_with_values_quoted_or_not() {
        let control = CacheControl::parse([
            b"Public, MAX-AGE=\"60\", s-maxage=30".as_slice(),
            b"must-revalidate, x-unknown=\"a,b\", no-cache=\"Set-Cookie, X\"".as_slice(),
        ]);
        assert!(control.public && control.must_revalidate && control.no_cache);
        assert_eq!((control.max_age, control.s_maxage), (Some(60), Some(30)));
        assert!(!control.private && !control.no_store);
    }

    #[test]
    fn doubtful_ages_are_stale() {
        for lines in [
            vec![b"max-age=abc".as_slice()],
            vec![b"max-age=60".as_slice(), b"max-age=61".as_slice()],
            vec![b"max-age=-1".as_slice()],
            vec![b"max-age".as_slice()],
        ] {
            assert_eq!(CacheControl::parse(lines.clone()).max_age, Some(0), "{lines:?}");
        }
        assert_eq!(CacheControl::parse([b"max-age=60, max-age=60".as_slice()]).max_age, Some(60));
        assert_eq!(
            CacheControl::parse([b"max-age=99999999999999999999999".as_slice()]).max_age,
            Some(u64::MAX)
        );
    }

    #[test]
    fn what_a_shared_cache_may_store() {
        let get = Method::GET;
        let none = HeaderMap::new();
        let ok = |request: &HeaderMap, status: u16, response: &[(&str, &str)]| {
            storable(&get, request, StatusCode::from_u16(status).unwrap(), &headers(response))
        };
        assert_eq!(ok(&none, 200, &[]), Ok(()));
        assert_eq!(ok(&none, 206, &[("cache-control", "max-age=10")]), Ok(()));
        // Any final status a reason to reuse it: heuristically cacheable, or explicitly fresh.
        assert_eq!(ok(&none, 404, &[]), Ok(()));
        assert_eq!(ok(&none, 503, &[]), Err(NotStorable::Status));
        assert_eq!(ok(&none, 503, &[("cache-control", "max-age=10")]), Ok(()));
        assert_eq!(ok(&none, 599, &[("expires", "Thu, 01 Jan 2099 00:00:00 GMT")]), Ok(()));
        assert_eq!(ok(&none, 599, &[("cache-control", "public")]), Ok(()));
        assert_eq!(ok(&none, 304, &[("cache-control", "max-age=10")]), Err(NotStorable::Status));
        assert_eq!(ok(&none, 103, &[("cache-control", "max-age=10")]), Err(NotStorable::Status));
        // `must-understand`: a status the cache does not know is not stored; a known one is, even
        // with `no-store` beside it (§5.2.2.3).
        let understand = "max-age=10, must-understand, no-store";
        assert_eq!(ok(&none, 599, &[("cache-control", understand)]), Err(NotStorable::Status));
        assert_eq!(ok(&none, 200, &[("cache-control", understand)]), Ok(()));
        assert_eq!(ok(&none, 200, &[("cache-control", "no-store")]), Err(NotStorable::NoStore));
        assert_eq!(
            ok(&none, 200, &[("cache-control", "private=\"x\"")]),
            Err(NotStorable::Private)
        );
        let asked_no_store = headers(&[("cache-control", "no-store")]);
        assert_eq!(ok(&asked_no_store, 200, &[]), Err(NotStorable::NoStore));
        let authorized = headers(&[("authorization", "Bearer x")]);
        assert_eq!(ok(&authorized, 200, &[]), Err(NotStorable::Authorization));
        for allowed in ["public", "s-maxage=5", "must-revalidate"] {
            assert_eq!(ok(&authorized, 200, &[("cache-control", allowed)]), Ok(()), "{allowed}");
        }
        let head = storable(&Method::HEAD, &none, StatusCode::OK, &none);
        assert_eq!(head, Err(NotStorable::Method));
    }

    #[test]
    fn lifetime_by_precedence() {
        let of = |pairs: &[(&str, &str)]| Freshness::of(&headers(pairs), at(T0), at(T0)).lifetime();
        let secs = Duration::from_secs;
        assert_eq!(of(&[("cache-control", "max-age=60, s-maxage=5")]), secs(5));
        assert_eq!(of(&[("cache-control", "max-age=60"), ("expires", &date(T0 + 999))]), secs(60));
        assert_eq!(of(&[("date", &date(T0)), ("expires", &date(T0 + 120))]), secs(120));
        // An invalid Expires is a time in the past; one before Date too.
        assert_eq!(of(&[("expires", "0")]), Duration::ZERO);
        assert_eq!(of(&[("date", &date(T0)), ("expires", &date(T0 - 5))]), Duration::ZERO);
        // Heuristic: a tenth of the time since Last-Modified, at most a day.
        assert_eq!(of(&[("date", &date(T0)), ("last-modified", &date(T0 - 1000))]), secs(100));
        assert_eq!(of(&[("last-modified", &date(T0 - 100 * 86_400))]), HEURISTIC_CAP);
        // ... but never beside an explicit expiry, and nothing without any of them.
        assert_eq!(of(&[("expires", "0"), ("last-modified", &date(T0 - 1000))]), Duration::ZERO);
        assert_eq!(of(&[]), Duration::ZERO);
    }

    #[test]
    fn age_as_section_4_2_3_computes_it() {
        // Asked at T0, answered at T0+2 with Date T0-3 and Age 10: the initial age is the larger
        // of apparent (5) and corrected (10 + 2 of delay) = 12; 30 s later it is 42.
        let headers = headers(&[("date", &date(T0 - 3)), ("age", "10")]);
        let facts = Freshness::of(&headers, at(T0), at(T0 + 2));
        assert_eq!(facts.age_at(at(T0 + 2)), Duration::from_secs(12));
        assert_eq!(facts.age_header(at(T0 + 32)), 42);
        // A Date in the future counts nothing.
        let future = super::tests::headers(&[("date", &date(T0 + 500))]);
        assert_eq!(Freshness::of(&future, at(T0), at(T0)).age_at(at(T0)), Duration::ZERO);
        // An Age that is not one line of digits makes the response as old as can be: stale.
        for bad in [&["x"][..], &["-1"], &["7200;p=1"], &["0, 0"], &["0", "0"]] {
            let mut fields = super::tests::headers(&[("cache-control", "max-age=3600")]);
            for line in bad {
                fields.append(AGE, http::HeaderValue::from_static(line));
            }
            let facts = Freshness::of(&fields, at(T0), at(T0));
            assert!(facts.staleness(at(T0)) > Duration::ZERO, "{bad:?}");
        }
    }

    #[test]
    fn what_a_request_asks_of_a_stored_response() {
        let stored = headers(&[("date", &date(T0)), ("cache-control", "max-age=100")]);
        let facts = Freshness::of(&stored, at(T0), at(T0));
        let serves = |request: &[(&str, &str)], now: u64| {
            facts.serves_unvalidated(&headers(request), at(now))
        };
        assert!(serves(&[], T0 + 50));
        assert!(!serves(&[], T0 + 100), "stale at its lifetime");
        assert!(!serves(&[("cache-control", "no-cache")], T0 + 1));
        assert!(!serves(&[("pragma", "no-cache")], T0 + 1));
        assert!(serves(&[("pragma", "no-cache"), ("cache-control", "max-age=60")], T0 + 1));
        assert!(!serves(&[("cache-control", "max-age=10")], T0 + 20));
        assert!(!serves(&[("cache-control", "min-fresh=60")], T0 + 50));
        let no_cache = headers(&[("cache-control", "no-cache, max-age=100")]);
        let always = Freshness::of(&no_cache, at(T0), at(T0));
        assert!(!always.serves_unvalidated(&HeaderMap::new(), at(T0)));
    }

    #[test]
    fn stale_is_served_only_where_a_directive_allows() {
        let stored = |control: &str| {
            let fields = headers(&[("date", &date(T0)), ("cache-control", control)]);
            Freshness::of(&fields, at(T0), at(T0))
        };
        let asked = |control: &str| headers(&[("cache-control", control)]);
        let none = HeaderMap::new();
        // 50 s stale at T0 + 60.
        let plain = stored("max-age=10");
        assert!(!plain.serves_unvalidated(&none, at(T0 + 60)));
        assert!(plain.serves_unvalidated(&asked("max-stale=50"), at(T0 + 60)));
        assert!(!plain.serves_unvalidated(&asked("max-stale=49"), at(T0 + 60)));
        assert!(plain.serves_unvalidated(&asked("max-stale"), at(T0 + 60)));
        assert!(!plain.serves_unvalidated(&asked("max-stale=x"), at(T0 + 60)));
        for forbids in
            ["max-age=10, must-revalidate", "max-age=10, proxy-revalidate", "s-maxage=10"]
        {
            let strict = stored(forbids);
            assert!(!strict.serves_unvalidated(&asked("max-stale"), at(T0 + 60)), "{forbids}");
            let swr = stored(&format!("{forbids}, stale-while-revalidate=100"));
            assert!(!swr.serves_while_revalidating(&none, at(T0 + 60)), "{forbids}");
            let sie = stored(&format!("{forbids}, stale-if-error=100"));
            assert!(!sie.serves_on_error(&none, at(T0 + 60)), "{forbids}");
        }
        let swr = stored("max-age=10, stale-while-revalidate=60");
        assert!(swr.serves_while_revalidating(&none, at(T0 + 60)));
        assert!(!swr.serves_while_revalidating(&none, at(T0 + 80)), "past its window");
        assert!(!swr.serves_while_revalidating(&asked("no-cache"), at(T0 + 60)));
        let sie = stored("max-age=10, stale-if-error=60");
        assert!(sie.serves_on_error(&none, at(T0 + 60)));
        assert!(!sie.serves_on_error(&none, at(T0 + 80)));
        // The request's own `stale-if-error` counts too.
        assert!(plain.serves_on_error(&asked("stale-if-error=60"), at(T0 + 60)));
        assert!(!plain.serves_on_error(&none, at(T0 + 60)));
        assert!(!sie.serves_while_revalidating(&none, at(T0 + 60)));
    }

    #[test]
    fn a_304_updates_the_stored_fields_but_not_their_length() {
        let mut stored = headers(&[
            ("etag", "\"v1\""),
            ("cache-control", "max-age=1"),
            ("content-length", "100"),
            ("content-encoding", "gzip"),
            ("x-keep", "yes"),
        ]);
        let fresh = headers(&[
            ("cache-control", "max-age=600"),
            ("content-length", "0"),
            ("content-encoding", "br"),
            ("etag", "\"v2\""),
            ("connection", "close"),
            ("x-new", "a"),
            ("x-new", "b"),
        ]);
        update_stored(&mut stored, &fresh);
        assert_eq!(stored.get("cache-control").unwrap(), "max-age=600");
        assert_eq!(stored.get("content-length").unwrap(), "100");
        assert_eq!(stored.get("content-encoding").unwrap(), "gzip", "what the bytes are in");
        assert_eq!(stored.get("etag").unwrap(), "\"v1\"", "what the bytes are kept by");
        assert_eq!(stored.get("x-keep").unwrap(), "yes");
        assert!(stored.get("connection").is_none());
        assert_eq!(stored.get_all("x-new").iter().count(), 2);
    }
}
