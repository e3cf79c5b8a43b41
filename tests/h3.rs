//! HTTP/3 to clients (`[tls] h3`): downloads over QUIC through the same pipeline as over HTTP/2,
//! driven by clients nobody here wrote — aioquic's HTTP/3 stack (`tests/h3_client.py`) and
//! headless chromium — against rangeway on free ports, with certificates the test makes. Each
//! answer is compared byte for byte with the object, and with the same request over HTTP/2
//! (curl) where the two must agree. A client that moves to another port mid-download keeps its
//! connection; a lossy, reordering UDP path between them loses no byte. (A flood of connection
//! attempts is tests/h3_flood.rs's, a binary of its own.)

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::clients::{CLIENT_TIMEOUT, ClientRun, run, sha256_file, sha256_hex};
use support::data::test_bytes;
use support::h3::{aioquic_command, quic_client_config};
use support::lossy_relay::LossyRelay;
use support::origin::Behaviour;
use support::origin::Origin;
use support::ports::free_port;
use support::proxy::{Instance, Proxy, ProxyProcess};
use support::tls::TestPki;
use support::tmp::TempDir;
use support::wait::{WITHIN, log_until};

/// `[tls]` on `port` with HTTP/3 on, presenting the `localhost` certificate; `h3` keys added.
fn tls_section(pki: &TestPki, port: u16, h3: &str) -> String {
    let files = pki.localhost();
    // `h3 = true` among [tls]'s keys; a [tls.h3] table after the certificates.
    let (on, table) = match h3 {
        "" => ("h3 = true\n", String::new()),
        keys => ("", format!("[tls.h3]\n{keys}\n")),
    };
    format!(
        "[tls]\nlisten = \"127.0.0.1:{port}\"\n{on}[[tls.certificates]]\ncert_file = \"{}\"\n\
         key_file = \"{}\"\n{table}\n",
        files.cert.display(),
        files.key.display(),
    )
}

/// A JSON log, and one route to `upstream` (an `[upstreams.origin]` table's keys).
fn routes(upstream: &str) -> String {
    format!(
        "[log]\nformat = \"json\"\n\n[upstreams.origin]\n{upstream}\n\n[[routes]]\n\
         path_prefix = \"/\"\nupstream = \"origin\"\n"
    )
}

/// rangeway as a process with HTTP/3 on a free port, logging JSON lines to `log`.
fn h3_proxy(pki: &TestPki, upstream: &str, h3: &str, log: &Path) -> (ProxyProcess, u16) {
    h3_proxy_with(pki, upstream, h3, "", log)
}

/// [`h3_proxy`], with `server_keys` in `[server]`.
fn h3_proxy_with(
    pki: &TestPki,
    upstream: &str,
    h3: &str,
    server_keys: &str,
    log: &Path,
) -> (ProxyProcess, u16) {
    let port = free_port();
    let body = format!("{}{}", tls_section(pki, port, h3), routes(upstream));
    let process = ProxyProcess::start_logged_with(&body, server_keys, &[], log);
    (process, port)
}

/// One request for `tests/h3_client.py`.
fn request(path: &str, headers: &[(&str, &str)], out: &Path) -> String {
    let headers: serde_json::Map<String, Value> =
        headers.iter().map(|(k, v)| ((*k).to_owned(), Value::from(*v))).collect();
    serde_json::json!({ "path": path, "headers": headers, "out": out }).to_string()
}

/// What aioquic's client saw: an answer per request, then the connection's addresses.
struct H3Run {
    answers: Vec<Value>,
    addresses: Vec<String>,
    run: ClientRun,
}

/// Runs `tests/h3_client.py` against `connect` (rangeway, or a relay in front of it), trusting
/// `pki`'s CA, with `requests` on one connection and `extra` arguments.
fn aioquic(pki: &TestPki, connect: SocketAddr, requests: &[String], extra: &[&str]) -> H3Run {
    let run = run(aioquic_command(pki, connect, requests, extra), CLIENT_TIMEOUT);
    run.assert_success();
    report(run)
}

/// `tests/h3_client.py` as [`aioquic`] runs it, whatever its outcome.
fn aioquic_run(pki: &TestPki, connect: SocketAddr, requests: &[String]) -> ClientRun {
    run(aioquic_command(pki, connect, requests, &[]), CLIENT_TIMEOUT)
}

/// What `tests/h3_client.py` printed.
fn report(run: ClientRun) -> H3Run {
    let lines: Vec<Value> = run
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let (connection, answers) = lines.split_last().expect("the client's report");
    let addresses = connection["connection"]["addresses"]
        .as_array()
        .expect("the connection's addresses")
        .iter()
        .map(|a| a.as_str().unwrap_or_default().to_owned())
        .collect();
    H3Run { answers: answers.to_vec(), addresses, run }
}

/// curl over HTTP/2, trusting the test CA: the answer's status and body.
fn curl_h2(pki: &TestPki, url: &str, headers: &[(&str, &str)], out: &Path) -> String {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--http2", "-w", "%{http_code}", "-o"]).arg(out).arg("--cacert");
    curl.arg(pki.ca_cert());
    for (name, value) in headers {
        curl.args(["-H", &format!("{name}: {value}")]);
    }
    curl.arg(url);
    let run = run(curl, CLIENT_TIMEOUT);
    run.assert_success();
    run.stdout
}

/// The access lines of `log`, as JSON, once there are `count` of them.
fn access_lines(log: &Path, count: usize) -> Vec<Value> {
    let parse = |text: &str| -> Vec<Value> {
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["target"] == "rangeway::access")
            .collect()
    };
    let text =
        log_until(log, &format!("{count} access lines"), WITHIN, |text| parse(text).len() >= count);
    parse(&text)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A request's name, its header fields, and the status and bytes it must get.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, u64, Vec<u8>);

