//! A route's middleware applied to one exchange: what the store knows of the object's
//! representation, the chain running over the upstream body, the headers that describe the
//! result, and what the stages learned, for the store.

use bytes::Bytes;
use rangeway_middleware::chain::{
    Chain, ChainError, ChainPlan, ChainRun, Digest, Learned, ObjectVersion, RangeDigest,
    StageFactory, StageReport,
};
use rangeway_middleware::checksum::{Crc32Piece, repr_digest};
use rangeway_middleware::{ByteRange, Window};

use crate::fingerprint::fingerprint;
use crate::state::{self, StageFacts, StateStore, StoreError};

/// Headers of the origin's that describe its bytes, not a transformed representation's.
pub(crate) const ORIGIN_DIGEST_HEADERS: [&str; 5] = [
    "repr-digest",
    "content-digest",
    "content-md5",
    "x-amz-checksum-sha256",
    "x-amz-checksum-crc32",
];

/// A resume of a download whose SHA-256 is not known yet starts its upstream request this much
/// before the client's range, at most, to continue the hash from a stored state: bytes fetched
/// but not sent, and only until the digest is known. The checksum stage stores a state at the
/// last 64-byte block of every pass, so a client that resumes where it stopped costs less than a
/// block; a piece of a parallel download may cost up to this much (the checksum's default
/// checkpoint interval, so that one stored state is always in reach).
pub(crate) const MAX_HASH_GAP: u64 = 8 << 20;

/// What the store knows of a route's stages, read as facts about one object version.
#[derive(Debug, Default)]
pub(crate) struct StoredFacts {
    /// The version the facts are read for (`StageFacts::version_of`).
    version: Option<String>,
    /// Per stage: its facts as stored, about whatever version they were recorded for.
    stored: Vec<Option<StageFacts>>,
}

impl StoredFacts {
    /// The facts of a lookup, read for `version` (the store's record of the object, when any).
    pub(crate) fn of(version: Option<String>, stored: Vec<Option<StageFacts>>) -> Self {
        Self { version, stored }
    }

    /// The same facts, read for the version an upstream answer shows.
    pub(crate) fn for_version(self, version: Option<String>) -> Self {
        Self { version, ..self }
    }

    /// Per stage, its facts when they are about the version read for.
    pub(crate) fn facts(&self) -> impl Iterator<Item = Option<&StageFacts>> {
        self.stored.iter().map(|facts| {
            facts.as_ref().filter(|f| self.version.as_deref() == Some(f.version.as_str()))
        })
    }

    /// What the chain's stages may plan with.
    pub(crate) fn learned(&self) -> Learned {
        let mut learned = Learned::new();
        for (index, facts) in self.facts().enumerate() {
            if let Some(facts) = facts {
                learned.set_segments(index, facts.contiguous_segments());
            }
        }
        learned
    }

    /// Where a pass over the origin should start to continue every hash that can be continued
    /// for a client range starting at `start`: the latest stored state at or before it (or the
    /// object's start), within [`MAX_HASH_GAP`]; `start` itself when every stage's whole digest
    /// is known or nothing helps. Stages of which nothing is known start from 0 when it is near:
    /// the pieces of a parallel download start together, before any of them stored a state.
    pub(crate) fn hash_start(&self, start: u64, origin_len: Option<u64>) -> u64 {
        let mut best = start;
        for facts in self.facts() {
            let whole_known = origin_len
                .zip(facts)
                .is_some_and(|(len, facts)| facts.sha256(ByteRange::whole(len)).is_some());
            if whole_known {
                continue;
            }
            let from = facts
                .into_iter()
                .flat_map(|f| f.checkpoints.iter().map(|c| c.offset()))
                .chain(std::iter::once(0))
                .filter(|&at| at <= start && start - at <= MAX_HASH_GAP)
                .min_by_key(|&at| start - at);
            if let Some(from) = from {
                best = best.min(from);
            }
        }
        best
    }
}

impl StoredFacts {
    /// Where a pass over the rest of the object must start so that every stage of `chain` (whose
    /// stages only observe, each seeing the origin's `len` bytes) gets the digests of its whole
    /// input that it still lacks: the latest stored state of each such stage, the earliest of
    /// those; `None` when nothing is missing.
    pub(crate) fn completion_start(&self, chain: &Chain, len: u64) -> Option<u64> {
        let whole = ByteRange::whole(len);
        chain
            .stages()
            .iter()
            .zip(self.facts())
            .filter(|(stage, facts)| !knows_whole_digests(stage.as_ref(), *facts, whole))
            .map(|(_, facts)| {
                facts
                    .into_iter()
                    .flat_map(|f| f.checkpoints.iter().map(|c| c.offset()))
                    .filter(|&at| at <= len)
                    .max()
                    .unwrap_or(0)
            })
            .min()
    }
}

