//! CRC32 of pieces: the CRCs of adjacent ranges combine into the CRC of their union, so a
//! download that arrives in resumed pieces still yields the CRC of the whole.

use std::collections::BTreeMap;

use crate::ByteRange;
use crate::chain::{Digest, RangeDigest};

/// The CRC32 (IEEE, as gzip and zlib compute it) of one range of a stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Crc32Piece {
    pub range: ByteRange,
    pub crc: u32,
}

impl Crc32Piece {
    pub const fn new(range: ByteRange, crc: u32) -> Self {
        Self { range, crc }
    }

    /// The piece a stage reported as a CRC32 digest; `None` for any other digest.
    pub fn from_digest(digest: &RangeDigest) -> Option<Self> {
        match digest.digest {
            Digest::Crc32(crc) => Some(Self::new(digest.range, crc)),
            _ => None,
        }
    }

    /// The CRC of this piece followed by `next`; `None` unless `next` starts where this ends.
    pub fn combine(&self, next: &Crc32Piece) -> Option<Crc32Piece> {
        if next.range.start() != self.range.end() {
            return None;
        }
        let range = ByteRange::new(self.range.start(), next.range.end())?;
        let mut crc = crc32fast::Hasher::new_with_initial_len(self.crc, self.range.len());
        crc.combine(&crc32fast::Hasher::new_with_initial_len(next.crc, next.range.len()));
        Some(Self::new(range, crc.finalize()))
    }

    /// The CRC of `range`, from pieces that tile it end to end, in any order; other pieces
    /// (overlapping ones, as resumed and parallel downloads make, or ones outside `range`) are
    /// ignored. `None` when no chain of adjacent pieces covers `range` exactly.
    pub fn assemble(pieces: &[Crc32Piece], range: ByteRange) -> Option<Crc32Piece> {
        let mut sorted: Vec<&Crc32Piece> = pieces
            .iter()
            .filter(|piece| !piece.range.is_empty() && range.contains_range(&piece.range))
            .collect();
        sorted.sort_unstable_by_key(|piece| piece.range.start());
        // reached[end] is the CRC of range.start..end through some chain of pieces. In start
        // order, every way to reach a piece's start is known by the time the piece comes up,
        // since the pieces that end there start before it.
        let mut reached = BTreeMap::new();
        reached.insert(
            range.start(),
            Crc32Piece::new(ByteRange::new(range.start(), range.start())?, 0),
        );
        for piece in sorted {
            if reached.contains_key(&piece.range.end()) {
                continue;
            }
            if let Some(joined) =
                reached.get(&piece.range.start()).and_then(|so_far| so_far.combine(piece))
            {
                reached.insert(piece.range.end(), joined);
            }
        }
        reached.remove(&range.end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn piece(data: &[u8], start: usize, end: usize) -> Crc32Piece {
        let range = ByteRange::new(start as u64, end as u64).unwrap();
        Crc32Piece::new(range, crc32fast::hash(&data[start..end]))
    }

    #[test]
    fn only_adjacent_pieces_combine() {
        let data = b"hello, world";
        assert_eq!(piece(data, 0, 5).combine(&piece(data, 5, 12)), Some(piece(data, 0, 12)));
        assert_eq!(piece(data, 0, 5).combine(&piece(data, 6, 12)), None);
        assert_eq!(piece(data, 5, 12).combine(&piece(data, 0, 5)), None);
        // Empty pieces are neutral.
        assert_eq!(piece(data, 0, 0).combine(&piece(data, 0, 12)), Some(piece(data, 0, 12)));
        assert_eq!(piece(data, 0, 12).combine(&piece(data, 12, 12)), Some(piece(data, 0, 12)));
    }

    #[test]
    fn assembly_needs_an_exact_tiling() {
        let data: Vec<u8> = (0..100u8).collect();
        let whole = ByteRange::whole(100);
        let overlapping = [piece(&data, 0, 40), piece(&data, 30, 70), piece(&data, 40, 100)];
        assert_eq!(Crc32Piece::assemble(&overlapping, whole), Some(piece(&data, 0, 100)));
        let gap = [piece(&data, 0, 40), piece(&data, 41, 100)];
        assert_eq!(Crc32Piece::assemble(&gap, whole), None);
        assert_eq!(Crc32Piece::assemble(&[], ByteRange::whole(0)), Some(piece(&data, 0, 0)));
        assert_eq!(Crc32Piece::assemble(&[], whole), None);
        let digest = RangeDigest { range: whole, digest: Digest::Crc32(7) };
        assert_eq!(Crc32Piece::from_digest(&digest), Some(Crc32Piece::new(whole, 7)));
        let sha = RangeDigest { range: whole, digest: Digest::Sha256([0; 32]) };
        assert_eq!(Crc32Piece::from_digest(&sha), None);
    }

    proptest! {
        #[test]
        fn pieces_combine_into_the_whole(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            cuts in proptest::collection::vec(0usize..2000, 0..10),
            extra in proptest::collection::vec((0usize..2000, 0usize..2000), 0..5),
        ) {
            let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(data.len())).collect();
            bounds.extend([0, data.len()]);
            bounds.sort_unstable();
            bounds.dedup();
            let mut pieces: Vec<Crc32Piece> =
                bounds.windows(2).map(|w| piece(&data, w[0], w[1])).collect();
            // Overlapping extras change nothing.
            for (a, b) in extra {
                let (a, b) = (a.min(data.len()), b.min(data.len()));
                pieces.push(piece(&data, a.min(b), a.max(b)));
            }
            pieces.reverse();
            let whole = ByteRange::whole(data.len() as u64);
            prop_assert_eq!(
                Crc32Piece::assemble(&pieces, whole),
                Some(Crc32Piece::new(whole, crc32fast::hash(&data)))
            );
        }
    }
}
