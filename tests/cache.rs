//! The slice cache in front of real origins (nginx, and an origin that misbehaves on purpose):
//! every answer byte for byte what the origin holds, each slice fetched from the origin once,
//! however many clients ask at once, versions never mixed, and a cache that fails (a full or
//! unwritable disk, a kill) costs the origin more bytes but never a client a wrong one.

mod support;

use std::path::Path;
use std::time::{Duration, SystemTime};

use support::clients::{aria2c_download, curl_resume, sha256_file, sha256_hex, write_partial};
use support::data::test_bytes;
use support::http::{RawRequest, Response, get, head};
use support::nginx::{Nginx, NginxOptions};
use support::origin::{Behaviour, Faults, Origin};
use support::proxy::{Instance, Proxy, ProxyProcess, cache_config as config};
use support::tmp::TempDir;

const MIB: usize = 1024 * 1024;

/// Writes `object` under `root` as `name`, last modified ten days ago: fresh for a day by RFC
/// 9111's heuristic, so that a second request is served without asking the origin.
fn put_file(root: &Path, name: &str, object: &[u8]) {
    let path = root.join(name);
    std::fs::write(&path, object).expect("write the object");
    let file = std::fs::File::options().write(true).open(&path).expect("open");
    file.set_modified(SystemTime::now() - Duration::from_secs(10 * 86_400)).expect("set mtime");
}

/// nginx's access log: `(method, uri, status, body bytes, range)` per request.
fn origin_requests(nginx: &Nginx) -> Vec<(String, String, u16, u64, String)> {
    nginx
        .access_log()
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(5, ' ');
            let method = fields.next()?.to_owned();
            let uri = fields.next()?.to_owned();
            let status = fields.next()?.parse().ok()?;
            let bytes = fields.next()?.parse().ok()?;
            let range = fields.next()?.split('"').nth(1)?.to_owned();
            Some((method, uri, status, bytes, range))
        })
        .collect()
}

fn body_bytes(nginx: &Nginx) -> u64 {
    origin_requests(nginx).iter().map(|r| r.3).sum()
}

fn range(url: &str, spec: &str) -> Response {
    get(url, &[("Range", spec)])
}

#[test]
fn a_cold_range_fetches_its_slices_only_and_what_was_fetched_is_served_again() {
    let root = TempDir::new("cache-root");
    let cache = TempDir::new("cache-dir");
    let len = 10 * MIB + 12_345;
    let object = test_bytes(len, 81);
    put_file(root.path(), "big.bin", &object);
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let proxy = Proxy::start(&config(&nginx.base_url(), cache.path(), "64MiB"));
    let url = proxy.url("/big.bin");

    // A cold tail: one request, which says what the object is and brings its last slice. Where
    // that slice begins is not known before the length is: the suffix asked is a slice longer
    // (less a byte), and what comes before the slice is passed over.
    let tail = range(&url, "bytes=-1000");
    assert_eq!(tail.status, 206);
    assert_eq!(tail.body, &object[len - 1000..]);
    assert_eq!(tail.header("x-rangeway-cache"), Some("miss"));
    let asked = origin_requests(&nginx);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].0, "GET");
    assert_eq!(asked[0].4, format!("bytes=-{}", 1000 + MIB - 1), "the last slice, and before it");
    let tail_bytes = (1000 + MIB - 1) as u64;
    assert_eq!(body_bytes(&nginx), tail_bytes);

    // Across three slice boundaries: exact, and only the slices missing are fetched.
    let (first, last) = (MIB - 10, 4 * MIB + 10);
    let across = range(&url, &format!("bytes={first}-{last}"));
    assert_eq!(across.status, 206);
    assert_eq!(
        across.header("content-range"),
        Some(format!("bytes {first}-{last}/{len}").as_str())
    );
    assert!(across.body == object[first..=last]);
    assert_eq!(body_bytes(&nginx), tail_bytes + 5 * MIB as u64, "slices 0 to 4, once");

    // Several ranges, over cached and missing slices: exact.
    let multi = range(&url, "bytes=0-99,7340032-7340131");
    assert_eq!(multi.status, 206);
    let text = String::from_utf8_lossy(&multi.body);
    assert!(text.contains("Content-Range: bytes 0-99/"), "{text:.300}");
    assert!(text.contains("Content-Range: bytes 7340032-7340131/"), "{text:.300}");

    // The whole object, twice: each byte fetched once in all, the second served from the cache
    // without a request to the origin.
    let before = origin_requests(&nginx).len();
    let whole = get(&url, &[]);
    assert_eq!(whole.status, 200);
    assert!(whole.body == object);
    assert!(
        body_bytes(&nginx) <= len as u64 + MIB as u64,
        "each slice once: {}",
        body_bytes(&nginx)
    );
    let fetched = origin_requests(&nginx).len();
    assert!(fetched > before);
    let again = get(&url, &[]);
    assert!(again.body == object);
    assert_eq!(again.header("x-rangeway-cache"), Some("hit"));
    assert_eq!(origin_requests(&nginx).len(), fetched, "a hit asks the origin nothing");
    let hits = proxy.metric_at_least("rangeway_cache_requests_total", "outcome=\"hit\"", 1);
    assert!(hits >= 1);
    // A hit that goes out untouched goes from the cache's files to the socket (sendfile).
    assert!(proxy.metric("rangeway_transport_total", "transport=\"sendfile\"") >= 1);

    // What the admin API says is cached, and a purge.
    let listed = proxy.cache_listing("path=/big.bin");
    let slices = listed["objects"][0]["slices"].as_array().map(Vec::len);
    assert_eq!(slices, Some(11), "{listed}");
    let purged = support::http::request(
        proxy.admin_addr(),
        &support::http::RawRequest::new("DELETE", "/v1/cache?path=/big.bin"),
    )
    .expect("an answer");
    assert_eq!(purged.status, 200, "{}", String::from_utf8_lossy(&purged.body));
    assert_eq!(get(&proxy.admin_url("/v1/cache?path=/big.bin"), &[]).status, 404);
    let after = get(&url, &[("Range", "bytes=0-9")]);
    assert_eq!(after.body, &object[..10]);
    assert_eq!(after.header("x-rangeway-cache"), Some("miss"), "fetched again after a purge");
}

