//! Several rangeway instances sharing one Redis behave as one, and a Redis outage never costs a
//! response or a byte.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::clients::{curl_resume, run, sha256_file, sha256_hex};
use support::data::test_bytes;
use support::http::get;
use support::origin::{Behaviour, Origin};
use support::proxy::{Instance, Proxy, ProxyProcess};
use support::redis::RedisServer;
use support::tmp::TempDir;
use support::wait;

const LEN: usize = 8 * 1024 * 1024;

fn config_with_redis(origin: &Origin, redis: &RedisServer) -> String {
    format!(
        "{}\n[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        redis.state_section(),
        origin.base_url()
    )
}

fn proxy_with_redis(origin: &Origin, redis: &RedisServer) -> Proxy {
    Proxy::start(&config_with_redis(origin, redis))
}

/// What the tests need of a rangeway instance.
/// About 1 MB/s, so that a client stopped after 1.5 s holds part of the object.
const SLOW: Behaviour = Behaviour::Slow { chunk: 256 * 1024, delay: Duration::from_millis(250) };

fn curl_with_id(
    id: &str,
    url: &str,
    file: &std::path::Path,
    limit: Option<Duration>,
) -> support::clients::ClientRun {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "-C", "-", "-H", &format!("X-Download-Id: {id}")]);
    curl.arg("-o").arg(file).arg(url);
    run(curl, limit.unwrap_or(Duration::from_secs(60)))
}

/// A download through `proxy` stopped part-way, as a user would.
fn interrupted(origin: &Origin, proxy: &dyn Instance, id: &str, file: &std::path::Path) {
    origin.set_global_behaviour(SLOW);
    let _ = curl_with_id(id, &proxy.url("/obj.bin"), file, Some(Duration::from_millis(1500)));
    origin.set_global_behaviour(Behaviour::Normal);
}

/// The download as `proxy`'s admin API shows it. A download is recorded when its response ends,
/// which for an interrupted one is when rangeway notices the client is gone: wait for it.
fn download(proxy: &dyn Instance, id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let response = get(&proxy.admin_url(&format!("/v1/downloads/{id}")), &[]);
        if response.status == 200 {
            return serde_json::from_slice(&response.body).expect("JSON");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&response.body)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two rangeway processes, one Redis.
#[test]
fn a_download_begun_on_one_instance_resumes_on_another() {
    let redis = RedisServer::start();
    let origin = Origin::start();
    let object = test_bytes(LEN, 21);
    origin.put("/obj.bin", object.clone());
    let a = ProxyProcess::start(&config_with_redis(&origin, &redis));
    let b = ProxyProcess::start(&config_with_redis(&origin, &redis));
    let work = TempDir::new("shared");
    let file = work.join("obj.bin");

    interrupted(&origin, &a, "job-1", &file);
    let partial = std::fs::metadata(&file).expect("partial file").len();
    assert!(partial > 0 && partial < LEN as u64);
    let seen = download(&b, "job-1");
    assert_eq!(seen["complete"], false);
    // Every response names its download and says how much of its version was sent: at least
    // what the client holds (more, by what was written and not read).
    let hint = get(&b.url("/obj.bin"), &[("X-Download-Id", "job-1"), ("Range", "bytes=0-0")]);
    assert_eq!(hint.header("x-download-id"), Some("job-1"));
    let sent: u64 = hint.header("x-sent-prefix").expect("X-Sent-Prefix").parse().expect("number");
    assert!(sent >= partial && sent < LEN as u64, "{sent} vs {partial}");

    curl_with_id("job-1", &b.url("/obj.bin"), &file, None).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    for proxy in [&a as &dyn Instance, &b] {
        let seen = download(proxy, "job-1");
        assert_eq!(seen["complete"], true, "{seen}");
        assert_eq!(seen["delivered_bytes"], LEN as u64, "{seen}");
        assert_eq!(seen["sent_prefix"], LEN as u64, "{seen}");
    }
    let page = get(&a.admin_url("/v1/downloads?active=false&limit=10"), &[]);
    assert!(String::from_utf8_lossy(&page.body).contains("job-1"));
    let object_info = get(&b.admin_url("/v1/objects?path=/obj.bin"), &[]);
    assert_eq!(object_info.status, 200, "{}", String::from_utf8_lossy(&object_info.body));

    // Resume safety holds across instances too.
    let file = work.join("second.bin");
    interrupted(&origin, &a, "job-2", &file);
    download(&b, "job-2");
    let partial = std::fs::metadata(&file).expect("partial file").len();
    origin.put("/obj.bin", test_bytes(LEN, 22));
    let _ = curl_with_id("job-2", &b.url("/obj.bin"), &file, None);
    let got = std::fs::read(&file).expect("file");
    assert_eq!(got.len() as u64, partial, "the refused resume leaves the file as it was");
    assert_eq!(got[..], object[..got.len()]);
}

#[test]
fn a_redis_outage_costs_no_response_and_no_byte() {
    let mut redis = RedisServer::start();
    let origin = Origin::start();
    let object = test_bytes(LEN, 23);
    origin.put("/obj.bin", object.clone());
    origin.set_global_behaviour(Behaviour::Slow {
        chunk: 1024 * 1024,
        delay: Duration::from_millis(150),
    });
    let proxy = proxy_with_redis(&origin, &redis);
    let work = TempDir::new("outage");

    let url = proxy.url("/obj.bin");
    let file = work.join("during.bin");
    let client = {
        let file = file.clone();
        let url = url.clone();
        std::thread::spawn(move || curl_resume(&url, &file))
    };
    // Redis goes down while the body is on its way.
    wait::until("the download to be under way", wait::WITHIN, || {
        (origin.body_bytes() > 0).then_some(())
    });
    redis.kill();
    client.join().expect("client thread").assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&object));

    // While the store is down, a bare range past byte 0 may continue a download whose session
    // cannot be read: it gets the whole object, which no resuming client appends. A range the
    // client pins with its validator is served as ever; and the metrics say the store is down.
    let response = get(&url, &[("Range", "bytes=100-199")]);
    assert_eq!(response.status, 200);
    assert_eq!(sha256_hex(&response.body), sha256_hex(&object));
    let etag = response.header("etag").expect("an ETag").to_owned();
    let response = get(&url, &[("Range", "bytes=100-199"), ("If-Range", &etag)]);
    assert_eq!(response.status, 206);
    assert_eq!(response.body, object[100..200]);
    assert_eq!(proxy.metric("rangeway_resumes_unvouched_total", "answer=\"whole\""), 1);
    let metrics = String::from_utf8_lossy(&get(&proxy.admin_url("/metrics"), &[]).body).to_string();
    assert!(metrics.contains("rangeway_store_up 0"), "{metrics}");
    assert_eq!(get(&proxy.admin_url("/v1/downloads/x"), &[]).status, 503);

    // Back up: state is written again, without restarting rangeway.
    redis.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let file = work.join("after.bin");
        let _ = std::fs::remove_file(&file);
        curl_with_id("after-outage", &url, &file, None).assert_success();
        let response = get(&proxy.admin_url("/v1/downloads/after-outage"), &[]);
        if response.status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "state was not written after Redis came back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let metrics = String::from_utf8_lossy(&get(&proxy.admin_url("/metrics"), &[]).body).to_string();
    assert!(metrics.contains("rangeway_store_up 1"), "{metrics}");
}