/// Whether `facts` hold every digest of the `whole` input that `stage` reports after a full pass.
fn knows_whole_digests(
    stage: &dyn StageFactory,
    facts: Option<&StageFacts>,
    whole: ByteRange,
) -> bool {
    let have = facts.map_or(0, |f| f.digests.iter().filter(|d| d.range == whole).count());
    have >= stage.whole_digests()
}

/// A strong ETag of a transformed representation: the origin's strong ETag and the chain's
/// identity, hashed, so that it changes when either does.
pub(crate) fn representation_etag(origin_etag: &str, chain: &Chain) -> String {
    format!(
        "\"rw-{}\"",
        fingerprint([origin_etag.as_bytes(), b"\n", chain.identity().as_bytes()], 16)
    )
}

/// The chain running over one upstream body.
#[derive(Debug)]
pub(crate) struct ChainPass {
    run: ChainRun,
    /// Cuts an upstream body that starts before the planned origin range (a 200, or a wider
    /// 206) to the plan's start.
    input: Option<Window>,
    /// What the stages' reports are about; `None`: nothing can be recorded (no strong ETag).
    version: Option<String>,
    /// Each stage's whole input length, where known.
    lens: Vec<Option<u64>>,
    /// The facts already stored for `version`, per stage: completed with this pass's.
    known: Vec<Option<StageFacts>>,
    /// Whether the output has gone wrong, so nothing more is pushed and nothing recorded from it.
    failed: bool,
    /// Whether a push may block the thread for milliseconds (see `StageFactory::blocks`).
    blocks: bool,
}

impl ChainPass {
    /// Starts `plan` for an upstream body whose first byte is origin byte `stream_start`.
    pub(crate) fn start(
        chain: &Chain,
        plan: &ChainPlan,
        object: &ObjectVersion<'_>,
        known: StoredFacts,
        stream_start: u64,
    ) -> Result<Self, ChainError> {
        let mut learned = known.learned();
        let mut lens = chain.lengths(object, &learned);
        // A stage with every digest known is not run (see `Learned::set_digested`).
        for (index, (stage, facts)) in chain.stages().iter().zip(known.facts()).enumerate() {
            if let Some(Some(len)) = lens.get(index)
                && stage.whole_digests() > 0
                && knows_whole_digests(stage.as_ref(), facts, ByteRange::whole(*len))
            {
                learned.set_digested(index);
            }
        }
        // A stage resumes from the state it stored at exactly where its input starts.
        let states: Vec<_> = plan
            .stages()
            .iter()
            .zip(known.facts().chain(std::iter::repeat(None)))
            .map(|(stage, facts)| {
                facts.and_then(|f| f.checkpoints.iter().find(|c| c.offset() == stage.input.start()))
            })
            .collect();
        let run = chain.start(plan, object, &learned, &states)?;
        let origin = plan.origin();
        let input = (stream_start != origin.start()).then(|| Window::new(stream_start, origin));
        lens.pop();
        let facts = known.facts().map(|facts| facts.cloned()).collect();
        Ok(Self {
            run,
            input,
            version: known.version,
            lens,
            known: facts,
            failed: false,
            blocks: chain.blocks(),
        })
    }

    /// Whether a push may block the thread for milliseconds: run it where blocking is allowed.
    pub(crate) fn blocks(&self) -> bool {
        self.blocks
    }

    /// Records what the stages learned (see [`learned_facts`](Self::learned_facts)) about
    /// `object` in `store`, under each stage's key.
    pub(crate) async fn record(
        &self,
        store: &dyn StateStore,
        stage_keys: &[String],
        object: &str,
    ) -> Result<(), StoreError> {
        for (index, facts) in self.learned_facts() {
            if let Some(key) = stage_keys.get(index) {
                store.learn(object, key, &facts).await?;
            }
        }
        Ok(())
    }

    /// The output for the next upstream chunk.
    pub(crate) fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, ChainError> {
        let chunk = match self.input.as_mut() {
            Some(window) => match window.cut(chunk) {
                Some(chunk) => chunk,
                None => return Ok(None),
            },
            None => chunk,
        };
        self.run.push(chunk).inspect_err(|_| self.failed = true)
    }

