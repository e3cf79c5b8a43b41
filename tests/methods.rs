//! Methods other than GET and HEAD, on a route that lets them through (`methods`): curl's
//! uploads reach a real origin byte for byte (SHA-256 compared there), chunked or not, with
//! `Expect: 100-continue` answered; a body over `max_request_body` is refused with 413 and one
//! that stalls with 408; a method the route does not take gets 405 and what it does take; a
//! replica down at connect time is passed over, and a request whose origin breaks after its body
//! went is never sent again. A successful unsafe request invalidates what the slice cache holds
//! for its target, its `Location` and its `Content-Location` (RFC 9111 §4.4); a failed one
//! nothing.

mod support;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use support::clients::{ClientRun, run, sha256_hex};
use support::data::test_bytes;
use support::http::{Connection, RawRequest, Response, get, request};
use support::origin::{Behaviour, Origin, RecordedRequest};
use support::proxy::Proxy;
use support::tmp::TempDir;

const MIB: usize = 1024 * 1024;

/// rangeway in front of `urls` (replicas of one upstream), the route `/` letting POST, PUT and
/// DELETE through, with `server` keys and `extra` config (a `[cache]`, say).
fn proxy(urls: &[String], server: &str, extra: &str) -> Proxy {
    let urls: Vec<String> = urls.iter().map(|url| format!("\"{url}\"")).collect();
    Proxy::start_with_server(
        &format!(
            "{extra}\n[upstreams.origin]\nurls = [{}]\nconnect_timeout = \"500ms\"\n\
             read_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n\
             methods = [\"POST\", \"PUT\", \"DELETE\"]\n",
            urls.join(", ")
        ),
        server,
    )
}

/// `curl -sS -v -o - -w '\n%{http_code}' ARGS`: its answer's status, body, and what it said
/// (`-v`: the interim answers it got).
fn curl(args: &[&str]) -> (u16, String, ClientRun) {
    let mut command = Command::new("curl");
    command.args(["-sS", "-v", "-o", "-", "-w", "\n%{http_code}"]).args(args);
    let ran = run(command, Duration::from_secs(120));
    ran.assert_success();
    let (body, status) = ran.stdout.rsplit_once('\n').unwrap_or_default();
    let status = status.parse().unwrap_or_else(|_| panic!("a status: {ran}"));
    (status, body.to_owned(), ran)
}

/// Writes `bytes` as `name` in `dir`, for curl to upload.
fn file(dir: &TempDir, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write the upload");
    path.display().to_string()
}

/// The requests of `method` for `target` the origin received.
fn received(origin: &Origin, method: &str, target: &str) -> Vec<RecordedRequest> {
    origin.requests().into_iter().filter(|r| r.method == method && r.target == target).collect()
}

#[test]
fn large_uploads_reach_the_origin_byte_for_byte_after_100_continue() {
    let origin = Origin::start();
    origin.set_global_behaviour(Behaviour::TakesBodies(Vec::new()));
    let proxy = proxy(&[origin.base_url()], "", "");
    let dir = TempDir::new("methods-upload");
    let upload = test_bytes(64 * MIB, 71);
    let path = file(&dir, "upload.bin", &upload);
    let sha = sha256_hex(&upload);
    for (method, args) in [
        ("POST", vec!["--data-binary".to_owned(), format!("@{path}")]),
        ("PUT", vec!["-T".to_owned(), path.clone()]),
    ] {
        let target = format!("/{method}.bin");
        let url = proxy.url(&target);
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.push(&url);
        let (status, body, ran) = curl(&args);
        assert_eq!(status, 200, "{method}: {ran}");
        // curl asks to continue for a body over 1 MiB, and waits a second for the answer.
        assert!(ran.stderr.contains("HTTP/1.1 100 Continue"), "{method}: {ran}");
        assert_eq!(body, format!("{} {sha}", upload.len()), "{method}");
        let got = received(&origin, method, &target);
        assert_eq!(got.len(), 1, "{method}: sent once");
        assert_eq!((got[0].body_len, got[0].body_sha256.as_str()), (upload.len() as u64, &*sha));
        assert_eq!(got[0].header("expect"), None, "rangeway answered the expectation itself");
    }
}

#[test]
fn a_chunked_upload_goes_on_chunked() {
    let origin = Origin::start();
    origin.set_global_behaviour(Behaviour::TakesBodies(Vec::new()));
    let proxy = proxy(&[origin.base_url()], "", "");
    let dir = TempDir::new("methods-chunked");
    let upload = test_bytes(3 * MIB + 17, 72);
    let data = format!("@{}", file(&dir, "chunked.bin", &upload));
    let url = proxy.url("/chunked.bin");
    let chunked =
        ["-H", "Transfer-Encoding: chunked", "--data-binary", data.as_str(), url.as_str()];
    let (status, body, ran) = curl(&chunked);
    assert_eq!(status, 200, "{ran}");
    assert_eq!(body, format!("{} {}", upload.len(), sha256_hex(&upload)));
    let got = received(&origin, "POST", "/chunked.bin");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("transfer-encoding"), Some("chunked"));
    assert_eq!(got[0].header("content-length"), None);
    assert_eq!(got[0].body_len, upload.len() as u64);
}

