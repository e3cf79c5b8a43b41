//! `rangeway get` against real servers: rangeway's routes (passthrough, checksum, gzip,
//! aes128gcm), nginx over http and https, S3 through rangeway; `kill -9` at random moments of
//! one large parallel download, with the object replaced between two of them; servers that lie,
//! ignore Range, have no ETag, or drop connections.

mod support;

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use rangeway_middleware::checksum::repr_digest;
use sha2::{Digest as _, Sha256};
use support::clients::{CLIENT_TIMEOUT, ClientRun, run, sha256_file, sha256_hex};
use support::data::test_bytes;
use support::nginx::{Nginx, NginxOptions};
use support::origin::{Behaviour, Faults, Origin};
use support::proxy::Proxy;
use support::s3::{ACCESS_KEY, S3Server, SECRET_KEY, credentials_file};
use support::tls::TestPki;
use support::tmp::TempDir;

/// `rangeway get URL -o FILE ARGS`, with no proxy from the test's environment.
fn get(url: &str, file: &Path, args: &[&str]) -> ClientRun {
    run(get_command(url, file, args), CLIENT_TIMEOUT)
}

fn get_command(url: &str, file: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rangeway"));
    command.args(["get", url, "-o"]).arg(file).args(args);
    for proxy in
        ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]
    {
        command.env_remove(proxy);
    }
    command
}

/// Ranged GETs the origin received for `path`.
fn ranged_gets(origin: &Origin, path: &str) -> usize {
    origin
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.target == path && r.header("range").is_some())
        .count()
}

#[test]
fn every_route_downloads_byte_exact_with_one_and_eight_connections_and_is_verified() {
    let origin = Origin::start();
    let object = test_bytes(6 * 1024 * 1024 + 12_345, 3);
    origin.put("/object.bin", object.clone());
    let work = TempDir::new("get-routes");
    let key_file = work.join("keys");
    std::fs::write(&key_file, "k1=AAECAwQFBgcICQoLDA0ODw\n").expect("write keys");
    let route = |prefix: &str, stages: &str| {
        format!(
            "\n[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n{stages}"
        )
    };
    let stage =
        |kind: &str, extra: &str| format!("  [[routes.middleware]]\n  kind = \"{kind}\"\n{extra}");
    let aes = format!("  key_file = \"{}\"\n", key_file.display());
    let config = format!(
        "[upstreams.origin]\nurl = \"{}\"\n{}{}{}{}",
        origin.base_url(),
        route("/plain/", ""),
        route("/sum/", &stage("checksum", "")),
        route("/gz/", &(stage("checksum", "") + &stage("gzip", "  level = 1\n"))),
        route("/enc/", &(stage("checksum", "") + &stage("aes128gcm", &aes))),
    );
    let proxy = Proxy::start(&config);
    // What the routes publish is learned by a first pass: one download through each.
    for prefix in ["/sum/", "/gz/", "/enc/"] {
        let url = proxy.url(&format!("{prefix}object.bin"));
        support::http::get(&url, &[]);
        support::http::head_until(&url, |r| {
            r.header("repr-digest").or(r.header("x-origin-digest")).is_some()
        });
    }
    let key = key_file.to_str().expect("a UTF-8 path");
    for connections in ["1", "8"] {
        for (prefix, decode, verified) in [
            ("/plain/", &[][..], None),
            ("/sum/", &[][..], Some("verified: sha-256 (repr-digest), crc32 (x-checksum-crc32)")),
            ("/gz/", &["--gunzip"][..], Some("sha-256 (x-origin-digest) after decoding")),
            (
                "/enc/",
                &["--decrypt", "--key-file", key][..],
                Some("sha-256 (x-origin-digest) after decoding"),
            ),
        ] {
            let file = work.join(format!("{}-{connections}.bin", prefix.trim_matches('/')));
            let args = [&["-x", connections][..], decode].concat();
            let ran = get(&proxy.url(&format!("{prefix}object.bin")), &file, &args);
            ran.assert_success();
            assert_eq!(
                sha256_file(&file),
                sha256_hex(&object),
                "{prefix} -x {connections}: byte-exact"
            );
            if let Some(verified) = verified {
                assert!(ran.stderr.contains(verified), "{prefix}: {}", ran.stderr);
            }
            assert!(!Path::new(&format!("{}.part", file.display())).exists(), "no part file left");
        }
    }
    // Eight connections made eight pieces, each a ranged request to the origin.
    let pieces = ranged_gets(&origin, "/object.bin");
    assert!(pieces >= 8, "{pieces} ranged requests");
}