#[test]
fn clients_through_the_cache_get_the_objects_bytes() {
    let root = TempDir::new("cache-clients-root");
    let cache = TempDir::new("cache-clients-dir");
    let work = TempDir::new("cache-clients-work");
    let object = test_bytes(6 * MIB + 77, 82);
    put_file(root.path(), "obj.bin", &object);
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let proxy = Proxy::start(&config(&nginx.base_url(), cache.path(), "64MiB"));
    let url = proxy.url("/obj.bin");
    let want = sha256_hex(&object);

    aria2c_download(&url, work.path(), "aria2.bin").assert_success();
    assert_eq!(sha256_file(&work.join("aria2.bin")), want);
    let file = work.join("curl.bin");
    write_partial(&file, &object, 3 * MIB + 5);
    curl_resume(&url, &file).assert_success();
    assert_eq!(sha256_file(&file), want);
    assert!(body_bytes(&nginx) <= object.len() as u64 + MIB as u64, "{}", body_bytes(&nginx));
    let headed = head(&url, &[]);
    assert_eq!(headed.header("content-length"), Some(object.len().to_string().as_str()));
}

/// A small, seeded generator: the same ranges on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// 100 clients at once, each asking ranges of a cold 1 GiB object, and aria2c with 16 connections:
/// every answer exact, and the origin sends each byte about once (a slice's worth more at most).
#[test]
fn concurrent_cold_clients_fetch_each_slice_once() {
    let root = TempDir::new("cache-many-root");
    let cache = TempDir::new("cache-many-dir");
    let work = TempDir::new("cache-many-work");
    let len = 1024 * MIB + 4321;
    let object = std::sync::Arc::new(test_bytes(len, 83));
    put_file(root.path(), "many.bin", &object);
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let proxy = Proxy::start(&config(&nginx.base_url(), cache.path(), "2GiB"));
    let url = proxy.url("/many.bin");

    let aria2 = {
        let (url, dir) = (url.clone(), work.path().to_owned());
        std::thread::spawn(move || {
            let mut command = std::process::Command::new("aria2c");
            command
                .args(["-x16", "-s16", "-k1M", "--allow-overwrite=true"])
                .arg("-d")
                .arg(&dir)
                .args(["-o", "aria2.bin", &url]);
            support::clients::run(command, Duration::from_secs(120))
        })
    };
    let clients: Vec<_> = (0..100u64)
        .map(|i| {
            let (url, object) = (url.clone(), std::sync::Arc::clone(&object));
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (i + 1));
                for _ in 0..3 {
                    let first = rng.below(len as u64) as usize;
                    let last = (first + rng.below(3 * MIB as u64) as usize).min(len - 1);
                    let answer = range(&url, &format!("bytes={first}-{last}"));
                    assert_eq!(answer.status, 206, "{first}-{last}");
                    assert!(answer.body == object[first..=last], "{first}-{last}: wrong bytes");
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a client's bytes were wrong");
    }
    aria2.join().expect("aria2c ran").assert_success();
    assert_eq!(sha256_file(&work.join("aria2.bin")), sha256_hex(&object));
    let fetched = body_bytes(&nginx);
    assert!(
        fetched <= (len + MIB) as u64,
        "the origin sent {fetched} bytes of a {len}-byte object"
    );
    let waits = proxy.metric("rangeway_cache_requests_total", "outcome=\"coalesced\"");
    assert!(waits > 0, "some requests waited on others' fetches");
}

/// An origin that cuts its answers at random bytes: fetches go on where they broke; an answer
/// is exact or cut, never a short one that looks complete; nothing torn is kept.
#[test]
fn fills_the_origin_breaks_off_are_continued_and_never_kept_torn() {
    let origin = Origin::start();
    let len = 5 * MIB + 999;
    let object = test_bytes(len, 84);
    origin.put_with_headers("/cut.bin", object.clone(), &[("Cache-Control", "max-age=3600")]);
    origin.set_behaviour(
        "/cut.bin",
        Behaviour::Faulty(Faults {
            seed: 7,
            error_percent: 10,
            cut_percent: 40,
            stall_percent: 0,
            stall: Duration::ZERO,
        }),
    );
    let cache = TempDir::new("cache-cut-dir");
    let proxy = Proxy::start(&config(&origin.base_url(), cache.path(), "64MiB"));
    let url = proxy.url("/cut.bin");
    for _ in 0..4 {
        let answer = get(&url, &[]);
        // Complete and exact, or cut: a short body never passes as the object.
        if answer.body.len() == len {
            assert!(answer.body == object, "a complete answer is the object");
        }
    }
    // With the origin well again, the cache's slices are the object's.
    origin.clear_behaviour("/cut.bin");
    let whole = get(&url, &[]);
    assert!(whole.body == object, "what was kept is the object");
    let again = get(&url, &[]);
    assert_eq!(again.header("x-rangeway-cache"), Some("hit"));
    assert!(again.body == object);
}

/// The object replaced while clients fill it: no answer mixes versions.
#[test]
fn an_object_replaced_while_it_fills_never_mixes_versions() {
    let origin = Origin::start();
    let len = 8 * MIB + 5;
    let (old, new) = (test_bytes(len, 85), test_bytes(len, 86));
    origin.put_with_headers("/moving.bin", old.clone(), &[("Cache-Control", "max-age=1")]);
    origin.set_behaviour(
        "/moving.bin",
        Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(5) },
    );
    let cache = TempDir::new("cache-moving-dir");
    let proxy = Proxy::start(&config(&origin.base_url(), cache.path(), "64MiB"));
    let url = proxy.url("/moving.bin");
    let versions = [sha256_hex(&old), sha256_hex(&new)];
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(40 * i));
                get(&url, &[]).body
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    origin.put_with_headers("/moving.bin", new.clone(), &[("Cache-Control", "max-age=1")]);
    let mut complete = 0;
    for client in clients {
        let body = client.join().expect("a client");
        if body.len() == len {
            complete += 1;
            assert!(versions.contains(&sha256_hex(&body)), "a complete answer is one version");
        }
    }
    // Once the cached version is stale, the new one is what is served.
    let served = support::http::get_until(&url, |r| {
        r.body.len() == len && sha256_hex(&r.body) == versions[1]
    });
    assert_eq!(sha256_hex(&served.body), versions[1]);
    let _ = complete;
}

