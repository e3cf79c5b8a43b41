//! Routes with middleware, end to end through real origins and clients: the checksum stage
//! publishes the digest of the whole object however it was fetched (one pass, resumed pieces,
//! parallel pieces, another instance), never for another version; a library user's own stage
//! serves a transformed representation with its own ETag, ranges and resumes.

mod support;

use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use rangeway_middleware::chain::StageRegistry;
use serde_json::Value;
use support::clients::{aria2c_download, curl_resume, run, sha256_file, sha256_hex};
use support::data::test_bytes;
use support::http::{Response, get, get_until, head, head_until};
use support::origin::{Behaviour, Origin};
use support::proxy::{Proxy, ProxyProcess};
use support::redis::RedisServer;
use support::tmp::TempDir;
use support::wait;

const LEN: usize = 6 * 1024 * 1024 + 4321;

fn checksum_route(origin: &Origin, state: &str) -> String {
    format!(
        "{state}\n[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n  [[routes.middleware]]\n  kind = \"checksum\"\n  algorithms = [\"sha256\", \"crc32\"]\n",
        origin.base_url()
    )
}

/// `sha256sum FILE`, the hex digest.
fn sha256sum(path: &std::path::Path) -> String {
    let output = Command::new("sha256sum").arg(path).output().expect("run sha256sum");
    assert!(output.status.success());
    String::from_utf8_lossy(&output.stdout).split_whitespace().next().expect("a digest").to_owned()
}

/// The hex SHA-256 a `Repr-Digest: sha-256=:…:` names.
fn repr_digest_hex(response: &Response) -> Option<String> {
    let value = response.header("repr-digest")?;
    let b64 = value.strip_prefix("sha-256=:")?.strip_suffix(':')?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// HEADs `url` until it shows a Repr-Digest (what a response learned is stored after it ends).
fn digest_eventually(url: &str) -> Option<String> {
    repr_digest_hex(&head_until(url, |r| r.header("repr-digest").is_some()))
}

#[test]
fn a_full_download_publishes_the_digest_on_every_later_response() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 11);
    origin.put("/obj.bin", object.clone());
    let proxy = Proxy::start(&checksum_route(&origin, ""));
    let url = proxy.url("/obj.bin");
    let work = TempDir::new("mw-full");

    assert_eq!(repr_digest_hex(&head(&url, &[])), None, "nothing known before a pass");
    let first = get(&url, &[]);
    assert_eq!(first.status, 200);
    assert_eq!(first.body, object, "an observing stage changes no byte");
    let file = work.join("obj.bin");
    std::fs::write(&file, &first.body).expect("write");

    let want = sha256sum(&file);
    assert_eq!(digest_eventually(&url), Some(want.clone()));
    let crc = format!("{:08x}", crc32fast::hash(&object));
    assert_eq!(head(&url, &[]).header("x-checksum-crc32"), Some(crc.as_str()));
    let ranged = get(&url, &[("Range", "bytes=100-199")]);
    assert_eq!(ranged.status, 206);
    assert_eq!(ranged.body, &object[100..200]);
    assert_eq!(repr_digest_hex(&ranged), Some(want.clone()), "also on a 206");
    // Want-Repr-Digest: sha-256=0 says the client does not accept sha-256.
    let refused = head(&url, &[("Want-Repr-Digest", "sha-256=0")]);
    assert_eq!(refused.header("repr-digest"), None);

    let admin = get(&proxy.admin_url("/v1/objects?path=/obj.bin"), &[]);
    assert_eq!(admin.status, 200);
    let json: Value = serde_json::from_slice(&admin.body).expect("JSON");
    let published = json["digests"]["repr-digest"].as_str().expect("a digest in the admin API");
    assert_eq!(Some(published), head(&url, &[]).header("repr-digest"));
}

