//! Concurrent-download limits: past a client's (or a route's) limit a new download is refused
//! with 429 and Retry-After before the origin is asked, while the downloads under way go on;
//! the ranged pieces of one download count once.

mod support;

use std::process::Command;

use support::clients::{CLIENT_TIMEOUT, aria2c_download, run, sha256_file, sha256_hex};
use support::data::test_bytes;
use support::http::{Connection, RawRequest};
use support::origin::Origin;
use support::proxy::Proxy;
use support::redis::RedisServer;
use support::tmp::TempDir;
use support::wait::{WITHIN, until};

/// The upstream `origin`, then a route for each `(prefix, limits)`.
fn limited(origin: &Origin, routes: &[(&str, &str)]) -> String {
    let mut config = format!("[upstreams.origin]\nurl = \"{}\"\n", origin.base_url());
    for (prefix, limits) in routes {
        config += &format!(
            "\n[[routes]]\npath_prefix = \"{prefix}\"\nupstream = \"origin\"\nstrip_prefix = true\n[routes.download_limits]\n{limits}\n"
        );
    }
    config
}

#[test]
fn the_eleventh_download_of_a_client_waits_for_one_of_ten_to_end() {
    let origin = Origin::start();
    // Large enough that socket buffers cannot hold a whole answer: the downloads stay under way
    // on rangeway's side while curl reads them slowly.
    let objects: Vec<Vec<u8>> = (0..11).map(|n| test_bytes(16 << 20, 60 + n)).collect();
    for (n, object) in objects.iter().enumerate() {
        origin.put(&format!("/{n}.bin"), object.clone());
    }
    let proxy = Proxy::start(&limited(&origin, &[("/", "per_client = 10")]));
    let dir = TempDir::new("limits");
    // Ten downloads at 4 MiB/s each: four seconds under way.
    let downloads: Vec<_> = (0..10)
        .map(|n| {
            let (url, file) = (proxy.url(&format!("/{n}.bin")), dir.join(format!("{n}.bin")));
            std::thread::spawn(move || {
                let mut curl = Command::new("curl");
                let id = format!("X-Download-Id: download-{n}");
                curl.args(["-sS", "--limit-rate", "4M", "-H", &id, "-w", "%{http_code}", "-o"])
                    .arg(&file)
                    .arg(&url);
                (run(curl, CLIENT_TIMEOUT), file)
            })
        })
        .collect();
    until("ten downloads under way", WITHIN, || {
        let started = (0..10)
            .filter(|n| std::fs::metadata(dir.join(format!("{n}.bin"))).is_ok_and(|m| m.len() > 0));
        (started.count() == 10).then_some(())
    });
    let before = origin.requests().len();
    let eleventh = support::http::get(&proxy.url("/10.bin"), &[]);
    assert_eq!(eleventh.status, 429, "{:?}", String::from_utf8_lossy(&eleventh.body));
    assert_eq!(eleventh.header("retry-after"), Some("5"));
    assert!(String::from_utf8_lossy(&eleventh.body).contains("10 downloads under way"));
    assert_eq!(origin.requests().len(), before, "refused before the origin was asked");
    assert_eq!(proxy.metric("rangeway_downloads_limited_total", "per_client"), 1);
    // A resume of one of the ten is that download, not an eleventh.
    let piece = support::http::get(
        &proxy.url("/3.bin"),
        &[("Range", "bytes=100-199"), ("X-Download-Id", "download-3")],
    );
    assert_eq!(piece.status, 206);
    for (n, download) in downloads.into_iter().enumerate() {
        let (report, file) = download.join().expect("the download's thread");
        assert_eq!(report.stdout, "200", "{report}");
        assert_eq!(sha256_file(&file), sha256_hex(&objects[n]), "download {n} byte-exact");
    }
    let after = support::http::get(&proxy.url("/10.bin"), &[]);
    assert_eq!((after.status, after.body.len()), (200, objects[10].len()), "a place came free");
}

