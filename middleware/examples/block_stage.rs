//! A block-structured stage of your own: `crc-blocks` cuts its input into blocks of `block_size`
//! bytes (the last one shorter) and follows each block with the CRC32 of that block, so that
//! whoever downloads the output can check every block of it. Registered beside the built-in
//! stages, built from a route's options, and run for a range of its output.
//!
//!   cargo run -p rangeway-middleware --example block_stage
//!   cargo test -p rangeway-middleware --example block_stage
//!
//! Where `custom_stage.rs` has the identity algebra (output byte `i` comes from input byte `i`),
//! this stage has a block algebra: output block `k` is input block `k` followed by a 4-byte
//! trailer, and the trailer depends on every byte of its block. So a range of the output maps to
//! the whole input blocks that cover it, a pass can only start at a block boundary, and the
//! output is longer than the input. The built-in `gzip` and `aes128gcm` stages plan the same way.
//!
//! The format, for an input of `L` bytes and blocks of `B`:
//! - input block `k` is bytes `k·B .. min((k + 1)·B, L)`;
//! - output block `k` is that block, then its CRC32 (IEEE, as gzip and zlib compute it),
//!   big-endian; it starts at output byte `k·(B + 4)`;
//! - the output is `L + 4·⌈L/B⌉` bytes: an empty input has no blocks and an empty output.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::{
    Chain, ChainError, Form, Learned, ObjectVersion, OptionError, Stage, StageContext, StageError,
    StageFactory, StageOptions, StagePlan, StageRegistry, StageState,
};

/// The kind name the stage is registered under, and that a route's config names.
const KIND: &str = "crc-blocks";

/// The version of the output format, in the identity: bump it when anything that shapes the
/// output (the trailer's byte order, say) changes, so that the representation's ETag changes too.
const FORMAT_VERSION: u32 = 1;

/// The length of a block's trailer: a CRC32.
const TRAILER_LEN: u64 = 4;

/// 64 KiB of input per block.
const DEFAULT_BLOCK_SIZE: u64 = 64 << 10;

/// Below 16 bytes the trailer would be more than a fifth of the output.
const MIN_BLOCK_SIZE: u64 = 16;

/// A range re-reads up to a whole block from the origin at each of its ends, and a resume
/// re-reads the block it starts in: 16 MiB keeps that bounded.
const MAX_BLOCK_SIZE: u64 = 16 << 20;

/// The `crc-blocks` stage, configured.
///
/// Options: `block_size` (bytes, from [`MIN_BLOCK_SIZE`] to [`MAX_BLOCK_SIZE`]; default
/// [`DEFAULT_BLOCK_SIZE`]).
#[derive(Debug)]
pub(crate) struct CrcBlocksFactory {
    block_size: u64,
    identity: String,
}

impl CrcBlocksFactory {
    /// Builds the stage from a route's options, reporting every bad one with its key. The
    /// signature is the one [`StageRegistry::register`] takes.
    pub(crate) fn from_options(
        options: &StageOptions,
    ) -> Result<Arc<dyn StageFactory>, Vec<OptionError>> {
        let mut reader = options.reader();
        // `None` when absent, and when not a non-negative integer (the reader recorded why).
        let block_size = reader.u64("block_size").unwrap_or(DEFAULT_BLOCK_SIZE);
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
            // `problem — fix`: rangeway's config check shows the two parts apart.
            reader.error(
                "block_size",
                format_args!(
                    "{block_size} bytes is not between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE} — \
                     use e.g. {DEFAULT_BLOCK_SIZE}, the default (64 KiB)"
                ),
            );
        }
        // Every problem at once, including keys nothing asked for (a typo of `block_size`).
        reader.finish()?;
        // Everything that shapes the output, and the format's version.
        let identity = format!("{KIND}(v{FORMAT_VERSION},block_size={block_size})");
        Ok(Arc::new(Self { block_size, identity }))
    }

    /// The length of every output block but the last: a whole input block and its trailer.
    const fn framed_size(&self) -> u64 {
        self.block_size + TRAILER_LEN
    }
}