    /// The rest of the output, at the end of the upstream body.
    pub(crate) fn finish(&mut self) -> Result<Option<Bytes>, ChainError> {
        self.run.finish().inspect_err(|_| self.failed = true)
    }

    /// What the stages learned, as facts to add per stage index; empty when nothing can be
    /// recorded. Only whole-input SHA-256 digests are kept (a prefix digest is of no use to
    /// anyone); CRC32 pieces are kept, and combined with the stored ones into the whole input's
    /// CRC32 when they cover it.
    fn learned_facts(&self) -> Vec<(usize, StageFacts)> {
        let Some(version) = self.version.as_ref().filter(|_| !self.failed) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (index, report) in self.run.reports().into_iter().enumerate() {
            let Some(report) = report else { continue };
            let len = self.lens.get(index).copied().flatten();
            let known = self.known.get(index).and_then(Option::as_ref);
            let facts = facts_of(version, report, len, known);
            if !facts.is_empty() {
                out.push((index, facts));
            }
        }
        out
    }
}

fn facts_of(
    version: &str,
    report: StageReport,
    len: Option<u64>,
    known: Option<&StageFacts>,
) -> StageFacts {
    let mut facts = StageFacts::from_report(version.to_owned(), report);
    let whole = len.map(ByteRange::whole);
    facts.digests.retain(|d| match d.digest {
        Digest::Sha256(_) => Some(d.range) == whole,
        _ => true,
    });
    if let Some(whole) = whole {
        let pieces: Vec<Crc32Piece> = facts
            .digests
            .iter()
            .chain(known.into_iter().flat_map(|k| k.digests.iter()))
            .filter_map(Crc32Piece::from_digest)
            .collect();
        let assembled = Crc32Piece::assemble(&pieces, whole)
            .map(|piece| RangeDigest { range: piece.range, digest: Digest::Crc32(piece.crc) });
        if let Some(digest) = assembled.filter(|d| !facts.digests.contains(d)) {
            facts.digests.push(digest);
        }
    }
    facts
}

/// The digest headers for what the store holds: of the delivered representation
/// (`Repr-Digest`, `X-Checksum-Crc32`), and of the origin's bytes when a transform comes after
/// the checksum (`X-Origin-Digest`, `X-Origin-Checksum-Crc32`). `want_sha256`: the client's
/// `Want-Repr-Digest` preference for sha-256, when it sent one (0: not acceptable).
pub(crate) fn digest_headers(
    chain: &Chain,
    known: &StoredFacts,
    lens: &[Option<u64>],
    want_sha256: Option<u8>,
) -> Vec<(&'static str, String)> {
    let output = chain.identity();
    let mut headers = Vec::new();
    for (index, facts) in known.facts().enumerate() {
        let (Some(facts), Some(Some(len))) = (facts, lens.get(index)) else { continue };
        let input = chain.input_identity(index).unwrap_or_default();
        let (sha_header, crc_header) = if input == output {
            ("repr-digest", "x-checksum-crc32")
        } else if input.is_empty() {
            ("x-origin-digest", "x-origin-checksum-crc32")
        } else {
            // Bytes between two transforms: nobody downloads those.
            continue;
        };
        let whole = ByteRange::whole(*len);
        if let Some(sha) = facts.sha256(whole)
            && !(input == output && want_sha256 == Some(0))
        {
            headers.push((sha_header, repr_digest(&sha)));
        }
        if let Some(crc) = facts.crc32(whole) {
            headers.push((crc_header, format!("{crc:08x}")));
        }
    }
    headers
}

/// The digest headers a response for the object's current version carries, for the admin API.
pub(crate) fn current_digests(
    route: &crate::routes::Route,
    path: &str,
    current: &state::ObjectVersion,
    facts: Vec<Option<StageFacts>>,
) -> Vec<(&'static str, String)> {
    let known = StoredFacts::of(version_key(current), facts);
    let object = ObjectVersion {
        route: &route.name,
        path,
        strong_etag: current.etag.as_deref().filter(|_| current.strong),
        len: current.size,
    };
    let lens = route.chain.lengths(&object, &known.learned());
    digest_headers(&route.chain, &known, &lens, None)
}

/// The store's version string for an upstream's version, when it has a strong ETag.
pub(crate) fn version_key(version: &state::ObjectVersion) -> Option<String> {
    version
        .etag
        .as_deref()
        .filter(|_| version.strong)
        .map(|etag| StageFacts::version_of(etag, version.size))
}
