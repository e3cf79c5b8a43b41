//! The `checksum` stage: SHA-256 and CRC32 of the bytes at its place in the chain, computed even
//! when a download only ever arrives in resumed pieces.
//!
//! It passes every chunk on as the same `Bytes`. What it learns, in its [`StageReport`]:
//! - the CRC32 of the input range the pass covered; pieces from several passes combine into the
//!   CRC of the whole ([`Crc32Piece::assemble`]);
//! - the SHA-256 of everything from byte 0 to where the pass got, when the pass started at 0 or
//!   at a checkpoint; when that is the whole input, it is the representation's digest;
//! - [`ShaCheckpoint`]s every `checkpoint_interval` bytes of stream offset, plus one at the last
//!   block boundary the pass reached, from which a later pass picks the hash up: a download cut
//!   short and resumed needs less than a block of re-fetched bytes to carry the hash on.

mod checkpoint;
mod crc;
mod repr_digest;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use crate::ByteRange;
use crate::chain::{
    Digest, Form, OptionError, RangeDigest, Stage, StageContext, StageError, StageFactory,
    StageOptions, StagePlan, StageReport, StageState,
};

pub use checkpoint::{CheckpointError, ShaCheckpoint};
pub use crc::Crc32Piece;
pub use repr_digest::{parse_repr_digest_sha256, repr_digest, want_repr_digest_sha256};

/// The kind name of the stage.
pub const KIND: &str = "checksum";

/// How far apart SHA-256 checkpoints are by default: a resumed piece re-fetches at most this much
/// from the origin to carry the hash on, and a 1 GiB object stores 128 checkpoints of 45 bytes.
pub const DEFAULT_CHECKPOINT_INTERVAL: u64 = 8 << 20;

/// A digest the stage can compute.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Algorithm {
    Sha256,
    Crc32,
}

impl Algorithm {
    /// Its name in configuration.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Crc32 => "crc32",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Algorithm::Sha256, Algorithm::Crc32].into_iter().find(|algorithm| algorithm.name() == name)
    }
}

/// Why a checksum stage cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChecksumConfigError {
    #[error("no algorithm — use \"sha256\", \"crc32\" or both")]
    NoAlgorithm,
    #[error(
        "{0} is not a positive multiple of 64 (SHA-256's block length) — use e.g. \
         {DEFAULT_CHECKPOINT_INTERVAL}, the default"
    )]
    CheckpointInterval(u64),
}

impl ChecksumConfigError {
    /// The option the error is about.
    fn key(&self) -> &'static str {
        match self {
            ChecksumConfigError::NoAlgorithm => "algorithms",
            ChecksumConfigError::CheckpointInterval(_) => "checkpoint_interval",
        }
    }
}

fn check_interval(interval: u64) -> Result<(), ChecksumConfigError> {
    if interval == 0 || !interval.is_multiple_of(checkpoint::BLOCK) {
        return Err(ChecksumConfigError::CheckpointInterval(interval));
    }
    Ok(())
}

/// The `checksum` stage, configured.
///
/// Options: `algorithms` (a list of `"sha256"`, `"crc32"`; default both) and
/// `checkpoint_interval` (bytes, a positive multiple of 64; default
/// [`DEFAULT_CHECKPOINT_INTERVAL`]).
#[derive(Clone, Debug)]
pub struct ChecksumFactory {
    sha256: bool,
    crc32: bool,
    checkpoint_interval: u64,
    identity: String,
}

impl ChecksumFactory {
    pub fn new(
        algorithms: &[Algorithm],
        checkpoint_interval: u64,
    ) -> Result<Self, ChecksumConfigError> {
        if algorithms.is_empty() {
            return Err(ChecksumConfigError::NoAlgorithm);
        }
        check_interval(checkpoint_interval)?;
        let sha256 = algorithms.contains(&Algorithm::Sha256);
        let crc32 = algorithms.contains(&Algorithm::Crc32);
        let names: Vec<&str> = [(sha256, Algorithm::Sha256), (crc32, Algorithm::Crc32)]
            .into_iter()
            .filter_map(|(on, algorithm)| on.then_some(algorithm.name()))
            .collect();
        let identity = format!("{KIND}({})", names.join(","));
        Ok(Self { sha256, crc32, checkpoint_interval, identity })
    }

