//! aes128gcm routes end to end: what rangeway serves decrypts with an RFC 8188 decoder nobody here
//! wrote (Python's http_ece) and with `rangeway decrypt`; every range is the same slice of the
//! whole, so curl, aria2c and a second instance all assemble identical bytes.

mod support;

use std::io::Write as _;
use std::process::{Command, Stdio};

use support::clients::{
    aria2c_download, curl_resume, pipe, sha256_file, sha256_hex, write_partial,
};
use support::data::test_bytes;
use support::http::get;
use support::origin::Origin;
use support::proxy::Proxy;
use support::redis::RedisServer;
use support::tmp::TempDir;

/// Not a multiple of the record payload (65536), so the last record is short.
const LEN: usize = 3 * 1024 * 1024 + 777;
/// Two keys, for rotation; the route encrypts with `k2`.
const KEY_FILE: &str = "k1=AAECAwQFBgcICQoLDA0ODw\nk2=EBESExQVFhcYGRobHB0eHw\n";
const K2: [u8; 16] = [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31];

fn route(origin: &Origin, key_file: &std::path::Path, state: &str) -> String {
    format!(
        "{state}\n[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n  [[routes.middleware]]\n  kind = \"checksum\"\n  [[routes.middleware]]\n  kind = \"aes128gcm\"\n  key_file = \"{}\"\n  key_id = \"k2\"\n",
        origin.base_url(),
        key_file.display()
    )
}

/// Decrypts with http_ece, given the raw key (the header names the key id).
fn http_ece_decrypt(ciphertext: &[u8]) -> Vec<u8> {
    let key_hex: String = K2.iter().map(|b| format!("{b:02x}")).collect();
    let script = "import sys, http_ece\n\
                  data = sys.stdin.buffer.read()\n\
                  sys.stdout.buffer.write(http_ece.decrypt(data, key=bytes.fromhex(sys.argv[1]), version='aes128gcm'))\n";
    pipe(Command::new("python3").args(["-c", script, &key_hex]), ciphertext)
}

fn expected_len(len: u64, key_id_len: u64) -> u64 {
    let payload = 65553 - 17;
    21 + key_id_len + len + 17 * len.div_ceil(payload).max(1)
}

#[test]
fn encrypted_downloads_decrypt_resume_and_agree_across_instances() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 21);
    let origin_etag = origin.put("/secret.bin", object.clone());
    let work = TempDir::new("aes-e2e");
    let key_file = work.join("keys");
    std::fs::write(&key_file, KEY_FILE).expect("write keys");
    let redis = RedisServer::start();
    let state = redis.state_section();
    let one = Proxy::start(&route(&origin, &key_file, &state));
    let two = Proxy::start(&route(&origin, &key_file, &state));
    let url = one.url("/secret.bin");

    let full = get(&url, &[]);
    assert_eq!(full.status, 200);
    assert_eq!(full.body.len() as u64, expected_len(LEN as u64, 2));
    assert_eq!(full.header("content-length"), Some(full.body.len().to_string().as_str()));
    assert_eq!(full.header("accept-ranges"), Some("bytes"), "ranges from the first response");
    assert_ne!(full.header("etag"), Some(origin_etag.as_str()));
    assert_eq!(full.header("repr-digest"), None, "no digest of plaintext on ciphertext");
    assert_eq!(&full.body[21..23], b"k2", "the header names the key");
    assert_eq!(
        full.header("content-disposition"),
        Some("attachment; filename=\"secret.bin.aes128gcm\""),
        "saved as what it is"
    );

    assert_eq!(http_ece_decrypt(&full.body), object, "http_ece reads it");
    let ours = pipe(
        Command::new(env!("CARGO_BIN_EXE_rangeway")).args(["decrypt", "--key-file"]).arg(&key_file),
        &full.body,
    );
    assert_eq!(ours, object, "rangeway decrypt reads it");

    // The same bytes from the other instance, and any range is that slice of the whole.
    assert_eq!(get(&two.url("/secret.bin"), &[]).body, full.body, "instances agree");
    for (first, last) in
        [(0, 0), (20, 40), (65_000, 140_000), (full.body.len() - 5, full.body.len() - 1)]
    {
        let part = get(&url, &[("Range", &format!("bytes={first}-{last}"))]);
        assert_eq!(part.status, 206, "{first}-{last}");
        assert_eq!(part.body, &full.body[first..=last], "{first}-{last}");
    }

    let want = sha256_hex(&full.body);
    let file = work.join("curl.bin");
    write_partial(&file, &full.body, full.body.len() / 3 + 5);
    curl_resume(&url, &file).assert_success();
    assert_eq!(sha256_file(&file), want, "curl -C - assembles the same ciphertext");
    aria2c_download(&two.url("/secret.bin"), work.path(), "aria2.bin").assert_success();
    assert_eq!(sha256_file(&work.join("aria2.bin")), want, "aria2c -x8 too");

    // The digest of the plaintext (the checksum before encryption), once a pass made it.
    let head = support::http::get_until(&url, |r| r.header("x-origin-digest").is_some());
    assert!(head.header("x-origin-digest").is_some_and(|d| d.starts_with("sha-256=:")));

    // A resume after the object changed is refused, showing the representation's ETag: the
    // origin's is not for the clients of ciphertext to see.
    let id = [("X-Download-Id", "encrypted-changes")];
    let piece = get(&url, &[id[0], ("Range", "bytes=0-99")]);
    assert_eq!(piece.status, 206);
    let new_origin_etag = origin.put("/secret.bin", test_bytes(LEN, 22));
    let refusal = get(&url, &[id[0], ("Range", "bytes=100-")]);
    assert_eq!(refusal.status, 412, "{:?}", refusal.headers);
    let shown = refusal.header("etag").expect("an ETag");
    assert!(shown.starts_with("\"rw-"), "{shown}");
    assert_ne!(Some(shown), piece.header("etag"), "the new version's");
    assert_ne!(shown, new_origin_etag);
}