#[test]
fn a_body_over_max_request_body_is_refused_with_413() {
    let origin = Origin::start();
    origin.set_global_behaviour(Behaviour::TakesBodies(Vec::new()));
    let proxy = proxy(&[origin.base_url()], "max_request_body = \"1MiB\"\n", "");
    let dir = TempDir::new("methods-413");
    let data = format!("@{}", file(&dir, "big.bin", &test_bytes(2 * MIB, 73)));
    let url = proxy.url("/big.bin");
    // Declared: refused before the body is asked for, and before the origin is.
    let (status, _, ran) = curl(&["--data-binary", &data, &url]);
    assert_eq!(status, 413, "{ran}");
    assert!(!ran.stderr.contains("100 Continue"), "no body invited for a refusal: {ran}");
    assert!(origin.requests().is_empty(), "{:?}", origin.requests());
    // Chunked: cut where it grows past the limit.
    let chunked =
        ["-H", "Transfer-Encoding: chunked", "--data-binary", data.as_str(), url.as_str()];
    let (status, _, ran) = curl(&chunked);
    assert_eq!(status, 413, "{ran}");
    assert!(origin.requests().iter().all(|r| r.body_len <= MIB as u64), "never all of it");
    // Within the limit, the same route takes it.
    let small = format!("@{}", file(&dir, "small.bin", &test_bytes(MIB, 74)));
    assert_eq!(curl(&["--data-binary", &small, &url]).0, 200);
}

#[test]
fn a_stalled_body_is_answered_408_and_its_connection_closed() {
    let origin = Origin::start();
    origin.set_global_behaviour(Behaviour::TakesBodies(Vec::new()));
    let proxy = proxy(&[origin.base_url()], "client_body_timeout = \"1s\"\n", "");
    let mut connection = Connection::open(proxy.addr()).expect("connect");
    let head = format!(
        "POST /stalled.bin HTTP/1.1\r\nHost: {}\r\nContent-Length: 1000\r\n\r\n",
        proxy.addr()
    );
    connection.write_raw(head.as_bytes()).expect("the header");
    connection.write_raw(&[7u8; 500]).expect("half the body");
    let answer = connection.send_raw("POST", "").expect("an answer");
    assert_eq!(answer.status, 408);
    assert_eq!(answer.header("connection"), Some("close"));
    assert!(connection.closed_within(Duration::from_secs(5)).expect("closed"));
    assert!(received(&origin, "POST", "/stalled.bin").is_empty(), "the origin never got it whole");
}

#[test]
fn a_method_the_route_does_not_take_gets_405_with_what_it_takes() {
    let origin = Origin::start();
    let proxy = proxy(&[origin.base_url()], "", "");
    // A body declared and waiting for `100 Continue`: none comes, and the connection ends.
    let patch = RawRequest::new("PATCH", "/obj.bin")
        .header("Host", &proxy.addr().to_string())
        .header("Content-Length", "5")
        .header("Expect", "100-continue");
    let answer = request(proxy.addr(), &patch).expect("an answer");
    assert_eq!(answer.status, 405);
    assert_eq!(answer.header("allow"), Some("GET, HEAD, POST, PUT, DELETE"));
    assert_eq!(answer.header("connection"), Some("close"));
    for method in ["OPTIONS", "TRACE", "CONNECT"] {
        let answer = request(proxy.addr(), &RawRequest::new(method, "/obj.bin")).expect("answer");
        assert_eq!(answer.status, 405, "{method}");
    }
    assert!(origin.requests().is_empty());
}

#[test]
fn a_replica_down_at_connect_time_is_passed_over_before_anything_is_sent() {
    let live = Origin::start();
    live.set_global_behaviour(Behaviour::TakesBodies(Vec::new()));
    // A port nothing listens on: connecting to it is refused.
    let down = TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("its address");
    let proxy = proxy(&[format!("http://{down}"), live.base_url()], "", "");
    for n in 0..4 {
        let body = format!("upload {n}");
        let (status, answer, ran) = curl(&["--data-binary", &body, &proxy.url("/up.bin")]);
        assert_eq!(status, 200, "{ran}");
        assert_eq!(answer, format!("{} {}", body.len(), sha256_hex(body.as_bytes())));
    }
    assert_eq!(received(&live, "POST", "/up.bin").len(), 4, "each sent once, to the live one");
}