/// rangeway killed (-9) while 50 fills run, then started again on the same folder: the slices
/// being written are gone, what is served is exact.
#[test]
fn a_kill_during_fills_leaves_nothing_torn() {
    let origin = Origin::start();
    let cache = TempDir::new("cache-kill-dir");
    let len = 4 * MIB + 3;
    let objects: Vec<Vec<u8>> = (0..10).map(|i| test_bytes(len, 100 + i)).collect();
    for (i, object) in objects.iter().enumerate() {
        origin.put_with_headers(
            &format!("/o{i}.bin"),
            object.clone(),
            &[("Cache-Control", "max-age=3600")],
        );
    }
    // A slow origin keeps the fills under way when the kill comes: with a fast one they could
    // all have ended, and the test would show nothing.
    origin.set_global_behaviour(Behaviour::Slow {
        chunk: 64 * 1024,
        delay: Duration::from_millis(25),
    });
    let body = config(&origin.base_url(), cache.path(), "256MiB");
    let first = ProxyProcess::start(&body);
    let clients: Vec<_> = (0..50)
        .map(|i| {
            let url = first.url(&format!("/o{}.bin", i % 10));
            std::thread::spawn(move || {
                let _ = support::http::try_get(&url);
            })
        })
        .collect();
    // Some slices complete, others half written.
    support::wait::until("whole slices and slices being written", Duration::from_secs(20), || {
        (dir_bytes(cache.path()) > 2 * MIB as u64 && !files_named(cache.path(), ".part").is_empty())
            .then_some(())
    });
    first.signal("KILL");
    for client in clients {
        let _ = client.join();
    }
    drop(first);
    origin.set_global_behaviour(Behaviour::Normal);
    let torn = files_named(cache.path(), ".part").len();
    assert!(torn > 0, "the kill left slices half written (else this test shows nothing)");
    let second = ProxyProcess::start(&body);
    let parts = files_named(cache.path(), ".part");
    assert!(parts.is_empty(), "slices being written are gone after a restart: {parts:?}");
    for (i, object) in objects.iter().enumerate() {
        let url = second.url(&format!("/o{i}.bin"));
        assert!(get(&url, &[]).body == *object, "o{i}.bin whole");
        let tail = range(&url, "bytes=-100");
        assert_eq!(tail.body, &object[len - 100..], "o{i}.bin tail");
    }
}

/// Five times the cache's size through it: the size holds, every answer is exact.
#[test]
fn the_size_bound_holds() {
    let root = TempDir::new("cache-bound-root");
    let cache = TempDir::new("cache-bound-dir");
    let len = 4 * MIB;
    let objects: Vec<Vec<u8>> = (0..20).map(|i| test_bytes(len, 200 + i)).collect();
    for (i, object) in objects.iter().enumerate() {
        put_file(root.path(), &format!("b{i}.bin"), object);
    }
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let proxy = Proxy::start(&config(&nginx.base_url(), cache.path(), "16MiB"));
    for round in 0..2 {
        for (i, object) in objects.iter().enumerate() {
            let answer = get(&proxy.url(&format!("/b{i}.bin")), &[]);
            assert!(answer.body == *object, "b{i}.bin, round {round}");
            let on_disk = dir_bytes(cache.path());
            assert!(on_disk <= 16 * MIB as u64 + 64 * 1024, "{on_disk} bytes on disk");
        }
    }
    assert!(proxy.metric("rangeway_cache_evictions_total", "") > 0);
    assert!(proxy.metric("rangeway_cache_disk_bytes", "") <= 16 * MIB as u64);
}

