//! Range requests meant to make the proxy (or its origin) work: many overlapping ranges, absurd
//! numbers, ranges that select nothing, Range on methods rangeway does not serve. Each is answered
//! correctly, and the origin sees at most one request per client request, for at most the bytes
//! that answer needs.

mod support;

use support::data::test_bytes;
use support::http::{RawRequest, Response, request};
use support::origin::Origin;
use support::proxy::Proxy;

const LEN: usize = 300_000;

struct Setup {
    origin: Origin,
    proxy: Proxy,
    object: Vec<u8>,
}

fn setup() -> Setup {
    setup_with("")
}

/// With `server_keys` added to the proxy's `[server]`.
fn setup_with(server_keys: &str) -> Setup {
    let origin = Origin::start();
    let object = test_bytes(LEN, 11);
    origin.put("/obj.bin", object.clone());
    let body = format!(
        "[upstreams.origin]\nurl = \"{}\"\nread_timeout = \"5s\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        origin.base_url()
    );
    let proxy = Proxy::start_with_server(&body, server_keys);
    Setup { origin, proxy, object }
}

/// What the origin did for one client request: its requests' Range headers, and the object bytes
/// it sent.
struct Upstream {
    ranges: Vec<Option<String>>,
    body_bytes: u64,
}

impl Setup {
    /// Sends `method /obj.bin` with `range`, and returns the answer and the origin's part in it.
    fn send(&self, method: &str, range: &str) -> (Response, Upstream) {
        self.origin.clear_requests();
        let before = self.origin.body_bytes();
        let raw = RawRequest::new(method, "/obj.bin").header("Range", range);
        let response = request(self.proxy.addr(), &raw).expect("a request through the proxy");
        let ranges =
            self.origin.requests().iter().map(|r| r.header("range").map(str::to_owned)).collect();
        (response, Upstream { ranges, body_bytes: self.origin.body_bytes() - before })
    }

    /// A GET with `range` answered 200 with the whole object, read once from the origin.
    fn assert_whole_once(&self, range: &str) {
        let label = short(range);
        let (response, upstream) = self.send("GET", range);
        assert_eq!(response.status, 200, "{label}");
        assert_eq!(response.header("content-range"), None, "{label}");
        assert!(response.body == self.object, "{label}: not the object");
        assert_eq!(upstream.ranges, [None], "{label}: the origin's requests");
        assert_eq!(upstream.body_bytes, LEN as u64, "{label}");
    }

    /// A GET with `range` answered 206 with the single range `first..end`, for which the origin
    /// was asked one range (the client's, covered in one spec, as written: the proxy does not know
    /// the length yet) and sent exactly those bytes.
    fn assert_single(&self, range: &str, first: usize, end: usize) {
        let label = short(range);
        let (response, upstream) = self.send("GET", range);
        assert_eq!(response.status, 206, "{label}");
        let content_range = format!("bytes {first}-{}/{LEN}", end - 1);
        assert_eq!(response.header("content-range"), Some(content_range.as_str()), "{label}");
        assert!(response.body == self.object[first..end], "{label}: not the range's bytes");
        assert!(matches!(upstream.ranges[..], [Some(_)]), "{label}: {:?}", upstream.ranges);
        assert_eq!(upstream.body_bytes, (end - first) as u64, "{label}");
    }

    /// A GET with `range` answered 416, having read no object byte from the origin.
    fn assert_unsatisfiable(&self, range: &str) {
        let label = short(range);
        let (response, upstream) = self.send("GET", range);
        assert_eq!(response.status, 416, "{label}");
        let unsatisfied = format!("bytes */{LEN}");
        assert_eq!(response.header("content-range"), Some(unsatisfied.as_str()), "{label}");
        assert!(upstream.ranges.len() <= 1, "{label}: {:?}", upstream.ranges);
        assert_eq!(upstream.body_bytes, 0, "{label}");
    }
}

/// `range` shortened for failure messages: headers here run to thousands of specs.
fn short(range: &str) -> String {
    match range.char_indices().nth(48) {
        Some((cut, _)) => format!("{}… ({} bytes)", &range[..cut], range.len()),
        None => range.to_owned(),
    }
}

fn ranges(specs: impl Iterator<Item = String>) -> String {
    format!("bytes={}", specs.collect::<Vec<_>>().join(","))
}