#[test]
fn aioquic_downloads_ranges_multipart_and_resumes_as_over_h2() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(3_000_000, 45);
    let etag = origin.put("/obj.bin", object.clone());
    let work = TempDir::new("h3-aioquic");
    let log = work.join("rangeway.log");
    let upstream = format!("url = \"{}\"", origin.base_url());
    let (proxy, port) = h3_proxy(&pki, &upstream, "", &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let n = object.len();
    let file = |name: &str| work.join(name);
    let cases: Vec<Case<'_>> = vec![
        ("whole", vec![], 200, object.clone()),
        ("first", vec![("range", "bytes=0-99")], 206, object[..100].to_vec()),
        ("tail", vec![("range", "bytes=2999000-")], 206, object[2_999_000..].to_vec()),
        ("suffix", vec![("range", "bytes=-4096")], 206, object[n - 4096..].to_vec()),
        (
            "middle",
            vec![("range", "bytes=1000000-1999999")],
            206,
            object[1_000_000..2_000_000].to_vec(),
        ),
        // If-Range: the current ETag keeps the range, another one gets the whole object.
        (
            "if-range",
            vec![("range", "bytes=0-9"), ("if-range", etag.as_str())],
            206,
            object[..10].to_vec(),
        ),
        (
            "if-range-other",
            vec![("range", "bytes=0-9"), ("if-range", "\"another\"")],
            200,
            object.clone(),
        ),
    ];
    let mut requests: Vec<String> =
        cases.iter().map(|(name, headers, ..)| request("/obj.bin", headers, &file(name))).collect();
    let multipart = [("range", "bytes=0-9,1000-1009")];
    requests.push(request("/obj.bin", &multipart, &file("multipart")));
    let seen = aioquic(&pki, addr, &requests, &[]);
    assert_eq!(seen.answers.len(), cases.len() + 1, "{}", seen.run);
    for ((name, headers, status, expected), answer) in cases.iter().zip(&seen.answers) {
        assert_eq!(answer["status"], *status, "{name}: {answer}");
        assert_eq!(answer["reset"], false, "{name}: {answer}");
        assert_eq!(read(&file(name)), *expected, "{name}: the bytes");
        // The same request over HTTP/2 gets the same answer.
        let h2 = file(&format!("{name}-h2"));
        let url = format!("https://localhost:{port}/obj.bin");
        assert_eq!(curl_h2(&pki, &url, headers, &h2), status.to_string(), "{name} over h2");
        assert_eq!(read(&h2), *expected, "{name} over h2: the bytes");
    }
    // Multipart: the very body HTTP/2 gets, each part the object's.
    let answer = &seen.answers[cases.len()];
    assert_eq!(answer["status"], 206, "{answer}");
    let content_type = answer["headers"]["content-type"].as_str().unwrap_or_default();
    assert!(content_type.starts_with("multipart/byteranges"), "{answer}");
    let body = read(&file("multipart"));
    for slice in [&object[..10], &object[1000..1010]] {
        assert!(body.windows(10).any(|w| w == slice), "a part is missing");
    }
    let h2 = file("multipart-h2");
    curl_h2(&pki, &format!("https://localhost:{port}/obj.bin"), &multipart, &h2);
    assert_eq!(read(&h2), body, "multipart over h2 and h3");

    // The access lines say HTTP/3, from the client's address.
    let lines = access_lines(&log, cases.len() + 1);
    let h3: Vec<&Value> = lines.iter().filter(|l| l["version"] == "HTTP/3.0").collect();
    assert_eq!(h3.len(), cases.len() + 1, "{lines:?}");
    assert!(h3.iter().all(|l| l["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:"))));
    // Answers over TLS advertise HTTP/3; plain ones do not.
    let mut headers = Command::new("curl");
    headers.args(["-sS", "--http2", "-D", "-", "-o", "/dev/null", "--cacert"]);
    headers.arg(pki.ca_cert()).arg(format!("https://localhost:{port}/obj.bin"));
    let tls = run(headers, CLIENT_TIMEOUT);
    let alt_svc = format!("alt-svc: h3=\":{port}\"; ma=86400");
    assert!(tls.stdout.to_ascii_lowercase().contains(&alt_svc), "{tls}");
    let plain = support::http::get(&proxy.url("/obj.bin"), &[("Range", "bytes=0-0")]);
    assert_eq!(plain.status, 206);
    assert_eq!(plain.header("alt-svc"), None, "plain HTTP advertises nothing");
}

#[test]
fn a_pinned_resume_over_h3_after_the_object_changed_is_refused() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let v1 = test_bytes(2_000_000, 46);
    let v2 = test_bytes(2_000_000, 47);
    let old_etag = origin.put("/obj.bin", v1.clone());
    let work = TempDir::new("h3-pinned");
    let log = work.join("rangeway.log");
    let upstream = format!("url = \"{}\"", origin.base_url());
    let (_proxy, port) = h3_proxy(&pki, &upstream, "", &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let id = ("x-download-id", "h3-pinned");

    // The first half, under the download's id.
    let first = work.join("first");
    let seen = aioquic(
        &pki,
        addr,
        &[request("/obj.bin", &[id, ("range", "bytes=0-999999")], &first)],
        &[],
    );
    assert_eq!(seen.answers[0]["status"], 206, "{}", seen.run);
    assert_eq!(read(&first), v1[..1_000_000]);
    access_lines(&log, 1);

    // The object changes; the resume is refused, never answered from the new version.
    origin.put("/obj.bin", v2.clone());
    let rest = work.join("rest");
    let resume = [id, ("range", "bytes=1000000-")];
    let seen = aioquic(&pki, addr, &[request("/obj.bin", &resume, &rest)], &[]);
    let answer = &seen.answers[0];
    assert_eq!(answer["status"], 412, "{answer}");
    assert!(answer["headers"]["x-rangeway-error"].as_str().is_some_and(|e| e.contains("changed")));
    assert_eq!(answer["length"], 0, "{answer}");
    // With If-Range naming the old version, the new one comes whole: never its tail.
    let whole = work.join("whole");
    let if_range = [("range", "bytes=1000000-"), ("if-range", old_etag.as_str())];
    let seen = aioquic(&pki, addr, &[request("/obj.bin", &if_range, &whole)], &[]);
    assert_eq!(seen.answers[0]["status"], 200, "{}", seen.run);
    assert_eq!(sha256_file(&whole), sha256_hex(&v2));
}