/// 20,000 distinct small objects through a cache of 16 MiB: everything it keeps — slices, their
/// metadata, its folders — stays within `max_size` as `du` counts it and within `max_entries`
/// (its default, 256 for 16 MiB) as `find` counts files and folders; the metrics say what `du`
/// and `find` find. rangeway's memory before and after is printed (`--nocapture`).
#[test]
fn many_small_objects_stay_within_both_bounds() {
    const OBJECTS: usize = 20_000;
    const CLIENTS: usize = 16;
    let origin = Origin::start();
    let object = test_bytes(1000, 93);
    // One object at the origin; each query is another object for the cache.
    origin.put_with_headers("/small.bin", object.clone(), &[("Cache-Control", "max-age=600")]);
    let cache = TempDir::new("cache-small-dir");
    let proxy = ProxyProcess::start(&config(&origin.base_url(), cache.path(), "16MiB"));
    assert_eq!(get(&proxy.url("/small.bin?z=warm"), &[]).body, object);
    let before = rss_kib(proxy.pid());
    let started = std::time::Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (addr, object) = (proxy.addr(), object.clone());
            std::thread::spawn(move || {
                // One connection each, kept alive: the cache's work, not connecting, is measured.
                let mut connection = support::http::Connection::open(addr).expect("connect");
                for n in (client..OBJECTS).step_by(CLIENTS) {
                    let request = RawRequest::get(&format!("/small.bin?z={n}"));
                    let answer = connection.send(&request).expect("an answer");
                    assert_eq!(answer.status, 200, "z={n}");
                    assert!(answer.body == object, "z={n}: the object's bytes");
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a client got a wrong answer");
    }
    let took = started.elapsed();
    assert!(proxy.metric("rangeway_cache_evictions_total", "") > 0);
    // A slice is read as it is written: it may be renamed into place just after its last byte
    // went out.
    support::wait::until("no slice being written", Duration::from_secs(10), || {
        files_named(cache.path(), ".part").is_empty().then_some(())
    });
    let after = rss_kib(proxy.pid());
    let du = du_bytes(cache.path());
    let entries = entry_count(cache.path());
    let (metric_bytes, metric_entries) =
        (proxy.metric("rangeway_cache_disk_bytes", ""), proxy.metric("rangeway_cache_entries", ""));
    println!(
        "{OBJECTS} objects in {took:?}: du {du} bytes, {entries} files and folders; \
         rangeway's RSS {before} KiB before, {after} KiB after ({:+} KiB)",
        after as i64 - before as i64
    );
    assert!(du <= 16 * MIB as u64, "du says {du} bytes, over max_size");
    assert!(entries <= 256, "{entries} files and folders, over max_entries");
    assert_eq!(metric_entries, entries, "rangeway_cache_entries against find");
    // Within a block per entry of what du finds.
    assert!(metric_bytes.abs_diff(du) <= 4096 * entries, "the metric {metric_bytes}, du {du}");
    // What was evicted was evicted whole: a version's folder with its metadata and slice.
    let kept =
        proxy.cache_listing("prefix=/small.bin")["objects"].as_array().map_or(0, Vec::len) as u64;
    assert!(kept > 0 && kept * 3 <= entries, "{kept} objects kept in {entries} entries");
    // What is kept is served without asking the origin.
    let url = proxy.url("/small.bin?z=again");
    assert_eq!(get(&url, &[]).header("x-rangeway-cache"), Some("miss"));
    origin.clear_requests();
    let again = get(&url, &[]);
    assert_eq!(again.header("x-rangeway-cache"), Some("hit"));
    assert!(again.body == object && origin.requests().is_empty());
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("read /proc/PID/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// What `du` finds under `dir`, in bytes (its blocks, as the disk holds them).
fn du_bytes(dir: &Path) -> u64 {
    let out = std::process::Command::new("du").args(["-s", "-B1"]).arg(dir).output().expect("du");
    assert!(out.status.success(), "du failed");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().and_then(|n| n.parse().ok()).expect("du's total")
}

/// Files and folders under `dir`, `dir` included, as `find` counts them.
fn entry_count(dir: &Path) -> u64 {
    let out = std::process::Command::new("find").arg(dir).output().expect("find");
    assert!(out.status.success(), "find failed");
    out.stdout.iter().filter(|b| **b == b'\n').count() as u64
}

/// A cache folder that cannot be made, and one whose writes fail: downloads complete from the
/// origin, and the failures are counted.
#[test]
fn a_cache_that_cannot_write_serves_from_the_origin() {
    let root = TempDir::new("cache-ro-root");
    let object = test_bytes(3 * MIB + 1, 87);
    put_file(root.path(), "ro.bin", &object);
    let nginx = Nginx::start(NginxOptions::serving(root.path()));

    // The folder's parent is a file: the cache is off at start.
    let blocked = TempDir::new("cache-ro-file");
    std::fs::write(blocked.join("file"), b"x").expect("write");
    let off = Proxy::start(&config(&nginx.base_url(), &blocked.join("file/cache"), "64MiB"));
    assert!(get(&off.url("/ro.bin"), &[]).body == object);
    assert_eq!(off.metric("rangeway_cache_enabled", ""), 0);
    // Counted once the request's logging phase ran, which may be after its client has it all.
    support::wait::until("the request counted", Duration::from_secs(5), || {
        (off.metric("rangeway_cache_requests_total", "outcome=\"off\"") == 1).then_some(())
    });

    // Every folder slices would go in is a file: each write fails, each slice comes from the
    // origin.
    let failing = TempDir::new("cache-ro-dir");
    let on = Proxy::start(&config(&nginx.base_url(), failing.path(), "64MiB"));
    for prefix in 0..256 {
        let _ = std::fs::write(failing.join(format!("v1/{prefix:02x}")), b"not a folder");
    }
    for _ in 0..2 {
        assert!(get(&on.url("/ro.bin"), &[]).body == object);
        let tail = range(&on.url("/ro.bin"), "bytes=-10");
        assert_eq!(tail.body, &object[object.len() - 10..]);
    }
    assert!(on.metric("rangeway_cache_write_errors_total", "") > 0);
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    walk(dir).iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum()
}

fn files_named(dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
    walk(dir).into_iter().filter(|p| p.to_string_lossy().ends_with(suffix)).collect()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(next) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

/// What is not for a shared cache goes to the origin as without one: answers that say `private`,
/// and requests carrying `Authorization` unless the route says such answers may be kept.
#[test]
fn what_a_shared_cache_may_not_keep_goes_to_the_origin() {
    let origin = Origin::start();
    let object = test_bytes(2 * MIB + 9, 88);
    origin.put_with_headers("/private.bin", object.clone(), &[("Cache-Control", "private")]);
    origin.put_with_headers("/mine.bin", object.clone(), &[("Cache-Control", "max-age=600")]);
    let cache = TempDir::new("cache-private-dir");
    let body = config(&origin.base_url(), cache.path(), "64MiB");
    let body = format!(
        "{body}\n[[routes]]\npath_prefix = \"/kept/\"\nupstream = \"origin\"\nstrip_prefix = true\n\
         cache = {{ authorized = true }}\n"
    );
    let proxy = Proxy::start(&body);
    for _ in 0..2 {
        let part = range(&proxy.url("/private.bin"), "bytes=1000-1999");
        assert_eq!(part.body, &object[1000..2000]);
        assert_eq!(part.header("x-rangeway-cache"), None);
    }
    assert_eq!(
        proxy.metric_at_least("rangeway_cache_requests_total", "outcome=\"bypass_uncacheable\"", 2),
        2
    );
    let auth = ("Authorization", "Bearer someone");
    let asked = get(&proxy.url("/mine.bin"), &[auth, ("Range", "bytes=0-9")]);
    assert_eq!((asked.body.as_slice(), asked.header("x-rangeway-cache")), (&object[..10], None));
    let kept = get(&proxy.url("/kept/mine.bin"), &[auth, ("Range", "bytes=0-9")]);
    assert_eq!(
        (kept.body.as_slice(), kept.header("x-rangeway-cache")),
        (&object[..10], Some("miss"))
    );
}

/// A miss costs the origin one request: the GET of the slices the client needs, whose answer
/// says what the object is (no HEAD before it) — from an origin that serves ranges, from one that
/// ignores them, and for answers that may not be kept, which are the client's; counted at the
/// origin.
#[test]
fn a_miss_costs_the_origin_one_request() {
    let origin = Origin::start();
    let len = 5 * MIB + 77;
    let object = test_bytes(len, 94);
    let kept = [("Cache-Control", "max-age=600")];
    for path in ["/whole.bin", "/middle.bin", "/ignores.bin", "/head.bin"] {
        origin.put_with_headers(path, object.clone(), &kept);
    }
    origin.set_behaviour("/ignores.bin", Behaviour::IgnoreRange);
    let no_store = [("Cache-Control", "no-store")];
    origin.put_with_headers("/no-store.bin", object.clone(), &no_store);
    origin.put_with_headers("/cookie.bin", object.clone(), &no_store);
    origin.put_with_headers("/private.bin", object.clone(), &[("Cache-Control", "private")]);
    let varies = [("Cache-Control", "max-age=600"), ("Vary", "X-Mine")];
    origin.put_with_headers("/varies.bin", object.clone(), &varies);
    let star = [("Cache-Control", "max-age=600"), ("Vary", "*")];
    origin.put_with_headers("/varies-star.bin", object.clone(), &star);
    let cache = TempDir::new("cache-one-dir");
    let proxy = Proxy::start(&config(&origin.base_url(), cache.path(), "64MiB"));
    // What reached the origin since the last look.
    let asked = || {
        let requests = origin.requests();
        origin.clear_requests();
        requests
    };

    // A cold whole download: one GET, of the run of slices from the first.
    let url = proxy.url("/whole.bin");
    let whole = get(&url, &[]);
    assert_eq!((whole.status, whole.header("x-rangeway-cache")), (200, Some("miss")));
    assert!(whole.body == object);
    let seen = asked();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].header("range")),
        ("GET", Some("bytes=0-16777215"))
    );
    // The second download and a range of it: from the cache, byte for byte.
    let again = get(&url, &[]);
    assert_eq!(again.header("x-rangeway-cache"), Some("hit"));
    assert!(again.body == object);
    let part = range(&url, "bytes=1048570-3000000");
    assert_eq!((part.status, part.header("x-rangeway-cache")), (206, Some("hit")));
    assert!(part.body == object[1_048_570..=3_000_000]);
    assert!(asked().is_empty(), "hits ask the origin nothing");

    // A cold range in the middle: one GET, of the slice holding it.
    let middle = range(&proxy.url("/middle.bin"), "bytes=2500000-2600000");
    assert_eq!(middle.body, &object[2_500_000..=2_600_000]);
    let seen = asked();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].header("range"), Some("bytes=2097152-3145727"));
    let middle = range(&proxy.url("/middle.bin"), "bytes=2500000-2600000");
    assert_eq!(middle.body, &object[2_500_000..=2_600_000]);
    assert!(asked().is_empty());

    // A cold HEAD: one GET, of the first slice; its header is the HEAD's answer.
    let headed = head(&proxy.url("/head.bin"), &[]);
    assert_eq!(headed.status, 200);
    assert_eq!(headed.header("content-length"), Some(len.to_string().as_str()));
    let seen = asked();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].header("range")),
        ("GET", Some("bytes=0-1048575"))
    );

    // An origin that ignores Range: its whole answer, kept as it streams; one request.
    let ignores = proxy.url("/ignores.bin");
    let first = range(&ignores, "bytes=100-199");
    assert_eq!((first.status, &first.body[..]), (206, &object[100..200]));
    assert_eq!(asked().len(), 1);
    support::wait::until("the whole object kept", Duration::from_secs(10), || {
        let listed = proxy.cache_listing("path=/ignores.bin");
        (listed["objects"][0]["slices"].as_array().map(Vec::len) == Some(6)).then_some(())
    });
    for (spec, bytes) in [
        ("bytes=4000000-5000000", &object[4_000_000..=5_000_000]),
        ("bytes=-10", &object[len - 10..]),
        ("bytes=0-", &object[..]),
    ] {
        let part = range(&ignores, spec);
        assert_eq!((part.status, part.header("x-rangeway-cache")), (206, Some("hit")), "{spec}");
        assert!(part.body == bytes, "{spec}");
    }
    assert!(asked().is_empty(), "the rest of it from the cache");

    // Answers that may not be kept: the first one, asked by the cache, is the client's; then the
    // client's own requests. One origin request a client request, whole or ranged first.
    for (path, ranged_first) in [("/no-store.bin", false), ("/private.bin", true)] {
        let url = proxy.url(path);
        let whole = || {
            let whole = get(&url, &[]);
            assert_eq!((whole.status, whole.header("x-rangeway-cache")), (200, None), "{path}");
            assert!(whole.body == object, "{path}: the object");
        };
        let part = || {
            let part = range(&url, "bytes=1000-1999");
            assert_eq!((part.status, part.header("x-rangeway-cache")), (206, None), "{path}");
            assert_eq!(part.body, &object[1000..2000], "{path}: the range");
        };
        for _ in 0..2 {
            if ranged_first {
                part();
                whole();
            } else {
                whole();
                part();
            }
        }
        let seen = asked();
        assert_eq!(seen.len(), 4, "{path}: {seen:?}");
    }

    // A client's Cookie could change an answer that may not be kept: the cache's request carried
    // none, so the client's own request goes to the origin after it.
    let cookie =
        get(&proxy.url("/cookie.bin"), &[("Cookie", "session=mine"), ("Range", "bytes=10-19")]);
    assert_eq!((cookie.status, &cookie.body[..]), (206, &object[10..20]));
    let seen = asked();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].header("cookie"), None, "the cache's own request");
    assert_eq!(seen[1].header("cookie"), Some("session=mine"), "the client's request");

    // An answer that varies by a field is kept apart by its values (RFC 9111 §4.1): the cache's
    // request carries the client's field, and each value is its own variant, asked once.
    let varies = proxy.url("/varies.bin");
    // A miss answers its ten bytes before its slice is whole; until then the variant's next
    // client joins the fill ("coalesced"), so each miss is waited on until its slice is kept.
    let variants_kept = || {
        let listed = proxy.cache_listing("path=/varies.bin");
        let objects = listed["objects"].as_array().into_iter().flatten();
        objects.filter(|o| o["slices"].as_array().is_some_and(|s| !s.is_empty())).count()
    };
    let mut misses = 0;
    for (mine, outcome) in [
        (None, "miss"),
        (Some("a"), "miss"),
        (None, "hit"),
        (Some("a"), "hit"),
        (Some("b"), "miss"),
    ] {
        let mut fields = vec![("Range", "bytes=10-19")];
        fields.extend(mine.map(|value| ("X-Mine", value)));
        let part = get(&varies, &fields);
        assert_eq!(
            (part.status, &part.body[..], part.header("x-rangeway-cache")),
            (206, &object[10..20], Some(outcome)),
            "X-Mine: {mine:?}"
        );
        let seen = asked();
        assert_eq!(seen.len(), usize::from(outcome == "miss"), "X-Mine: {mine:?}: {seen:?}");
        if let Some(request) = seen.first() {
            assert_eq!(request.header("x-mine"), mine, "the client's field, as it sent it");
            misses += 1;
            support::wait::until("the variant kept", Duration::from_secs(10), || {
                (variants_kept() == misses).then_some(())
            });
        }
    }
    // `Vary: *` names no field to keep variants apart by: not kept, its first answer the
    // client's, then the client's own requests, one each.
    for _ in 0..2 {
        let star = get(&proxy.url("/varies-star.bin"), &[("Range", "bytes=10-19")]);
        assert_eq!((star.status, &star.body[..]), (206, &object[10..20]));
        assert_eq!(star.header("x-rangeway-cache"), None);
        assert_eq!(asked().len(), 1);
    }
}

