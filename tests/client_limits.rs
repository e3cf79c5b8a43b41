//! What one client may cost: a header dribbled byte by byte is cut off, an address may hold only
//! so many connections, oversized headers are answered 431, a client that stops reading is cut
//! rather than held on to, and a GET or HEAD with a body (a request smuggled in it) is answered
//! 400 on a connection that ends there, the origin never asked.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::data::test_bytes;
use support::http::{Connection, RawRequest, get, get_until};
use support::origin::Origin;
use support::proxy::{Instance, Proxy, ProxyProcess};
use support::wait;

fn proxy(origin: &Origin, server_keys: &str) -> Proxy {
    Proxy::start_with_server(
        &format!(
            "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
            origin.base_url()
        ),
        server_keys,
    )
}

/// Reads until the server closes (or resets) the connection; what arrived.
fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn a_header_dribbled_byte_by_byte_is_cut_off() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(100, 1));
    let proxy = proxy(&origin, "client_header_timeout = \"1s\"");
    let mut stream = TcpStream::connect(proxy.addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let began = Instant::now();
    stream.write_all(b"GET /a.bin HTTP/1.1\r\n").expect("write");
    // One header byte every 200 ms: every read gets something, none waits out a read timeout.
    for byte in b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter().cycle().take(100) {
        // Deliberate: the dribble is the attack under test.
        std::thread::sleep(Duration::from_millis(200));
        if stream.write_all(&[*byte]).is_err() || began.elapsed() > Duration::from_secs(4) {
            break;
        }
    }
    let answer = read_to_close(&mut stream);
    let elapsed = began.elapsed();
    assert!(!answer.starts_with(b"HTTP/1.1 2"), "{}", String::from_utf8_lossy(&answer));
    assert!(elapsed >= Duration::from_millis(900), "cut before the deadline: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "not cut: {elapsed:?}");
    assert!(origin.requests().is_empty(), "nothing reached the origin");
    let metrics = String::from_utf8(get(&proxy.admin_url("/metrics"), &[]).body).expect("text");
    assert!(
        metrics.contains("rangeway_client_connections_refused_total{reason=\"header_timeout\"} 1"),
        "{metrics}"
    );

    // A client that sends its header at once, then waits before the next request on the same
    // connection, is not timed while it waits.
    let mut kept = TcpStream::connect(proxy.addr()).expect("connect");
    kept.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    for _ in 0..2 {
        kept.write_all(b"GET /a.bin HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
        let mut buf = vec![0u8; 4096];
        let n = kept.read(&mut buf).expect("an answer");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
        // Deliberate: idle longer than client_header_timeout (1 s) between two requests.
        std::thread::sleep(Duration::from_millis(1500));
    }
}

#[test]
fn a_get_or_head_with_a_body_is_refused_and_its_connection_closed() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(100, 2));
    let proxy = proxy(&origin, "");
    // Each body is a whole request, as an origin that reads no body on a GET would take it.
    let smuggled = "GET /a.bin HTTP/1.1\r\nHost: x\r\n\r\n";
    let chunked = format!("{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len());
    let length = format!("Content-Length: {}\r\n", smuggled.len());
    let cases = [
        ("GET", length.clone(), smuggled.to_owned()),
        ("HEAD", length.clone(), smuggled.to_owned()),
        ("GET", "Transfer-Encoding: chunked\r\n".to_owned(), chunked.clone()),
        ("HEAD", "Transfer-Encoding: chunked\r\n".to_owned(), chunked),
        // A coding that is not chunked still frames a body to some origins.
        ("GET", format!("Transfer-Encoding: gzip\r\n{length}"), smuggled.to_owned()),
    ];
    for (method, framing, body) in cases {
        let mut stream = TcpStream::connect(proxy.addr()).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let request = format!("{method} /a.bin HTTP/1.1\r\nHost: x\r\n{framing}\r\n{body}");
        stream.write_all(request.as_bytes()).expect("write");
        let began = Instant::now();
        let answer = String::from_utf8_lossy(&read_to_close(&mut stream)).into_owned();
        let case = format!("{method} with {framing:?}");
        assert!(answer.starts_with("HTTP/1.1 400 "), "{case}: {answer}");
        assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{case}: the body read: {answer}");
        assert!(answer.to_ascii_lowercase().contains("connection: close"), "{case}: {answer}");
        // Closed by rangeway, not by the read timeout.
        assert!(began.elapsed() < Duration::from_secs(5), "{case}: kept open");
    }
    assert_eq!(origin.requests().len(), 0, "a request with a body reached the origin");
    // No body: `Content-Length: 0` says so as well as no framing at all.
    let empty = RawRequest::get("/a.bin").header("Content-Length", "0");
    let served = Connection::open(proxy.addr()).expect("connect").send(&empty).expect("answer");
    assert_eq!(served.status, 200);
    assert_eq!(origin.requests().len(), 1);
}

/// A request header that is not HTTP is answered 400 — dated now, as every answer is (RFC 9110
/// §6.6.1) — on a connection that ends there, the origin never asked.
#[test]
fn a_header_that_is_not_http_is_answered_400_dated_now() {
    let origin = Origin::start();
    let proxy = proxy(&origin, "");
    let mut stream = TcpStream::connect(proxy.addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(b"GET /a.bin HTTP/1.1\r\nHost x\r\n\r\n").expect("write");
    let answer = String::from_utf8_lossy(&read_to_close(&mut stream)).into_owned();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    let date = answer
        .lines()
        .find_map(|line| line.strip_prefix("Date: ").or_else(|| line.strip_prefix("date: ")))
        .unwrap_or_else(|| panic!("no Date: {answer}"));
    let date = httpdate::parse_http_date(date).expect("an HTTP date");
    let off = date.elapsed().unwrap_or_default();
    assert!(off < Duration::from_secs(60), "dated {off:?} ago: {answer}");
    assert!(origin.requests().is_empty());
}

#[test]
fn one_address_holds_at_most_its_connections() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(100, 2));
    let proxy = proxy(&origin, "max_connections_per_client = 3");
    // Each answered, and kept open: each has its place in the address's count.
    let held: Vec<Connection> = (0..3)
        .map(|_| {
            let mut connection = Connection::open(proxy.addr()).expect("connect");
            let answer = connection.send(&RawRequest::get("/a.bin")).expect("an answer");
            assert_eq!(answer.status, 200);
            connection
        })
        .collect();
    let mut fourth = TcpStream::connect(proxy.addr()).expect("connect");
    fourth.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let answer = String::from_utf8(read_to_close(&mut fourth)).expect("text");
    assert!(answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{answer}");
    assert!(answer.ends_with("too many connections from your address\n"), "{answer}");
    // One closes: the address has room again.
    drop(held);
    let answer = get_until(&proxy.url("/a.bin"), |r| r.status == 200);
    assert_eq!(answer.status, 200, "never admitted again");
}

#[test]
fn oversized_headers_are_answered_431() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(100, 3));
    let proxy = proxy(&origin, "max_header_bytes = 4096\nmax_header_fields = 20");
    let many: Vec<(String, String)> = (0..21).map(|i| (format!("x-f{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    assert_eq!(get(&proxy.url("/a.bin"), &many).status, 431);
    let long = "a".repeat(5000);
    assert_eq!(get(&proxy.url("/a.bin"), &[("x-long", &long)]).status, 431);
    assert_eq!(get(&proxy.url("/a.bin"), &many[..10]).status, 200);
    assert!(origin.requests().len() == 1, "only the request within limits reached the origin");

    // The answer ends the connection, and says so.
    let mut connection = Connection::open(proxy.addr()).expect("connect");
    let mut oversized = RawRequest::get("/a.bin");
    for (name, value) in &many {
        oversized = oversized.header(name, value);
    }
    let refused = connection.send(&oversized).expect("the 431");
    assert_eq!(refused.status, 431);
    assert_eq!(refused.header("connection"), Some("close"));
    assert!(
        connection.send(&RawRequest::get("/a.bin")).is_err(),
        "the connection served another request"
    );
}

#[test]
fn a_client_that_stops_reading_is_cut() {
    let origin = Origin::start();
    let len = 64 * 1024 * 1024;
    origin.put("/big.bin", test_bytes(len, 4));
    let proxy = proxy(&origin, "client_write_timeout = \"1s\"");
    let mut stream = TcpStream::connect(proxy.addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    // Read a little, then nothing until rangeway gives up on the client: it does when its
    // writes stall longer than the write timeout, and counts the response once it has ended.
    let mut first = vec![0u8; 4096];
    let _ = stream.read(&mut first).expect("the answer begins");
    wait::until("the cut of a client that stopped reading", Duration::from_secs(10), || {
        (proxy.metric("rangeway_requests_total", "") >= 1).then_some(())
    });
    let rest = read_to_close(&mut stream);
    assert!(
        rest.len() < len / 2,
        "a client that stopped reading got {} of {len} bytes: it was never cut",
        rest.len()
    );
}

/// A connection cut for its slow header is counted, not logged at ERROR: one line per
/// connection would put the log's volume in the hands of whoever opens slow connections.
#[test]
fn slow_headers_do_not_fill_the_log() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(100, 5));
    let work = support::tmp::TempDir::new("slow-log");
    let log = work.join("rangeway.log");
    let process = ProxyProcess::start_logged(
        &format!(
            "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
            origin.base_url()
        ),
        &[("RANGEWAY__SERVER__CLIENT_HEADER_TIMEOUT", "1s")],
        &log,
    );
    let slow: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut stream = TcpStream::connect(process.addr()).expect("connect");
            stream.write_all(b"GET /a.bin HTTP/1.1\r\nX-Slow: a").expect("write");
            stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
            stream
        })
        .collect();
    for mut stream in slow {
        // Cut by the deadline, while the client still sends now and then: a deliberate pause.
        std::thread::sleep(Duration::from_millis(300));
        let _ = stream.write_all(b"a");
        read_to_close(&mut stream);
    }
    let counted = "rangeway_client_connections_refused_total";
    wait::until("the slow connections to be counted", wait::WITHIN, || {
        (process.metric(counted, "header_timeout") >= 5).then_some(())
    });
    // A request that does get through is logged as ever: the log is working.
    assert_eq!(get(&process.url("/a.bin"), &[]).status, 200);
    let text = wait::log_line(&log, "rangeway::access");
    assert!(!text.contains("ERROR"), "{text}");
    assert!(text.contains("rangeway::access"), "{text}");
}