/// A download that only ever arrives in pieces: curl stopped and resumed until done, each piece
/// continuing the hash from the state the one before stored.
#[test]
fn a_download_made_of_resumed_pieces_still_yields_the_digest() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 12);
    origin.put("/obj.bin", object.clone());
    let proxy = Proxy::start(&checksum_route(&origin, ""));
    let url = proxy.url("/obj.bin");
    let work = TempDir::new("mw-pieces");
    let file = work.join("obj.bin");

    origin.set_global_behaviour(Behaviour::Slow {
        chunk: 256 * 1024,
        delay: Duration::from_millis(200),
    });
    let mut pieces = 0;
    while std::fs::metadata(&file).map_or(0, |m| m.len()) < LEN as u64 && pieces < 40 {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "-C", "-", "-o"]).arg(&file).arg(&url);
        let _ = run(curl, Duration::from_millis(900));
        pieces += 1;
    }
    origin.set_global_behaviour(Behaviour::Normal);
    assert!(pieces >= 3, "the download came in {pieces} pieces");
    // The last piece may have been cut just before its end: finish it.
    curl_resume(&url, &file).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    assert_eq!(digest_eventually(&url), Some(sha256sum(&file)));
}

/// aria2c -x8: pieces in parallel, none of them a full pass.
#[test]
fn parallel_pieces_yield_the_digest() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 13);
    origin.put("/obj.bin", object.clone());
    let proxy = Proxy::start(&checksum_route(&origin, ""));
    let url = proxy.url("/obj.bin");
    let work = TempDir::new("mw-aria2");
    aria2c_download(&url, work.path(), "obj.bin").assert_success();
    let file = work.join("obj.bin");
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    assert_eq!(digest_eventually(&url), Some(sha256sum(&file)));
}

/// Pieces out of order and far apart, beyond the reach of any stored hash state: when the
/// download completes, rangeway reads the rest from the origin itself to finish the digest.
#[test]
fn pieces_out_of_order_still_yield_the_digest_once_the_download_completes() {
    let origin = Origin::start();
    let len = 20 * 1024 * 1024 + 5;
    let object = test_bytes(len, 18);
    origin.put("/far.bin", object.clone());
    let proxy = Proxy::start(&checksum_route(&origin, ""));
    let url = proxy.url("/far.bin");
    let split = 15 * 1024 * 1024;
    let id = [("X-Download-Id", "far-apart")];
    let tail = get(&url, &[id[0], ("Range", &format!("bytes={split}-"))]);
    assert_eq!(tail.body, &object[split..]);
    // Recorded after the response: wait for it, so the next piece completes the download.
    get_until(&proxy.admin_url("/v1/downloads/far-apart"), |r| r.status == 200);
    let head_piece = get(&url, &[id[0], ("Range", &format!("bytes=0-{}", split - 1))]);
    assert_eq!(head_piece.body, &object[..split]);
    assert_eq!(digest_eventually(&url), Some(sha256_hex(&object)));
    let crc = format!("{:08x}", crc32fast::hash(&object));
    assert_eq!(head(&url, &[]).header("x-checksum-crc32"), Some(crc.as_str()));
    // The pass of rangeway's own: the rest of the object, from the latest stored state, pinned
    // to the version with If-Match.
    let clients = [format!("bytes={split}-"), format!("bytes=0-{}", split - 1)];
    let own: Vec<String> = origin
        .requests()
        .into_iter()
        .filter(|r| r.header("if-match").is_some())
        .filter_map(|r| r.header("range").map(str::to_owned))
        .filter(|range| !clients.contains(range))
        .collect();
    assert_eq!(own.len(), 1, "one completion pass: {own:?}");
    assert!(own[0].ends_with(&format!("-{}", len - 1)), "to the end: {own:?}");
}

#[test]
fn a_digest_is_never_shown_for_another_version() {
    let origin = Origin::start();
    let v1 = test_bytes(LEN, 14);
    origin.put("/obj.bin", v1.clone());
    let proxy = Proxy::start(&checksum_route(&origin, ""));
    let url = proxy.url("/obj.bin");
    assert_eq!(get(&url, &[]).body, v1);
    let old = digest_eventually(&url).expect("v1's digest");
    assert_eq!(old, sha256_hex(&v1));

    let v2 = test_bytes(LEN, 15);
    origin.put("/obj.bin", v2.clone());
    for response in [head(&url, &[]), get(&url, &[("Range", "bytes=0-9")])] {
        assert_eq!(response.header("repr-digest"), None, "v1's digest on v2");
    }
    assert_eq!(get(&url, &[]).body, v2);
    assert_eq!(digest_eventually(&url), Some(sha256_hex(&v2)));
}

