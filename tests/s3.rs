//! S3 routes end to end, against a real S3-compatible server (s3s-fs, which checks every SigV4
//! signature): rangeway signs its own requests; objects of awkward sizes and names come through
//! byte for byte in every range form; S3's errors become plain answers; boto3, the AWS CLI, curl,
//! wget and aria2c download and resume through it; and the middleware works as on HTTP routes.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use support::clients::{
    aria2c_download, curl_resume, pipe, run, sha256_file, sha256_hex, wget_resume, write_partial,
};
use support::data::test_bytes;
use support::http::{Response, get, head, head_until};
use support::multipart::parts;
use support::origin::{Behaviour, Origin};
use support::ports::free_port;
use support::proxy::{Instance, Proxy, ProxyProcess};
use support::s3::{ACCESS_KEY, S3Server, SECRET_KEY, credentials_file};
use support::tls::TestPki;
use support::tmp::TempDir;

const BUCKET: &str = "releases";

/// `[upstreams.store]` for `server`'s bucket with credentials from `credentials`, and a route
/// `/s3/` to it with `middleware` (TOML of `[[routes.middleware]]` entries, or empty).
fn s3_config(server: &S3Server, credentials: &Path, middleware: &str) -> String {
    format!(
        "[upstreams.store]\nurl = \"{}\"\nbucket = \"{BUCKET}\"\ncredentials_file = \"{}\"\n\
         read_timeout = \"10s\"\n\n[[routes]]\npath_prefix = \"/s3/\"\nupstream = \"store\"\n\
         strip_prefix = true\n{middleware}",
        server.url(),
        credentials.display()
    )
}

/// A key written as a client writes it in a URL: every byte but the unreserved ones encoded.
fn url_path(key: &str) -> String {
    key.split('/')
        .map(|segment| {
            segment
                .bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn started(config: &str) -> Proxy {
    Proxy::start(config)
}

/// Objects of awkward sizes and names, as S3 users have them.
fn awkward_objects() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty.bin", Vec::new()),
        ("one.bin", test_bytes(1, 1)),
        ("with space/and more.bin", test_bytes(65_537, 2)),
        ("ünïcødé/日本語+plus.bin", test_bytes(1000, 3)),
        ("100%.bin", test_bytes(10, 4)),
        ("tilde~!$&'()=,;@.bin", test_bytes(77, 5)),
        ("big/three-mib.bin", test_bytes(3 * 1024 * 1024 + 7, 6)),
    ]
}

#[test]
fn awkward_objects_come_through_an_s3_route_in_every_range_form() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let objects = awkward_objects();
    for (key, bytes) in &objects {
        server.put(BUCKET, key, bytes);
    }
    let work = TempDir::new("s3-awkward");
    let proxy = started(&s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), ""));

    for (key, object) in &objects {
        let url = proxy.url(&format!("/s3/{}", url_path(key)));
        let len = object.len();
        let full = get(&url, &[]);
        assert_eq!(full.status, 200, "{key}: {}", String::from_utf8_lossy(&full.body));
        assert_eq!(full.body, *object, "{key}");
        assert_eq!(full.header("content-length"), Some(len.to_string().as_str()), "{key}");
        let etag = full.header("etag").expect("an ETag").to_owned();

        let probe = head(&url, &[]);
        assert_eq!(probe.status, 200, "{key}");
        assert_eq!(probe.header("content-length"), Some(len.to_string().as_str()), "{key}");
        assert!(probe.body.is_empty());

        // Past the end: a proper 416 naming the length, though S3's own 416 does not.
        let beyond = get(&url, &[("range", &format!("bytes={len}-"))]);
        assert_eq!(beyond.status, 416, "{key}");
        assert_eq!(beyond.header("content-range"), Some(format!("bytes */{len}").as_str()));
        // boto3 sends If-Match on every ranged part: honoured both ways.
        if len > 0 {
            let same = get(&url, &[("range", "bytes=0-0"), ("if-match", &etag)]);
            assert_eq!(same.status, 206, "{key}");
            let other = get(&url, &[("range", "bytes=0-0"), ("if-match", "\"another\"")]);
            assert_eq!(other.status, 412, "{key}");
        }
        if len < 2 {
            continue;
        }
        let (mid, last) = (len / 2, len - 1);
        for (range, want) in [
            ("bytes=0-0".to_owned(), 0..1),
            (format!("bytes={mid}-"), mid..len),
            ("bytes=-1".to_owned(), last..len),
            (format!("bytes=1-{mid}"), 1..mid + 1),
            (format!("bytes={mid}-{}", len * 10), mid..len),
        ] {
            let part = get(&url, &[("range", &range)]);
            assert_eq!(part.status, 206, "{key} {range}");
            assert_eq!(part.body, object[want.clone()], "{key} {range}");
            let content_range = format!("bytes {}-{}/{len}", want.start, want.end - 1);
            assert_eq!(part.header("content-range"), Some(content_range.as_str()));
        }
        // S3 answers one range per request; rangeway serves several from one covering run
        // (ranges a few bytes apart it may coalesce, as RFC 9110 allows: far apart here).
        if len < 65_536 {
            continue;
        }
        let multi = get(&url, &[("range", &format!("bytes=0-0,{last}-{last}"))]);
        assert_eq!(multi.status, 206, "{key}");
        let got = parts(&multi);
        assert_eq!(got.len(), 2, "{key}");
        assert_eq!(got[0].body, object[..1]);
        assert_eq!(got[1].body, object[last..]);
    }

    // Missing keys: a plain 404 for people, S3's error document for S3 clients.
    let missing = get(&proxy.url("/s3/no/such.bin"), &[]);
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body, b"404 Not Found: no such object (S3 NoSuchKey)\n");
    let for_sdk = get(&proxy.url("/s3/no/such.bin"), &[("x-amz-date", "20261130T000000Z")]);
    assert_eq!(for_sdk.status, 404);
    assert_eq!(for_sdk.header("content-type"), Some("application/xml"));
    assert!(String::from_utf8_lossy(&for_sdk.body).contains("<Code>NoSuchKey</Code>"));
    assert_eq!(head(&proxy.url("/s3/no/such.bin"), &[]).status, 404);

    // Keys that would leave the route's folder are refused before S3 is asked.
    for escape in ["/s3/../secret.bin", "/s3/a%2F..%2Fsecret.bin", "/s3/%2e%2e/x"] {
        assert_eq!(get(&proxy.url(escape), &[]).status, 400, "{escape}");
    }
}

