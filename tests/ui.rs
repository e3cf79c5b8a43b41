//! The live downloads page (`/ui` on the admin listener) in a real browser: Debian's chromium,
//! headless, driven by Playwright for Python (`tests/ui.py`), watching a throttled curl download
//! make progress through rangeway.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;
use sha2::{Digest, Sha256};
use support::clients::{CLIENT_TIMEOUT, run};
use support::data::test_bytes;
use support::http::get;
use support::origin::{Behaviour, Origin};
use support::proxy::ProxyProcess;
use support::tmp::TempDir;

/// Where Debian's package puts it; scripts/deps.sh installs it.
const CHROMIUM: &str = "/usr/bin/chromium";
const TOKEN: &str = "ui-test-token-5f1e0c";
const TOKEN_VAR: &str = "RANGEWAY_UI_TEST_TOKEN";

const LEN: usize = 16 * 1024 * 1024;
/// About 1 MiB/s: the whole object in ~16 s, in one response, started once the page is up, long
/// enough for it to look twice on a loaded machine; the page shows the response's progress while it lasts.
const SLOW: Behaviour = Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(250) };

/// A download id made to be markup: the page must show it as text.
const HOSTILE_ID: &str = "<img/src=x/onerror=document.title='pwned'><b>bold</b>";

/// Where the screenshot is kept after the run, for a human to look at.
fn screenshot_path() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-artifacts").join("downloads.png")
}

/// curl fetching `url` into `file` in one throttled response, as download `id`.
fn curl_download(id: &str, url: &str, file: &Path) -> Command {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "-H", &format!("X-Download-Id: {id}"), "-o"]).arg(file).arg(url);
    curl
}

