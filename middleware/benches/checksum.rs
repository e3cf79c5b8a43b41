//! The checksum stage beside raw sha2 / crc32fast over the same 64 KiB chunks, so the ratio of
//! each pair is the stage's overhead (target: the stage at 90 % or more of raw).
//!
//!   cargo bench -p rangeway-middleware --bench checksum -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::{Chain, Learned, ObjectVersion, StageContext, StageFactory};
use rangeway_middleware::checksum::{Algorithm, ChecksumFactory, DEFAULT_CHECKPOINT_INTERVAL};
use sha2::{Digest as _, Sha256};

mod support;

/// The checksum stage looks at nothing in its context.
const OBJECT: ObjectVersion<'static> =
    ObjectVersion { route: "bench", path: "/object", strong_etag: Some("\"v1\""), len: 0 };
const CONTEXT: StageContext<'static> =
    StageContext { object: &OBJECT, input_len: None, input_identity: "", segments: &[] };

fn object(len: u64) -> ObjectVersion<'static> {
    ObjectVersion { len, ..OBJECT }
}

/// 16 MiB: two checkpoints at the default interval per pass, as a real object would have.
const TOTAL: usize = 16 << 20;

fn stage(algorithms: &[Algorithm]) -> ChecksumFactory {
    ChecksumFactory::new(algorithms, DEFAULT_CHECKPOINT_INTERVAL).expect("valid configuration")
}

/// One pass of the stage: every chunk pushed, then the report (which finalizes the digests).
fn run_stage(factory: &ChecksumFactory, chunks: &[Bytes]) {
    let mut stage = factory.start(0, None, &CONTEXT).expect("starts at 0");
    for chunk in chunks {
        black_box(stage.push(chunk.clone()).expect("never fails"));
    }
    black_box(stage.finish().expect("never fails"));
    black_box(stage.report());
}

fn raw_sha(chunks: &[Bytes]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    chunks.iter().for_each(|chunk| hasher.update(chunk));
    hasher.finalize().into()
}

fn raw_crc(chunks: &[Bytes]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    chunks.iter().for_each(|chunk| hasher.update(chunk));
    hasher.finalize()
}

fn checksum(c: &mut Criterion) {
    let chunks = support::chunks(TOTAL);
    let mut group = c.benchmark_group("checksum-64KiB-chunks");
    group.throughput(Throughput::Bytes(TOTAL as u64));

    let sha = stage(&[Algorithm::Sha256]);
    let crc = stage(&[Algorithm::Crc32]);
    let both = stage(&[Algorithm::Sha256, Algorithm::Crc32]);

    group.bench_function("sha256/raw", |b| b.iter(|| black_box(raw_sha(&chunks))));
    group.bench_function("sha256/stage", |b| b.iter(|| run_stage(&sha, &chunks)));
    group.bench_function("crc32/raw", |b| b.iter(|| black_box(raw_crc(&chunks))));
    group.bench_function("crc32/stage", |b| b.iter(|| run_stage(&crc, &chunks)));
    group
        .bench_function("both/raw", |b| b.iter(|| black_box((raw_sha(&chunks), raw_crc(&chunks)))));
    group.bench_function("both/stage", |b| b.iter(|| run_stage(&both, &chunks)));

    // The same stage inside a chain: what a route with only a checksum costs, windows included.
    let chain = Chain::new(vec![Arc::new(both) as Arc<dyn StageFactory>]).expect("valid chain");
    let plan = chain
        .plan(ByteRange::whole(TOTAL as u64), &object(TOTAL as u64), &Learned::new())
        .expect("in range");
    group.bench_function("both/chain", |b| {
        b.iter(|| {
            let mut run =
                chain.start(&plan, &object(TOTAL as u64), &Learned::new(), &[]).expect("starts");
            for chunk in &chunks {
                black_box(run.push(chunk.clone()).expect("never fails"));
            }
            black_box(run.finish().expect("complete"));
            black_box(run.reports());
        })
    });
    group.finish();
}

criterion_group!(benches, checksum);
criterion_main!(benches);
