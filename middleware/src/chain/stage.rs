//! The contract between the chain and one stage: a factory built once from configuration, and the
//! per-request instance it starts.

use std::fmt;

use bytes::Bytes;

use crate::ByteRange;

/// What the bytes between two stages are, relative to the object's own bytes.
///
/// The forms are ordered: each one is further from the object than the ones before it. A stage
/// states the furthest form it can work on ([`StageFactory::accepts`]) and the form its own change
/// puts bytes in ([`StageFactory::produces`]); the bytes entering a stage are in the furthest form
/// any stage before it produces. [`Chain::new`](super::Chain::new) rejects a chain in which a stage
/// would see bytes further than it accepts. One ordered scale, rather than a flag per concern,
/// keeps every rule a single comparison and lets a new stage fit in without touching the others.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[non_exhaustive]
pub enum Form {
    /// The object's own bytes, exactly as the origin holds them.
    Original,
    /// Changed (compressed, re-encoded) but not encrypted: still plaintext.
    Transformed,
    /// Encrypted: nothing after this point can read the content.
    Encrypted,
}

impl Form {
    /// What a stage that accepts at most this form must see, for error messages.
    pub(super) const fn requirement(self) -> &'static str {
        match self {
            Form::Original => "the origin's own bytes",
            Form::Transformed => "plaintext",
            Form::Encrypted => "any bytes",
        }
    }
}

/// The input a stage needs to produce a range of its output.
///
/// Fed `input` (starting at `input.start()`, see [`StageFactory::start`]), the stage's output
/// begins `skip` bytes before the wanted output range: dropping those lands exactly on its start.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct StagePlan {
    pub input: ByteRange,
    pub skip: u64,
}

impl StagePlan {
    /// The plan of a stage whose output byte `i` is made from input byte `i` alone.
    pub const fn identity(output: ByteRange) -> Self {
        Self { input: output, skip: 0 }
    }
}

/// State from which a stage can resume part-way through its input, as a stage reports it in a
/// [`StageReport`] and gets it back in [`StageFactory::start`].
///
/// The bytes are in a format of the stage's own, which must carry a version so that a state saved
/// by one build is never misread by another; the proxy stores them as they are, indexed by offset.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct StageState {
    offset: u64,
    bytes: Bytes,
}

impl StageState {
    /// A state from which the stage continues at input byte `offset`.
    pub const fn new(offset: u64, bytes: Bytes) -> Self {
        Self { offset, bytes }
    }

    /// The input offset the state continues at.
    pub const fn offset(&self) -> u64 {
        self.offset
    }

    /// The encoded state.
    pub const fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// The object version a request's bytes come from, as every stage of its chain is told.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ObjectVersion<'a> {
    /// The route's name.
    pub route: &'a str,
    /// The object's path on the upstream.
    pub path: &'a str,
    /// The origin's strong ETag, quotes included, or `None` when it has none. Without it nothing
    /// pins the version: two requests may see different bytes under the same path, so a stage
    /// that derives anything from the version (a key, a salt) must not make it repeatable.
    pub strong_etag: Option<&'a str>,
    /// The origin's length in bytes.
    pub len: u64,
}

/// One segment of a stage whose output is made of independently produced pieces (a compressor's
/// blocks). What input a segment covers is the stage's own rule; the entry records what came of
/// it, so that a later pass can place any output offset without producing what lies before it,
/// check a regenerated segment before any byte of it is sent, and combine checksums of the input
/// it did not see.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Segment {
    /// Length of the segment's output.
    pub output_len: u64,
    /// CRC32 of the segment's output.
    pub output_crc32: u32,
    /// CRC32 of the segment's input.
    pub input_crc32: u32,
}