#[test]
fn nginx_over_http_and_https_and_s3_through_rangeway() {
    let root = TempDir::new("get-nginx");
    let object = test_bytes(20 * 1024 * 1024 + 1, 5);
    std::fs::write(root.join("release.iso"), &object).expect("write the object");
    let work = TempDir::new("get-nginx-work");
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    // Paced, so the first connection cannot read the whole object before the other seven have
    // connected: on loopback it can, and then there is no piece left worth a request of its own.
    for connections in ["1", "8"] {
        let file = work.join(format!("http-{connections}.iso"));
        let args = ["-x", connections, "-v", "--limit-rate", "64M"];
        get(&nginx.url("/release.iso"), &file, &args).assert_success();
        assert_eq!(sha256_file(&file), sha256_hex(&object));
    }
    let ranged = nginx.access_log().lines().filter(|line| line.contains(" 206 ")).count();
    assert!(ranged >= 8, "eight connections, each a 206:\n{}", nginx.access_log());
    // A known digest to hold the file to, right and wrong.
    let file = work.join("sha.iso");
    get(&nginx.url("/release.iso"), &file, &["--sha256", &sha256_hex(&object)]).assert_success();
    let wrong =
        get(&nginx.url("/release.iso"), &work.join("wrong.iso"), &["--sha256", &"0".repeat(64)]);
    assert_eq!(wrong.code(), Some(3), "{wrong}");

    let pki = TestPki::new();
    let mut options = NginxOptions::serving(root.path());
    options.tls = Some(pki.localhost().clone());
    let https = Nginx::start(options);
    let file = work.join("https.iso");
    let ca = pki.ca_cert().to_str().expect("a UTF-8 path");
    get(&https.url("/release.iso"), &file, &["-x", "4", "--cacert", ca]).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    // Through a real forward proxy: a CONNECT tunnel, TLS inside it.
    let proxy = Tinyproxy::start();
    let mut command = get_command(
        &https.url("/release.iso"),
        &work.join("tunnel.iso"),
        &["-x", "2", "--cacert", ca],
    );
    command.env("https_proxy", format!("http://{}", proxy.addr));
    run(command, CLIENT_TIMEOUT).assert_success();
    assert_eq!(sha256_file(&work.join("tunnel.iso")), sha256_hex(&object));
    let log = proxy.log();
    assert!(log.contains(&format!("CONNECT localhost:{}", https.addr().port())), "{log}");
    let untrusted = get(&https.url("/release.iso"), &work.join("untrusted.iso"), &[]);
    assert_eq!(untrusted.code(), Some(1), "a certificate no root vouches for: {untrusted}");
    assert!(untrusted.stderr.contains("certificate"), "{untrusted}");

    let s3 = S3Server::start();
    s3.bucket("releases");
    s3.put("releases", "v1/release.iso", &object);
    let config = format!(
        "[upstreams.store]\nurl = \"{}\"\nbucket = \"releases\"\ncredentials_file = \"{}\"\n\n[[routes]]\npath_prefix = \"/s3/\"\nupstream = \"store\"\nstrip_prefix = true\n",
        s3.url(),
        credentials_file(&work, ACCESS_KEY, SECRET_KEY).display()
    );
    let proxy = Proxy::start(&config);
    let file = work.join("s3.iso");
    get(&proxy.url("/s3/v1/release.iso"), &file, &["-x", "8"]).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&object));
}