/// A folder with `object` as `big.bin`, served as the `origin` upstream.
fn folder_with(object: &[u8], work: &TempDir) -> (PathBuf, String) {
    let folder = work.join("files");
    std::fs::create_dir_all(&folder).expect("make the folder");
    std::fs::write(folder.join("big.bin"), object).expect("write the object");
    let upstream = format!("dir = \"{}\"", folder.display());
    (folder, upstream)
}

#[test]
fn a_client_that_changes_port_mid_download_keeps_its_connection() {
    const LEN: usize = 64 << 20;
    let pki = TestPki::new();
    let work = TempDir::new("h3-migration");
    let object = test_bytes(LEN, 48);
    let (_folder, upstream) = folder_with(&object, &work);
    let log = work.join("rangeway.log");
    let (proxy, port) = h3_proxy(&pki, &upstream, "", &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let out = work.join("big.bin");
    let half = (LEN / 2).to_string();
    // Halfway, the client moves to a new socket: a new port, and another loopback address.
    let seen = aioquic(
        &pki,
        addr,
        &[request("/big.bin", &[], &out)],
        &["--rebind-after", &half, "--rebind-host", "127.0.0.2"],
    );
    let answer = &seen.answers[0];
    assert_eq!((answer["status"].as_u64(), answer["reset"].as_bool()), (Some(200), Some(false)));
    assert_eq!(seen.addresses.len(), 2, "the client moved: {}", seen.run);
    assert_ne!(seen.addresses[0], seen.addresses[1]);
    assert!(seen.addresses[1].contains("127.0.0.2"), "{:?}", seen.addresses);
    assert_eq!(sha256_file(&out), sha256_hex(&object), "byte for byte");
    // One request, whole, from the address of the handshake.
    let lines = access_lines(&log, 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(
        (lines[0]["status"].as_u64(), lines[0]["bytes"].as_u64()),
        (Some(200), Some(LEN as u64))
    );
    assert!(lines[0]["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{lines:?}");
    // rangeway saw the connection end on the new path.
    support::wait::until("the migration counted", WITHIN, || {
        (proxy.metric("rangeway_quic_migrated_total", "") == 1).then_some(())
    });
}

#[test]
fn downloads_through_a_lossy_reordering_path_lose_no_byte() {
    const LEN: usize = 6 << 20;
    let pki = TestPki::new();
    let work = TempDir::new("h3-lossy");
    let object = test_bytes(LEN, 49);
    let (_folder, upstream) = folder_with(&object, &work);
    let log = work.join("rangeway.log");
    let (_proxy, port) = h3_proxy(&pki, &upstream, "", &log);
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    for (loss, reorder) in [(0.01, 0.02), (0.05, 0.05)] {
        let relay = LossyRelay::start(server, loss, reorder);
        let (whole, part) = (work.join("whole"), work.join("part"));
        let authority = format!("localhost:{port}");
        let seen = aioquic(
            &pki,
            relay.addr,
            &[
                request("/big.bin", &[], &whole),
                request("/big.bin", &[("range", "bytes=1000000-2999999")], &part),
            ],
            &["--authority", &authority],
        );
        assert_eq!(seen.answers[0]["status"], 200, "loss {loss}: {}", seen.run);
        assert_eq!(seen.answers[1]["status"], 206, "loss {loss}: {}", seen.run);
        assert_eq!(sha256_file(&whole), sha256_hex(&object), "loss {loss}: the whole object");
        assert_eq!(read(&part), object[1_000_000..3_000_000], "loss {loss}: the range");
    }
}

/// The base64 SHA-256 of `cert`'s public key (its SubjectPublicKeyInfo), as chromium's
/// `--ignore-certificate-errors-spki-list` takes it.
fn spki_sha256(cert: &Path) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let mut pem = Command::new("openssl");
    pem.args(["x509", "-pubkey", "-noout", "-in"]).arg(cert);
    let public_key = support::clients::pipe(&mut pem, b"");
    let mut der = Command::new("openssl");
    der.args(["pkey", "-pubin", "-outform", "der"]);
    let der = support::clients::pipe(&mut der, &public_key);
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(der))
}

#[test]
fn chromium_downloads_over_h3() {
    const CHROMIUM: &str = "/usr/bin/chromium";
    const LEN: usize = 24 << 20;
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: run scripts/deps.sh --test");
    let pki = TestPki::new();
    let work = TempDir::new("h3-chromium");
    let object = test_bytes(LEN, 50);
    let (folder, upstream) = folder_with(&object, &work);
    let page = "<!doctype html><title>download</title><p>over HTTP/3";
    std::fs::write(folder.join("page.html"), page).expect("write the page");
    let log = work.join("rangeway.log");
    let (_proxy, port) = h3_proxy(&pki, &upstream, "", &log);
    let profile = work.join("profile");
    std::fs::create_dir_all(&profile).expect("make the profile folder");
    let args = serde_json::json!({
        // By address: `localhost` may resolve to ::1 first, where nothing listens, and QUIC
        // forced on the origin has no TCP to fall back to.
        "page": format!("https://127.0.0.1:{port}/page.html"),
        "object": "/big.bin",
        "quic_origin": format!("127.0.0.1:{port}"),
        "spki": spki_sha256(&pki.localhost().cert),
        "profile": profile,
        "chromium": CHROMIUM,
    });
    let mut browser = Command::new("python3");
    browser.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser_h3.py"));
    browser.arg(args.to_string());
    let browsing = run(browser, CLIENT_TIMEOUT);
    browsing.assert_success();
    let seen: Value = serde_json::from_str(&browsing.stdout).expect("the script's JSON");
    // The page's network log: every request went over HTTP/3.
    assert_eq!(seen["navigation"], "h3", "{seen}");
    let resources = seen["resources"].as_array().expect("the resources");
    assert!(!resources.is_empty() && resources.iter().all(|p| p == "h3"), "{seen}");
    assert_eq!(seen["status"], 200, "{seen}");
    assert_eq!(seen["length"], LEN, "{seen}");
    assert_eq!(seen["sha256"], sha256_hex(&object).as_str(), "byte for byte");
    let range: String = object[100..200].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(seen["range_status"], 206, "{seen}");
    assert_eq!(seen["range_hex"], range.as_str());
    // rangeway's access lines agree: HTTP/3, all of them.
    let lines = access_lines(&log, 3);
    assert!(lines.iter().all(|l| l["version"] == "HTTP/3.0"), "{lines:?}");
}

#[test]
fn sigterm_lets_quic_downloads_finish_refuses_new_connections_then_exits() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(2 << 20, 51);
    origin.put("/obj.bin", object.clone());
    // About 2 s for the whole object.
    origin.set_global_behaviour(Behaviour::Slow {
        chunk: 256 * 1024,
        delay: Duration::from_millis(250),
    });
    let work = TempDir::new("h3-drain");
    let log = work.join("rangeway.log");
    let upstream = format!("url = \"{}\"", origin.base_url());
    let grace = "grace_period = \"30s\"";
    let (mut proxy, port) = h3_proxy_with(&pki, &upstream, "", grace, &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let file = work.join("obj.bin");
    let download = {
        let client = aioquic_command(&pki, addr, &[request("/obj.bin", &[], &file)], &[]);
        std::thread::spawn(move || run(client, CLIENT_TIMEOUT))
    };
    support::wait::until("the download under way", WITHIN, || {
        (proxy.metric("rangeway_active_downloads", "") == 1).then_some(())
    });
    let signalled = std::time::Instant::now();
    proxy.signal("TERM");
    log_until(&log, "the drain", WITHIN, |text| text.contains("draining: new connections"));
    // A new QUIC connection is refused while the one in flight goes on.
    let refused = aioquic_run(&pki, addr, &[request("/obj.bin", &[], &work.join("late"))]);
    assert!(!refused.success(), "a connection during the drain: {refused}");
    assert!(proxy.wait_exit(Duration::ZERO).is_none(), "draining, not exited");
    let done = report(download.join().expect("the download's thread"));
    assert_eq!(done.answers[0]["status"], 200, "{}", done.run);
    assert_eq!(read(&file), object, "the download in flight finished, byte for byte");
    let status = proxy.wait_exit(Duration::from_secs(10)).expect("exits once drained");
    assert!(status.success(), "{status}");
    assert!(signalled.elapsed() < Duration::from_secs(10), "{:?}", signalled.elapsed());
    log_until(&log, "the drained line", WITHIN, |text| text.contains("no QUIC connection open"));
}

/// rangeway in-process with HTTP/3 on, `h3` its `[tls.h3]` keys, in front of `origin`; and the
/// address of its QUIC listener.
fn in_process(pki: &TestPki, origin: &Origin, h3: &str) -> (Proxy, SocketAddr) {
    in_process_with(pki, origin, h3, "")
}

/// [`in_process`], with `server_keys` in `[server]`.
fn in_process_with(
    pki: &TestPki,
    origin: &Origin,
    h3: &str,
    server_keys: &str,
) -> (Proxy, SocketAddr) {
    let port = free_port();
    let body = format!(
        "{}[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        tls_section(pki, port, h3),
        origin.base_url()
    );
    (Proxy::start_with_server(&body, server_keys), SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A QUIC client endpoint on 127.0.0.1 trusting `pki`'s CA, offering `h3`: for what the listener
/// does before any request (limits, Retry, timeouts). Run within a tokio runtime.
fn quic_client(pki: &TestPki) -> quinn::Endpoint {
    quic_client_on(pki, [127, 0, 0, 1])
}

/// [`quic_client`], its socket on the loopback address `ip`.
fn quic_client_on(pki: &TestPki, ip: [u8; 4]) -> quinn::Endpoint {
    let local = SocketAddr::from((ip, 0));
    let mut endpoint = quinn::Endpoint::client(local).expect("a client endpoint");
    endpoint.set_default_client_config(quic_client_config(pki));
    endpoint
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
}

#[test]
fn connections_per_address_are_bounded_after_a_retry_and_streams_per_connection() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let keys = "max_connections_per_client = 2\nmax_streams = 3\n";
    let (proxy, addr) = in_process(&pki, &origin, keys);
    runtime().block_on(async {
        let client = quic_client(&pki);
        let connect =
            || async { client.connect(addr, "localhost").expect("a connection attempt").await };
        let (first, second) = (connect().await.expect("one"), connect().await.expect("two"));
        // The third from the same address: asked to prove its address (Retry), then refused.
        match connect().await {
            Err(quinn::ConnectionError::ConnectionClosed(close)) => {
                assert_eq!(close.error_code, quinn::TransportErrorCode::CONNECTION_REFUSED);
            }
            other => panic!("a third connection from one address: {other:?}"),
        }
        // A connection takes max_streams requests at once, no more.
        let mut open = Vec::new();
        for _ in 0..3 {
            let (mut send, recv) = first.open_bi().await.expect("a stream");
            // A stream exists for the server once something is sent on it.
            send.write_all(b"\x01").await.expect("write");
            open.push((send, recv));
        }
        let fourth = tokio::time::timeout(Duration::from_millis(500), first.open_bi()).await;
        assert!(fourth.is_err(), "a fourth stream opened");
        // One closed, another may open.
        drop(second);
        tokio::time::sleep(Duration::from_millis(200)).await;
        connect().await.expect("room for another once one closed");
    });
    assert_eq!(proxy.metric("rangeway_quic_handshakes_total", "retried"), 1);
    assert_eq!(proxy.metric("rangeway_quic_handshakes_total", "refused_per_client"), 1);
    assert_eq!(proxy.metric_at_least("rangeway_quic_handshakes_total", "accepted", 3), 3);
}

#[test]
fn every_client_proves_its_address_when_retry_is_always_asked_for() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(100_000, 52);
    origin.put("/obj.bin", object.clone());
    let (proxy, addr) = in_process(&pki, &origin, "retry_above_handshakes = 0\n");
    let work = TempDir::new("h3-retry");
    let out = work.join("obj.bin");
    let seen = aioquic(&pki, addr, &[request("/obj.bin", &[], &out)], &[]);
    assert_eq!(seen.answers[0]["status"], 200, "{}", seen.run);
    assert_eq!(read(&out), object);
    assert_eq!(proxy.metric("rangeway_quic_handshakes_total", "retried"), 1);
    assert_eq!(proxy.metric("rangeway_quic_handshakes_total", "accepted"), 1);
}

#[test]
fn an_idle_connection_is_closed_after_idle_timeout() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let (proxy, addr) = in_process(&pki, &origin, "idle_timeout = \"1s\"\n");
    runtime().block_on(async {
        let client = quic_client(&pki);
        let connection = client.connect(addr, "localhost").expect("an attempt").await;
        let connection = connection.expect("a connection");
        let closed = tokio::time::timeout(Duration::from_secs(5), connection.closed()).await;
        assert_eq!(closed.ok(), Some(quinn::ConnectionError::TimedOut), "closed when idle");
    });
    support::wait::until("the connection's place given up", WITHIN, || {
        (proxy.metric("rangeway_quic_connections", "") == 0).then_some(())
    });
}

