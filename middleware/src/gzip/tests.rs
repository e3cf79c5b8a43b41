use std::io::Read as _;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use sha2::{Digest as _, Sha256};

use super::layout::{FINAL_BLOCK, HEADER};
use super::*;
use crate::chain::{
    Chain, ChainError, Learned, ObjectVersion, OptionValue, Segment, StageRegistry, StageReport,
};
use crate::checksum::{Algorithm, ChecksumFactory};

const BLOCK: u64 = MIN_BLOCK_SIZE;

fn object(len: u64) -> ObjectVersion<'static> {
    ObjectVersion { route: "test", path: "/object.txt", strong_etag: Some("\"v1\""), len }
}

fn context<'a>(object: &'a ObjectVersion<'a>, segments: &'a [Segment]) -> StageContext<'a> {
    StageContext { object, input_len: Some(object.len), input_identity: "", segments }
}

fn factory(level: u32, block_size: u64) -> GzipFactory {
    GzipFactory::new(level, block_size).expect("a valid configuration")
}

/// Text-like input: words from a small vocabulary, so that it compresses as text does.
fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: [&str; 12] = [
        "range", "resume", "the ", "download", "of ", "bytes", "proxy", "\n", "gzip", ", ", "a ",
        "block",
    ];
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(WORDS[(state % WORDS.len() as u64) as usize].as_bytes());
        out.push(b' ');
    }
    out.truncate(len);
    out
}

/// One pass of `factory` from input byte `at` (with `index` known) over `data`, the input from
/// there on, pushed in pieces cut at `cuts`: the output, and the report or the error with the
/// output returned before it.
fn pass(
    factory: &GzipFactory,
    input_len: u64,
    index: &[Segment],
    at: u64,
    data: &[u8],
    cuts: &[usize],
) -> (Vec<u8>, Result<StageReport, StageError>) {
    let object = object(input_len);
    let mut stage = factory.start(at, None, &context(&object, index)).expect("starts");
    let data = Bytes::copy_from_slice(data);
    let mut bounds: Vec<usize> = cuts.iter().map(|&cut| cut % (data.len() + 1)).collect();
    bounds.extend([0, data.len()]);
    bounds.sort_unstable();
    let mut out = Vec::new();
    for pair in bounds.windows(2) {
        match stage.push(data.slice(pair[0]..pair[1])) {
            Ok(piece) => out.extend(piece.unwrap_or_default()),
            Err(error) => return (out, Err(error)),
        }
    }
    match stage.finish() {
        Ok(tail) => out.extend(tail.unwrap_or_default()),
        Err(error) => return (out, Err(error)),
    }
    (out, Ok(stage.report().expect("gzip always reports")))
}

/// The whole output for `data`, and the block index its pass reported.
fn compress(factory: &GzipFactory, data: &[u8], cuts: &[usize]) -> (Vec<u8>, Vec<Segment>) {
    let (out, report) = pass(factory, data.len() as u64, &[], 0, data, cuts);
    let report = report.expect("a whole pass succeeds");
    let numbers: Vec<u64> = report.segments.iter().map(|(k, _)| *k).collect();
    assert_eq!(numbers, (0..numbers.len() as u64).collect::<Vec<_>>());
    (out, report.segments.into_iter().map(|(_, segment)| segment).collect())
}

fn gunzip(member: &[u8]) -> Vec<u8> {
    let mut decoded = Vec::new();
    flate2::read::GzDecoder::new(member).read_to_end(&mut decoded).expect("a valid gzip member");
    decoded
}

/// The output offset of block `k`'s segment.
fn segment_start(index: &[Segment], k: usize) -> usize {
    HEADER.len() + index[..k].iter().map(|segment| segment.output_len as usize).sum::<usize>()
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    let len = 0..(5 * BLOCK as usize + 100);
    prop_oneof![
        (len.clone(), any::<u64>()).prop_map(|(len, seed)| text(len, seed)),
        proptest::collection::vec(any::<u8>(), len),
    ]
}