/// tinyproxy on a free port, in the foreground, logging every connection; killed on drop.
struct Tinyproxy {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    dir: TempDir,
}

impl Tinyproxy {
    fn start() -> Self {
        let dir = TempDir::new("tinyproxy");
        let port = support::ports::free_port();
        // Run as root, tinyproxy needs a user to become.
        let config = format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nAllow 127.0.0.1\nMaxClients 50\nUser nobody\nGroup nogroup\nLogLevel Connect\n"
        );
        std::fs::write(dir.join("tinyproxy.conf"), config).expect("write the config");
        let log = std::fs::File::create(dir.join("out.log")).expect("a log file");
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(dir.join("tinyproxy.conf"))
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("spawn tinyproxy (scripts/deps.sh installs it)");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        support::ports::wait_for_port(addr, Duration::from_secs(10)).expect("tinyproxy listens");
        Self { child, addr, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("out.log")).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small deterministic generator for the kill schedule.
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    *seed >> 33
}

/// Whether what the control file beside `part` claims is on disk is the object it names:
/// the start, end and a few windows of each span it lists, compared with `versions`' bytes.
fn claims_hold(part: &Path, versions: &[(&str, &[u8])], seed: &mut u64) -> Result<(), String> {
    let Ok(control) = std::fs::read_to_string(format!("{}.ctl", part.display())) else {
        return Ok(());
    };
    let field = |key: &str| control.lines().find_map(|l| l.strip_prefix(key)).map(str::to_owned);
    let etag = field("etag ").ok_or("a control file without an etag")?;
    let (_, object) = versions
        .iter()
        .find(|(tag, _)| etag.contains(tag))
        .ok_or(format!("an unknown version {etag}"))?;
    let file = std::fs::File::open(part).map_err(|e| e.to_string())?;
    for span in field("done ").unwrap_or_default().split(',').filter(|s| !s.is_empty()) {
        let (first, last) = span.split_once('-').ok_or("a bad span")?;
        let (first, last): (u64, u64) =
            (first.parse().map_err(|_| "a bad span")?, last.parse().map_err(|_| "a bad span")?);
        let mut windows = vec![first, last.saturating_sub(4095).max(first)];
        windows.extend((0..4).map(|_| first + next(seed) % (last - first + 1)));
        for at in windows {
            let len = (last + 1 - at).min(4096) as usize;
            let mut on_disk = vec![0; len];
            file.read_exact_at(&mut on_disk, at)
                .map_err(|e| format!("{span}: claimed, not on disk: {e}"))?;
            if on_disk[..] != object[at as usize..at as usize + len] {
                return Err(format!("bytes at {at} claimed done ({span}) are not the object's"));
            }
        }
    }
    Ok(())
}