/// An origin that ignores Range, kept whole; one of its slices lost while rangeway was down is
/// filled again by asking for the whole object (a Range would be ignored), pinned to the version
/// with `If-Match`, the bytes before the slice passed over: the answer exact, one request.
#[test]
fn a_missing_slice_of_an_origin_that_ignores_ranges_is_fetched_from_the_whole() {
    let origin = Origin::start();
    let len = 5 * MIB + 77;
    let object = test_bytes(len, 95);
    let etag = origin.put_with_headers(
        "/ignores.bin",
        object.clone(),
        &[("Cache-Control", "max-age=600")],
    );
    origin.set_behaviour("/ignores.bin", Behaviour::IgnoreRange);
    let cache = TempDir::new("cache-ignores-dir");
    let body = config(&origin.base_url(), cache.path(), "64MiB");
    let first = ProxyProcess::start(&body);
    assert!(get(&first.url("/ignores.bin"), &[]).body == object);
    support::wait::until("every slice kept", Duration::from_secs(10), || {
        files_named(cache.path(), ".part").is_empty().then_some(())
    });
    drop(first);
    let slices = walk(cache.path());
    let third = slices.iter().find(|p| p.file_name().is_some_and(|n| n == "3")).expect("slice 3");
    std::fs::remove_file(third).expect("remove slice 3");
    origin.clear_requests();

    let second = ProxyProcess::start(&body);
    let (first_byte, last_byte) = (3 * MIB + 10, 3 * MIB + 99_999);
    let part = range(&second.url("/ignores.bin"), &format!("bytes={first_byte}-{last_byte}"));
    assert_eq!(part.status, 206);
    assert!(
        part.body == object[first_byte..=last_byte],
        "the slice's bytes, not the object's first"
    );
    let asked = origin.requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].header("range"), Some(format!("bytes=0-{}", len - 1).as_str()));
    assert_eq!(asked[0].header("if-match"), Some(etag.as_str()));
    // Refilled (its fill may outlast the answer, which needed a tenth of the slice): asked
    // again, it is a hit.
    support::wait::until("slice 3 kept again", Duration::from_secs(10), || {
        files_named(cache.path(), ".part").is_empty().then_some(())
    });
    let again = range(&second.url("/ignores.bin"), &format!("bytes={first_byte}-{last_byte}"));
    assert_eq!(again.header("x-rangeway-cache"), Some("hit"));
    assert!(again.body == object[first_byte..=last_byte]);
    assert_eq!(origin.requests().len(), 1);
}