#[test]
fn a_client_signature_is_not_passed_on_and_s3_errors_are_explained() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    server.put(BUCKET, "a.bin", &test_bytes(1000, 7));
    let work = TempDir::new("s3-errors");

    // A client's own Authorization (and x-amz-* fields) would fail S3's check: rangeway drops
    // them and signs the request itself.
    let good = started(&s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), ""));
    let signed_by_client = get(
        &good.url("/s3/a.bin"),
        &[
            (
                "authorization",
                "AWS4-HMAC-SHA256 Credential=OTHER/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00",
            ),
            ("x-amz-date", "20260101T000000Z"),
            ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ],
    );
    assert_eq!(signed_by_client.status, 200);
    assert_eq!(signed_by_client.body, test_bytes(1000, 7));

    // The bucket itself is no object: S3 would list its keys (rangeway's credentials may).
    for root in ["/s3/", "/s3", "/s3//", "/s3/?list-type=2"] {
        let listing = get(&good.url(root), &[]);
        assert_eq!(listing.status, 404, "{root}");
        assert!(!String::from_utf8_lossy(&listing.body).contains("a.bin"), "{root}");
    }

    // rangeway's own credentials wrong: a clear 403 at once, never a hang.
    let wrong_dir = TempDir::new("s3-wrong");
    let wrong =
        started(&s3_config(&server, &credentials_file(&wrong_dir, ACCESS_KEY, "not-it"), ""));
    let began = Instant::now();
    let refused = get(&wrong.url("/s3/a.bin"), &[]);
    assert!(began.elapsed() < Duration::from_secs(5));
    assert_eq!(refused.status, 403);
    let text = String::from_utf8_lossy(&refused.body);
    assert!(text.contains("does not accept rangeway's credentials"), "{text}");
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");
    assert!(!text.contains("not-it") && !text.contains(ACCESS_KEY), "{text}");

    let unknown_key =
        started(&s3_config(&server, &credentials_file(&wrong_dir, "AKIDUNKNOWN", "x"), ""));
    let refused = get(&unknown_key.url("/s3/a.bin"), &[]);
    assert_eq!(refused.status, 403);
    assert!(!String::from_utf8_lossy(&refused.body).contains("AKIDUNKNOWN"));

    // A bucket that does not exist (s3s-fs says NoSuchKey where S3 says NoSuchBucket).
    let config = s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), "")
        .replace(&format!("bucket = \"{BUCKET}\""), "bucket = \"nonexistent\"");
    let no_bucket = started(&config);
    assert_eq!(get(&no_bucket.url("/s3/a.bin"), &[]).status, 404);

    // A store that throttles or fails (the in-process origin, as an S3 endpoint of a public
    // bucket): 503 with Retry-After, and 502 for its own failures.
    let store = Origin::start();
    store.put("/public/a.bin", test_bytes(10, 1));
    let public = started(&format!(
        "[upstreams.store]\nurl = \"{}\"\nbucket = \"public\"\nanonymous = true\n\n[[routes]]\n\
         path_prefix = \"/s3/\"\nupstream = \"store\"\nstrip_prefix = true\n",
        store.base_url()
    ));
    assert_eq!(get(&public.url("/s3/a.bin"), &[]).body, test_bytes(10, 1));
    store.set_global_behaviour(Behaviour::Status(503));
    let throttled = get(&public.url("/s3/a.bin"), &[]);
    assert_eq!(throttled.status, 503);
    assert_eq!(throttled.header("retry-after"), Some("1"));
    assert_eq!(
        throttled.body,
        b"503 Service Unavailable: the store is unavailable; retry shortly\n"
    );
    store.set_global_behaviour(Behaviour::Status(500));
    assert_eq!(get(&public.url("/s3/a.bin"), &[]).status, 502);
    // Anonymous: nothing signed, and the client's own Authorization does not get through either.
    let _ = get(&public.url("/s3/a.bin"), &[("authorization", "Bearer client-token")]);
    let seen = store.requests();
    assert!(seen.iter().all(|r| r.header("authorization").is_none()), "{seen:?}");
    assert!(seen.iter().all(|r| r.target.starts_with("/public/a.bin")), "{seen:?}");

    // Nothing listens: a 502, not a hang.
    let closed = S3Server::start();
    let config = s3_config(&closed, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), "");
    drop(closed);
    let unreachable = started(&config);
    assert_eq!(get(&unreachable.url("/s3/a.bin"), &[]).status, 502);
}