impl StageFactory for CrcBlocksFactory {
    fn kind(&self) -> &str {
        KIND
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    /// The input blocks that hold `output`: from the block holding its first byte to the end of
    /// the block holding its last (the input's end for the last block), and `skip` the bytes of
    /// the first output block before `output` starts.
    fn plan(
        &self,
        output: ByteRange,
        input_len: u64,
        context: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        let plan_error = |reason: String| StageError::Plan { range: output, input_len, reason };
        let len = self.output_len(input_len, context).ok_or(StageError::Overflow(input_len))?;
        if output.end() > len {
            return Err(plan_error(format!("past the end of the {len} bytes of output")));
        }
        let Some(last) = output.last() else {
            // Nothing wanted: nothing to read.
            return Ok(StagePlan { input: ByteRange::whole(0), skip: 0 });
        };
        let framed = self.framed_size();
        let first_block = output.start() / framed;
        let last_block = last / framed;
        // Both blocks exist (the output is inside `len`), so their starts lie inside the input.
        let start = first_block * self.block_size;
        let end = (last_block + 1).saturating_mul(self.block_size).min(input_len);
        let input = ByteRange::new(start, end)
            .ok_or_else(|| plan_error(format!("block {first_block} starts past the input")))?;
        Ok(StagePlan { input, skip: output.start() - first_block * framed })
    }

    fn output_len(&self, input_len: u64, _: &StageContext<'_>) -> Option<u64> {
        let trailers = input_len.div_ceil(self.block_size).checked_mul(TRAILER_LEN)?;
        input_len.checked_add(trailers)
    }

    fn observes_only(&self) -> bool {
        false
    }

    /// Framing reads no content, so it may follow encryption: a download of ciphertext can be
    /// checked block by block too.
    fn accepts(&self) -> Form {
        Form::Encrypted
    }

    /// Trailers interleaved with the content make it no longer of the origin's type.
    fn media_type(&self) -> Option<&str> {
        Some("application/octet-stream")
    }

    /// Starts at a block boundary: a trailer needs its whole block, from the block's first byte.
    fn start(
        &self,
        at_input: u64,
        resume: Option<&StageState>,
        context: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError> {
        let refuse = |reason: String| Err(StageError::Resume { offset: at_input, reason });
        if resume.is_some() {
            return refuse(format!(
                "{KIND} reports no states to resume from; it starts at any block boundary"
            ));
        }
        if !at_input.is_multiple_of(self.block_size) {
            return refuse(format!(
                "not a block boundary: blocks hold {} input bytes each",
                self.block_size
            ));
        }
        if let Some(len) = context.input_len
            && at_input > len
        {
            return refuse(format!("past the end of the {len} input bytes"));
        }
        Ok(Box::new(CrcBlocks {
            block_size: self.block_size,
            input_len: context.input_len,
            offset: at_input,
            filled: 0,
            crc: crc32fast::Hasher::new(),
            finished: false,
        }))
    }
}

/// Why a pass of the stage cannot go on; it comes as a [`StageError::Other`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum CrcBlocksError {
    #[error("the input runs past its {len} bytes")]
    InputPastEnd { len: u64 },
    #[error(
        "the input ended at byte {offset}, inside a block, short of its {len} bytes: a block's \
         trailer needs all of the block"
    )]
    EndedInsideBlock { offset: u64, len: u64 },
    #[error("input pushed after the pass finished")]
    Finished,
}

impl From<CrcBlocksError> for StageError {
    fn from(error: CrcBlocksError) -> Self {
        StageError::Other(Box::new(error))
    }
}

/// One request's pass, from a block boundary on. The data bytes go out as they come; a block's
/// trailer goes out with the chunk that completes the block, or at `finish` for a last, short
/// block. So nothing is buffered but the running CRC32.
#[derive(Debug)]
struct CrcBlocks {
    block_size: u64,
    /// The whole input's length, when known: a pass that ends inside a block short of it fails.
    input_len: Option<u64>,
    /// Input offset past the last byte taken.
    offset: u64,
    /// Bytes of the current block taken so far, less than `block_size`.
    filled: u64,
    /// CRC32 of those bytes.
    crc: crc32fast::Hasher,
    finished: bool,
}