#[test]
fn an_upgrade_serves_new_quic_connections_at_once_while_the_old_process_finishes_its_own() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(4 << 20, 53);
    origin.put("/obj.bin", object.clone());
    origin.put("/small.bin", b"small".to_vec());
    // About 10 s for the whole object.
    origin.set_behaviour(
        "/obj.bin",
        Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(600) },
    );
    let work = TempDir::new("h3-upgrade");
    let (old_log, new_log) = (work.join("old.log"), work.join("new.log"));
    let socket = work.join("upgrade.sock");
    let server_keys = format!("grace_period = \"20s\"\nupgrade_socket = \"{}\"", socket.display());
    let upstream = format!("url = \"{}\"", origin.base_url());
    let (mut old, port) = h3_proxy_with(&pki, &upstream, "", &server_keys, &old_log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let file = work.join("obj.bin");
    let download = {
        let client = aioquic_command(&pki, addr, &[request("/obj.bin", &[], &file)], &[]);
        std::thread::spawn(move || run(client, CLIENT_TIMEOUT))
    };
    support::wait::until("the download under way", WITHIN, || {
        (old.metric("rangeway_active_downloads", "") == 1).then_some(())
    });
    let _new = old.upgrade(&new_log);
    support::wait::until("the upgrade socket", Duration::from_secs(15), || {
        use std::os::unix::fs::FileTypeExt;
        std::fs::metadata(&socket).ok().filter(|m| m.file_type().is_socket())
    });
    old.signal("QUIT");
    // The new process shares the UDP port at once: a new connection is its, while the old
    // process still sends its download.
    log_until(&new_log, "HTTP/3 on the new process", Duration::from_secs(15), |text| {
        text.contains("HTTP/3 listening (UDP)")
    });
    // Five connections, each from a port of its own: the kernel's hash alone would send some
    // of them to the old process (all five to this one once in 32 times).
    for n in 0..5 {
        let small = work.join(format!("small-{n}"));
        let seen = aioquic(&pki, addr, &[request("/small.bin", &[], &small)], &[]);
        assert_eq!(seen.answers[0]["status"], 200, "{}", seen.run);
        assert_eq!(read(&small), b"small");
    }
    assert!(!download.is_finished(), "the old process's download is still under way");
    log_until(&new_log, "the new connections' access lines", WITHIN, |text| {
        text.matches("/small.bin").count() == 5
    });
    // Every packet of the old process's connection still reaches it: its download completes
    // there, byte for byte.
    let done = report(download.join().expect("the download's thread"));
    assert_eq!(done.answers[0]["status"], 200, "{}", done.run);
    assert_eq!(read(&file), object, "the download finished on the old process");
    let exited = old.wait_exit(Duration::from_secs(15));
    assert!(exited.is_some_and(|s| s.success()), "the old process did not leave: {exited:?}");
    let old_text = std::fs::read_to_string(&old_log).expect("the old process's log");
    assert!(old_text.contains("/obj.bin") && !old_text.contains("/small.bin"), "{old_text}");
    let new_text = std::fs::read_to_string(&new_log).expect("the new process's log");
    assert!(!new_text.contains("/obj.bin"), "{new_text}");
    // Alone on the port, the new process serves every connection.
    let again = work.join("again");
    let seen = aioquic(&pki, addr, &[request("/small.bin", &[], &again)], &[]);
    assert_eq!(seen.answers[0]["status"], 200, "{}", seen.run);
    assert_eq!(read(&again), b"small");
}

