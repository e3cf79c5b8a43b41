//! The `gzip` stage: a gzip representation of its input that a download can resume at any byte,
//! because the same input always gives the same bytes and any part of them can be regenerated
//! from a block of input.
//!
//! The output is ONE gzip member (what curl `--compressed` and browsers decode; a concatenation of
//! members is not): a fixed header, then a raw deflate stream made of segments, then an empty final
//! block, the CRC32 of the whole input and its length modulo 2^32. Segment `k` is input block `k`
//! (bytes `k * block_size ..`, the last one shorter) compressed in one call by a fresh raw-deflate
//! compressor ending in a sync flush — the `pigz -i` layout: each segment ends byte-aligned with
//! an empty stored block, depends on no byte before it, and so can be regenerated alone.
//!
//! A segment's compressed length is only known once it is made, so the stage reports each one
//! ([`Segment`]: output length, output CRC32, input CRC32) for the proxy to keep as the object
//! version's block index. With the index:
//! - the output length is known ([`StageFactory::output_len`]), and any output range maps to the
//!   blocks that hold it ([`StageFactory::plan`]);
//! - a pass can start at any block boundary: the trailer's CRC32 combines the index's input CRCs
//!   of the blocks before it with those the pass computes;
//! - every regenerated block is checked against its entry before any byte of it is returned: a
//!   mismatch (the origin changed under the same version, or the backend's output did) is a
//!   [`StageError::SegmentMismatch`], never a wrong byte.
//!
//! Without a complete index, an open range (`bytes=X-`) is planned with
//! [`StageFactory::plan_open`]: from the last indexed block boundary at or before `X`, computing
//! the output up to `X` without sending it; its report completes the index.
//!
//! # The deflate backend
//! The same input must give the same bytes on every instance and after every upgrade, and two
//! deflate implementations (or two versions of one) give different bytes. pingora-core turns on
//! flate2's `zlib-ng` feature for the whole proxy, and flate2 picks a C zlib over zlib-rs over
//! miniz_oxide whichever others are on, and within C zlibs zlib-ng over zlib
//! (`flate2/src/ffi/mod.rs` and `c.rs`). This crate asks for `zlib-ng` alone too, so its own
//! builds, tests and benches compress with the very backend production does. The identity names
//! it and its version ([`BACKEND`]), and a golden test pins its output: a backend change shows up
//! as a failing test and a new identity (so a new ETag), not as a corrupted resume.

mod layout;
mod run;

use flate2::Compression;

use crate::ByteRange;
use crate::chain::{
    Form, OptionError, Stage, StageContext, StageError, StageFactory, StageOptions, StagePlan,
    StageState,
};

use layout::Layout;
use run::GzipRun;

/// The kind name of the stage.
pub const KIND: &str = "gzip";

/// The version of the output format: the member's framing and the block rule. A change to either
/// bumps it, which changes the identity.
pub const FORMAT_VERSION: u32 = 1;

/// The deflate backend the output comes from and its version: the zlib-ng that libz-ng-sys
/// bundles, and the libz-ng-sys release (as locked in `Cargo.lock`; a test keeps the two in
/// step). On s390x, libz-ng-sys builds zlib-ng with the CPU's own deflate (DFLTCC), whose output
/// differs, so that is a backend of its own.
#[cfg(not(target_arch = "s390x"))]
pub const BACKEND: &str = "zlib-ng-2.3.3/libz-ng-sys-1.1.33";
#[cfg(target_arch = "s390x")]
pub const BACKEND: &str = "zlib-ng-2.3.3-dfltcc/libz-ng-sys-1.1.33";

/// gzip's own default level: most of level 9's ratio at a fraction of its time.
pub const DEFAULT_LEVEL: u32 = 6;

/// 1 MiB: a resume re-fetches and recompresses at most this much, a few milliseconds of CPU; a
/// 1 GiB object has 1024 index entries; the compressed size is within a fraction of a percent
/// of one deflate stream.
pub const DEFAULT_BLOCK_SIZE: u64 = 1 << 20;

