//! A download interrupted, then resumed after the object changed at the origin, must never end as
//! a file that mixes the two versions. Straight from the origin, curl does splice them (checked
//! first, so this test can fail); through rangeway every client gets the new object whole or
//! refuses to resume — whoever else downloads under the same download id, and whatever id a
//! client names (`docs/architecture.md`, "Download sessions").

mod support;

use std::process::Command;
use std::time::Duration;

use support::clients::{curl_resume, run, sha256_file, sha256_hex};
use support::data::test_bytes;
use support::origin::{Behaviour, Origin};
use support::proxy::{Instance, Proxy, ProxyProcess};
use support::redis::RedisServer;
use support::tmp::TempDir;

const LEN: usize = 8 * 1024 * 1024;

/// The origin sends about 1 MB/s per connection, so that a client stopped after 1.5 s holds part
/// of the object.
const SLOW: Behaviour = Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(250) };

/// Starts a download of `url` and stops it after 1.5 s, as a user would.
fn interrupted(command: Command) {
    let _ = run(command, Duration::from_millis(1500));
}

/// Waits until `proxy` has recorded the response to a client that was stopped: an interrupted
/// download is recorded when rangeway notices its client went away, a moment after it stopped.
fn wait_logged(proxy: &dyn Instance, responses: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while proxy.metric("rangeway_requests_total", "") < responses {
        assert!(std::time::Instant::now() < deadline, "{responses} responses were not logged");
        std::thread::sleep(Duration::from_millis(20));
    }
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

    // Downloading it again from the start, as the refusal says, gets the new object; a download
    // of it interrupted past what the old version left resumes, as the client that restarted
    // expects (one that stops within it could be holding either: see the scenarios below).
    let file = work.join("again.bin");
    let mut again = Command::new("curl");
    again.args(["-sS", "-o"]).arg(&file).arg(proxy.url("/obj.bin"));
    run(again, Duration::from_secs(60)).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&v2));
    let file = work.join("unchanged.bin");
    origin.set_global_behaviour(SLOW);
    stopped(&proxy.url("/obj.bin"), &file, LATER, &[]);
    origin.set_global_behaviour(Behaviour::Normal);
    assert!(std::fs::metadata(&file).unwrap().len() as usize > 2 * partial);
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
    // Saving its control file every second is what lets aria2c resume after being killed: it is
    // stopped once the file is there (a fixed delay could stop a slow-starting aria2c before).
    aria.args(["-x2", "-s2", "-k1M", "--auto-save-interval=1", "--auto-file-renaming=false", "-d"])
        .arg(work.path())
        .args(["-o", "aria.bin", &url])
        .stdout(std::process::Stdio::null());
    let mut aria = aria.spawn().expect("spawn aria2c");
    let control = work.join("aria.bin.aria2");
    support::wait::until("aria2c's control file", Duration::from_secs(20), || {
        control.exists().then_some(())
    });
    let _ = aria.kill();
    let _ = aria.wait();
    origin.set_global_behaviour(Behaviour::Normal);
    wait_recorded(&proxy, 2);
    let len = std::fs::metadata(&file).map_or(0, |m| m.len()) as usize;
    assert!(len < LEN, "wget must hold part of the object ({len})");
    // aria2c preallocates its file; its control file says the download is unfinished.
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

/// How long a stopped download runs: about 1.5 MB of the slow origin, and about 4 MB.
const SOON: Duration = Duration::from_millis(1500);
const LATER: Duration = Duration::from_millis(4000);

fn file_len(file: &std::path::Path) -> usize {
    std::fs::metadata(file).expect("the client's file").len() as usize
}

/// `curl -sS [ARGS] -o FILE URL`, stopped after `after`, as a user stops it.
fn stopped(url: &str, file: &std::path::Path, after: Duration, args: &[&str]) {
    let mut curl = Command::new("curl");
    curl.arg("-sS").args(args).arg("-o").arg(file).arg(url);
    let _ = run(curl, after);
}

/// `curl -sS -C - [ARGS] -o FILE URL` to its end.
fn resumed(url: &str, file: &std::path::Path, args: &[&str]) -> support::clients::ClientRun {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "-C", "-"]).args(args).arg("-o").arg(file).arg(url);
    run(curl, Duration::from_secs(60))
}

/// The download id rangeway gave a client's response (from `curl -D`).
fn given_id(url: &str, args: &[&str]) -> String {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "-o", "/dev/null", "-D", "-", "-r", "0-0"]).args(args).arg(url);
    let head = run(curl, Duration::from_secs(30));
    head.assert_success();
    head.stdout
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("x-download-id").then(|| value.trim().to_owned())
        })
        .expect("an X-Download-Id")
}

