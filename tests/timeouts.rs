//! Every wait on an origin has an end: an origin that never answers gets the client a 504
//! within the upstream's `read_timeout`; a client that hangs up while the origin is silent has
//! its origin request dropped at once, on every way a body goes (relayed, spliced, paced, from
//! the cache). (TLS and HTTP/2 hang-ups: tests/edge_tls.rs.)

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::data::test_bytes;
use support::http::{RawRequest, request};
use support::origin::{Behaviour, Origin};
use support::proxy::Proxy;
use support::tmp::TempDir;
use support::wait::{WITHIN, until};

/// How soon a client's hang-up must reach the origin.
const HANG_UP_NOTICED: Duration = Duration::from_secs(2);

/// An upstream `origin` with `read_timeout`, then one route per `(prefix, extra route keys)`.
fn routes(origin: &Origin, read_timeout: &str, routes: &[(&str, &str)]) -> String {
    let mut config = format!(
        "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"{read_timeout}\"\n",
        origin.base_url()
    );
    for (prefix, keys) in routes {
        config += &format!(
            "\n[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n{keys}\n"
        );
    }
    config
}

#[test]
fn an_origin_that_never_answers_is_a_504_within_read_timeout() {
    let origin = Origin::start();
    origin.put("/hung", b"never sent".to_vec());
    origin.set_behaviour("/hung", Behaviour::Silent);
    let proxy = Proxy::start(&routes(&origin, "1s", &[("/", "")]));
    for (path, method) in [("/hung", "GET"), ("/hung", "HEAD")] {
        let started = Instant::now();
        let response =
            request(proxy.addr(), &RawRequest::new(method, path)).expect("an answer from rangeway");
        let took = started.elapsed();
        assert_eq!(response.status, 504, "{method} {path}");
        assert!(took < Duration::from_secs(2), "{method} {path}: answered after {took:?}");
        assert!(took >= Duration::from_millis(900), "{method} {path}: after {took:?}");
    }
    let timeouts = proxy.metric_at_least("rangeway_upstream_errors_total", "kind=\"timeout\"", 2);
    assert!(timeouts >= 2, "{timeouts} timeouts counted");
    assert_eq!(proxy.metric("rangeway_active_downloads", ""), 0);
}

/// curl downloading `url`, its output thrown away.
fn curl(url: &str) -> Child {
    Command::new("curl")
        .args(["-sS", "-o", "/dev/null", url])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn curl (scripts/deps.sh installs it)")
}

/// Runs a download of `path` with curl, kills curl once the origin has the request and the
/// download is under way, and checks that the origin sees its connection closed within
/// [`HANG_UP_NOTICED`] and the download is over.
fn hang_up_on(proxy: &Proxy, origin: &Origin, path: &str) {
    let closed_before = origin.closed_while_silent();
    let asked_before = origin.requests().len();
    let mut client = curl(&proxy.url(path));
    until(&format!("the origin asked for {path}"), WITHIN, || {
        (origin.requests().len() > asked_before).then_some(())
    });
    until(&format!("{path} under way"), WITHIN, || {
        (proxy.metric("rangeway_active_downloads", "") == 1).then_some(())
    });
    // Long enough for the relay to be waiting on the origin, not setting out.
    std::thread::sleep(Duration::from_millis(200));
    let hung_up = Instant::now();
    client.kill().expect("kill curl");
    let _ = client.wait();
    until(&format!("the origin's connection for {path} closed"), HANG_UP_NOTICED, || {
        (origin.closed_while_silent() > closed_before).then_some(())
    });
    let noticed = hung_up.elapsed();
    until(&format!("{path} no longer under way"), WITHIN, || {
        (proxy.metric("rangeway_active_downloads", "") == 0).then_some(())
    });
    eprintln!("{path}: the origin saw the hang-up after {noticed:?}");
}

#[test]
fn a_client_that_hangs_up_on_a_silent_origin_frees_it_on_http1() {
    let origin = Origin::start();
    let large = test_bytes(1 << 20, 5);
    let medium = test_bytes(200_000, 6);
    for prefix in ["", "/paced"] {
        origin.put(&format!("{prefix}/silent"), large.clone());
        origin.set_behaviour(&format!("{prefix}/silent"), Behaviour::Silent);
        // Spliced: 1 MiB untouched, its header sent at once, then the origin falls silent.
        origin.put(&format!("{prefix}/spliced"), large.clone());
        origin.set_behaviour(&format!("{prefix}/spliced"), Behaviour::SilentAfter(0));
        // Relayed: past the 64 KiB held before the header, then silent.
        origin.put(&format!("{prefix}/relayed"), medium.clone());
        origin.set_behaviour(&format!("{prefix}/relayed"), Behaviour::SilentAfter(100_000));
        // Held: less than the 64 KiB the header waits for.
        origin.put(&format!("{prefix}/held"), medium.clone());
        origin.set_behaviour(&format!("{prefix}/held"), Behaviour::SilentAfter(1000));
    }
    // A read timeout far beyond the test: only the hang-up can end these requests in time.
    let proxy = Proxy::start(&routes(
        &origin,
        "60s",
        &[("/paced", "[routes.rate_limit]\nrate = \"1MiB\""), ("/", "")],
    ));
    for path in ["/silent", "/spliced", "/relayed", "/held"] {
        hang_up_on(&proxy, &origin, path);
        hang_up_on(&proxy, &origin, &format!("/paced{path}"));
    }
    assert!(proxy.metric("rangeway_transport_total", "transport=\"splice\"") >= 2);
}

#[test]
fn a_client_that_hangs_up_on_a_cache_fill_frees_its_origin() {
    let origin = Origin::start();
    origin.put("/silent", test_bytes(3 << 20, 9));
    origin.set_behaviour("/silent", Behaviour::SilentAfter(0));
    let cache = TempDir::new("timeouts-cache");
    let config = format!(
        "[cache]\ndir = \"{}\"\nslice_size = \"1MiB\"\nmax_size = \"64MiB\"\n\n{}",
        cache.path().display(),
        routes(&origin, "60s", &[("/", "")])
    );
    let proxy = Proxy::start(&config);
    hang_up_on(&proxy, &origin, "/silent");
}
