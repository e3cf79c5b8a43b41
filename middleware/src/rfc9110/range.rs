//! The `Range` request header (RFC 9110 §14.1–14.2) and how a range set resolves against a length.

use std::fmt;

use http::HeaderMap;
use http::header::RANGE;

use super::syntax::{is_token, parse_digits, trim_ows};
use crate::ByteRange;

/// Ranges closer together than this many bytes are served as one.
///
/// About what one more part of a `multipart/byteranges` body costs in headers (boundary line,
/// `Content-Type`, `Content-Range`): below it, sending the gap is cheaper than a new part.
const COALESCE_GAP: u64 = 80;

/// Bounds on the `Range` headers [`parse_range`] is willing to honour.
///
/// Both keep the work done for one header small and fixed whatever a client sends; a header over
/// either limit is ignored (the whole representation is served), which is always a correct answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeLimits {
    /// Most range-specs in one header. Zero turns range requests off.
    pub max_ranges: usize,
    /// Longest header value, in bytes, looked at.
    pub max_header_len: usize,
}

impl Default for RangeLimits {
    fn default() -> Self {
        Self { max_ranges: 16, max_header_len: 1024 }
    }
}

/// The longest range-spec written without leading zeros, both positions at `u64::MAX` (20 digits
/// each), with its dash and the comma after it.
const LONGEST_SPEC_LEN: usize = 20 + 1 + 20 + 1;

impl RangeLimits {
    /// Limits honouring up to `max_ranges` specs, with a header long enough to hold that many
    /// of any size (and never shorter than the default's): a length limit that cut the header
    /// short of them would ignore every header with that many ranges, whatever `max_ranges` says.
    pub fn with_max_ranges(max_ranges: usize) -> Self {
        let needed = max_ranges.saturating_mul(LONGEST_SPEC_LEN).saturating_add("bytes=".len());
        let max_header_len = needed.max(Self::default().max_header_len);
        Self { max_ranges, max_header_len }
    }
}

/// What to do with a request's `Range` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeRequest {
    /// Serve the whole representation (200), as if there were no `Range` header.
    Ignore(IgnoreReason),
    /// A valid set of byte ranges, still to be [resolved](RangeSet::resolve) against the length.
    Bytes(RangeSet),
}

/// Why a `Range` header is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IgnoreReason {
    /// A range unit other than `bytes`, which a server must ignore (§14.2).
    OtherUnit,
    /// Not a valid `bytes` ranges-specifier.
    Invalid,
    /// More range-specs than [`RangeLimits::max_ranges`].
    TooMany,
    /// Longer than [`RangeLimits::max_header_len`].
    TooLong,
    /// Ranges so far apart that reading from the first to the last would cost far more than the
    /// bytes asked for, where they cannot be fetched one by one (see [`RangeSet::fetches`]).
    Sparse,
}

impl fmt::Display for IgnoreReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OtherUnit => "range unit is not bytes",
            Self::Invalid => "malformed range header",
            Self::TooMany => "too many ranges",
            Self::TooLong => "range header too long",
            Self::Sparse => "ranges too far apart",
        })
    }
}

/// One `range-spec` of a `bytes` range set, as the client wrote it (inclusive positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RangeSpec {
    /// `first-last`; `first <= last` in every spec [`parse_range`] or [`RangeSet::new`] accepts.
    Closed { first: u64, last: u64 },
    /// `first-`: from `first` to the end.
    From { first: u64 },
    /// `-len`: the last `len` bytes.
    Suffix { len: u64 },
}

impl RangeSpec {
    /// The bytes this spec selects from a representation of `complete_len` bytes (§14.1.1), or
    /// `None` when it selects none.
    ///
    /// A `last` at or past the end is cut to the end, a suffix longer than the representation
    /// means all of it, and `-0`, a `first` at or past the end, or a reversed `Closed` select
    /// nothing. Nothing is satisfiable in an empty representation: RFC 9110 counts a non-zero
    /// suffix as satisfiable there, but the 206 it calls for would need a `Content-Range` of
    /// `bytes 0--1/0`, which cannot be written, so an empty representation answers every range
    /// request with 416 and `bytes */0`.
    pub fn resolve(&self, complete_len: u64) -> Option<ByteRange> {
        // The last byte there is; against it every inclusive position turns half-open without
        // overflow.
        let last_byte = complete_len.checked_sub(1)?;
        match *self {
            Self::Closed { first, last } if first <= last && first <= last_byte => {
                ByteRange::new(first, last.min(last_byte) + 1)
            }
            Self::From { first } if first <= last_byte => ByteRange::new(first, complete_len),
            Self::Suffix { len } if len > 0 => {
                ByteRange::new(complete_len - len.min(complete_len), complete_len)
            }
            Self::Closed { .. } | Self::From { .. } | Self::Suffix { .. } => None,
        }
    }