#[test]
fn many_overlapping_ranges_cost_the_origin_one_read() {
    let s = setup();
    // 1000 overlapping ranges, more than the default 16: ignored; the object is read once.
    s.assert_whole_once(&ranges((0..1000).map(|i| format!("{i}-{}", i + 9999))));
    // 17 ranges, one over the default limit of 16: ignored too.
    s.assert_whole_once(&ranges((0..17).map(|i| format!("{i}-{i}"))));
    // 16 overlapping ranges are coalesced: one range out, the same one range asked upstream.
    s.assert_single(&ranges((0..16).map(|i| format!("{i}-{}", i + 9999))), 0, 10_015);
    // 16 copies of the whole object: one copy out, one read.
    s.assert_single(&ranges((0..16).map(|_| "0-".to_owned())), 0, LEN);
    s.assert_single(&ranges((0..16).map(|i| format!("-{}", 1000 + i))), LEN - 1015, LEN);

    // 16 ranges far apart: 16 parts out; upstream, one request for the range covering them.
    let header = ranges((0..16).map(|i| format!("{}-{}", i * 1000, i * 1000 + 9)));
    let (response, upstream) = s.send("GET", &header);
    assert_eq!(response.status, 206);
    let parts = support::multipart::parts(&response);
    assert_eq!(parts.len(), 16);
    for (i, part) in parts.iter().enumerate() {
        assert!(part.body == s.object[i * 1000..i * 1000 + 10], "part {i}");
    }
    assert_eq!(upstream.ranges, [Some("bytes=0-15009".to_owned())]);
    assert_eq!(upstream.body_bytes, 15_010);
}

/// With `max_ranges = 1000`, a header of 1000 ranges is honoured (it is long, but the length
/// limit grows with `max_ranges`), and still costs the origin one request for one range.
#[test]
fn a_thousand_ranges_allowed_are_served_from_one_upstream_range() {
    let s = setup_with("max_ranges = 1000\n");
    s.assert_single(&ranges((0..1000).map(|i| format!("{i}-{}", i + 9999))), 0, 10_999);
    s.assert_single(&ranges((0..1000).map(|_| "0-".to_owned())), 0, LEN);

    let header = ranges((0..1000).map(|i| format!("{}-{}", i * 300, i * 300)));
    let (response, upstream) = s.send("GET", &header);
    assert_eq!(response.status, 206);
    let parts = support::multipart::parts(&response);
    assert_eq!(parts.len(), 1000);
    assert!(parts.iter().enumerate().all(|(i, part)| part.body == [s.object[i * 300]]));
    assert!(response.body.len() < LEN, "the answer outgrew the object: {}", response.body.len());
    assert_eq!(upstream.ranges, [Some("bytes=0-299700".to_owned())]);
    assert_eq!(upstream.body_bytes, 299_701);

    // 1001 ranges: one over, ignored.
    s.assert_whole_once(&ranges((0..1001).map(|i| format!("{i}-{i}"))));
}

#[test]
fn absurd_numbers_are_ignored_or_clamped() {
    let s = setup();
    // Past u64: not a valid header, so ignored (RFC 9110 §14.2), never forwarded.
    s.assert_whole_once("bytes=0-99999999999999999999999");
    s.assert_whole_once("bytes=99999999999999999999999-");
    s.assert_whole_once("bytes=-99999999999999999999999");
    // Within u64, past the object: a last-pos is clamped to the end, a suffix to the whole, and
    // the origin is asked for what they mean (origins that keep offsets signed refuse the
    // numbers as written; see ranges_vs_nginx.rs).
    for (range, first, asked) in [
        ("bytes=0-18446744073709551615", 0, "bytes=0-"),
        ("bytes=299990-18446744073709551614", LEN - 10, "bytes=299990-"),
        ("bytes=-18446744073709551615", 0, "bytes=0-"),
    ] {
        s.assert_single(range, first, LEN);
        assert_eq!(s.send("GET", range).1.ranges, [Some(asked.to_owned())], "{range}");
    }
    // A first-pos past the end selects nothing.
    s.assert_unsatisfiable("bytes=18446744073709551615-");
    s.assert_unsatisfiable("bytes=300000-300000");
}

#[test]
fn ranges_selecting_nothing_are_unsatisfiable() {
    let s = setup();
    s.assert_unsatisfiable("bytes=-0");
    s.assert_unsatisfiable(&ranges((0..16).map(|_| "-0".to_owned())));

    // A suffix mixed with a first-pos: only the whole object is sure to cover both, so that is
    // what is asked, once (no more than a GET without Range costs), and nothing is sent on.
    let (response, upstream) = s.send("GET", "bytes=-0,400000-");
    assert_eq!(response.status, 416);
    assert_eq!(response.header("content-range"), Some(format!("bytes */{LEN}").as_str()));
    assert!(response.body.is_empty());
    assert_eq!(upstream.ranges, [None]);
    assert!(upstream.body_bytes <= LEN as u64);
}