#[test]
fn the_page_shows_a_download_making_progress() {
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: run scripts/deps.sh");
    let origin = Origin::start();
    let object = test_bytes(LEN, 31);
    origin.put("/big.bin", object.clone());
    origin.put("/small.bin", test_bytes(4096, 32));
    origin.set_behaviour("/big.bin", SLOW);
    let proxy = ProxyProcess::start_with(
        &format!(
            "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n  [[routes.middleware]]\n  kind = \"checksum\"\n  algorithms = [\"sha256\"]\n",
            origin.base_url()
        ),
        &format!("admin_token_env = \"{TOKEN_VAR}\""),
        &[(TOKEN_VAR, TOKEN)],
    );

    // The page itself holds no data and needs no token; the API does.
    let html = get(&proxy.admin_url("/ui"), &[]);
    assert_eq!(html.status, 200);
    assert_eq!(html.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(html.header("cache-control"), Some("no-store"));
    let csp = html.header("content-security-policy").expect("a Content-Security-Policy");
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe"), "{csp}");
    assert_eq!(get(&proxy.admin_url("/ui/app.js"), &[]).status, 200);
    assert_eq!(get(&proxy.admin_url("/v1/downloads"), &[]).status, 401);

    let hostile = get(&proxy.url("/small.bin"), &[("X-Download-Id", HOSTILE_ID)]);
    assert_eq!(hostile.status, 200);
    // Two pieces with a gap between them, for the strip to draw apart.
    for range in ["bytes=0-1023", "bytes=3072-3583"] {
        let piece = get(&proxy.url("/small.bin"), &[("X-Download-Id", "gappy"), ("Range", range)]);
        assert_eq!(piece.status, 206);
    }
    let work = TempDir::new("ui");
    let ready = work.join("page-ready");
    let screenshot = screenshot_path();
    std::fs::create_dir_all(screenshot.parent().expect("a folder")).expect("artifact folder");
    let _ = std::fs::remove_file(&screenshot);
    let page_args = serde_json::json!({
        "page": proxy.admin_url("/ui"),
        "token": TOKEN,
        "watch": "watched-1",
        "hostile": HOSTILE_ID,
        "gappy": "gappy",
        "ready": ready,
        "screenshot": screenshot,
        "chromium": CHROMIUM,
    });
    let mut browser = Command::new("python3");
    browser.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui.py"));
    browser.arg(page_args.to_string());
    let started = Instant::now();
    let browsing = thread::spawn(move || run(browser, CLIENT_TIMEOUT));
    // A browser that failed before the page was up is reported by its own run below.
    support::wait::until("the page showing downloads", CLIENT_TIMEOUT, || {
        (ready.exists() || browsing.is_finished()).then_some(())
    });
    let download = {
        let curl = curl_download("watched-1", &proxy.url("/big.bin"), &work.join("big.bin"));
        thread::spawn(move || run(curl, CLIENT_TIMEOUT))
    };
    let browsing = browsing.join().expect("the browser thread");
    browsing.assert_success();
    println!("the browser's run took {:?}", started.elapsed());
    let seen: Value = serde_json::from_str(&browsing.stdout).expect("the script's JSON");

    download.join().expect("the download thread").assert_success();
    assert_eq!(std::fs::read(work.join("big.bin")).expect("read"), object, "curl got the object");

    assert_eq!(seen["without_token"], "The admin API needs its token.", "{seen}");
    assert_eq!(seen["token_form_hidden"], true, "the token was taken: {seen}");
    let (first, second, last) = (&seen["first"], &seen["second"], &seen["final"]);
    let delivered = |row: &Value| row["delivered"].as_f64().expect("a number");
    assert!(delivered(first) > 0.0 && delivered(first) < LEN as f64, "{first}");
    assert!(delivered(second) > delivered(first), "progress on the live page: {first} {second}");
    assert_eq!(first["size"], LEN as f64, "{first}");
    for row in [first, second, last] {
        assert_eq!(row["id"], "watched-1", "{row}");
        assert_eq!(row["route"], "/", "{row}");
        assert_eq!(row["object"], "/big.bin", "{row}");
        assert_eq!(row["client"], "127.0.0.1", "{row}");
        assert!(row["segments"].as_u64() >= Some(1), "the strip draws the ranges: {row}");
        assert!(!row["started"].as_str().unwrap_or("").is_empty(), "{row}");
    }
    assert_eq!(second["state"], "active", "{second}");
    assert_eq!(last["segments"], 1, "{last}");
    assert!(second["rate"].as_str().is_some_and(|r| r.ends_with("/s")), "a rate: {second}");
    assert_eq!(delivered(last), LEN as f64, "{last}");
    let sha256 = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(&object));
    assert_eq!(last["digest"], format!("repr-digest: sha-256=:{sha256}:"), "{last}");

    let gappy = &seen["gappy"];
    assert_eq!((&gappy["segments"], &gappy["state"]), (&2.into(), &"active".into()), "{gappy}");
    assert_eq!(gappy["progress"], "1.5 KiB / 4.0 KiB (37.5%)", "{gappy}");

    // Data is text, never markup.
    assert_eq!(seen["hostile"]["id"], HOSTILE_ID, "{seen}");
    assert_eq!(seen["injected_elements"], 0, "{seen}");
    assert_ne!(seen["title"], "pwned");
    // The token lives in the tab's storage, never in an address; the policy was never broken.
    assert_eq!(seen["token_in_storage"], serde_json::json!([TOKEN]));
    assert!(!seen["url"].as_str().unwrap_or("").contains(TOKEN), "{seen}");
    let console = seen["console"].as_array().expect("console messages");
    assert!(
        console.iter().all(|m| {
            let m = m.as_str().unwrap_or("");
            !m.contains("Content Security Policy") && !m.starts_with("pageerror")
        }),
        "{console:?}"
    );

    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG at {}", screenshot.display());
    println!("screenshot: {} ({} bytes; {})", screenshot.display(), png.len(), seen["browser"]);
}