    /// `bytes=…`: the value of a `Range` header asking for this spec alone.
    pub fn header_value(&self) -> String {
        format!("bytes={self}")
    }

    /// The smallest spec covering both, whatever the representation's length; `None` when one is
    /// a suffix and the other is not, as no one spec covers the end and a start both of unknown
    /// place.
    fn cover(self, other: Self) -> Option<Self> {
        use RangeSpec::{Closed, From, Suffix};
        match (self, other) {
            (Suffix { len: a }, Suffix { len: b }) => Some(Suffix { len: a.max(b) }),
            (Suffix { .. }, _) | (_, Suffix { .. }) => None,
            (Closed { first: a, last: a_last }, Closed { first: b, last: b_last }) => {
                Some(Closed { first: a.min(b), last: a_last.max(b_last) })
            }
            (From { first: a }, From { first: b } | Closed { first: b, .. })
            | (Closed { first: a, .. }, From { first: b }) => Some(From { first: a.min(b) }),
        }
    }

    const fn is_reversed(&self) -> bool {
        matches!(*self, Self::Closed { first, last } if first > last)
    }
}

/// `0-99`, `5-` or `-20`, the wire form of one range-spec.
impl fmt::Display for RangeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Closed { first, last } => write!(f, "{first}-{last}"),
            Self::From { first } => write!(f, "{first}-"),
            Self::Suffix { len } => write!(f, "-{len}"),
        }
    }
}

/// `ranges` (sorted by start), where less than `gap` apart, as one.
fn merge_within(ranges: &[ByteRange], gap: u64) -> Vec<ByteRange> {
    let mut merged: Vec<ByteRange> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start().saturating_sub(last.end()) < gap => {
                // Cannot fail: `last` starts no later than `range`.
                *last = ByteRange::new(last.start(), last.end().max(range.end())).unwrap_or(*last);
            }
            _ => merged.push(*range),
        }
    }
    merged
}

/// A non-empty list of byte range-specs, in the order the client sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    specs: Vec<RangeSpec>,
}

/// How a [`RangeSet`] applies to a representation of known length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// No spec selects any byte: 416 with `Content-Range: bytes */len`.
    Unsatisfiable,
    /// One range, after coalescing: a 206 with a single `Content-Range`.
    Single(ByteRange),
    /// Two or more ranges, sorted and at least a part's overhead (80 bytes) apart: a 206 with a
    /// `multipart/byteranges` body.
    Multiple(Vec<ByteRange>),
}

impl RangeSet {
    /// A set of the given specs; `None` when there are none or a `Closed` spec is reversed.
    pub fn new(specs: Vec<RangeSpec>) -> Option<Self> {
        (!specs.is_empty() && !specs.iter().any(RangeSpec::is_reversed)).then_some(Self { specs })
    }

    pub fn specs(&self) -> &[RangeSpec] {
        &self.specs
    }

    /// The ranges to serve from a representation of `complete_len` bytes.
    ///
    /// Unsatisfiable specs are dropped (§14.1.1); what remains is sorted and every two ranges that
    /// overlap, touch, or leave a gap of less than about one part's headers (80 bytes) between
    /// them become one (§14.2 allows this whatever the order of the specs). Coalescing is what
    /// keeps `bytes=0-,0-,0-,…` from multiplying the response (CVE-2011-3192): however the specs
    /// are written, the ranges served never overlap, so the body is never longer than the
    /// representation plus the part headers.
    pub fn resolve(&self, complete_len: u64) -> Resolution {
        let mut ranges: Vec<ByteRange> =
            self.specs.iter().filter_map(|spec| spec.resolve(complete_len)).collect();
        ranges.sort_unstable();
        // Half-open (start, end) pairs while merging: each only ever grows its end.
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for range in ranges {
            match merged.last_mut() {
                // Sorted by start, so `range` starts no earlier than the merged range before it;
                // the gap is zero when the two overlap or touch.
                Some((_, last_end)) if range.start().saturating_sub(*last_end) < COALESCE_GAP => {
                    *last_end = (*last_end).max(range.end());
                }
                _ => merged.push((range.start(), range.end())),
            }
        }
        // `start <= end` holds for every pair by construction, so nothing is filtered out here.
        let mut merged: Vec<ByteRange> =
            merged.into_iter().filter_map(|(start, end)| ByteRange::new(start, end)).collect();
        match merged.len() {
            0 => Resolution::Unsatisfiable,
            1 => Resolution::Single(merged.remove(0)),
            _ => Resolution::Multiple(merged),
        }
    }

