//! Where each part of the gzip member lies in the output, as far as the block index tells: the
//! arithmetic behind planning, apart from the bytes.

use crate::chain::Segment;

/// The member's header: magic, deflate, no flags (no name, comment or extra field), no
/// modification time, no extra flags, OS 255 ("unknown"). The same for every input, so the output
/// depends on nothing but the input bytes.
pub(super) const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];

/// The empty final deflate block with fixed Huffman codes (BFINAL 1, BTYPE 01, end-of-block),
/// padded to a byte: after the last segment's sync flush it ends the deflate stream.
pub(super) const FINAL_BLOCK: [u8; 2] = [0x03, 0x00];

/// The final block, then the CRC32 and ISIZE of the whole input (little-endian).
pub(super) const TAIL_LEN: u64 = FINAL_BLOCK.len() as u64 + 8;

const HEADER_LEN: u64 = HEADER.len() as u64;

/// The member for an input of `input_len` bytes cut into blocks of `block_size`, with the first
/// blocks' segments known from the index.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout<'a> {
    block_size: u64,
    input_len: u64,
    blocks: u64,
    /// The usable index entries: at most one per block, and only as many as the output offsets
    /// they place fit a `u64` (an index past that is corrupt, not merely large).
    indexed: &'a [Segment],
    /// The output offset where the first block not indexed starts.
    indexed_end: u64,
}

impl<'a> Layout<'a> {
    pub(super) fn new(block_size: u64, input_len: u64, index: &'a [Segment]) -> Self {
        let blocks = input_len.div_ceil(block_size);
        let mut usable = index.len().min(usize::try_from(blocks).unwrap_or(usize::MAX));
        let mut indexed_end = HEADER_LEN;
        for (k, segment) in index[..usable].iter().enumerate() {
            match indexed_end
                .checked_add(segment.output_len)
                .filter(|end| *end <= u64::MAX - TAIL_LEN)
            {
                Some(end) => indexed_end = end,
                None => {
                    usable = k;
                    break;
                }
            }
        }
        Self { block_size, input_len, blocks, indexed: &index[..usable], indexed_end }
    }

    /// How many blocks the input has: none for an empty input.
    pub(super) fn blocks(&self) -> u64 {
        self.blocks
    }

    /// How many blocks, from block 0 on, the index places.
    pub(super) fn indexed_blocks(&self) -> u64 {
        self.indexed.len() as u64
    }

    /// The whole output length, when the index places every block.
    pub(super) fn output_len(&self) -> Option<u64> {
        (self.indexed_blocks() == self.blocks).then_some(self.indexed_end + TAIL_LEN)
    }

    /// The input range of block `block`, clipped to the input.
    pub(super) fn block_input(&self, block: u64) -> (u64, u64) {
        let start = block.saturating_mul(self.block_size).min(self.input_len);
        (start, start.saturating_add(self.block_size).min(self.input_len))
    }

    /// The block a pass must start at for its output to reach output byte `at`, and the output
    /// offset that pass's output starts at. The header counts as block 0's (a pass from 0 emits
    /// it), the tail as the last block's (the pass that compresses it emits the tail), and an
    /// offset past the indexed blocks as the first block not indexed: output up to `at` is then
    /// computed ahead, never sent.
    pub(super) fn pass_for(&self, at: u64) -> (u64, u64) {
        let run_start = |k: u64, start: u64| (k, if k == 0 { 0 } else { start });
        let mut start = HEADER_LEN;
        for (k, segment) in (0u64..).zip(self.indexed) {
            // `Layout::new` kept only the entries whose sum fits.
            let end = start + segment.output_len;
            if at < end {
                return run_start(k, start);
            }
            start = end;
        }
        match (self.output_len(), self.indexed.last()) {
            (Some(_), Some(last)) => run_start(self.blocks - 1, start - last.output_len),
            // An empty input: the header and the tail are all there is.
            (Some(_), None) => (0, 0),
            (None, _) => run_start(self.indexed_blocks(), start),
        }
    }
}
