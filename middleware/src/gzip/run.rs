//! One pass of the gzip stage: input buffered into whole blocks, each compressed by a fresh
//! raw-deflate compressor, checked against the index, and framed into the member.

use std::fmt;

use bytes::Bytes;
use flate2::{Compress, Compression, FlushCompress};

use super::GzipError;
use super::layout::{FINAL_BLOCK, HEADER};
use crate::chain::{Segment, Stage, StageError, StageReport};

/// A pass over the input from the start of block `first_block` on.
pub(super) struct GzipRun {
    level: Compression,
    block_size: usize,
    /// The length of the whole input, when known: the tail is emitted when the pass reaches it.
    input_len: Option<u64>,
    /// Input offset of the next byte pushed.
    offset: u64,
    /// The input of the block in progress. A block is compressed in one call, never fed in
    /// pieces (how the input was chunked must not shape the output), so it waits here until it
    /// is complete or the input ends. Allocated once, at `block_size`.
    pending: Vec<u8>,
    first_block: u64,
    /// The number of the next block to compress.
    next_block: u64,
    /// What the index recorded for blocks `first_block..`: each regenerated block is checked
    /// against it before any byte of it is returned.
    expected: Vec<Segment>,
    /// CRC32 of the input before block `next_block`, the blocks before the pass's from the index.
    crc: crc32fast::Hasher,
    header_due: bool,
    /// Every segment this pass produced, by block number.
    produced: Vec<(u64, Segment)>,
    phase: Phase,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Running,
    Finished,
    /// An error was returned: nothing more comes out.
    Failed,
}

impl GzipRun {
    /// A pass starting at the first byte of block `first_block`, whose input CRC32 up to there
    /// is `crc`; `expected` are the index entries from that block on.
    pub(super) fn new(
        level: Compression,
        block_size: usize,
        input_len: Option<u64>,
        first_block: u64,
        crc: crc32fast::Hasher,
        expected: Vec<Segment>,
    ) -> Self {
        Self {
            level,
            block_size,
            input_len,
            // The CRC covers exactly the input before the pass: blocks 0..first_block.
            offset: crc.total_len(),
            pending: Vec::with_capacity(block_size),
            first_block,
            next_block: first_block,
            expected,
            crc,
            header_due: first_block == 0,
            produced: Vec::new(),
            phase: Phase::Running,
        }
    }

    /// Compresses one whole block onto `out` as the next segment, checking it against the index.
    fn compress_block(&mut self, block: &[u8], out: &mut Vec<u8>) -> Result<(), StageError> {
        let start = out.len();
        // Deflate's worst case is a little over the input (5 bytes per stored block, 9 bits for
        // some literals under fixed Huffman codes) plus the flush: room for all of it lets one
        // call do the whole block.
        out.reserve(block.len() + block.len() / 8 + 64);
        let mut compressor = Compress::new(self.level, false);
        loop {
            // At most `block.len()`, so it fits a usize.
            let consumed = compressor.total_in() as usize;
            compressor
                .compress_vec(&block[consumed..], out, FlushCompress::Sync)
                .map_err(|error| StageError::Other(Box::new(error)))?;
            // Returning with output space left means the flush is complete.
            if compressor.total_in() == block.len() as u64 && out.len() < out.capacity() {
                break;
            }
            out.reserve(block.len() / 8 + 64);
        }
        let segment = Segment {
            output_len: (out.len() - start) as u64,
            output_crc32: crc32fast::hash(&out[start..]),
            input_crc32: crc32fast::hash(block),
        };
        let block_number = self.next_block;
        let known = usize::try_from(block_number - self.first_block)
            .ok()
            .and_then(|index| self.expected.get(index));
        if let Some(&expected) = known
            && expected != segment
        {
            out.truncate(start);
            return Err(StageError::SegmentMismatch {
                segment: block_number,
                expected,
                found: segment,
            });
        }
        self.crc.combine(&crc32fast::Hasher::new_with_initial_len(
            segment.input_crc32,
            block.len() as u64,
        ));
        self.produced.push((block_number, segment));
        self.next_block += 1;
        Ok(())
    }

    /// Compresses the pending block onto `out`, keeping the buffer for the next one.
    fn compress_pending(&mut self, out: &mut Vec<u8>) -> Result<(), StageError> {
        let block = std::mem::take(&mut self.pending);
        let result = self.compress_block(&block, out);
        self.pending = block;
        self.pending.clear();
        result
    }

    fn start_output(&mut self) -> Vec<u8> {
        if std::mem::take(&mut self.header_due) { HEADER.to_vec() } else { Vec::new() }
    }

    fn push_block_data(&mut self, mut data: &[u8]) -> Result<Option<Bytes>, StageError> {
        let mut out = self.start_output();
        if !self.pending.is_empty() {
            let take = (self.block_size - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() == self.block_size {
                self.compress_pending(&mut out)?;
            }
        }
        // Whole blocks straight from the chunk, without a copy into `pending`.
        while self.pending.is_empty() && data.len() >= self.block_size {
            let (block, rest) = data.split_at(self.block_size);
            self.compress_block(block, &mut out)?;
            data = rest;
        }
        self.pending.extend_from_slice(data);
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }

    fn finish_output(&mut self) -> Result<Option<Bytes>, StageError> {
        let at_end = match self.input_len {
            None => true,
            Some(input_len) => {
                // A pass may stop early at a block boundary (a range that ends before the
                // input's end), never inside a block or past the end.
                if self.offset > input_len || (self.offset < input_len && !self.pending.is_empty())
                {
                    return Err(StageError::Other(Box::new(GzipError::InputEnd {
                        offset: self.offset,
                        input_len,
                    })));
                }
                self.offset == input_len
            }
        };
        let mut out = self.start_output();
        if !self.pending.is_empty() {
            self.compress_pending(&mut out)?;
        }
        if at_end {
            out.extend_from_slice(&FINAL_BLOCK);
            out.extend_from_slice(&self.crc.clone().finalize().to_le_bytes());
            // ISIZE is the input length modulo 2^32: the truncation is the format's.
            out.extend_from_slice(&(self.offset as u32).to_le_bytes());
        }
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }
}

impl fmt::Debug for GzipRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GzipRun")
            .field("level", &self.level.level())
            .field("block_size", &self.block_size)
            .field("offset", &self.offset)
            .field("pending", &self.pending.len())
            .field("next_block", &self.next_block)
            .field("phase", &self.phase)
            .finish()
    }
}

impl Stage for GzipRun {
    fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError> {
        if self.phase != Phase::Running {
            return Err(StageError::Other(Box::new(GzipError::Ended)));
        }
        let result = self
            .offset
            .checked_add(chunk.len() as u64)
            .ok_or(StageError::Overflow(self.offset))
            .and_then(|end| {
                self.offset = end;
                self.push_block_data(&chunk)
            });
        if result.is_err() {
            self.phase = Phase::Failed;
        }
        result
    }

    fn finish(&mut self) -> Result<Option<Bytes>, StageError> {
        match self.phase {
            Phase::Running => {}
            Phase::Finished => return Ok(None),
            Phase::Failed => return Err(StageError::Other(Box::new(GzipError::Ended))),
        }
        let result = self.finish_output();
        self.phase = if result.is_ok() { Phase::Finished } else { Phase::Failed };
        result
    }

    fn report(&self) -> Option<StageReport> {
        let mut report = StageReport::default();
        report.segments.clone_from(&self.produced);
        Some(report)
    }
}