#[test]
fn limits_the_cache_and_stages_hold_over_h3_as_over_tcp() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(1_500_000, 54);
    // Last modified ten days ago: fresh for a day by RFC 9111's heuristic, so a cache hit.
    let ten_days_ago = std::time::SystemTime::now() - Duration::from_secs(10 * 86_400);
    origin.put_modified("/obj.bin", object.clone(), &[], ten_days_ago);
    origin.put("/slow.bin", test_bytes(2 << 20, 55));
    origin.set_behaviour(
        "/slow.bin",
        Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(250) },
    );
    let work = TempDir::new("h3-features");
    let cache = work.join("cache");
    let log = work.join("rangeway.log");
    let port = free_port();
    let route = |prefix: &str, extra: &str| {
        format!(
            "[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n{extra}\n"
        )
    };
    let body = format!(
        "{}[log]\nformat = \"json\"\n\n[cache]\ndir = \"{}\"\n\n[upstreams.origin]\nurl = \"{}\"\n\n{}{}{}",
        tls_section(&pki, port, ""),
        cache.display(),
        origin.base_url(),
        route("/limited/", "[routes.download_limits]\nper_client = 1\n"),
        route("/cached/", "cache = true\n"),
        route("/sum/", "[[routes.middleware]]\nkind = \"checksum\"\nalgorithms = [\"sha256\"]\n"),
    );
    let proxy = ProxyProcess::start_logged(&body, &[], &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));

    // One download under way over TCP: the same address's second, over QUIC, is refused.
    let slow_url = proxy.url("/limited/slow.bin");
    let slow = std::thread::spawn(move || support::http::get(&slow_url, &[]));
    support::wait::until("the TCP download under way", WITHIN, || {
        (proxy.metric("rangeway_active_downloads", "") == 1).then_some(())
    });
    let refused = work.join("refused");
    let seen = aioquic(&pki, addr, &[request("/limited/obj.bin", &[], &refused)], &[]);
    assert_eq!(seen.answers[0]["status"], 429, "{}", seen.run);
    assert_eq!(seen.answers[0]["headers"]["retry-after"], "5", "{}", seen.run);
    assert_eq!(slow.join().expect("the TCP download").status, 200);

    // The slice cache: a miss, then a hit that asks the origin nothing, both byte for byte.
    let (first, second) = (work.join("first"), work.join("second"));
    let asked = origin.requests().len();
    let seen = aioquic(&pki, addr, &[request("/cached/obj.bin", &[], &first)], &[]);
    assert_eq!(seen.answers[0]["status"], 200, "{}", seen.run);
    let after_miss = origin.requests().len();
    assert!(after_miss > asked, "the miss asked the origin");
    let range = [("range", "bytes=1000-1499999")];
    let seen = aioquic(&pki, addr, &[request("/cached/obj.bin", &range, &second)], &[]);
    assert_eq!(seen.answers[0]["status"], 206, "{}", seen.run);
    assert_eq!(origin.requests().len(), after_miss, "the hit asked the origin nothing");
    assert_eq!(read(&first), object);
    assert_eq!(read(&second), object[1000..]);

    // A checksum stage: the digest learned from one download is published on the next.
    let (once, twice) = (work.join("once"), work.join("twice"));
    let seen = aioquic(
        &pki,
        addr,
        &[request("/sum/obj.bin", &[], &once), request("/sum/obj.bin", &[], &twice)],
        &[],
    );
    assert_eq!(read(&once), object);
    assert_eq!(read(&twice), object);
    let digest = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&object));
    let published = seen.answers[1]["headers"]["repr-digest"].as_str().unwrap_or_default();
    assert_eq!(published, format!("sha-256=:{digest}:"), "{}", seen.run);

    // The access lines: the QUIC requests say HTTP/3, the cache's outcomes as over TCP (with a
    // [cache], every route but a folder's uses it).
    let lines = access_lines(&log, 6);
    let h3: Vec<&Value> = lines.iter().filter(|l| l["version"] == "HTTP/3.0").collect();
    assert_eq!(h3.len(), 5, "{lines:?}");
    let cached: Vec<&str> = h3
        .iter()
        .filter(|l| l["route"] == "/cached/")
        .filter_map(|l| l["cache"].as_str())
        .collect();
    assert_eq!(cached, ["miss", "hit"], "{lines:?}");
}

