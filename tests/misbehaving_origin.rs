//! rangeway in front of an origin that gets ranges wrong on purpose: whatever the origin does, the
//! client gets either the exact bytes it asked for or an error — never other bytes passed off as
//! its range.

mod support;

use std::time::Duration;

use support::data::test_bytes;
use support::http::{Connection, RawRequest, request};
use support::origin::{Behaviour, Origin};
use support::proxy::{Proxy, ProxyProcess};

const LEN: usize = 300_000;

fn setup(behaviour: Behaviour) -> (Origin, Proxy, Vec<u8>) {
    let origin = Origin::start();
    let object = test_bytes(LEN, 7);
    origin.put("/obj.bin", object.clone());
    origin.set_global_behaviour(behaviour);
    let proxy = Proxy::in_front_of(&origin.base_url());
    (origin, proxy, object)
}

fn get(proxy: &Proxy, headers: &[(&str, &str)]) -> support::http::Response {
    let mut raw = RawRequest::get("/obj.bin");
    for (name, value) in headers {
        raw = raw.header(name, value);
    }
    request(proxy.addr(), &raw).expect("request through the proxy")
}

#[test]
fn an_origin_that_ignores_range_is_sliced() {
    let (origin, proxy, object) = setup(Behaviour::IgnoreRange);
    for (range, start, end) in [
        ("bytes=100-199", 100, 200),
        ("bytes=-10", LEN - 10, LEN),
        ("bytes=299990-", LEN - 10, LEN),
    ] {
        let response = get(&proxy, &[("Range", range)]);
        assert_eq!(response.status, 206, "{range}");
        assert_eq!(
            response.header("content-range"),
            Some(format!("bytes {start}-{}/{LEN}", end - 1).as_str())
        );
        assert_eq!(response.body, object[start..end], "{range}");
        assert!(response.complete);
    }
    let response = get(&proxy, &[("Range", "bytes=0-0,1000-1000")]);
    assert_eq!(response.status, 206);
    assert_eq!(support::multipart::parts(&response).len(), 2);
    let response = get(&proxy, &[("Range", "bytes=400000-")]);
    assert_eq!(response.status, 416);
    assert_eq!(response.header("content-range"), Some(format!("bytes */{LEN}").as_str()));
    // What the proxy asked for: the client's single range, as it was.
    assert!(origin.requests().iter().any(|r| r.header("range") == Some("bytes=100-199")));
    let metrics = support::http::get(&proxy.admin_url("/metrics"), &[]);
    assert!(
        String::from_utf8_lossy(&metrics.body)
            .contains("rangeway_upstream_ignored_range_total{route=\"/\"} 3")
    );
}

#[test]
fn a_wrong_range_is_never_passed_off() {
    let (_origin, proxy, _object) = setup(Behaviour::WrongRange(5));
    let response = get(&proxy, &[("Range", "bytes=100-199")]);
    assert_eq!(response.status, 502);
    assert!(response.body.is_empty());
    assert!(response.header("x-rangeway-error").unwrap().contains("does not cover"));
}

/// A request rangeway fails (its origin refuses the connection) is answered 502, and the
/// connection, which that answer says is kept, carries the client's next request.
#[test]
fn a_failed_request_keeps_the_connection_it_says_it_keeps() {
    let nobody = format!("http://127.0.0.1:{}", support::ports::free_port());
    let proxy = Proxy::in_front_of(&nobody);
    let mut connection = Connection::open(proxy.addr()).expect("connect to the proxy");
    for attempt in ["first", "second, on the same connection"] {
        let failed = connection.send(&RawRequest::get("/obj.bin")).expect(attempt);
        assert_eq!(failed.status, 502, "{attempt}");
        assert_ne!(failed.header("connection"), Some("close"), "{attempt}");
    }
}