fn boto3(endpoint: &str, command: &str, key: &str, file: Option<&Path>) -> serde_json::Value {
    boto3_as((ACCESS_KEY, SECRET_KEY), endpoint, command, key, file, &[])
}

/// Runs tests/s3_clients.py signing with `key` (id, secret), with `env` added to its
/// environment (`AWS_CA_BUNDLE` for an https endpoint).
fn boto3_as(
    (key_id, secret): (&str, &str),
    endpoint: &str,
    command: &str,
    key: &str,
    file: Option<&Path>,
    env: &[(&str, &str)],
) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/s3_clients.py");
    let mut python = Command::new("python3");
    python.args([script, endpoint, command, BUCKET, key]);
    if let Some(file) = file {
        python.arg(file);
    }
    python
        .env("AWS_ACCESS_KEY_ID", key_id)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .envs(env.iter().copied());
    let out = run(python, Duration::from_secs(120));
    out.assert_success();
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

#[test]
fn boto3_and_the_aws_cli_download_through_rangeway() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let work = TempDir::new("s3-sdk");
    // The route's prefix is the bucket's name: S3 clients address rangeway as an S3 endpoint,
    // path style (s3://releases/KEY → GET /releases/KEY).
    let config = s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), "")
        .replace("path_prefix = \"/s3/\"", &format!("path_prefix = \"/{BUCKET}/\""));
    let proxy = started(&config);
    let endpoint = proxy.url("");

    // Uploaded to the S3 server itself: a multipart upload (ETag "…-3") and an object with a
    // CRC32 checksum S3 publishes.
    let multipart = test_bytes(11 * 1024 * 1024 + 3, 8);
    let source = work.join("multipart.src");
    std::fs::write(&source, &multipart).expect("write");
    let uploaded = boto3(&server.url(), "upload-multipart", "dir/multi part.bin", Some(&source));
    assert!(uploaded["etag"].as_str().is_some_and(|e| e.ends_with("-3\"")), "{uploaded}");
    let summed = test_bytes(3 * 1024 * 1024 + 11, 9);
    let source = work.join("summed.src");
    std::fs::write(&source, &summed).expect("write");
    let put = boto3(&server.url(), "put-checksum", "summed.bin", Some(&source));
    let crc32 = put["crc32"].as_str().expect("S3 took the checksum").to_owned();

    for (key, object) in [("dir/multi part.bin", &multipart), ("summed.bin", &summed)] {
        let head = boto3(&endpoint, "head", key, None);
        assert_eq!(head["length"].as_u64(), Some(object.len() as u64), "{key}");
        let file = work.join(format!("boto3-{}", key.replace('/', "_")));
        boto3(&endpoint, "download", key, Some(&file));
        assert_eq!(sha256_file(&file), sha256_hex(object), "boto3 download_file of {key}");

        let file = work.join(format!("cli-{}", key.replace('/', "_")));
        let mut cli = Command::new("python3");
        cli.args(["-m", "awscli", "s3", "cp", &format!("s3://{BUCKET}/{key}")])
            .arg(&file)
            .args(["--endpoint-url", &endpoint, "--region", "us-east-1", "--no-progress"])
            .env("AWS_ACCESS_KEY_ID", "client-key-rangeway-ignores")
            .env("AWS_SECRET_ACCESS_KEY", "client-secret")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/dev/null");
        run(cli, Duration::from_secs(120)).assert_success();
        assert_eq!(sha256_file(&file), sha256_hex(object), "aws s3 cp of {key}");
    }
    let missing = boto3(&endpoint, "get-error", "no/such.bin", None);
    assert_eq!(missing["error"], "NoSuchKey");
    assert_eq!(missing["modeled"], true, "boto3 raises its NoSuchKey: {missing}");

    // S3's whole-object checksum on a whole answer only: boto3 checks it against what it got.
    let url = proxy.url(&format!("/{BUCKET}/summed.bin"));
    let whole = get(&url, &[("x-amz-checksum-mode", "ENABLED")]);
    assert_eq!(whole.header("x-amz-checksum-crc32"), Some(crc32.as_str()));
    for range in ["bytes=0-", "bytes=0-99", "bytes=0-0,-1"] {
        let part = get(&url, &[("x-amz-checksum-mode", "ENABLED"), ("range", range)]);
        assert_eq!(part.status, 206, "{range}");
        assert_eq!(part.header("x-amz-checksum-crc32"), None, "{range}");
    }
}