    /// Builds the stage from a route's options, reporting every bad one.
    pub fn from_options(options: &StageOptions) -> Result<Self, Vec<OptionError>> {
        let mut reader = options.reader();
        let mut algorithms = vec![Algorithm::Sha256, Algorithm::Crc32];
        if let Some(names) = reader.str_list("algorithms") {
            algorithms.clear();
            for (index, name) in names.iter().enumerate() {
                match Algorithm::from_name(name) {
                    Some(algorithm) => algorithms.push(algorithm),
                    None => reader.error(
                        format!("algorithms[{index}]"),
                        format_args!("unknown algorithm {name:?} — use \"sha256\" or \"crc32\""),
                    ),
                }
            }
            if names.is_empty() {
                reader.error("algorithms", ChecksumConfigError::NoAlgorithm);
            }
        }
        let interval = reader.u64("checkpoint_interval").unwrap_or(DEFAULT_CHECKPOINT_INTERVAL);
        if let Err(error) = check_interval(interval) {
            reader.error("checkpoint_interval", error);
        }
        reader.finish()?;
        // Every way `new` can fail was reported above, so this is Ok once `finish` was.
        Self::new(&algorithms, interval)
            .map_err(|error| vec![OptionError::new(error.key(), error.to_string())])
    }

    pub fn checkpoint_interval(&self) -> u64 {
        self.checkpoint_interval
    }
}

impl StageFactory for ChecksumFactory {
    fn kind(&self) -> &str {
        KIND
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn plan(
        &self,
        output: ByteRange,
        input_len: u64,
        _: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        if output.end() > input_len {
            return Err(StageError::Plan {
                range: output,
                input_len,
                reason: "past the end of the input".to_owned(),
            });
        }
        Ok(StagePlan::identity(output))
    }

    fn output_len(&self, input_len: u64, _: &StageContext<'_>) -> Option<u64> {
        Some(input_len)
    }

    fn whole_digests(&self) -> usize {
        usize::from(self.sha256) + usize::from(self.crc32)
    }

    fn observes_only(&self) -> bool {
        true
    }

    /// A digest of ciphertext says nothing about the content, and a checksum meant for the
    /// origin's bytes after an encrypting stage is a configuration mistake.
    fn accepts(&self) -> Form {
        Form::Transformed
    }

    fn start(
        &self,
        at_input: u64,
        resume: Option<&StageState>,
        _: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError> {
        let resume_error = |reason: String| StageError::Resume { offset: at_input, reason };
        let sha = match (self.sha256, resume) {
            (false, _) => None,
            (true, Some(state)) if state.offset() != at_input => {
                return Err(resume_error(format!(
                    "the state is for input byte {}",
                    state.offset()
                )));
            }
            (true, _) if at_input == 0 => Some(Sha256::new()),
            (true, Some(state)) => {
                let checkpoint = ShaCheckpoint::from_state(state)
                    .map_err(|error| resume_error(error.to_string()))?;
                let hasher = checkpoint.restore().ok_or_else(|| {
                    resume_error("the SHA-256 state does not load into this sha2".to_owned())
                })?;
                Some(hasher)
            }
            // A piece that starts elsewhere gets no SHA-256: it cannot be continued.
            (true, None) => None,
        };
        let sha = sha.map(|hasher| ShaRun {
            hasher,
            next_checkpoint: next_multiple(at_input, self.checkpoint_interval),
            interval: self.checkpoint_interval,
            checkpoints: Vec::new(),
        });
        Ok(Box::new(ChecksumStage {
            start: at_input,
            offset: at_input,
            crc: self.crc32.then(crc32fast::Hasher::new),
            sha,
        }))
    }
}

/// The first multiple of `interval` after `offset`; `None` past `u64::MAX`.
fn next_multiple(offset: u64, interval: u64) -> Option<u64> {
    (offset / interval).checked_add(1)?.checked_mul(interval)
}

/// One pass of the checksum stage.
struct ChecksumStage {
    /// Input offset of the first byte of the pass.
    start: u64,
    /// Input offset of the next byte.
    offset: u64,
    crc: Option<crc32fast::Hasher>,
    /// Present when SHA-256 is on and the pass has the state of everything before `start`.
    sha: Option<ShaRun>,
}

impl std::fmt::Debug for ChecksumStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChecksumStage")
            .field("start", &self.start)
            .field("offset", &self.offset)
            .field("crc32", &self.crc.is_some())
            .field("sha256", &self.sha.as_ref().map(|sha| sha.checkpoints.len()))
            .finish()
    }
}