/// Below 4 KiB a block costs too much: each segment starts without the previous 32 KiB as its
/// dictionary and with fresh Huffman tables, ends in a 4–5 byte flush marker, and is one more
/// index entry in the store for every request to load.
pub const MIN_BLOCK_SIZE: u64 = 4 << 10;

/// Above 64 MiB a block costs too much at the other end: each request holds a block of input and
/// its output in memory, and a resume recompresses up to a whole block (a second or more of CPU)
/// before its first byte.
pub const MAX_BLOCK_SIZE: u64 = 64 << 20;

/// Why a gzip stage cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GzipConfigError {
    #[error(
        "{0} is not a deflate level — use 0 (stored, no compression) to 9 (smallest, slowest); \
         {DEFAULT_LEVEL}, the default, is gzip's own"
    )]
    Level(u64),
    #[error(
        "{0} bytes is not between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE} — smaller blocks compress \
         worse and bloat the block index, larger ones make every resume recompress more; use e.g. \
         {DEFAULT_BLOCK_SIZE}, the default"
    )]
    BlockSize(u64),
}

impl GzipConfigError {
    /// The option the error is about.
    fn key(&self) -> &'static str {
        match self {
            GzipConfigError::Level(_) => "level",
            GzipConfigError::BlockSize(_) => "block_size",
        }
    }
}

/// Why a pass of the gzip stage cannot go on, beyond what [`StageError`] names; it comes as a
/// [`StageError::Other`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GzipError {
    /// The input ended inside a block or past the input's length: a block is compressed whole or
    /// not at all, so no segment can be made that matches the member.
    #[error(
        "the input ended at byte {offset} of {input_len}: a pass may stop early only at a block \
         boundary"
    )]
    InputEnd { offset: u64, input_len: u64 },
    /// Input was pushed after the pass finished or failed.
    #[error("the pass has ended (finished, or failed before)")]
    Ended,
}

fn check_level(level: u64) -> Result<u32, GzipConfigError> {
    u32::try_from(level).ok().filter(|&level| level <= 9).ok_or(GzipConfigError::Level(level))
}

fn check_block_size(block_size: u64) -> Result<(), GzipConfigError> {
    if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
        return Err(GzipConfigError::BlockSize(block_size));
    }
    Ok(())
}

/// How a gzip route serves its output.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub enum GzipMode {
    /// A representation of its own (`application/gzip`, a `.gz` name, its own ETag): resumable.
    #[default]
    Representation,
    /// `Content-Encoding: gzip` for clients that accept it, negotiated per request. Clients decode
    /// on the fly and would resume at decoded offsets, so ranges are never offered: for small,
    /// non-resumable responses only.
    ContentEncoding,
}

/// The `gzip` stage, configured.
///
/// Options: `level` (0 to 9; default [`DEFAULT_LEVEL`]), `block_size` (bytes, from
/// [`MIN_BLOCK_SIZE`] to [`MAX_BLOCK_SIZE`]; default [`DEFAULT_BLOCK_SIZE`]) and `mode`
/// (`"representation"`, the default, or `"content-encoding"`; see [`GzipMode`]).
#[derive(Clone, Debug)]
pub struct GzipFactory {
    level: u32,
    block_size: u64,
    mode: GzipMode,
    identity: String,
}

impl GzipFactory {
    pub fn new(level: u32, block_size: u64) -> Result<Self, GzipConfigError> {
        let level = check_level(level.into())?;
        check_block_size(block_size)?;
        let identity =
            format!("{KIND}(v{FORMAT_VERSION},{BACKEND},level={level},block_size={block_size})");
        Ok(Self { level, block_size, mode: GzipMode::default(), identity })
    }

    /// The same stage, serving its output as `mode` says. The bytes are the same either way, and
    /// so is the identity.
    pub fn with_mode(self, mode: GzipMode) -> Self {
        Self { mode, ..self }
    }

