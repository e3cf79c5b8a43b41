//! A download's resume stays safe when the state store forgets its session: a flood that fills
//! the embedded store, a Redis flush, restart, outage or stall. A bare resume whose session may be
//! lost is never served the current version's tail: `curl -C -` and `wget -c` are refused (their
//! partial files unchanged), other clients get the whole object; an object older than every
//! session the store could have lost still resumes (`docs/ranges-and-resume.md`).

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use support::clients::{run, sha256_hex};
use support::data::test_bytes;
use support::http::get;
use support::origin::Origin;
use support::proxy::{Instance, Proxy, ProxyProcess};
use support::redis::{RedisCluster, RedisServer, id_key_line};
use support::tmp::TempDir;
use support::wait;

const LEN: usize = 2 * 1024 * 1024;
const PARTIAL: usize = 700_000;

fn body(state: &str, origin: &Origin) -> String {
    format!(
        "{state}\n[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        origin.base_url()
    )
}

/// A partial download through rangeway, as an interrupted client leaves it: the first
/// [`PARTIAL`] bytes, fetched under download id `id` by `curl` with `user_agent`.
fn partial_download(url: &str, id: &str, user_agent: &str, file: &Path) {
    let mut curl = Command::new("curl");
    curl.args(["-fsS", "-A", user_agent, "-H", &format!("X-Download-Id: {id}")])
        .args(["-r", &format!("0-{}", PARTIAL - 1), "-o"])
        .arg(file)
        .arg(url);
    run(curl, Duration::from_secs(30)).assert_success();
    assert_eq!(std::fs::metadata(file).expect("partial file").len() as usize, PARTIAL);
}

/// `curl -C -` under download id `id`; the file must end as it was or as `whole`, never mixed.
fn curl_resumes_safely(url: &str, id: &str, file: &Path, v1: &[u8], whole: &[u8]) {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "-C", "-", "-H", &format!("X-Download-Id: {id}"), "-o"]).arg(file).arg(url);
    let resumed = run(curl, Duration::from_secs(30));
    assert_one_version(&format!("curl ({resumed})"), file, v1, whole);
}

/// `wget -c URL` in `dir` under download id `id`; likewise.
fn wget_resumes_safely(url: &str, id: &str, dir: &Path, v1: &[u8], whole: &[u8]) {
    let mut wget = Command::new("wget");
    wget.current_dir(dir).args(["-c", "-q", &format!("--header=X-Download-Id: {id}"), url]);
    let resumed = run(wget, Duration::from_secs(30));
    let name = url.rsplit('/').next().expect("a file name");
    assert_one_version(&format!("wget ({resumed})"), &dir.join(name), v1, whole);
}

/// The file is the partial download unchanged, or `whole`: never v1's head on another tail.
fn assert_one_version(client: &str, file: &Path, v1: &[u8], whole: &[u8]) {
    let got = std::fs::read(file).unwrap_or_default();
    let from_v1 = got.iter().zip(v1).take_while(|(a, b)| a == b).count();
    assert!(
        got[..] == v1[..PARTIAL] || got == whole,
        "{client}: the file has {} bytes, the first {from_v1} of the old version",
        got.len()
    );
}

/// One GET on a connection from `from` (a loopback address of this machine), answer discarded.
fn get_from(from: std::net::IpAddr, to: SocketAddr, target: &str, headers: &str) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.bind(&SocketAddr::new(from, 0).into()).expect("bind the client's address");
    socket.connect(&to.into()).expect("connect");
    let mut stream: TcpStream = socket.into();
    let request =
        format!("GET {target} HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read");
    assert!(answer.starts_with(b"HTTP/1.1 206"), "{}", String::from_utf8_lossy(&answer));
}

/// `count` one-byte downloads of `target`, each under a fresh download id, from `from`.
fn flood(proxy: &Proxy, from: std::net::IpAddr, target: &str, count: usize) {
    for i in 0..count {
        let headers = format!("Range: bytes=0-0\r\nX-Download-Id: flood-{from}-{i}\r\n");
        get_from(from, proxy.addr(), target, &headers);
    }
}

