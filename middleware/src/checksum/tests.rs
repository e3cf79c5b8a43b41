use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use sha2::{Digest as _, Sha256};

use super::*;
use crate::chain::{Chain, ConfigError, Learned, ObjectVersion, OptionValue, StageRegistry};

/// The checksum stage looks at nothing in its context.
const OBJECT: ObjectVersion<'static> =
    ObjectVersion { route: "test", path: "/object", strong_etag: Some("\"v1\""), len: 0 };
const CONTEXT: StageContext<'static> =
    StageContext { object: &OBJECT, input_len: None, input_identity: "", segments: &[] };

fn object(len: u64) -> ObjectVersion<'static> {
    ObjectVersion { len, ..OBJECT }
}

fn factory(interval: u64) -> ChecksumFactory {
    ChecksumFactory::new(&[Algorithm::Sha256, Algorithm::Crc32], interval).unwrap()
}

/// Feeds `data` (the input from `start` on) cut at `cuts`, and returns the report.
fn pass(
    factory: &ChecksumFactory,
    start: u64,
    resume: Option<&StageState>,
    data: &[u8],
    cuts: &[usize],
) -> StageReport {
    let mut stage = factory.start(start, resume, &CONTEXT).unwrap();
    let data = Bytes::copy_from_slice(data);
    let mut bounds: Vec<usize> = cuts.iter().map(|&cut| cut % (data.len() + 1)).collect();
    bounds.extend([0, data.len()]);
    bounds.sort_unstable();
    for pair in bounds.windows(2) {
        let chunk = data.slice(pair[0]..pair[1]);
        let out = stage.push(chunk.clone()).unwrap().unwrap();
        // Observing: the very same bytes.
        assert_eq!((out.as_ptr(), out.len()), (chunk.as_ptr(), chunk.len()));
    }
    assert_eq!(stage.finish().unwrap(), None);
    stage.report().unwrap()
}

fn sha(report: &StageReport) -> Option<(ByteRange, [u8; 32])> {
    report.digests.iter().find_map(|digest| match digest.digest {
        Digest::Sha256(sha) => Some((digest.range, sha)),
        _ => None,
    })
}

fn crc(report: &StageReport) -> Option<Crc32Piece> {
    report.digests.iter().find_map(Crc32Piece::from_digest)
}