fn level() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(1), Just(6), Just(9)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The output decodes to the input; the chunking, the pass and the factory do not change a
    /// byte of it; each segment's entry describes its bytes.
    #[test]
    fn the_member_decodes_and_is_deterministic(
        data in input(),
        level in level(),
        blocks in 1u64..4,
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let block_size = blocks * BLOCK;
        let (whole, index) = compress(&factory(level, block_size), &data, &[]);
        prop_assert_eq!(gunzip(&whole), data.clone());
        prop_assert_eq!(index.len() as u64, (data.len() as u64).div_ceil(block_size));
        let (chunked, again) = compress(&factory(level, block_size), &data, &cuts);
        prop_assert_eq!(&chunked, &whole);
        prop_assert_eq!(&again, &index);
        for (k, segment) in index.iter().enumerate() {
            let bytes = &whole[segment_start(&index, k)..segment_start(&index, k + 1)];
            let block = &data[k * block_size as usize..((k + 1) * block_size as usize).min(data.len())];
            prop_assert_eq!(crc32fast::hash(bytes), segment.output_crc32);
            prop_assert_eq!(crc32fast::hash(block), segment.input_crc32);
            // Each segment ends in the sync flush's empty stored block, byte-aligned.
            prop_assert!(bytes.ends_with(&[0, 0, 0xff, 0xff]));
        }
        let tail = &whole[segment_start(&index, index.len())..];
        prop_assert_eq!(&tail[..2], &FINAL_BLOCK);
        prop_assert_eq!(&tail[2..6], &crc32fast::hash(&data).to_le_bytes());
        prop_assert_eq!(&tail[6..], &(data.len() as u32).to_le_bytes());
    }

    /// With the index learned, any range planned and run through a chain is that slice of the
    /// whole output, whatever the chunking, with or without a checksum before the gzip.
    #[test]
    fn ranges_equal_slices_of_the_whole_output(
        data in input(),
        level in level(),
        checksum_first in any::<bool>(),
        ends in (any::<u64>(), any::<u64>()),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let gzip = factory(level, BLOCK);
        let (whole, index) = compress(&gzip, &data, &[]);
        let mut stages: Vec<Arc<dyn StageFactory>> = vec![Arc::new(gzip)];
        if checksum_first {
            let checksum = ChecksumFactory::new(&[Algorithm::Crc32], 64).unwrap();
            stages.insert(0, Arc::new(checksum));
        }
        let gzip_index = stages.len() - 1;
        let chain = Chain::new(stages).unwrap();
        let object = object(data.len() as u64);
        let mut learned = Learned::new();
        prop_assert!(chain.output_len(&object, &learned).is_none());
        learned.set_segments(gzip_index, index);
        prop_assert_eq!(chain.output_len(&object, &learned), Some(whole.len() as u64));

        let len = whole.len() as u64;
        let (a, b) = (ends.0 % (len + 1), ends.1 % (len + 1));
        let wanted = ByteRange::new(a.min(b), a.max(b)).unwrap();
        let plan = chain.plan(wanted, &object, &learned).unwrap();
        let got = run_chain(&chain, &plan, &object, &learned, &data, &cuts);
        prop_assert_eq!(&got[..], &whole[a.min(b) as usize..a.max(b) as usize]);
        // Whole blocks are read.
        prop_assert_eq!(plan.origin().start() % BLOCK, 0);
        let end = plan.origin().end();
        prop_assert!(end.is_multiple_of(BLOCK) || end == data.len() as u64);
    }

    /// With only part of the index, an open range from any offset is the tail of the whole
    /// output, and the pass reports the rest of the index.
    #[test]
    fn open_ranges_work_with_part_of_the_index(
        data in input(),
        level in level(),
        known in any::<usize>(),
        start in any::<u64>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let gzip = factory(level, BLOCK);
        let (whole, index) = compress(&gzip, &data, &[]);
        let known = known % (index.len() + 1);
        let chain = Chain::new(vec![Arc::new(gzip) as Arc<dyn StageFactory>]).unwrap();
        let object = object(data.len() as u64);
        let mut learned = Learned::new();
        learned.set_segments(0, index[..known].to_vec());
        // Up to the last byte: an open range from the end asks for nothing, and plans no pass
        // (the proxy answers it 416 before planning).
        let start = start % whole.len() as u64;
        let plan = chain.plan_open(start, &object, &learned).unwrap();
        let origin = plan.origin();
        prop_assert_eq!(origin.end(), data.len() as u64);
        let first = (origin.start() / BLOCK) as usize;
        prop_assert!(first <= known);
        let mut run = chain.start(&plan, &object, &learned, &[]).unwrap();
        let data = Bytes::from(data);
        let mut got = Vec::new();
        for piece in split(data.slice(origin.start() as usize..), &cuts) {
            got.extend(run.push(piece).unwrap().unwrap_or_default());
        }
        got.extend(run.finish().unwrap().unwrap_or_default());
        prop_assert_eq!(&got[..], &whole[start as usize..]);
        let report = run.reports().pop().flatten().unwrap();
        let learned_now: Vec<(u64, Segment)> = (first as u64..).zip(index[first..].iter().copied()).collect();
        prop_assert_eq!(report.segments, learned_now);
    }
}

