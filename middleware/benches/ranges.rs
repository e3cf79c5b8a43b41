//! The per-request range work: parsing a `Range` header, resolving it against a length, planning
//! the upstream range, and cutting a body of 64 KiB chunks to a window.
//!
//!   cargo bench -p rangeway-middleware --bench ranges -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rangeway_middleware::rfc9110::{RangeLimits, RangeRequest, parse_range};
use rangeway_middleware::{ByteRange, Window};

const HEADERS: [(&str, &str); 4] = [
    ("open", "bytes=1048576-"),
    ("suffix", "bytes=-500"),
    ("closed", "bytes=0-1048575"),
    (
        "multi-16",
        "bytes=0-9,100-109,200-209,300-309,400-409,500-509,600-609,700-709,800-809,900-909,1000-1009,1100-1109,1200-1209,1300-1309,1400-1409,1500-1509",
    ),
];

fn parse_and_plan(c: &mut Criterion) {
    let limits = RangeLimits::default();
    let mut group = c.benchmark_group("range-header");
    for (name, header) in HEADERS {
        group.bench_function(name, |b| {
            b.iter(|| {
                let RangeRequest::Bytes(set) = parse_range(black_box(header.as_bytes()), &limits)
                else {
                    unreachable!("the benchmark headers are valid");
                };
                black_box((set.covering_spec(), set.resolve(black_box(1 << 30))))
            })
        });
    }
    group.finish();
}

fn window(c: &mut Criterion) {
    const CHUNK: usize = 64 << 10;
    let body = Bytes::from(vec![7u8; 16 << 20]);
    let chunks: Vec<Bytes> =
        (0..body.len()).step_by(CHUNK).map(|at| body.slice(at..at + CHUNK)).collect();
    let mut group = c.benchmark_group("window-64KiB-chunks");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("cut-16MiB-to-the-middle-8MiB", |b| {
        b.iter(|| {
            let wanted = ByteRange::new(4 << 20, 12 << 20).expect("start <= end");
            let mut window = Window::new(0, wanted);
            let mut kept = 0;
            for chunk in &chunks {
                if let Some(piece) = window.cut(chunk.clone()) {
                    kept += piece.len();
                }
            }
            black_box(kept)
        })
    });
    group.finish();
}

criterion_group!(benches, parse_and_plan, window);
criterion_main!(benches);