#[test]
fn a_signed_link_bound_to_the_client_holds_across_a_migration() {
    const LEN: usize = 16 << 20;
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(LEN, 56);
    origin.put("/big.bin", object.clone());
    let work = TempDir::new("h3-links");
    let keys = work.join("link-keys");
    std::fs::write(&keys, "k1 0123456789abcdef0123456789abcdef\n").expect("write the keys");
    let upstream = format!("url = \"{}\"", origin.base_url());
    let links = format!("[routes.signed_links]\nkeys_file = \"{}\"\n", keys.display());
    let port = free_port();
    let body = format!("{}{}{links}", tls_section(&pki, port, ""), routes(&upstream));
    let config = work.join("sign.toml");
    std::fs::write(&config, &body).expect("write the config");
    let sign = |client: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rangeway"));
        command.args(["sign", "--config"]).arg(&config);
        command.args(["/big.bin", "--client", client]);
        let signed = run(command, CLIENT_TIMEOUT);
        signed.assert_success();
        signed.stdout.trim().to_owned()
    };
    let log = work.join("rangeway.log");
    let _proxy = ProxyProcess::start_logged(&body, &[], &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (mine, theirs) = (sign("127.0.0.1/32"), sign("192.0.2.0/24"));
    let (whole, again, refused) = (work.join("whole"), work.join("again"), work.join("refused"));
    // Halfway through the first download the client moves to 127.0.0.2; the second request,
    // from there, is still the client of the handshake, whom the link names.
    let half = (LEN / 2).to_string();
    let seen = aioquic(
        &pki,
        addr,
        &[
            request(&mine, &[], &whole),
            request(&mine, &[("range", "bytes=0-99")], &again),
            request(&theirs, &[], &refused),
        ],
        &["--rebind-after", &half, "--rebind-host", "127.0.0.2"],
    );
    let statuses: Vec<u64> = seen.answers.iter().filter_map(|a| a["status"].as_u64()).collect();
    assert_eq!(statuses, [200, 206, 403], "{}", seen.run);
    assert!(seen.addresses[1].contains("127.0.0.2"), "{:?}", seen.addresses);
    assert_eq!(sha256_file(&whole), sha256_hex(&object));
    assert_eq!(read(&again), object[..100]);
    let lines = access_lines(&log, 3);
    assert!(
        lines.iter().all(|l| l["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:"))),
        "{lines:?}"
    );
}