#[test]
fn instances_sharing_redis_share_the_digest() {
    let redis = RedisServer::start();
    let origin = Origin::start();
    let object = test_bytes(LEN, 16);
    origin.put("/obj.bin", object.clone());
    let state = redis.state_section();
    let one = Proxy::start(&checksum_route(&origin, &state));
    let two = Proxy::start(&checksum_route(&origin, &state));
    // Half on one instance, the rest (a resume) on the other.
    let half = LEN / 2;
    let first = get(&one.url("/obj.bin"), &[("Range", &format!("bytes=0-{}", half - 1))]);
    assert_eq!(first.body, &object[..half]);
    // What the first half's stages learned is stored before the response is counted.
    let counted = one.metric_at_least("rangeway_requests_total", "", 1);
    assert!(counted >= 1, "the first half was never recorded");
    let rest = get(&two.url("/obj.bin"), &[("Range", &format!("bytes={half}-"))]);
    assert_eq!(rest.body, &object[half..]);
    assert_eq!(digest_eventually(&one.url("/obj.bin")), Some(sha256_hex(&object)));
    assert_eq!(digest_eventually(&two.url("/obj.bin")), Some(sha256_hex(&object)));
}

/// The stage of `middleware/examples/custom_stage.rs`, as a library user writes one.
#[allow(dead_code)]
#[path = "../middleware/examples/custom_stage.rs"]
mod custom_stage;

fn case_registry() -> StageRegistry {
    let mut registry = StageRegistry::new();
    registry.register("case", custom_stage::CaseFactory::from_options).expect("a new kind");
    registry
}