struct ShaRun {
    hasher: Sha256,
    interval: u64,
    /// Offset of the next checkpoint to take; `None` when it would lie past `u64::MAX`.
    next_checkpoint: Option<u64>,
    checkpoints: Vec<ShaCheckpoint>,
}

impl ShaRun {
    /// Hashes `data`, which starts at stream offset `at`, taking the checkpoints it passes: the
    /// hash is fed up to each checkpoint offset, whatever the chunking, so checkpoints land on the
    /// same offsets in every pass.
    fn update(&mut self, mut at: u64, mut data: &[u8]) {
        while let Some(next) = self.next_checkpoint {
            // `next > at` always holds: it starts past the pass's start and moves on after use.
            let until = next - at;
            if until > data.len() as u64 {
                break;
            }
            // Fits usize: at most data.len().
            let (head, rest) = data.split_at(until as usize);
            self.hasher.update(head);
            at = next;
            data = rest;
            if let Some(checkpoint) = ShaCheckpoint::capture(&self.hasher, at) {
                self.checkpoints.push(checkpoint);
            }
            self.next_checkpoint = next.checked_add(self.interval);
        }
        self.hasher.update(data);
    }
}

impl Stage for ChecksumStage {
    fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError> {
        let end =
            self.offset.checked_add(chunk.len() as u64).ok_or(StageError::Overflow(self.offset))?;
        if let Some(crc) = &mut self.crc {
            crc.update(&chunk);
        }
        if let Some(sha) = &mut self.sha {
            sha.update(self.offset, &chunk);
        }
        self.offset = end;
        Ok(Some(chunk))
    }

    fn finish(&mut self) -> Result<Option<Bytes>, StageError> {
        Ok(None)
    }

    fn report(&self) -> Option<StageReport> {
        let mut report = StageReport::default();
        // `offset` only grows from `start`.
        let covered = ByteRange::new(self.start, self.offset)?;
        if let Some(crc) = &self.crc {
            let crc = crc.clone().finalize();
            report.digests.push(RangeDigest { range: covered, digest: Digest::Crc32(crc) });
        }
        if let Some(sha) = &self.sha {
            let digest = sha.hasher.clone().finalize().into();
            report.digests.push(RangeDigest {
                range: ByteRange::whole(self.offset),
                digest: Digest::Sha256(digest),
            });
            report.checkpoints.extend(sha.checkpoints.iter().map(ShaCheckpoint::to_state));
            // The state at the last block boundary reached: a download cut short here resumes
            // the hash with less than a block to re-fetch.
            let last = sha.checkpoints.last().map_or(self.start, ShaCheckpoint::offset);
            if let Some(tail) = ShaCheckpoint::capture(&sha.hasher, self.offset)
                && tail.offset() > last
            {
                report.checkpoints.push(tail.to_state());
            }
        }
        Some(report)
    }
}

#[cfg(test)]
mod tests;