#[test]
fn a_flood_that_fills_the_embedded_store_never_splices_a_resume() {
    let origin = Origin::start();
    let work = TempDir::new("store-flood");
    let (v1, v2) = (test_bytes(LEN, 31), test_bytes(LEN, 32));
    origin.put("/obj.bin", v1.clone());
    let proxy = Proxy::start(&body("[state]\nmax_memory = \"1MiB\"\nttl = \"1h\"", &origin));
    let url = proxy.url("/obj.bin");

    // Victims: a curl, a wget and a client that downloads in pieces, each part-way.
    partial_download(&url, "victim-curl", "curl/8", &work.join("curl.bin"));
    let wget_dir = TempDir::new("store-flood-wget");
    partial_download(&url, "victim-wget", "Wget/1.21", &wget_dir.join("obj.bin"));
    partial_download(&url, "victim-other", "curl/8", &work.join("other.bin"));

    // A fresh ranged request of a new download, with nothing lost: served as asked.
    let fresh = get(&url, &[("Range", "bytes=1000-1999"), ("X-Download-Id", "fresh-1")]);
    assert_eq!(fresh.status, 206);
    assert_eq!(fresh.body, v1[1000..2000]);

    // Another address floods first: its records push out its own, not the victims'.
    let other: std::net::IpAddr = "127.0.0.2".parse().expect("an address");
    flood(&proxy, other, "/obj.bin", 400);
    let evicted_by_other = proxy.metric("rangeway_store_evictions_total", "");
    assert!(evicted_by_other > 0, "the other address's flood evicted nothing");
    let kept = get(&proxy.admin_url("/v1/downloads/victim-curl"), &[]);
    assert_eq!(kept.status, 200, "another address's flood evicted a victim");
    // Then the victims' own address, past its share: the victims' records go.
    flood(&proxy, "127.0.0.1".parse().expect("an address"), "/obj.bin", 400);
    let evictions = proxy.metric("rangeway_store_evictions_total", "");
    assert!(evictions > evicted_by_other, "the same address's flood evicted nothing");
    println!("evictions: {evicted_by_other} by 127.0.0.2's flood, {evictions} in all");

    origin.put("/obj.bin", v2.clone());
    curl_resumes_safely(&url, "victim-curl", &work.join("curl.bin"), &v1, &v2);
    wget_resumes_safely(&url, "victim-wget", wget_dir.path(), &v1, &v2);
    // A client that is neither gets the whole object: a valid answer it can use.
    let other_client =
        get(&url, &[("Range", &format!("bytes={PARTIAL}-")), ("X-Download-Id", "victim-other")]);
    assert_eq!(other_client.status, 200);
    assert_eq!(sha256_hex(&other_client.body), sha256_hex(&v2));
    assert!(proxy.metric("rangeway_resumes_unvouched_total", "answer=\"refused\"") >= 2);
    assert_eq!(proxy.metric("rangeway_resumes_unvouched_total", "answer=\"whole\""), 1);
}

#[test]
fn an_object_older_than_every_lost_session_still_resumes() {
    let origin = Origin::start();
    let work = TempDir::new("store-old-object");
    let object = test_bytes(LEN, 33);
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    origin.put_modified("/old.bin", object.clone(), &[], two_hours_ago);
    let mut redis = RedisServer::start();
    let proxy = Proxy::start(&body(&format!("{}ttl = \"1h\"\n", redis.state_section()), &origin));
    wait_for_epoch(&redis);
    let url = proxy.url("/old.bin");
    let file = work.join("old.bin");
    partial_download(&url, "old-object", "curl/8", &file);
    redis.restart();
    // Unchanged for longer than the store's ttl: no session the store lost can be of another
    // version, so the resume goes on.
    let mut curl = Command::new("curl");
    curl.args(["-fsS", "-C", "-", "-H", "X-Download-Id: old-object", "-o"]).arg(&file).arg(&url);
    run(curl, Duration::from_secs(30)).assert_success();
    assert_eq!(sha256_hex(&std::fs::read(&file).expect("file")), sha256_hex(&object));
    assert_eq!(proxy.metric("rangeway_resumes_unvouched_total", ""), 0);
}

/// Two partial downloads through a rangeway on the embedded store kept in `snapshot_file`: one
/// under an explicit id, one under the id derived from the client (which needs the key kept).
struct KeptDownloads {
    origin: Origin,
    work: TempDir,
    v1: Vec<u8>,
    v2: Vec<u8>,
}