#[test]
fn twenty_kill_nines_during_a_parallel_gigabyte_and_a_replaced_object_end_whole() {
    let root = TempDir::new("get-kill");
    let first = test_bytes(1 << 30, 7);
    let second = test_bytes(1 << 30, 8);
    let object = root.join("big.bin");
    std::fs::write(&object, &first).expect("write the object");
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let etag_of = |url: &str| {
        support::http::head(url, &[])
            .header("etag")
            .map(|e| e.trim_matches('"').to_owned())
            .expect("an etag")
    };
    let url = nginx.url("/big.bin");
    let first_tag = etag_of(&url);
    let work = TempDir::new("get-kill-work");
    let file = work.join("big.bin");
    let part = work.join("big.bin.part");
    let mut seed = 0x5eed;
    let mut second_tag = None;
    let mut started_over = false;
    for kill in 0..20 {
        if kill == 8 {
            // A new version, whole, under the same name (a new mtime: a new nginx ETag).
            std::thread::sleep(Duration::from_millis(1100));
            let staged = root.join("big.bin.new");
            std::fs::write(&staged, &second).expect("write the new version");
            std::fs::rename(&staged, &object).expect("replace the object");
            second_tag = Some(etag_of(&url));
        }
        let mut child = get_command(&url, &file, &["-x", "8", "--limit-rate", "96M"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn rangeway get");
        std::thread::sleep(Duration::from_millis(150 + next(&mut seed) % 900));
        child.kill().expect("kill -9");
        child.wait().expect("reap it");
        let mut stderr = String::new();
        child.stderr.take().expect("piped").read_to_string(&mut stderr).expect("its stderr");
        started_over |= stderr.contains("changed");
        assert!(!file.exists(), "killed before the end: no file yet");
        let mut versions: Vec<(&str, &[u8])> = vec![(&first_tag, &first)];
        if let Some(tag) = &second_tag {
            versions.push((tag, &second));
        }
        claims_hold(&part, &versions, &mut seed)
            .unwrap_or_else(|e| panic!("after kill {kill}: {e}"));
    }
    let last = get(&url, &file, &["-x", "8"]);
    last.assert_success();
    started_over |= last.stderr.contains("changed");
    assert!(started_over, "the change was seen and the download started over");
    assert_eq!(sha256_file(&file), sha256_hex(&second), "the new version, whole, never a mix");
}

/// A server answering every request with `response` (head and body as given), then closing.
fn canned(response: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("an address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = [0; 4096];
            let _ = stream.read(&mut head);
            let _ = stream.write_all(&response);
        }
    });
    format!("http://{addr}")
}

#[test]
fn servers_that_lie_are_refused_and_the_part_file_kept() {
    let origin = Origin::start();
    let object = test_bytes(3 * 1024 * 1024, 9);
    origin.put("/moved.bin", object.clone());
    origin.set_behaviour("/moved.bin", Behaviour::WrongRange(1000));
    // The Repr-Digest of other bytes, written as rangeway writes its own.
    let wrong_digest = repr_digest(&Sha256::digest(b"another object").into());
    origin.put_with_headers("/digest.bin", object.clone(), &[("Repr-Digest", &wrong_digest)]);
    let work = TempDir::new("get-liars");

    let file = work.join("moved.bin");
    let moved = get(&origin.url("/moved.bin"), &file, &[]);
    assert_eq!(moved.code(), Some(4), "{moved}");
    assert!(moved.stderr.contains("asked for bytes=0-, the server sent bytes 1000-"), "{moved}");
    assert!(!file.exists());

    let file = work.join("digest.bin");
    let mismatch = get(&origin.url("/digest.bin"), &file, &["-x", "4"]);
    assert_eq!(mismatch.code(), Some(3), "{mismatch}");
    assert!(mismatch.stderr.contains("sha-256 mismatch: repr-digest states"), "{mismatch}");
    assert!(!file.exists(), "a file that fails its digest is not given its name");
    assert_eq!(sha256_file(&work.join("digest.bin.part")), sha256_hex(&object), "kept as .part");

    let short = canned(
        b"HTTP/1.1 206 Partial Content\r\nETag: \"x\"\r\nContent-Range: bytes 0-999/1000\r\nContent-Length: 500\r\n\r\n"
            .iter()
            .chain(&[b'a'; 500])
            .copied()
            .collect(),
    );
    let file = work.join("short.bin");
    let lied = get(&format!("{short}/short.bin"), &file, &[]);
    assert_eq!(lied.code(), Some(4), "{lied}");
    assert!(
        lied.stderr.contains("Content-Length 500 for Content-Range bytes 0-999/1000"),
        "{lied}"
    );
}

