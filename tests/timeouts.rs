//! Every wait has an end: an origin that never answers gets the client a 504 within the
//! upstream's `read_timeout`; a client that hangs up while the origin is silent has its origin
//! request dropped at once, on every way a body goes (relayed, spliced, paced, from the cache);
//! idle kept-alive connections are closed after `client_keepalive_timeout`; and past
//! `max_connections` the longest idle connection makes room, or the new one is refused.
//! (TLS and HTTP/2 hang-ups: tests/edge_tls.rs.)

mod support;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::data::test_bytes;
use support::http::{Connection, RawRequest, request};
use support::origin::{Behaviour, Origin};
use support::proxy::{Instance, Proxy, ProxyProcess, usage};
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

#[test]
fn idle_connections_are_closed_after_client_keepalive_timeout() {
    let origin = Origin::start();
    origin.put("/small", b"small".to_vec());
    let proxy = ProxyProcess::start_with(
        &routes(&origin, "5s", &[("/", "")]),
        "client_keepalive_timeout = \"2s\"\nmax_connections = 5000\nmax_connections_per_client = 0\n",
        &[],
    );
    let keepalive = Duration::from_secs(2);
    let rss = || usage(proxy.pid()).0;
    let rss_start = rss();
    // Twice: the memory the first 2 000 held is what the next 2 000 take.
    let mut figures = Vec::new();
    for round in 1..=2 {
        let connections = idle_connections(&proxy, 2000);
        let rss_idle = rss();
        let last_answer = connections.iter().map(|(_, at)| *at).max().expect("connections");
        // Each is closed by rangeway within a second or so of its keepalive deadline.
        let closed_by = last_answer + keepalive + Duration::from_secs(3);
        for (mut connection, _) in connections {
            let left =
                closed_by.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let closed = connection.closed_within(left).expect("the connection");
            assert!(
                closed,
                "round {round}: a connection still open {keepalive:?} after its answer"
            );
        }
        until("the idle connections counted as closed", WITHIN, || {
            let reason = "keepalive_timeout";
            let closed = proxy.metric("rangeway_client_connections_refused_total", reason);
            (closed >= 2000 * round).then_some(())
        });
        figures.push((rss_idle, rss()));
    }
    eprintln!(
        "RSS: {rss_start} KiB at start; with 2000 idle connections, then after they were closed: \
         {figures:?} KiB (peak {} KiB)",
        usage(proxy.pid()).1
    );
    // The server still answers.
    let mut fresh = Connection::open(proxy.addr()).expect("connect");
    assert_eq!(fresh.send(&RawRequest::get("/small")).expect("an answer").status, 200);
}

/// `count` connections to `proxy`, each idle after one request, opened by 8 threads at once;
/// with when each was answered.
fn idle_connections(proxy: &ProxyProcess, count: usize) -> Vec<(Connection, Instant)> {
    std::thread::scope(|scope| {
        let openers: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    (0..count / 8)
                        .map(|_| {
                            let mut connection =
                                Connection::open(proxy.addr()).expect("connect to rangeway");
                            let response =
                                connection.send(&RawRequest::get("/small")).expect("an answer");
                            assert_eq!(response.status, 200);
                            (connection, Instant::now())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        openers.into_iter().flat_map(|opener| opener.join().expect("an opener")).collect()
    })
}

#[test]
fn past_max_connections_the_longest_idle_makes_room_then_new_ones_are_refused() {
    let origin = Origin::start();
    origin.put("/small", b"small".to_vec());
    origin.put("/slow", b"slow".to_vec());
    origin.set_behaviour("/slow", Behaviour::Delayed(Duration::from_secs(2)));
    let proxy =
        Proxy::start_with_server(&routes(&origin, "5s", &[("/", "")]), "max_connections = 3\n");
    let refused = |reason: &str| {
        proxy.metric("rangeway_client_connections_refused_total", &format!("\"{reason}\""))
    };
    // The connections made to see that rangeway listens are gone.
    until("no client connection open", WITHIN, || {
        (proxy.metric("rangeway_client_connections", "") == 0).then_some(())
    });
    let get = RawRequest::get("/small");
    // Three connections, idle after a request each, the first the longest.
    let mut idle: Vec<Connection> = (0..3)
        .map(|_| {
            let mut connection = Connection::open(proxy.addr()).expect("connect");
            assert_eq!(connection.send(&get).expect("an answer").status, 200);
            connection
        })
        .collect();
    // A fourth is served; the first is closed to make room for it.
    let mut fourth = Connection::open(proxy.addr()).expect("connect");
    assert_eq!(fourth.send(&get).expect("an answer").status, 200);
    assert!(idle[0].closed_within(WITHIN).expect("the first connection"), "the longest idle");
    assert!(!idle[1].closed_within(Duration::from_millis(200)).expect("the second"));
    assert_eq!(refused("max_connections_idle"), 1);
    assert_eq!(proxy.metric("rangeway_client_connections", ""), 3);
    // The second and third busy (their requests waiting on the origin), the fourth idle: a fifth
    // takes the fourth's place; with it busy too, a sixth finds none idle and is refused.
    let slow = b"GET /slow HTTP/1.1\r\nHost: rangeway\r\n\r\n";
    let mut busy: Vec<Connection> = idle.drain(1..).collect();
    let asked = |count: usize| {
        until(&format!("{count} requests for /slow at the origin"), WITHIN, || {
            let slow = origin.requests().iter().filter(|r| r.target == "/slow").count();
            (slow == count).then_some(())
        })
    };
    for connection in &mut busy {
        connection.write_raw(slow).expect("a request");
    }
    asked(2);
    let mut fifth = Connection::open(proxy.addr()).expect("connect");
    fifth.write_raw(slow).expect("a request");
    assert!(fourth.closed_within(WITHIN).expect("the fourth connection"), "the idle one");
    asked(3);
    busy.push(fifth);
    let mut sixth = Connection::open(proxy.addr()).expect("connect");
    let refusal = sixth.send(&get).expect("an answer");
    assert_eq!(refusal.status, 503);
    assert_eq!(refusal.header("retry-after"), Some("1"));
    assert_eq!(refused("max_connections"), 1);
    // The busy ones get their answers as usual.
    for connection in &mut busy {
        let answer = connection.send_raw("GET", "").expect("an answer");
        assert_eq!((answer.status, answer.body.as_slice()), (200, &b"slow"[..]));
    }
}

#[test]
fn a_check_names_a_connection_cap_above_the_descriptor_limit() {
    let limit = descriptor_limit();
    let config = format!("[server]\nmax_connections = {}\n", limit + 1);
    let dir = TempDir::new("timeouts-check");
    let path = dir.join("rangeway.toml");
    std::fs::File::create(&path)
        .and_then(|mut file| file.write_all(config.as_bytes()))
        .expect("write the config");
    let output = Command::new(env!("CARGO_BIN_EXE_rangeway"))
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run rangeway check");
    let report = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{report}");
    assert!(report.contains("server.max_connections"), "{report}");
    assert!(report.contains("RLIMIT_NOFILE"), "{report}");
}

/// This process's hard limit on descriptors, as `ulimit -Hn` says it (the check runs as a child
/// of this process, with the same limit).
fn descriptor_limit() -> u64 {
    let output = Command::new("sh").args(["-c", "ulimit -Hn"]).output().expect("run sh");
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim().parse().unwrap_or_else(|_| panic!("ulimit -n said {text:?}: set a finite limit"))
}
