//! Stopping rangeway: SIGTERM refuses new connections, lets the downloads in flight finish, and
//! ends the process when they have — not a whole grace period later.

mod support;

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use support::clients::{CLIENT_TIMEOUT, run};
use support::data::test_bytes;
use support::http::{Connection, RawRequest};
use support::origin::{Behaviour, Origin};
use support::proxy::{Instance, ProxyProcess};
use support::tmp::TempDir;
use support::wait;

const GRACE: &str = "grace_period = \"30s\"";

fn route(origin: &Origin) -> String {
    format!(
        "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        origin.base_url()
    )
}

#[test]
fn sigterm_drains_the_downloads_in_flight_then_exits() {
    let origin = Origin::start();
    let object = test_bytes(2 * 1024 * 1024, 41);
    origin.put("/obj.bin", object.clone());
    // About 2 s for the whole object.
    origin.set_global_behaviour(Behaviour::Slow {
        chunk: 256 * 1024,
        delay: Duration::from_millis(250),
    });
    let mut proxy = ProxyProcess::start_with(&route(&origin), GRACE, &[]);
    let work = TempDir::new("graceful");
    let file = work.join("obj.bin");
    let download = {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "-o"]).arg(&file).arg(proxy.url("/obj.bin"));
        std::thread::spawn(move || run(curl, CLIENT_TIMEOUT))
    };
    wait_in_flight(&proxy);
    let signalled = Instant::now();
    proxy.signal("TERM");

    wait::until("new connections to be refused", wait::WITHIN, || {
        TcpStream::connect(proxy.addr()).is_err().then_some(())
    });
    assert!(proxy.wait_exit(Duration::ZERO).is_none(), "refused while draining, not exited");
    download.join().expect("the download thread").assert_success();
    assert_eq!(std::fs::read(&file).expect("read"), object, "the download in flight finished");
    let status =
        proxy.wait_exit(Duration::from_secs(10)).expect("exits once drained, well within 30 s");
    assert!(status.success(), "{status}");
    assert!(signalled.elapsed() < Duration::from_secs(10), "{:?}", signalled.elapsed());
}

#[test]
fn sigterm_on_an_idle_rangeway_exits_at_once_and_sigint_during_a_drain_cuts_it_short() {
    let origin = Origin::start();
    origin.put("/obj.bin", test_bytes(4096, 42));
    let mut idle = ProxyProcess::start_with(&route(&origin), GRACE, &[]);
    let signalled = Instant::now();
    idle.signal("TERM");
    let status = idle.wait_exit(Duration::from_secs(5)).expect("an idle rangeway exits at once");
    assert!(status.success(), "{status}");
    assert!(signalled.elapsed() < Duration::from_secs(5));

    // A download that would take a minute: SIGINT during the drain ends it.
    origin.set_global_behaviour(Behaviour::Slow { chunk: 64, delay: Duration::from_millis(500) });
    let work = TempDir::new("graceful-int");
    let log = work.join("rangeway.log");
    let mut busy = ProxyProcess::start_logged_with(&route(&origin), GRACE, &[], &log);
    let url = busy.url("/obj.bin");
    let download = std::thread::spawn(move || {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "-o", "/dev/null", &url]);
        run(curl, CLIENT_TIMEOUT)
    });
    wait_in_flight(&busy);
    busy.signal("TERM");
    // The drain has begun, its SIGINT handler in place.
    wait::log_line(&log, "draining: new connections are refused");
    // Deliberate: the drain must not end by itself for this long, the download still in flight.
    assert!(busy.wait_exit(Duration::from_millis(500)).is_none(), "still draining");
    let interrupted = Instant::now();
    busy.signal("INT");
    busy.wait_exit(Duration::from_secs(5)).expect("SIGINT cuts the drain short");
    assert!(interrupted.elapsed() < Duration::from_secs(5));
    assert!(!download.join().expect("the download thread").success(), "that download was cut");
}

/// A kept-alive connection waiting for its next request holds nothing: the drain ends at once
/// and closes it, not after its idle timeout or the grace period.
#[test]
fn sigterm_closes_kept_alive_connections_between_requests() {
    let origin = Origin::start();
    origin.put("/obj.bin", test_bytes(4096, 43));
    let mut proxy = ProxyProcess::start_with(&route(&origin), GRACE, &[]);
    let mut kept = Connection::open(proxy.addr()).expect("connect");
    let answer = kept.send(&RawRequest::get("/obj.bin")).expect("an answer");
    assert_eq!(answer.status, 200);
    let signalled = Instant::now();
    proxy.signal("TERM");
    assert!(kept.closed_within(Duration::from_secs(5)).expect("read"), "still open");
    let status = proxy.wait_exit(Duration::from_secs(5)).expect("exits once the drain is done");
    assert!(status.success(), "{status}");
    assert!(signalled.elapsed() < Duration::from_secs(10), "{:?}", signalled.elapsed());
}

/// Waits until `proxy` has a response in flight.
fn wait_in_flight(proxy: &ProxyProcess) {
    wait::until("the download to be in flight", wait::WITHIN, || {
        (proxy.metric("rangeway_active_downloads", "") >= 1).then_some(())
    });
}
