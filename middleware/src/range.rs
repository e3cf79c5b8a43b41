use std::fmt;

/// A half-open range of byte offsets, `start..end`, in some representation.
///
/// HTTP writes ranges inclusively (`bytes=0-99`); inside rangeway every range is half-open so that
/// empty ranges and lengths need no `- 1` and cannot underflow. Invariant: `start <= end`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByteRange {
    start: u64,
    end: u64,
}

impl ByteRange {
    /// `start..end`, or `None` when `start > end`.
    pub const fn new(start: u64, end: u64) -> Option<Self> {
        if start <= end { Some(Self { start, end }) } else { None }
    }

    /// `start..start + len`, or `None` when that overflows `u64`.
    pub const fn from_len(start: u64, len: u64) -> Option<Self> {
        match start.checked_add(len) {
            Some(end) => Some(Self { start, end }),
            None => None,
        }
    }

    /// The whole of a representation of `len` bytes.
    pub const fn whole(len: u64) -> Self {
        Self { start: 0, end: len }
    }

    /// From `start` to an end not known yet, which ranges write as `u64::MAX`.
    pub const fn open(start: u64) -> Self {
        Self { start, end: u64::MAX }
    }

    pub const fn start(&self) -> u64 {
        self.start
    }

    /// One past the last byte.
    pub const fn end(&self) -> u64 {
        self.end
    }

    pub const fn len(&self) -> u64 {
        self.end - self.start
    }

    pub const fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The last byte, as HTTP's `Content-Range` writes it; `None` for an empty range.
    pub const fn last(&self) -> Option<u64> {
        if self.is_empty() { None } else { Some(self.end - 1) }
    }

    pub const fn contains_range(&self, other: &ByteRange) -> bool {
        self.start <= other.start && other.end <= self.end
    }

    /// The overlap of two ranges, `None` when they do not overlap.
    pub fn intersect(&self, other: &ByteRange) -> Option<ByteRange> {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        (start < end).then_some(ByteRange { start, end })
    }
}

impl fmt::Debug for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn construction_rejects_reversed_and_overflowing() {
        assert_eq!(ByteRange::new(5, 4), None);
        assert_eq!(ByteRange::from_len(u64::MAX, 1), None);
        assert_eq!(ByteRange::from_len(u64::MAX, 0).map(|r| r.len()), Some(0));
    }

    #[test]
    fn last_and_intersection() {
        let r = ByteRange::new(10, 20).unwrap();
        assert_eq!(r.last(), Some(19));
        assert_eq!(ByteRange::whole(0).last(), None);
        assert_eq!(r.intersect(&ByteRange::new(15, 30).unwrap()), ByteRange::new(15, 20));
        assert_eq!(r.intersect(&ByteRange::new(20, 30).unwrap()), None);
        assert!(r.contains_range(&ByteRange::new(10, 20).unwrap()));
        assert!(!r.contains_range(&ByteRange::new(9, 20).unwrap()));
    }
}
