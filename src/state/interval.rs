//! The byte ranges a download has delivered: a small, bounded set of disjoint intervals.

use std::fmt;

use rangeway_middleware::ByteRange;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Sorted, disjoint, half-open ranges of byte offsets, with touching ranges merged: `0..10` and
/// `10..20` are stored as `0..20`, so the set has one representation for each set of bytes.
///
/// Serialised compactly as `[[start, end], ...]`.
///
/// The set holds at most [`IntervalSet::MAX_INTERVALS`] intervals. An insert that would need more
/// is refused rather than approximated: merging the closest gaps would claim bytes that were never
/// delivered and could mark a download complete that is not. A refused range is only missing from
/// the record, so `delivered` stays an under-approximation and everything derived from it (the
/// resume hint, completion) stays safe. Inserts that fill or extend an existing interval never
/// add one, so a download that goes on delivering still completes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct IntervalSet {
    /// Invariant: `start < end`, and each interval ends strictly before the next starts.
    ranges: Vec<ByteRange>,
}

/// [`IntervalSet::insert`] refused a range: the set already holds as many intervals as it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the set already holds {} intervals", IntervalSet::MAX_INTERVALS)]
pub struct IntervalSetFull;

impl IntervalSet {
    /// The most intervals one set holds. Each record of a Redis-backed download decodes and
    /// re-encodes the set inside a Lua script that blocks the server while it runs: 1024 intervals
    /// keep that under a millisecond, and no well-behaved client fragments a download nearly that
    /// much (aria2c with 16 connections leaves at most 16 gaps open).
    pub const MAX_INTERVALS: usize = 1024;

    pub const fn new() -> Self {
        Self { ranges: Vec::new() }
    }

    /// Adds `range`, merging it with every interval it overlaps or touches. An empty range is a
    /// no-op. Refused, leaving the set as it was, when the result would hold more than
    /// [`Self::MAX_INTERVALS`] intervals.
    pub fn insert(&mut self, range: ByteRange) -> Result<(), IntervalSetFull> {
        if range.is_empty() {
            return Ok(());
        }
        // Intervals ending before `range` starts (not touching it) stay in front of it...
        let first = self.ranges.partition_point(|r| r.end() < range.start());
        // ...and those starting after it ends (not touching it) stay behind it.
        let last = self.ranges.partition_point(|r| r.start() <= range.end());
        // Those in between overlap or touch `range`, and become one interval with it.
        let touching = self.ranges.get(first..last).unwrap_or_default();
        let merged = match (touching.first(), touching.last()) {
            // Cannot fail: low.start <= high.end, and range.start <= range.end.
            (Some(low), Some(high)) => {
                ByteRange::new(low.start().min(range.start()), high.end().max(range.end()))
                    .unwrap_or(range)
            }
            _ if self.ranges.len() >= Self::MAX_INTERVALS => return Err(IntervalSetFull),
            _ => range,
        };
        self.ranges.splice(first..last, [merged]);
        Ok(())
    }

    /// The end of the run of bytes starting at offset 0: how far a client could resume from with
    /// everything before it in hand. 0 when byte 0 was never delivered.
    pub fn contiguous_prefix_end(&self) -> u64 {
        match self.ranges.first() {
            Some(r) if r.start() == 0 => r.end(),
            _ => 0,
        }
    }

    /// Whether `offset` is in the set.
    pub fn contains(&self, offset: u64) -> bool {
        let after = self.ranges.partition_point(|r| r.start() <= offset);
        after > 0 && self.ranges.get(after - 1).is_some_and(|r| offset < r.end())
    }

    /// Whether every byte of `0..len` is in the set (always, for `len == 0`).
    pub fn covers(&self, len: u64) -> bool {
        len == 0 || self.contiguous_prefix_end() >= len
    }

    /// How many distinct bytes the set holds.
    pub fn total(&self) -> u64 {
        // Cannot overflow: the intervals are disjoint ranges of u64 offsets.
        self.ranges.iter().map(ByteRange::len).sum()
    }

    /// The intervals, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = ByteRange> + '_ {
        self.ranges.iter().copied()
    }

    /// How many intervals the set holds (not bytes: see [`Self::total`]).
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl fmt::Debug for IntervalSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.ranges.iter()).finish()
    }
}

impl Serialize for IntervalSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.ranges.iter().map(|r| [r.start(), r.end()]))
    }
}

impl<'de> Deserialize<'de> for IntervalSet {
    /// Accepts only what [`Serialize`] writes: a stored set that breaks the invariants (unsorted,
    /// overlapping, touching, empty or reversed intervals, too many) is an error, never silently
    /// repaired into something else.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let pairs = Vec::<[u64; 2]>::deserialize(deserializer)?;
        if pairs.len() > Self::MAX_INTERVALS {
            return Err(D::Error::invalid_length(pairs.len(), &"at most 1024 intervals"));
        }
        let mut ranges = Vec::with_capacity(pairs.len());
        let mut previous_end = None;
        for [start, end] in pairs {
            let in_order = previous_end.is_none_or(|previous| previous < start);
            match ByteRange::new(start, end) {
                Some(range) if in_order && start < end => {
                    ranges.push(range);
                    previous_end = Some(end);
                }
                _ => {
                    return Err(D::Error::custom(format_args!(
                        "interval [{start}, {end}] is empty, reversed, out of order, or overlaps \
                         or touches its neighbour"
                    )));
                }
            }
        }
        Ok(Self { ranges })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn range(start: u64, end: u64) -> ByteRange {
        ByteRange::new(start, end).expect("start <= end")
    }

