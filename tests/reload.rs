//! SIGHUP reloads the config: new routes take effect for new requests, a download in flight
//! finishes on the route it began with, and a config with errors changes nothing.

mod support;

use std::time::Duration;

use support::clients::sha256_hex;
use support::data::test_bytes;
use support::http::{get, get_until};
use support::origin::{Behaviour, Origin};
use support::proxy::ProxyProcess;
use support::tmp::TempDir;
use support::wait;

/// An http upstream under `prefix`, and a `dir` upstream (`folder`) under `/files/`.
fn routes_with(origin: &Origin, prefix: &str, folder: &std::path::Path) -> String {
    format!(
        "[upstreams.local]\ndir = \"{}\"\n\n[[routes]]\npath_prefix = \"/files/\"\nupstream = \"local\"\nstrip_prefix = true\n\n[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n",
        folder.display(),
        origin.base_url()
    )
}

/// GETs `url` until it answers `status`, for up to 5 s.
fn until_status(url: &str, status: u16) -> bool {
    get_until(url, |r| r.status == status).status == status
}

#[test]
fn sighup_reloads_routes_and_keeps_them_when_the_new_config_is_wrong() {
    let origin = Origin::start();
    let object = test_bytes(4 * 1024 * 1024, 41);
    origin.put("/a.bin", object.clone());
    let logs = TempDir::new("reload-log");
    let log = logs.join("rangeway.log");
    let folder = logs.join("files");
    std::fs::create_dir(&folder).expect("folder");
    std::fs::write(folder.join("f.txt"), b"from the folder\n").expect("write");
    let routes = |origin: &Origin, prefix: &str| routes_with(origin, prefix, &folder);
    let process = ProxyProcess::start_logged(&routes(&origin, "/old/"), &[], &log);
    assert_eq!(get(&process.url("/old/a.bin"), &[]).status, 200);

    // A slow download on the old route, in flight across the reload.
    origin.set_behaviour(
        "/a.bin",
        Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(100) },
    );
    let url = process.url("/old/a.bin");
    let in_flight = std::thread::spawn(move || get(&url, &[]));
    // In flight, its route chosen, before the reload: the origin has its request.
    wait::until("the download to reach the origin", wait::WITHIN, || {
        (origin.requests().iter().filter(|r| r.target == "/a.bin").count() >= 2).then_some(())
    });

    process.rewrite(&routes(&origin, "/new/"));
    process.signal("HUP");
    assert!(until_status(&process.url("/new/a.bin"), 200), "the new route never came");
    assert_eq!(get(&process.url("/old/a.bin"), &[]).status, 404, "the old route is gone");
    let from_folder = get(&process.url("/files/f.txt"), &[]);
    assert_eq!(from_folder.body, b"from the folder\n", "the dir upstream still serves");
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
    let text = wait::log_until(&log, "the config's error", wait::WITHIN, |text| {
        text.contains("the config has errors, the running one stays")
            && text.contains("routes[1].middleware[0].level")
    });
    assert_eq!(get(&process.url("/new/a.bin"), &[]).status, 200, "the running config stays");
    assert_eq!(get(&process.url("/broken/a.bin"), &[]).status, 404);
    assert!(text.contains("SIGHUP: reloaded"), "{text}");
    assert!(text.contains("the config has errors, the running one stays"), "{text}");
    assert!(text.contains("routes[1].middleware[0].level"), "the error names the key: {text}");

    // A dir upstream moved elsewhere needs a restart: nothing changes.
    let elsewhere = logs.join("elsewhere");
    process.rewrite(&routes_with(&origin, "/moved/", &elsewhere));
    process.signal("HUP");
    wait::log_line(&log, "the dir upstreams changed");
    assert_eq!(get(&process.url("/moved/a.bin"), &[]).status, 404);
    assert_eq!(get(&process.url("/files/f.txt"), &[]).status, 200);

    // Fixed again, it reloads.
    process.rewrite(&routes(&origin, "/third/"));
    process.signal("HUP");
    assert!(until_status(&process.url("/third/a.bin"), 200));
    assert_eq!(get(&process.url("/new/a.bin"), &[]).status, 404);
}
