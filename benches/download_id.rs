//! What deriving a download id costs on this CPU, beside what callgrind counts for it.
//!
//!   cargo bench --bench download_id -- --warm-up-time 1 --measurement-time 3
//!
//! Side by side, for one request (curl's User-Agent, an IPv4 client, a short path): the id
//! (AES-128-CMAC from the key's saved schedule), the HMAC-SHA-256 ids were derived with before
//! (two compressions from the key's saved states), a plain SHA-256 of the same parts (one
//! compression), and pingora building the request the id is derived from — the ratio of the
//! first to the last is what the id adds to a request's header work, natively.
//! `benches/load/instructions.sh` weighs SHA-256 about five times its native cost (valgrind's
//! virtual CPU has no SHA extensions, so sha2 runs its portable code there); it has AES's.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use hmac::{Hmac, KeyInit as _, Mac as _};
use pingora_http::RequestHeader;
use rangeway::fingerprint::{FingerprintKey, fingerprint};
use rangeway::proxy::download::download_id;
use sha2::Sha256;

const CLIENT: &str = "192.0.2.17";
const AGENT: &str = "curl/8.14.1";
const OBJECT: &str = "files|/releases/image-2026.12.iso";

fn curl_request() -> RequestHeader {
    let mut request = RequestHeader::build("GET", b"/releases/image-2026.12.iso", Some(4))
        .expect("a valid request");
    for (name, value) in [("host", "mirror.example"), ("user-agent", AGENT), ("accept", "*/*")] {
        request.insert_header(name, value).expect("a valid field");
    }
    request
}

fn ids(c: &mut Criterion) {
    let key = FingerprintKey::new(b"a deployment's key, 32 bytes lo");
    let request = curl_request();
    let mut group = c.benchmark_group("download_id");
    group.bench_function("derived id (AES-128-CMAC)", |b| {
        b.iter(|| download_id(black_box(&request), Some(CLIENT), OBJECT, &key))
    });
    group.bench_function("HMAC-SHA-256 of the same parts (the id before)", |b| {
        let keyed = <Hmac<Sha256>>::new_from_slice(b"a deployment's key, 32 bytes lo")
            .expect("HMAC takes any key");
        b.iter(|| {
            let mut mac = keyed.clone();
            for (i, part) in [CLIENT, AGENT, OBJECT].into_iter().enumerate() {
                if i > 0 {
                    mac.update(&[0]);
                }
                mac.update(black_box(part.as_bytes()));
            }
            mac.finalize().into_bytes()
        })
    });
    group.bench_function("SHA-256 of the same parts", |b| {
        let parts = [CLIENT.as_bytes(), AGENT.as_bytes(), OBJECT.as_bytes()];
        b.iter(|| fingerprint(black_box(parts), 16))
    });
    group.bench_function("pingora builds the request", |b| b.iter(curl_request));
    group.finish();
}

criterion_group!(benches, ids);
criterion_main!(benches);
