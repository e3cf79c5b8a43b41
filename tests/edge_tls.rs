//! rangeway at the edge: TLS listeners with certificates chosen by SNI and reloaded without a
//! restart, HTTP/2 to clients — driven by real clients (curl, wget, aria2c, h2load, openssl
//! s_client) on rangeway's TLS port, with certificates the test makes with openssl.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::clients::{CLIENT_TIMEOUT, ClientRun, run, sha256_file, sha256_hex, write_partial};
use support::data::test_bytes;
use support::origin::{Behaviour, Origin};
use support::ports::free_port;
use support::proxy::{Proxy, ProxyProcess, usage};
use support::tls::{TestPki, TlsFiles};
use support::tmp::TempDir;
use support::wait::{WITHIN, log_line, log_until};

/// `[tls]` on `port` with `certificates` (the one marked `true` the default), then `extra` keys.
fn tls_section(port: u16, certificates: &[(&TlsFiles, bool)], extra: &str) -> String {
    let mut text = format!("[tls]\nlisten = \"127.0.0.1:{port}\"\n{extra}\n");
    for (files, default) in certificates {
        text += &format!(
            "[[tls.certificates]]\ncert_file = \"{}\"\nkey_file = \"{}\"\n{}\n",
            files.cert.display(),
            files.key.display(),
            if *default { "default = true\n" } else { "" },
        );
    }
    text
}

fn route_to(origin: &Origin) -> String {
    format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        origin.base_url()
    )
}

/// rangeway with a TLS listener on a free port, presenting the `localhost` certificate, in front
/// of `origin`; and that port.
fn edge(pki: &TestPki, origin: &Origin) -> (Proxy, u16) {
    let port = free_port();
    let config =
        format!("{}{}", tls_section(port, &[(pki.localhost(), false)], ""), route_to(origin));
    (Proxy::start(&config), port)
}

/// curl trusting the test CA only.
fn curl(ca: &Path, args: &[&str]) -> ClientRun {
    let mut command = Command::new("curl");
    command.arg("-sS").arg("--cacert").arg(ca).args(args);
    run(command, CLIENT_TIMEOUT)
}

/// `openssl s_client -connect ADDR ARGS` with nothing to send: the handshake's report.
fn s_client(addr: SocketAddr, args: &[&str]) -> ClientRun {
    let mut command = Command::new("openssl");
    command.args(["s_client", "-connect", &addr.to_string()]).args(args);
    run(command, CLIENT_TIMEOUT)
}

/// The subject line s_client prints for the certificate the server chose.
fn subject(report: &ClientRun) -> String {
    report
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix("subject="))
        .unwrap_or_else(|| panic!("no certificate in the handshake:\n{report}"))
        .to_owned()
}

#[test]
fn curl_over_tls_on_http1_and_h2_gets_every_range_form_and_resumes() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(3_000_000, 19);
    let etag = origin.put("/obj.bin", object.clone());
    let (proxy, port) = edge(&pki, &origin);
    let url = format!("https://localhost:{port}/obj.bin");
    let ca = pki.ca_cert();
    let dir = TempDir::new("edge-curl");
    for (protocol, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let file = dir.join(format!("whole-{version}"));
        let whole =
            curl(ca, &[protocol, "-w", "%{http_version} %{http_code}", "-o", path(&file), &url]);
        whole.assert_success();
        assert_eq!(whole.stdout, format!("{version} 200"), "{protocol}");
        assert_eq!(sha256_file(&file), sha256_hex(&object), "{protocol}: the whole object");

        let n = object.len();
        for (spec, expected) in [
            ("0-99", &object[..100]),
            ("2999000-", &object[2_999_000..]),
            ("-4096", &object[n - 4096..]),
            ("1000000-1999999", &object[1_000_000..2_000_000]),
        ] {
            let part = dir.join("part");
            let ranged =
                curl(ca, &[protocol, "-r", spec, "-w", "%{http_code}", "-o", path(&part), &url]);
            assert_eq!(ranged.stdout, "206", "{protocol} {spec}: {ranged}");
            assert_eq!(std::fs::read(&part).unwrap(), expected, "{protocol} bytes={spec}");
        }

        let parts = dir.join("parts");
        let multipart = curl(
            ca,
            &[
                protocol,
                "-r",
                "0-9,1000-1009",
                "-w",
                "%{http_code} %{content_type}",
                "-o",
                path(&parts),
                &url,
            ],
        );
        assert!(
            multipart.stdout.starts_with("206 multipart/byteranges"),
            "{protocol}: {multipart}"
        );
        let body = std::fs::read(&parts).unwrap();
        for slice in [&object[..10], &object[1000..1010]] {
            assert!(body.windows(10).any(|w| w == slice), "{protocol}: a part is missing");
        }

        // If-Range: the current ETag keeps the range, another one gets the whole object.
        for (validator, status) in [(etag.as_str(), "206"), ("\"another\"", "200")] {
            let header = format!("If-Range: {validator}");
            let answered = curl(
                ca,
                &[
                    protocol,
                    "-r",
                    "0-9",
                    "-H",
                    &header,
                    "-w",
                    "%{http_code}",
                    "-o",
                    "/dev/null",
                    &url,
                ],
            );
            assert_eq!(answered.stdout, status, "{protocol} {header}");
        }

        let resumed = dir.join(format!("resumed-{version}"));
        write_partial(&resumed, &object, 1_234_567);
        let resume =
            curl(ca, &[protocol, "-C", "-", "-w", "%{http_code}", "-o", path(&resumed), &url]);
        assert_eq!(resume.stdout, "206", "{protocol} -C -: {resume}");
        assert_eq!(sha256_file(&resumed), sha256_hex(&object), "{protocol}: resumed");
    }

    // The origin is told what the client used: https, and the host it asked for.
    let plain = support::http::get(&proxy.url("/obj.bin"), &[("Range", "bytes=0-0")]);
    assert_eq!(plain.status, 206);
    let requests = origin.requests();
    let (last, over_tls) = requests.split_last().expect("the origin was asked");
    assert_eq!(last.header("x-forwarded-proto"), Some("http"));
    for request in over_tls {
        assert_eq!(request.header("x-forwarded-proto"), Some("https"), "{request:?}");
        assert_eq!(request.header("x-forwarded-host"), Some(format!("localhost:{port}").as_str()));
    }
}