#[test]
fn boto3_downloads_through_an_s3_route_over_https() {
    let pki = TestPki::new();
    let server = S3Server::start();
    server.bucket(BUCKET);
    let object = test_bytes(3 * 1024 * 1024 + 5, 12);
    server.put(BUCKET, "over/tls.bin", &object);
    let work = TempDir::new("s3-https");
    let port = free_port();
    let tls = format!(
        "[tls]\nlisten = \"127.0.0.1:{port}\"\n[[tls.certificates]]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        pki.localhost().cert.display(),
        pki.localhost().key.display()
    );
    let config = s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), "")
        .replace("path_prefix = \"/s3/\"", &format!("path_prefix = \"/{BUCKET}/\""));
    let _proxy = started(&format!("{tls}{config}"));
    let endpoint = format!("https://localhost:{port}");
    let ca = pki.ca_cert().to_str().expect("a UTF-8 path");
    let trust = [("AWS_CA_BUNDLE", ca)];
    let head = boto3_as((ACCESS_KEY, SECRET_KEY), &endpoint, "head", "over/tls.bin", None, &trust);
    assert_eq!(head["length"].as_u64(), Some(object.len() as u64));
    // Ranged parts of 1 MiB on 4 connections, each verified against the test CA.
    let file = work.join("tls.bin");
    boto3_as((ACCESS_KEY, SECRET_KEY), &endpoint, "download", "over/tls.bin", Some(&file), &trust);
    assert_eq!(sha256_file(&file), sha256_hex(&object), "boto3 over https");
}