fn split(data: Bytes, cuts: &[usize]) -> Vec<Bytes> {
    let mut bounds: Vec<usize> = cuts.iter().map(|&cut| cut % (data.len() + 1)).collect();
    bounds.extend([0, data.len()]);
    bounds.sort_unstable();
    bounds.windows(2).map(|pair| data.slice(pair[0]..pair[1])).collect()
}

fn run_chain(
    chain: &Chain,
    plan: &crate::chain::ChainPlan,
    object: &ObjectVersion<'_>,
    learned: &Learned,
    data: &[u8],
    cuts: &[usize],
) -> Vec<u8> {
    let origin = plan.origin();
    let input = Bytes::copy_from_slice(&data[origin.start() as usize..origin.end() as usize]);
    let mut run = chain.start(plan, object, learned, &[]).unwrap();
    let mut out = Vec::new();
    for piece in split(input, cuts) {
        out.extend(run.push(piece).unwrap().unwrap_or_default());
    }
    out.extend(run.finish().unwrap().unwrap_or_default());
    assert!(run.is_done());
    out
}

#[test]
fn a_pass_from_every_block_boundary_gives_the_rest_of_the_output() {
    let data = text(7 * BLOCK as usize + 123, 7);
    for level in [1, 6] {
        let gzip = factory(level, BLOCK);
        let (whole, index) = compress(&gzip, &data, &[]);
        for k in 0..index.len() {
            let at = k as u64 * BLOCK;
            let (out, report) =
                pass(&gzip, data.len() as u64, &index, at, &data[at as usize..], &[5000, 9000]);
            report.unwrap();
            let from = if k == 0 { 0 } else { segment_start(&index, k) };
            assert_eq!(out, &whole[from..], "level {level}, block {k}");
        }
    }
}

#[test]
fn two_factories_give_the_same_bytes() {
    let data = text(3 * BLOCK as usize + 5, 3);
    let one = compress(&factory(6, BLOCK), &data, &[]);
    let two = compress(
        &GzipFactory::from_options(&StageOptions::new().with("block_size", 4096)).unwrap(),
        &data,
        &[1, 2, 3],
    );
    assert_eq!(one, two);
}

#[test]
fn a_tampered_index_entry_stops_the_pass_before_that_block() {
    let data = text(5 * BLOCK as usize + 7, 11);
    let gzip = factory(6, BLOCK);
    let (whole, index) = compress(&gzip, &data, &[]);
    let tampers: [fn(&mut Segment); 3] = [
        |segment| segment.output_len += 1,
        |segment| segment.output_crc32 ^= 1,
        |segment| segment.input_crc32 ^= 1,
    ];
    for tamper in tampers {
        for k in [0, 2, 5] {
            let mut bad = index.clone();
            tamper(&mut bad[k]);
            // Chunks of a third of a block: the bad block completes inside a push.
            let cuts: Vec<usize> = (1..20).map(|i| i * BLOCK as usize / 3).collect();
            let (out, result) = pass(&gzip, data.len() as u64, &bad, 0, &data, &cuts);
            match result {
                Err(StageError::SegmentMismatch { segment, expected, found }) => {
                    assert_eq!((segment, expected, found), (k as u64, bad[k], index[k]));
                }
                other => panic!("block {k}: {other:?}"),
            }
            // Everything returned lies before the tampered block's segment, and is right.
            assert!(out.len() <= segment_start(&index, k).max(HEADER.len()), "block {k}");
            assert_eq!(out, &whole[..out.len()]);
        }
    }
}