impl CrcBlocks {
    /// The current block's trailer; the next byte starts a new block.
    fn take_trailer(&mut self) -> [u8; TRAILER_LEN as usize] {
        self.filled = 0;
        std::mem::take(&mut self.crc).finalize().to_be_bytes()
    }
}

impl Stage for CrcBlocks {
    fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError> {
        if self.finished {
            return Err(CrcBlocksError::Finished.into());
        }
        if chunk.is_empty() {
            return Ok(None);
        }
        let end =
            self.offset.checked_add(chunk.len() as u64).ok_or(StageError::Overflow(self.offset))?;
        if let Some(len) = self.input_len
            && end > len
        {
            return Err(CrcBlocksError::InputPastEnd { len }.into());
        }
        self.offset = end;
        // Made only when a block ends in this chunk, with room for every trailer it can hold.
        let mut out: Option<BytesMut> = None;
        // `chunk[..copied]` is in `out` already.
        let (mut at, mut copied) = (0, 0);
        while at < chunk.len() {
            // At most `block_size`, which is at most MAX_BLOCK_SIZE, so it fits a usize.
            let room = (self.block_size - self.filled) as usize;
            let take = room.min(chunk.len() - at);
            self.crc.update(&chunk[at..at + take]);
            self.filled += take as u64;
            at += take;
            if self.filled == self.block_size {
                // A chunk ends at most one block more than it holds whole.
                let trailers = chunk.len() as u64 / self.block_size + 1;
                let capacity = chunk.len() + (trailers * TRAILER_LEN) as usize;
                let buffer = out.get_or_insert_with(|| BytesMut::with_capacity(capacity));
                buffer.extend_from_slice(&chunk[copied..at]);
                buffer.extend_from_slice(&self.take_trailer());
                copied = at;
            }
        }
        Ok(Some(match out {
            // No block ended in the chunk: its bytes are the output as they are, the same `Bytes`.
            None => chunk,
            Some(mut buffer) => {
                buffer.extend_from_slice(&chunk[copied..]);
                buffer.freeze()
            }
        }))
    }

    fn finish(&mut self) -> Result<Option<Bytes>, StageError> {
        if self.finished {
            return Ok(None);
        }
        // A pass may stop early at a block boundary (a range that ends before the input's end),
        // never inside a block: its trailer could not be made.
        if self.filled > 0
            && let Some(len) = self.input_len
            && self.offset != len
        {
            return Err(CrcBlocksError::EndedInsideBlock { offset: self.offset, len }.into());
        }
        self.finished = true;
        // A block still open is the last one, shorter than the others.
        Ok((self.filled > 0).then(|| Bytes::copy_from_slice(&self.take_trailer())))
    }
}

/// Checks every block of a whole `crc-blocks` output against its trailer and returns the input:
/// what a client of the route would do with what it downloaded. `Err(k)`: block `k` is damaged.
fn unframe(framed: &[u8], block_size: u64) -> Result<Vec<u8>, usize> {
    let framed_size = usize::try_from(block_size + TRAILER_LEN).map_err(|_| 0usize)?;
    let mut input = Vec::with_capacity(framed.len());
    for (k, block) in framed.chunks(framed_size).enumerate() {
        // Every block holds at least one byte of input.
        let data_len = block.len().checked_sub(TRAILER_LEN as usize).filter(|&n| n > 0).ok_or(k)?;
        let (data, trailer) = block.split_at(data_len);
        if crc32fast::hash(data).to_be_bytes() != trailer {
            return Err(k);
        }
        input.extend_from_slice(data);
    }
    Ok(input)
}

/// The version the proxy would take from the origin's answer for an object of `len` bytes.
fn version(len: u64) -> ObjectVersion<'static> {
    ObjectVersion { route: "docs", path: "/notes.txt", strong_etag: Some("\"v1\""), len }
}