    /// What to read of a representation of `complete_len` bytes to serve this set: its ranges,
    /// where less than `gap` apart, read through as one. One read for a set whose ranges lie
    /// together; one per stretch for ranges far apart, so that the bytes read stay within the
    /// bytes asked for plus a `gap` per stretch.
    pub fn fetches(&self, complete_len: u64, gap: u64) -> Vec<ByteRange> {
        let ranges = match self.resolve(complete_len) {
            Resolution::Unsatisfiable => return Vec::new(),
            Resolution::Single(range) => return vec![range],
            Resolution::Multiple(ranges) => ranges,
        };
        merge_within(&ranges, gap)
    }

    /// Whether the bytes from this set's first range to its last, whatever the representation's
    /// length, lie within `gap` of each other (see [`Self::fetches`]): only `Closed` and `From`
    /// specs say where they are without the length; a set mixing suffixes with them does not.
    pub fn lies_together(&self, gap: u64) -> bool {
        // `-0` selects nothing, wherever the end is.
        let specs = self.specs.iter().filter(|spec| **spec != RangeSpec::Suffix { len: 0 });
        if specs.clone().all(|spec| matches!(spec, RangeSpec::Suffix { .. })) {
            return true;
        }
        let mut placed: Vec<ByteRange> = Vec::with_capacity(self.specs.len());
        for spec in specs {
            match *spec {
                RangeSpec::Closed { first, last } => {
                    placed.extend(ByteRange::new(first, last.saturating_add(1)));
                }
                RangeSpec::From { first } => placed.extend(ByteRange::new(first, u64::MAX)),
                RangeSpec::Suffix { .. } => return false,
            }
        }
        placed.sort_unstable();
        merge_within(&placed, gap).len() <= 1
    }

    /// One spec to ask upstream for that covers every byte this set can resolve to, whatever the
    /// representation's length turns out to be.
    ///
    /// The spec itself for a set of one; for `Closed` and `From` specs, from the smallest `first`
    /// to the largest `last` (open-ended when any spec is); for suffixes only, the longest. `None`
    /// when suffixes are mixed with other specs: the end of the representation and a fixed start
    /// are then both needed, and only the whole object is sure to cover them.
    pub fn covering_spec(&self) -> Option<RangeSpec> {
        let (first, rest) = self.specs.split_first()?;
        rest.iter().try_fold(*first, |cover, spec| cover.cover(*spec))
    }

    /// `bytes=…`: this set as the value of a `Range` header, specs in their original order.
    ///
    /// Re-serialised from the parsed numbers, so it is canonical whatever the client wrote
    /// (no whitespace, no empty elements, no leading zeros).
    pub fn header_value(&self) -> String {
        let mut value = String::from("bytes=");
        for (index, spec) in self.specs.iter().enumerate() {
            if index > 0 {
                value.push(',');
            }
            value.push_str(&spec.to_string());
        }
        value
    }
}