    fn set(ranges: &[(u64, u64)]) -> IntervalSet {
        let mut set = IntervalSet::new();
        for &(start, end) in ranges {
            set.insert(range(start, end)).expect("room");
        }
        set
    }

    fn pairs(set: &IntervalSet) -> Vec<(u64, u64)> {
        set.iter().map(|r| (r.start(), r.end())).collect()
    }

    #[test]
    fn merges_overlapping_touching_and_out_of_order_ranges() {
        assert_eq!(pairs(&set(&[(10, 20), (0, 5)])), [(0, 5), (10, 20)]);
        assert_eq!(pairs(&set(&[(10, 20), (0, 5), (5, 10)])), [(0, 20)]);
        assert_eq!(pairs(&set(&[(10, 20), (15, 30)])), [(10, 30)]);
        assert_eq!(pairs(&set(&[(10, 20), (12, 18)])), [(10, 20)]);
        assert_eq!(pairs(&set(&[(10, 20), (30, 40), (50, 60), (0, 100)])), [(0, 100)]);
        assert_eq!(pairs(&set(&[(10, 20), (30, 40), (20, 30)])), [(10, 40)]);
        assert_eq!(pairs(&set(&[(10, 20), (5, 5)])), [(10, 20)]);
    }

    #[test]
    fn prefix_cover_and_total() {
        let s = set(&[(0, 10), (20, 30)]);
        assert_eq!(s.contiguous_prefix_end(), 10);
        assert_eq!(s.total(), 20);
        assert!(s.covers(10));
        assert!(!s.covers(11));
        assert!(IntervalSet::new().covers(0));
        assert!(!IntervalSet::new().covers(1));
        assert_eq!(set(&[(1, 10)]).contiguous_prefix_end(), 0);
    }

    #[test]
    fn refuses_a_new_interval_when_full_but_still_merges() {
        let mut s = IntervalSet::new();
        for i in 0..IntervalSet::MAX_INTERVALS as u64 {
            s.insert(range(i * 10, i * 10 + 5)).expect("room");
        }
        let before = s.clone();
        let beyond = IntervalSet::MAX_INTERVALS as u64 * 10 + 100;
        assert_eq!(s.insert(range(beyond, beyond + 1)), Err(IntervalSetFull));
        assert_eq!(s, before);
        // Extending an interval or filling a gap adds none, so they are still taken.
        s.insert(range(5, 7)).expect("extends an interval");
        s.insert(range(7, 10)).expect("fills a gap");
        assert_eq!(s.len(), IntervalSet::MAX_INTERVALS - 1);
        assert_eq!(s.contiguous_prefix_end(), 15);
    }

    #[test]
    fn serialises_as_pairs_and_refuses_broken_sets() {
        let s = set(&[(0, 5), (10, 20)]);
        let json = serde_json::to_string(&s).expect("serialise");
        assert_eq!(json, "[[0,5],[10,20]]");
        assert_eq!(serde_json::from_str::<IntervalSet>(&json).expect("round trip"), s);
        for broken in [
            "[[5,0]]",
            "[[5,5]]",
            "[[0,5],[5,10]]",
            "[[0,5],[3,10]]",
            "[[10,20],[0,5]]",
            "[[0]]",
            "[[-1,5]]",
            "{}",
            "[[0,1.5]]",
        ] {
            assert!(serde_json::from_str::<IntervalSet>(broken).is_err(), "{broken} accepted");
        }
        let too_many: Vec<[u64; 2]> =
            (0..=IntervalSet::MAX_INTERVALS as u64).map(|i| [i * 2, i * 2 + 1]).collect();
        let json = serde_json::to_string(&too_many).expect("serialise");
        assert!(serde_json::from_str::<IntervalSet>(&json).is_err());
    }

    /// The model: one bool per byte of a small space.
    const SPACE: u64 = 200;

    fn model_of(inserted: &[(u64, u64)]) -> Vec<bool> {
        let mut bytes = vec![false; SPACE as usize];
        for &(start, end) in inserted {
            for b in start..end {
                bytes[b as usize] = true;
            }
        }
        bytes
    }

    proptest! {
        #[test]
        fn agrees_with_a_bitmap(
            inserts in proptest::collection::vec((0..SPACE, 0..SPACE), 0..40),
            len in 0..=SPACE,
        ) {
            let inserts: Vec<(u64, u64)> =
                inserts.into_iter().map(|(a, b)| (a.min(b), a.max(b))).collect();
            let s = set(&inserts);
            let model = model_of(&inserts);

            let mut from_set = vec![false; SPACE as usize];
            let mut previous_end = None;
            for r in s.iter() {
                prop_assert!(r.start() < r.end());
                prop_assert!(previous_end.is_none_or(|e| e < r.start()), "not canonical: {s:?}");
                previous_end = Some(r.end());
                for b in r.start()..r.end() {
                    from_set[b as usize] = true;
                }
            }
            prop_assert_eq!(&from_set, &model);

            let prefix = model.iter().take_while(|&&b| b).count() as u64;
            prop_assert_eq!(s.contiguous_prefix_end(), prefix);
            prop_assert_eq!(s.covers(len), model[..len as usize].iter().all(|&b| b));
            for offset in 0..SPACE {
                prop_assert_eq!(s.contains(offset), model[offset as usize]);
            }
            prop_assert_eq!(s.total(), model.iter().filter(|&&b| b).count() as u64);

            let json = serde_json::to_string(&s).expect("serialise");
            prop_assert_eq!(serde_json::from_str::<IntervalSet>(&json).expect("decode"), s);
        }
    }
}