#[test]
fn servers_that_ignore_range_have_no_etag_or_drop_connections_are_downloaded_whole() {
    let origin = Origin::start();
    let object = test_bytes(8 * 1024 * 1024 + 3, 10);
    let work = TempDir::new("get-awkward");
    let check = |path: &str, args: &[&str]| -> ClientRun {
        let file = work.join(path.trim_start_matches('/'));
        let ran = get(&origin.url(path), &file, args);
        ran.assert_success();
        assert_eq!(sha256_file(&file), sha256_hex(&object), "{path}");
        ran
    };

    origin.put("/whole.bin", object.clone());
    origin.set_behaviour("/whole.bin", Behaviour::IgnoreRange);
    let ran = check("/whole.bin", &["-x", "8"]);
    assert!(ran.stderr.contains("one connection"), "{ran}");
    let gets =
        origin.requests().iter().filter(|r| r.method == "GET" && r.target == "/whole.bin").count();
    assert_eq!(gets, 1, "one request, one whole body");

    // Last-Modified a minute before the answer's Date: strong, so pieces and If-Range by date.
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    origin.put_modified("/dated.bin", object.clone(), &[], an_hour_ago);
    origin.set_behaviour("/dated.bin", Behaviour::NoEtag);
    // Paced, so the first connection has not read it all before the other three ask for pieces.
    check("/dated.bin", &["-x", "4", "--limit-rate", "32M"]);
    let by_date = origin
        .requests()
        .into_iter()
        .filter(|r| r.target == "/dated.bin" && r.header("if-range").is_some());
    assert!(by_date.count() >= 3, "pieces pinned by Last-Modified");
    // Modified no earlier than the answer's Date (here, a clock ahead of the origin's): weak,
    // however long the test has run.
    let ahead = SystemTime::now() + Duration::from_secs(3600);
    origin.put_modified("/fresh.bin", object.clone(), &[], ahead);
    origin.set_behaviour("/fresh.bin", Behaviour::NoEtag);
    check("/fresh.bin", &["-x", "4"]);
    assert!(
        origin
            .requests()
            .iter()
            .filter(|r| r.target == "/fresh.bin")
            .all(|r| r.header("if-range").is_none())
    );

    origin.put("/flaky.bin", object.clone());
    let faults = Faults {
        seed: 11,
        error_percent: 20,
        cut_percent: 60,
        stall_percent: 0,
        stall: Duration::ZERO,
    };
    origin.set_behaviour("/flaky.bin", Behaviour::Faulty(faults));
    check("/flaky.bin", &["-x", "4", "--retry-for", "30s"]);

    origin.put("/gone.bin", object.clone());
    let missing = get(&origin.url("/missing.bin"), &work.join("missing.bin"), &[]);
    assert_eq!(missing.code(), Some(6), "{missing}");
    assert!(missing.stderr.contains("the server answered 404"), "{missing}");
}

#[test]
fn a_proxy_from_the_environment_carries_the_requests() {
    let origin = Origin::start();
    let object = test_bytes(2 * 1024 * 1024, 12);
    origin.put("/via-proxy.bin", object.clone());
    let work = TempDir::new("get-proxy");
    let file = work.join("via-proxy.bin");
    // The origin stands in as a forward proxy: requests reach it in absolute form.
    let mut command = get_command("http://downloads.invalid/via-proxy.bin", &file, &["-x", "2"]);
    command.env("http_proxy", origin.base_url());
    run(command, CLIENT_TIMEOUT).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    let requests = origin.requests();
    assert!(!requests.is_empty());
    assert!(
        requests.iter().all(|r| r.target == "http://downloads.invalid/via-proxy.bin"),
        "{requests:?}"
    );
    assert!(requests.iter().all(|r| r.header("host") == Some("downloads.invalid")));
    let ids: std::collections::HashSet<_> =
        requests.iter().filter_map(|r| r.header("x-download-id")).collect();
    assert_eq!(ids.len(), 1, "one download id on every request");

    let usage = get("ftp://x/y", &PathBuf::from("y"), &[]);
    assert_eq!(usage.code(), Some(2), "{usage}");
}