#[test]
fn a_custom_stage_serves_its_own_representation_with_ranges_and_resumes() {
    let origin = Origin::start();
    let object: Vec<u8> =
        test_bytes(LEN, 17).iter().map(|b| b"abcxyzABCXYZ 01"[*b as usize % 15]).collect();
    let etag = origin.put("/text.txt", object.clone());
    let transformed = object.to_ascii_uppercase();
    let body = format!(
        "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n  [[routes.middleware]]\n  kind = \"checksum\"\n  [[routes.middleware]]\n  kind = \"case\"\n  to = \"upper\"\n  [[routes.middleware]]\n  kind = \"checksum\"\n",
        origin.base_url()
    );
    let proxy = Proxy::start_with_registry(&body, "", &case_registry());
    let url = proxy.url("/text.txt");

    let full = get(&url, &[]);
    assert_eq!(full.status, 200);
    assert_eq!(full.body, transformed);
    let own_etag = full.header("etag").expect("an ETag of its own").to_owned();
    assert!(own_etag.starts_with("\"rw-"), "{own_etag}");
    assert_ne!(own_etag, etag);
    assert_eq!(full.header("accept-ranges"), Some("bytes"));
    // The version is recorded after the response: wait for it, so the next request can plan.
    let recorded = get_until(&proxy.admin_url("/v1/objects?path=/text.txt"), |r| r.status == 200);
    assert_eq!(recorded.status, 200);

    let part = get(&url, &[("Range", "bytes=1000-1999")]);
    assert_eq!(part.status, 206);
    assert_eq!(part.body, &transformed[1000..2000]);
    assert_eq!(part.header("content-range"), Some(format!("bytes 1000-1999/{LEN}").as_str()));
    // The origin was asked for those bytes only, with If-Range on the version they were planned for.
    let asked = origin.requests().into_iter().last().expect("a request");
    assert_eq!(asked.header("range"), Some("bytes=1000-1999"));
    assert_eq!(asked.header("if-range"), Some(etag.as_str()));

    // If-Range against the representation's own ETag.
    let held = get(&url, &[("Range", "bytes=0-9"), ("If-Range", &own_etag)]);
    assert_eq!((held.status, &held.body[..]), (206, &transformed[..10]));
    let stale = get(&url, &[("Range", "bytes=0-9"), ("If-Range", &etag)]);
    assert_eq!(stale.status, 200, "the origin's ETag is not this representation's");
    let matched = get(&url, &[("If-Match", &own_etag), ("Range", "bytes=5-9")]);
    assert_eq!((matched.status, &matched.body[..]), (206, &transformed[5..10]));
    assert_eq!(get(&url, &[("If-Match", &etag)]).status, 412, "If-Match is of this representation");
    let cached = get(&url, &[("If-None-Match", &own_etag)]);
    assert_eq!(cached.status, 304);
    let multi = get(&url, &[("Range", "bytes=0-4,100-104")]);
    assert_eq!(multi.status, 206);
    assert!(multi.header("content-type").is_some_and(|t| t.starts_with("multipart/byteranges")));

    // Digests of both ends of the chain: the origin's bytes and the delivered ones.
    let head = head_until(&url, |r| r.header("repr-digest").is_some());
    assert_eq!(repr_digest_hex(&head), Some(sha256_hex(&transformed)));
    let origin_digest = head.header("x-origin-digest").expect("the origin bytes' digest");
    assert_eq!(
        origin_digest,
        format!(
            "sha-256=:{}:",
            base64::engine::general_purpose::STANDARD.encode(sha2_digest(&object))
        )
    );

    // curl resumes the transformed representation.
    let work = TempDir::new("mw-case");
    let file = work.join("text.txt");
    std::fs::write(&file, &transformed[..LEN / 3]).expect("write");
    curl_resume(&url, &file).assert_success();
    assert_eq!(std::fs::read(&file).expect("read"), transformed);

    // A changed object: a resume of the download begun on the old one is refused (as on any
    // route); a new download's range, planned for the old version, comes whole from the origin
    // (If-Range there) and is cut from the new representation.
    let v2: Vec<u8> = object.iter().rev().copied().collect();
    origin.put("/text.txt", v2.clone());
    assert_eq!(get(&url, &[("Range", "bytes=10-19")]).status, 412);
    let changed = get(&url, &[("Range", "bytes=10-19"), ("X-Download-Id", "another")]);
    assert_eq!(changed.status, 206);
    let v2_transformed = v2.to_ascii_uppercase();
    assert_eq!(changed.body, &v2_transformed[10..20]);
}

fn sha2_digest(data: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}

#[test]
fn a_bad_stage_option_is_a_config_error_naming_the_key() {
    let registry = StageRegistry::new();
    let text = "[upstreams.o]\nurl = \"http://127.0.0.1:1\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"o\"\n  [[routes.middleware]]\n  kind = \"checksum\"\n  algorithms = [\"md5\"]\n";
    let errors = rangeway::config::Config::from_toml_str(text, &registry)
        .expect_err("md5 is not offered: refused with the rest of the config");
    let shown = errors.to_string();
    assert!(shown.contains("routes[0].middleware[0].algorithms"), "{shown}");
}

/// A download made of one whole response showed the stages everything: no completion pass is
/// started for it, and nothing is logged of one.
#[test]
fn a_whole_download_starts_no_completion_pass() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 19);
    origin.put("/whole.bin", object.clone());
    let work = TempDir::new("mw-whole");
    let log = work.join("rangeway.log");
    let process = ProxyProcess::start_logged(&checksum_route(&origin, ""), &[], &log);
    for _ in 0..3 {
        let whole = get(&process.url("/whole.bin"), &[]);
        assert!(whole.body == object);
    }
    let text = wait::log_until(&log, "three access lines", wait::WITHIN, |text| {
        text.matches("rangeway::access").count() >= 3
    });
    assert_eq!(text.matches("rangeway::access").count(), 3, "{text}");
    assert!(!text.contains("digests"), "{text}");
    let ranged: Vec<_> =
        origin.requests().into_iter().filter(|r| r.header("range").is_some()).collect();
    assert!(ranged.is_empty(), "no pass of rangeway's own: {ranged:?}");
}
