//! The gzip stage beside the raw backend (zlib-ng through flate2) compressing the same data at
//! the same level and block size, each block by a fresh compressor in one call with a sync flush:
//! the ratio is the stage's own overhead (buffering, CRC32s, framing; target: the stage at 85 %
//! or more of raw). Before the timings it prints what the block size costs in compressed size
//! against one deflate stream over the whole input.
//!
//!   cargo bench -p rangeway-middleware --bench gzip -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flate2::{Compress, Compression, FlushCompress};
use rangeway_middleware::chain::{ObjectVersion, StageContext, StageFactory};
use rangeway_middleware::gzip::{DEFAULT_BLOCK_SIZE, GzipFactory};

const CHUNK: usize = 64 << 10;
const TOTAL: usize = 16 << 20;

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Text-like: words of a few hundred-word vocabulary in sentences, compressing about as English
/// prose or logs do.
fn text() -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let words: Vec<String> = (0..400)
        .map(|_| {
            let len = 2 + xorshift(&mut state) % 8;
            (0..len).map(|_| (b'a' + (xorshift(&mut state) % 26) as u8) as char).collect()
        })
        .collect();
    let mut out = Vec::with_capacity(TOTAL + 16);
    while out.len() < TOTAL {
        // Zipf-like: low word numbers far more often.
        let pick = xorshift(&mut state) % 400;
        let word = &words[(pick * pick / 400) as usize];
        out.extend_from_slice(word.as_bytes());
        out.push(if xorshift(&mut state).is_multiple_of(12) { b'\n' } else { b' ' });
    }
    out.truncate(TOTAL);
    out
}

/// Random bytes: what deflate cannot shrink (already compressed media, archives).
fn random() -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..TOTAL).map(|_| xorshift(&mut state) as u8).collect()
}

fn context<'a>(object: &'a ObjectVersion<'a>) -> StageContext<'a> {
    StageContext { object, input_len: Some(object.len), input_identity: "", segments: &[] }
}

const OBJECT: ObjectVersion<'static> = ObjectVersion {
    route: "bench",
    path: "/object",
    strong_etag: Some("\"v1\""),
    len: TOTAL as u64,
};

/// One pass of the stage over the chunks: the output length.
fn run_stage(factory: &GzipFactory, chunks: &[Bytes]) -> usize {
    let mut stage = factory.start(0, None, &context(&OBJECT)).expect("starts at 0");
    let mut len = 0;
    for chunk in chunks {
        len += stage.push(chunk.clone()).expect("compresses").map_or(0, |out| out.len());
    }
    len + stage.finish().expect("finishes").map_or(0, |out| out.len())
}

/// The backend alone: each block compressed in one call by a fresh compressor, sync-flushed.
fn raw_blocks(level: u32, block_size: usize, data: &[u8]) -> usize {
    let mut len = 0;
    let mut out = Vec::new();
    for block in data.chunks(block_size) {
        out.clear();
        out.reserve(block.len() + block.len() / 8 + 64);
        let mut compressor = Compress::new(Compression::new(level), false);
        compressor.compress_vec(block, &mut out, FlushCompress::Sync).expect("compresses");
        len += out.len();
    }
    len
}

/// One deflate stream over the whole input, as `gzip` itself would write it.
fn one_stream(level: u32, data: &[u8]) -> usize {
    let mut out = Vec::with_capacity(data.len() + data.len() / 8 + 64);
    let mut compressor = Compress::new(Compression::new(level), false);
    compressor.compress_vec(data, &mut out, FlushCompress::Finish).expect("compresses");
    out.len()
}

fn size_table(inputs: &[(&str, &[u8])]) {
    println!("\ncompressed size, blocks vs one deflate stream ({} MiB input):", TOTAL >> 20);
    println!(
        "{:<8} {:>5} {:>12} {:>18} {:>18} {:>18}",
        "input", "level", "one stream", "64 KiB blocks", "1 MiB blocks", "4 MiB blocks"
    );
    for (name, data) in inputs {
        for level in [1, 6] {
            let whole = one_stream(level, data);
            let cell = |block: usize| {
                let len = raw_blocks(level, block, data) + 20;
                format!("{len} ({:+.2}%)", (len as f64 / whole as f64 - 1.0) * 100.0)
            };
            println!(
                "{name:<8} {level:>5} {whole:>12} {:>18} {:>18} {:>18}",
                cell(64 << 10),
                cell(1 << 20),
                cell(4 << 20)
            );
        }
    }
    println!();
}

fn gzip(c: &mut Criterion) {
    let text = text();
    let random = random();
    size_table(&[("text", &text), ("random", &random)]);

    let mut group = c.benchmark_group("gzip-64KiB-chunks-1MiB-blocks");
    group.throughput(Throughput::Bytes(TOTAL as u64));
    group.sample_size(10);
    for (name, data) in [("text", text), ("random", random)] {
        let data = Bytes::from(data);
        let chunks: Vec<Bytes> =
            (0..TOTAL).step_by(CHUNK).map(|at| data.slice(at..at + CHUNK)).collect();
        for level in [1, 6] {
            let factory = GzipFactory::new(level, DEFAULT_BLOCK_SIZE).expect("valid configuration");
            group.bench_function(format!("{name}/level{level}/raw"), |b| {
                b.iter(|| black_box(raw_blocks(level, DEFAULT_BLOCK_SIZE as usize, &data)))
            });
            group.bench_function(format!("{name}/level{level}/stage"), |b| {
                b.iter(|| black_box(run_stage(&factory, &chunks)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, gzip);
criterion_main!(benches);