#[test]
fn a_failed_pass_stays_failed() {
    let data = text(2 * BLOCK as usize, 1);
    let gzip = factory(6, BLOCK);
    let (_, mut index) = compress(&gzip, &data, &[]);
    index[0].output_crc32 ^= 1;
    let object = object(data.len() as u64);
    let mut stage = gzip.start(0, None, &context(&object, &index)).unwrap();
    assert!(stage.push(Bytes::from(data.clone())).is_err());
    let again = stage.push(Bytes::from_static(b"x")).unwrap_err();
    assert_eq!(again.to_string(), "the pass has ended (finished, or failed before)");
    assert!(stage.finish().is_err());
}

#[test]
fn start_refuses_what_it_cannot_produce() {
    let data = text(3 * BLOCK as usize, 2);
    let gzip = factory(6, BLOCK);
    let (_, index) = compress(&gzip, &data, &[]);
    let object = object(data.len() as u64);
    let with_index = context(&object, &index);
    let refusal = |at: u64, context: &StageContext<'_>, resume: Option<&StageState>| {
        gzip.start(at, resume, context).unwrap_err().to_string()
    };
    assert_eq!(
        refusal(100, &with_index, None),
        "cannot resume at input byte 100: not a multiple of the block size, 4096"
    );
    assert_eq!(
        refusal(4 * BLOCK, &with_index, None),
        "cannot resume at input byte 16384: past the end of the 12288 input bytes"
    );
    let state = StageState::new(BLOCK, Bytes::new());
    assert!(refusal(BLOCK, &with_index, Some(&state)).contains("no resume states"));
    let partial = context(&object, &index[..1]);
    assert!(gzip.start(BLOCK, None, &partial).is_ok());
    assert_eq!(
        refusal(2 * BLOCK, &partial, None),
        "cannot resume at input byte 8192: the trailer's CRC32 needs the input CRC32 of every \
         block before block 2, and the block index has 1"
    );
}

#[test]
fn a_pass_cannot_end_inside_a_block() {
    let data = text(2 * BLOCK as usize, 4);
    let gzip = factory(6, BLOCK);
    let object = object(data.len() as u64);
    let mut stage = gzip.start(0, None, &context(&object, &[])).unwrap();
    stage.push(Bytes::copy_from_slice(&data[..100])).unwrap();
    let error = stage.finish().unwrap_err();
    assert_eq!(
        error.to_string(),
        "the input ended at byte 100 of 8192: a pass may stop early only at a block boundary"
    );
    // Stopping at a block boundary is a ranged pass: no tail.
    let mut stage = gzip.start(0, None, &context(&object, &[])).unwrap();
    let out = stage.push(Bytes::copy_from_slice(&data[..BLOCK as usize])).unwrap().unwrap();
    assert_eq!(stage.finish().unwrap(), None);
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
}