#[test]
fn a_cut_body_ends_the_client_connection_short() {
    let (_origin, proxy, object) = setup(Behaviour::CutAfter(1000));
    let response = get(&proxy, &[]);
    assert!(!response.complete, "a truncated upstream body must not look complete");
    assert!(response.body.len() < LEN);
    assert_eq!(response.body, object[..response.body.len()]);
    let response = get(&proxy, &[("Range", "bytes=5000-")]);
    assert!(!response.complete);
}

#[test]
fn upstream_errors_are_forwarded() {
    let (_origin, proxy, _object) = setup(Behaviour::Status(503));
    let response = get(&proxy, &[("Range", "bytes=0-1")]);
    assert_eq!(response.status, 503);
}

#[test]
fn a_slow_origin_is_waited_for_and_a_stalled_one_times_out() {
    let (_origin, proxy, object) =
        setup(Behaviour::Slow { chunk: 100_000, delay: Duration::from_millis(200) });
    let response = get(&proxy, &[("Range", "bytes=1-250000")]);
    assert_eq!(response.status, 206);
    assert_eq!(response.body, object[1..250_001]);

    // read_timeout is 5 s in these tests: an origin that stalls longer is given up on — after
    // the continuations the route allows (by default, 30 s of them; 2 s here).
    let origin = Origin::start();
    origin.put("/obj.bin", test_bytes(LEN, 7));
    origin.set_global_behaviour(Behaviour::Slow { chunk: 1000, delay: Duration::from_secs(8) });
    let proxy = Proxy::start(&format!(
        "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\nupstream_resume = {{ deadline = \"2s\" }}\n",
        origin.base_url()
    ));
    let started = std::time::Instant::now();
    let response = get(&proxy, &[]);
    assert!(!response.complete);
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
}

#[test]
fn chunked_and_validator_less_origins() {
    let (_origin, proxy, object) = setup(Behaviour::Chunked);
    let response = get(&proxy, &[("Range", "bytes=10-19")]);
    assert_eq!(response.status, 206);
    assert_eq!(response.body, object[10..20]);

    let (_origin, proxy, object) = setup(Behaviour::NoEtag);
    let response = get(&proxy, &[("Range", "bytes=10-19")]);
    assert_eq!(response.status, 206);
    assert_eq!(response.body, object[10..20]);
    assert_eq!(response.header("etag"), None);
}

#[test]
fn the_upstream_gets_a_sanitised_range_and_forwarding_headers() {
    let (origin, proxy, object) = setup(Behaviour::Normal);
    // Two ranges become one covering range upstream; the client still gets its two parts.
    let response =
        get(&proxy, &[("Range", "bytes=0-1,5000-5001"), ("X-Forwarded-For", "10.1.2.3")]);
    assert_eq!(response.status, 206);
    let parts = support::multipart::parts(&response);
    assert_eq!(parts[1].body, object[5000..5002]);
    // Garbage never reaches the origin.
    let response = get(&proxy, &[("Range", "bytes=99999999999999999999-")]);
    assert_eq!(response.status, 200);
    let requests = origin.requests();
    assert_eq!(requests[0].header("range"), Some("bytes=0-5001"));
    assert_eq!(requests[0].header("x-forwarded-for"), Some("10.1.2.3, 127.0.0.1"));
    assert_eq!(requests[0].header("via"), Some("1.1 rangeway"));
    assert_eq!(requests[1].header("range"), None);
    // Connections to the origin are reused.
    assert_eq!(requests[0].connection, requests[1].connection);
}

#[test]
fn bad_requests_get_clear_statuses() {
    let (origin, proxy, _object) = setup(Behaviour::Normal);
    for (method, target, status) in [
        ("GET", "/a/../obj.bin", 400),
        ("GET", "/%2e%2e/etc/passwd", 400),
        ("GET", "/a%00b", 400),
        ("GET", "/a%5cb", 400),
        ("POST", "/obj.bin", 405),
        ("DELETE", "/obj.bin", 405),
    ] {
        let response = request(proxy.addr(), &RawRequest::new(method, target)).unwrap();
        assert_eq!(response.status, status, "{method} {target}");
    }
    assert!(origin.requests().is_empty(), "nothing bad reaches the origin");
}

