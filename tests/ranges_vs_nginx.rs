//! Every range request of a table, sent to nginx directly and through rangeway, compared: status,
//! Content-Range, Content-Length, ETag, Last-Modified and body (multipart part by part). Where
//! nginx departs from RFC 9110, rangeway's answer is checked against the RFC instead and the
//! difference is named.

mod support;

use support::data::test_bytes;
use support::http::{RawRequest, Response, request};
use support::multipart::parts;
use support::nginx::{Nginx, NginxOptions};
use support::proxy::Proxy;
use support::tmp::TempDir;

const ODD_LEN: usize = 1_000_003;

/// Method, path, request headers.
type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>);

struct Setup {
    _dir: TempDir,
    nginx: Nginx,
    proxy: Proxy,
    odd: Vec<u8>,
}

fn setup() -> Setup {
    let dir = TempDir::new("ranges");
    let odd = test_bytes(ODD_LEN, 1);
    std::fs::write(dir.join("odd.bin"), &odd).expect("write odd.bin");
    std::fs::write(dir.join("small.bin"), &odd[..50]).expect("write small.bin");
    std::fs::write(dir.join("empty.bin"), b"").expect("write empty.bin");
    let nginx = Nginx::start(NginxOptions::serving(dir.path()));
    let proxy = Proxy::in_front_of(&nginx.base_url());
    Setup { _dir: dir, nginx, proxy, odd }
}

fn send(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    let mut raw = RawRequest::new(method, path);
    for (name, value) in headers {
        raw = raw.header(name, value);
    }
    request(addr, &raw).unwrap_or_else(|e| panic!("{method} {path} {headers:?}: {e}"))
}

fn assert_same(case: &str, direct: &Response, proxied: &Response) {
    assert_eq!(direct.status, proxied.status, "{case}: status");
    for name in ["content-range", "etag", "last-modified"] {
        assert_eq!(direct.header(name), proxied.header(name), "{case}: {name}");
    }
    let is_multipart =
        direct.header("content-type").is_some_and(|t| t.starts_with("multipart/byteranges"));
    if is_multipart {
        assert!(
            proxied.header("content-type").unwrap_or_default().starts_with("multipart/byteranges"),
            "{case}"
        );
        assert_eq!(parts(direct), parts(proxied), "{case}: parts");
        assert_eq!(
            proxied
                .header("content-length")
                .map(|l| l.parse::<usize>().expect("numeric Content-Length")),
            Some(proxied.body.len()),
            "{case}: length"
        );
    } else {
        assert_eq!(
            direct.header("content-length"),
            proxied.header("content-length"),
            "{case}: content-length"
        );
        assert!(
            direct.body == proxied.body,
            "{case}: body differs ({} vs {} bytes)",
            direct.body.len(),
            proxied.body.len()
        );
    }
    assert!(proxied.complete, "{case}: incomplete body");
}

#[test]
fn agrees_with_nginx_where_nginx_follows_the_rfc() {
    let s = setup();
    let direct = send(s.nginx.addr(), "HEAD", "/odd.bin", &[]);
    let etag = direct.header("etag").unwrap().to_owned();
    let last_modified = direct.header("last-modified").unwrap().to_owned();
    let cases: Vec<Case> = vec![
        ("GET", "/odd.bin", vec![]),
        ("GET", "/odd.bin", vec![("Range", "bytes=0-0")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=0-99")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=1000-")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=-100")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=-2000000")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=999990-2000000")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=1000003-")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=5000000-6000000")]),
        ("GET", "/odd.bin", vec![("Range", "items=0-1")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=0-1,500-501")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=0-1, 999000-999099, -5")]),
        ("GET", "/small.bin", vec![("Range", "bytes=0-1,60-70")]),
        ("GET", "/small.bin", vec![("Range", "bytes=49-1000")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=10-19"), ("If-Range", etag.as_str())]),
        ("GET", "/odd.bin", vec![("Range", "bytes=10-19"), ("If-Range", "\"stale\"")]),
        ("GET", "/odd.bin", vec![("Range", "bytes=10-19"), ("If-Range", "W/\"weak\"")]),
        ("GET", "/odd.bin", vec![("If-None-Match", etag.as_str())]),
        ("GET", "/odd.bin", vec![("If-Match", "\"other\""), ("Range", "bytes=0-1")]),
        ("GET", "/odd.bin", vec![("If-Modified-Since", last_modified.as_str())]),
        ("GET", "/empty.bin", vec![]),
        ("GET", "/missing.bin", vec![]),
        ("HEAD", "/odd.bin", vec![]),
    ];
    for (method, path, headers) in &cases {
        let case = format!("{method} {path} {headers:?}");
        let direct = send(s.nginx.addr(), method, path, headers);
        let proxied = send(s.proxy.addr(), method, path, headers);
        if proxied.status != 304 && proxied.status != 404 && proxied.status != 412 {
            assert_same(&case, &direct, &proxied);
        } else {
            assert_eq!(direct.status, proxied.status, "{case}");
        }
    }
    // The bodies are the object's bytes, not just equal to nginx's.
    let proxied = send(s.proxy.addr(), "GET", "/odd.bin", &[("Range", "bytes=-100")]);
    assert_eq!(proxied.body, s.odd[ODD_LEN - 100..]);
}