fn whole(len: usize) -> ByteRange {
    ByteRange::whole(len as u64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// One pass agrees with sha2 and crc32fast, whatever the chunking, and takes its
    /// checkpoints at the same offsets whatever the chunking.
    #[test]
    fn one_pass_agrees_with_the_libraries(
        data in proptest::collection::vec(any::<u8>(), 0..3000),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
        blocks in 1u64..8,
    ) {
        let factory = factory(blocks * 64);
        let report = pass(&factory, 0, None, &data, &cuts);
        let expected: [u8; 32] = Sha256::digest(&data).into();
        prop_assert_eq!(sha(&report), Some((whole(data.len()), expected)));
        prop_assert_eq!(crc(&report), Some(Crc32Piece::new(whole(data.len()), crc32fast::hash(&data))));
        let offsets: Vec<u64> = report.checkpoints.iter().map(StageState::offset).collect();
        let mut regular: Vec<u64> =
            (1..).map(|k| k * blocks * 64).take_while(|&at| at <= data.len() as u64).collect();
        let tail = data.len() as u64 / 64 * 64;
        if regular.last().copied().unwrap_or(0) < tail {
            regular.push(tail);
        }
        prop_assert_eq!(offsets, regular);
        let in_one = pass(&factory, 0, None, &data, &[]);
        prop_assert_eq!(in_one, report);
    }

    /// A pass resumed from any checkpoint of an earlier pass ends with the same SHA-256 as one
    /// pass over everything, and its CRC piece combines with the earlier piece into the whole's.
    #[test]
    fn resuming_from_a_checkpoint_gives_the_one_pass_digest(
        data in proptest::collection::vec(any::<u8>(), 64..3000),
        first_len in any::<usize>(),
        pick in any::<usize>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        blocks in 1u64..8,
    ) {
        let factory = factory(blocks * 64);
        // A first pass cut short anywhere past the first block.
        let first_len = 64 + first_len % (data.len() - 63);
        let first = pass(&factory, 0, None, &data[..first_len], &cuts);
        prop_assert!(!first.checkpoints.is_empty());
        let state = &first.checkpoints[pick % first.checkpoints.len()];
        // Through the store: only the bytes and the offset survive.
        let stored = StageState::new(state.offset(), Bytes::copy_from_slice(state.bytes()));
        let at = stored.offset() as usize;
        let second = pass(&factory, stored.offset(), Some(&stored), &data[at..], &cuts);
        let expected: [u8; 32] = Sha256::digest(&data).into();
        prop_assert_eq!(sha(&second), Some((whole(data.len()), expected)));
        // The CRC of [0, at) from a piece of the first pass, then the second's.
        let head = Crc32Piece::new(whole(at), crc32fast::hash(&data[..at]));
        let pieces = [crc(&first).unwrap(), head, crc(&second).unwrap()];
        prop_assert_eq!(
            Crc32Piece::assemble(&pieces, whole(data.len())),
            Some(Crc32Piece::new(whole(data.len()), crc32fast::hash(&data)))
        );
    }

    /// A piece that starts past 0 without a checkpoint still yields its CRC, and no SHA-256.
    #[test]
    fn pieces_without_checkpoints_report_their_crc(
        data in proptest::collection::vec(any::<u8>(), 1..2000),
        splits in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let factory = factory(DEFAULT_CHECKPOINT_INTERVAL);
        let mut bounds: Vec<usize> = splits.iter().map(|&s| s % data.len()).collect();
        bounds.extend([0, data.len()]);
        bounds.sort_unstable();
        bounds.dedup();
        let mut pieces = Vec::new();
        for pair in bounds.windows(2) {
            let report = pass(&factory, pair[0] as u64, None, &data[pair[0]..pair[1]], &[]);
            if pair[0] > 0 {
                prop_assert_eq!(sha(&report), None);
                prop_assert!(report.checkpoints.is_empty());
            }
            pieces.push(crc(&report).unwrap());
        }
        prop_assert_eq!(
            Crc32Piece::assemble(&pieces, whole(data.len())).map(|piece| piece.crc),
            Some(crc32fast::hash(&data))
        );
    }
}

#[test]
fn a_report_is_available_before_the_end() {
    let factory = factory(128);
    let data = vec![1u8; 300];
    let mut stage = factory.start(0, None, &CONTEXT).unwrap();
    stage.push(Bytes::from(data[..200].to_vec())).unwrap();
    let report = stage.report().unwrap();
    let expected: [u8; 32] = Sha256::digest(&data[..200]).into();
    assert_eq!(sha(&report), Some((whole(200), expected)));
    let offsets: Vec<u64> = report.checkpoints.iter().map(StageState::offset).collect();
    assert_eq!(offsets, [128, 192]);
}

#[test]
fn resume_states_must_fit() {
    let factory = factory(128);
    let checkpoint = pass(&factory, 0, None, &[5u8; 256], &[]).checkpoints[0].clone();
    assert_eq!(checkpoint.offset(), 128);
    let error = factory.start(64, Some(&checkpoint), &CONTEXT).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot resume at input byte 64: the state is for input byte 128"
    );
    let foreign = StageState::new(128, Bytes::from_static(b"gzip index"));
    let error = factory.start(128, Some(&foreign), &CONTEXT).unwrap_err();
    assert_eq!(error.to_string(), "cannot resume at input byte 128: not a SHA-256 checkpoint");
    // Without SHA-256 a state is not needed, and not looked at.
    let crc_only = ChecksumFactory::new(&[Algorithm::Crc32], 64).unwrap();
    let report = pass(&crc_only, 128, Some(&foreign), b"abc", &[]);
    assert_eq!(report.digests.len(), 1);
    assert!(report.checkpoints.is_empty());
    let sha_only = ChecksumFactory::new(&[Algorithm::Sha256], 64).unwrap();
    assert_eq!(pass(&sha_only, 0, None, b"", &[]).digests.len(), 1);
}

#[test]
fn offsets_never_overflow() {
    let mut stage = factory(64).start(u64::MAX - 1, None, &CONTEXT).unwrap();
    stage.push(Bytes::from_static(b"a")).unwrap();
    let error = stage.push(Bytes::from_static(b"bc")).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("input runs past byte {}, beyond what a u64 offset can count", u64::MAX)
    );
    // The last checkpoint offset that fits: the next one is never due.
    assert_eq!(next_multiple(u64::MAX - 10, 64), None);
}

#[test]
fn configuration() {
    let default = ChecksumFactory::from_options(&StageOptions::new()).unwrap();
    assert_eq!(default.identity(), "checksum(sha256,crc32)");
    assert_eq!(default.checkpoint_interval(), DEFAULT_CHECKPOINT_INTERVAL);
    assert!(default.observes_only());
    assert_eq!(default.accepts(), Form::Transformed);
    assert_eq!(default.output_len(42, &CONTEXT), Some(42));
    let range = ByteRange::new(3, 9).unwrap();
    assert_eq!(default.plan(range, 9, &CONTEXT).unwrap(), StagePlan::identity(range));
    assert!(default.plan(range, 8, &CONTEXT).is_err());

    let options = StageOptions::new()
        .with("algorithms", vec!["crc32", "crc32"])
        .with("checkpoint_interval", 1 << 20);
    let crc = ChecksumFactory::from_options(&options).unwrap();
    assert_eq!(crc.identity(), "checksum(crc32)");
    assert_eq!(crc.checkpoint_interval(), 1 << 20);

    assert_eq!(ChecksumFactory::new(&[], 64).unwrap_err(), ChecksumConfigError::NoAlgorithm);
    assert_eq!(
        ChecksumFactory::new(&[Algorithm::Crc32], 0).unwrap_err(),
        ChecksumConfigError::CheckpointInterval(0)
    );
}

