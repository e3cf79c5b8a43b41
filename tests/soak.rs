//! Soak: mixed load on every route kind for a while, with clients that abort downloads at random
//! bytes, against rangeway as a process of its own; its memory stays flat, it leaks no file
//! descriptors, and every request that was not aborted gets exactly the right bytes.
//!
//! 15 seconds in a local `cargo test`, 60 in CI (`.ci/run` sets `RANGEWAY_SOAK_SECS=60`);
//! `RANGEWAY_SOAK_SECS=600 cargo test --release --test soak -- --nocapture` is the long run.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::clients::sha256_hex;
use support::data::test_bytes;
use support::http::{Response, get};
use support::nginx::{Nginx, NginxOptions};
use support::proxy::ProxyProcess;
use support::tmp::TempDir;

const LARGE: usize = 8 * 1024 * 1024 + 333;
const KEYS: &str = "k1=AAECAwQFBgcICQoLDA0ODw\n";
const WORKERS: u64 = 6;

/// VmRSS and open descriptors of process `pid`.
fn footprint(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("/proc fd").count();
    (rss_kib * 1024, fds)
}

/// A small deterministic generator for the workers' choices.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// Asks for `path` and hangs up after `bytes` of the answer.
fn abort_after(addr: std::net::SocketAddr, path: &str, bytes: usize) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: soak\r\n\r\n").expect("write");
    let mut got = 0;
    let mut buf = [0u8; 65536];
    while got < bytes {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
}

#[test]
fn mixed_load_with_aborts_keeps_memory_and_descriptors_flat() {
    let seconds: u64 =
        std::env::var("RANGEWAY_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let root = TempDir::new("soak-root");
    let large = test_bytes(LARGE, 31);
    std::fs::write(root.join("large.bin"), &large).expect("write");
    std::fs::write(root.join("small.bin"), b"sixteen bytes..\n").expect("write");
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let keys = root.join("keys");
    std::fs::write(&keys, KEYS).expect("keys");
    let route = |prefix: &str, extra: &str| {
        format!(
            "[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n{extra}\n"
        )
    };
    let body = [
        format!("[upstreams.origin]\nurl = \"{}\"\n", nginx.base_url()),
        route("/plain/", ""),
        route("/resume/", "upstream_resume = true"),
        route("/sum/", "  [[routes.middleware]]\n  kind = \"checksum\""),
        route(
            "/enc/",
            &format!(
                "  [[routes.middleware]]\n  kind = \"checksum\"\n  [[routes.middleware]]\n  kind = \
                 \"aes128gcm\"\n  key_file = \"{}\"",
                keys.display()
            ),
        ),
        route("/gz/", "  [[routes.middleware]]\n  kind = \"gzip\"\n  level = 1"),
    ]
    .concat();
    let proxy = ProxyProcess::start(&body);
    let pid = proxy.pid();
    let addr = proxy.addr();

    // The representations, whole, once: what every later answer must equal.
    let reference = |path: &str| {
        let answer = get(&proxy.url(path), &[]);
        assert_eq!(answer.status, 200, "{path}");
        Arc::new(answer.body)
    };
    let want_large = sha256_hex(&large);
    let encrypted = reference("/enc/large.bin");
    let gzipped = reference("/gz/large.bin");
    assert_eq!(sha256_hex(&reference("/plain/large.bin")), want_large);

    let stop = Arc::new(AtomicBool::new(false));
    let (requests, aborts, errors) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let workers: Vec<_> = (0..WORKERS)
        .map(|n| {
            let (stop, requests, aborts, errors) =
                (stop.clone(), requests.clone(), aborts.clone(), errors.clone());
            let (large, want_large) = (large.clone(), want_large.clone());
            let (encrypted, gzipped) = (encrypted.clone(), gzipped.clone());
            let url = move |path: &str| format!("http://{addr}{path}");
            std::thread::spawn(move || {
                let mut dice = Dice(0x9E37_79B9_7F4A_7C15 ^ (n + 1));
                let check = |ok: bool, what: &str| {
                    requests.fetch_add(1, Ordering::Relaxed);
                    if !ok {
                        errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("soak: wrong answer to {what}");
                    }
                };
                let whole = |r: &Response| r.status == 200 && r.complete;
                while !stop.load(Ordering::Relaxed) {
                    match dice.roll(10) {
                        0 | 1 => {
                            let prefix = ["/plain/", "/resume/", "/sum/"][dice.roll(3) as usize];
                            let r = get(&url(&format!("{prefix}large.bin")), &[]);
                            check(whole(&r) && sha256_hex(&r.body) == want_large, prefix);
                        }
                        2 | 3 => {
                            let prefix =
                                ["/plain/", "/resume/", "/enc/", "/gz/"][dice.roll(4) as usize];
                            let at = dice.roll(LARGE as u64) as usize;
                            abort_after(addr, &format!("{prefix}large.bin"), at);
                            aborts.fetch_add(1, Ordering::Relaxed);
                        }
                        4..=6 => {
                            let r = get(&url("/plain/small.bin"), &[]);
                            check(whole(&r) && r.body == b"sixteen bytes..\n", "small");
                        }
                        7 => {
                            let start = dice.roll(LARGE as u64 - (1 << 20)) as usize;
                            let end = start + (1 << 20) - 1;
                            let range = format!("bytes={start}-{end}");
                            let r = get(&url("/plain/large.bin"), &[("range", &range)]);
                            check(r.status == 206 && r.body == large[start..=end], "range");
                        }
                        8 => {
                            let r = get(&url("/enc/large.bin"), &[]);
                            check(whole(&r) && r.body == *encrypted, "encrypted");
                        }
                        _ => {
                            let r = get(&url("/gz/large.bin"), &[]);
                            check(r.status == 200 && r.complete && r.body == *gzipped, "gzip");
                        }
                    }
                }
            })
        })
        .collect();

    let began = Instant::now();
    let warm_up = Duration::from_secs((seconds / 6).max(5));
    std::thread::sleep(warm_up);
    let (start_rss, start_fds) = footprint(pid);
    let mut peak_rss = start_rss;
    while began.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(500));
        peak_rss = peak_rss.max(footprint(pid).0);
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().expect("a worker panicked");
    }
    // Let connections the workers dropped be noticed and closed.
    std::thread::sleep(Duration::from_secs(2));
    let (end_rss, end_fds) = footprint(pid);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "soak {seconds}s: {} requests checked, {} aborted, {} wrong; RSS after warm-up {:.1} MiB, \
         end {:.1} MiB, peak {:.1} MiB; fds after warm-up {start_fds}, end {end_fds}",
        requests.load(Ordering::Relaxed),
        aborts.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        mib(start_rss),
        mib(end_rss),
        mib(peak_rss),
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0, "wrong answers to requests not aborted");
    // That the load ran, not how fast: a debug build on a busy machine checks few answers a
    // second, and speed is the benches' to measure.
    assert!(requests.load(Ordering::Relaxed) >= 3 * WORKERS, "the load ran");
    assert!(end_fds <= start_fds + 4, "descriptors leaked: {start_fds} -> {end_fds}");
    assert!(
        end_rss <= start_rss + (64 << 20),
        "memory grew: {:.1} -> {:.1} MiB",
        mib(start_rss),
        mib(end_rss)
    );
}
