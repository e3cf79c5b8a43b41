//! Large untouched bodies go from the origin's socket to the client's by splice(2): every byte
//! arrives, ranges are the object's slices, the download is recorded for resume, and a client or
//! origin that goes away mid-body leaves rangeway serving the next request, and the client's
//! connection and the origin's are kept for the next. Small bodies, HEAD, multi-range answers and
//! routes with middleware are not spliced; the bodies of the last are read from the origin's
//! socket by rangeway, with the same guarantees.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;
use support::data::test_bytes;
use support::http::{Connection, RawRequest, Response, get_until, request};
use support::origin::{Behaviour, Origin};
use support::proxy::{Proxy, ProxyProcess};
use support::tmp::TempDir;
use support::wait;

const BIG: usize = 3 * 1024 * 1024 + 5;
const SMALL: usize = 100 * 1024;

/// The bytes spliced so far, once they are `expected` (or after a wait): rangeway counts them
/// when it logs a response, after the client has it all.
fn spliced_bytes(proxy: &Proxy, expected: u64) -> u64 {
    proxy.metric_at_least("rangeway_spliced_bytes_total", "", expected)
}

fn send(proxy: &Proxy, raw: RawRequest) -> Response {
    request(proxy.addr(), &raw).expect("request through rangeway")
}

fn setup() -> (Origin, Proxy, Vec<u8>, Vec<u8>) {
    let origin = Origin::start();
    let big = test_bytes(BIG, 5);
    let small = test_bytes(SMALL, 6);
    origin.put("/big.bin", big.clone());
    origin.put("/small.bin", small.clone());
    // Bodies the origin breaks off are not continued here: these tests are about what reaches
    // the client of a body that ends early (continuations: tests/upstream_resume.rs).
    let proxy = Proxy::start(&format!(
        "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"2s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\nupstream_resume = false\n\n[[routes]]\npath_prefix = \"/sum/\"\nupstream = \"origin\"\nstrip_prefix = true\nupstream_resume = false\n  [[routes.middleware]]\n  kind = \"checksum\"\n",
        origin.base_url()
    ));
    (origin, proxy, big, small)
}

#[test]
fn large_untouched_bodies_are_spliced_byte_for_byte() {
    let (origin, proxy, big, small) = setup();

    let whole = send(&proxy, RawRequest::get("/big.bin"));
    assert_eq!(whole.status, 200);
    assert!(whole.complete, "cut after {} bytes", whole.body.len());
    assert!(whole.body == big, "other bytes than the object's");
    assert_eq!(whole.header("content-length"), Some(BIG.to_string().as_str()));
    assert_eq!(spliced_bytes(&proxy, BIG as u64), BIG as u64);

    let mut expected = BIG as u64;
    for (range, slice) in [
        ("bytes=1000-2000999", 1000..2_001_000),
        ("bytes=-300000", BIG - 300_000..BIG),
        ("bytes=2000000-", 2_000_000..BIG),
    ] {
        let part = send(&proxy, RawRequest::get("/big.bin").header("Range", range));
        assert_eq!(part.status, 206, "{range}");
        assert!(part.complete, "{range}: cut");
        assert!(part.body == big[slice.clone()], "{range}: other bytes than the slice");
        assert_eq!(
            part.header("content-range"),
            Some(format!("bytes {}-{}/{BIG}", slice.start, slice.end - 1).as_str())
        );
        expected += slice.len() as u64;
        assert_eq!(spliced_bytes(&proxy, expected), expected, "{range}");
    }
    // The origin connection goes back to the pool after each: one connection served all four.
    let connections: Vec<u64> = origin.requests().iter().map(|r| r.connection).collect();
    assert_eq!(connections, [connections[0]; 4], "origin connections per request");

    // Below the threshold, HEAD, a multi-range answer and a route with middleware: not spliced.
    // Spliced or not, the answers follow each other on one kept-alive connection.
    let mut connection = Connection::open(proxy.addr()).expect("connect");
    let mut send_on = |raw: RawRequest| connection.send(&raw).expect("request on the connection");
    let spliced = send_on(RawRequest::get("/big.bin"));
    assert!(spliced.complete && spliced.body == big);
    assert_eq!(spliced.header("connection"), Some("keep-alive"));
    expected += BIG as u64;
    let kept = send_on(RawRequest::get("/small.bin"));
    assert!(kept.complete && kept.body == small);
    let head = send_on(RawRequest::head("/big.bin"));
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    let multi = send_on(RawRequest::get("/big.bin").header("Range", "bytes=0-9,-400000"));
    assert_eq!(multi.status, 206);
    assert!(multi.complete);
    let summed = send_on(RawRequest::get("/sum/big.bin"));
    assert!(summed.complete && summed.body == big);
    let spliced = send_on(RawRequest::get("/big.bin").header("Range", "bytes=5-"));
    assert!(spliced.complete && spliced.body == big[5..]);
    expected += BIG as u64 - 5;
    assert_eq!(spliced.header("connection"), Some("keep-alive"));
    assert_eq!(
        spliced_bytes(&proxy, expected),
        expected,
        "only the large plain bodies were spliced"
    );
    // The access record counts spliced bytes as any others.
    let body_bytes = proxy.metric_at_least("rangeway_response_body_bytes_total", "", expected);
    assert!(body_bytes >= expected, "{body_bytes} body bytes counted, {expected} spliced");
}

