//! A download interrupted, then resumed after the object changed at the origin, must never end as
//! a file that mixes the two versions. Straight from the origin, curl does splice them (checked
//! first, so this test can fail); through rangeway every client gets the new object whole or
//! refuses to resume.

mod support;

use std::process::Command;
use std::time::Duration;

use support::clients::{curl_resume, run, sha256_file, sha256_hex};
use support::data::test_bytes;
use support::origin::{Behaviour, Origin};
use support::proxy::Proxy;
use support::tmp::TempDir;

const LEN: usize = 8 * 1024 * 1024;

/// The origin sends about 1 MB/s per connection, so that a client stopped after 1.5 s holds part
/// of the object.
const SLOW: Behaviour = Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(250) };

/// Starts a download of `url` and stops it after 1.5 s, as a user would.
fn interrupted(command: Command) {
    let _ = run(command, Duration::from_millis(1500));
}

/// Waits until rangeway has recorded `count` unfinished downloads: an interrupted download is
/// recorded when rangeway notices its client went away, a moment after the client stopped.
fn wait_recorded(proxy: &Proxy, count: usize) {
    let listed = support::http::get_until(&proxy.admin_url("/v1/downloads?active=true"), |r| {
        serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| v["downloads"].as_array().map(Vec::len))
            .is_some_and(|n| n >= count)
    });
    assert_eq!(listed.status, 200, "{}", String::from_utf8_lossy(&listed.body));
}

fn curl_interrupted(url: &str, file: &std::path::Path) {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "-o"]).arg(file).arg(url);
    interrupted(curl);
}

fn assert_not_mixed(name: &str, file: &std::path::Path, v1: &[u8], v2: &[u8], succeeded: bool) {
    let got = std::fs::read(file).unwrap_or_default();
    if succeeded {
        let from = |v: &[u8]| got.iter().zip(v).take_while(|(a, b)| a == b).count();
        assert!(
            got == v2,
            "{name} succeeded: the file must be the new object; it has {} bytes, {} first bytes of the old, {} of the new",
            got.len(),
            from(v1),
            from(v2)
        );
    } else {
        // Refused: whatever is on disk is a prefix of one version, not a splice.
        let prefix_of = |v: &[u8]| got.len() <= v.len() && got[..] == v[..got.len()];
        assert!(prefix_of(v1) || prefix_of(v2), "{name}: the file mixes versions");
    }
}

#[test]
fn curl_splices_without_rangeway_and_never_with_it() {
    let origin = Origin::start();
    let work = TempDir::new("resume-safety");
    let v1 = test_bytes(LEN, 1);
    let v2 = test_bytes(LEN, 2);

    // Direct: curl resumes the old partial file onto the new object.
    origin.put("/obj.bin", v1.clone());
    let direct = work.join("direct.bin");
    origin.set_global_behaviour(SLOW);
    curl_interrupted(&origin.url("/obj.bin"), &direct);
    origin.set_global_behaviour(Behaviour::Normal);
    let partial = std::fs::metadata(&direct).unwrap().len() as usize;
    assert!(partial > 0 && partial < LEN, "the first attempt must stop part-way ({partial})");
    origin.put("/obj.bin", v2.clone());
    curl_resume(&origin.url("/obj.bin"), &direct).assert_success();
    let spliced = std::fs::read(&direct).unwrap();
    assert!(
        spliced[..partial] == v1[..partial] && spliced[partial..] == v2[partial..],
        "curl spliced, as expected"
    );

    // Through rangeway: the resume of the changed object is refused.
    let old_etag = origin.put("/obj.bin", v1.clone());
    let proxy = Proxy::in_front_of(&origin.base_url());
    let file = work.join("proxied.bin");
    origin.set_global_behaviour(SLOW);
    curl_interrupted(&proxy.url("/obj.bin"), &file);
    origin.set_global_behaviour(Behaviour::Normal);
    let partial = std::fs::metadata(&file).unwrap().len() as usize;
    assert!(partial > 0 && partial < LEN);
    wait_recorded(&proxy, 1);
    origin.put("/obj.bin", v2.clone());
    // The resume is refused with 412 and no body: curl -C - leaves the file as it was (plain curl
    // exits 0 on an HTTP error; with -f it fails), wget -c fails. A 200 would be spliced by wget.
    let resumed = curl_resume(&proxy.url("/obj.bin"), &file);
    assert_not_mixed("curl", &file, &v1, &v2, false);
    assert_eq!(std::fs::metadata(&file).unwrap().len() as usize, partial, "{resumed}");
    let mut strict = Command::new("curl");
    strict.args(["-fsS", "-C", "-", "-o"]).arg(&file).arg(proxy.url("/obj.bin"));
    assert_eq!(
        run(strict, Duration::from_secs(60)).code(),
        Some(22),
        "curl -f reports the refusal"
    );
    // What the origin saw: the resume carried If-Match with the old version's ETag.
    assert!(origin.requests().iter().any(|r| r.header("if-match") == Some(old_etag.as_str())));
    let metrics = support::http::get(&proxy.admin_url("/metrics"), &[]);
    assert!(
        String::from_utf8_lossy(&metrics.body)
            .contains("rangeway_resumes_refused_total{route=\"/\"} 2")
    );

    // Downloading it again from the start, as the refusal says, gets the new object; from then
    // on the new version is the download's, and an interrupted download of it resumes normally.
    let file = work.join("again.bin");
    let mut again = Command::new("curl");
    again.args(["-sS", "-o"]).arg(&file).arg(proxy.url("/obj.bin"));
    run(again, Duration::from_secs(60)).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&v2));
    let file = work.join("unchanged.bin");
    origin.set_global_behaviour(SLOW);
    curl_interrupted(&proxy.url("/obj.bin"), &file);
    origin.set_global_behaviour(Behaviour::Normal);
    let resumed = curl_resume(&proxy.url("/obj.bin"), &file);
    resumed.assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&v2));
}

