//! The `Content-Range` response header (RFC 9110 §14.4): written for our 206/416 answers, read
//! from an upstream's.

use super::syntax::{is_ows, parse_digits, trim_ows};
use crate::ByteRange;

/// What a `Content-Range` header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContentRange {
    /// `bytes first-last/complete` or `bytes first-last/*`.
    Satisfied {
        /// The bytes enclosed, half-open; never empty.
        range: ByteRange,
        /// The representation's length; `None` when the sender wrote `*` (unknown).
        complete_len: Option<u64>,
    },
    /// `bytes */complete`, as sent with a 416.
    Unsatisfied { complete_len: u64 },
}

/// `bytes first-last/complete_len`, the `Content-Range` of a 206 carrying `range`.
///
/// `range` must be non-empty and end within `complete_len` — true of every range a
/// [`RangeSet`](super::RangeSet) resolves to. HTTP cannot state anything else as a satisfied
/// range, so a violation (a bug in the caller) is caught in debug builds and written as the
/// unsatisfied form in release ones: a client then rejects the response rather than take it as
/// the wrong bytes.
pub fn content_range(range: ByteRange, complete_len: u64) -> String {
    debug_assert!(
        !range.is_empty() && range.end() <= complete_len,
        "{range:?} cannot be a Content-Range of {complete_len} bytes"
    );
    match range.last() {
        Some(last) if range.end() <= complete_len => {
            format!("bytes {}-{last}/{complete_len}", range.start())
        }
        _ => unsatisfied_content_range(complete_len),
    }
}

/// `bytes */complete_len`, the `Content-Range` of a 416.
pub fn unsatisfied_content_range(complete_len: u64) -> String {
    format!("bytes */{complete_len}")
}

/// Parses a `Content-Range` value, as an upstream sends with a 206 or 416.
///
/// Only the `bytes` unit (case-insensitive) is understood. `None` for anything malformed or
/// impossible: `last < first`, `last` at or past a known complete length, numbers that overflow
/// `u64`, or a last byte of `u64::MAX` (its end cannot be written half-open).
pub fn parse_content_range(value: &[u8]) -> Option<ContentRange> {
    let value = trim_ows(value);
    let space = value.iter().position(|&b| b == b' ')?;
    let (unit, rest) = value.split_at(space);
    if !unit.eq_ignore_ascii_case(b"bytes") {
        return None;
    }
    // The grammar has one SP here; accepting a run of them costs nothing and refuses nothing real.
    let rest = &rest[rest.iter().take_while(|&&b| is_ows(b)).count()..];
    let slash = rest.iter().position(|&b| b == b'/')?;
    let (enclosed, complete) = (&rest[..slash], &rest[slash + 1..]);
    if enclosed == b"*" {
        return Some(ContentRange::Unsatisfied { complete_len: parse_digits(complete)? });
    }
    let dash = enclosed.iter().position(|&b| b == b'-')?;
    let first = parse_digits(&enclosed[..dash])?;
    let last = parse_digits(&enclosed[dash + 1..])?;
    let complete_len = match complete {
        b"*" => None,
        digits => Some(parse_digits(digits)?),
    };
    if last < first || complete_len.is_some_and(|len| last >= len) {
        return None;
    }
    // `checked_add` refuses a last byte of u64::MAX, whose end `u64` cannot hold.
    let range = ByteRange::new(first, last.checked_add(1)?)?;
    Some(ContentRange::Satisfied { range, complete_len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn satisfied(start: u64, end: u64, complete_len: Option<u64>) -> Option<ContentRange> {
        Some(ContentRange::Satisfied { range: ByteRange::new(start, end).unwrap(), complete_len })
    }

    #[test]
    fn writes_both_forms() {
        let range = ByteRange::new(0, 100).unwrap();
        assert_eq!(content_range(range, 1000), "bytes 0-99/1000");
        let last = ByteRange::new(u64::MAX - 1, u64::MAX).unwrap();
        assert_eq!(
            content_range(last, u64::MAX),
            "bytes 18446744073709551614-18446744073709551614/18446744073709551615"
        );
        assert_eq!(unsatisfied_content_range(1000), "bytes */1000");
        assert_eq!(unsatisfied_content_range(0), "bytes */0");
    }

    #[test]
    fn parses_what_upstreams_send() {
        let cases: &[(&[u8], Option<ContentRange>)] = &[
            (b"bytes 0-99/1000", satisfied(0, 100, Some(1000))),
            (b"bytes 999-999/1000", satisfied(999, 1000, Some(1000))),
            (b"BYTES 5-9/*", satisfied(5, 10, None)),
            (b" bytes  5-9/10 ", satisfied(5, 10, Some(10))),
            (b"bytes */1000", Some(ContentRange::Unsatisfied { complete_len: 1000 })),
            (b"bytes */0", Some(ContentRange::Unsatisfied { complete_len: 0 })),
            (
                b"bytes 0-18446744073709551614/18446744073709551615",
                satisfied(0, u64::MAX, Some(u64::MAX)),
            ),
            (b"bytes 9-5/10", None),
            (b"bytes 6-5/90", None),
            (b"bytes 0-10/10", None),
            (b"bytes 0-0/0", None),
            (b"bytes 0-18446744073709551615/*", None),
            (b"bytes 0-99999999999999999999/*", None),
            (b"bytes 0-1/99999999999999999999", None),
            (b"bytes */*", None),
            (b"bytes *", None),
            (b"bytes 0-1", None),
            (b"bytes 0-/10", None),
            (b"bytes -1/10", None),
            (b"bytes +0-1/10", None),
            (b"bytes=0-1/10", None),
            (b"items 0-1/10", None),
            (b"bytes0-1/10", None),
            (b"", None),
        ];
        for (value, expected) in cases {
            assert_eq!(
                &parse_content_range(value),
                expected,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    proptest! {
        #[test]
        fn content_range_round_trips(
            start in any::<u64>(),
            len in 1u64..=u64::MAX,
            extra in any::<u64>(),
        ) {
            let Some(range) = ByteRange::from_len(start, len) else { return Ok(()) };
            let complete_len = range.end().saturating_add(extra % 1000);
            let written = content_range(range, complete_len);
            prop_assert_eq!(
                parse_content_range(written.as_bytes()),
                Some(ContentRange::Satisfied { range, complete_len: Some(complete_len) })
            );
            let unsatisfied = unsatisfied_content_range(complete_len);
            prop_assert_eq!(
                parse_content_range(unsatisfied.as_bytes()),
                Some(ContentRange::Unsatisfied { complete_len })
            );
        }

        #[test]
        fn accepts_exactly_the_possible_positions(
            first in prop_oneof![0u64..8, any::<u64>()],
            last in prop_oneof![0u64..8, any::<u64>()],
            len in prop_oneof![0u64..8, any::<u64>(), Just(u64::MAX)],
        ) {
            let parsed = parse_content_range(format!("bytes {first}-{last}/{len}").as_bytes());
            prop_assert_eq!(parsed.is_some(), first <= last && last < len);
            if let Some(ContentRange::Satisfied { range, .. }) = parsed {
                prop_assert_eq!((range.start(), range.last()), (first, Some(last)));
            }
        }

        #[test]
        fn parsing_arbitrary_bytes_never_panics(
            value in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let parsed = parse_content_range(&value);
            if let Some(ContentRange::Satisfied { range, complete_len }) = parsed {
                prop_assert!(!range.is_empty());
                prop_assert!(complete_len.is_none_or(|len| range.end() <= len));
            }
        }
    }
}