/// Parses the value of a `Range` header (§14.1–14.2).
///
/// The unit `bytes` is matched case-insensitively; a valid token naming another unit is
/// [`IgnoreReason::OtherUnit`]. The range set is a list (§5.6.1): whitespace around commas and
/// empty elements are accepted. Each spec is `first-last`, `first-` or `-suffix` with plain
/// decimal digits; anything else in any element — a sign, a space inside, `last < first`, a
/// number too big for `u64` — makes the whole header [`IgnoreReason::Invalid`], as §14.1.1 asks.
/// The limits are checked first, so a hostile header costs no more than `max_header_len` bytes of
/// scanning and `max_ranges` specs of memory.
pub fn parse_range(value: &[u8], limits: &RangeLimits) -> RangeRequest {
    if value.len() > limits.max_header_len {
        return RangeRequest::Ignore(IgnoreReason::TooLong);
    }
    let value = trim_ows(value);
    let Some(equals) = value.iter().position(|&b| b == b'=') else {
        return RangeRequest::Ignore(IgnoreReason::Invalid);
    };
    let (unit, range_set) = (&value[..equals], &value[equals + 1..]);
    if !is_token(unit) {
        return RangeRequest::Ignore(IgnoreReason::Invalid);
    }
    if !unit.eq_ignore_ascii_case(b"bytes") {
        return RangeRequest::Ignore(IgnoreReason::OtherUnit);
    }
    let mut specs = Vec::new();
    for element in range_set.split(|&b| b == b',').map(trim_ows) {
        if element.is_empty() {
            continue;
        }
        if specs.len() == limits.max_ranges {
            return RangeRequest::Ignore(IgnoreReason::TooMany);
        }
        match parse_spec(element) {
            Some(spec) => specs.push(spec),
            None => return RangeRequest::Ignore(IgnoreReason::Invalid),
        }
    }
    match RangeSet::new(specs) {
        Some(set) => RangeRequest::Bytes(set),
        // `bytes=` or `bytes=,,`: the grammar wants at least one spec.
        None => RangeRequest::Ignore(IgnoreReason::Invalid),
    }
}

/// The request's `Range` header, parsed; `None` when it has none.
///
/// `Range` is a single value, so a request with several `Range` field lines is
/// [`IgnoreReason::Invalid`] rather than read by its first line alone.
pub fn parse_range_header(headers: &HeaderMap, limits: &RangeLimits) -> Option<RangeRequest> {
    let mut lines = headers.get_all(RANGE).iter();
    let line = lines.next()?;
    if lines.next().is_some() {
        return Some(RangeRequest::Ignore(IgnoreReason::Invalid));
    }
    Some(parse_range(line.as_bytes(), limits))
}

