//! The middleware chain of a route: stages composed into one streaming transform with one range
//! algebra.
//!
//! A route's stages are built once, from configuration, into a [`Chain`]; it checks their order
//! ([`Form`]) and joins their identities. Per request, [`Chain::plan`] maps the client's range on
//! the delivered representation back to the origin bytes to fetch, last stage first, and
//! [`Chain::start`] gives a [`ChainRun`] that pushes origin chunks through every stage and trims
//! the output to exactly the planned range. Between stages, and at both ends, [`Window`]s cut the
//! stream so each stage sees exactly the input it planned for: chunks that lie inside pass on as
//! the same `Bytes`, so a chain whose stages only observe forwards every chunk without a copy.

mod options;
mod registry;
mod stage;

use std::fmt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::{ByteRange, Window};

pub use options::{OptionError, OptionReader, OptionValue, StageOptions};
pub use registry::{ConfigError, RegistryError, StageBuilder, StageRegistry};
pub use stage::{
    Digest, Form, ObjectVersion, RangeDigest, Segment, Stage, StageContext, StageError,
    StageFactory, StagePlan, StageReport, StageState,
};

/// Joins stage identities into a chain's; stages may not use it themselves.
const IDENTITY_SEPARATOR: char = '|';

/// Why a list of stages does not make a chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A stage would see bytes in a form it cannot work on.
    #[error(
        "{kind} at middleware[{index}] must see {} but comes after {after_kind} at middleware[{after_index}]",
        needs.requirement()
    )]
    Order { index: usize, kind: String, needs: Form, after_index: usize, after_kind: String },
    /// A stage's identity cannot be joined into the chain's without ambiguity.
    #[error(
        "{kind} at middleware[{index}] has identity {identity:?}; an identity must be non-empty \
         visible ASCII without '|'"
    )]
    Identity { index: usize, kind: String, identity: String },
    /// A stage changes bytes that an earlier stage serves as a content coding.
    #[error(
        "{kind} at middleware[{index}] changes the bytes that {coding_kind} at \
         middleware[{coding_index}] serves as a content coding — put the content coding last"
    )]
    AfterCoding { index: usize, kind: String, coding_index: usize, coding_kind: String },
}

/// Why a range cannot be planned, or a run cannot start or go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// The requested range is not inside the chain's output.
    #[error("range {range:?} is not inside the {len} bytes of output")]
    RangePastEnd { range: ByteRange, len: u64 },
    /// A stage's output length is unknown, so no range after it can be planned.
    #[error(
        "the output length of {kind} at middleware[{index}] is unknown until a full pass, so \
         ranges of the output cannot be planned"
    )]
    LengthUnknown { index: usize, kind: String },
    /// A stage planned an input it does not have: a bug in that stage.
    #[error(
        "{kind} at middleware[{index}] planned input {input:?} (skipping {skip}) for output \
         {output:?}, outside its {input_len} input bytes"
    )]
    BadPlan {
        index: usize,
        kind: String,
        output: ByteRange,
        input: ByteRange,
        skip: u64,
        input_len: u64,
    },
    /// The plan was made by a chain of another length.
    #[error("the plan has {planned} stages; this chain has {stages}")]
    PlanMismatch { planned: usize, stages: usize },
    /// More resume states than stages.
    #[error("given {given} resume states for a chain of {stages} stages")]
    TooManyStates { given: usize, stages: usize },
    /// A stage failed.
    #[error("{kind} at middleware[{index}]: {error}")]
    Stage { index: usize, kind: String, error: StageError },
    /// The stages ended before producing the whole planned output.
    #[error("output ended at byte {reached}, short of the planned {planned:?}")]
    ShortOutput { reached: u64, planned: ByteRange },
    /// Input was pushed after [`ChainRun::finish`].
    #[error("input pushed after the run finished")]
    Finished,
}

/// What earlier passes over one object version taught a chain's stages, as the proxy keeps it:
/// for each stage, the segments it reported (see [`Segment`]), from segment 0 on without a gap,
/// and whether it has learned all a pass could teach it.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Learned {
    segments: Vec<Vec<Segment>>,
    /// Indices of stages that only observe and already know every digest of their whole input.
    digested: Vec<usize>,
}