/// `tests/h3_client.py --zero-rtt` against `addr`: a session resumed, `requests` sent first
/// thing on it; the answers, and whether the server took the 0-RTT data.
fn zero_rtt(pki: &TestPki, addr: SocketAddr, requests: &[String]) -> (H3Run, bool) {
    let seen = aioquic(pki, addr, requests, &["--zero-rtt"]);
    let run = seen.run.stdout.lines().last().unwrap_or_default().to_owned();
    let connection: Value = serde_json::from_str(&run).expect("the connection's line");
    assert_eq!(connection["connection"]["resumed"], true, "{}", seen.run);
    let accepted = connection["connection"]["early_data_accepted"] == true;
    (seen, accepted)
}

#[test]
fn zero_rtt_is_refused_by_default_and_only_get_and_head_ride_it_when_on() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(50_000, 57);
    origin.put("/obj.bin", object.clone());
    let work = TempDir::new("h3-0rtt");
    let out = work.join("obj.bin");
    let get = request("/obj.bin", &[], &out);

    // Off: the session resumes, its early data is not taken, the request is answered anyway.
    let (_off, addr) = in_process(&pki, &origin, "");
    let (seen, accepted) = zero_rtt(&pki, addr, std::slice::from_ref(&get));
    assert!(!accepted, "0-RTT taken while off: {}", seen.run);
    assert_eq!(seen.answers[0]["status"], 200, "{}", seen.run);

    // On: a GET in 0-RTT data is answered; a POST is told to come back after the handshake.
    let (_on, addr) = in_process(&pki, &origin, "early_data = true\n");
    let (seen, accepted) = zero_rtt(&pki, addr, std::slice::from_ref(&get));
    assert!(accepted, "0-RTT not taken while on: {}", seen.run);
    assert_eq!(seen.answers[0]["status"], 200, "{}", seen.run);
    assert_eq!(read(&out), object);
    // A POST is early while the handshake is not confirmed when its stream is taken; once it is,
    // the request is the route's to answer (RFC 8470 §5.1: a server may wait for the handshake),
    // here 405, POST not being its method. Which a try meets is timing: a few tries meet the first.
    let post = serde_json::json!({ "path": "/obj.bin", "method": "POST" }).to_string();
    let mut statuses = Vec::new();
    while statuses.len() < 5 && !statuses.contains(&Some(425)) {
        let (seen, accepted) = zero_rtt(&pki, addr, std::slice::from_ref(&post));
        assert!(accepted, "{}", seen.run);
        let status = seen.answers[0]["status"].as_u64();
        assert!(matches!(status, Some(425 | 405)), "{}", seen.run);
        statuses.push(status);
    }
    assert!(statuses.contains(&Some(425)), "no POST in 0-RTT data refused: {statuses:?}");
    assert!(origin.requests().iter().all(|r| r.method != "POST"), "a POST reached the origin");
}

#[test]
fn uploads_pass_through_over_h3_and_one_too_large_is_refused() {
    let pki = TestPki::new();
    let origin = Origin::start();
    origin.set_global_behaviour(Behaviour::TakesBodies(Vec::new()));
    let work = TempDir::new("h3-upload");
    let upload = test_bytes(3 << 20, 58);
    let file = work.join("upload.bin");
    std::fs::write(&file, &upload).expect("write the upload");
    let port = free_port();
    let body = format!(
        "{}[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\n\
         upstream = \"origin\"\nmethods = [\"POST\", \"PUT\"]\n",
        tls_section(&pki, port, ""),
        origin.base_url()
    );
    let _proxy = Proxy::start_with_server(&body, "max_request_body = \"4MiB\"\n");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let upload_request = |method: &str, file: &Path, out: &Path| {
        serde_json::json!({ "path": "/in.bin", "method": method, "body_file": file, "out": out })
            .to_string()
    };
    // The origin answers with the length and SHA-256 of the body it read.
    let answered = work.join("answered");
    let seen = aioquic(&pki, addr, &[upload_request("POST", &file, &answered)], &[]);
    assert_eq!(seen.answers[0]["status"], 200, "{}", seen.run);
    let expected = format!("{} {}", upload.len(), sha256_hex(&upload));
    assert_eq!(String::from_utf8_lossy(&read(&answered)).trim(), expected);
    // Past max_request_body (no length declared, as HTTP/3 needs none): cut where it grows
    // past the limit, 413; the origin never gets all of it.
    let large = work.join("large.bin");
    std::fs::write(&large, test_bytes(5 << 20, 59)).expect("write the large upload");
    let refused = work.join("refused");
    let seen = aioquic(&pki, addr, &[upload_request("PUT", &large, &refused)], &[]);
    assert_eq!(seen.answers[0]["status"], 413, "{}", seen.run);
    assert!(origin.requests().iter().all(|r| r.body_len <= 4 << 20), "never all of it");
}

