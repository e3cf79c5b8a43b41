//! Transparent upstream resume: an origin that cuts bodies at random bytes, stalls mid-body and
//! answers continuations with 503s; rangeway continues every body from where it broke, on
//! passthrough, checksum, aes128gcm and gzip routes, and every client gets the same bytes as from
//! a healthy origin. Where the origin does not recover, or the object changes, the client's
//! response is cut: never padded, never spliced.

mod support;

use std::process::Command;
use std::time::Duration;

use support::clients::{pipe, sha256_hex};
use support::data::test_bytes;
use support::http::{Response, get};
use support::origin::{Behaviour, Faults, Origin};
use support::proxy::Proxy;
use support::redis::RedisServer;
use support::tmp::TempDir;

const LEN: usize = 300 * 1024 + 17;
const ROUTES: [&str; 4] = ["/plain/", "/sum/", "/enc/", "/gz/"];
const KEYS: &str = "k1=AAECAwQFBgcICQoLDA0ODw\n";

fn config(origin: &Origin, key_file: &std::path::Path, resume: &str, state: &str) -> String {
    let route = |prefix: &str, middleware: &str| {
        format!(
            "[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n\
             upstream_resume = {resume}\n{middleware}\n"
        )
    };
    [
        format!(
            "{state}\n[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"300ms\"\n",
            origin.base_url()
        ),
        route("/plain/", ""),
        route("/sum/", "  [[routes.middleware]]\n  kind = \"checksum\"\n"),
        route(
            "/enc/",
            &format!(
                "  [[routes.middleware]]\n  kind = \"aes128gcm\"\n  key_file = \"{}\"\n",
                key_file.display()
            ),
        ),
        route(
            "/gz/",
            "  [[routes.middleware]]\n  kind = \"gzip\"\n  level = 1\n  block_size = 65536\n",
        ),
    ]
    .concat()
}

fn metric(proxy: &Proxy, outcome: &str) -> u64 {
    proxy.metric("rangeway_upstream_resumes_total", outcome)
}

fn whole(response: &Response) -> &[u8] {
    assert_eq!(response.status, 200);
    assert!(response.complete, "the response was cut");
    &response.body
}

#[test]
fn two_hundred_downloads_through_a_faulty_origin_all_arrive_whole() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 21);
    origin.put("/obj.bin", object.clone());
    let work = TempDir::new("upstream-resume");
    let key_file = work.join("keys");
    std::fs::write(&key_file, KEYS).expect("write keys");
    let mut redis = RedisServer::start();
    let state = redis.state_section();
    let resume = "{ attempts = 40, deadline = \"30s\", backoff = \"1ms\" }";
    let proxy = Proxy::start(&config(&origin, &key_file, resume, &state));

    // What a healthy origin gives, each representation checked by a decoder of its own.
    let reference: Vec<Vec<u8>> = ROUTES
        .iter()
        .map(|route| whole(&get(&proxy.url(&format!("{route}obj.bin")), &[])).to_vec())
        .collect();
    assert_eq!(reference[0], object);
    assert_eq!(reference[1], object);
    let plain = pipe(
        Command::new(env!("CARGO_BIN_EXE_rangeway")).args(["decrypt", "--key-file"]).arg(&key_file),
        &reference[2],
    );
    assert_eq!(plain, object, "the encrypted representation decrypts");
    assert_eq!(pipe(Command::new("gzip").arg("-dc"), &reference[3]), object);

    origin.set_global_behaviour(Behaviour::Faulty(Faults {
        seed: 7,
        error_percent: 30,
        cut_percent: 35,
        stall_percent: 5,
        stall: Duration::from_millis(600),
    }));
    let mut downloads = 0;
    for round in 0..50 {
        if round == 25 {
            // The store goes away half way: nothing about continuing a body needs it.
            redis.kill();
        }
        for (route, want) in ROUTES.iter().zip(&reference) {
            let got = get(&proxy.url(&format!("{route}obj.bin")), &[]);
            assert_eq!(got.status, 200, "{route} round {round}");
            assert!(got.complete, "{route} round {round}: cut after {} bytes", got.body.len());
            assert_eq!(sha256_hex(&got.body), sha256_hex(want), "{route} round {round}");
            downloads += 1;
        }
    }
    assert_eq!(downloads, 200);
    let resumed = metric(&proxy, "outcome=\"resumed\"");
    let failed = metric(&proxy, "outcome=\"failed\"") + metric(&proxy, "outcome=\"changed\"");
    println!("200 downloads through a faulty origin: {resumed} continuations, {failed} failures");
    assert!(resumed >= 50, "the origin broke off bodies often: {resumed} continuations");
    assert_eq!(failed, 0);
    // The passthrough route's bodies went by splice, continuations included.
    let spliced =
        proxy.metric_at_least("rangeway_spliced_bytes_total", "route=\"/plain/\"", 50 * LEN as u64);
    println!("spliced on /plain/: {spliced} bytes");
    assert!(spliced >= 50 * LEN as u64, "{spliced} bytes spliced on /plain/");
}

#[test]
fn an_origin_that_does_not_recover_cuts_the_response_and_never_pads_it() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 22);
    origin.put("/obj.bin", object.clone());
    let work = TempDir::new("upstream-resume-down");
    let key_file = work.join("keys");
    std::fs::write(&key_file, KEYS).expect("write keys");
    let resume = "{ attempts = 3, deadline = \"2s\", backoff = \"10ms\" }";
    let proxy = Proxy::start(&config(&origin, &key_file, resume, ""));
    // Every body is cut, every continuation refused.
    origin.set_global_behaviour(Behaviour::Faulty(Faults {
        seed: 9,
        error_percent: 100,
        cut_percent: 100,
        stall_percent: 0,
        stall: Duration::ZERO,
    }));
    for route in ROUTES {
        let got = get(&proxy.url(&format!("{route}obj.bin")), &[]);
        assert!(!got.complete, "{route}: a body the origin never finished came out whole");
        if route == "/plain/" || route == "/sum/" {
            assert!(got.body.len() < LEN && object.starts_with(&got.body), "{route}: wrong bytes");
        }
    }
    assert!(metric(&proxy, "outcome=\"failed\"") >= 4);
}

#[test]
fn an_object_replaced_mid_download_cuts_the_response_never_splices_it() {
    let origin = Origin::start();
    let old = test_bytes(LEN, 23);
    origin.put("/obj.bin", old.clone());
    let work = TempDir::new("upstream-resume-change");
    let key_file = work.join("keys");
    std::fs::write(&key_file, KEYS).expect("write keys");
    // A long backoff leaves time to replace the object before the continuation is sent.
    let resume = "{ attempts = 3, deadline = \"10s\", backoff = \"700ms\" }";
    let proxy = Proxy::start(&config(&origin, &key_file, resume, ""));
    origin.set_behaviour("/obj.bin", Behaviour::CutAfter(100_000));
    let url = proxy.url("/plain/obj.bin");
    let client = std::thread::spawn(move || get(&url, &[]));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while origin.requests().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    origin.put("/obj.bin", test_bytes(LEN, 24));
    origin.clear_behaviour("/obj.bin");
    let got = client.join().expect("the client thread");
    assert!(!got.complete, "a download of two versions came out whole");
    assert_eq!(got.body, old[..got.body.len()], "only bytes of the version it began with");
    let continuation = origin.requests().into_iter().nth(1).expect("a continuation was asked");
    assert_eq!(continuation.header("range"), Some(format!("bytes=100000-{}", LEN - 1).as_str()));
    assert!(continuation.header("if-match").is_some());
    assert_eq!(metric(&proxy, "outcome=\"changed\""), 1);
}