#[test]
fn curl_wget_and_aria2c_resume_through_an_s3_route() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let object = test_bytes(5 * 1024 * 1024 + 321, 10);
    server.put(BUCKET, "nightly/build 1.tar", &object);
    let work = TempDir::new("s3-clients");
    let proxy = started(&s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), ""));
    let url = proxy.url(&format!("/s3/{}", url_path("nightly/build 1.tar")));
    let want = sha256_hex(&object);
    for offset in [1, object.len() / 3, object.len() - 1] {
        let file = work.join(format!("curl-{offset}"));
        write_partial(&file, &object, offset);
        curl_resume(&url, &file).assert_success();
        assert_eq!(sha256_file(&file), want, "curl -C - from {offset}");
    }
    let file = work.join("wget");
    write_partial(&file, &object, object.len() / 2);
    wget_resume(&url, &file).assert_success();
    assert_eq!(sha256_file(&file), want, "wget -c");
    aria2c_download(&url, work.path(), "aria2").assert_success();
    assert_eq!(sha256_file(&work.join("aria2")), want, "aria2c -x8");
}

/// The hex SHA-256 a `Repr-Digest: sha-256=:…:` names.
fn repr_digest_hex(response: &Response) -> Option<String> {
    let value = response.header("repr-digest")?;
    let b64 = value.strip_prefix("sha-256=:")?.strip_suffix(':')?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[test]
fn middleware_works_on_s3_routes_as_on_http_routes() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let object = test_bytes(2 * 1024 * 1024 + 555, 11);
    server.put(BUCKET, "data/blob.bin", &object);
    let work = TempDir::new("s3-middleware");
    let key_file = work.join("keys");
    std::fs::write(&key_file, "k1=AAECAwQFBgcICQoLDA0ODw\n").expect("write keys");
    let credentials = credentials_file(&work, ACCESS_KEY, SECRET_KEY);
    let chain = format!(
        "  [[routes.middleware]]\n  kind = \"checksum\"\n  [[routes.middleware]]\n  kind = \
         \"gzip\"\n  level = 1\n  block_size = 262144\n  [[routes.middleware]]\n  kind = \
         \"aes128gcm\"\n  key_file = \"{}\"\n",
        key_file.display()
    );
    let config = format!(
        "{}\n[[routes]]\npath_prefix = \"/sum/\"\nupstream = \"store\"\nstrip_prefix = true\n  \
         [[routes.middleware]]\n  kind = \"checksum\"\n",
        s3_config(&server, &credentials, &chain)
    );
    let proxy = started(&config);

    // checksum: the digest of the object, published once a full pass has run.
    let url = proxy.url("/sum/data/blob.bin");
    assert_eq!(get(&url, &[]).body, object);
    let digest = repr_digest_hex(&head_until(&url, |r| r.header("repr-digest").is_some()));
    assert_eq!(digest, Some(sha256_hex(&object)));

    // checksum → gzip → aes128gcm: decrypts and decompresses to the object; once the gzip index
    // is known, ranges are exact slices of the whole and curl resumes.
    let url = proxy.url("/s3/data/blob.bin");
    let first = get(&url, &[]);
    assert_eq!(first.status, 200);
    let whole = head_until(&url, |r| r.header("content-length").is_some());
    let len: usize = whole.header("content-length").and_then(|v| v.parse().ok()).expect("length");
    let full = get(&url, &[]);
    assert_eq!(full.body.len(), len);
    assert_eq!(full.body, first.body, "the representation is the same bytes every time");
    let plain = pipe(
        Command::new(env!("CARGO_BIN_EXE_rangeway")).args(["decrypt", "--key-file"]).arg(&key_file),
        &full.body,
    );
    assert_eq!(pipe(Command::new("gzip").arg("-dc"), &plain), object);
    for (range, want) in [
        ("bytes=0-99".to_owned(), 0..100),
        (format!("bytes={}-", len / 2), len / 2..len),
        ("bytes=-17".to_owned(), len - 17..len),
    ] {
        let part = get(&url, &[("range", &range)]);
        assert_eq!(part.status, 206, "{range}");
        assert_eq!(part.body, full.body[want], "{range}");
    }
    let file = work.join("resumed");
    write_partial(&file, &full.body, len / 3);
    curl_resume(&url, &file).assert_success();
    assert_eq!(sha256_file(&file), sha256_hex(&full.body));
}