/// An origin that publishes a digest its bytes do not match: the client never gets a complete
/// download of those bytes; a matching digest changes nothing. (A range cut out of a whole answer
/// reaches its client before the pass ends, so only whole bodies can be held back.)
#[test]
fn bodies_are_checked_against_the_digest_their_origin_published() {
    use base64::Engine as _;
    let origin = Origin::start();
    let object = test_bytes(LEN, 9);
    let right = base64::engine::general_purpose::STANDARD
        .encode(<sha2::Sha256 as sha2::Digest>::digest(&object));
    let wrong = base64::engine::general_purpose::STANDARD.encode([0u8; 32]);
    origin.put_with_headers(
        "/good.bin",
        object.clone(),
        &[("Repr-Digest", &format!("sha-256=:{right}:"))],
    );
    origin.put_with_headers(
        "/bad.bin",
        object.clone(),
        &[("Repr-Digest", &format!("sha-256=:{wrong}:"))],
    );
    origin.put_with_headers("/bad-s3.bin", object.clone(), &[("x-amz-checksum-sha256", &wrong)]);
    let crc = |value: u32| base64::engine::general_purpose::STANDARD.encode(value.to_be_bytes());
    let object_crc = crc32fast::hash(&object);
    origin.put_with_headers(
        "/good-crc.bin",
        object.clone(),
        &[("x-amz-checksum-crc32", &crc(object_crc))],
    );
    origin.put_with_headers(
        "/bad-crc.bin",
        object.clone(),
        &[("x-amz-checksum-crc32", &crc(object_crc ^ 1))],
    );
    let proxy = Proxy::in_front_of(&origin.base_url());

    for path in ["/good.bin", "/good-crc.bin"] {
        let good = request(proxy.addr(), &RawRequest::get(path)).expect("GET");
        assert_eq!((good.status, good.complete), (200, true), "{path}");
        assert_eq!(good.body, object, "{path}");
    }
    for path in ["/bad.bin", "/bad-s3.bin", "/bad-crc.bin"] {
        let bad = request(proxy.addr(), &RawRequest::get(path)).expect("GET");
        // Refused before the headers went out (502), or cut short after: never a whole 200.
        let refused = bad.status == 502 || (bad.status == 200 && !bad.complete);
        assert!(
            refused,
            "{path}: {} with {} bytes, complete: {}",
            bad.status,
            bad.body.len(),
            bad.complete
        );
        assert!(bad.body.len() < LEN);
        assert_ne!(bad.body, object);
    }
    // Every refusal is counted.
    let counted = "rangeway_origin_digest_mismatches_total{route=\"/\"} 3";
    let metrics = support::http::get_until(&proxy.admin_url("/metrics"), |r| {
        String::from_utf8_lossy(&r.body).contains(counted)
    });
    assert!(String::from_utf8_lossy(&metrics.body).contains(counted));
}