#[test]
fn an_empty_input_is_a_header_and_a_tail() {
    let (out, index) = compress(&factory(6, BLOCK), &[], &[]);
    assert!(index.is_empty());
    let mut expected = HEADER.to_vec();
    expected.extend([0x03, 0x00, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(out, expected);
    assert!(gunzip(&out).is_empty());
    let object = object(0);
    assert_eq!(factory(6, BLOCK).output_len(0, &context(&object, &[])), Some(20));
}

#[test]
fn plans_read_whole_blocks_and_the_last_one_for_the_tail() {
    let data = text(3 * BLOCK as usize + 10, 5);
    let gzip = factory(6, BLOCK);
    let (whole, index) = compress(&gzip, &data, &[]);
    let object = object(data.len() as u64);
    let context = context(&object, &index);
    let len = whole.len() as u64;
    let plan = |a: u64, b: u64| gzip.plan(ByteRange::new(a, b).unwrap(), object.len, &context);
    let s1 = segment_start(&index, 1) as u64;
    // The header alone: block 0.
    assert_eq!(
        plan(0, 3).unwrap(),
        StagePlan { input: ByteRange::new(0, BLOCK).unwrap(), skip: 0 }
    );
    // Inside block 1's segment, ending in block 2's.
    assert_eq!(
        plan(s1 + 1, segment_start(&index, 2) as u64 + 1).unwrap(),
        StagePlan { input: ByteRange::new(BLOCK, 3 * BLOCK).unwrap(), skip: 1 }
    );
    // The tail alone: the last block, which the index has, is read again.
    let s3 = segment_start(&index, 3) as u64;
    assert_eq!(
        plan(len - 3, len).unwrap(),
        StagePlan { input: ByteRange::new(3 * BLOCK, object.len).unwrap(), skip: len - 3 - s3 }
    );
    let past = plan(0, len + 1).unwrap_err();
    assert!(past.to_string().contains("past the end"), "{past}");
    let partial = StageContext { segments: &index[..2], ..context };
    let unknown = gzip.plan(ByteRange::new(0, 1).unwrap(), object.len, &partial).unwrap_err();
    assert!(unknown.to_string().contains("places 2 of the 4 blocks"), "{unknown}");
    // An open range past the indexed blocks starts at the first block not indexed.
    let ahead = gzip.plan_open(len - 1, object.len, &partial).unwrap();
    let s2 = segment_start(&index, 2) as u64;
    assert_eq!(
        ahead,
        StagePlan { input: ByteRange::new(2 * BLOCK, object.len).unwrap(), skip: len - 1 - s2 }
    );
}

#[test]
fn options_are_checked_and_named() {
    let built = GzipFactory::from_options(&StageOptions::new()).unwrap();
    assert_eq!((built.level(), built.block_size()), (DEFAULT_LEVEL, DEFAULT_BLOCK_SIZE));
    assert_eq!(
        built.identity(),
        "gzip(v1,zlib-ng-2.3.3/libz-ng-sys-1.1.33,level=6,block_size=1048576)"
    );
    assert!(!built.observes_only());
    assert_eq!((built.accepts(), built.produces()), (Form::Transformed, Form::Transformed));

    let options: StageOptions = [
        ("level", OptionValue::Int(10)),
        ("block_size", OptionValue::Int(1000)),
        ("mtime", OptionValue::Int(0)),
    ]
    .into_iter()
    .collect();
    let errors: Vec<String> =
        GzipFactory::from_options(&options).unwrap_err().iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "level: 10 is not a deflate level — use 0 (stored, no compression) to 9 (smallest, \
             slowest); 6, the default, is gzip's own",
            "block_size: 1000 bytes is not between 4096 and 67108864 — smaller blocks compress \
             worse and bloat the block index, larger ones make every resume recompress more; use \
             e.g. 1048576, the default",
            "mtime: unknown key `mtime` — known keys: `block_size`, `level`, `mode`",
        ]
    );
    let negative = StageOptions::new().with("level", -1).with("block_size", "big");
    let errors = GzipFactory::from_options(&negative).unwrap_err();
    let keys: Vec<&str> = errors.iter().map(|error| error.key()).collect();
    assert_eq!(keys, ["level", "block_size"]);
    assert!(GzipFactory::new(6, MAX_BLOCK_SIZE + 1).is_err());
    assert!(GzipFactory::new(9, MAX_BLOCK_SIZE).is_ok());

    let registry = StageRegistry::new();
    assert!(registry.kinds().any(|kind| kind == "gzip"));
    let chain = registry
        .build_chain([("gzip", &StageOptions::new().with("level", 1).with("block_size", 65536))])
        .unwrap();
    assert_eq!(
        chain.identity(),
        "gzip(v1,zlib-ng-2.3.3/libz-ng-sys-1.1.33,level=1,block_size=65536)"
    );
}