#[test]
fn credentials_from_the_aws_environment_sign_and_never_reach_the_log() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let object = test_bytes(100_000, 12);
    server.put(BUCKET, "a.bin", &object);
    let body = format!(
        "[upstreams.store]\nurl = \"{}\"\nbucket = \"{BUCKET}\"\n\n[[routes]]\npath_prefix = \
         \"/s3/\"\nupstream = \"store\"\nstrip_prefix = true\n",
        server.url()
    );
    let log = TempDir::new("s3-log");
    let log_file = log.join("rangeway.log");
    let process = ProxyProcess::start_logged(
        &body,
        &[("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY)],
        &log_file,
    );
    let got = get(&process.url("/s3/a.bin"), &[]);
    assert_eq!(got.status, 200);
    assert_eq!(got.body, object);
    assert_eq!(get(&process.url("/s3/missing"), &[]).status, 404);
    drop(process);
    let log = std::fs::read_to_string(&log_file).expect("the log");
    assert!(log.contains("S3 upstream: requests are signed"), "{log}");
    assert!(log.contains("AWS_ACCESS_KEY_ID"), "the log names where the key came from: {log}");
    assert!(!log.contains(SECRET_KEY) && !log.contains(ACCESS_KEY), "{log}");

    // Without any credentials, `rangeway check` names the upstream and the ways to give some.
    let config = log_dir_config(&body);
    let check = Command::new(env!("CARGO_BIN_EXE_rangeway"))
        .args(["check", "--config"])
        .arg(config.join("rangeway.toml"))
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env("HOME", config.path())
        .output()
        .expect("run rangeway check");
    assert_eq!(check.status.code(), Some(2));
    let errors = String::from_utf8_lossy(&check.stderr);
    assert!(errors.contains("upstreams.store (line 1, column 12): has no credentials"), "{errors}");
    assert!(errors.contains("access_key_env"), "{errors}");
}

fn log_dir_config(body: &str) -> TempDir {
    let dir = TempDir::new("s3-check");
    std::fs::write(dir.join("rangeway.toml"), body).expect("write the config");
    dir
}

#[test]
fn a_route_with_client_keys_serves_only_requests_signed_with_one() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let object = test_bytes(2 * 1024 * 1024 + 99, 13);
    server.put(BUCKET, "private/a b.bin", &object);
    let work = TempDir::new("s3-client-keys");
    let keys = work.join("clients");
    std::fs::write(&keys, "# team keys\nAKIDCLIENT1 client/secret+1\nAKIDCLIENT2 two\n")
        .expect("keys");
    let config = s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), "")
        .replace("path_prefix = \"/s3/\"", &format!("path_prefix = \"/{BUCKET}/\""))
        .replace(
            "strip_prefix = true\n",
            &format!("strip_prefix = true\ns3_client_keys_file = \"{}\"\n", keys.display()),
        );
    let proxy = started(&config);
    let endpoint = proxy.url("");

    // boto3 signing with an admitted key: HeadObject, then ranged GetObjects, all verified.
    let file = work.join("admitted");
    boto3_as(
        ("AKIDCLIENT1", "client/secret+1"),
        &endpoint,
        "download",
        "private/a b.bin",
        Some(&file),
        &[],
    );
    assert_eq!(sha256_file(&file), sha256_hex(&object));

    // The wrong secret, an unknown key, no signature: 403 with S3's code, and nothing fetched.
    let wrong =
        boto3_as(("AKIDCLIENT1", "guess"), &endpoint, "get-error", "private/a b.bin", None, &[]);
    assert_eq!(wrong["error"], "SignatureDoesNotMatch");
    let unknown =
        boto3_as(("AKIDNOBODY", "x"), &endpoint, "get-error", "private/a b.bin", None, &[]);
    assert_eq!(unknown["error"], "InvalidAccessKeyId");
    let unsigned = get(&proxy.url(&format!("/{BUCKET}/private/a%20b.bin")), &[]);
    assert_eq!(unsigned.status, 403);
    assert!(String::from_utf8_lossy(&unsigned.body).contains("<Code>AccessDenied</Code>"));
    // A signature of a day ago is refused even with the right key.
    let stale = get(
        &proxy.url(&format!("/{BUCKET}/private/a%20b.bin")),
        &[
            (
                "authorization",
                &format!(
                    "AWS4-HMAC-SHA256 Credential=AKIDCLIENT2/20000101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature={}",
                    "0".repeat(64)
                ),
            ),
            ("x-amz-date", "20000101T000000Z"),
        ],
    );
    assert_eq!(stale.status, 403);
    assert!(String::from_utf8_lossy(&stale.body).contains("RequestTimeTooSkewed"));
}