#[test]
fn the_pieces_of_one_download_count_once_and_routes_have_their_own_limit() {
    let origin = Origin::start();
    let object = test_bytes(24 << 20, 71);
    origin.put("/big.bin", object.clone());
    origin.put("/other.bin", test_bytes(100_000, 72));
    let proxy = Proxy::start(&limited(
        &origin,
        &[("/one/", "per_client = 1"), ("/route/", "per_route = 1\ncount = \"request\"")],
    ));
    let dir = TempDir::new("limits-pieces");
    // aria2c: 8 connections, each a ranged piece of the same download — one download.
    aria2c_download(&proxy.url("/one/big.bin"), dir.path(), "big.bin").assert_success();
    assert_eq!(sha256_file(&dir.join("big.bin")), sha256_hex(&object));
    let pieces = origin.requests().iter().filter(|r| r.header("range").is_some()).count();
    assert!(pieces >= 2, "aria2c fetched in pieces ({pieces})");
    assert_eq!(proxy.metric("rangeway_downloads_limited_total", ""), 0, "no piece refused");

    // A route limit counting requests: while one is under way, the next of anyone is refused.
    // The one under way is a client that stopped reading, so it stays under way however large
    // the machine's socket buffers are (a client reading at a limited rate did not, on one).
    let mut stalled = Connection::open(proxy.addr()).expect("connect");
    assert_eq!(stalled.start(&RawRequest::get("/route/big.bin")).expect("the head"), 200);
    let refused = support::http::get(&proxy.url("/route/other.bin"), &[]);
    assert_eq!(refused.status, 429);
    assert_eq!(proxy.metric("rangeway_downloads_limited_total", "per_route"), 1);
    drop(stalled);
    let after = support::http::get_until(&proxy.url("/route/other.bin"), |r| r.status != 429);
    assert_eq!(after.status, 200, "the place came free when the stalled client went away");
}

/// Behind a load balancer that spreads a client's connections, instances sharing Redis count
/// together: a client at its limit on one instance is refused on the other, a download under
/// way on one is the same download on the other, a place freed on one is free on both, and with
/// Redis gone each instance's own count decides (never a 5xx).
#[test]
fn instances_sharing_redis_count_downloads_together() {
    let origin = Origin::start();
    let objects: Vec<Vec<u8>> = (0..4).map(|n| test_bytes(16 << 20, 80 + n)).collect();
    for (n, object) in objects.iter().enumerate() {
        origin.put(&format!("/{n}.bin"), object.clone());
    }
    let mut redis = RedisServer::start();
    let body =
        format!("{}\n{}", limited(&origin, &[("/", "per_client = 2")]), redis.state_section());
    let (a, b) = (Proxy::start(&body), Proxy::start(&body));
    // Two downloads under way on a, their clients not reading: they stay under way.
    let stalled = |n: usize| {
        let mut connection = Connection::open(a.addr()).expect("connect");
        let request =
            RawRequest::get(&format!("/{n}.bin")).header("X-Download-Id", &format!("download-{n}"));
        assert_eq!(connection.start(&request).expect("the head"), 200);
        connection
    };
    let (zero, one) = (stalled(0), stalled(1));
    let third = support::http::get(&b.url("/2.bin"), &[("X-Download-Id", "download-2")]);
    assert_eq!(third.status, 429, "{:?}", String::from_utf8_lossy(&third.body));
    assert_eq!(b.metric("rangeway_downloads_limited_total", "per_client"), 1);
    // A piece of download-0, through b: the download a serves, not a third.
    let piece = support::http::get(
        &b.url("/0.bin"),
        &[("Range", "bytes=100-199"), ("X-Download-Id", "download-0")],
    );
    assert_eq!((piece.status, &piece.body[..]), (206, &objects[0][100..200]));
    // download-1 ends on a: b admits a new one once a has released it.
    drop(one);
    let after = support::http::get_until(&b.url("/2.bin"), |r| r.status != 429);
    assert_eq!((after.status, after.body.len()), (200, objects[2].len()), "a place came free");

    // Redis gone: b counts alone (download-0 is a's), and serves.
    redis.kill();
    let alone = support::http::get(&b.url("/3.bin"), &[("X-Download-Id", "download-3")]);
    assert_eq!((alone.status, alone.body.len()), (200, objects[3].len()));
    drop(zero);
}