fn path(file: &Path) -> &str {
    file.to_str().expect("a UTF-8 path")
}

#[test]
fn sni_chooses_a_certificate_by_name_wildcard_or_default() {
    let pki = TestPki::new();
    let exact = pki.leaf("a.example", "DNS:a.example", 30);
    let wildcard = pki.leaf("wildcard.b.example", "DNS:*.b.example", 30);
    let origin = Origin::start();
    origin.put("/x", "hello over tls".as_bytes().to_vec());
    let port = free_port();
    // The default is listed last: `default = true`, not the order, makes it so.
    let certificates = [(&exact, false), (&wildcard, false), (pki.localhost(), true)];
    let _proxy =
        Proxy::start(&format!("{}{}", tls_section(port, &certificates, ""), route_to(&origin)));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    for (name, chosen) in [
        (Some("a.example"), "CN = a.example"),
        (Some("A.Example"), "CN = a.example"),
        (Some("x.b.example"), "CN = wildcard.b.example"),
        // A wildcard stands for one label only.
        (Some("y.x.b.example"), "CN = localhost"),
        (Some("c.example"), "CN = localhost"),
        (None, "CN = localhost"),
    ] {
        let report = match name {
            Some(name) => s_client(addr, &["-servername", name]),
            None => s_client(addr, &["-noservername"]),
        };
        assert_eq!(subject(&report), chosen, "SNI {name:?}");
    }
    // Clients verify what they were given: the names served pass, another name fails.
    for name in ["a.example", "x.b.example", "localhost"] {
        let resolve = format!("{name}:{port}:127.0.0.1");
        let url = format!("https://{name}:{port}/x");
        let fetched = curl(pki.ca_cert(), &["--resolve", &resolve, &url]);
        fetched.assert_success();
        assert_eq!(fetched.stdout, "hello over tls");
    }
    let resolve = format!("c.example:{port}:127.0.0.1");
    let refused =
        curl(pki.ca_cert(), &["--resolve", &resolve, &format!("https://c.example:{port}/x")]);
    // 60: the peer's certificate cannot be authenticated (it names another host).
    assert_eq!(refused.code(), Some(60), "{refused}");
}

#[test]
fn tls_1_2_and_1_3_only_modern_ciphers_alpn_and_the_chain() {
    let pki = TestPki::new();
    let chained = pki.chained("localhost", "DNS:localhost");
    let origin = Origin::start();
    let [h2_port, h1_port] = [free_port(), free_port()];
    let _h2 = Proxy::start(&format!(
        "{}{}",
        tls_section(h2_port, &[(&chained, false)], ""),
        route_to(&origin)
    ));
    let _h1 = Proxy::start(&format!(
        "{}{}",
        tls_section(h1_port, &[(&chained, false)], "h2 = false"),
        route_to(&origin)
    ));
    let addr = SocketAddr::from(([127, 0, 0, 1], h2_port));
    let ca = pki.ca_cert().to_str().unwrap();
    // SECLEVEL=0 lets openssl offer the old versions, so the refusal is the server's.
    for (args, refused) in [
        (vec!["-tls1", "-cipher", "DEFAULT@SECLEVEL=0"], true),
        (vec!["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"], true),
        // No forward secrecy, CBC: not offered.
        (vec!["-tls1_2", "-cipher", "AES128-SHA"], true),
        (vec!["-tls1_2"], false),
        (vec!["-tls1_3"], false),
    ] {
        let report = s_client(addr, &[&args[..], &["-servername", "localhost"]].concat());
        assert_eq!(
            report.stderr.contains("alert handshake failure"),
            refused,
            "{args:?}: {report}"
        );
        assert_eq!(report.success(), !refused, "{args:?}: {report}");
    }
    let verified = s_client(addr, &["-servername", "localhost", "-CAfile", ca, "-showcerts"]);
    assert!(verified.stdout.contains("Verify return code: 0 (ok)"), "{verified}");
    // The leaf and the intermediate that chains it to the CA.
    assert_eq!(verified.stdout.matches("-----BEGIN CERTIFICATE-----").count(), 2, "{verified}");
    for (port, offered, chosen) in [
        (h2_port, "h2,http/1.1", "ALPN protocol: h2"),
        (h2_port, "http/1.1", "ALPN protocol: http/1.1"),
        (h1_port, "h2,http/1.1", "ALPN protocol: http/1.1"),
    ] {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let report = s_client(addr, &["-servername", "localhost", "-alpn", offered]);
        assert!(report.stdout.contains(chosen), "offered {offered} to {port}: {report}");
    }
}