#[test]
fn a_spliced_download_is_recorded_for_resume() {
    let (_origin, proxy, big, _small) = setup();
    let whole = send(&proxy, RawRequest::get("/big.bin").header("X-Download-Id", "spliced"));
    assert!(whole.complete && whole.body == big);
    let record = get_until(&proxy.admin_url("/v1/downloads/spliced"), |r| r.status == 200);
    let record: Value = serde_json::from_slice(&record.body).expect("JSON");
    assert_eq!(record["complete"], true, "{record}");
    assert_eq!(record["delivered_bytes"], BIG as u64, "{record}");
}

#[test]
fn a_client_that_leaves_mid_body_is_recorded_and_the_next_is_served() {
    let (origin, proxy, big, _small) = setup();
    // Larger than the socket buffers between rangeway and the client can hold.
    const HUGE: usize = 32 * 1024 * 1024;
    origin.put("/huge.bin", test_bytes(HUGE, 7));
    let mut client = TcpStream::connect(proxy.addr()).expect("connect");
    client
        .write_all(b"GET /huge.bin HTTP/1.1\r\nHost: x\r\nX-Download-Id: left\r\n\r\n")
        .expect("send");
    let mut first = vec![0u8; 256 * 1024];
    client.read_exact(&mut first).expect("read the start");
    drop(client);

    let record = get_until(&proxy.admin_url("/v1/downloads/left"), |r| r.status == 200);
    let record: Value = serde_json::from_slice(&record.body).expect("JSON");
    assert_eq!(record["complete"], false, "{record}");
    let delivered = record["delivered_bytes"].as_u64().expect("delivered_bytes");
    assert!(delivered > 0 && delivered < HUGE as u64, "{record}");

    let next = send(&proxy, RawRequest::get("/big.bin"));
    assert!(next.complete && next.body == big);
}

