//! rangeway behind a balancer sees the real client: a real HAProxy sending the PROXY protocol v2
//! (`send-proxy-v2`) in front of the plain and the TLS listener, and headers a test writes
//! itself, make the access line and the per-address connection limit see the client rather than
//! the balancer; a connection without the header is closed; `X-Forwarded-For` is believed from a
//! trusted peer only. The admin listener refuses a `Host` it is not (DNS rebinding).
//!
//! Second clients on the same machine come from other loopback addresses (127.0.0.2, 127.0.0.3),
//! which Linux routes to `lo` without setup.

mod support;

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::clients::{CLIENT_TIMEOUT, run};
use support::data::test_bytes;
use support::haproxy::Haproxy;
use support::http::{Connection, RawRequest, request};
use support::origin::Origin;
use support::ports::free_port;
use support::proxy::{Instance, Proxy, ProxyProcess};
use support::tls::TestPki;
use support::tmp::TempDir;
use support::wait;

/// The PROXY protocol v2 signature (the header's first 12 bytes).
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// Upstreams and a route to `origin`, with the log as JSON lines.
fn body(origin: &Origin) -> String {
    format!(
        "[log]\nformat = \"json\"\n\n[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\n\
         path_prefix = \"/\"\nupstream = \"origin\"\n",
        origin.base_url()
    )
}

/// rangeway as a process logging JSON lines to `log`, with `server_keys`.
fn logged(origin: &Origin, server_keys: &str, log: &Path) -> ProxyProcess {
    ProxyProcess::start_logged_with(&body(origin), server_keys, &[], log)
}

/// The access lines of the log, as JSON, once there are `count` of them.
fn access_lines(log: &Path, count: usize) -> Vec<Value> {
    let parse = |text: &str| -> Vec<Value> {
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["target"] == "rangeway::access")
            .collect()
    };
    let text = wait::log_until(log, &format!("{count} access lines"), wait::WITHIN, |text| {
        parse(text).len() >= count
    });
    parse(&text)
}

/// A PROXY v2 header for a TCP connection from `source` to `destination`; LOCAL without them.
fn v2_header(command: u8, addresses: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    let mut block = Vec::new();
    let family = match addresses {
        Some((SocketAddr::V4(source), SocketAddr::V4(destination))) => {
            block.extend_from_slice(&source.ip().octets());
            block.extend_from_slice(&destination.ip().octets());
            block.extend_from_slice(&source.port().to_be_bytes());
            block.extend_from_slice(&destination.port().to_be_bytes());
            0x11
        }
        Some((SocketAddr::V6(source), SocketAddr::V6(destination))) => {
            block.extend_from_slice(&source.ip().octets());
            block.extend_from_slice(&destination.ip().octets());
            block.extend_from_slice(&source.port().to_be_bytes());
            block.extend_from_slice(&destination.port().to_be_bytes());
            0x21
        }
        Some(_) => panic!("source and destination of one family"),
        None => 0x00,
    };
    let mut header = V2_SIGNATURE.to_vec();
    header.push(0x20 | command);
    header.push(family);
    header.extend_from_slice(
        &u16::try_from(block.len()).expect("a short address block").to_be_bytes(),
    );
    header.extend_from_slice(&block);
    header
}

/// Reads until the server closes the connection; what arrived.
fn read_to_close(connection: &mut Connection) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = connection.stream().read_to_end(&mut got);
    got
}

#[test]
fn behind_haproxy_the_client_is_the_one_haproxy_names() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(1000, 1));
    let work = TempDir::new("behind-haproxy");
    let log = work.join("rangeway.log");
    let process = logged(&origin, "proxy_protocol = true\nmax_connections_per_client = 1\n", &log);
    let haproxy = Haproxy::send_proxy_v2_to(process.addr());
    let get = RawRequest::get("/a.bin").header("Host", "downloads.example");

    // 127.0.0.2 holds its one connection open, kept alive.
    let mut held = Connection::open_from(loopback(2), haproxy.addr(), b"").expect("connect");
    let answer = held.send(&get).expect("a response");
    assert_eq!((answer.status, answer.body.len()), (200, 1000));
    // Its second is refused; a client at another address is not, though every connection
    // reaches rangeway from HAProxy's one address.
    // (Answered before its request is read: nothing is sent, so that no unread request makes
    // the close a reset.)
    let mut second = Connection::open_from(loopback(2), haproxy.addr(), b"").expect("connect");
    let refused = String::from_utf8(read_to_close(&mut second)).unwrap();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    let mut other = Connection::open_from(loopback(3), haproxy.addr(), b"").expect("connect");
    assert_eq!(other.send(&get).expect("a response").status, 200);
    assert_eq!(process.metric("rangeway_client_connections_refused_total", "per_client_limit"), 1);

    let lines = access_lines(&log, 2);
    let clients: Vec<&str> = lines.iter().map(|line| line["client"].as_str().unwrap()).collect();
    assert!(clients[0].starts_with("127.0.0.2:"), "{lines:?}");
    assert!(clients[1].starts_with("127.0.0.3:"), "{lines:?}");
    // The client's own port, not HAProxy's connection's.
    assert_eq!(
        clients[0].rsplit(':').next().unwrap(),
        held.stream().local_addr().unwrap().port().to_string()
    );
    assert!(lines.iter().all(|line| line.get("forwarded_by").is_none()), "{lines:?}");
}