#[test]
fn range_on_other_methods_never_reaches_the_origin() {
    let s = setup();
    for method in ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"] {
        let (response, upstream) = s.send(method, "bytes=0-99");
        assert_eq!(response.status, 405, "{method}");
        assert_eq!(response.header("allow"), Some("GET, HEAD"), "{method}");
        assert_eq!(response.header("content-range"), None, "{method}");
        assert!(upstream.ranges.is_empty(), "{method}: {:?}", upstream.ranges);
        assert_eq!(upstream.body_bytes, 0, "{method}");
    }
    // HEAD with a Range is answered as HEAD without one (Range is defined for GET only): the
    // origin sends no body.
    let (response, upstream) = s.send("HEAD", "bytes=0-99");
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-length"), Some(LEN.to_string().as_str()));
    assert!(response.body.is_empty());
    assert!(upstream.ranges.len() <= 1, "{:?}", upstream.ranges);
    assert_eq!(upstream.body_bytes, 0);
}

/// Ranges far apart are fetched apart: what the origin sends stays within the bytes asked for
/// (plus a small gap per stretch), where one covering range pulled everything between them.
/// Until rangeway knows the object's version to pin the stretches to, and on routes whose stages
/// would have to produce everything between them, the Range is ignored instead: a 200 costs what
/// the client takes of it.
#[test]
fn ranges_far_apart_cost_the_origin_what_they_ask_for() {
    let s = setup();
    let far = format!("bytes=0-0,{}-{}", LEN - 1, LEN - 1);
    // Not known yet: answered whole.
    s.assert_whole_once(&far);
    let known = s.proxy.admin_url("/v1/objects?path=/obj.bin");
    support::http::get_until(&known, |r| r.status == 200);

    let etag = s.origin.etag("/obj.bin").expect("an ETag");
    for (range, expected) in [
        (far.clone(), vec![(0, 1), (LEN - 1, LEN)]),
        ("bytes=0-0,-1".to_owned(), vec![(0, 1), (LEN - 1, LEN)]),
        (
            ranges((0..4).map(|i| format!("{}-{}", i * 70_000, i * 70_000 + 10))),
            (0..4).map(|i| (i * 70_000, i * 70_000 + 11)).collect(),
        ),
    ] {
        let label = short(&range);
        let (response, upstream) = s.send("GET", &range);
        assert_eq!(response.status, 206, "{label}");
        let parts = support::multipart::parts(&response);
        assert_eq!(parts.len(), expected.len(), "{label}");
        for (part, (start, end)) in parts.iter().zip(&expected) {
            assert!(part.body == s.object[*start..*end], "{label}: part {start}-{end}");
        }
        let asked: u64 = expected.iter().map(|(start, end)| (end - start) as u64).sum();
        assert_eq!(upstream.body_bytes, asked, "{label}: the origin sent only what was asked");
        assert_eq!(upstream.ranges.len(), expected.len(), "{label}: one request per stretch");
        // The first pinned with If-Range, the others with If-Match, to the version known.
        let requests = s.origin.requests();
        assert_eq!(requests[0].header("if-range"), Some(etag.as_str()), "{label}");
        assert!(requests[1..].iter().all(|r| r.header("if-match") == Some(etag.as_str())));
    }

    // The object changed since: the first request comes whole (If-Range), the ranges are cut
    // from it, of the new version only. (Under a download id of its own: the pieces sent above,
    // of the old version, would make a bare multi-range request under the same id a resume that
    // could mix versions, refused.)
    let changed = test_bytes(LEN, 12);
    s.origin.put("/obj.bin", changed.clone());
    s.origin.clear_requests();
    let raw = RawRequest::get("/obj.bin").header("Range", &far).header("X-Download-Id", "fresh");
    let response = request(s.proxy.addr(), &raw).expect("a request through the proxy");
    assert_eq!(response.status, 206);
    let parts = support::multipart::parts(&response);
    assert!(parts[0].body == changed[..1] && parts[1].body == changed[LEN - 1..]);
    assert_eq!(s.origin.requests().len(), 1);
}

/// On a route whose stages transform the body, ranges far apart would make them produce all
/// between: answered whole.
#[test]
fn ranges_far_apart_of_a_transformed_representation_are_answered_whole() {
    let origin = Origin::start();
    let object = test_bytes(LEN, 13);
    origin.put("/obj.bin", object.clone());
    let proxy = Proxy::start(&format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n[[routes.middleware]]\nkind = \"gzip\"\nlevel = 1\nblock_size = 65536\n",
        origin.base_url()
    ));
    let whole = request(proxy.addr(), &RawRequest::get("/obj.bin")).expect("GET");
    assert_eq!(whole.status, 200);
    let len = whole.body.len();
    let far = format!("bytes=0-0,{}-{}", len - 1, len - 1);
    let response =
        request(proxy.addr(), &RawRequest::get("/obj.bin").header("Range", &far)).expect("GET");
    assert_eq!(response.status, 200, "{:?}", response.header("content-type"));
    assert!(response.body == whole.body);
    // Ranges that lie together are still served as ranges.
    let near =
        request(proxy.addr(), &RawRequest::get("/obj.bin").header("Range", "bytes=0-0,100-100"))
            .expect("GET");
    assert_eq!(near.status, 206);
    assert_eq!(support::multipart::parts(&near).len(), 2);
}