#[test]
fn a_client_that_hangs_up_during_a_slow_copied_body_is_let_go_at_once() {
    let (origin, proxy, _big, _small) = setup();
    // 100 KiB, below the splicing threshold: relayed by copy, the rest 5 s after the first part.
    origin.set_global_behaviour(Behaviour::Slow { chunk: 70_000, delay: Duration::from_secs(5) });
    let mut client = TcpStream::connect(proxy.addr()).expect("connect");
    client.write_all(b"GET /small.bin HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    let mut start = [0u8; 1000];
    client.read_exact(&mut start).expect("the start of the answer");
    drop(client);
    let hung_up = std::time::Instant::now();
    // The response ends, and is recorded, when rangeway notices: not when the origin sends more.
    // rangeway_requests_total counts responses once finished, their access records written.
    while proxy.metric("rangeway_requests_total", "") == 0 {
        assert!(hung_up.elapsed() < Duration::from_secs(3), "the hang-up went unnoticed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_origin_that_breaks_off_mid_body_cuts_the_client_short_with_its_bytes() {
    let (origin, proxy, big, _small) = setup();
    // Spliced, and read from the origin's socket into the checksum route's chunks.
    for path in ["/big.bin", "/sum/big.bin"] {
        origin.set_global_behaviour(Behaviour::CutAfter(1_000_000));
        let cut = send(&proxy, RawRequest::get(path));
        assert_eq!(cut.status, 200, "{path}");
        assert!(!cut.complete, "{path}: a cut body was passed off as whole");
        assert_eq!(cut.body.len(), 1_000_000, "{path}");
        assert!(cut.body == big[..1_000_000], "{path}");

        // A silent origin: the read timeout (2 s) ends it the same way.
        origin.set_global_behaviour(Behaviour::Slow {
            chunk: 600_000,
            delay: Duration::from_secs(4),
        });
        let stalled = send(&proxy, RawRequest::get(path));
        assert!(!stalled.complete, "{path}");
        assert!(stalled.body == big[..stalled.body.len()], "{path}");

        origin.set_global_behaviour(Behaviour::Normal);
        let next = send(&proxy, RawRequest::get(path));
        assert!(next.complete && next.body == big, "{path}");
    }
}

#[test]
fn a_body_read_past_pingora_keeps_its_origin_connection() {
    let (origin, proxy, big, _small) = setup();
    // A route with middleware: its bodies are read from the origin's socket by rangeway once
    // pingora has handed over the first chunk, and the connection goes back to the pool.
    for _ in 0..3 {
        let summed = send(&proxy, RawRequest::get("/sum/big.bin"));
        assert!(summed.complete && summed.body == big, "{} bytes", summed.body.len());
    }
    let part = send(&proxy, RawRequest::get("/sum/big.bin").header("Range", "bytes=1000-2000999"));
    assert_eq!(part.status, 206);
    assert!(part.complete && part.body == big[1000..2_001_000]);
    let connections: Vec<u64> = origin.requests().iter().map(|r| r.connection).collect();
    assert_eq!(connections, [connections[0]; 4], "origin connections per request");
    // A chunked body has no length to read to: pingora reads it, all of it.
    origin.set_global_behaviour(Behaviour::Chunked);
    let chunked = send(&proxy, RawRequest::get("/sum/big.bin"));
    assert!(chunked.complete && chunked.body == big);
    proxy.metric_at_least("rangeway_requests_total", "", 5);
    assert_eq!(spliced_bytes(&proxy, 0), 0, "a route with middleware is not spliced");
}

#[test]
fn a_middleware_route_reads_the_body_past_pingora() {
    let origin = Origin::start();
    let big = test_bytes(BIG, 7);
    origin.put("/big.bin", big.clone());
    origin.set_global_behaviour(Behaviour::CutAfter(2_000_000));
    let logs = TempDir::new("splice-log");
    let log = logs.join("rangeway.log");
    let process = ProxyProcess::start_logged(
        &format!(
            "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\nupstream_resume = false\n  [[routes.middleware]]\n  kind = \"checksum\"\n",
            origin.base_url()
        ),
        &[],
        &log,
    );
    let cut = request(process.addr(), &RawRequest::get("/big.bin")).expect("request");
    assert!(!cut.complete && cut.body == big[..2_000_000], "{} bytes", cut.body.len());
    // The end of the body was seen by rangeway's own reader, past the first 64 KiB that pingora
    // reads: pingora's reader words an early close otherwise.
    let text = wait::log_line(&log, "rangeway::access");
    assert!(text.contains("the origin closed the connection before the end of the body"), "{text}");
}