impl Learned {
    /// Nothing learned yet.
    pub const fn new() -> Self {
        Self { segments: Vec::new(), digested: Vec::new() }
    }

    /// Records that stage `stage` knows every digest of its whole input
    /// ([`StageFactory::whole_digests`]). A stage that only observes then has nothing left to
    /// learn, so [`Chain::start`] does not run it: its bytes pass by unread.
    pub fn set_digested(&mut self, stage: usize) {
        if !self.digested.contains(&stage) {
            self.digested.push(stage);
        }
    }

    /// Whether stage `stage` knows every digest of its whole input.
    pub fn is_digested(&self, stage: usize) -> bool {
        self.digested.contains(&stage)
    }

    /// Records stage `stage`'s known segments, replacing what was there.
    pub fn set_segments(&mut self, stage: usize, segments: Vec<Segment>) {
        if self.segments.len() <= stage {
            self.segments.resize_with(stage + 1, Vec::new);
        }
        self.segments[stage] = segments;
    }

    /// Stage `stage`'s known segments.
    pub fn segments(&self, stage: usize) -> &[Segment] {
        self.segments.get(stage).map_or(&[], Vec::as_slice)
    }
}

/// A route's stages, in order, checked to work together.
#[derive(Clone)]
pub struct Chain {
    stages: Vec<Arc<dyn StageFactory>>,
    /// `identities[i]` is the identity of the bytes entering stage `i`; the last one, of the
    /// chain's output.
    identities: Vec<String>,
}

impl Default for Chain {
    /// The empty chain: the origin's bytes, forwarded as they come.
    fn default() -> Self {
        Self { stages: Vec::new(), identities: vec![String::new()] }
    }
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain").field("stages", &self.stages).finish()
    }
}

impl Chain {
    /// Builds a chain, rejecting stages in an order that cannot work (a stage that must see
    /// plaintext after one that encrypts, say) and identities that cannot be joined.
    pub fn new(stages: Vec<Arc<dyn StageFactory>>) -> Result<Self, BuildError> {
        for (index, stage) in stages.iter().enumerate() {
            let identity = stage.identity();
            let joinable = !identity.is_empty()
                && identity.bytes().all(|b| b.is_ascii_graphic() && b != IDENTITY_SEPARATOR as u8);
            if !joinable {
                return Err(BuildError::Identity {
                    index,
                    kind: stage.kind().to_owned(),
                    identity: identity.to_owned(),
                });
            }
            if !stage.observes_only()
                && let Some((coding_index, coding)) = stages[..index]
                    .iter()
                    .enumerate()
                    .find(|(_, before)| before.content_coding().is_some())
            {
                return Err(BuildError::AfterCoding {
                    index,
                    kind: stage.kind().to_owned(),
                    coding_index,
                    coding_kind: coding.kind().to_owned(),
                });
            }
            let needs = stage.accepts();
            // The earliest offender is the one to move, so name it.
            if let Some((after_index, after)) =
                stages[..index].iter().enumerate().find(|(_, before)| before.produces() > needs)
            {
                return Err(BuildError::Order {
                    index,
                    kind: stage.kind().to_owned(),
                    needs,
                    after_index,
                    after_kind: after.kind().to_owned(),
                });
            }
        }
        // A stage that only observes leaves the bytes as they are, so it leaves their identity
        // as it is too: the output of a chain of observers is the origin's own representation,
        // and a checksum moved before or after a transform does not change what is delivered.
        let mut identities = Vec::with_capacity(stages.len() + 1);
        let mut identity = String::new();
        identities.push(identity.clone());
        for stage in &stages {
            if !stage.observes_only() {
                if !identity.is_empty() {
                    identity.push(IDENTITY_SEPARATOR);
                }
                identity.push_str(stage.identity());
            }
            identities.push(identity.clone());
        }
        Ok(Self { stages, identities })
    }

