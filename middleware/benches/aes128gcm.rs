//! The aes128gcm stage beside raw `aes-gcm` over the same 64 KiB chunks, so their ratio is the
//! stage's overhead (target: the stage at 2 GB/s or more per core), and the decryptor.
//!
//!   cargo bench -p rangeway-middleware --bench aes128gcm -- --warm-up-time 1 --measurement-time 3
//!
//! `aes-gcm` picks AES-NI and PCLMULQDQ at run time; no target-feature flags are needed.

use std::hint::black_box;

use aes_gcm::{AeadInOut as _, Aes128Gcm, KeyInit as _};
use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rangeway_middleware::aes128gcm::{
    Aes128GcmFactory, DEFAULT_RECORD_SIZE, Decryptor, KeySet, parse_key_file,
};
use rangeway_middleware::chain::{ObjectVersion, StageContext, StageFactory};

mod support;
use support::CHUNK;

/// 16 MiB: 256 records at the default record size.
const TOTAL: usize = 16 << 20;
const OBJECT: ObjectVersion<'static> = ObjectVersion {
    route: "bench",
    path: "/object",
    strong_etag: Some("\"v1\""),
    len: TOTAL as u64,
};

fn keys() -> KeySet {
    parse_key_file("bench=AAECAwQFBgcICQoLDA0ODw").expect("valid key")
}

/// One pass of the stage over every chunk, told the input length (`Some`) or not.
fn run_stage(factory: &Aes128GcmFactory, chunks: &[Bytes], input_len: Option<u64>) -> usize {
    let context = StageContext { object: &OBJECT, input_len, input_identity: "", segments: &[] };
    let mut stage = factory.start(0, None, &context).expect("starts at 0");
    let mut out = 0;
    for chunk in chunks {
        out += stage.push(chunk.clone()).expect("encrypts").map_or(0, |bytes| bytes.len());
    }
    out + stage.finish().expect("encrypts").map_or(0, |bytes| bytes.len())
}

/// AES-128-GCM over each chunk in place, in one buffer; with `copy`, each chunk is copied in
/// first, as any stage must (its input `Bytes` are shared and immutable).
fn raw(cipher: &Aes128Gcm, chunks: &[Bytes], buffer: &mut [u8], copy: bool) {
    for (index, chunk) in chunks.iter().enumerate() {
        if copy {
            buffer.copy_from_slice(chunk);
        }
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&(index as u64).to_be_bytes());
        let tag = cipher
            .encrypt_inout_detached(&nonce.into(), &[], (&mut *buffer).into())
            .expect("a 64 KiB message is not too long");
        black_box(tag);
    }
}

fn aes128gcm(c: &mut Criterion) {
    let chunks = support::chunks(TOTAL);
    let keys = keys();
    let factory = Aes128GcmFactory::new(&keys, None, DEFAULT_RECORD_SIZE.into())
        .expect("valid configuration");
    let cipher = Aes128Gcm::new(&[7u8; 16].into());
    let mut buffer = vec![0u8; CHUNK];

    let mut group = c.benchmark_group("aes128gcm-64KiB-chunks");
    group.throughput(Throughput::Bytes(TOTAL as u64));
    group.bench_function("raw/in-place", |b| {
        b.iter(|| raw(&cipher, &chunks, &mut buffer, false));
    });
    group.bench_function("raw/copy-in-place", |b| {
        b.iter(|| raw(&cipher, &chunks, &mut buffer, true));
    });
    group.bench_function("stage/length-known", |b| {
        b.iter(|| black_box(run_stage(&factory, &chunks, Some(TOTAL as u64))));
    });
    group.bench_function("stage/length-unknown", |b| {
        b.iter(|| black_box(run_stage(&factory, &chunks, None)));
    });

    // The decryptor over the stage's output, fed in 64 KiB pieces.
    let context = StageContext {
        object: &OBJECT,
        input_len: Some(TOTAL as u64),
        input_identity: "",
        segments: &[],
    };
    let mut stage = factory.start(0, None, &context).expect("starts at 0");
    let mut ciphertext = Vec::new();
    for chunk in &chunks {
        ciphertext
            .extend_from_slice(&stage.push(chunk.clone()).expect("encrypts").unwrap_or_default());
    }
    ciphertext.extend_from_slice(&stage.finish().expect("encrypts").unwrap_or_default());
    let mut plaintext = Vec::with_capacity(TOTAL);
    group.bench_function("decryptor", |b| {
        b.iter(|| {
            plaintext.clear();
            let mut decryptor = Decryptor::new(&keys);
            for piece in ciphertext.chunks(CHUNK) {
                decryptor.push(piece, &mut plaintext).expect("authentic");
            }
            decryptor.finish(&mut plaintext).expect("complete");
            black_box(plaintext.len());
        });
    });
    group.finish();
}

criterion_group!(benches, aes128gcm);
criterion_main!(benches);
