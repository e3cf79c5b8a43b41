//! The gzip stage on arbitrary input, block sizes, levels and chunkings, through the chain API as
//! the proxy drives it.
//!
//! Input: 8 control bytes (level, block size, how many times the data repeats, a chunking seed,
//! an output range), then the data. Checks: the output is exactly one gzip member that decodes to
//! the input; it is the same bytes however the input is cut into pushes; the pass reports one
//! index entry per block, with which the chain knows the output's length; and any range of the
//! output, planned and run from the origin bytes the plan asks for, is that slice of it.
#![no_main]

use std::io::Read as _;
use std::sync::Arc;

use bytes::Bytes;
use flate2::bufread::GzDecoder;
use libfuzzer_sys::fuzz_target;
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::{Chain, ChainPlan, Learned, ObjectVersion, Segment, StageFactory};
use rangeway_middleware::gzip::{GzipFactory, MIN_BLOCK_SIZE};

/// Repeated data stays under this, so that a run takes milliseconds.
const MAX_DATA_LEN: usize = 48 << 10;

fuzz_target!(|input: &[u8]| {
    if input.len() < 8 {
        return;
    }
    let (control, payload) = input.split_at(8);
    let level = u32::from(control[0] % 10);
    // From the smallest block allowed to a little over 4 of them: several blocks per input.
    let block_size = MIN_BLOCK_SIZE + u64::from(u16::from_le_bytes([control[1], control[2]]));
    let repeats = usize::from(control[3] % 16) + 1;
    let seed = control[4];
    let ends = (u64::from(control[5]), u64::from(u16::from_le_bytes([control[6], control[7]])));
    let data: Vec<u8> =
        payload.iter().copied().cycle().take((payload.len() * repeats).min(MAX_DATA_LEN)).collect();
    let data = Bytes::from(data);

    let gzip = GzipFactory::new(level, block_size).expect("a valid configuration");
    let chain = Chain::new(vec![Arc::new(gzip) as Arc<dyn StageFactory>]).expect("one stage");
    let object = ObjectVersion {
        route: "fuzz",
        path: "/f",
        strong_etag: Some("\"e\""),
        len: data.len() as u64,
    };
    let mut learned = Learned::new();
    // An empty input has no blocks, so its (empty) index is already complete.
    let known = chain.output_len(&object, &learned);
    assert_eq!(known.is_some(), data.is_empty(), "a length without an index");

    let whole_plan = chain.plan_whole(&object, &learned);
    let (whole, segments) = run(&chain, &whole_plan, &object, &learned, &data, &[data.len()]);
    let mut decoder = GzDecoder::new(&whole[..]);
    let mut decoded = Vec::new();
    decoder.read_to_end(&mut decoded).expect("a valid gzip member");
    assert!(decoded == data, "the member decodes to other bytes");
    assert!(decoder.into_inner().is_empty(), "bytes after the first member");

    let blocks = (data.len() as u64).div_ceil(block_size);
    assert_eq!(
        segments.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        (0..blocks).collect::<Vec<_>>()
    );
    let cuts = chunking(seed, data.len());
    let (chunked, again) = run(&chain, &whole_plan, &object, &learned, &data, &cuts);
    assert!(chunked == whole, "the chunking changed the output");
    assert_eq!(again, segments, "the chunking changed the index");

    learned.set_segments(0, segments.into_iter().map(|(_, segment)| segment).collect());
    let len = whole.len() as u64;
    assert_eq!(chain.output_len(&object, &learned), Some(len));
    let (a, b) = (ends.0 % (len + 1), ends.1 % (len + 1));
    // The proxy never plans an empty range: it answers 416 first.
    let Some(wanted) = ByteRange::new(a.min(b), a.max(b)).filter(|range| !range.is_empty()) else {
        return;
    };
    let plan = chain.plan(wanted, &object, &learned).expect("plans with the whole index");
    let origin = plan.origin();
    assert!(origin.start().is_multiple_of(block_size), "{origin:?} starts inside a block");
    let (part, _) = run(&chain, &plan, &object, &learned, &data, &cuts);
    assert!(part[..] == whole[wanted.start() as usize..wanted.end() as usize], "{wanted:?}");
});

/// Cut points of `len` bytes, from a seed: chunks of 1 to 4 KiB bytes, sizes cycling.
fn chunking(seed: u8, len: usize) -> Vec<usize> {
    let mut state = u32::from(seed) | 0x100;
    let mut cuts = Vec::new();
    let mut at = 0;
    while at < len {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        at = (at + 1 + (state >> 20) as usize).min(len);
        cuts.push(at);
    }
    cuts
}

/// Runs `plan` over the origin bytes it asks for, pushed in pieces ending at `cuts` (offsets in
/// `data`): the output, and the block index entries the pass reported.
fn run(
    chain: &Chain,
    plan: &ChainPlan,
    object: &ObjectVersion<'_>,
    learned: &Learned,
    data: &Bytes,
    cuts: &[usize],
) -> (Vec<u8>, Vec<(u64, Segment)>) {
    let origin = plan.origin();
    let (start, end) = (origin.start() as usize, origin.end() as usize);
    let mut chain_run = chain.start(plan, object, learned, &[]).expect("starts");
    let mut out = Vec::new();
    let mut at = start;
    for &cut in cuts.iter().filter(|&&cut| cut > start).chain([&end]) {
        let cut = cut.min(end);
        if cut > at {
            out.extend(
                chain_run.push(data.slice(at..cut)).expect("compresses").unwrap_or_default(),
            );
            at = cut;
        }
    }
    out.extend(chain_run.finish().expect("finishes").unwrap_or_default());
    // A whole pass's end is not known before it runs, so only a ranged run can be done.
    assert_eq!(chain_run.is_done(), plan.output().end() != u64::MAX, "{plan:?}");
    let report = chain_run.reports().pop().flatten().expect("gzip reports");
    (out, report.segments)
}