#[test]
fn behind_haproxy_a_tls_listener_reads_the_header_before_the_handshake() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(5000, 2));
    let pki = TestPki::new();
    let tls_port = free_port();
    let localhost = pki.localhost();
    let tls = format!(
        "[tls]\nlisten = \"127.0.0.1:{tls_port}\"\n\n[[tls.certificates]]\ncert_file = \"{}\"\n\
         key_file = \"{}\"\n\n",
        localhost.cert.display(),
        localhost.key.display()
    );
    let work = TempDir::new("behind-haproxy-tls");
    let log = work.join("rangeway.log");
    let _process = ProxyProcess::start_logged_with(
        &format!("{tls}{}", body(&origin)),
        "proxy_protocol = true\n",
        &[],
        &log,
    );
    support::ports::wait_for_port(
        SocketAddr::from(([127, 0, 0, 1], tls_port)),
        std::time::Duration::from_secs(20),
    )
    .expect("the TLS listener listens");
    let haproxy = Haproxy::send_proxy_v2_to(SocketAddr::from(([127, 0, 0, 1], tls_port)));
    let port = haproxy.addr().port();
    let saved = work.join("a.bin");
    let mut curl = Command::new("curl");
    curl.arg("-sS")
        .arg("--fail")
        .arg("--cacert")
        .arg(pki.ca_cert())
        .args(["--interface", "127.0.0.2", "--resolve", &format!("localhost:{port}:127.0.0.1")])
        .arg("-o")
        .arg(&saved)
        .arg(format!("https://localhost:{port}/a.bin"));
    run(curl, CLIENT_TIMEOUT).assert_success();
    assert_eq!(std::fs::read(&saved).unwrap(), test_bytes(5000, 2));
    let lines = access_lines(&log, 1);
    let client = lines[0]["client"].as_str().unwrap();
    assert!(client.starts_with("127.0.0.2:"), "{lines:?}");
}

#[test]
fn written_headers_name_the_client_and_a_connection_without_one_is_closed() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(100, 3));
    let work = TempDir::new("proxy-header");
    let log = work.join("rangeway.log");
    let process = logged(&origin, "proxy_protocol = true\n", &log);
    let get = RawRequest::get("/a.bin");

    // `/readyz` connects to the public listener and closes without a byte: not a refusal.
    let ready = support::http::get(&process.admin_url("/readyz"), &[]);
    assert_eq!(ready.status, 200);
    // No header: closed unanswered, and counted.
    let mut bare = Connection::open_from(loopback(1), process.addr(), b"").expect("connect");
    let wrote = std::io::Write::write_all(bare.stream(), b"GET /a.bin HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(wrote.is_ok());
    assert_eq!(read_to_close(&mut bare), b"", "answered without a PROXY header");
    assert_eq!(process.metric("rangeway_client_connections_refused_total", "proxy_protocol"), 1);

    // v2 over IPv6, and v1: the source they name is the client.
    let source: SocketAddr = "[2001:db8::7]:4711".parse().unwrap();
    let destination: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
    let v6 = v2_header(1, Some((source, destination)));
    let mut connection = Connection::open_from(loopback(1), process.addr(), &v6).expect("connect");
    assert_eq!(connection.send(&get).expect("a response").status, 200);
    let v1 = b"PROXY TCP4 198.51.100.22 10.0.0.2 35646 80\r\n";
    let mut connection = Connection::open_from(loopback(1), process.addr(), v1).expect("connect");
    assert_eq!(connection.send(&get).expect("a response").status, 200);
    // LOCAL, a balancer's own health check: the peer is the client.
    let local = v2_header(0, None);
    let mut connection =
        Connection::open_from(loopback(2), process.addr(), &local).expect("connect");
    assert_eq!(connection.send(&get).expect("a response").status, 200);

    let lines = access_lines(&log, 3);
    let clients: Vec<&str> = lines.iter().map(|line| line["client"].as_str().unwrap()).collect();
    assert_eq!(clients[..2], ["[2001:db8::7]:4711", "198.51.100.22:35646"]);
    assert!(clients[2].starts_with("127.0.0.2:"), "{lines:?}");
}