#[test]
fn h2load_many_streams_on_one_connection_and_http1_beside() {
    let pki = TestPki::new();
    let origin = Origin::start();
    origin.put("/64k", test_bytes(65_536, 3));
    let (proxy, port) = edge(&pki, &origin);
    let url = format!("https://localhost:{port}/64k");
    // 400 requests on one connection, 100 streams at a time (the most rangeway allows).
    for args in [vec!["-n", "400", "-c", "1", "-m", "100"], vec!["-n", "200", "-c", "4", "--h1"]] {
        let mut command = Command::new("h2load");
        command.args(&args).arg(&url);
        let report = run(command, CLIENT_TIMEOUT);
        report.assert_success();
        let requests = args[1];
        let line = format!(
            "requests: {requests} total, {requests} started, {requests} done, {requests} succeeded"
        );
        assert!(report.stdout.contains(&line), "{args:?}: {report}");
        assert!(report.stdout.contains(&format!("status codes: {requests} 2xx")), "{report}");
    }
    // Every h2 stream was a download of its own.
    assert!(proxy.metric_at_least("rangeway_requests_total", "", 600) >= 600);
}

#[test]
fn wget_resumes_and_aria2c_splits_over_https() {
    let pki = TestPki::new();
    let origin = Origin::start();
    // Large enough that aria2c's other connections start before its first has it all: at 6 MB,
    // with this file's other tests running, it sometimes had (0 ranged requests, 2 of 5 runs).
    let object = test_bytes(48_000_000, 23);
    origin.put("/big.bin", object.clone());
    let (_proxy, port) = edge(&pki, &origin);
    let url = format!("https://localhost:{port}/big.bin");
    let ca = pki.ca_cert();
    let dir = TempDir::new("edge-clients");
    let file = dir.join("wget.bin");
    write_partial(&file, &object, 2_500_001);
    let mut wget = Command::new("wget");
    wget.arg("-c").arg("-q").arg("--ca-certificate").arg(ca).arg("-O").arg(&file).arg(&url);
    run(wget, CLIENT_TIMEOUT).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&object), "wget -c over https");

    let requests_before = origin.requests().len();
    let ca_option = format!("--ca-certificate={}", ca.display());
    let mut aria2c = Command::new("aria2c");
    aria2c
        .args(["-x8", "-s8", "-k1M", "--allow-overwrite=true", "--auto-file-renaming=false"])
        .arg(&ca_option)
        .arg("-d")
        .arg(dir.path())
        .args(["-o", "aria.bin", &url]);
    run(aria2c, CLIENT_TIMEOUT).assert_success();
    assert_eq!(sha256_file(&dir.join("aria.bin")), sha256_hex(&object), "aria2c -x8 over https");
    let ranged = origin.requests()[requests_before..]
        .iter()
        .filter(|request| request.header("range").is_some())
        .count();
    assert!(ranged >= 2, "aria2c split the download: {ranged} ranged requests");
}