/// Where the scenarios run: one instance with its memory store, one with Redis, or two instances
/// sharing Redis (the first client's requests to one, everyone else's to the other).
enum Place {
    Memory,
    Redis,
    TwoInstances,
}

/// One origin and the instances of a place; the object under test is `/obj.bin`.
struct Stage {
    origin: Origin,
    /// The first client's instance first; everyone else uses the last.
    instances: Vec<Box<dyn Instance>>,
    _redis: Option<RedisServer>,
}

impl Stage {
    fn new(place: &Place) -> Stage {
        let origin = Origin::start();
        let body = |state: &str| {
            format!(
                "{state}\n[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
                origin.base_url()
            )
        };
        let (instances, redis): (Vec<Box<dyn Instance>>, _) = match place {
            Place::Memory => (vec![Box::new(Proxy::start(&body("")))], None),
            Place::Redis => {
                let redis = RedisServer::start();
                (vec![Box::new(Proxy::start(&body(&redis.state_section())))], Some(redis))
            }
            Place::TwoInstances => {
                let redis = RedisServer::start();
                let a = ProxyProcess::start(&body(&redis.state_section()));
                let b = ProxyProcess::start(&body(&redis.state_section()));
                (vec![Box::new(a), Box::new(b)], Some(redis))
            }
        };
        Stage { origin, instances, _redis: redis }
    }

    fn first(&self) -> &dyn Instance {
        self.instances[0].as_ref()
    }

    fn others(&self) -> &dyn Instance {
        self.instances[self.instances.len() - 1].as_ref()
    }

    /// Resumes refused, on every instance.
    fn refused(&self) -> u64 {
        self.instances.iter().map(|i| i.metric("rangeway_resumes_refused_total", "")).sum()
    }

    /// A download by the first client, stopped after `after` while the origin is slow.
    fn first_stops(&self, file: &std::path::Path, after: Duration, args: &[&str]) {
        let logged = self.first().metric("rangeway_requests_total", "") + 1;
        self.origin.set_global_behaviour(SLOW);
        stopped(&self.first().url("/obj.bin"), file, after, args);
        self.origin.set_global_behaviour(Behaviour::Normal);
        wait_logged(self.first(), logged);
    }
}