/// S3's `response-*` query parameters set the answer's headers; through rangeway, which signs
/// with its own keys, they would let any client make an object be served as, say, HTML inline
/// from rangeway's host. They reach S3 only on a route that allows them.
#[test]
fn response_overrides_reach_s3_only_where_the_route_allows_them() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let object = b"<script>alert(1)</script>".to_vec();
    server.put(BUCKET, "upload.txt", &object);
    let work = TempDir::new("s3-overrides");
    let credentials = credentials_file(&work, ACCESS_KEY, SECRET_KEY);
    let hostile = "/s3/upload.txt?response-content-type=text%2Fhtml\
                   &response-content-disposition=inline";

    let locked = started(&s3_config(&server, &credentials, ""));
    let served = get(&locked.url(hostile), &[]);
    assert_eq!(served.status, 200, "{}", String::from_utf8_lossy(&served.body));
    assert_eq!(served.body, object);
    assert_ne!(served.header("content-type"), Some("text/html"));
    assert_eq!(served.header("content-disposition"), None);

    let allowing = started(&s3_config(&server, &credentials, "s3_response_overrides = true\n"));
    let served = get(&allowing.url(hostile), &[]);
    assert_eq!(served.status, 200, "{}", String::from_utf8_lossy(&served.body));
    assert_eq!(served.header("content-type"), Some("text/html"), "s3s-fs honours the override");
    assert_eq!(served.header("content-disposition"), Some("inline"));
}

/// An S3 route through the slice cache: the GET that learns an object and the ranged fetches
/// of its slices are signed like any request, and a second download asks S3 nothing more.
#[test]
fn an_s3_route_through_the_slice_cache() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let object = test_bytes(3 * 1024 * 1024 + 17, 11);
    server.put(BUCKET, "cached/obj.bin", &object);
    let work = TempDir::new("s3-cache");
    let cache = TempDir::new("s3-cache-dir");
    let config = format!(
        "[cache]\ndir = \"{}\"\nslice_size = \"1MiB\"\n\n{}",
        cache.path().display(),
        s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), "")
    );
    let proxy = started(&config);
    let url = proxy.url("/s3/cached/obj.bin");
    let tail = get(&url, &[("Range", "bytes=-100")]);
    assert_eq!(tail.status, 206);
    assert_eq!(tail.body, &object[object.len() - 100..]);
    assert_eq!(tail.header("x-rangeway-cache"), Some("miss"));
    let whole = get(&url, &[]);
    assert!(whole.body == object);
    let listed = proxy.cache_listing("path=/s3/cached/obj.bin");
    assert_eq!(listed["objects"][0]["slices"].as_array().map(Vec::len), Some(4), "{listed}");
    assert_eq!(proxy.metric("rangeway_cache_fill_failures_total", ""), 0);
    let served = proxy.metric("rangeway_cache_served_bytes_total", "");
    let fetched = proxy.metric("rangeway_cache_origin_bytes_total", "");
    // The cold tail asked for a slice more than it wanted, less a byte (where its slice begins
    // was not known yet): the bytes before that slice were read and passed over.
    const SLICE: u64 = 1024 * 1024;
    let asked_from = object.len() as u64 - (100 + SLICE - 1);
    let passed = asked_from.div_ceil(SLICE) * SLICE - asked_from;
    assert_eq!(fetched, object.len() as u64 + passed, "each byte from S3 once");
    assert!(served >= fetched - passed + 100, "{served} served, {fetched} fetched");
}