#[test]
fn certificates_swapped_and_reloaded_during_downloads_over_tls() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(16 << 20, 29);
    origin.put("/long.bin", object.clone());
    let certs = TempDir::new("edge-reload");
    let served = TlsFiles { cert: certs.join("cert.pem"), key: certs.join("key.pem") };
    let install = |files: &TlsFiles| {
        std::fs::copy(&files.cert, &served.cert).unwrap();
        std::fs::copy(&files.key, &served.key).unwrap();
    };
    install(pki.localhost());
    let port = free_port();
    let log = certs.join("rangeway.log");
    let body = format!("{}{}", tls_section(port, &[(&served, false)], ""), route_to(&origin));
    let proxy = ProxyProcess::start_logged(&body, &[], &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    support::ports::wait_for_port(addr, WITHIN).expect("the TLS listener");
    let handshake = || subject(&s_client(addr, &["-servername", "localhost"]));
    assert_eq!(handshake(), "CN = localhost");

    // Two downloads of 16 MiB at 4 MiB/s, one on each protocol: in flight across both reloads.
    let url = format!("https://localhost:{port}/long.bin");
    let downloads: Vec<_> = ["--http1.1", "--http2"]
        .into_iter()
        .map(|protocol| {
            let file = certs.join(protocol.trim_start_matches('-'));
            let ca = pki.ca_cert().to_owned();
            let url = url.clone();
            let download = std::thread::spawn(move || {
                let args = [protocol, "--limit-rate", "4M", "-w", "%{http_code}", "-o"];
                curl(&ca, &[&args[..], &[path(&file), &url]].concat())
            });
            (download, certs.join(protocol.trim_start_matches('-')))
        })
        .collect();
    support::wait::until("both downloads under way", WITHIN, || {
        let started = |name: &str| std::fs::metadata(certs.join(name)).is_ok_and(|m| m.len() > 0);
        (started("http1.1") && started("http2")).then_some(())
    });

    let renewed = pki.leaf("localhost-renewed", "DNS:localhost", 90);
    install(&renewed);
    proxy.signal("HUP");
    log_line(&log, "SIGHUP: new TLS handshakes get the certificates read now");
    assert_eq!(handshake(), "CN = localhost-renewed", "the next handshake sees the new one");

    // A broken renewal: the running certificate stays, and the log says which file and why.
    std::fs::write(&served.cert, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    proxy.signal("HUP");
    let text = log_until(&log, "the refused reload", WITHIN, |text| {
        text.contains("the config has errors, the running one stays")
    });
    assert!(text.contains(&served.cert.display().to_string()), "{text}");
    assert_eq!(handshake(), "CN = localhost-renewed");

    for (download, file) in downloads {
        let report = download.join().unwrap();
        assert_eq!(report.stdout, "200", "{report}");
        assert_eq!(sha256_file(&file), sha256_hex(&object), "{} byte-exact", file.display());
    }
}

#[test]
fn check_names_the_certificate_file_and_the_fix() {
    let pki = TestPki::new();
    let dir = TempDir::new("edge-check");
    let garbage = TlsFiles { cert: dir.join("garbage.pem"), key: pki.localhost().key.clone() };
    std::fs::write(&garbage.cert, "not a certificate\n").unwrap();
    let mismatched =
        TlsFiles { cert: pki.localhost().cert.clone(), key: pki.wrong_name().key.clone() };
    let missing = TlsFiles { cert: dir.join("absent.pem"), key: dir.join("absent.key") };
    let check = |certificates: &[(&TlsFiles, bool)], extra: &str| {
        let config = dir.join("rangeway.toml");
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:{}\"\n{}{extra}[upstreams.origin]\nurl = \"http://127.0.0.1:9\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
            free_port(),
            tls_section(free_port(), certificates, "")
        );
        std::fs::write(&config, text).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_rangeway"));
        command.args(["check", "--config"]).arg(&config);
        run(command, CLIENT_TIMEOUT)
    };

    // Every bad certificate at once, each with its key, its file and the fix.
    let report = check(&[(&garbage, false), (&mismatched, false), (&missing, false)], "");
    assert!(!report.success(), "{report}");
    for expected in [
        format!(
            "tls.certificates[0] (line 6, column 1): {} holds no certificate",
            garbage.cert.display()
        ),
        "give the PEM certificate chain, leaf first".to_owned(),
        format!(
            "tls.certificates[1] (line 10, column 1): {} is not the key of {}",
            mismatched.key.display(),
            mismatched.cert.display()
        ),
        "give the key the certificate was issued for".to_owned(),
        format!("tls.certificates[2] (line 14, column 1): {}", missing.cert.display()),
    ] {
        assert!(report.stderr.contains(&expected), "missing {expected:?}:\n{report}");
    }

    let report = check(&[(pki.localhost(), true), (pki.wrong_name(), true)], "");
    assert!(report.stderr.contains("tls.certificates[1].default"), "{report}");

    // Expired or expiring: warned, not refused (a renewal may be on its way).
    let expired = pki.leaf("expired", "DNS:expired.example", -1);
    let expiring = pki.leaf("expiring", "DNS:expiring.example", 3);
    let report = check(&[(&expired, false), (&expiring, false), (pki.localhost(), false)], "");
    report.assert_success();
    let expired_line =
        format!("warning: tls.certificates[0]: {} expired on", expired.cert.display());
    let expiring_line =
        format!("warning: tls.certificates[1]: {} expires on", expiring.cert.display());
    assert!(report.stdout.contains(&expired_line), "{report}");
    assert!(report.stdout.contains(&expiring_line), "{report}");
    assert!(!report.stdout.contains("tls.certificates[2]"), "{report}");
}

