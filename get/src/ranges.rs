//! The byte ranges of a file that are on disk: sorted, disjoint, half-open `[start, end)`.

use std::fmt;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RangeSet {
    /// Sorted by start; no two touch (adjacent ranges are merged).
    spans: Vec<(u64, u64)>,
}

impl RangeSet {
    /// Adds `[start, end)`, merging it with the spans it touches.
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let first = self.spans.partition_point(|&(_, e)| e < start);
        let last = self.spans.partition_point(|&(s, _)| s <= end);
        let (mut merged_start, mut merged_end) = (start, end);
        if first < last {
            merged_start = merged_start.min(self.spans[first].0);
            merged_end = merged_end.max(self.spans[last - 1].1);
        }
        self.spans.splice(first..last, [(merged_start, merged_end)]);
    }

    /// Bytes held.
    pub(crate) fn total(&self) -> u64 {
        self.spans.iter().map(|&(s, e)| e - s).sum()
    }

    /// Where the run of bytes from 0 ends (0 when byte 0 is missing).
    pub(crate) fn prefix_end(&self) -> u64 {
        match self.spans.first() {
            Some(&(0, end)) => end,
            _ => 0,
        }
    }

    /// Whether every byte of `[0, len)` is held.
    pub(crate) fn covers(&self, len: u64) -> bool {
        len == 0 || self.prefix_end() >= len
    }

    /// The first missing stretch of `[0, len)` at or after `from`, as `[start, end)`.
    pub(crate) fn first_gap(&self, from: u64, len: u64) -> Option<(u64, u64)> {
        let mut at = from;
        for &(s, e) in &self.spans {
            if e <= at {
                continue;
            }
            if s > at {
                return Some((at, s.min(len))).filter(|&(a, b)| a < b);
            }
            at = e;
        }
        (at < len).then_some((at, len))
    }

    #[cfg(test)]
    fn spans(&self) -> &[(u64, u64)] {
        &self.spans
    }
}

/// `0-1048575,2097152-4194303` (inclusive ends, as in a Range header); empty when none.
impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, &(s, e)) in self.spans.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{s}-{}", e - 1)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for RangeSet {
    type Err = ();

    /// The form [`Display`](fmt::Display) writes.
    fn from_str(text: &str) -> Result<Self, ()> {
        let mut set = RangeSet::default();
        for span in text.split(',').filter(|s| !s.is_empty()) {
            let (first, last) = span.split_once('-').ok_or(())?;
            let (first, last): (u64, u64) =
                (first.parse().map_err(|_| ())?, last.parse().map_err(|_| ())?);
            if last < first {
                return Err(());
            }
            set.insert(first, last.checked_add(1).ok_or(())?);
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_merge_what_touches_and_keep_the_rest_apart() {
        let mut set = RangeSet::default();
        set.insert(10, 20);
        set.insert(30, 40);
        set.insert(20, 25);
        assert_eq!(set.spans(), [(10, 25), (30, 40)]);
        set.insert(5, 35);
        assert_eq!(set.spans(), [(5, 40)]);
        set.insert(0, 5);
        assert_eq!((set.prefix_end(), set.total()), (40, 40));
        set.insert(50, 50);
        assert_eq!(set.spans(), [(0, 40)], "an empty span adds nothing");
    }

    #[test]
    fn gaps_are_found_in_order_up_to_the_length() {
        let set: RangeSet = "0-9,20-29".parse().expect("parses");
        assert_eq!(set.first_gap(0, 40), Some((10, 20)));
        assert_eq!(set.first_gap(20, 40), Some((30, 40)));
        assert_eq!(set.first_gap(0, 15), Some((10, 15)));
        assert_eq!(set.first_gap(0, 10), None);
        assert!(set.covers(10) && !set.covers(11));
    }

    #[test]
    fn the_text_form_round_trips_and_bad_text_is_refused() {
        let set: RangeSet = "0-9,20-29".parse().expect("parses");
        assert_eq!(set.to_string(), "0-9,20-29");
        assert_eq!("".parse::<RangeSet>(), Ok(RangeSet::default()));
        for bad in ["5", "9-0", "a-b", "0-18446744073709551615"] {
            assert!(bad.parse::<RangeSet>().is_err(), "{bad}");
        }
    }
}