    /// Builds the stage from a route's options, reporting every bad one.
    pub fn from_options(options: &StageOptions) -> Result<Self, Vec<OptionError>> {
        let mut reader = options.reader();
        let level = reader.u64("level").map_or(Ok(DEFAULT_LEVEL), check_level);
        if let Err(error) = &level {
            reader.error(error.key(), error);
        }
        let block_size = reader.u64("block_size").unwrap_or(DEFAULT_BLOCK_SIZE);
        if let Err(error) = check_block_size(block_size) {
            reader.error(error.key(), error);
        }
        let mode = match reader.str("mode") {
            None | Some("representation") => GzipMode::Representation,
            Some("content-encoding") => GzipMode::ContentEncoding,
            Some(other) => {
                reader.error(
                    "mode",
                    format_args!(
                        "unknown mode {other:?} — use \"representation\" (a resumable .gz, the \
                         default) or \"content-encoding\" (Content-Encoding: gzip, not resumable)"
                    ),
                );
                GzipMode::Representation
            }
        };
        reader.finish()?;
        // Every way `new` can fail was reported above, so this is Ok once `finish` was.
        level
            .and_then(|level| Self::new(level, block_size))
            .map(|factory| factory.with_mode(mode))
            .map_err(|error| vec![OptionError::new(error.key(), error.to_string())])
    }

    pub fn level(&self) -> u32 {
        self.level
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    fn layout<'a>(&self, input_len: u64, context: &StageContext<'a>) -> Layout<'a> {
        Layout::new(self.block_size, input_len, context.segments)
    }

    /// The plan for `output` of a pass from block `block`, whose output starts at `pass_start`,
    /// to the end of the block holding the last wanted byte, or to the input's end for an open
    /// range.
    fn plan_pass(
        layout: &Layout<'_>,
        (block, pass_start): (u64, u64),
        output: ByteRange,
        open: bool,
        input_len: u64,
    ) -> Result<StagePlan, StageError> {
        let (input_start, _) = layout.block_input(block);
        let input_end = match output.last() {
            Some(last) if !open => layout.block_input(layout.pass_for(last).0).1,
            _ => input_len,
        };
        // `pass_for` gives passes that start at or before the offset asked for, and later
        // passes for later offsets; this only guards against a bug in that.
        let input = ByteRange::new(input_start, input_end);
        let skip = output.start().checked_sub(pass_start);
        match (input, skip) {
            (Some(input), Some(skip)) => Ok(StagePlan { input, skip }),
            _ => Err(StageError::Plan {
                range: output,
                input_len,
                reason: format!("block {block} starts at output byte {pass_start}, after it"),
            }),
        }
    }
}