/// `int-range / suffix-range` (§14.1.1), with OWS already trimmed.
fn parse_spec(spec: &[u8]) -> Option<RangeSpec> {
    if let Some(suffix) = spec.strip_prefix(b"-") {
        return Some(RangeSpec::Suffix { len: parse_digits(suffix)? });
    }
    let dash = spec.iter().position(|&b| b == b'-')?;
    let first = parse_digits(&spec[..dash])?;
    let last = &spec[dash + 1..];
    if last.is_empty() {
        return Some(RangeSpec::From { first });
    }
    let last = parse_digits(last)?;
    (first <= last).then_some(RangeSpec::Closed { first, last })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(value: &str) -> RangeRequest {
        parse_range(value.as_bytes(), &RangeLimits::default())
    }

    fn bytes(specs: &[RangeSpec]) -> RangeRequest {
        RangeRequest::Bytes(RangeSet::new(specs.to_vec()).unwrap())
    }

    fn range(start: u64, end: u64) -> ByteRange {
        ByteRange::new(start, end).unwrap()
    }

    const fn closed(first: u64, last: u64) -> RangeSpec {
        RangeSpec::Closed { first, last }
    }

    const fn from(first: u64) -> RangeSpec {
        RangeSpec::From { first }
    }

    const fn suffix(len: u64) -> RangeSpec {
        RangeSpec::Suffix { len }
    }

    #[test]
    fn valid_headers() {
        let cases: &[(&str, &[RangeSpec])] = &[
            ("bytes=0-499", &[closed(0, 499)]),
            ("bytes=500-", &[from(500)]),
            ("bytes=-500", &[suffix(500)]),
            ("bytes=-0", &[suffix(0)]),
            ("bytes=0-0,-1", &[closed(0, 0), suffix(1)]),
            ("bytes=5-5", &[closed(5, 5)]),
            ("BYTES=0-1", &[closed(0, 1)]),
            ("Bytes=0-1", &[closed(0, 1)]),
            ("bytes=0-1 , 3-4,\t5-", &[closed(0, 1), closed(3, 4), from(5)]),
            ("  bytes=0-1\t", &[closed(0, 1)]),
            ("bytes= 0-1", &[closed(0, 1)]),
            ("bytes=0-1,,2-3", &[closed(0, 1), closed(2, 3)]),
            ("bytes=,0-1,", &[closed(0, 1)]),
            ("bytes=0-10,5-15,0-", &[closed(0, 10), closed(5, 15), from(0)]),
            ("bytes=0000007-0008", &[closed(7, 8)]),
            ("bytes=18446744073709551615-", &[from(u64::MAX)]),
            ("bytes=0-18446744073709551615", &[closed(0, u64::MAX)]),
            ("bytes=-18446744073709551615", &[suffix(u64::MAX)]),
        ];
        for (header, specs) in cases {
            assert_eq!(parse(header), bytes(specs), "{header:?}");
        }
    }

    #[test]
    fn ignored_headers() {
        use IgnoreReason::{Invalid, OtherUnit, TooLong, TooMany};
        let many = format!("bytes={}", vec!["0-1"; 17].join(","));
        let sixteen_and_empties = format!("bytes={},,,", vec!["0-1"; 16].join(","));
        let long = format!("bytes=0-{}", "1".repeat(1100));
        let cases: &[(&str, IgnoreReason)] = &[
            ("items=0-5", OtherUnit),
            ("none=", OtherUnit),
            ("bytes", Invalid),
            ("", Invalid),
            ("=0-1", Invalid),
            ("bytes =0-1", Invalid),
            ("by tes=0-1", Invalid),
            ("bytes=", Invalid),
            ("bytes=,", Invalid),
            ("bytes=-", Invalid),
            ("bytes=5-2", Invalid),
            ("bytes=0-1,5-2", Invalid),
            ("bytes=0-1,garbage", Invalid),
            ("bytes=abc", Invalid),
            ("bytes=1", Invalid),
            ("bytes=+1-2", Invalid),
            ("bytes=1-+2", Invalid),
            ("bytes=--1", Invalid),
            ("bytes=-1-2", Invalid),
            ("bytes=1--2", Invalid),
            ("bytes=1-2-3", Invalid),
            ("bytes=1 -2", Invalid),
            ("bytes=1- 2", Invalid),
            ("bytes=0x10-", Invalid),
            ("bytes=1e3-", Invalid),
            ("bytes=0-1;2-3", Invalid),
            ("bytes=0-1\r\n", Invalid),
            ("bytes=99999999999999999999-", Invalid),
            ("bytes=0-99999999999999999999", Invalid),
            ("bytes=-99999999999999999999", Invalid),
            ("bytes=18446744073709551616-", Invalid),
            (&many, TooMany),
            (&long, TooLong),
        ];
        for (header, reason) in cases {
            assert_eq!(parse(header), RangeRequest::Ignore(*reason), "{header:?}");
        }
        // Empty elements do not count against the limit.
        assert!(matches!(parse(&sixteen_and_empties), RangeRequest::Bytes(_)));
        // Non-UTF-8 bytes are just invalid.
        let weird = parse_range(b"bytes=0-1,\xff", &RangeLimits::default());
        assert_eq!(weird, RangeRequest::Ignore(Invalid));
    }

    #[test]
    fn from_a_header_map() {
        use http::HeaderValue;
        let limits = RangeLimits::default();
        let mut headers = HeaderMap::new();
        assert_eq!(parse_range_header(&headers, &limits), None);
        headers.append(RANGE, HeaderValue::from_static("bytes=0-1"));
        assert_eq!(parse_range_header(&headers, &limits), Some(bytes(&[closed(0, 1)])));
        headers.append(RANGE, HeaderValue::from_static("bytes=2-3"));
        let twice = parse_range_header(&headers, &limits);
        assert_eq!(twice, Some(RangeRequest::Ignore(IgnoreReason::Invalid)));
    }

    #[test]
    fn limits_apply() {
        let limits = RangeLimits { max_ranges: 2, max_header_len: 12 };
        assert_eq!(
            parse_range(b"bytes=0-1,2-3", &limits),
            RangeRequest::Ignore(IgnoreReason::TooLong)
        );
        let limits = RangeLimits { max_ranges: 2, max_header_len: 64 };
        assert_eq!(
            parse_range(b"bytes=0-1,2-3,4-5", &limits),
            RangeRequest::Ignore(IgnoreReason::TooMany)
        );
        assert!(matches!(parse_range(b"bytes=0-1,2-3", &limits), RangeRequest::Bytes(_)));
        let off = RangeLimits { max_ranges: 0, ..RangeLimits::default() };
        assert_eq!(parse_range(b"bytes=0-1", &off), RangeRequest::Ignore(IgnoreReason::TooMany));
    }

    /// The most ranges a server allows all fit in a header under its length limit, each as long
    /// as a range-spec can be; one more, however short, is too many.
    #[test]
    fn a_max_ranges_limit_comes_with_room_for_that_many() {
        assert_eq!(RangeLimits::with_max_ranges(16), RangeLimits::default());
        for max_ranges in [1, 16, 24, 100, 1000] {
            let limits = RangeLimits::with_max_ranges(max_ranges);
            let spec = format!("{}-{}", u64::MAX - 1, u64::MAX);
            let specs = vec![spec.as_str(); max_ranges];
            let header = format!("bytes={}", specs.join(","));
            let set = match parse_range(header.as_bytes(), &limits) {
                RangeRequest::Bytes(set) => set,
                ignored => panic!("{max_ranges} ranges: {ignored:?}"),
            };
            assert_eq!(set.specs().len(), max_ranges);
            let one_more = format!("bytes={}", vec!["0-0"; max_ranges + 1].join(","));
            let parsed = parse_range(one_more.as_bytes(), &limits);
            assert_eq!(parsed, RangeRequest::Ignore(IgnoreReason::TooMany), "{max_ranges}");
        }
    }

    #[test]
    fn resolution_against_a_length() {
        let resolve = |header: &str, len: u64| match parse(header) {
            RangeRequest::Bytes(set) => set.resolve(len),
            ignored => panic!("{header:?} was {ignored:?}"),
        };
        use Resolution::{Multiple, Single, Unsatisfiable};
        let cases: &[(&str, u64, Resolution)] = &[
            ("bytes=0-499", 1000, Single(range(0, 500))),
            ("bytes=0-499", 100, Single(range(0, 100))),
            ("bytes=500-", 1000, Single(range(500, 1000))),
            ("bytes=999-", 1000, Single(range(999, 1000))),
            ("bytes=1000-", 1000, Unsatisfiable),
            ("bytes=1000-2000", 1000, Unsatisfiable),
            ("bytes=-500", 1000, Single(range(500, 1000))),
            ("bytes=-5000", 1000, Single(range(0, 1000))),
            ("bytes=-0", 1000, Unsatisfiable),
            ("bytes=-0,1000-", 1000, Unsatisfiable),
            ("bytes=-0,999-", 1000, Single(range(999, 1000))),
            ("bytes=0-0,-1", 1000, Multiple(vec![range(0, 1), range(999, 1000)])),
            ("bytes=0-0,-1", 50, Single(range(0, 50))),
            ("bytes=0-0,-1", 1, Single(range(0, 1))),
            // Overlapping and out of order: sorted and merged.
            ("bytes=500-600,0-100,50-550", 1000, Single(range(0, 601))),
            ("bytes=0-,0-,0-,0-", 1000, Single(range(0, 1000))),
            // Touching.
            ("bytes=0-9,10-19", 1000, Single(range(0, 20))),
            // A gap of 79 bytes is merged, one of 80 is not.
            ("bytes=0-9,89-99", 1000, Single(range(0, 100))),
            ("bytes=0-9,90-99", 1000, Multiple(vec![range(0, 10), range(90, 100)])),
            ("bytes=900-999,0-9", 1000, Multiple(vec![range(0, 10), range(900, 1000)])),
            // Absurd positions against a huge length.
            ("bytes=0-18446744073709551615", u64::MAX, Single(range(0, u64::MAX))),
            ("bytes=-18446744073709551615", u64::MAX, Single(range(0, u64::MAX))),
            ("bytes=18446744073709551614-", u64::MAX, Single(range(u64::MAX - 1, u64::MAX))),
            ("bytes=18446744073709551615-", u64::MAX, Unsatisfiable),
            // An empty representation satisfies nothing.
            ("bytes=0-", 0, Unsatisfiable),
            ("bytes=-1", 0, Unsatisfiable),
            ("bytes=0-0,-5,3-", 0, Unsatisfiable),
        ];
        for (header, len, expected) in cases {
            assert_eq!(&resolve(header, *len), expected, "{header:?} against {len}");
        }
    }

    #[test]
    fn covering_specs() {
        let cover = |specs: &[RangeSpec]| RangeSet::new(specs.to_vec()).unwrap().covering_spec();
        assert_eq!(cover(&[suffix(20)]), Some(suffix(20)));
        assert_eq!(cover(&[closed(5, 9)]), Some(closed(5, 9)));
        assert_eq!(cover(&[closed(50, 60), closed(5, 9)]), Some(closed(5, 60)));
        assert_eq!(cover(&[closed(50, 60), from(70), closed(5, 9)]), Some(from(5)));
        assert_eq!(cover(&[from(70), from(7)]), Some(from(7)));
        assert_eq!(cover(&[suffix(3), suffix(30)]), Some(suffix(30)));
        assert_eq!(cover(&[closed(0, 0), suffix(1)]), None);
        assert_eq!(cover(&[suffix(1), from(1)]), None);
    }

    #[test]
    fn wire_forms() {
        assert_eq!(closed(0, 99).to_string(), "0-99");
        assert_eq!(from(5).to_string(), "5-");
        assert_eq!(suffix(20).to_string(), "-20");
        assert_eq!(closed(0, 99).header_value(), "bytes=0-99");
        let set = RangeSet::new(vec![closed(7, 8), suffix(3), from(9)]).unwrap();
        assert_eq!(set.header_value(), "bytes=7-8,-3,9-");
        assert_eq!(parse(" BYTES=0007-8 ,, -3,9-"), RangeRequest::Bytes(set));
    }

    #[test]
    fn sets_reject_what_the_grammar_rejects() {
        assert_eq!(RangeSet::new(vec![]), None);
        assert_eq!(RangeSet::new(vec![closed(0, 1), closed(3, 2)]), None);
        assert_eq!(closed(3, 2).resolve(100), None);
    }

    #[test]
    fn ignore_reasons_read_well_in_logs() {
        assert_eq!(IgnoreReason::TooMany.to_string(), "too many ranges");
        assert_eq!(IgnoreReason::OtherUnit.to_string(), "range unit is not bytes");
    }

    fn spec_strategy() -> impl Strategy<Value = RangeSpec> {
        // Small numbers meet small lengths; the edges of u64 meet huge ones.
        let position = prop_oneof![0u64..300, any::<u64>(), Just(u64::MAX), Just(u64::MAX - 1)];
        prop_oneof![
            (position.clone(), position.clone()).prop_map(|(a, b)| closed(a.min(b), a.max(b))),
            position.clone().prop_map(from),
            position.prop_map(suffix),
        ]
    }

    fn length_strategy() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..400, any::<u64>(), Just(0), Just(1), Just(u64::MAX)]
    }

    fn resolved(resolution: &Resolution) -> Vec<ByteRange> {
        match resolution {
            Resolution::Unsatisfiable => vec![],
            Resolution::Single(range) => vec![*range],
            Resolution::Multiple(ranges) => ranges.clone(),
        }
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_bytes_never_panics(
            value in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let _ = parse_range(&value, &RangeLimits::default());
        }

        #[test]
        fn parsing_near_valid_headers_never_panics(
            value in "[bB][yY][tT][eE][sS]=[0-9, \t,-]{0,40}",
        ) {
            let _ = parse_range(value.as_bytes(), &RangeLimits::default());
        }

        #[test]
        fn any_spec_resolves_to_a_nonempty_range_inside(
            kind in 0u8..3, a in any::<u64>(), b in any::<u64>(), len in length_strategy(),
        ) {
            // Reversed `Closed` specs included: hand-built ones can be.
            let spec = match kind {
                0 => closed(a, b),
                1 => from(a),
                _ => suffix(a),
            };
            if let Some(range) = spec.resolve(len) {
                prop_assert!(!range.is_empty() && range.end() <= len);
            }
        }

        #[test]
        fn canonical_form_parses_back(specs in proptest::collection::vec(spec_strategy(), 1..16)) {
            let set = RangeSet::new(specs).unwrap();
            let reparsed = parse_range(set.header_value().as_bytes(), &RangeLimits::default());
            prop_assert_eq!(reparsed, RangeRequest::Bytes(set));
        }

        #[test]
        fn resolved_ranges_are_nonempty_inside_sorted_and_disjoint(
            specs in proptest::collection::vec(spec_strategy(), 1..16),
            len in length_strategy(),
        ) {
            let set = RangeSet::new(specs).unwrap();
            let resolution = set.resolve(len);
            let ranges = resolved(&resolution);
            if let Resolution::Multiple(ranges) = &resolution {
                prop_assert!(ranges.len() >= 2);
            }
            for range in &ranges {
                prop_assert!(!range.is_empty());
                prop_assert!(range.end() <= len);
            }
            for pair in ranges.windows(2) {
                prop_assert!(pair[1].start().saturating_sub(pair[0].end()) >= COALESCE_GAP);
            }
            // Every spec's own bytes are served.
            for spec in set.specs() {
                if let Some(wanted) = spec.resolve(len) {
                    prop_assert!(ranges.iter().any(|range| range.contains_range(&wanted)));
                }
            }
            let none_satisfiable = set.specs().iter().all(|spec| spec.resolve(len).is_none());
            prop_assert_eq!(ranges.is_empty(), none_satisfiable);
        }

        #[test]
        fn covering_spec_covers_every_resolved_range(
            specs in proptest::collection::vec(spec_strategy(), 1..16),
            len in length_strategy(),
        ) {
            let set = RangeSet::new(specs).unwrap();
            if let Some(cover) = set.covering_spec() {
                let ranges = resolved(&set.resolve(len));
                if let Some(last) = ranges.last() {
                    let covered = cover.resolve(len);
                    prop_assert!(covered.is_some(), "{:?} resolves to nothing", cover);
                    let covered = covered.unwrap();
                    prop_assert!(covered.start() <= ranges[0].start());
                    prop_assert!(last.end() <= covered.end());
                }
            }
        }

        /// The fetches hold every range served, in order, apart by `gap` at least, and read at
        /// most the bytes served plus `gap` per fetch; a set that lies together is one fetch.
        #[test]
        fn fetches_hold_the_ranges_and_little_else(
            specs in proptest::collection::vec(spec_strategy(), 1..16),
            len in length_strategy(),
            gap in 0u64..10_000,
        ) {
            let set = RangeSet::new(specs).unwrap();
            let ranges = resolved(&set.resolve(len));
            let fetches = set.fetches(len, gap);
            for range in &ranges {
                prop_assert!(fetches.iter().any(|f| f.contains_range(range)), "{range:?}");
            }
            for pair in fetches.windows(2) {
                prop_assert!(pair[1].start().saturating_sub(pair[0].end()) >= gap.max(1));
            }
            let served: u64 = ranges.iter().map(ByteRange::len).sum();
            let read: u64 = fetches.iter().map(ByteRange::len).sum();
            let bound = served.saturating_add(gap.saturating_mul(ranges.len() as u64));
            prop_assert!(read <= bound, "{read} for {served}");
            if set.lies_together(gap) {
                prop_assert!(fetches.len() <= 1, "{:?} lies together in {:?}", set, fetches);
            }
        }
    }

    #[test]
    fn far_apart_ranges_are_fetched_apart() {
        let set = |specs: &[RangeSpec]| RangeSet::new(specs.to_vec()).unwrap();
        let two_ends = set(&[closed(0, 0), closed(52_428_799, 52_428_799)]);
        assert_eq!(
            two_ends.fetches(52_428_800, 65_536),
            [range(0, 1), range(52_428_799, 52_428_800)]
        );
        assert!(!two_ends.lies_together(65_536));
        let near = set(&[closed(0, 9), closed(1000, 1009), from(2000)]);
        assert!(near.lies_together(65_536));
        assert_eq!(near.fetches(3000, 65_536), [range(0, 3000)]);
        // A suffix's place depends on the length: not known to lie together.
        assert!(!set(&[closed(0, 0), suffix(1)]).lies_together(65_536));
        assert!(set(&[suffix(10), suffix(5)]).lies_together(65_536));
        assert!(set(&[suffix(0), from(400_000)]).lies_together(65_536));
        assert_eq!(set(&[closed(0, 0), suffix(1)]).fetches(10, 65_536), [range(0, 10)]);
        assert_eq!(set(&[closed(0, 0), suffix(1)]).fetches(1 << 20, 65_536).len(), 2);
    }
}