/// Runs `chain` over `object` for `wanted` of its output, as the proxy would: plan the range,
/// fetch the origin bytes the plan names (here, slice them), push them in chunks of `chunk_len`
/// as an upstream delivers them, and finish.
fn deliver(
    chain: &Chain,
    object: &Bytes,
    wanted: ByteRange,
    chunk_len: usize,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let version = version(object.len() as u64);
    let learned = Learned::new();
    let plan = chain.plan(wanted, &version, &learned)?;
    let origin = plan.origin();
    // The range lies inside `object`, whose length is a usize.
    let piece = object.slice(usize::try_from(origin.start())?..usize::try_from(origin.end())?);
    let mut run = chain.start(&plan, &version, &learned, &[])?;
    let mut body = Vec::new();
    for at in (0..piece.len()).step_by(chunk_len.max(1)) {
        if let Some(out) = run.push(piece.slice(at..piece.len().min(at + chunk_len)))? {
            body.extend_from_slice(&out);
        }
    }
    if let Some(tail) = run.finish()? {
        body.extend_from_slice(&tail);
    }
    Ok(body)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Before the server starts: the built-ins, plus ours.
    let mut registry = StageRegistry::new();
    registry.register(KIND, CrcBlocksFactory::from_options)?;
    println!("kinds: {:?}", registry.kinds().collect::<Vec<_>>());

    // Bad options are reported together, each with its place, as the config loader would.
    let too_small = StageOptions::new().with("block_size", 8);
    let not_a_number = StageOptions::new().with("block_size", "64KiB").with("blocksize", 1024);
    if let Err(errors) = registry.build_chain([(KIND, &too_small), (KIND, &not_a_number)]) {
        errors.iter().for_each(|error| println!("config error: {error}"));
    }

    // middleware = [{ kind = "checksum" }, { kind = "crc-blocks", block_size = 16 },
    //               { kind = "checksum" }]
    // Tiny blocks, so that the few bytes below make several of them.
    let block_size = 16;
    let checksum = StageOptions::new();
    let blocks = StageOptions::new().with("block_size", 16);
    let chain = registry
        .build_chain([("checksum", &checksum), (KIND, &blocks), ("checksum", &checksum)])
        .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))?;
    // The checksums only observe, so the identity is the transform's alone.
    println!("chain identity: {:?}", chain.identity());

    let object = Bytes::from_static(b"Resumable downloads, even when a stage works in blocks.");
    let len = object.len() as u64;
    let learned = Learned::new();
    let output_len = chain.output_len(&version(len), &learned).ok_or("no output length")?;
    println!("{len} bytes in, {output_len} bytes out");

    // The whole output, checked block by block as a client would.
    let whole = deliver(&chain, &object, ByteRange::whole(output_len), 7)?;
    println!("whole: {}", whole.escape_ascii());
    if unframe(&whole, block_size).as_deref() != Ok(&object[..]) {
        return Err("the whole output does not unframe to the object".into());
    }

    // A client asks for bytes 30..50: from inside block 1 (output 20..40) into block 2.
    let wanted = ByteRange::new(30, 50).ok_or("reversed range")?;
    let plan = chain.plan(wanted, &version(len), &learned)?;
    println!("to send {wanted:?}: fetch origin {:?}", plan.origin());
    for (index, stage) in plan.stages().iter().enumerate() {
        println!("  middleware[{index}]: input {:?}, skip {}", stage.input, stage.skip);
    }
    let body = deliver(&chain, &object, wanted, 5)?;
    println!("body: {}", body.escape_ascii());
    if body[..] != whole[30..50] {
        return Err("the range differs from the same bytes of the whole output".into());
    }

    // Asking past the end is an error, not a panic.
    match chain.plan(
        ByteRange::new(0, output_len + 1).ok_or("reversed range")?,
        &version(len),
        &learned,
    ) {
        Err(error @ ChainError::RangePastEnd { .. }) => println!("past the end: {error}"),
        other => return Err(format!("unexpected: {other:?}").into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rangeway_middleware::chain::{ConfigError, OptionValue};

    use super::*;

    /// The format, written down directly: each block, then its CRC32, big-endian.
    fn reference(input: &[u8], block_size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for block in input.chunks(block_size) {
            out.extend_from_slice(block);
            out.extend_from_slice(&crc32fast::hash(block).to_be_bytes());
        }
        out
    }

    fn registry() -> StageRegistry {
        let mut registry = StageRegistry::new();
        registry.register(KIND, CrcBlocksFactory::from_options).unwrap();
        registry
    }

    /// The stage alone, with blocks of `block_size`.
    fn chain(block_size: i64) -> Chain {
        let options = StageOptions::new().with("block_size", block_size);
        registry().build_chain([(KIND, &options)]).unwrap()
    }

    /// The stage between two checksums, as in `main`.
    fn observed_chain(block_size: i64) -> Chain {
        let checksum = StageOptions::new();
        let options = StageOptions::new().with("block_size", block_size);
        registry()
            .build_chain([("checksum", &checksum), (KIND, &options), ("checksum", &checksum)])
            .unwrap()
    }

    fn factory(block_size: i64) -> Arc<dyn StageFactory> {
        CrcBlocksFactory::from_options(&StageOptions::new().with("block_size", block_size)).unwrap()
    }

    /// Bytes that differ from block to block, so that a block taken for another shows.
    fn input(len: usize) -> Bytes {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ len as u64;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    fn range(start: u64, end: u64) -> ByteRange {
        ByteRange::new(start, end).unwrap()
    }

    fn output_len(chain: &Chain, len: usize) -> u64 {
        chain.output_len(&version(len as u64), &Learned::new()).unwrap()
    }

    #[test]
    fn the_output_is_each_block_then_its_crc32() {
        for block_size in [16, 17, 64] {
            let chain = chain(block_size);
            for len in [0, 1, 15, 16, 17, 47, 48, 63, 64, 65, 100, 1000] {
                let object = input(len);
                let expected = reference(&object, block_size as usize);
                assert_eq!(output_len(&chain, len), expected.len() as u64, "{len}/{block_size}");
                let whole = ByteRange::whole(expected.len() as u64);
                let out = deliver(&chain, &object, whole, 1 << 20).unwrap();
                assert_eq!(out, expected, "len {len}, blocks of {block_size}");
                assert_eq!(unframe(&out, block_size as u64), Ok(object.to_vec()));
            }
        }
    }

    #[test]
    fn a_full_pass_planned_without_a_range_gives_the_same_bytes() {
        let chain = observed_chain(16);
        let object = input(53);
        let (version, learned) = (version(53), Learned::new());
        let plan = chain.plan_whole(&version, &learned);
        let mut run = chain.start(&plan, &version, &learned, &[]).unwrap();
        let mut out = run.push(object.clone()).unwrap().unwrap().to_vec();
        out.extend(run.finish().unwrap().unwrap_or_default());
        assert_eq!(out, reference(&object, 16));
    }

    #[test]
    fn ranges_map_to_the_whole_blocks_that_cover_them() {
        // 53 bytes in blocks of 16: 16 + 16 + 16 + 5 in, 20 + 20 + 20 + 9 out.
        let chain = chain(16);
        let version = version(53);
        let plan = |start, end| {
            let plan = chain.plan(range(start, end), &version, &Learned::new()).unwrap();
            (plan.origin(), plan.stages()[0].skip)
        };
        // Inside block 0.
        assert_eq!(plan(3, 9), (range(0, 16), 3));
        // From inside block 1 to inside block 2.
        assert_eq!(plan(30, 50), (range(16, 48), 10));
        // Block 1's trailer alone still needs all of block 1.
        assert_eq!(plan(36, 40), (range(16, 32), 16));
        // Exactly block 2.
        assert_eq!(plan(40, 60), (range(32, 48), 0));
        // The last, short block, to the end: the input's end, not a block boundary.
        assert_eq!(plan(61, 69), (range(48, 53), 1));
        assert_eq!(plan(0, 69), (range(0, 53), 0));
    }

    /// Every range of the output, for inputs of whole blocks, a short last block, one byte and
    /// nothing: the same bytes as in the whole output, from origin bytes that start at a block
    /// boundary and end at one or at the input's end.
    #[test]
    fn every_range_is_the_same_slice_as_in_the_whole_output() {
        let block = 16;
        for len in [0, 1, 15, 16, 48, 53] {
            let object = input(len);
            let whole = reference(&object, block);
            let total = whole.len() as u64;
            for chain in [chain(block as i64), observed_chain(block as i64)] {
                assert_eq!(output_len(&chain, len), total);
                for start in 0..total {
                    for end in start + 1..=total {
                        let wanted = range(start, end);
                        let plan = chain.plan(wanted, &version(len as u64), &Learned::new());
                        let origin = plan.unwrap().origin();
                        assert_eq!(origin.start() % block as u64, 0, "{wanted:?} of {len}");
                        assert!(
                            origin.end() % block as u64 == 0 || origin.end() == len as u64,
                            "{wanted:?} of {len} plans {origin:?}"
                        );
                        let out = deliver(&chain, &object, wanted, 7).unwrap();
                        assert_eq!(out, &whole[start as usize..end as usize], "{wanted:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn how_the_input_is_chunked_does_not_change_the_output() {
        let chain = observed_chain(16);
        let object = input(100);
        let whole = reference(&object, 16);
        let total = whole.len() as u64;
        let wanted =
            [range(0, total), range(0, 1), range(19, 21), range(30, 75), range(total - 3, total)];
        for chunk_len in (1..=40).chain([100]) {
            for wanted in wanted {
                let out = deliver(&chain, &object, wanted, chunk_len).unwrap();
                let expected = &whole[wanted.start() as usize..wanted.end() as usize];
                assert_eq!(out, expected, "{wanted:?} in chunks of {chunk_len}");
            }
        }
    }

    /// A pass's context where the whole input's length is known.
    fn whole_input<'a>(version: &'a ObjectVersion<'a>) -> StageContext<'a> {
        StageContext {
            object: version,
            input_len: Some(version.len),
            input_identity: "",
            segments: &[],
        }
    }

    #[test]
    fn a_chunk_that_ends_no_block_is_passed_on_without_a_copy() {
        let factory = factory(16);
        let version = version(40);
        let context = whole_input(&version);
        let mut stage = factory.start(0, None, &context).unwrap();
        let chunk = input(40).slice(..10);
        let out = stage.push(chunk.clone()).unwrap().unwrap();
        assert_eq!(out.as_ptr(), chunk.as_ptr());
        assert_eq!(out.len(), 10);
        // The one that completes the block carries its trailer.
        let out = stage.push(input(40).slice(10..20)).unwrap().unwrap();
        assert_eq!(out.len(), 6 + 4 + 4);
    }

    #[test]
    fn an_empty_input_has_an_empty_output() {
        let chain = observed_chain(16);
        let object = Bytes::new();
        assert_eq!(output_len(&chain, 0), 0);
        assert_eq!(deliver(&chain, &object, ByteRange::whole(0), 4).unwrap(), b"");
        let (version, learned) = (version(0), Learned::new());
        let mut run = chain.start(&chain.plan_whole(&version, &learned), &version, &learned, &[]);
        let run = run.as_mut().unwrap();
        assert_eq!(run.finish().unwrap(), None);
        assert!(run.is_done());
        assert!(matches!(
            chain.plan(range(0, 1), &version, &learned),
            Err(ChainError::RangePastEnd { len: 0, .. })
        ));
    }

    #[test]
    fn a_pass_starts_only_at_a_block_boundary() {
        let factory = factory(16);
        let version = version(53);
        let context = whole_input(&version);
        for at in [0, 16, 48] {
            assert!(factory.start(at, None, &context).is_ok(), "{at}");
        }
        for at in [1, 15, 17, 50] {
            let error = factory.start(at, None, &context).unwrap_err();
            assert!(matches!(error, StageError::Resume { offset, .. } if offset == at), "{at}");
        }
        assert!(matches!(factory.start(64, None, &context), Err(StageError::Resume { .. })));
        let state = StageState::new(16, Bytes::from_static(b"state"));
        assert!(matches!(
            factory.start(16, Some(&state), &context),
            Err(StageError::Resume { .. })
        ));
    }

    #[test]
    fn a_pass_that_ends_inside_a_block_short_of_the_input_end_fails() {
        let factory = factory(16);
        let version = version(53);
        let context = whole_input(&version);
        let object = input(53);

        // Ends at a block boundary before the end: a range that stops there. Fine.
        let mut stage = factory.start(16, None, &context).unwrap();
        stage.push(object.slice(16..32)).unwrap();
        assert_eq!(stage.finish().unwrap(), None);

        // Ends inside block 1: its trailer cannot be made.
        let mut stage = factory.start(16, None, &context).unwrap();
        stage.push(object.slice(16..20)).unwrap();
        let error = stage.finish().unwrap_err();
        assert!(error.to_string().contains("inside a block"), "{error}");

        // Runs past the input's end.
        let mut stage = factory.start(48, None, &context).unwrap();
        let error = stage.push(input(6)).unwrap_err();
        assert!(error.to_string().contains("past its 53 bytes"), "{error}");

        // Input after the pass finished.
        let mut stage = factory.start(48, None, &context).unwrap();
        stage.push(object.slice(48..)).unwrap();
        assert_eq!(stage.finish().unwrap().map(|tail| tail.len()), Some(4));
        assert!(stage.push(input(1)).is_err());
    }

    #[test]
    fn bad_options_are_refused_with_their_key() {
        let registry = registry();
        let bad = [
            (OptionValue::Int(0), "0 bytes is not between 16 and 16777216"),
            (OptionValue::Int(15), "15 bytes is not between 16 and 16777216"),
            (OptionValue::Int((16 << 20) + 1), "16777217 bytes is not between"),
            (OptionValue::Int(-1), "expected a non-negative integer, found -1"),
            (OptionValue::from("64KiB"), "expected a non-negative integer, found a string"),
            (OptionValue::Float(1.5), "expected a non-negative integer, found a float"),
        ];
        for (value, message) in bad {
            let options = StageOptions::new().with("block_size", value);
            let errors =
                registry.build_chain([("checksum", &StageOptions::new()), (KIND, &options)]);
            let errors = errors.unwrap_err();
            assert_eq!(errors.len(), 1, "{errors:?}");
            let ConfigError::Option { index, error } = &errors[0] else {
                panic!("not an option error: {errors:?}");
            };
            assert_eq!((*index, error.key()), (1, "block_size"));
            assert!(error.message().contains(message), "{error}");
            assert!(errors[0].to_string().starts_with("middleware[1].block_size: "));
        }

        // Every problem at once, an unknown key among them.
        let options = StageOptions::new().with("block_size", 1).with("blocksize", 1024);
        let errors = CrcBlocksFactory::from_options(&options).unwrap_err();
        let keys: Vec<&str> = errors.iter().map(OptionError::key).collect();
        assert_eq!(keys, ["block_size", "blocksize"]);
        assert!(errors[1].message().contains("known keys: `block_size`"), "{}", errors[1]);

        // The bounds themselves are fine, and so is no option at all.
        for size in [16, 16 << 20] {
            assert!(
                CrcBlocksFactory::from_options(&StageOptions::new().with("block_size", size))
                    .is_ok()
            );
        }
        assert!(CrcBlocksFactory::from_options(&StageOptions::new()).is_ok());
    }

    #[test]
    fn the_identity_names_the_block_size_and_the_format_version() {
        let default = CrcBlocksFactory::from_options(&StageOptions::new()).unwrap();
        assert_eq!(default.identity(), "crc-blocks(v1,block_size=65536)");
        assert_eq!(factory(16).identity(), "crc-blocks(v1,block_size=16)");
        // The checksums only observe: the chain's identity, in the ETag, is the transform's.
        assert_eq!(observed_chain(16).identity(), "crc-blocks(v1,block_size=16)");
        assert_ne!(chain(16).identity(), chain(17).identity());
    }
}