#[test]
fn presigned_urls_from_boto3_and_a_resume_past_their_expiry() {
    let server = S3Server::start();
    server.bucket(BUCKET);
    let object = test_bytes(20 << 20, 14);
    server.put(BUCKET, "private/big.bin", &object);
    let work = TempDir::new("s3-presigned");
    let keys = work.join("clients");
    std::fs::write(&keys, "AKIDCLIENT1 client/secret+1\n").expect("keys");
    let config = s3_config(&server, &credentials_file(&work, ACCESS_KEY, SECRET_KEY), "")
        .replace("path_prefix = \"/s3/\"", &format!("path_prefix = \"/{BUCKET}/\""))
        .replace(
            "strip_prefix = true\n",
            &format!(
                "strip_prefix = true\ns3_client_keys_file = \"{}\"\ns3_presigned_grace = \"1h\"\n",
                keys.display()
            ),
        );
    let proxy = started(&config);
    let endpoint = proxy.url("");
    let client = ("AKIDCLIENT1", "client/secret+1");
    let presign = |seconds: &str| {
        let made = boto3_as(
            client,
            &endpoint,
            "presign",
            "private/big.bin",
            Some(Path::new(seconds)),
            &[],
        );
        made["url"].as_str().expect("a URL").to_owned()
    };
    let curl = |args: &[&str]| {
        let mut command = Command::new("curl");
        command.arg("-sS").args(args);
        run(command, Duration::from_secs(120))
    };

    // Good: the whole object, byte-exact; nothing of the signature reaches the store.
    let url = presign("3600");
    assert!(url.contains("X-Amz-Signature="), "{url}");
    let file = work.join("whole.bin");
    let whole = curl(&["-w", "%{http_code}", "-o", file.to_str().unwrap(), &url]);
    assert_eq!(whole.stdout, "200", "{whole}");
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    // Tampered: the key, the lifetime, the signature.
    let signature = url.rsplit_once("X-Amz-Signature=").unwrap().1.to_owned();
    for (tampered, code) in [
        (url.replace("X-Amz-Expires=3600", "X-Amz-Expires=7200"), "SignatureDoesNotMatch"),
        (url.replace(&signature, &"0".repeat(64)), "SignatureDoesNotMatch"),
        (url.replace("AKIDCLIENT1", "AKIDNOBODY"), "InvalidAccessKeyId"),
        (url.replace("big.bin", "other.bin"), "SignatureDoesNotMatch"),
    ] {
        let refused = curl(&["-w", "%{http_code}", &tampered]);
        assert!(refused.stdout.ends_with("403"), "{tampered}: {refused}");
        assert!(refused.stdout.contains(&format!("<Code>{code}</Code>")), "{refused}");
    }

    // A URL good for 2 s: a download begun with it, stopped part way, resumes after it expired.
    let url = presign("2");
    let file = work.join("resumed.bin");
    let started = curl(&["--limit-rate", "500K", "-m", "1", "-o", file.to_str().unwrap(), &url]);
    assert_eq!(started.code(), Some(28), "cut by -m 1: {started}");
    // The delay is the point: the URL runs out.
    std::thread::sleep(Duration::from_secs(3));
    let fresh = curl(&["-w", "%{http_code}", &url]);
    assert!(fresh.stdout.ends_with("403"), "{fresh}");
    assert!(fresh.stdout.contains("Request has expired"), "{fresh}");
    let resumed = curl(&["-C", "-", "-w", "%{http_code}", "-o", file.to_str().unwrap(), &url]);
    assert_eq!(resumed.stdout, "206", "{resumed}");
    assert_eq!(sha256_file(&file), sha256_hex(&object), "resumed past the URL's expiry");
    assert_eq!(proxy.metric("rangeway_resumed_past_expiry_total", "by=\"presigned\""), 1);
    assert_eq!(proxy.metric("rangeway_s3_clients_refused_total", "reason=\"expired\""), 1);
}
