//! gzip routes end to end: the first pass streams a gzip that outside decoders read and builds
//! the block index; from then on the representation has a length and serves any range, the same
//! bytes on every instance and after a restart; gzip then aes128gcm decrypts and decompresses
//! back to the object.

mod support;

use std::process::Command;
use std::time::Duration;

use support::clients::{
    aria2c_download, curl_resume, pipe, sha256_file, sha256_hex, write_partial,
};
use support::data::test_bytes;
use support::http::{Response, get, head, head_until};
use support::origin::Origin;
use support::proxy::{Proxy, ProxyProcess};
use support::redis::RedisServer;
use support::tmp::TempDir;

const LEN: usize = 2 * 1024 * 1024 + 333;
const BLOCK: usize = 64 * 1024;

/// Text-like bytes, so compression has something to do.
fn object(seed: u64) -> Vec<u8> {
    test_bytes(LEN, seed)
        .iter()
        .map(|b| b"the quick brown fox jumps over 0123456789\n"[*b as usize % 42])
        .collect()
}

fn route(origin: &Origin, state: &str, extra: &str) -> String {
    format!(
        "{state}\n[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n  [[routes.middleware]]\n  kind = \"gzip\"\n  level = 6\n  block_size = {BLOCK}\n{extra}",
        origin.base_url()
    )
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    pipe(Command::new("gzip").arg("-dc"), data)
}

/// HEADs until the representation has a length: the index is stored after the first pass.
fn indexed(url: &str) -> Response {
    head_until(url, |r| r.header("content-length").is_some())
}

#[test]
fn the_first_pass_indexes_then_every_range_and_resume_works() {
    let origin = Origin::start();
    let object = object(31);
    origin.put("/obj.txt", object.clone());
    let redis = RedisServer::start();
    let state = redis.state_section();
    let one = Proxy::start(&route(&origin, &state, ""));
    let url = one.url("/obj.txt");

    // Before the index: a resume asks for what cannot be placed yet, and gets the whole
    // representation (RFC 9110 lets a server ignore Range); chunked, no ranges advertised.
    let early = get(&url, &[("Range", "bytes=1000-")]);
    assert_eq!(early.status, 200);
    assert_eq!(early.header("content-length"), None);
    assert_eq!(early.header("accept-ranges"), None);
    assert_eq!(early.header("content-type"), Some("application/gzip"));
    assert_eq!(early.header("content-disposition"), Some("attachment; filename=\"obj.txt.gz\""));
    let gz = early.body.clone();
    assert_eq!(gunzip(&gz), object, "gzip -dc reads it");
    assert!(gz.len() < LEN * 3 / 4, "it compresses: {} of {LEN}", gz.len());
    let python = pipe(
        Command::new("python3").args([
            "-c",
            "import gzip,sys; sys.stdout.buffer.write(gzip.decompress(sys.stdin.buffer.read()))",
        ]),
        &gz,
    );
    assert_eq!(python, object, "Python's gzip reads it");

    // After it: a length, ranges, the same bytes.
    let described = indexed(&url);
    assert_eq!(described.header("content-length"), Some(gz.len().to_string().as_str()));
    assert_eq!(described.header("accept-ranges"), Some("bytes"));
    let etag = described.header("etag").expect("a strong ETag of its own").to_owned();
    assert!(etag.starts_with("\"rw-"));
    assert_eq!(get(&url, &[]).body, gz, "deterministic");
    for (first, last) in [(0, 9), (10, 20), (BLOCK / 2, BLOCK * 3), (gz.len() - 8, gz.len() - 1)] {
        let part = get(&url, &[("Range", &format!("bytes={first}-{last}"))]);
        assert_eq!(part.status, 206, "{first}-{last}");
        assert_eq!(part.body, &gz[first..=last], "{first}-{last}");
    }
    let part = get(&url, &[("Range", "bytes=100-")]);
    assert_eq!(part.body, &gz[100..]);

    let work = TempDir::new("gzip-e2e");
    let want = sha256_hex(&gz);
    let file = work.join("curl.gz");
    write_partial(&file, &gz, gz.len() / 2 + 3);
    curl_resume(&url, &file).assert_success();
    assert_eq!(sha256_file(&file), want, "curl -C -");

    // Another instance sharing Redis, and one started after this one is gone: the index is in
    // Redis, so both serve the same bytes with a length from their first response.
    let two = Proxy::start(&route(&origin, &state, ""));
    assert_eq!(
        head(&two.url("/obj.txt"), &[]).header("content-length"),
        Some(gz.len().to_string().as_str())
    );
    aria2c_download(&two.url("/obj.txt"), work.path(), "aria2.gz").assert_success();
    assert_eq!(sha256_file(&work.join("aria2.gz")), want, "aria2c -x8");
    drop(one);
    drop(two);
    // A process of its own (the built binary), so determinism is not an artefact of one process.
    let restarted = ProxyProcess::start(&route(&origin, &state, ""));
    let again = restarted.url("/obj.txt");
    assert_eq!(get(&again, &[]).body, gz, "another process, the same bytes");
    assert_eq!(head(&again, &[]).header("content-length"), Some(gz.len().to_string().as_str()));
    let part = get(&again, &[("Range", "bytes=5000-70000")]);
    assert_eq!(part.body, &gz[5000..=70000]);
}