/// An HTTP/2 frame: its 9-byte header, then `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a frame under 16 MiB").to_be_bytes();
    let mut bytes = vec![len[1], len[2], len[3], kind, flags];
    bytes.extend_from_slice(&stream.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// The HPACK block of `GET https://localhost/PATH`: indexed `:method GET` and `:scheme https`,
/// then `:path` and `:authority` as literals without indexing.
fn get_block(path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x87];
    for (index, value) in [(0x04, path), (0x01, "localhost")] {
        block.extend_from_slice(&[index, u8::try_from(value.len()).expect("a short header value")]);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// What an HTTP/2 client sends first (RFC 9113 §3.4), before its SETTINGS.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// `openssl s_client` connected to `addr` over TLS with ALPN h2, carrying the frames written to
/// its stdin and those read from its stdout.
fn h2_over_s_client(addr: SocketAddr) -> std::process::Child {
    Command::new("openssl")
        .args(["s_client", "-quiet", "-alpn", "h2", "-servername", "localhost"])
        .args(["-connect", &addr.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn openssl s_client")
}

/// What came back on an attacking connection, until the server closed it.
#[derive(Debug, Default)]
struct Answered {
    /// The error code of the server's GOAWAY, if it sent one.
    goaway: Option<u32>,
    headers: usize,
}

/// Sends `attack` (frames after the connection preface) to `addr` over TLS with ALPN h2, as
/// fast as the connection takes it, and reads what comes back until the server closes the
/// connection or `within` passes. openssl s_client carries the bytes both ways.
fn attack(addr: SocketAddr, attack: Vec<u8>, within: Duration) -> Answered {
    let mut client = h2_over_s_client(addr);
    let mut stdin = client.stdin.take().expect("a piped stdin");
    let mut stdout = client.stdout.take().expect("a piped stdout");
    let writer = std::thread::spawn(move || {
        let mut bytes = H2_PREFACE.to_vec();
        bytes.extend(frame(SETTINGS, 0, 0, &[]));
        bytes.extend(attack);
        // The server closing the connection mid-way ends the write: expected.
        let _ = stdin.write_all(&bytes);
        // Kept open (dropping it would end s_client's side): the reader decides when it ends.
        stdin
    });
    let (answered_tx, answered_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut answered = Answered::default();
        let mut head = [0u8; 9];
        while stdout.read_exact(&mut head).is_ok() {
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0; len];
            if stdout.read_exact(&mut payload).is_err() {
                break;
            }
            match head[3] {
                GOAWAY => {
                    answered.goaway = Some(u32::from_be_bytes(
                        payload[4..8].try_into().expect("a GOAWAY has an error code"),
                    ))
                }
                HEADERS => answered.headers += 1,
                _ => {}
            }
        }
        let _ = answered_tx.send(answered);
    });
    let answered = answered_rx.recv_timeout(within);
    let _ = client.kill();
    let _ = client.wait();
    drop(writer);
    answered
        .unwrap_or_else(|_| panic!("the server kept the attacking connection open for {within:?}"))
}

/// Bounds measured in debug builds on the 2-core machine (see docs/operations.md, "HTTP/2
/// abuse"): rapid reset and CONTINUATION floods cost at most this much memory beyond the
/// process's start.
const ABUSE_MEMORY_KIB: u64 = 64 * 1024;

#[test]
fn h2_rapid_reset_and_continuation_floods_are_cut_within_a_bound() {
    let pki = TestPki::new();
    let origin = Origin::start();
    origin.put("/small", "x".repeat(1024).into_bytes());
    let port = free_port();
    let dir = TempDir::new("edge-abuse");
    let log = dir.join("rangeway.log");
    let body =
        format!("{}{}", tls_section(port, &[(pki.localhost(), false)], ""), route_to(&origin));
    let proxy = ProxyProcess::start_logged(&body, &[], &log);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    support::ports::wait_for_port(addr, WITHIN).expect("the TLS listener");
    let (rss_before, _, cpu_before) = usage(proxy.pid());

    // Rapid reset (CVE-2023-44487): 20 000 streams, each opened and cancelled at once.
    let streams = 20_000u32;
    let mut flood = Vec::new();
    for n in 0..streams {
        let id = 2 * n + 1;
        flood.extend(frame(HEADERS, END_STREAM | END_HEADERS, id, &get_block("/small")));
        flood.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    let reset = attack(addr, flood, Duration::from_secs(60));
    // Streams cancelled before rangeway took them up count against the connection (h2's bound:
    // 20 pending), and the connection ends with ENHANCE_YOUR_CALM. (`attack` returning at all
    // means the server closed the connection; the GOAWAY itself can be lost, when the close
    // with the flood still unread makes the kernel reset the connection before s_client read it.)
    assert!(matches!(reset.goaway, None | Some(0xb)), "{reset:?}");
    let (_, _, cpu_after_reset) = usage(proxy.pid());

    // CONTINUATION flood: a header block that never ends, 16 KiB a frame.
    let mut flood = frame(HEADERS, END_STREAM, 1, &get_block("/small"));
    for _ in 0..1000 {
        flood.extend(frame(CONTINUATION, 0, 1, &[b'a'; 16_384]));
    }
    let continuation = attack(addr, flood, Duration::from_secs(30));
    // ENHANCE_YOUR_CALM, or COMPRESSION_ERROR for a block that cannot be decoded (or the GOAWAY
    // lost, as above): either way the connection ends before the flood does.
    assert!(matches!(continuation.goaway, None | Some(0xb | 0x9)), "{continuation:?}");

    let (rss_after, peak, cpu_after) = usage(proxy.pid());
    eprintln!(
        "rapid reset: {reset:?}, {} ticks for {streams} streams; continuation: {continuation:?}, {} ticks; RSS {rss_before} -> {rss_after} KiB (peak {peak})",
        cpu_after_reset - cpu_before,
        cpu_after - cpu_after_reset
    );
    assert!(
        peak.saturating_sub(rss_before) < ABUSE_MEMORY_KIB,
        "memory grew from {rss_before} KiB to a peak of {peak} KiB"
    );
    // The server is still there for everyone else.
    let fetched = curl(pki.ca_cert(), &["--http2", &format!("https://localhost:{port}/small")]);
    fetched.assert_success();
    assert_eq!(fetched.stdout.len(), 1024);
}

#[test]
fn client_limits_hold_on_tls_and_h2_connections() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(3_000_000, 37);
    origin.put("/slow.bin", object.clone());
    let port = free_port();
    let limits = "client_header_timeout = \"1s\"\nmax_connections_per_client = 3\n";
    let proxy = Proxy::start_with_server(
        &format!("{}{}", tls_section(port, &[(pki.localhost(), false)], ""), route_to(&origin)),
        limits,
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let refused = |reason: &str| proxy.metric("rangeway_client_connections_refused_total", reason);

    // An HTTP/2 download that lasts three times the header timeout: h2 frames are no header.
    let dir = TempDir::new("edge-limits");
    let file = dir.join("slow.bin");
    let url = format!("https://localhost:{port}/slow.bin");
    let args = ["--http2", "--limit-rate", "1M", "-w", "%{http_code}", "-o", path(&file), &url];
    let download = curl(pki.ca_cert(), &args);
    assert_eq!(download.stdout, "200", "{download}");
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    // A request whose answer takes twice the header timeout, on an HTTP/2 connection kept from
    // the one before it: no header clock runs on it.
    origin.put("/late", b"late".to_vec());
    origin.set_behaviour("/late", Behaviour::Delayed(Duration::from_secs(2)));
    let late = format!("https://localhost:{port}/late");
    let args = ["--http2", "-w", "%{http_code} %{num_connects}\n", "-o", "/dev/null"];
    let two = curl(pki.ca_cert(), &[&args[..], &[&url, "-o", "/dev/null", &late]].concat());
    assert_eq!(two.stdout, "200 1\n200 0\n", "{two}");

    // A handshake never begun is cut at the header timeout; one that is not TLS at once.
    let silent = std::net::TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = std::time::Instant::now();
    assert_eq!((&silent).read(&mut [0; 16]).unwrap_or(0), 0, "closed");
    assert!(started.elapsed() < Duration::from_secs(5), "cut after {:?}", started.elapsed());
    // Counted as the handshake is dropped, which is when the client sees the close: maybe after.
    support::wait::until("the cut handshake counted", WITHIN, || {
        (refused("header_timeout") == 1).then_some(())
    });
    let mut plain = std::net::TcpStream::connect(addr).unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = plain.read(&mut [0; 64]);
    support::wait::until("the failed handshake counted", WITHIN, || {
        (refused("tls_handshake") == 1).then_some(())
    });

    // Connections are counted before their handshake: the fourth from one address is closed.
    let held: Vec<_> = (0..3).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    support::wait::until("three connections admitted", WITHIN, || {
        let mut fourth = std::net::TcpStream::connect(addr).ok()?;
        fourth.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        matches!(fourth.read(&mut [0; 16]), Ok(0)).then_some(())
    });
    assert!(refused("per_client_limit") >= 1);
    drop(held);
}

#[test]
fn an_ocsp_response_is_stapled() {
    let pki = TestPki::new();
    let leaf = pki.leaf("stapled", "DNS:localhost", 30);
    let ocsp = pki.ocsp_response(&leaf);
    let origin = Origin::start();
    let port = free_port();
    let _proxy = Proxy::start(&format!(
        "[tls]\nlisten = \"127.0.0.1:{port}\"\n[[tls.certificates]]\ncert_file = \"{}\"\nkey_file = \"{}\"\nocsp_file = \"{}\"\n{}",
        leaf.cert.display(),
        leaf.key.display(),
        ocsp.display(),
        route_to(&origin)
    ));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let ca = pki.ca_cert().to_str().expect("a UTF-8 path");
    let report = s_client(addr, &["-servername", "localhost", "-status", "-CAfile", ca]);
    assert!(report.stdout.contains("OCSP Response Status: successful"), "{report}");
    assert!(report.stdout.contains("Cert Status: good"), "{report}");
}

#[test]
fn middleware_routes_resume_over_h2() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let object = test_bytes(2_000_000, 41);
    origin.put("/obj.bin", object.clone());
    let port = free_port();
    let _proxy = Proxy::start(&format!(
        "{}[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/gz/\"\nupstream = \"origin\"\nstrip_prefix = true\n  [[routes.middleware]]\n  kind = \"gzip\"\n\n[[routes]]\npath_prefix = \"/sum/\"\nupstream = \"origin\"\nstrip_prefix = true\n  [[routes.middleware]]\n  kind = \"checksum\"\n",
        tls_section(port, &[(pki.localhost(), false)], ""),
        origin.base_url()
    ));
    let ca = pki.ca_cert();
    let dir = TempDir::new("edge-stages");
    let gz_url = format!("https://localhost:{port}/gz/obj.bin");
    let gz = dir.join("first.gz");
    let raw = curl(ca, &["--http2", "-w", "%{http_version}", "-o", path(&gz), &gz_url]);
    assert_eq!(raw.stdout, "2", "{raw}");
    let gz_bytes = std::fs::read(&gz).expect("the gzip file");
    let decoded = support::clients::pipe(Command::new("gzip").arg("-dc"), &gz_bytes);
    assert_eq!(decoded, object, "gzip -dc reads what came over h2");
    // A resume of the gzip representation over h2: the same bytes as the whole one.
    let resumed = dir.join("resumed.gz");
    write_partial(&resumed, &gz_bytes, gz_bytes.len() / 3);
    let resume = curl(
        ca,
        &[
            "--http2",
            "-H",
            "Accept-Encoding: gzip",
            "-C",
            "-",
            "-w",
            "%{http_code}",
            "-o",
            path(&resumed),
            &gz_url,
        ],
    );
    assert_eq!(resume.stdout, "206", "{resume}");
    assert_eq!(std::fs::read(&resumed).expect("the resumed file"), gz_bytes);

    // The checksum route's digest, learned by the first download, in the second's header.
    let sum_url = format!("https://localhost:{port}/sum/obj.bin");
    let digest = format!("repr-digest: sha-256=:{}:", base64_sha256(&object));
    support::wait::until("the digest in the header", WITHIN, || {
        let headers = curl(ca, &["--http2", "-D", "-", "-o", "/dev/null", &sum_url]);
        headers.stdout.to_ascii_lowercase().contains(&digest.to_ascii_lowercase()).then_some(())
    });
}

/// What an origin says of its answer reaches HTTP/1.1 and HTTP/2 clients as it said it: the
/// `103 Early Hints` before the answer, with its `Link` (RFC 9110 §15.2), and the answer's own
/// `Date` (RFC 9110 §6.6.1: the time the origin made it, not the time rangeway relayed it).
#[test]
fn an_origins_early_hints_and_date_reach_http1_and_h2_clients() {
    const MADE: &str = "Tue, 01 Dec 2026 08:00:00 GMT";
    let pki = TestPki::new();
    let origin = Origin::start();
    origin.set_global_behaviour(Behaviour::Interim(103));
    let object = test_bytes(300_000, 47);
    origin.put_with_headers("/dated.bin", object.clone(), &[("Date", MADE)]);
    let (_proxy, port) = edge(&pki, &origin);
    let url = format!("https://localhost:{port}/dated.bin");
    let dir = TempDir::new("edge-interim");
    for (protocol, version) in [("--http1.1", "HTTP/1.1"), ("--http2", "HTTP/2")] {
        let body = dir.join(&protocol[2..]);
        let run = curl(pki.ca_cert(), &[protocol, "-D", "-", "-o", path(&body), &url]);
        let head = run.stdout.to_ascii_lowercase();
        let answers: Vec<&str> = head.split("\r\n\r\n").filter(|a| !a.trim().is_empty()).collect();
        assert_eq!(answers.len(), 2, "{protocol}: the hints, then the answer: {run}");
        let status = |answer: &str| answer.split_whitespace().nth(1).map(str::to_owned);
        assert!(answers[0].starts_with(&version.to_ascii_lowercase()), "{protocol}: {run}");
        assert_eq!(status(answers[0]).as_deref(), Some("103"), "{protocol}: {run}");
        assert!(answers[0].contains("link: </hint.css>; rel=preload"), "{protocol}: {run}");
        assert_eq!(status(answers[1]).as_deref(), Some("200"), "{protocol}: {run}");
        let date = format!("date: {}", MADE.to_ascii_lowercase());
        assert!(answers[1].contains(&date), "{protocol}: the origin's Date: {run}");
        assert!(std::fs::read(&body).expect("the body") == object, "{protocol}: the body");
    }
}

/// `sha-256=:BASE64:`'s BASE64 for `data`, as Repr-Digest carries it.
fn base64_sha256(data: &[u8]) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(data))
}