impl KeptDownloads {
    const DERIVED_AGENT: &str = "curl/8.5.0";

    fn start(tag: &str) -> (KeptDownloads, ProxyProcess) {
        let origin = Origin::start();
        let work = TempDir::new(tag);
        let (v1, v2) = (test_bytes(LEN, 41), test_bytes(LEN, 42));
        origin.put("/same.bin", v1.clone());
        origin.put("/replaced.bin", v1.clone());
        let state = format!(
            "[state]\nttl = \"1h\"\nsnapshot_file = \"{}\"\n",
            work.join("kept/sessions").display()
        );
        let server = format!("upgrade_socket = \"{}\"", work.join("upgrade.sock").display());
        let proxy = ProxyProcess::start_with(&body(&state, &origin), &server, &[]);
        let kept = KeptDownloads { origin, work, v1, v2 };
        for name in ["same.bin", "replaced.bin"] {
            partial_download(&proxy.url(&format!("/{name}")), name, "curl/8", &kept.file(name));
        }
        let mut curl = Command::new("curl");
        curl.args(["-fsS", "-A", Self::DERIVED_AGENT, "-r", &format!("0-{}", PARTIAL - 1), "-o"])
            .arg(kept.file("derived.bin"))
            .arg(proxy.url("/same.bin"));
        run(curl, Duration::from_secs(30)).assert_success();
        (kept, proxy)
    }

    fn file(&self, name: &str) -> std::path::PathBuf {
        self.work.join(format!("partial-{name}"))
    }

    /// The downloads resumed through `proxy` after `/replaced.bin` became v2: those of the
    /// unchanged object end whole, and that of the replaced one is refused or whole.
    fn resume(&self, proxy: &ProxyProcess) {
        self.origin.put("/replaced.bin", self.v2.clone());
        let same = proxy.url("/same.bin");
        let mut curl = Command::new("curl");
        curl.args(["-fsS", "-C", "-", "-H", "X-Download-Id: same.bin", "-o"])
            .arg(self.file("same.bin"))
            .arg(&same);
        run(curl, Duration::from_secs(30)).assert_success();
        let mut curl = Command::new("curl");
        curl.args(["-fsS", "-C", "-", "-A", Self::DERIVED_AGENT, "-o"])
            .arg(self.file("derived.bin"))
            .arg(&same);
        run(curl, Duration::from_secs(30)).assert_success();
        for name in ["same.bin", "derived.bin"] {
            let got = std::fs::read(self.file(name)).expect("the resumed file");
            assert!(got == self.v1, "{name}: resumed to {} bytes, not the object", got.len());
        }
        let replaced = proxy.url("/replaced.bin");
        curl_resumes_safely(
            &replaced,
            "replaced.bin",
            &self.file("replaced.bin"),
            &self.v1,
            &self.v2,
        );
    }
}