    /// The media type of the output, when a stage gives it one: the last that does.
    pub fn media_type(&self) -> Option<&str> {
        self.stages.iter().rev().find_map(|stage| stage.media_type())
    }

    /// The extensions the stages add to a file name, in order (`["gz"]`).
    pub fn file_extensions(&self) -> impl Iterator<Item = &str> {
        self.stages.iter().filter_map(|stage| stage.file_extension())
    }

    /// The content coding of the output, when a stage serves its output as one (see
    /// [`StageFactory::content_coding`]).
    pub fn content_coding(&self) -> Option<&str> {
        self.stages.iter().find_map(|stage| stage.content_coding())
    }

    /// Whether a stage's push may block its thread for milliseconds (see
    /// [`StageFactory::blocks`]).
    pub fn blocks(&self) -> bool {
        self.stages.iter().any(|stage| stage.blocks())
    }

    /// The stages, in order.
    pub fn stages(&self) -> &[Arc<dyn StageFactory>] {
        &self.stages
    }

    /// A string that changes whenever the chain's output bytes could change: the identities of
    /// its transforming stages, joined by `|`. Empty when the output is the origin's own bytes.
    pub fn identity(&self) -> &str {
        self.identities.last().map_or("", String::as_str)
    }

    /// The identity of the bytes entering stage `index` (of the output, for `index ==
    /// stages().len()`): what a stage's state and digests are about, and what a later stage keys
    /// its own derivations on. `None` past the end.
    pub fn input_identity(&self, index: usize) -> Option<&str> {
        self.identities.get(index).map(String::as_str)
    }

    /// Whether every stage passes the bytes on unchanged (true for an empty chain): the output is
    /// the origin's bytes, and every chunk is forwarded as the same `Bytes`.
    pub fn is_observing_only(&self) -> bool {
        self.stages.iter().all(|stage| stage.observes_only())
    }