/// A client reading `/paced.bin` at about `rate` bytes a second through a small receive buffer
/// (so that its kernel holds little ahead of it), as a rate-limited curl reads; counts what it
/// read into `read`.
fn paced_download(
    url: std::net::SocketAddr,
    id: &str,
    rate: usize,
    read: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> thread::JoinHandle<()> {
    use std::io::{Read, Write};
    let request = format!(
        "GET /paced.bin HTTP/1.1\r\nHost: {url}\r\nX-Download-Id: {id}\r\nConnection: close\r\n\r\n"
    );
    thread::spawn(move || {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket.set_recv_buffer_size(64 * 1024).expect("SO_RCVBUF");
        socket.connect(&url.into()).expect("connect");
        let mut stream = std::net::TcpStream::from(socket);
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        stream.write_all(request.as_bytes()).expect("request");
        // Steps of a tenth of a second, as curl's --limit-rate paces its reads.
        let step = rate / 10;
        let mut buffer = vec![0; step];
        let started = Instant::now();
        let mut total = 0usize;
        loop {
            let mut got = 0;
            while got < step {
                match stream.read(&mut buffer[got..]) {
                    Ok(n) if n > 0 => got += n,
                    // The end, or the proxy stopped once the test has seen enough.
                    _ => return,
                }
            }
            total += got;
            read.fetch_add(got as u64, std::sync::atomic::Ordering::Relaxed);
            let due = Duration::from_secs_f64(total as f64 / rate as f64);
            thread::sleep(due.saturating_sub(started.elapsed()));
        }
    })
}

/// A download whose client reads slower than the origin sends: the admin API's bytes (which the
/// page's rate is taken from, between polls) follow what the client takes, so the rate is near
/// the client's, not 0 B/s while the kernel's buffers drain.
#[test]
fn a_slow_clients_download_moves_at_its_rate_in_the_live_view() {
    const RATE: usize = 1024 * 1024;
    let origin = Origin::start();
    origin.put("/paced.bin", test_bytes(64 * 1024 * 1024, 33));
    // A route of rangeway's own writes (a middleware chain), whose client socket queues what the
    // kernel lets it, megabytes on loopback.
    let proxy = ProxyProcess::start(&format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n  [[routes.middleware]]\n  kind = \"checksum\"\n  algorithms = [\"sha256\"]\n",
        origin.base_url()
    ));
    let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let addr: std::net::SocketAddr =
        proxy.url("").trim_start_matches("http://").parse().expect("the proxy's address");
    let client = paced_download(addr, "paced-1", RATE, std::sync::Arc::clone(&read));

    let bytes = || -> Option<u64> {
        let page = get(&proxy.admin_url("/v1/downloads"), &[]);
        let page: Value = serde_json::from_slice(&page.body).ok()?;
        let downloads = page["downloads"].as_array()?;
        downloads.iter().find(|d| d["id"] == "paced-1").and_then(|d| d["bytes"].as_u64())
    };
    support::wait::until("the download in the live view", CLIENT_TIMEOUT, bytes);
    // Past the start, when the buffers on the way fill.
    thread::sleep(Duration::from_secs(2));
    // Polled as the page polls; each rate over two seconds, as the page's window holds several.
    let mut samples = Vec::new();
    for _ in 0..9 {
        let taken = read.load(std::sync::atomic::Ordering::Relaxed);
        samples.push((Instant::now(), bytes().expect("still in flight"), taken));
        thread::sleep(Duration::from_secs(1));
    }
    for pair in samples.windows(3) {
        let ((at, before, _), (later, after, taken)) = (pair[0], pair[2]);
        let rate = (after - before) as f64 / (later - at).as_secs_f64();
        assert!(
            rate > RATE as f64 * 0.3 && rate < RATE as f64 * 3.0,
            "the live view's rate is {rate:.0} B/s where the client reads {RATE} B/s: {samples:?}"
        );
        // What the view counts is what the client took, give or take what its small receive
        // buffer and one chunk hold, never megabytes ahead.
        assert!(after <= taken + 1024 * 1024, "{after} counted, {taken} read: {samples:?}");
    }
    drop(proxy);
    client.join().expect("the client");
}