impl StageFactory for GzipFactory {
    fn kind(&self) -> &str {
        KIND
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    /// Needs the complete block index (the chain asks only when [`output_len`](Self::output_len)
    /// knows the length). The input runs from the block holding the first wanted byte (block 0
    /// for the header) to the end of the block holding the last (the last block for the tail,
    /// whose CRC32 the index has but whose pass is the one that emits it).
    fn plan(
        &self,
        output: ByteRange,
        input_len: u64,
        context: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        let layout = self.layout(input_len, context);
        let plan_error = |reason: String| StageError::Plan { range: output, input_len, reason };
        let Some(len) = layout.output_len() else {
            return Err(plan_error(format!(
                "the block index places {} of the {} blocks, so the output's length is unknown; \
                 plan an open range instead",
                layout.indexed_blocks(),
                layout.blocks()
            )));
        };
        if output.end() > len {
            return Err(plan_error(format!("past the end of the {len} bytes of output")));
        }
        if output.is_empty() {
            // Nothing wanted: nothing to read.
            return Ok(StagePlan { input: ByteRange::whole(0), skip: 0 });
        }
        Self::plan_pass(&layout, layout.pass_for(output.start()), output, false, input_len)
    }

    /// Works with any part of the block index: a start inside the indexed blocks plans as
    /// [`plan`](Self::plan) does; one past them starts at the first block not indexed (the only
    /// place a pass can start from without knowing the output offsets of the blocks after it)
    /// and skips the output up to `output_start`, computed but not sent.
    fn plan_open(
        &self,
        output_start: u64,
        input_len: u64,
        context: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        let layout = self.layout(input_len, context);
        if let Some(len) = layout.output_len() {
            let output = ByteRange::new(output_start, len).ok_or_else(|| StageError::Plan {
                range: ByteRange::open(output_start),
                input_len,
                reason: format!("past the end of the {len} bytes of output"),
            })?;
            return self.plan(output, input_len, context);
        }
        let output = ByteRange::open(output_start);
        Self::plan_pass(&layout, layout.pass_for(output_start), output, true, input_len)
    }

    fn output_len(&self, input_len: u64, context: &StageContext<'_>) -> Option<u64> {
        self.layout(input_len, context).output_len()
    }

    fn observes_only(&self) -> bool {
        false
    }

    /// A representation of its own, unless served as a content coding.
    fn media_type(&self) -> Option<&str> {
        match self.mode {
            GzipMode::Representation => Some("application/gzip"),
            GzipMode::ContentEncoding => None,
        }
    }

    fn file_extension(&self) -> Option<&str> {
        match self.mode {
            GzipMode::Representation => Some("gz"),
            GzipMode::ContentEncoding => None,
        }
    }

    fn content_coding(&self) -> Option<&str> {
        match self.mode {
            GzipMode::Representation => None,
            GzipMode::ContentEncoding => Some("gzip"),
        }
    }

    /// A push at level 6 compresses a whole block, long enough to stall the thread's other
    /// connections (see docs/benchmarks.md, "Stage throughput (criterion)").
    fn blocks(&self) -> bool {
        true
    }

    /// Compressing ciphertext gains nothing, and a compressor after an encrypting stage is a
    /// configuration mistake (and, for chosen plaintext, a leak).
    fn accepts(&self) -> Form {
        Form::Transformed
    }

    /// Starts at a block boundary `k * block_size`, with the index's entries for blocks `0..k`
    /// (their input CRC32s make the trailer's); emits the header only from 0, and the tail only
    /// when the input reaches its end.
    fn start(
        &self,
        at_input: u64,
        resume: Option<&StageState>,
        context: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError> {
        let refuse = |reason: String| Err(StageError::Resume { offset: at_input, reason });
        if resume.is_some() {
            return refuse("gzip reports no resume states; it starts at any block boundary".into());
        }
        if !at_input.is_multiple_of(self.block_size) {
            return refuse(format!("not a multiple of the block size, {}", self.block_size));
        }
        let index = match context.input_len {
            Some(input_len) if at_input > input_len => {
                return refuse(format!("past the end of the {input_len} input bytes"));
            }
            Some(input_len) => {
                let layout = self.layout(input_len, context);
                // The usable entries: one per block at most, and none past a corrupt sum.
                &context.segments[..layout.indexed_blocks() as usize]
            }
            None => context.segments,
        };
        let block = at_input / self.block_size;
        let Some((before, expected)) =
            usize::try_from(block).ok().and_then(|block| index.split_at_checked(block))
        else {
            return refuse(format!(
                "the trailer's CRC32 needs the input CRC32 of every block before block {block}, \
                 and the block index has {}",
                index.len()
            ));
        };
        let mut crc = crc32fast::Hasher::new();
        for segment in before {
            crc.combine(&crc32fast::Hasher::new_with_initial_len(
                segment.input_crc32,
                self.block_size,
            ));
        }
        // Within MAX_BLOCK_SIZE, so it fits a usize.
        let block_size = self.block_size as usize;
        let level = Compression::new(self.level);
        Ok(Box::new(GzipRun::new(
            level,
            block_size,
            context.input_len,
            block,
            crc,
            expected.to_vec(),
        )))
    }
}

#[cfg(test)]
mod tests;