#[test]
fn gzip_then_aes128gcm_decrypts_and_decompresses_to_the_object() {
    let origin = Origin::start();
    let object = object(32);
    origin.put("/obj.txt", object.clone());
    let work = TempDir::new("gzip-aes");
    let key_file = work.join("key");
    std::fs::write(&key_file, "AAECAwQFBgcICQoLDA0ODw\n").expect("write key");
    let aes = format!(
        "  [[routes.middleware]]\n  kind = \"aes128gcm\"\n  key_file = \"{}\"\n",
        key_file.display()
    );
    let proxy = Proxy::start(&route(&origin, "", &aes));
    let url = proxy.url("/obj.txt");
    let first = get(&url, &[]);
    assert_eq!(first.status, 200);
    let decrypt = |body: &[u8]| {
        pipe(
            Command::new(env!("CARGO_BIN_EXE_rangeway"))
                .args(["decrypt", "--key-file"])
                .arg(&key_file),
            body,
        )
    };
    assert_eq!(gunzip(&decrypt(&first.body)), object);
    // Once indexed, the encrypted gzip has a length and ranges, and the same bytes.
    let described = indexed(&url);
    assert_eq!(described.header("content-length"), Some(first.body.len().to_string().as_str()));
    let full = get(&url, &[]);
    assert_eq!(full.body, first.body, "the same salt and the same compressed bytes");
    let part = get(&url, &[("Range", "bytes=70000-140000")]);
    assert_eq!(part.status, 206);
    assert_eq!(part.body, &full.body[70000..=140000]);
}

/// `mode = "content-encoding"`: gzip as a content coding, for the clients that ask for it, never
/// with ranges; the others get the object as it is.
#[test]
fn content_encoding_mode_is_negotiated_and_never_ranged() {
    let origin = Origin::start();
    let object = object(33);
    origin.put("/page.txt", object.clone());
    let proxy = Proxy::start(
        &route(&origin, "", "")
            .replace("  level = 6\n", "  level = 6\n  mode = \"content-encoding\"\n"),
    );
    let url = proxy.url("/page.txt");

    for headers in [
        vec![("Accept-Encoding", "gzip")],
        vec![("Accept-Encoding", "br, gzip;q=0.5"), ("Range", "bytes=0-9")],
    ] {
        let coded = get(&url, &headers);
        assert_eq!(coded.status, 200, "{headers:?}: no ranges of a content coding");
        assert_eq!(coded.header("content-encoding"), Some("gzip"));
        assert_eq!(coded.header("vary"), Some("Accept-Encoding"));
        assert_eq!(coded.header("accept-ranges"), None);
        assert_eq!(coded.header("content-disposition"), None);
        assert_eq!(gunzip(&coded.body), object);
    }

    let work = TempDir::new("gzip-coding");
    let file = work.join("page.txt");
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--compressed", "-o"]).arg(&file).arg(&url);
    support::clients::run(curl, Duration::from_secs(60)).assert_success();
    assert_eq!(std::fs::read(&file).expect("read"), object, "curl --compressed decodes it");

    let plain = get(&url, &[("Range", "bytes=10-19")]);
    assert_eq!(plain.status, 206, "without Accept-Encoding: the object, with ranges");
    assert_eq!(plain.body, &object[10..20]);
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.header("vary"), Some("Accept-Encoding"));
    let refused = get(&url, &[("Accept-Encoding", "gzip;q=0")]);
    assert_eq!((refused.header("content-encoding"), &refused.body[..]), (None, &object[..]));
}