#[test]
fn a_graceful_restart_keeps_the_embedded_stores_sessions() {
    let (kept, proxy) = KeptDownloads::start("store-restart");
    proxy.signal("TERM");
    let mut proxy = proxy;
    assert!(proxy.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    let next = proxy.restart(&kept.work.join("next.log"));
    kept.resume(&next);
    // The replaced object's resume was refused on the session's word: nothing was lost.
    assert_eq!(next.metric("rangeway_store_losses_total", ""), 0);
    assert_eq!(next.metric("rangeway_resumes_unvouched_total", ""), 0);
    let log = std::fs::read_to_string(kept.work.join("next.log")).expect("the log");
    assert!(log.contains("restored the embedded store's records"), "{log}");
}

#[test]
fn rangeway_killed_never_splices_a_resume() {
    let (kept, mut proxy) = KeptDownloads::start("store-killed");
    proxy.signal("KILL");
    assert!(proxy.wait_exit(Duration::from_secs(20)).is_some());
    let next = proxy.restart(&kept.work.join("next.log"));
    kept.origin.put("/replaced.bin", kept.v2.clone());
    let url = next.url("/replaced.bin");
    curl_resumes_safely(&url, "replaced.bin", &kept.file("replaced.bin"), &kept.v1, &kept.v2);
    let wget_dir = kept.work.join("wget");
    std::fs::create_dir_all(&wget_dir).expect("a folder for wget");
    std::fs::write(wget_dir.join("replaced.bin"), &kept.v1[..PARTIAL]).expect("wget's partial");
    wget_resumes_safely(&url, "replaced.bin", &wget_dir, &kept.v1, &kept.v2);
    assert_eq!(next.metric("rangeway_store_losses_total", "kind=\"crashed\""), 1);
    assert!(next.metric("rangeway_resumes_unvouched_total", "answer=\"refused\"") >= 1);
}

#[test]
fn an_upgrade_hands_the_embedded_stores_sessions_over() {
    let (kept, mut old) = KeptDownloads::start("store-upgrade");
    let new = old.upgrade(&kept.work.join("new.log"));
    // The new process waits for the old one's sockets until this signal.
    std::thread::sleep(Duration::from_millis(500));
    old.signal("QUIT");
    assert!(old.wait_exit(Duration::from_secs(30)).is_some_and(|s| s.success()));
    let log = kept.work.join("new.log");
    wait::until("the new process to restore the records", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("restored the embedded store's records").then_some(())
    });
    kept.resume(&new);
    assert_eq!(new.metric("rangeway_store_losses_total", ""), 0);
    assert_eq!(new.metric("rangeway_resumes_unvouched_total", ""), 0);
}

/// Waits until an instance has named the store's epoch (within its first check).
fn wait_for_epoch(redis: &RedisServer) {
    wait::until("the store's epoch", Duration::from_secs(10), || {
        (!redis.cli(&["HGET", "rangeway:epoch", "id"]).trim().is_empty()).then_some(())
    });
}

/// What happens to Redis between a download's interruption and its resume.
#[derive(Debug, Clone, Copy)]
enum Event {
    Flushed,
    Restarted,
    Stopped,
    Stalled,
}

#[test]
fn redis_losing_its_records_never_splices_a_resume() {
    for event in [Event::Flushed, Event::Restarted, Event::Stopped, Event::Stalled] {
        let origin = Origin::start();
        let work = TempDir::new("store-redis");
        let (v1, v2) = (test_bytes(LEN, 34), test_bytes(LEN, 35));
        origin.put("/obj.bin", v1.clone());
        let mut redis = RedisServer::start();
        let proxy =
            Proxy::start(&body(&format!("{}ttl = \"1h\"\n", redis.state_section()), &origin));
        wait_for_epoch(&redis);
        let url = proxy.url("/obj.bin");
        partial_download(&url, "victim-curl", "curl/8", &work.join("curl.bin"));
        let wget_dir = TempDir::new("store-redis-wget");
        partial_download(&url, "victim-wget", "Wget/1.21", &wget_dir.join("obj.bin"));
        let fresh = get(&url, &[("Range", "bytes=1000-1999"), ("X-Download-Id", "fresh")]);
        assert_eq!(fresh.status, 206, "{event:?}: a healthy store serves a fresh range");
        origin.put("/obj.bin", v2.clone());

        let stall = match event {
            Event::Flushed => {
                redis.cli(&["FLUSHALL"]);
                None
            }
            Event::Restarted => {
                redis.restart();
                None
            }
            Event::Stopped => {
                redis.kill();
                None
            }
            Event::Stalled => {
                let port = redis.addr().port().to_string();
                let sleeper = std::thread::spawn(move || {
                    let slept = Command::new("redis-cli")
                        .args(["-p", &port, "DEBUG", "SLEEP", "3"])
                        .output()
                        .expect("run redis-cli");
                    assert_eq!(String::from_utf8_lossy(&slept.stdout).trim(), "OK");
                });
                std::thread::sleep(Duration::from_millis(200));
                Some(sleeper)
            }
        };
        // First a client that downloads in pieces, while a stall still holds the store.
        let other =
            get(&url, &[("Range", &format!("bytes={PARTIAL}-")), ("X-Download-Id", "other")]);
        assert_eq!(other.status, 200, "{event:?}: another client gets the whole object");
        assert_eq!(sha256_hex(&other.body), sha256_hex(&v2));
        curl_resumes_safely(&url, "victim-curl", &work.join("curl.bin"), &v1, &v2);
        wget_resumes_safely(&url, "victim-wget", wget_dir.path(), &v1, &v2);
        let unvouched = proxy.metric("rangeway_resumes_unvouched_total", "");
        assert!(unvouched >= 3, "{event:?}: {unvouched} resumes counted");
        if let Some(sleeper) = stall {
            sleeper.join().expect("the sleeper");
        }
    }
}

