//! SIGHUP reloads the config: new routes take effect for new requests, a download in flight
//! finishes on the route it began with, and a config with errors changes nothing.

mod support;

use std::time::{Duration, Instant};

use support::clients::sha256_hex;
use support::data::test_bytes;
use support::http::get;
use support::origin::{Behaviour, Origin};
use support::proxy::ProxyProcess;
use support::tmp::TempDir;

fn routes(origin: &Origin, prefix: &str) -> String {
    format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n",
        origin.base_url()
    )
}

/// GETs `url` until it answers `status`, for up to 5 s.
fn until_status(url: &str, status: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if get(url, &[]).status == status {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn sighup_reloads_routes_and_keeps_them_when_the_new_config_is_wrong() {
    let origin = Origin::start();
    let object = test_bytes(4 * 1024 * 1024, 41);
    origin.put("/a.bin", object.clone());
    let logs = TempDir::new("reload-log");
    let log = logs.join("rangeway.log");
    let process = ProxyProcess::start_logged(&routes(&origin, "/old/"), &[], &log);
    assert_eq!(get(&process.url("/old/a.bin"), &[]).status, 200);

    // A slow download on the old route, in flight across the reload.
    origin.set_behaviour(
        "/a.bin",
        Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(100) },
    );
    let url = process.url("/old/a.bin");
    let in_flight = std::thread::spawn(move || get(&url, &[]));
    std::thread::sleep(Duration::from_millis(300));

    process.rewrite(&routes(&origin, "/new/"));
    process.signal("HUP");
    assert!(until_status(&process.url("/new/a.bin"), 200), "the new route never came");
    assert_eq!(get(&process.url("/old/a.bin"), &[]).status, 404, "the old route is gone");
    let finished = in_flight.join().expect("the download thread");
    assert!(finished.complete && finished.status == 200);
    assert_eq!(sha256_hex(&finished.body), sha256_hex(&object), "finished on its old route");
    origin.clear_behaviour("/a.bin");

    // A config with errors: logged with its fix, nothing changes.
    process.rewrite(&format!(
        "{}middleware = [{{ kind = \"gzip\", level = 99 }}]\n",
        routes(&origin, "/broken/")
    ));
    process.signal("HUP");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(&process.url("/new/a.bin"), &[]).status, 200, "the running config stays");
    assert_eq!(get(&process.url("/broken/a.bin"), &[]).status, 404);
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(text.contains("SIGHUP: reloaded"), "{text}");
    assert!(text.contains("the config has errors, the running one stays"), "{text}");
    assert!(text.contains("routes[0].middleware[0].level"), "the error names the key: {text}");

    // Fixed again, it reloads.
    process.rewrite(&routes(&origin, "/third/"));
    process.signal("HUP");
    assert!(until_status(&process.url("/third/a.bin"), 200));
    assert_eq!(get(&process.url("/new/a.bin"), &[]).status, 404);
}