/// Without a strong ETag nothing pins the version, so nothing may be repeatable: a random salt
/// per response, served whole, no ranges advertised or honoured.
#[test]
fn without_a_strong_etag_the_representation_is_whole_and_never_repeats() {
    let origin = Origin::start();
    let object = test_bytes(200_000, 22);
    origin.put("/plain.bin", object.clone());
    origin.set_global_behaviour(support::origin::Behaviour::NoEtag);
    let work = TempDir::new("aes-noetag");
    let key_file = work.join("keys");
    std::fs::write(&key_file, KEY_FILE).expect("write keys");
    let proxy = Proxy::start(&route(&origin, &key_file, ""));
    let url = proxy.url("/plain.bin");
    let first = get(&url, &[]);
    let second = get(&url, &[("Range", "bytes=100-199")]);
    for response in [&first, &second] {
        assert_eq!(response.status, 200, "a range is not honoured");
        assert_eq!(response.header("accept-ranges"), None);
        assert_eq!(response.header("etag"), None);
        assert_eq!(http_ece_decrypt(&response.body), object);
    }
    assert_ne!(first.body[..16], second.body[..16], "a fresh salt each time");
}

#[test]
fn keygen_prints_a_key_that_a_route_accepts() {
    let output =
        Command::new(env!("CARGO_BIN_EXE_rangeway")).arg("keygen").output().expect("keygen");
    assert!(output.status.success());
    let key = String::from_utf8(output.stdout).expect("text");
    let key = key.trim();
    assert_eq!(key.len(), 22, "16 bytes, unpadded base64url: {key}");
    assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));

    let work = TempDir::new("aes-keygen");
    let key_file = work.join("key");
    std::fs::write(&key_file, format!("{key}\n")).expect("write");
    let origin = Origin::start();
    origin.put("/a.bin", test_bytes(1000, 3));
    let proxy = Proxy::start(&route(&origin, &key_file, "").replace("  key_id = \"k2\"\n", ""));
    let body = get(&proxy.url("/a.bin"), &[]).body;
    let plain = pipe(
        Command::new(env!("CARGO_BIN_EXE_rangeway")).args(["decrypt", "--key-file"]).arg(&key_file),
        &body,
    );
    assert_eq!(plain, test_bytes(1000, 3));

    // A flipped byte: decrypt fails, and says so.
    let mut tampered = body.clone();
    tampered[40] ^= 1;
    let output = Command::new(env!("CARGO_BIN_EXE_rangeway"))
        .args(["decrypt", "--key-file"])
        .arg(&key_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().expect("stdin").write_all(&tampered)?;
            child.wait_with_output()
        })
        .expect("decrypt runs");
    assert!(!output.status.success());
    assert!(!String::from_utf8_lossy(&output.stderr).contains(key), "never echoes the key");
}
