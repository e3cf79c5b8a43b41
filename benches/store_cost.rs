//! What the state store adds to a resumed request: the latency of ranged GETs of a known download
//! through rangeway with the embedded memory store and with a local redis-server, side by side.
//!
//!   cargo bench --bench store_cost             (2000 requests per store; `-- N` for another count)
//!
//! Each request is a resume (`Range: bytes=N-M`, 4 KiB) of one download (`X-Download-Id`), so every
//! one does the store lookup before going upstream and the store write after answering. Printed:
//! p50/p99/mean per store and the difference. Under `cargo test` it only checks that it runs.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use support::data::test_bytes;
use support::http::{Connection, RawRequest};
use support::origin::Origin;
use support::proxy::Proxy;
use support::redis::RedisServer;

fn measure(proxy: &Proxy, requests: usize) -> Vec<Duration> {
    let mut connection = Connection::open(proxy.addr()).expect("connect to rangeway");
    let mut latencies = Vec::with_capacity(requests);
    for i in 0..requests {
        let start = (i % 1000) * 4096;
        let request = RawRequest::get("/obj.bin")
            .header("Host", "bench")
            .header("X-Download-Id", "bench-download")
            .header("Range", &format!("bytes={start}-{}", start + 4095));
        let began = Instant::now();
        let response = connection.send(&request).expect("ranged GET");
        latencies.push(began.elapsed());
        assert_eq!(response.status, 206);
    }
    latencies.sort_unstable();
    latencies
}

fn summary(name: &str, latencies: &[Duration]) -> (Duration, Duration) {
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let mean = latencies.iter().sum::<Duration>() / latencies.len() as u32;
    println!(
        "{name:<8} p50 {:>8.1?}  p99 {:>8.1?}  mean {:>8.1?}  ({} requests)",
        at(0.5),
        at(0.99),
        mean,
        latencies.len()
    );
    (at(0.5), at(0.99))
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let requests = std::env::args().filter_map(|a| a.parse().ok()).next().unwrap_or(if benching {
        2000
    } else {
        20
    });
    let origin = Origin::start();
    origin.put("/obj.bin", test_bytes(8 * 1024 * 1024, 5));
    let redis = RedisServer::start();
    let body = |state: &str| {
        format!(
            "{state}\n[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
            origin.base_url()
        )
    };
    let memory = Proxy::start(&body("[state]\nbackend = \"memory\""));
    let shared = Proxy::start(&body(&redis.state_section()));
    // Warm both (connections to origin and Redis, first session write).
    measure(&memory, 50);
    measure(&shared, 50);
    let (m50, m99) = summary("memory", &measure(&memory, requests));
    let (r50, r99) = summary("redis", &measure(&shared, requests));
    println!(
        "redis adds p50 {:+.3} ms, p99 {:+.3} ms per resumed request (one lookup before, one write after)",
        r50.as_secs_f64() * 1e3 - m50.as_secs_f64() * 1e3,
        r99.as_secs_f64() * 1e3 - m99.as_secs_f64() * 1e3
    );
}