/// An origin that builds its answer from the host it was asked for (`X-Forwarded-Host`, else
/// `Host`), as web applications behind proxies do: the cache asks it with the client's fields
/// but none that names a host or a scheme, nor its `Cookie`, so a hostile client's `Host` never
/// becomes what another client is served.
#[test]
fn a_clients_host_never_changes_what_others_are_served() {
    let origin = Origin::start();
    let object = test_bytes(2 * MIB + 5, 92);
    origin.put_with_headers("/page.bin", object.clone(), &[("Cache-Control", "max-age=600")]);
    origin.set_behaviour("/page.bin", Behaviour::ReflectHost);
    let cache = TempDir::new("cache-host-dir");
    let proxy = Proxy::start(&config(&origin.base_url(), cache.path(), "64MiB"));
    // What the origin answers a clean request: links to its own host.
    let clean = get(&origin.url("/page.bin"), &[]);
    assert!(clean.body.starts_with(format!("http://{}/", origin.addr()).as_bytes()));
    origin.clear_requests();

    // The hostile client asks first, so its request is the one that starts every fetch.
    let hostile = RawRequest::get("/page.bin")
        .header("Host", "evil.example")
        .header("X-Forwarded-Host", "evil.example")
        .header("X-Forwarded-Proto", "https")
        .header("Cookie", "session=attacker")
        .header("X-Original-Host", "evil.example")
        .header("Accept-Language", "de");
    let first = support::http::request(proxy.addr(), &hostile).expect("an answer");
    assert_eq!(first.header("x-rangeway-cache"), Some("miss"));
    assert!(first.body == clean.body, "the hostile client gets the clean answer too");
    for asked in origin.requests() {
        let fields =
            ["x-forwarded-host", "x-forwarded-for", "x-forwarded-proto", "x-original-host"];
        for field in fields.into_iter().chain(["cookie"]) {
            assert_eq!(
                asked.header(field),
                None,
                "{field} in the cache's {} request",
                asked.method
            );
        }
        // What does not name a host is the client's, as it would reach the origin without a
        // cache (an answer that depends on it says so with `Vary`).
        assert_eq!(asked.header("accept-language"), Some("de"));
        assert_eq!(asked.header("host"), Some(origin.addr().to_string().as_str()));
    }

    // Another client, whole and in ranges: the origin's clean answer, fields included.
    let second = get(&proxy.url("/page.bin"), &[]);
    assert_eq!(second.header("x-rangeway-cache"), Some("hit"));
    assert!(second.body == clean.body, "the second client's bytes are the clean answer");
    assert_eq!(second.header("content-location"), clean.header("content-location"));
    let start = range(&proxy.url("/page.bin"), "bytes=0-63");
    assert_eq!(start.body, &clean.body[..64]);
}

