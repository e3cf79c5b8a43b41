//! Zero-downtime upgrade through pingora's socket handoff: a new rangeway started with `--upgrade`
//! takes the listening sockets of the running one when it gets SIGQUIT. No request in a steady
//! stream across the handoff fails, and a download in flight on the old process finishes there.

mod support;

use std::os::unix::fs::FileTypeExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use support::clients::sha256_hex;
use support::data::test_bytes;
use support::http::get;
use support::origin::{Behaviour, Origin};
use support::proxy::ProxyProcess;
use support::tmp::TempDir;
use support::wait;

#[test]
fn a_new_process_takes_the_sockets_over_without_a_failed_request() {
    let origin = Origin::start();
    let big = test_bytes(3 * 1024 * 1024, 51);
    origin.put("/big.bin", big.clone());
    origin.put("/small.bin", b"sixteen bytes..\n".to_vec());
    origin.set_behaviour(
        "/big.bin",
        Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(250) },
    );
    let work = TempDir::new("upgrade");
    let socket = work.join("upgrade.sock");
    let body = format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        origin.base_url()
    );
    let server_keys = format!("grace_period = \"20s\"\nupgrade_socket = \"{}\"", socket.display());
    let mut old = ProxyProcess::start_with(&body, &server_keys, &[]);
    assert_eq!(get(&old.url("/small.bin"), &[]).status, 200);

    // A steady stream of small requests, and one slow download, across the handoff.
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let small = old.url("/small.bin");
    let stream = {
        let (stop, served, failed) = (stop.clone(), served.clone(), failed.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let ok = support::http::try_get(&small)
                    .is_some_and(|r| r.status == 200 && r.body == b"sixteen bytes..\n");
                if ok { &served } else { &failed }.fetch_add(1, Ordering::Relaxed);
                // Deliberate pacing: a steady stream of requests, not a flood.
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let big_url = old.url("/big.bin");
    let download = std::thread::spawn(move || get(&big_url, &[]));
    wait::until("the download to reach the origin", wait::WITHIN, || {
        origin.requests().iter().any(|r| r.target == "/big.bin").then_some(())
    });

    let new_log = work.join("new.log");
    let new = old.upgrade(&new_log);
    // The new process waits on the upgrade socket; the old one hands its sockets over.
    wait::until("the new process to open the upgrade socket", Duration::from_secs(15), || {
        std::fs::metadata(&socket).ok().filter(|m| m.file_type().is_socket())
    });
    old.signal("QUIT");
    wait::log_until(&new_log, "the new process to take over", Duration::from_secs(15), |text| {
        text.contains("rangeway is listening")
    });
    let finished = download.join().expect("the download thread");
    assert!(finished.complete && finished.status == 200, "the download in flight was cut");
    assert_eq!(sha256_hex(&finished.body), sha256_hex(&big));
    // The old process leaves once its download is over (after pingora's 5 s close timeout).
    let exited = old.wait_exit(Duration::from_secs(15));
    assert!(exited.is_some_and(|s| s.success()), "the old process did not leave: {exited:?}");
    // The stream goes on a while against the new process alone.
    let before = served.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
    wait::until("requests to the new process alone", wait::WITHIN, || {
        let now = served.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed);
        (now >= before + 20).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    stream.join().expect("the request stream");
    let (served, failed) = (served.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("upgrade: {served} requests served across the handoff, {failed} failed");
    assert_eq!(failed, 0);
    assert!(served > 100, "the stream ran: {served}");
    // Only the new process is left, and it answers.
    assert_eq!(get(&new.url("/small.bin"), &[]).status, 200);
    let log = std::fs::read_to_string(&new_log).expect("the new log");
    assert!(log.contains("rangeway::access"), "the new process served requests: {log}");
}