/// Interim answers before the final one (RFC 9110 §15.2): 100 Continue, 102 Processing and 103
/// Early Hints (which CDNs send) are not the answer. Each path a GET can take — spliced, read by
/// rangeway for a route's stages, cut to a range — and a HEAD serves the final response. A 103
/// is relayed to the HTTP/1.1 client before it, its `Link` kept; 100 and 102, which answer the
/// origin's request and not the client's, are not.
#[test]
fn interim_answers_before_the_final_one_are_not_the_answer() {
    for status in [100, 102, 103] {
        let (origin, proxy, object) = setup(Behaviour::Interim(status));
        let whole = get(&proxy, &[]);
        assert_eq!((whole.status, whole.complete), (200, true), "{status}");
        assert!(whole.body == object, "{status}: the whole body");
        let relayed: Vec<u16> = whole.interim.iter().map(|(status, _)| *status).collect();
        if status == 103 {
            assert_eq!(relayed, [103], "the early hints, before the answer");
            let link = whole.interim[0].1.iter().find(|(name, _)| name == "link");
            assert_eq!(link.map(|(_, value)| value.as_str()), Some("</hint.css>; rel=preload"));
        } else {
            assert!(relayed.is_empty(), "{status} is the origin's own");
        }
        let ranged = get(&proxy, &[("Range", "bytes=1000-2999")]);
        assert_eq!(ranged.status, 206, "{status}");
        assert_eq!(ranged.body, object[1000..3000], "{status}");
        let head = request(proxy.addr(), &RawRequest::head("/obj.bin")).expect("HEAD");
        assert_eq!(head.status, 200, "{status}");
        assert_eq!(head.header("content-length"), Some(LEN.to_string().as_str()), "{status}");

        let checksum = Proxy::start(&format!(
            "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n[[routes.middleware]]\nkind = \"checksum\"\nalgorithms = [\"sha256\"]\n",
            origin.base_url()
        ));
        let response = get(&checksum, &[]);
        assert_eq!((response.status, response.complete), (200, true), "{status}");
        assert!(response.body == object, "{status}: through the stages");
    }
}

/// The request line and Host as RFC 9112 has them: an HTTP/1.1 request without Host is 400
/// (§3.2); a target in absolute form is served, routed by its authority (§3.2.2; pingora refuses
/// one whose Host says otherwise, stricter than the RFC's "ignore Host"); requests pipelined on
/// one connection are all answered, in order (§9.3.2), on every path a GET can take.
#[test]
fn request_lines_and_hosts_as_rfc_9112_has_them() {
    let (origin, proxy, object) = setup(Behaviour::Normal);
    let send = |head: &str| {
        let mut connection = Connection::open(proxy.addr()).expect("connect");
        connection.send_raw("GET", head).expect("an answer")
    };
    assert_eq!(send("GET /obj.bin HTTP/1.1\r\nRange: bytes=0-9\r\n\r\n").status, 400);
    assert_eq!(send("GET /obj.bin HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n").status, 400);
    assert!(origin.requests().is_empty(), "nothing bad reaches the origin");
    let old = send("GET /obj.bin HTTP/1.0\r\nRange: bytes=0-9\r\n\r\n");
    assert_eq!((old.status, &old.body[..]), (206, &object[..10]), "HTTP/1.0 needs no Host");
    let absolute = send("GET http://files.example/obj.bin HTTP/1.1\r\nHost: files.example\r\n\r\n");
    assert_eq!(absolute.status, 200);
    assert!(absolute.body == object);
    let conflicting = send("GET http://files.example/obj.bin HTTP/1.1\r\nHost: other\r\n\r\n");
    assert_eq!(conflicting.status, 400, "pingora refuses a Host that contradicts the target");

    // Pipelined: a range, the whole object (spliced), a HEAD (pingora's own path), a range.
    let mut connection = Connection::open(proxy.addr()).expect("connect");
    let requests = [
        RawRequest::get("/obj.bin").header("Range", "bytes=0-9"),
        RawRequest::get("/obj.bin"),
        RawRequest::head("/obj.bin"),
        RawRequest::get("/obj.bin").header("Range", "bytes=10-19"),
    ];
    let answers = connection.pipeline(&requests).expect("every pipelined request answered");
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [206, 200, 200, 206]);
    assert_eq!(answers[0].body, object[..10]);
    assert!(answers[1].body == object);
    assert_eq!(answers[3].body, object[10..20]);
}