/// A client that stops its stream while the origin is silent is noticed at once, its connection
/// kept open: the origin's request is dropped and the download ends, as on HTTP/2.
#[test]
fn a_client_that_stops_its_stream_frees_a_silent_origin() {
    let pki = TestPki::new();
    let origin = Origin::start();
    origin.put("/silent", test_bytes(1 << 20, 60));
    origin.set_behaviour("/silent", Behaviour::Silent);
    let (proxy, addr) = in_process(&pki, &origin, "");
    let work = TempDir::new("h3-stop");
    let spec = serde_json::json!({
        "path": "/silent", "out": work.join("silent"), "cancel_after": 1.5, "hold": 4,
    });
    let client = {
        let client = aioquic_command(&pki, addr, &[spec.to_string()], &[]);
        std::thread::spawn(move || run(client, CLIENT_TIMEOUT))
    };
    support::wait::until("the origin asked, the download under way", WITHIN, || {
        (origin.requests().len() == 1 && proxy.metric("rangeway_active_downloads", "") == 1)
            .then_some(())
    });
    let asked = std::time::Instant::now();
    // Stopped 1.5 s after the request: the origin's connection closes within 2 s of that, while
    // the client's QUIC connection is still open (it holds it 4 s more).
    support::wait::until("the origin's connection closed", Duration::from_secs(10), || {
        (origin.closed_while_silent() == 1).then_some(())
    });
    assert!(asked.elapsed() < Duration::from_millis(3500), "{:?}", asked.elapsed());
    assert_eq!(proxy.metric("rangeway_quic_connections", ""), 1, "the connection is kept");
    support::wait::until("the download ended", WITHIN, || {
        (proxy.metric("rangeway_active_downloads", "") == 0).then_some(())
    });
    let done = report(client.join().expect("the client's thread"));
    assert_eq!(done.answers[0]["reset"], true, "{}", done.run);
}

#[test]
fn quic_connections_count_toward_max_connections_with_tcp_ones() {
    let pki = TestPki::new();
    let origin = Origin::start();
    origin.put("/small.bin", b"small".to_vec());
    let (proxy, addr) = in_process_with(&pki, &origin, "", "max_connections = 2\n");
    let url = proxy.url("/small.bin");
    // A plain request, from a thread of its own (the test's runs the QUIC clients).
    let plain = move || {
        let url = url.clone();
        async move {
            let status = move || support::http::try_get(&url).map(|r| r.status);
            tokio::task::spawn_blocking(status).await.expect("the TCP request")
        }
    };
    support::wait::until("the listeners' own checks gone", WITHIN, || {
        (proxy.metric("rangeway_client_connections", "") == 0).then_some(())
    });
    runtime().block_on(async {
        let (client, elsewhere) = (quic_client(&pki), quic_client_on(&pki, [127, 0, 0, 2]));
        let connect = |client: &quinn::Endpoint| {
            client.connect(addr, "localhost").expect("a connection attempt")
        };
        let first = connect(&client).await.expect("one");
        let _second = connect(&client).await.expect("two");
        // Every place taken, by QUIC connections: a third, from another address, is refused,
        // and so is a TCP connection.
        match connect(&elsewhere).await {
            Err(quinn::ConnectionError::ConnectionClosed(close)) => {
                assert_eq!(close.error_code, quinn::TransportErrorCode::CONNECTION_REFUSED);
            }
            other => panic!("a third connection past max_connections: {other:?}"),
        }
        assert_eq!(proxy.metric("rangeway_client_connections", ""), 2);
        assert_eq!(plain().await, Some(503), "a TCP connection past max_connections");
        // One gone, a place is free again.
        drop(first);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(plain().await, Some(200));
    });
    assert_eq!(proxy.metric("rangeway_client_connections_refused_total", "max_connections"), 2);
}

/// `rangeway get URL -o FILE --cacert CA ARGS`.
fn rangeway_get(pki: &TestPki, url: &str, file: &Path, args: &[&str]) -> ClientRun {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rangeway"));
    command.args(["get", url, "-o"]).arg(file).arg("--cacert").arg(pki.ca_cert()).args(args);
    run(command, CLIENT_TIMEOUT)
}

#[test]
fn rangeway_get_speaks_h3_when_asked_or_once_advertised() {
    const LEN: usize = 12 << 20;
    let pki = TestPki::new();
    let work = TempDir::new("h3-get");
    let object = test_bytes(LEN, 61);
    let (_folder, upstream) = folder_with(&object, &work);
    let log = work.join("rangeway.log");
    let (_proxy, port) = h3_proxy(&pki, &upstream, "", &log);
    // By address: `localhost` may resolve to ::1 first, where nothing listens.
    let url = format!("https://127.0.0.1:{port}/big.bin");
    let versions = |lines: &[Value]| -> Vec<String> {
        lines.iter().map(|l| l["version"].as_str().unwrap_or_default().to_owned()).collect()
    };

    // Asked: every connection over QUIC, in pieces.
    let asked = work.join("asked.bin");
    rangeway_get(&pki, &url, &asked, &["--http3", "-x", "4", "-q"]).assert_success();
    assert_eq!(sha256_file(&asked), sha256_hex(&object));
    let lines = access_lines(&log, 1);
    assert!(versions(&lines).iter().all(|v| v == "HTTP/3.0"), "{lines:?}");
    let asked_lines = lines.len();

    // Not asked: the first request over TCP, whose answer advertises HTTP/3; the other pieces'
    // connections over QUIC.
    let advertised = work.join("advertised.bin");
    rangeway_get(&pki, &url, &advertised, &["-x", "4", "-q"]).assert_success();
    assert_eq!(sha256_file(&advertised), sha256_hex(&object));
    let lines = access_lines(&log, asked_lines + 2);
    let later = versions(&lines[asked_lines..]);
    assert_eq!(later[0], "HTTP/1.1", "{later:?}");
    assert!(later[1..].iter().any(|v| v == "HTTP/3.0"), "{later:?}");

    // --http3 is for https only.
    let plain = rangeway_get(&pki, "http://127.0.0.1:1/x", &work.join("x"), &["--http3"]);
    assert!(!plain.success() && plain.stderr.contains("https"), "{plain}");
}