/// What the origin's `Connection` names concerns its connection alone (RFC 9110 §7.6.1): it
/// reaches no client, relayed or from the cache, missed or hit, whole or in a range.
#[test]
fn fields_the_origins_connection_names_never_reach_a_client() {
    let origin = Origin::start();
    let object = test_bytes(MIB + 17, 93);
    let fields = [
        ("Cache-Control", "max-age=600"),
        ("Connection", "X-Hop, Keep-Alive"),
        ("X-Hop", "for the proxy's connection only"),
        ("X-Kept", "end to end"),
    ];
    origin.put_with_headers("/c.bin", object.clone(), &fields);
    let cache = TempDir::new("cache-connection-dir");
    let body = config(&origin.base_url(), cache.path(), "64MiB");
    let body = format!(
        "{body}\n[[routes]]\npath_prefix = \"/relayed/\"\nupstream = \"origin\"\n\
         strip_prefix = true\ncache = false\n"
    );
    let proxy = Proxy::start(&body);
    for (path, cache) in
        [("/c.bin", Some("miss")), ("/c.bin", Some("hit")), ("/relayed/c.bin", None)]
    {
        let whole = get(&proxy.url(path), &[]);
        assert_eq!(whole.header("x-rangeway-cache"), cache, "{path}");
        assert!(whole.body == object, "{path}: the object's bytes");
        let part = range(&proxy.url(path), "bytes=1000-1999");
        assert_eq!(part.body, &object[1000..2000], "{path}");
        for answer in [&whole, &part] {
            assert_eq!(answer.header("x-hop"), None, "{path}: a field Connection named");
            assert_eq!(answer.header("x-kept"), Some("end to end"), "{path}");
        }
    }
}

/// Decrypts with http_ece (an RFC 8188 implementation nobody here wrote), given the raw key.
fn http_ece_decrypt(ciphertext: &[u8], key: &[u8; 16]) -> Vec<u8> {
    let key_hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let script = "import sys, http_ece\n\
                  data = sys.stdin.buffer.read()\n\
                  sys.stdout.buffer.write(http_ece.decrypt(data, key=bytes.fromhex(sys.argv[1]), version='aes128gcm'))\n";
    support::clients::pipe(
        std::process::Command::new("python3").args(["-c", script, &key_hex]),
        ciphertext,
    )
}