#[test]
fn a_post_whose_origin_breaks_after_its_body_is_not_sent_again() {
    let (a, b) = (Origin::start(), Origin::start());
    for origin in [&a, &b] {
        origin.set_global_behaviour(Behaviour::HangUp);
    }
    let proxy = proxy(&[a.base_url(), b.base_url()], "", "");
    let (status, _, ran) = curl(&["--data-binary", "once only", &proxy.url("/order")]);
    assert_eq!(status, 502, "{ran}");
    let sent: Vec<RecordedRequest> =
        [&a, &b].iter().flat_map(|origin| received(origin, "POST", "/order")).collect();
    assert_eq!(sent.len(), 1, "no second attempt, on either replica: {sent:?}");
    assert_eq!(sent[0].body_len, 9);
}

/// rangeway with a slice cache in `dir` in front of `origin`, and three cacheable objects there:
/// fresh for an hour, so that a second GET is a hit.
fn cached(origin: &Origin, dir: &Path) -> Proxy {
    let ten_days_ago = SystemTime::now() - Duration::from_secs(10 * 86_400);
    for path in ["/obj.bin", "/a.bin", "/b.bin"] {
        let fresh = [("Cache-Control", "max-age=3600")];
        origin.put_modified(path, test_bytes(200_000, 75), &fresh, ten_days_ago);
    }
    let cache = format!("[cache]\ndir = \"{}\"\nslice_size = \"1MiB\"\n", dir.display());
    proxy(&[origin.base_url()], "", &cache)
}

/// GETs `path` until it is a hit: the cache holds it.
fn hit(proxy: &Proxy, path: &str) -> Response {
    let mut answer = get(&proxy.url(path), &[]);
    for _ in 0..3 {
        if answer.header("x-rangeway-cache") == Some("hit") {
            break;
        }
        answer = get(&proxy.url(path), &[]);
    }
    assert_eq!(answer.header("x-rangeway-cache"), Some("hit"), "{path}");
    answer
}

/// The GETs and HEADs the origin received for `path`.
fn fetched(origin: &Origin, path: &str) -> usize {
    origin.requests().iter().filter(|r| r.target == path && r.method != "POST").count()
}

#[test]
fn a_successful_post_invalidates_its_target() {
    let origin = Origin::start();
    let dir = TempDir::new("methods-invalidate");
    let proxy = cached(&origin, dir.path());
    hit(&proxy, "/obj.bin");
    let before = fetched(&origin, "/obj.bin");
    origin.set_behaviour("/obj.bin", Behaviour::TakesBodies(Vec::new()));
    assert_eq!(curl(&["--data-binary", "changed", &proxy.url("/obj.bin")]).0, 200);
    let after = get(&proxy.url("/obj.bin"), &[]);
    assert_eq!(after.status, 200);
    assert_ne!(after.header("x-rangeway-cache"), Some("hit"));
    assert!(fetched(&origin, "/obj.bin") > before, "the next GET reached the origin");
}

#[test]
fn a_successful_post_invalidates_its_location_and_content_location() {
    let origin = Origin::start();
    let dir = TempDir::new("methods-locations");
    let proxy = cached(&origin, dir.path());
    for path in ["/a.bin", "/b.bin"] {
        hit(&proxy, path);
    }
    let before = (fetched(&origin, "/a.bin"), fetched(&origin, "/b.bin"));
    let elsewhere = format!("http://{}/b.bin", origin.addr());
    let fields = vec![
        ("Location".to_owned(), "/a.bin".to_owned()),
        ("Content-Location".to_owned(), elsewhere),
    ];
    origin.set_behaviour("/orders", Behaviour::TakesBodies(fields));
    assert_eq!(curl(&["--data-binary", "new", &proxy.url("/orders")]).0, 200);
    for path in ["/a.bin", "/b.bin"] {
        assert_ne!(get(&proxy.url(path), &[]).header("x-rangeway-cache"), Some("hit"), "{path}");
    }
    assert!(fetched(&origin, "/a.bin") > before.0 && fetched(&origin, "/b.bin") > before.1);
}

#[test]
fn a_failed_post_invalidates_nothing() {
    let origin = Origin::start();
    let dir = TempDir::new("methods-failed");
    let proxy = cached(&origin, dir.path());
    hit(&proxy, "/obj.bin");
    let before = fetched(&origin, "/obj.bin");
    for status in [403, 500] {
        origin.set_behaviour("/obj.bin", Behaviour::Status(status));
        assert_eq!(curl(&["--data-binary", "x", &proxy.url("/obj.bin")]).0, status);
        origin.clear_behaviour("/obj.bin");
        assert_eq!(get(&proxy.url("/obj.bin"), &[]).header("x-rangeway-cache"), Some("hit"));
    }
    assert_eq!(fetched(&origin, "/obj.bin"), before, "the origin was asked for it no more");
}