#[test]
fn the_registry_reports_every_bad_option_at_once() {
    let registry = StageRegistry::new();
    assert_eq!(registry.kinds().collect::<Vec<_>>(), ["aes128gcm", "checksum", "gzip"]);
    let bad = StageOptions::new()
        .with("algorithms", OptionValue::List(vec!["md5".into(), 3.into(), "sha256".into()]))
        .with("checkpoint_interval", 100)
        .with("levle", 6);
    let empty = StageOptions::new().with("algorithms", Vec::<OptionValue>::new());
    let good = StageOptions::new();
    let stages = [("checksum", &bad), ("gzp", &good), ("checksum", &empty), ("checksum", &good)];
    let errors: Vec<String> =
        registry.build_chain(stages).unwrap_err().iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "middleware[0].algorithms[1]: expected a string, found an integer",
            "middleware[0].checkpoint_interval: 100 is not a positive multiple of 64 (SHA-256's \
             block length) — use e.g. 8388608, the default",
            "middleware[0].levle: unknown key `levle` — known keys: `algorithms`, \
             `checkpoint_interval`",
            "middleware[1].kind: unknown kind \"gzp\" — use \"aes128gcm\", \"checksum\", \"gzip\"",
            "middleware[2].algorithms: no algorithm — use \"sha256\", \"crc32\" or both",
        ]
    );
    let unknown = StageOptions::new().with("algorithms", vec!["md5"]);
    let errors = registry.build_chain([("checksum", &unknown)]).unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        "middleware[0].algorithms[0]: unknown algorithm \"md5\" — use \"sha256\" or \"crc32\""
    );
    assert!(matches!(&errors[..], [ConfigError::Option { index: 0, .. }]));

    let chain = registry.build_chain([("checksum", &good), ("checksum", &good)]).unwrap();
    assert!(chain.is_observing_only());
    assert_eq!(
        StageRegistry::empty().build("checksum", &good).unwrap_err()[0].message(),
        "unknown kind \"checksum\" — no kinds are registered"
    );
}

#[test]
fn registering_kinds() {
    let mut registry = StageRegistry::new();
    let builder = |options: &StageOptions| {
        ChecksumFactory::from_options(options).map(|f| Arc::new(f) as Arc<dyn StageFactory>)
    };
    assert_eq!(
        registry.register("checksum", builder).unwrap_err().to_string(),
        "middleware kind \"checksum\" is already registered"
    );
    for bad in ["", "Upper", "9lives", "a b", "x".repeat(65).as_str()] {
        assert!(matches!(
            registry.register(bad, builder),
            Err(crate::chain::RegistryError::InvalidKind(_))
        ));
    }
    registry.register("digest-2", builder).unwrap();
    assert_eq!(registry.kinds().collect::<Vec<_>>(), ["aes128gcm", "checksum", "digest-2", "gzip"]);
    assert!(format!("{registry:?}").contains("digest-2"));
}

#[test]
fn in_a_chain_digests_the_bytes_at_its_place() {
    let registry = StageRegistry::new();
    let chain = registry.build_chain([("checksum", &StageOptions::new())]).unwrap();
    let data = Bytes::from((0..=255u8).cycle().take(10_000).collect::<Vec<u8>>());
    let plan = chain.plan(whole(data.len()), &object(data.len() as u64), &Learned::new()).unwrap();
    let mut run = chain.start(&plan, &object(data.len() as u64), &Learned::new(), &[]).unwrap();
    let out = run.push(data.clone()).unwrap().unwrap();
    assert_eq!(out.as_ptr(), data.as_ptr());
    run.finish().unwrap();
    let report = run.reports().pop().flatten().unwrap();
    let expected: [u8; 32] = Sha256::digest(&data).into();
    assert_eq!(sha(&report), Some((whole(data.len()), expected)));
    assert_eq!(repr_digest(&expected), format!("sha-256=:{}:", base64_std(&expected)));
    // Chain::new takes the factory as is, too.
    Chain::new(vec![Arc::new(factory(64))]).unwrap();
}

fn base64_std(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