    /// What stage `index` is told about this request.
    fn context<'a>(
        &'a self,
        index: usize,
        input_len: Option<u64>,
        object: &'a ObjectVersion<'a>,
        learned: &'a Learned,
    ) -> StageContext<'a> {
        StageContext {
            object,
            input_len,
            input_identity: self.identities.get(index).map_or("", String::as_str),
            segments: learned.segments(index),
        }
    }

    /// The output length for `object`, when every stage knows its own.
    pub fn output_len(&self, object: &ObjectVersion<'_>, learned: &Learned) -> Option<u64> {
        self.stages.iter().enumerate().try_fold(object.len, |len, (index, stage)| {
            stage.output_len(len, &self.context(index, Some(len), object, learned))
        })
    }

    /// The length of each stage's whole input, then of the output, for `object`: `None` from the
    /// first stage that does not know its output length on.
    pub fn lengths(&self, object: &ObjectVersion<'_>, learned: &Learned) -> Vec<Option<u64>> {
        let mut lens = Vec::with_capacity(self.stages.len() + 1);
        let mut len = Some(object.len);
        lens.push(len);
        for (index, stage) in self.stages.iter().enumerate() {
            let context = self.context(index, len, object, learned);
            len = len.and_then(|len| stage.output_len(len, &context));
            lens.push(len);
        }
        lens
    }

    /// Plans the origin bytes to fetch, and what each stage drops, to produce exactly `output`
    /// (a non-empty range normally; an empty one plans no useful work) of the chain's output for
    /// `object`. Stages are planned last first, each from the input the next one needs.
    pub fn plan(
        &self,
        output: ByteRange,
        object: &ObjectVersion<'_>,
        learned: &Learned,
    ) -> Result<ChainPlan, ChainError> {
        let lens = self.known_lens(object, learned);
        let Some(&len) = lens.get(self.stages.len()) else {
            return Err(self.length_unknown(lens.len() - 1));
        };
        if output.end() > len {
            return Err(ChainError::RangePastEnd { range: output, len });
        }
        self.plan_before(output, lens, object, learned, Vec::new(), true)
    }

    /// Plans the chain's output from `output_start` to its end (an open range, `bytes=X-`), which
    /// works even while the last stage's output length is unknown: that stage plans with
    /// [`StageFactory::plan_open`] (a compressor whose block index is incomplete starts at the
    /// last block it indexed and computes the bytes up to `output_start` without sending them),
    /// and the stages before it as in [`plan`](Self::plan). With every length known it is
    /// `plan(output_start..len)`. Otherwise the run ends where the output does, found out by
    /// running it: a run of an `output_start` past that end produces nothing, and its reports
    /// complete what was learned. An unknown output length of any stage but the last is an error:
    /// the stages after it could not be told their input length.
    pub fn plan_open(
        &self,
        output_start: u64,
        object: &ObjectVersion<'_>,
        learned: &Learned,
    ) -> Result<ChainPlan, ChainError> {
        let lens = self.known_lens(object, learned);
        let stages = self.stages.len();
        if let Some(&len) = lens.get(stages) {
            let output = ByteRange::new(output_start, len)
                .ok_or(ChainError::RangePastEnd { range: ByteRange::open(output_start), len })?;
            return self.plan_before(output, lens, object, learned, Vec::new(), true);
        }
        // `lens` stops at the input of the first stage whose output length is unknown.
        let index = lens.len() - 1;
        if index + 1 != stages {
            return Err(self.length_unknown(index));
        }
        let (stage, input_len) = (&self.stages[index], lens[index]);
        let context = self.context(index, Some(input_len), object, learned);
        let plan = stage
            .plan_open(output_start, input_len, &context)
            .map_err(|error| ChainError::Stage { index, kind: stage.kind().to_owned(), error })?;
        let output = ByteRange::open(output_start);
        self.check_plan(index, output, plan, input_len)?;
        self.plan_before(output, lens, object, learned, vec![plan], false)
    }

    /// The input length of each stage, then the output length, up to the input of the first stage
    /// whose output length is unknown: `stages().len() + 1` entries when every length is known.
    fn known_lens(&self, object: &ObjectVersion<'_>, learned: &Learned) -> Vec<u64> {
        let mut lens = Vec::with_capacity(self.stages.len() + 1);
        lens.push(object.len);
        for (index, stage) in self.stages.iter().enumerate() {
            let len = lens[index];
            match stage.output_len(len, &self.context(index, Some(len), object, learned)) {
                Some(len) => lens.push(len),
                None => break,
            }
        }
        lens
    }

    fn length_unknown(&self, index: usize) -> ChainError {
        let kind = self.stages.get(index).map_or("", |stage| stage.kind()).to_owned();
        ChainError::LengthUnknown { index, kind }
    }

    /// Plans the stages before those already planned (in `plans`, last stage first, made for
    /// `output`), each for the input the next one needs.
    fn plan_before(
        &self,
        output: ByteRange,
        mut lens: Vec<u64>,
        object: &ObjectVersion<'_>,
        learned: &Learned,
        mut plans: Vec<StagePlan>,
        exact: bool,
    ) -> Result<ChainPlan, ChainError> {
        let before = self.stages.len() - plans.len();
        let mut wanted = plans.last().map_or(output, |plan| plan.input);
        for (index, (stage, &input_len)) in
            self.stages[..before].iter().zip(&lens).enumerate().rev()
        {
            let context = self.context(index, Some(input_len), object, learned);
            let plan = stage.plan(wanted, input_len, &context).map_err(|error| {
                ChainError::Stage { index, kind: stage.kind().to_owned(), error }
            })?;
            self.check_plan(index, wanted, plan, input_len)?;
            plans.push(plan);
            wanted = plan.input;
        }
        plans.reverse();
        lens.truncate(self.stages.len());
        let input_lens = lens.into_iter().map(Some).collect();
        Ok(ChainPlan { origin: wanted, stages: plans, input_lens, output, exact })
    }

    /// Rejects a stage's plan for `wanted` that lies outside its input.
    fn check_plan(
        &self,
        index: usize,
        wanted: ByteRange,
        plan: StagePlan,
        input_len: u64,
    ) -> Result<(), ChainError> {
        // The output a stage produces from its planned input starts `skip` bytes before the
        // wanted range, so it cannot skip past the start of its output.
        if plan.input.end() > input_len || plan.skip > wanted.start() {
            return Err(ChainError::BadPlan {
                index,
                kind: self.stages[index].kind().to_owned(),
                output: wanted,
                input: plan.input,
                skip: plan.skip,
                input_len,
            });
        }
        Ok(())
    }

    /// Plans one pass over the whole origin producing the whole output, which works even when
    /// a stage's output length is unknown. Ranges whose end is unknown end at `u64::MAX`.
    pub fn plan_whole(&self, object: &ObjectVersion<'_>, learned: &Learned) -> ChainPlan {
        let mut len = Some(object.len);
        let mut stages = Vec::with_capacity(self.stages.len());
        let mut input_lens = Vec::with_capacity(self.stages.len());
        for (index, stage) in self.stages.iter().enumerate() {
            stages.push(StagePlan { input: ByteRange::whole(len.unwrap_or(u64::MAX)), skip: 0 });
            input_lens.push(len);
            let context = self.context(index, len, object, learned);
            len = len.and_then(|len| stage.output_len(len, &context));
        }
        ChainPlan {
            origin: ByteRange::whole(object.len),
            stages,
            input_lens,
            output: ByteRange::whole(len.unwrap_or(u64::MAX)),
            exact: len.is_some(),
        }
    }

    /// Starts a run of `plan`, made by this chain for the same `object` and `learned`.
    /// `resume[i]`, when given, is a state stage `i` reported at the offset its planned input
    /// starts at; missing entries mean none.
    ///
    /// The run expects origin bytes from `plan.origin().start()` on; cut a stream that starts
    /// elsewhere (a 200 answering a ranged request) with a [`Window`] first.
    pub fn start(
        &self,
        plan: &ChainPlan,
        object: &ObjectVersion<'_>,
        learned: &Learned,
        resume: &[Option<&StageState>],
    ) -> Result<ChainRun, ChainError> {
        let stages = self.stages.len();
        if plan.stages.len() != stages {
            return Err(ChainError::PlanMismatch { planned: plan.stages.len(), stages });
        }
        if resume.len() > stages {
            return Err(ChainError::TooManyStates { given: resume.len(), stages });
        }
        let mut running = Vec::with_capacity(stages);
        for (index, (factory, stage_plan)) in self.stages.iter().zip(&plan.stages).enumerate() {
            let state = resume.get(index).copied().flatten();
            let input_len = plan.input_lens.get(index).copied().flatten();
            let stage: Box<dyn Stage> = if factory.observes_only() && learned.is_digested(index) {
                // Hashing the bytes again would only find what is known: the costliest part of
                // a checksum route, saved on every download of an object after the first.
                Box::new(Unobserved)
            } else {
                let context = self.context(index, input_len, object, learned);
                factory.start(stage_plan.input.start(), state, &context).map_err(|error| {
                    ChainError::Stage { index, kind: factory.kind().to_owned(), error }
                })?
            };
            let wanted = plan.stages.get(index + 1).map_or(plan.output, |next| next.input);
            // `plan` checked `skip <= wanted.start()`; should a plan of another chain of the same
            // length break it, the window just starts at 0.
            let output = Window::new(wanted.start().saturating_sub(stage_plan.skip), wanted);
            running.push(Running { factory: Arc::clone(factory), stage, output });
        }
        Ok(ChainRun {
            input: Window::new(plan.origin.start(), plan.origin),
            stages: running,
            planned: plan.output,
            exact: plan.exact,
            finished: false,
        })
    }
}

