//! Upstreams with replicas (`urls = [...]`): requests go round them, a replica that cannot be
//! reached is passed over, one that fails its health check gets no requests until it passes, and
//! a body one replica breaks off is continued from another holding the same version.

mod support;

use std::time::{Duration, Instant};

use support::clients::sha256_hex;
use support::data::test_bytes;
use support::http::get;
use support::origin::{Behaviour, Origin};
use support::proxy::Proxy;
use support::wait;

/// rangeway in front of `origins` as replicas: `/` continues broken bodies (rangeway's own
/// client), `/plain/` is proxied by pingora.
fn replicated(origins: &[&Origin], extra: &str) -> Proxy {
    let urls: Vec<String> = origins.iter().map(|o| format!("\"{}\"", o.base_url())).collect();
    Proxy::start(&format!(
        "[upstreams.pool]\nurls = [{}]\nconnect_timeout = \"500ms\"\nread_timeout = \"2s\"\n{extra}\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"pool\"\nupstream_resume = {{ attempts = 5, backoff = \"10ms\" }}\n\n[[routes]]\npath_prefix = \"/plain/\"\nupstream = \"pool\"\nstrip_prefix = true\n",
        urls.join(", ")
    ))
}

fn gets(origin: &Origin, path: &str) -> usize {
    origin.requests().iter().filter(|r| r.target == path).count()
}

#[test]
fn requests_go_round_the_replicas_and_pass_over_one_that_is_gone() {
    let (a, b) = (Origin::start(), Origin::start());
    let object = test_bytes(100_000, 61);
    for origin in [&a, &b] {
        origin.put("/obj.bin", object.clone());
    }
    let proxy = replicated(&[&a, &b], "");
    for _ in 0..10 {
        assert_eq!(get(&proxy.url("/obj.bin"), &[]).body, object);
    }
    assert!(gets(&a, "/obj.bin") >= 3 && gets(&b, "/obj.bin") >= 3, "both take requests");

    drop(a);
    let began = Instant::now();
    for path in ["/obj.bin", "/plain/obj.bin"].into_iter().cycle().take(20) {
        let answer = get(&proxy.url(path), &[]);
        assert_eq!((answer.status, answer.body == object), (200, true), "{path}");
    }
    assert!(began.elapsed() < Duration::from_secs(5), "failover took {:?}", began.elapsed());
}

#[test]
fn a_body_one_replica_breaks_off_is_continued_from_another() {
    let (a, b) = (Origin::start(), Origin::start());
    let object = test_bytes(1_000_000, 62);
    let etag = a.put("/big.bin", object.clone());
    assert_eq!(b.put("/big.bin", object.clone()), etag, "the replicas hold the same version");
    a.set_behaviour("/big.bin", Behaviour::CutAfter(100_000));
    let proxy = replicated(&[&a, &b], "");
    for _ in 0..4 {
        let answer = get(&proxy.url("/big.bin"), &[]);
        assert!(answer.complete, "cut after {} bytes", answer.body.len());
        assert_eq!(sha256_hex(&answer.body), sha256_hex(&object));
    }
    let continued = b.requests().into_iter().find(|r| r.header("range").is_some());
    let continued = continued.expect("B continued a body A broke off");
    assert_eq!(continued.header("range"), Some("bytes=100000-999999"));
    assert_eq!(continued.header("if-match"), Some(etag.as_str()));
}

#[test]
fn a_replica_failing_its_health_check_gets_no_requests_until_it_passes() {
    let (a, b) = (Origin::start(), Origin::start());
    for origin in [&a, &b] {
        origin.put("/obj.bin", test_bytes(1000, 63));
        origin.put("/health", b"ok\n".to_vec());
    }
    let check = "  [upstreams.pool.health_check]\n  path = \"/health\"\n  interval = \"100ms\"\n  timeout = \"500ms\"";
    let proxy = replicated(&[&a, &b], check);
    a.set_behaviour("/health", Behaviour::Status(503));
    a.clear_requests();
    // A round of checks ends before the next begins: a second check since the 503s began means
    // the first was answered 503 and the replica marked down.
    wait::until("a check of A answered 503", wait::WITHIN, || {
        (gets(&a, "/health") >= 2).then_some(())
    });
    a.clear_requests();
    for _ in 0..10 {
        assert_eq!(get(&proxy.url("/obj.bin"), &[]).status, 200);
    }
    assert_eq!(gets(&a, "/obj.bin"), 0, "a replica failing its check got requests");
    let checked = gets(&a, "/health");
    wait::until("A to be checked again (it is still checked)", wait::WITHIN, || {
        (gets(&a, "/health") > checked).then_some(())
    });

    a.clear_behaviour("/health");
    let deadline = Instant::now() + Duration::from_secs(5);
    while gets(&a, "/obj.bin") == 0 {
        assert!(Instant::now() < deadline, "the replica never came back");
        assert_eq!(get(&proxy.url("/obj.bin"), &[]).status, 200);
        std::thread::sleep(Duration::from_millis(50));
    }
}