#[test]
fn a_flood_through_redis_evicts_its_own_address_records_and_never_splices() {
    // Both protocols: RESP3 answers a score as a double, a hash as a map.
    for protocol in ["", "?protocol=resp3"] {
        flood_through_redis(protocol);
    }
}

fn flood_through_redis(protocol: &str) {
    let origin = Origin::start();
    let work = TempDir::new("store-redis-flood");
    let (v1, v2) = (test_bytes(LEN, 36), test_bytes(LEN, 37));
    origin.put("/obj.bin", v1.clone());
    let redis = RedisServer::start();
    // A thousandth of 2 MiB: two sessions a client address, a KiB each.
    let state = format!(
        "[state]\nbackend = \"redis\"\nredis_url = \"{}{protocol}\"\n{}ttl = \"1h\"\nmax_memory = \"2MiB\"\nclient_share = 0.001\n",
        redis.url(),
        id_key_line()
    );
    let proxy = Proxy::start(&body(&state, &origin));
    let url = proxy.url("/obj.bin");
    partial_download(&url, "victim-curl", "curl/8", &work.join("curl.bin"));

    flood(&proxy, "127.0.0.2".parse().expect("an address"), "/obj.bin", 20);
    // Recorded after each response: the last ones a moment later.
    let evictions = proxy.metric_at_least("rangeway_store_evictions_total", "", 18);
    assert!(
        evictions >= 18,
        "{evictions} evictions; {} {}",
        redis.cli(&["--scan"]),
        redis.cli(&["ZRANGE", "rangeway:evicted", "0", "-1"])
    );
    let kept = get(&proxy.admin_url("/v1/downloads/victim-curl"), &[]);
    assert_eq!(kept.status, 200, "another address's flood evicted the victim");

    flood(&proxy, "127.0.0.1".parse().expect("an address"), "/obj.bin", 20);
    origin.put("/obj.bin", v2.clone());
    curl_resumes_safely(&url, "victim-curl", &work.join("curl.bin"), &v1, &v2);
    assert_eq!(proxy.metric("rangeway_resumes_unvouched_total", "answer=\"refused\""), 1);
    // What one address holds stays within its share.
    let sessions = redis.cli(&["--scan", "--pattern", "rangeway:ses:*"]);
    assert!(sessions.lines().count() <= 2 * 2 + 1, "{sessions}");
}

/// A `[state]` section that puts rangeway's state in `cluster`.
fn cluster_state(cluster: &RedisCluster) -> String {
    let nodes = cluster.urls().iter().map(|url| format!("\"{url}\"")).collect::<Vec<_>>();
    format!(
        "[state]\nbackend = \"redis\"\nredis_url = [{}]\n{}ttl = \"1h\"\n",
        nodes.join(", "),
        id_key_line()
    )
}

fn holds_epoch(node: &RedisServer) -> bool {
    node.cli(&["EXISTS", "rangeway:epoch"]).trim() == "1"
}

/// The nodes the epoch is not on, once an instance has named it.
fn nodes_without_the_epoch(cluster: &RedisCluster) -> Vec<usize> {
    wait::until("the store's epoch", Duration::from_secs(10), || {
        cluster.nodes().iter().any(holds_epoch).then_some(())
    });
    (0..cluster.nodes().len()).filter(|&i| !holds_epoch(&cluster.nodes()[i])).collect()
}

/// Waits until an instance has laid every slot's marker (the epoch says when).
fn wait_for_markers(cluster: &RedisCluster) {
    wait::until("the slots' markers", Duration::from_secs(10), || {
        let laid =
            |node: &RedisServer| !node.cli(&["HGET", "rangeway:epoch", "laid"]).trim().is_empty();
        cluster.nodes().iter().filter(|node| holds_epoch(node)).any(laid).then_some(())
    });
}