#[test]
fn x_forwarded_for_is_believed_from_a_trusted_peer_only() {
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(100, 4));
    let work = TempDir::new("trusted-proxies");
    let log = work.join("rangeway.log");
    let process = logged(&origin, "trusted_proxies = [\"127.0.0.1/32\", \"10.0.0.0/8\"]\n", &log);
    let forwarded = |from: u8| {
        let get = RawRequest::get("/a.bin")
            .header("X-Forwarded-For", "6.6.6.6, 198.51.100.9, 10.1.2.3")
            .header("Connection", "close");
        let mut connection =
            Connection::open_from(loopback(from), process.addr(), b"").expect("connect");
        assert_eq!(connection.send(&get).expect("a response").status, 200);
    };
    forwarded(1);
    forwarded(2);

    let lines = access_lines(&log, 2);
    // From 127.0.0.1 (trusted): the rightmost hop not trusted, and who said so.
    assert_eq!(lines[0]["client"], "198.51.100.9", "{lines:?}");
    assert_eq!(lines[0]["forwarded_by"], "127.0.0.1", "{lines:?}");
    // From 127.0.0.2 (not trusted): the header is the client's own claim, ignored.
    assert!(lines[1]["client"].as_str().unwrap().starts_with("127.0.0.2:"), "{lines:?}");
    assert!(lines[1].get("forwarded_by").is_none(), "{lines:?}");
    // The origin is told the hop rangeway was connected from, once.
    let sent: Vec<String> = origin
        .requests()
        .iter()
        .filter_map(|request| request.header("x-forwarded-for").map(str::to_owned))
        .collect();
    assert_eq!(
        sent,
        [
            "6.6.6.6, 198.51.100.9, 10.1.2.3, 127.0.0.1",
            "6.6.6.6, 198.51.100.9, 10.1.2.3, 127.0.0.2"
        ]
    );
}

/// A link bound to clients of 198.51.100.0/24 is judged by the address a PROXY header names, and
/// by a trusted proxy's `X-Forwarded-For` behind it, never by the balancer's own address.
#[test]
fn a_signed_link_bound_to_a_client_sees_the_real_client() {
    let origin = Origin::start();
    origin.put("/files/a.bin", test_bytes(100, 5));
    let work = TempDir::new("bound-link");
    let keys = work.join("link-keys");
    std::fs::write(&keys, "k1 0123456789abcdef0123456789abcdef\n").expect("write the keys");
    let routes = format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/files/\"\n\
         upstream = \"origin\"\n[routes.signed_links]\nkeys_file = \"{}\"\n",
        origin.base_url(),
        keys.display()
    );
    let config = work.join("sign.toml");
    std::fs::write(&config, &routes).expect("write the config");
    let mut sign = Command::new(env!("CARGO_BIN_EXE_rangeway"));
    sign.args(["sign", "--config"]).arg(&config);
    sign.args(["/files/a.bin", "--client", "198.51.100.0/24"]);
    let signed = run(sign, CLIENT_TIMEOUT);
    signed.assert_success();
    let link = signed.stdout.trim().to_owned();
    let server = "proxy_protocol = true\ntrusted_proxies = [\"10.0.0.0/8\"]\n";
    let process = ProxyProcess::start_with(&routes, server, &[]);
    let status = |source: &str, forwarded_for: Option<&str>| {
        let preface = format!("PROXY TCP4 {source} 10.0.0.2 40000 80\r\n");
        let mut get = RawRequest::get(&link);
        if let Some(client) = forwarded_for {
            get = get.header("X-Forwarded-For", client);
        }
        let mut connection = Connection::open_from(loopback(1), process.addr(), preface.as_bytes())
            .expect("connect");
        connection.send(&get).expect("a response").status
    };
    assert_eq!(status("198.51.100.22", None), 200);
    assert_eq!(status("203.0.113.5", None), 403);
    // A trusted proxy (10.1.1.1, named by the PROXY header) forwarding for a client.
    assert_eq!(status("10.1.1.1", Some("198.51.100.30")), 200);
    assert_eq!(status("10.1.1.1", Some("203.0.113.9")), 403);
    // The same header from a client not trusted to write it is its own claim.
    assert_eq!(status("203.0.113.5", Some("198.51.100.30")), 403);
}

#[test]
fn the_admin_listener_answers_only_its_own_host_names() {
    let origin = Origin::start();
    let proxy = Proxy::start_with_server(&body(&origin), "admin_hosts = [\"metrics.internal\"]\n");
    let admin = proxy.admin_addr();
    let status = |host: Option<&str>, path: &str| {
        let mut get = RawRequest::get(path);
        if let Some(host) = host {
            get = get.header("Host", host);
        }
        request(admin, &get).expect("a response").status
    };
    let port = admin.port();
    for path in ["/metrics", "/ui", "/v1/downloads"] {
        // A page that pointed its own name at 127.0.0.1.
        assert_eq!(status(Some("evil.example"), path), 421, "{path}");
        assert_eq!(status(Some(&format!("evil.example:{port}")), path), 421, "{path}");
    }
    for host in [
        format!("localhost:{port}"),
        "localhost".to_owned(),
        format!("127.0.0.1:{port}"),
        format!("METRICS.internal:{port}"),
    ] {
        assert_eq!(status(Some(&host), "/metrics"), 200, "{host}");
    }
    // The support client adds a Host naming the address when none is given: a bare request
    // has to be written by hand.
    let mut bare = Connection::open(admin).expect("connect");
    let answer = bare.send_raw("GET", "GET /healthz HTTP/1.0\r\n\r\n").expect("a response");
    assert_eq!(answer.status, 200, "an HTTP/1.0 probe without Host");
}
