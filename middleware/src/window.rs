use bytes::Bytes;

use crate::ByteRange;

/// Cuts a stream of chunks down to one range of it, without copying.
///
/// The stream starts at offset `stream_start`; each chunk passed to [`Window::cut`] continues it.
/// What lies inside `wanted` comes back as a `Bytes::slice` of the chunk (a reference-count bump,
/// never a copy); a chunk that lies wholly inside comes back as the very same `Bytes`.
#[derive(Debug, Clone)]
pub struct Window {
    offset: u64,
    wanted: ByteRange,
}

impl Window {
    pub fn new(stream_start: u64, wanted: ByteRange) -> Self {
        Self { offset: stream_start, wanted }
    }

    /// The part of `chunk` inside the window; `None` when there is none.
    pub fn cut(&mut self, chunk: Bytes) -> Option<Bytes> {
        let chunk_start = self.offset;
        // A chunk cannot be longer than memory, so its length fits u64; saturate rather than wrap
        // should a stream ever claim to run past u64::MAX.
        let chunk_end = chunk_start.saturating_add(chunk.len() as u64);
        self.offset = chunk_end;
        let inside = ByteRange::new(chunk_start, chunk_end)?.intersect(&self.wanted)?;
        if inside.len() == chunk.len() as u64 {
            return Some(chunk);
        }
        // Both bounds are within the chunk, so they fit usize.
        let from = (inside.start() - chunk_start) as usize;
        let to = (inside.end() - chunk_start) as usize;
        Some(chunk.slice(from..to))
    }

    /// Whether every wanted byte has gone by.
    pub fn is_done(&self) -> bool {
        self.offset >= self.wanted.end()
    }

    /// Offset in the stream of the next chunk.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_chunk_inside_is_passed_on_as_is() {
        let chunk = Bytes::from_static(b"abcdef");
        let mut w = Window::new(100, ByteRange::new(0, 1000).unwrap());
        let out = w.cut(chunk.clone()).unwrap();
        assert_eq!(out.as_ptr(), chunk.as_ptr());
        assert_eq!(out.len(), chunk.len());
    }

    proptest! {
        #[test]
        fn cutting_chunks_equals_slicing_the_whole(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            cuts in proptest::collection::vec(0usize..300, 0..8),
            a in 0u64..320, b in 0u64..320,
        ) {
            let wanted = ByteRange::new(a.min(b), a.max(b)).unwrap();
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            bounds.push(0);
            bounds.push(data.len());
            bounds.sort_unstable();
            let whole = Bytes::from(data.clone());
            let mut w = Window::new(0, wanted);
            let mut got = Vec::new();
            for pair in bounds.windows(2) {
                if let Some(piece) = w.cut(whole.slice(pair[0]..pair[1])) {
                    // A slice of the original buffer, not a copy.
                    prop_assert!(piece.as_ptr() >= whole.as_ptr());
                    got.extend_from_slice(&piece);
                }
            }
            let lo = (wanted.start() as usize).min(data.len());
            let hi = (wanted.end() as usize).min(data.len());
            prop_assert_eq!(&got[..], &data[lo..hi]);
        }
    }
}