/// Downloads interrupted part-way under ids `victim-0..8`: enough that some sessions are kept
/// on a node the epoch is not on.
fn victims(url: &str, work: &TempDir) -> Vec<String> {
    let victims: Vec<String> = (0..8).map(|i| format!("victim-{i}")).collect();
    for victim in &victims {
        partial_download(url, victim, "curl/8", &work.join(victim));
    }
    victims
}

#[test]
fn a_cluster_node_that_restarts_empty_never_splices_a_resume() {
    let origin = Origin::start();
    let work = TempDir::new("store-cluster");
    let (v1, v2) = (test_bytes(LEN, 38), test_bytes(LEN, 39));
    origin.put("/obj.bin", v1.clone());
    let mut cluster = RedisCluster::start();
    let proxy = Proxy::start(&body(&cluster_state(&cluster), &origin));
    let url = proxy.url("/obj.bin");
    let victims = victims(&url, &work);
    // Every node but the epoch's loses its data: only their processes tell.
    for index in nodes_without_the_epoch(&cluster) {
        cluster.restart_node(index);
    }
    wait::until("the restarts to be seen", Duration::from_secs(10), || {
        (proxy.metric("rangeway_store_losses_total", "kind=\"restarted\"") > 0).then_some(())
    });
    origin.put("/obj.bin", v2.clone());
    for victim in &victims {
        curl_resumes_safely(&url, victim, &work.join(victim), &v1, &v2);
    }
    assert!(proxy.metric("rangeway_resumes_unvouched_total", "answer=\"refused\"") > 0);
}

#[test]
fn a_cluster_node_flushed_while_running_never_splices_a_resume() {
    let origin = Origin::start();
    let work = TempDir::new("store-cluster-flush");
    let (v1, v2) = (test_bytes(LEN, 40), test_bytes(LEN, 41));
    origin.put("/obj.bin", v1.clone());
    let cluster = RedisCluster::start();
    let proxy = Proxy::start(&body(&cluster_state(&cluster), &origin));
    let url = proxy.url("/obj.bin");
    wait_for_markers(&cluster);
    let victims = victims(&url, &work);
    // Every node but the epoch's forgets all, its process going on: no run_id tells, only the
    // markers of the flushed slots, missing beside the sessions.
    for index in nodes_without_the_epoch(&cluster) {
        cluster.nodes()[index].cli(&["FLUSHALL"]);
    }
    origin.put("/obj.bin", v2.clone());
    for victim in &victims {
        curl_resumes_safely(&url, victim, &work.join(victim), &v1, &v2);
    }
    assert!(proxy.metric("rangeway_store_losses_total", "kind=\"flushed\"") > 0);
    assert_eq!(proxy.metric("rangeway_store_losses_total", "kind=\"restarted\""), 0);
    assert!(proxy.metric("rangeway_resumes_unvouched_total", "answer=\"refused\"") > 0);
}

#[test]
fn a_cluster_node_restarted_while_rangeway_was_down_never_splices() {
    let origin = Origin::start();
    let work = TempDir::new("store-cluster-unwatched");
    let (v1, v2) = (test_bytes(LEN, 42), test_bytes(LEN, 43));
    origin.put("/obj.bin", v1.clone());
    let mut cluster = RedisCluster::start();
    let state = body(&cluster_state(&cluster), &origin);
    let proxy = Proxy::start(&state);
    wait_for_markers(&cluster);
    let victims = victims(&proxy.url("/obj.bin"), &work);
    drop(proxy);
    // No instance watches: the restarts' new run_ids are the first any instance sees.
    for index in nodes_without_the_epoch(&cluster) {
        cluster.restart_node(index);
    }
    let proxy = Proxy::start(&state);
    let url = proxy.url("/obj.bin");
    // Its first check lays the markers again, and finds them missing beside the others.
    wait::until("the loss to be seen", Duration::from_secs(10), || {
        (proxy.metric("rangeway_store_losses_total", "kind=\"flushed\"") > 0).then_some(())
    });
    origin.put("/obj.bin", v2.clone());
    for victim in &victims {
        curl_resumes_safely(&url, victim, &work.join(victim), &v1, &v2);
    }
    assert!(proxy.metric("rangeway_resumes_unvouched_total", "answer=\"refused\"") > 0);
}