/// An If-Range date (RFC 9110 §13.1.5) is judged once, by rangeway's rule (stricter than an
/// origin's exact match: a date is not trusted beside an entity tag, nor within a minute of the
/// change), and only what it decided goes upstream; the answer is never refused for the origin
/// having applied its own rule (this was a 502).
#[test]
fn if_range_dates_are_decided_once() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 12);
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    origin.put_modified("/tagged.bin", object.clone(), &[], an_hour_ago);
    origin.put_modified("/dated.bin", object.clone(), &[], an_hour_ago);
    origin.set_behaviour("/dated.bin", Behaviour::NoEtag);
    let proxy = Proxy::in_front_of(&origin.base_url());
    let date = httpdate::fmt_http_date(an_hour_ago);
    let ask = |path: &str, date: &str| {
        origin.clear_requests();
        let raw = RawRequest::get(path).header("Range", "bytes=0-9").header("If-Range", date);
        let response = request(proxy.addr(), &raw).expect("an answer");
        let upstream: Vec<(Option<String>, Option<String>)> = origin
            .requests()
            .iter()
            .map(|r| {
                (r.header("range").map(str::to_owned), r.header("if-range").map(str::to_owned))
            })
            .collect();
        (response, upstream)
    };

    // Beside an entity tag a date is not trusted: the whole object, asked for whole, each time.
    for _ in 0..2 {
        let (response, upstream) = ask("/tagged.bin", &date);
        assert_eq!(response.status, 200, "{:?}", response.header("x-rangeway-error"));
        assert!(response.body == object);
        assert_eq!(upstream, [(None, None)]);
    }
    // Without one, the date holds: first cut from the whole object (nothing was known of it),
    // then asked for with the date, which the origin confirms.
    let (response, upstream) = ask("/dated.bin", &date);
    assert_eq!((response.status, &response.body[..]), (206, &object[..10]));
    assert_eq!(upstream, [(None, None)]);
    // What the store learned of the object is recorded after the answer went out, before the
    // request is counted.
    assert_eq!(proxy.metric_at_least("rangeway_requests_total", "", 3), 3);
    let (response, upstream) = ask("/dated.bin", &date);
    assert_eq!((response.status, &response.body[..]), (206, &object[..10]));
    assert_eq!(upstream, [(Some("bytes=0-9".to_owned()), Some(date.clone()))]);
    // Another date: the whole object.
    let other = httpdate::fmt_http_date(an_hour_ago - Duration::from_secs(60));
    let (response, _) = ask("/dated.bin", &other);
    assert_eq!(response.status, 200);
    assert!(response.body == object);
}

/// The access line's `upstream_ms` is what the upstream took to answer, on every way a request
/// takes (it read ~0 on the relay's, stamped after the answer's header came).
#[test]
fn the_access_line_says_what_the_upstream_took() {
    let origin = Origin::start();
    origin.put("/obj.bin", test_bytes(LEN, 14));
    origin.set_global_behaviour(Behaviour::Delayed(Duration::from_millis(300)));
    let work = support::tmp::TempDir::new("upstream-ms");
    let log = work.join("rangeway.log");
    let body = format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        origin.base_url()
    );
    let process = ProxyProcess::start_logged(&body, &[], &log);
    for (target, transport) in [("bytes=0-9", "relay"), ("bytes=0-", "splice")] {
        let raw = RawRequest::get("/obj.bin").header("Range", target);
        assert_eq!(request(process.addr(), &raw).expect("an answer").status, 206);
        let line = wait_for_access_line(&log, &format!("transport=\"{transport}\""))
            .or_else(|| wait_for_access_line(&log, &format!("transport={transport}")))
            .unwrap_or_else(|| {
                panic!(
                    "no {transport} line in {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        let upstream_ms: f64 = line
            .split_whitespace()
            .find_map(|field| field.strip_prefix("upstream_ms="))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("no upstream_ms in {line}"));
        assert!((300.0..3000.0).contains(&upstream_ms), "{transport}: {line}");
    }
}

/// The first access line of `file` containing `needle`, within 5 s.
fn wait_for_access_line(file: &std::path::Path, needle: &str) -> Option<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if let Some(line) =
            text.lines().find(|l| l.contains("rangeway::access") && l.contains(needle))
        {
            return Some(line.to_owned());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