/// What a request needs from the origin, and what each stage drops, to produce one range of a
/// chain's output. Made by [`Chain::plan`] or [`Chain::plan_whole`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChainPlan {
    origin: ByteRange,
    stages: Vec<StagePlan>,
    /// The whole input length of each stage, where known.
    input_lens: Vec<Option<u64>>,
    output: ByteRange,
    /// Whether the output's end is known, so that a run ending before it is an error.
    exact: bool,
}

impl ChainPlan {
    /// The origin bytes to fetch.
    pub fn origin(&self) -> ByteRange {
        self.origin
    }

    /// Each stage's planned input and the bytes of its output dropped before the range the next
    /// stage (or the client) needs.
    pub fn stages(&self) -> &[StagePlan] {
        &self.stages
    }

    /// The output range the run produces.
    pub fn output(&self) -> ByteRange {
        self.output
    }
}

/// A started stage and the window that cuts its output to what comes next.
#[derive(Debug)]
struct Running {
    factory: Arc<dyn StageFactory>,
    stage: Box<dyn Stage>,
    output: Window,
}

/// A stage that only observes, in a run where it has nothing left to learn: bytes pass by.
#[derive(Debug)]
struct Unobserved;

impl Stage for Unobserved {
    fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError> {
        Ok(Some(chunk))
    }