#[test]
fn chromium_downloads_over_h2() {
    const CHROMIUM: &str = "/usr/bin/chromium";
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: run scripts/deps.sh --test");
    let pki = TestPki::new();
    let folder = TempDir::new("edge-browser");
    let object = test_bytes(3_000_000, 43);
    std::fs::write(folder.join("obj.bin"), &object).expect("write the object");
    let page =
        "<!doctype html><title>download</title><a id=download href=/obj.bin download>get</a>";
    std::fs::write(folder.join("page.html"), page).expect("write the page");
    let port = free_port();
    let _proxy = Proxy::start(&format!(
        "{}[upstreams.folder]\ndir = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"folder\"\n",
        tls_section(port, &[(pki.localhost(), false)], ""),
        folder.path().display()
    ));
    let args = serde_json::json!({
        "page": format!("https://localhost:{port}/page.html"),
        "object": "/obj.bin",
        "chromium": CHROMIUM,
    });
    let mut browser = Command::new("python3");
    browser.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser_h2.py"));
    browser.arg(args.to_string());
    let browsing = run(browser, CLIENT_TIMEOUT);
    browsing.assert_success();
    let seen: serde_json::Value =
        serde_json::from_str(&browsing.stdout).expect("the script's JSON");
    // The page's network log: every request went over HTTP/2.
    assert_eq!(seen["navigation"], "h2", "{seen}");
    let resources = seen["resources"].as_array().expect("the resources");
    assert!(!resources.is_empty() && resources.iter().all(|p| p == "h2"), "{seen}");
    let digest = sha256_hex(&object);
    assert_eq!(
        (seen["status"].as_u64(), seen["sha256"].as_str()),
        (Some(200), Some(digest.as_str()))
    );
    let range: String = object[100..200].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(seen["range_status"], 206, "{seen}");
    assert_eq!(seen["range_hex"], range.as_str());
    assert_eq!(seen["download_failure"], serde_json::Value::Null, "{seen}");
    assert_eq!(seen["download_sha256"], digest.as_str(), "the clicked download");
}