#[test]
fn content_encoding_is_a_mode_that_must_come_last() {
    let registry = StageRegistry::new();
    let coding = StageOptions::new().with("mode", "content-encoding");
    let chain = registry.build_chain([("checksum", &StageOptions::new()), ("gzip", &coding)]);
    let chain = chain.unwrap();
    assert_eq!(chain.content_coding(), Some("gzip"));
    assert_eq!(chain.media_type(), None, "the origin's type stays");
    assert_eq!(chain.file_extensions().count(), 0);
    let represented = registry.build_chain([("gzip", &StageOptions::new())]).unwrap();
    assert_eq!(represented.content_coding(), None);
    assert_eq!(represented.media_type(), Some("application/gzip"));
    // The same bytes either way: the same identity.
    assert_eq!(chain.identity(), represented.identity());

    let key = std::env::temp_dir().join(format!("gzip-coding-key-{}", std::process::id()));
    std::fs::write(&key, "AAECAwQFBgcICQoLDA0ODw\n").unwrap();
    let aes = StageOptions::new().with("key_file", key.to_string_lossy().as_ref());
    let errors = registry.build_chain([("gzip", &coding), ("aes128gcm", &aes)]).unwrap_err();
    std::fs::remove_file(&key).unwrap();
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["aes128gcm at middleware[1] changes the bytes that gzip at middleware[0] serves as a \
          content coding — put the content coding last"]
    );
    let bad = StageOptions::new().with("mode", "brotli");
    let errors = GzipFactory::from_options(&bad).unwrap_err();
    assert_eq!(errors[0].key(), "mode");
    assert!(errors[0].message().contains("content-encoding"), "{}", errors[0]);
}

#[test]
fn gzip_cannot_follow_encryption_and_needs_its_index_for_ranges() {
    let chain = Chain::new(vec![Arc::new(factory(6, BLOCK)) as Arc<dyn StageFactory>]).unwrap();
    let unknown = chain.plan(ByteRange::new(0, 1).unwrap(), &object(10), &Learned::new());
    assert!(matches!(unknown, Err(ChainError::LengthUnknown { index: 0, .. })));
}

/// The golden test: the deflate backend's output for a fixed input. A different backend (or
/// version of it) fails here rather than in a user's resumed download. Should it fail after a
/// deliberate backend upgrade: update [`BACKEND`] (so the identity, and with it every ETag and
/// stored index, changes) and these values together.
#[test]
fn the_backend_gives_the_recorded_bytes() {
    let data = text(300_000, 42);
    let golden = [
        (1, 96420, "bf7627e5788efcef68f981bb2e0e28742eb18d7edeab848e18d80901224549d2"),
        (6, 47354, "467ca9bdd5b0c08ec6b509d65311679a429032515cf46cf2a5c175b667c9255e"),
    ];
    for (level, len, digest) in golden {
        let (out, _) = compress(&factory(level, 64 << 10), &data, &[]);
        let found: String = Sha256::digest(&out).iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!((level, out.len(), found.as_str()), (level, len, digest));
    }
}

/// [`BACKEND`] names the libz-ng-sys the workspace locks, and nothing else compresses for flate2.
#[test]
fn the_identity_names_the_locked_backend() {
    // Built in, not read at run time: a test binary reused from a build directory shared by
    // several clones would look for the lock file of a clone that may be gone.
    let lock = include_str!("../../../Cargo.lock");
    let version = |name: &str| {
        let entry = format!("name = \"{name}\"\nversion = \"");
        lock.split("[[package]]\n").find_map(|package| {
            package.strip_prefix(&entry).and_then(|rest| rest.split('"').next()).map(str::to_owned)
        })
    };
    let libz_ng_sys = version("libz-ng-sys").expect("libz-ng-sys is locked");
    assert!(
        BACKEND.ends_with(&format!("/libz-ng-sys-{libz_ng_sys}")),
        "{BACKEND} vs {libz_ng_sys}"
    );
    for other in ["miniz_oxide", "libz-sys", "libz-rs-sys", "zlib-rs"] {
        assert_eq!(version(other), None, "{other} is in the lock: another deflate could be built");
    }
}
