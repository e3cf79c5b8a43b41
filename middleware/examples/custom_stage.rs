//! A stage of your own: a case-changing transform, registered beside the built-in `checksum`,
//! built from a route's options, and run for a range of its output.
//!
//!   cargo run -p rangeway-middleware --example custom_stage
//!
//! `tests/middleware.rs` serves this very stage through the proxy.

use std::sync::Arc;

use bytes::Bytes;
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::{
    ChainError, Digest, Learned, ObjectVersion, OptionError, Stage, StageContext, StageError,
    StageFactory, StageOptions, StagePlan, StageRegistry, StageState,
};
use rangeway_middleware::checksum::repr_digest;

/// Turns ASCII letters to upper or lower case. Byte `i` of the output depends on byte `i` of the
/// input alone, so its range algebra is the identity and it can start anywhere.
#[derive(Debug)]
pub(crate) struct CaseFactory {
    upper: bool,
    identity: String,
}

impl CaseFactory {
    /// Options: `to = "upper" | "lower"` (default `"upper"`).
    pub(crate) fn from_options(
        options: &StageOptions,
    ) -> Result<Arc<dyn StageFactory>, Vec<OptionError>> {
        let mut reader = options.reader();
        let upper = match reader.str("to") {
            None | Some("upper") => true,
            Some("lower") => false,
            Some(other) => {
                reader.error(
                    "to",
                    format_args!("unknown case {other:?} — use \"upper\" or \"lower\""),
                );
                true
            }
        };
        reader.finish()?;
        // The identity names everything that shapes the output, and a version to bump should
        // the transform ever change.
        let identity = format!("case({})/1", if upper { "upper" } else { "lower" });
        Ok(Arc::new(Self { upper, identity }))
    }
}

impl StageFactory for CaseFactory {
    fn kind(&self) -> &str {
        "case"
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn plan(
        &self,
        output: ByteRange,
        _input_len: u64,
        _: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        Ok(StagePlan::identity(output))
    }

    fn output_len(&self, input_len: u64, _: &StageContext<'_>) -> Option<u64> {
        Some(input_len)
    }

    fn observes_only(&self) -> bool {
        false
    }

    fn start(
        &self,
        _at_input: u64,
        _resume: Option<&StageState>,
        _: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError> {
        Ok(Box::new(Case { upper: self.upper }))
    }
}

#[derive(Debug)]
struct Case {
    upper: bool,
}

impl Stage for Case {
    fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError> {
        let mut out = chunk.to_vec();
        if self.upper {
            out.make_ascii_uppercase();
        } else {
            out.make_ascii_lowercase();
        }
        Ok(Some(Bytes::from(out)))
    }

    fn finish(&mut self) -> Result<Option<Bytes>, StageError> {
        Ok(None)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Before the server starts: the built-ins, plus ours.
    let mut registry = StageRegistry::new();
    registry.register("case", CaseFactory::from_options)?;
    println!("kinds: {:?}", registry.kinds().collect::<Vec<_>>());

    // A bad option is reported with its place, as the config loader would show it.
    let bad = StageOptions::new().with("to", "title");
    if let Err(errors) = registry.build_chain([("case", &bad)]) {
        errors.iter().for_each(|error| println!("config error: {error}"));
    }

    // middleware = [{ kind = "checksum" }, { kind = "case", to = "upper" }, { kind = "checksum" }]
    let checksum = StageOptions::new();
    let upper = StageOptions::new().with("to", "upper");
    let chain = registry
        .build_chain([("checksum", &checksum), ("case", &upper), ("checksum", &checksum)])
        .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))?;
    println!("chain identity: {:?}", chain.identity());

    let object = Bytes::from_static(b"Resumable downloads, even when the route changes the body.");
    let len = object.len() as u64;
    // The version the proxy would take from the origin's answer; nothing is learned yet.
    let version =
        ObjectVersion { route: "docs", path: "/notes.txt", strong_etag: Some("\"v1\""), len };
    let learned = Learned::new();

    // A client asks for bytes 10..20 of the transformed representation.
    let wanted = ByteRange::new(10, 20).ok_or("reversed range")?;
    let plan = chain.plan(wanted, &version, &learned)?;
    println!("to send {wanted:?}: fetch origin {:?}", plan.origin());
    let origin = plan.origin();
    // usize::try_from: the range lies inside `object`, whose length is a usize.
    let piece = object.slice(usize::try_from(origin.start())?..usize::try_from(origin.end())?);
    let mut run = chain.start(&plan, &version, &learned, &[])?;
    let mut body = Vec::new();
    // Chunks as an upstream would deliver them.
    for at in (0..piece.len()).step_by(4) {
        if let Some(out) = run.push(piece.slice(at..piece.len().min(at + 4)))? {
            body.extend_from_slice(&out);
        }
    }
    if let Some(tail) = run.finish()? {
        body.extend_from_slice(&tail);
    }
    println!("body: {:?}", String::from_utf8_lossy(&body));

    // A full pass publishes the digests: of the origin's bytes, and of the delivered ones.
    let mut whole = chain.start(&chain.plan_whole(&version, &learned), &version, &learned, &[])?;
    whole.push(object)?;
    whole.finish()?;
    for (index, report) in whole.reports().into_iter().enumerate() {
        let Some(report) = report else { continue };
        for digest in &report.digests {
            match digest.digest {
                Digest::Sha256(sha) => {
                    println!(
                        "middleware[{index}] {:?}: Repr-Digest: {}",
                        digest.range,
                        repr_digest(&sha)
                    );
                }
                Digest::Crc32(crc) => {
                    println!("middleware[{index}] {:?}: crc32 {crc:08x}", digest.range)
                }
                _ => {}
            }
        }
    }

    // Asking past the end is an error, not a panic.
    match chain.plan(ByteRange::new(0, len + 1).ok_or("reversed range")?, &version, &learned) {
        Err(error @ ChainError::RangePastEnd { .. }) => println!("past the end: {error}"),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