/// A client that goes away while the origin is silent is noticed at once over TLS too: an
/// HTTP/1.1 client closing its connection, an HTTP/2 client resetting its stream (its connection
/// kept open) or closing the connection. The origin's request is dropped and the download ends.
#[test]
fn a_client_that_hangs_up_over_tls_or_resets_its_h2_stream_frees_a_silent_origin() {
    let pki = TestPki::new();
    let origin = Origin::start();
    origin.put("/silent", test_bytes(1 << 20, 43));
    origin.set_behaviour("/silent", Behaviour::Silent);
    origin.put("/stalled", test_bytes(200_000, 44));
    origin.set_behaviour("/stalled", Behaviour::SilentAfter(100_000));
    let port = free_port();
    let config = format!(
        "{}[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"60s\"\n\n\
         [[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        tls_section(port, &[(pki.localhost(), false)], ""),
        origin.base_url()
    );
    let proxy = Proxy::start(&config);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let active = || proxy.metric("rangeway_active_downloads", "");
    // Waits for the origin to have `asked` requests and the download to be under way; then
    // `hang_up`, and the origin must see its connection closed within two seconds.
    let hung_up_within_2s = |asked: usize, what: &str, hang_up: &mut dyn FnMut()| {
        let closed = origin.closed_while_silent();
        support::wait::until(&format!("{what}: the origin asked"), WITHIN, || {
            (origin.requests().len() == asked && active() == 1).then_some(())
        });
        std::thread::sleep(Duration::from_millis(200));
        let at = std::time::Instant::now();
        hang_up();
        support::wait::until(
            &format!("{what}: the origin's connection closed"),
            Duration::from_secs(2),
            || (origin.closed_while_silent() > closed).then_some(()),
        );
        eprintln!("{what}: the origin saw the hang-up after {:?}", at.elapsed());
        support::wait::until(&format!("{what}: the download over"), WITHIN, || {
            (active() == 0).then_some(())
        });
    };
    let mut asked = 0;
    for (protocol, path) in [
        ("--http1.1", "/silent"),
        ("--http1.1", "/stalled"),
        ("--http2", "/silent"),
        ("--http2", "/stalled"),
    ] {
        let url = format!("https://localhost:{port}{path}");
        let mut client = Command::new("curl")
            .args(["-sS", protocol, "--cacert"])
            .arg(pki.ca_cert())
            .args(["-o", "/dev/null", &url])
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn curl");
        asked += 1;
        hung_up_within_2s(asked, &format!("curl {protocol} {path}"), &mut || {
            let _ = client.kill();
            let _ = client.wait();
        });
    }
    // An HTTP/2 stream reset, the connection kept open.
    let mut client = h2_over_s_client(addr);
    let mut stdin = client.stdin.take().expect("a piped stdin");
    let mut stdout = client.stdout.take().expect("a piped stdout");
    // What the server sends (its SETTINGS, their ACK) is read and dropped.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let mut opening = H2_PREFACE.to_vec();
    opening.extend(frame(SETTINGS, 0, 0, &[]));
    opening.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &get_block("/silent")));
    stdin.write_all(&opening).expect("the request");
    stdin.flush().expect("the request");
    asked += 1;
    hung_up_within_2s(asked, "an h2 stream reset", &mut || {
        // CANCEL (0x8), as a browser cancelling a download.
        stdin.write_all(&frame(RST_STREAM, 0, 1, &8u32.to_be_bytes())).expect("the reset");
        stdin.flush().expect("the reset");
    });
    // A stream's reset is not the connection's end.
    assert!(client.try_wait().expect("s_client").is_none(), "the h2 connection was closed");
    let _ = client.kill();
    let _ = client.wait();
}

#[test]
fn an_idle_h2_connection_is_closed_after_client_keepalive_timeout() {
    let pki = TestPki::new();
    let origin = Origin::start();
    let port = free_port();
    let body =
        format!("{}{}", tls_section(port, &[(pki.localhost(), false)], ""), route_to(&origin));
    let _proxy = Proxy::start_with_server(&body, "client_keepalive_timeout = \"1s\"\n");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let opened = std::time::Instant::now();
    // The preface and SETTINGS, no stream: `attack` returns when the server closes the
    // connection (and fails the test if it is still open after 5 s).
    attack(addr, Vec::new(), Duration::from_secs(5));
    let closed = opened.elapsed();
    assert!(closed >= Duration::from_millis(900), "closed after {closed:?}, before the timeout");
}