/// Per request, what a stage is told beyond its input bytes.
#[derive(Clone, Copy, Debug)]
pub struct StageContext<'a> {
    /// The object version the chain's input comes from.
    pub object: &'a ObjectVersion<'a>,
    /// The length of the stage's whole input (not only the planned part), when known.
    pub input_len: Option<u64>,
    /// The identity of the bytes entering the stage: empty for the origin's own, else the
    /// identities of the transforming stages before it (see [`Chain::identity`](super::Chain::identity)).
    /// A stage that derives anything from its input (a salt) includes it.
    pub input_identity: &'a str,
    /// The segments earlier passes over this input reported, from segment 0 on without a gap;
    /// empty when none are known.
    pub segments: &'a [Segment],
}

/// A digest value, as a stage reports it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Digest {
    Sha256([u8; 32]),
    Crc32(u32),
}

/// The digest of one range of a stage's input.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RangeDigest {
    pub range: ByteRange,
    pub digest: Digest,
}

/// What a stage learned from the bytes it has seen so far, for the proxy to persist.
///
/// Every entry is a fact about byte ranges of the stage's own input, true whether or not the pass
/// went on to its end, so a report taken from a pass cut short is as usable as a finished one's.
/// New kinds of facts become new fields: build one with `StageReport::default()`.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub struct StageReport {
    /// Digests of ranges of the input.
    pub digests: Vec<RangeDigest>,
    /// States from which a later pass can start (see [`StageFactory::start`]), by ascending offset.
    pub checkpoints: Vec<StageState>,
    /// Segments of the output produced in this pass, by segment number, ascending.
    pub segments: Vec<(u64, Segment)>,
}

/// Why a stage cannot plan, start or go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// The stage cannot produce this output range from the input length it was given.
    #[error("cannot plan output {range:?} from {input_len} input bytes: {reason}")]
    Plan { range: ByteRange, input_len: u64, reason: String },
    /// The resume state cannot be used to start at this offset.
    #[error("cannot resume at input byte {offset}: {reason}")]
    Resume { offset: u64, reason: String },
    /// A regenerated segment differs from what an earlier pass recorded for it (see [`Segment`]):
    /// the input changed under the same version, or the backend's output did. None of the
    /// segment's bytes were returned, and the segments learned for this input cannot be trusted.
    #[error(
        "segment {segment} came out as {found:?}, not as recorded: {expected:?}; none of it was \
         returned"
    )]
    SegmentMismatch { segment: u64, expected: Segment, found: Segment },
    /// The input runs past what byte offsets can count.
    #[error("input runs past byte {0}, beyond what a u64 offset can count")]
    Overflow(u64),
    /// A failure of the stage's own, e.g. from a compression or encryption backend.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// A stage built once from its configuration, shared by every request on its route.
///
/// Output must be deterministic: the same input bytes give the same output bytes at every offset,
/// on every instance, after every restart. That is what lets a download of a transformed
/// representation resume at any byte.
pub trait StageFactory: Send + Sync + fmt::Debug {
    /// The kind it was registered under, e.g. `checksum`.
    fn kind(&self) -> &str;

    /// A string that changes whenever this stage's output bytes could change: its kind, every
    /// parameter that shapes its output, and the version of any backend it uses. It becomes part
    /// of the representation's ETag and of the state keys of later stages. Visible ASCII, without
    /// `|` (the chain's separator).
    fn identity(&self) -> &str;

    /// The input needed to produce `output`, for an input of `input_len` bytes.
    ///
    /// The chain calls it only with an `output` that lies inside the stage's output, when
    /// [`output_len`](Self::output_len) knows that; the returned input must lie inside
    /// `0..input_len`.
    fn plan(
        &self,
        output: ByteRange,
        input_len: u64,
        context: &StageContext<'_>,
    ) -> Result<StagePlan, StageError>;