#[test]
fn wget_and_aria2c_never_splice_through_rangeway() {
    let origin = Origin::start();
    let work = TempDir::new("resume-clients");
    let v1 = test_bytes(LEN, 3);
    let v2 = test_bytes(LEN, 4);
    origin.put("/obj.bin", v1.clone());
    let proxy = Proxy::in_front_of(&origin.base_url());
    let url = proxy.url("/obj.bin");

    origin.set_global_behaviour(SLOW);
    // wget as people run it: `wget -c URL` into the current folder. (With `-O FILE`, wget opens the
    // file for appending and adds whatever body comes — a 200 included — to the end: that mode
    // cannot be protected by any server.)
    let wget_dir = TempDir::new("resume-wget");
    let file = wget_dir.join("obj.bin");
    let wget = |continue_: bool| {
        let mut wget = Command::new("wget");
        wget.current_dir(wget_dir.path()).arg("-q");
        if continue_ {
            wget.arg("-c");
        }
        wget.arg(&url);
        wget
    };
    interrupted(wget(false));
    let mut aria = Command::new("aria2c");
    // Saving its control file every second is what lets aria2c resume after being killed.
    aria.args(["-x2", "-s2", "-k1M", "--auto-save-interval=1", "--auto-file-renaming=false", "-d"])
        .arg(work.path())
        .args(["-o", "aria.bin", &url]);
    interrupted(aria);
    origin.set_global_behaviour(Behaviour::Normal);
    wait_recorded(&proxy, 2);
    let len = std::fs::metadata(&file).map_or(0, |m| m.len()) as usize;
    assert!(len < LEN, "wget must hold part of the object ({len})");
    // aria2c preallocates its file; its control file says the download is unfinished.
    let control = work.join("aria.bin.aria2");
    assert!(control.exists(), "aria2c must have stopped part-way");

    origin.put("/obj.bin", v2.clone());

    let resumed = run(wget(true), Duration::from_secs(60));
    assert_not_mixed("wget", &file, &v1, &v2, resumed.success());
    let resumed = support::clients::aria2c_download(&url, work.path(), "aria.bin");
    if resumed.success() {
        assert_eq!(
            sha256_file(&work.join("aria.bin")),
            sha256_hex(&v2),
            "aria2c finished: it must hold the new object"
        );
    } else {
        assert!(control.exists(), "aria2c refused: the download must stay marked unfinished");
    }
}