    fn finish(&mut self) -> Result<Option<Bytes>, StageError> {
        Ok(None)
    }
}

/// One request's run of a chain: origin chunks in, the planned output range out.
#[derive(Debug)]
pub struct ChainRun {
    input: Window,
    stages: Vec<Running>,
    planned: ByteRange,
    exact: bool,
    finished: bool,
}

impl ChainRun {
    /// Pushes the next origin chunk through every stage; returns the output it completes, if any.
    pub fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, ChainError> {
        if self.finished {
            return Err(ChainError::Finished);
        }
        match self.input.cut(chunk) {
            Some(data) => self.feed(0, data),
            None => Ok(None),
        }
    }

    /// Ends the input: finishes every stage in order, pushing each one's tail through the stages
    /// after it, and returns the rest of the output. Errors when the output ends short of a
    /// planned range whose end is known. Calling it again returns nothing.
    pub fn finish(&mut self) -> Result<Option<Bytes>, ChainError> {
        if self.finished {
            return Ok(None);
        }
        self.finished = true;
        let mut pieces = Vec::new();
        for index in 0..self.stages.len() {
            let running = &mut self.stages[index];
            let tail = running.stage.finish().map_err(|error| ChainError::Stage {
                index,
                kind: running.factory.kind().to_owned(),
                error,
            })?;
            if let Some(tail) = tail.and_then(|tail| running.output.cut(tail))
                && let Some(out) = self.feed(index + 1, tail)?
            {
                pieces.push(out);
            }
        }
        if self.exact && !self.is_done() {
            let last = self.stages.last().map_or(&self.input, |running| &running.output);
            return Err(ChainError::ShortOutput { reached: last.offset(), planned: self.planned });
        }
        Ok(match pieces.len() {
            0 => None,
            1 => pieces.pop(),
            // Several stages with tails: rare, and only at the end.
            _ => {
                let mut joined = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
                pieces.iter().for_each(|piece| joined.extend_from_slice(piece));
                Some(joined.freeze())
            }
        })
    }

    /// What each stage has learned so far, by stage index.
    pub fn reports(&self) -> Vec<Option<StageReport>> {
        self.stages.iter().map(|running| running.stage.report()).collect()
    }

    /// Whether the whole planned output has been produced.
    pub fn is_done(&self) -> bool {
        // An empty range is done before any byte goes by.
        self.planned.is_empty()
            || self.stages.last().map_or(&self.input, |running| &running.output).is_done()
    }

    /// Runs `data` (already cut to stage `from`'s input) through the stages from `from` on.
    fn feed(&mut self, from: usize, mut data: Bytes) -> Result<Option<Bytes>, ChainError> {
        for (index, running) in self.stages.iter_mut().enumerate().skip(from) {
            let out = running.stage.push(data).map_err(|error| ChainError::Stage {
                index,
                kind: running.factory.kind().to_owned(),
                error,
            })?;
            match out.and_then(|out| running.output.cut(out)) {
                Some(out) => data = out,
                None => return Ok(None),
            }
        }
        Ok(Some(data))
    }
}

#[cfg(test)]
mod tests;