/// Every interleaving the issue names, with curl (the same program, so the same derived id, for
/// every client at one address) and a second client, at the same address or another:
///
/// | scenario | who does what, in order | what must happen |
/// |---|---|---|
/// | neighbours | A stops in v1; v1 -> v2; B, at A's address, downloads v2 whole; A resumes | A refused, its file still a v1 prefix |
/// | forged id | A stops in v1; M, at another address, sends A's id (header and parameter) and downloads v2 whole; v1 -> v2 (already); A resumes | M's download is its own; A refused |
/// | one id, two objects | A (id `job`) stops in /obj.bin v1; A downloads /other.bin whole under `job`; v1 -> v2; A resumes /obj.bin | refused |
/// | restarted, past the old version | A stops in v1 early; v1 -> v2; A starts over, stops later; A resumes | resumes: v2 whole |
/// | restarted, within the old version | A stops in v1 late; v1 -> v2; A starts over, stops early; A resumes | refused, the body naming X-Download-Id; A starts over with an id of its own, stops, resumes: v2 whole |
fn scenarios(place: Place) {
    let v1 = test_bytes(LEN, 31);
    let v2 = test_bytes(LEN, 32);
    let work = TempDir::new("resume-scenarios");

    // Neighbours.
    let stage = Stage::new(&place);
    stage.origin.put("/obj.bin", v1.clone());
    let a = work.join("neighbours-a.bin");
    stage.first_stops(&a, SOON, &[]);
    let held = file_len(&a);
    stage.origin.put("/obj.bin", v2.clone());
    let b = work.join("neighbours-b.bin");
    resumed(&stage.others().url("/obj.bin"), &b, &[]).assert_success();
    assert_eq!(sha256_file(&b), sha256_hex(&v2));
    let refused = stage.refused();
    let _ = resumed(&stage.first().url("/obj.bin"), &a, &[]);
    assert_not_mixed("neighbours", &a, &v1, &v2, false);
    assert_eq!(file_len(&a), held);
    assert_eq!(stage.refused(), refused + 1, "the refusal is counted");

    // Forged id: M at 127.0.0.2 names A's id.
    let stage = Stage::new(&place);
    stage.origin.put("/obj.bin", v1.clone());
    let a = work.join("forged-a.bin");
    stage.first_stops(&a, SOON, &[]);
    let victims = given_id(&stage.first().url("/obj.bin"), &[]);
    assert!(victims.starts_with("auto-"), "{victims}");
    stage.origin.put("/obj.bin", v2.clone());
    let attacker = ["--interface", "127.0.0.2"];
    for url in [
        stage.others().url("/obj.bin"),
        stage.others().url(&format!("/obj.bin?download_id={victims}")),
    ] {
        let header = format!("X-Download-Id: {victims}");
        let mut args = attacker.to_vec();
        args.extend(["-H", &header]);
        assert_ne!(given_id(&url, &args), victims, "a client cannot name a derived id");
        let m = work.join("forged-m.bin");
        let _ = std::fs::remove_file(&m);
        resumed(&url, &m, &args).assert_success();
        assert_eq!(sha256_file(&m), sha256_hex(&v2));
    }
    let _ = resumed(&stage.first().url("/obj.bin"), &a, &[]);
    assert_not_mixed("forged id", &a, &v1, &v2, false);

    // One id, two objects.
    let stage = Stage::new(&place);
    stage.origin.put("/obj.bin", v1.clone());
    stage.origin.put("/other.bin", v2.clone());
    let job = ["-H", "X-Download-Id: job"];
    let a = work.join("two-objects.bin");
    stage.first_stops(&a, SOON, &job);
    let other = work.join("two-objects-other.bin");
    resumed(&stage.others().url("/other.bin"), &other, &job).assert_success();
    stage.origin.put("/obj.bin", v2.clone());
    let _ = resumed(&stage.first().url("/obj.bin"), &a, &job);
    assert_not_mixed("one id, two objects", &a, &v1, &v2, false);

    // Restarted, past what the old version left.
    let stage = Stage::new(&place);
    stage.origin.put("/obj.bin", v1.clone());
    let a = work.join("restarted-past.bin");
    stage.first_stops(&a, SOON, &[]);
    let old = file_len(&a) as u64;
    stage.origin.put("/obj.bin", v2.clone());
    stage.first_stops(&a, LATER, &[]);
    assert!(file_len(&a) as u64 > 2 * old, "the restart got further");
    resumed(&stage.first().url("/obj.bin"), &a, &[]).assert_success();
    assert_eq!(sha256_file(&a), sha256_hex(&v2), "the restarted download resumed");

    // Restarted, within what the old version left: the prefix could be either's.
    let stage = Stage::new(&place);
    stage.origin.put("/obj.bin", v1.clone());
    let a = work.join("restarted-within.bin");
    stage.first_stops(&a, LATER, &[]);
    stage.origin.put("/obj.bin", v2.clone());
    stage.first_stops(&a, SOON, &[]);
    let held = file_len(&a);
    let refusal = support::http::get(
        &stage.first().url("/obj.bin"),
        &[("Range", &format!("bytes={held}-")), ("User-Agent", &curl_agent())],
    );
    assert_eq!(refusal.status, 412);
    let explained = String::from_utf8_lossy(&refusal.body);
    assert!(
        explained.contains("X-Download-Id") && explained.contains("download_id"),
        "{explained}"
    );
    let _ = resumed(&stage.first().url("/obj.bin"), &a, &[]);
    assert_eq!(file_len(&a), held);
    assert_not_mixed("restarted within", &a, &v1, &v2, false);
    // As the body says: start over under an id of its own, and that download resumes.
    let own = ["-H", "X-Download-Id: mine"];
    stage.first_stops(&a, SOON, &own);
    resumed(&stage.first().url("/obj.bin"), &a, &own).assert_success();
    assert_eq!(sha256_file(&a), sha256_hex(&v2));
}

/// curl's User-Agent, as the curl on this machine sends it.
fn curl_agent() -> String {
    let version = run(
        {
            let mut curl = Command::new("curl");
            curl.arg("--version");
            curl
        },
        Duration::from_secs(10),
    );
    let number = version.stdout.split_whitespace().nth(1).expect("curl --version").to_owned();
    format!("curl/{number}")
}

#[test]
fn no_other_client_can_make_a_resume_splice_with_the_memory_store() {
    scenarios(Place::Memory);
}

#[test]
fn no_other_client_can_make_a_resume_splice_with_redis() {
    scenarios(Place::Redis);
}

#[test]
fn no_other_client_can_make_a_resume_splice_across_instances() {
    scenarios(Place::TwoInstances);
}