/// nginx answers 416 to Range headers that RFC 9110 §14.2 says a server may only ignore (invalid
/// syntax, a reversed range): rangeway ignores them and sends the whole object, which every client
/// handles. nginx also answers 206 to HEAD with a Range, which §14.2 rules out (Range is defined
/// for GET only).
#[test]
fn departs_from_nginx_where_the_rfc_says_otherwise() {
    let s = setup();
    for range in ["bytes=5-2", "bytes=abc", "bytes=0-1,x", "bytes=99999999999999999999-"] {
        let direct = send(s.nginx.addr(), "GET", "/small.bin", &[("Range", range)]);
        let proxied = send(s.proxy.addr(), "GET", "/small.bin", &[("Range", range)]);
        assert_eq!(direct.status, 416, "{range}: nginx");
        assert_eq!(proxied.status, 200, "{range}");
        assert_eq!(proxied.body, s.odd[..50], "{range}");
    }
    let proxied = send(s.proxy.addr(), "HEAD", "/small.bin", &[("Range", "bytes=0-1")]);
    assert_eq!(proxied.status, 200);
    assert_eq!(proxied.header("content-length"), Some("50"));
    assert_eq!(proxied.header("accept-ranges"), Some("bytes"));

    // An empty object: nginx ignores every Range with a 200; a first-pos at or past the end is
    // unsatisfiable (§14.1.1), a suffix is served as the whole (empty) object.
    let proxied = send(s.proxy.addr(), "GET", "/empty.bin", &[("Range", "bytes=0-")]);
    assert_eq!(proxied.status, 416);
    assert_eq!(proxied.header("content-range"), Some("bytes */0"));

    // `-0` asks for nothing: unsatisfiable, with the length.
    let proxied = send(s.proxy.addr(), "GET", "/small.bin", &[("Range", "bytes=-0")]);
    assert_eq!(proxied.status, 416);
    assert_eq!(proxied.header("content-range"), Some("bytes */50"));

    // A last position or a suffix past any object's length means the end, or the whole object
    // (§14.1.2): nginx, which keeps offsets signed, refuses the numbers as written (416 here);
    // rangeway asks it for what they mean.
    for range in ["bytes=0-18446744073709551615", "bytes=-18446744073709551615"] {
        let direct = send(s.nginx.addr(), "GET", "/odd.bin", &[("Range", range)]);
        let proxied = send(s.proxy.addr(), "GET", "/odd.bin", &[("Range", range)]);
        assert_ne!(direct.status, 206, "{range}: nginx");
        assert_eq!(proxied.status, 206, "{range}");
        assert_eq!(proxied.header("content-range"), Some("bytes 0-1000002/1000003"), "{range}");
        assert!(proxied.body == s.odd, "{range}");
    }

    // Overlapping ranges are coalesced into one (§14.2), where nginx sends both.
    let proxied = send(s.proxy.addr(), "GET", "/odd.bin", &[("Range", "bytes=0-99,50-149")]);
    assert_eq!(proxied.status, 206);
    assert_eq!(proxied.header("content-range"), Some("bytes 0-149/1000003"));
    assert_eq!(proxied.body, s.odd[..150]);
}

#[test]
fn range_amplification_is_bounded() {
    let s = setup();
    // Many small ranges: more than the limit, so the header is ignored and the object sent once.
    let many: Vec<String> = (0..200).map(|i| format!("{}-{}", i * 2, i * 2)).collect();
    let header = format!("bytes={}", many.join(","));
    let proxied = send(s.proxy.addr(), "GET", "/small.bin", &[("Range", &header)]);
    assert_eq!(proxied.status, 200);
    // Overlapping copies of the whole object are sent once, not 10 times.
    let proxied = send(
        s.proxy.addr(),
        "GET",
        "/small.bin",
        &[("Range", "bytes=0-,0-,0-,0-,0-,0-,0-,0-,0-,0-")],
    );
    assert_eq!(proxied.status, 206);
    assert_eq!(proxied.body.len(), 50);
}