    /// The input needed to produce the output from `output_start` to its end, for an input of
    /// `input_len` bytes, even while [`output_len`](Self::output_len) does not know that end: what
    /// resuming an open range (`bytes=X-`) needs before a full pass has indexed the output. The
    /// planned input runs to `input_len`; the run's output starts `skip` bytes before
    /// `output_start`, bytes it may have to compute ahead but that are never sent. Should the
    /// output turn out to end before `output_start`, the run produces nothing.
    ///
    /// By default, [`plan`](Self::plan) of `output_start..` the output's end when that is known,
    /// else an error: a stage whose length can be unknown overrides it.
    fn plan_open(
        &self,
        output_start: u64,
        input_len: u64,
        context: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        let output = self
            .output_len(input_len, context)
            .and_then(|len| ByteRange::new(output_start, len))
            .ok_or_else(|| StageError::Plan {
                range: ByteRange::open(output_start),
                input_len,
                reason: "the output's end is unknown or before the start".to_owned(),
            })?;
        self.plan(output, input_len, context)
    }

    /// The output length for an input of `input_len` bytes; `None` when it is unknown (until a
    /// full pass has indexed it, say) or would overflow `u64`.
    fn output_len(&self, input_len: u64, context: &StageContext<'_>) -> Option<u64>;

    /// Whether the stage passes every byte on unchanged, returning the very chunk it was given,
    /// and only observes (digests, counts) them.
    fn observes_only(&self) -> bool;

    /// The furthest [`Form`] of input this stage can work on. By default any for a stage that
    /// only observes, plaintext for one that changes bytes: a change meant for content means
    /// nothing to ciphertext, so a stage that works on any bytes (framing, say) must say so.
    fn accepts(&self) -> Form {
        if self.observes_only() { Form::Encrypted } else { Form::Transformed }
    }

    /// The [`Form`] this stage's own change puts bytes in. By default [`Form::Original`] for a
    /// stage that only observes, [`Form::Transformed`] otherwise; an encrypting stage must say
    /// [`Form::Encrypted`].
    fn produces(&self) -> Form {
        if self.observes_only() { Form::Original } else { Form::Transformed }
    }

    /// The media type of this stage's output, when it is a format of its own
    /// (`application/gzip`); `None` keeps the type of its input.
    fn media_type(&self) -> Option<&str> {
        None
    }

    /// The file name extension of this stage's output (`gz`), added to the object's name in a
    /// `Content-Disposition` so that a saved download is named for what it holds.
    fn file_extension(&self) -> Option<&str> {
        None
    }

    /// How many digests of its whole input a full pass of this stage reports (one per algorithm
    /// of a checksum); 0 for a stage that digests nothing. Tells the proxy when what the pieces
    /// of a download taught a stage is still short of a full pass.
    fn whole_digests(&self) -> usize {
        0
    }

    /// The HTTP content coding this stage's output is (`gzip`), when it is served as one: applied
    /// only for clients that accept it, with `Content-Encoding`, and never with ranges (clients
    /// decode on the fly and would resume at decoded offsets). `None`: the output is a
    /// representation of its own.
    fn content_coding(&self) -> Option<&str> {
        None
    }

    /// Whether a push may take long enough (milliseconds: compression) to stall other connections
    /// served by the same thread, so that the proxy runs it where blocking is allowed.
    fn blocks(&self) -> bool {
        false
    }

    /// Starts a per-request instance that will be fed the input from byte `at_input` on, going on
    /// from `resume` when it is given (a state this stage reported at that offset).
    fn start(
        &self,
        at_input: u64,
        resume: Option<&StageState>,
        context: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError>;
}

/// One request's run of a stage over a contiguous part of its input. `Sync` because the proxy's
/// per-request state, which holds it, is shared across the request's phases.
pub trait Stage: Send + Sync + fmt::Debug {
    /// Takes the next input chunk and returns what output is ready, if any. A stage that only
    /// observes returns the very same `Bytes`.
    fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError>;

    /// Ends the input, returning the rest of the output, if any.
    fn finish(&mut self) -> Result<Option<Bytes>, StageError>;

    /// What the stage has learned from the input so far, at any point of the pass (a pass may be
    /// cut short by the client, and what it saw until then is still worth keeping).
    fn report(&self) -> Option<StageReport> {
        None
    }
}