/// gzip and aes128gcm routes through the cache: once a representation was made whole, the next
/// downloads and resumes of it come from the cache — the origin asked nothing, the stages not
/// run — and `gzip -dc` and an outside RFC 8188 decoder still read them.
#[test]
fn transformed_representations_are_made_once() {
    let origin = Origin::start();
    let len = 5 * MIB + 4321;
    let object = test_bytes(len, 89);
    origin.put_with_headers("/doc.bin", object.clone(), &[("Cache-Control", "max-age=600")]);
    let cache = TempDir::new("cache-transformed-dir");
    let work = TempDir::new("cache-transformed-work");
    let keys = work.join("keys");
    std::fs::write(&keys, "k1=AAECAwQFBgcICQoLDA0ODw\n").expect("write keys");
    let body = format!(
        "[cache]\ndir = \"{}\"\nslice_size = \"1MiB\"\n\n[upstreams.origin]\nurl = \"{}\"\n\n\
         [[routes]]\npath_prefix = \"/gz/\"\nupstream = \"origin\"\nstrip_prefix = true\n  \
         [[routes.middleware]]\n  kind = \"gzip\"\n  level = 6\n\n\
         [[routes]]\npath_prefix = \"/enc/\"\nupstream = \"origin\"\nstrip_prefix = true\n  \
         [[routes.middleware]]\n  kind = \"aes128gcm\"\n  key_file = \"{}\"\n",
        cache.path().display(),
        origin.base_url(),
        keys.display()
    );
    let proxy = Proxy::start(&body);
    let key = [0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

    for (route, decode) in [
        (
            "/gz/doc.bin",
            Box::new(|b: &[u8]| {
                support::clients::pipe(std::process::Command::new("gzip").arg("-dc"), b)
            }) as Box<dyn Fn(&[u8]) -> Vec<u8>>,
        ),
        ("/enc/doc.bin", Box::new(move |b: &[u8]| http_ece_decrypt(b, &key))),
    ] {
        let url = proxy.url(route);
        // gzip's first whole pass learns its block index (the output's length); the next makes
        // the representation's slices; then it is kept.
        let mut whole = get(&url, &[]);
        for _ in 0..2 {
            if whole.header("x-rangeway-cache") == Some("hit") {
                break;
            }
            whole = get(&url, &[]);
        }
        assert!(decode(&whole.body) == object, "{route}: the decoder reads it");
        let asked = origin.requests().len();
        let again = get(&url, &[]);
        assert_eq!(again.header("x-rangeway-cache"), Some("hit"), "{route}");
        assert!(again.body == whole.body, "{route}: the same bytes");
        let n = again.body.len();
        let part = range(&url, &format!("bytes={}-{}", n / 3, n - 1));
        assert_eq!(part.status, 206, "{route}");
        assert_eq!(part.header("x-rangeway-cache"), Some("hit"), "{route}");
        assert!(part.body == again.body[n / 3..], "{route}: a resume from the cache");
        let file = work.join(format!("resume-{}", route.len()));
        write_partial(&file, &whole.body, n / 2);
        curl_resume(&url, &file).assert_success();
        assert_eq!(sha256_file(&file), sha256_hex(&whole.body), "{route}: curl -C -");
        assert_eq!(origin.requests().len(), asked, "{route}: the origin was asked nothing");
    }
    // No stage ran for them: their untouched bodies went from the cache's files to the sockets.
    for route in ["/gz/", "/enc/"] {
        let label = format!("route=\"{route}\",transport=\"sendfile\"");
        assert!(proxy.metric_at_least("rangeway_transport_total", &label, 2) >= 2, "{route}");
    }
}

/// RFC 9111 freshness: a stale version is validated with one conditional GET of its first slices
/// (a 304 keeps its slices and refreshes its fields), and a route that validates every new download asks each
/// time while a resume of a session is served from the version it began on.
#[test]
fn stale_versions_are_validated_and_routes_may_validate_every_download() {
    let origin = Origin::start();
    let object = test_bytes(2 * MIB + 3, 90);
    // Fresh for long enough that a loaded debug run still finds it fresh on the second request
    // (with max-age=1 the first fill alone sometimes outlasted it).
    origin.put_with_headers("/fresh.bin", object.clone(), &[("Cache-Control", "max-age=4")]);
    let cache = TempDir::new("cache-fresh-dir");
    let body = format!(
        "{}\n[[routes]]\npath_prefix = \"/strict/\"\nupstream = \"origin\"\nstrip_prefix = true\n\
         cache = {{ revalidate = \"each-download\" }}\n",
        config(&origin.base_url(), cache.path(), "64MiB")
    );
    let proxy = Proxy::start(&body);
    let url = proxy.url("/fresh.bin");
    let learned = std::time::Instant::now();
    assert!(get(&url, &[]).body == object);
    let fresh = get(&url, &[]);
    assert_eq!(fresh.header("x-rangeway-cache"), Some("hit"));
    let age: u64 = fresh.header("age").and_then(|a| a.parse().ok()).expect("an Age");
    assert!(age < 4, "{age}");
    // The version's max-age running out.
    std::thread::sleep(Duration::from_millis(4500).saturating_sub(learned.elapsed()));
    origin.clear_requests();
    let validated = get(&url, &[]);
    assert!(validated.body == object);
    assert_eq!(validated.header("x-rangeway-cache"), Some("revalidated"));
    let asked: Vec<String> = origin.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(asked, ["GET"], "one conditional request");
    assert!(origin.requests()[0].header("if-none-match").is_some());
    assert!(origin.requests()[0].header("range").is_some(), "of the slices it would fill");

    // Every new download on the strict route is validated; a resume pinned to the version is not.
    let strict = proxy.url("/strict/fresh.bin");
    for _ in 0..2 {
        origin.clear_requests();
        let answer = get(&strict, &[]);
        assert!(answer.body == object);
        assert_eq!(answer.header("x-rangeway-cache"), Some("revalidated"));
        assert_eq!(origin.requests().len(), 1);
    }
    let etag = get(&strict, &[("Range", "bytes=0-0")]).header("etag").expect("an ETag").to_owned();
    origin.clear_requests();
    let pinned = get(&strict, &[("Range", "bytes=10-19"), ("If-Range", &etag)]);
    assert_eq!(pinned.body, &object[10..20]);
    assert_eq!(pinned.header("x-rangeway-cache"), Some("hit"));
    assert!(origin.requests().is_empty(), "a resume is served from its version");
}

/// A slice damaged on disk while rangeway was down is found by its CRC the first time it is read:
/// deleted, counted, fetched again — never served.
#[test]
fn a_slice_damaged_at_rest_is_never_served() {
    let root = TempDir::new("cache-rot-root");
    let cache = TempDir::new("cache-rot-dir");
    let object = test_bytes(3 * MIB, 91);
    put_file(root.path(), "rot.bin", &object);
    let nginx = Nginx::start(NginxOptions::serving(root.path()));
    let body = config(&nginx.base_url(), cache.path(), "64MiB");
    let first = ProxyProcess::start(&body);
    assert!(get(&first.url("/rot.bin"), &[]).body == object);
    drop(first);
    // Flip a byte in the middle of every slice.
    let slices: Vec<_> = walk(cache.path())
        .into_iter()
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.parse::<u64>().is_ok())
        })
        .collect();
    assert_eq!(slices.len(), 3);
    for slice in &slices {
        let mut bytes = std::fs::read(slice).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(slice, bytes).expect("write");
    }
    let second = ProxyProcess::start(&body);
    let fetched_before = body_bytes(&nginx);
    assert!(get(&second.url("/rot.bin"), &[]).body == object, "the object, not the damage");
    assert_eq!(second.metric("rangeway_cache_corrupt_slices_total", ""), 3);
    assert_eq!(body_bytes(&nginx) - fetched_before, object.len() as u64, "fetched again");
}
