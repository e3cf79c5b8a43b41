//! The slice cache in front of origins as operators have them: a strong ETag, a weak one, only
//! `Last-Modified`, no validator at all, Range ignored, no length on HEAD or on any answer.
//! Whatever the validators, a cold download costs the origin one request and the next one
//! none, ranges are exact, and an object replaced between two fills never yields an answer that
//! mixes versions.
//! Served stale only where the answer allows it: with the origin gone (`stale-if-error`), or
//! while one validation runs behind (`stale-while-revalidate`). Counted at the origin.

mod support;

use std::time::{Duration, SystemTime};

use support::clients::sha256_hex;
use support::data::test_bytes;
use support::http::{RawRequest, Response, get, head};
use support::origin::{Behaviour, Origin};
use support::proxy::{Instance, Proxy, cache_config};
use support::tmp::TempDir;

const MIB: usize = 1024 * 1024;

/// The kinds of origin, each by the behaviour that makes it and how it is last modified: an
/// hour ago makes `Last-Modified` a strong validator (a minute or more before `Date`), now does
/// not.
const KINDS: [(&str, Behaviour, u64); 6] = [
    ("strong", Behaviour::Normal, 0),
    ("weak", Behaviour::WeakEtag, 3600),
    ("dated", Behaviour::NoEtag, 3600),
    ("weak-new", Behaviour::WeakEtag, 0),
    ("ignores-range", Behaviour::IgnoreRange, 0),
    ("no-head-length", Behaviour::NoLengthOnHead, 0),
];

fn range(url: &str, spec: &str) -> Response {
    get(url, &[("Range", spec)])
}

/// What reached the origin since the last look.
fn asked(origin: &Origin) -> usize {
    let seen = origin.requests().len();
    origin.clear_requests();
    seen
}

/// Each kind: the first download one origin request, the second none; ranges of it exact and
/// from the cache. The object fits in the cache's first run of slices (16 MiB), so even a
/// version nothing pins (a weak ETag modified a moment ago) is kept whole from its first answer.
#[test]
fn every_kind_of_origin_is_cached_with_one_request_a_miss() {
    let origin = Origin::start();
    let len = 3 * MIB + 5;
    let cache = TempDir::new("cache-kinds-dir");
    let proxy = Proxy::start(&cache_config(&origin.base_url(), cache.path(), "256MiB"));
    for (index, (kind, behaviour, age)) in KINDS.into_iter().enumerate() {
        let object = test_bytes(len, 120 + index as u64);
        let path = format!("/{kind}.bin");
        let modified = SystemTime::now() - Duration::from_secs(age);
        origin.put_modified(&path, object.clone(), &[("Cache-Control", "max-age=600")], modified);
        origin.set_behaviour(&path, behaviour);
        let url = proxy.url(&path);
        let cold = get(&url, &[]);
        assert_eq!((cold.status, cold.header("x-rangeway-cache")), (200, Some("miss")), "{kind}");
        assert!(cold.body == object, "{kind}: the object");
        assert_eq!(asked(&origin), 1, "{kind}: a cold download is one request");
        let warm = get(&url, &[]);
        assert_eq!(warm.header("x-rangeway-cache"), Some("hit"), "{kind}");
        assert!(warm.body == object, "{kind}: the object again");
        for (spec, bytes) in [
            ("bytes=1000000-2100000", &object[1_000_000..=2_100_000]),
            ("bytes=-7", &object[len - 7..]),
        ] {
            let part = range(&url, spec);
            assert_eq!(
                (part.status, part.header("x-rangeway-cache")),
                (206, Some("hit")),
                "{kind}"
            );
            assert!(part.body == bytes, "{kind}: {spec}");
        }
        assert_eq!(asked(&origin), 0, "{kind}: warm downloads ask the origin nothing");
    }
}

/// Waits until the cache holds `path` whole: as many slices as its length takes.
fn kept_whole(proxy: &Proxy, path: &str, len: usize) {
    support::wait::until("the whole object kept", Duration::from_secs(10), || {
        let listed = proxy.cache_listing(&format!("path={path}"));
        let object = &listed["objects"][0];
        let slice = object["slice_size"].as_u64().filter(|size| *size > 0)?;
        let slices = object["slices"].as_array().map(Vec::len)? as u64;
        let whole = object["len"].as_u64() == Some(len as u64);
        (whole && slices == (len as u64).div_ceil(slice)).then_some(())
    });
}

/// An answer without a length — the whole object chunked whatever the Range, as an application
/// server streams it — is kept as its body streams to its first client: one origin request,
/// then whole downloads, ranges and HEADs from the cache, byte for byte, with the length the
/// cache learned at the body's end. A first client that asks a range stops reading before the
/// end: the cache reads its own answer to the end behind it, while that client's request goes
/// to the origin.
#[test]
fn an_answer_without_a_length_is_kept_as_it_streams() {
    let origin = Origin::start();
    let len = 3 * MIB + 5;
    let cache = TempDir::new("cache-streamed-dir");
    let proxy = Proxy::start(&cache_config(&origin.base_url(), cache.path(), "256MiB"));
    let fresh = [("Cache-Control", "max-age=600")];
    for (index, first_range) in [None, Some("bytes=100-199")].into_iter().enumerate() {
        let object = test_bytes(len, 90 + index as u64);
        let path = format!("/streamed-{index}.bin");
        origin.put_with_headers(&path, object.clone(), &fresh);
        origin.set_behaviour(&path, Behaviour::ChunkedWhole);
        let url = proxy.url(&path);
        match &first_range {
            None => {
                let cold = get(&url, &[]);
                assert_eq!((cold.status, cold.header("x-rangeway-cache")), (200, Some("miss")));
                assert!(cold.body == object, "{path}: the object");
                assert_eq!(asked(&origin), 1, "{path}: a cold download is one request");
            }
            Some(spec) => {
                // The origin's 200 as it is: a range cannot be cut from a body of no length.
                let cold = range(&url, spec);
                assert_eq!(cold.status, 200, "{path}");
                assert!(cold.body == object, "{path}: {spec}");
                assert_eq!(asked(&origin), 2, "{path}: the cache's request and the client's");
            }
        }
        kept_whole(&proxy, &path, len);
        let warm = get(&url, &[]);
        assert_eq!((warm.status, warm.header("x-rangeway-cache")), (200, Some("hit")), "{path}");
        assert_eq!(warm.header("content-length"), Some(len.to_string().as_str()), "{path}");
        assert_eq!(warm.header("transfer-encoding"), None, "{path}: not stored");
        assert!(warm.body == object, "{path}: the object again");
        for (spec, bytes) in [
            ("bytes=1000000-2100000", &object[1_000_000..=2_100_000]),
            ("bytes=-7", &object[len - 7..]),
        ] {
            let part = range(&url, spec);
            assert_eq!((part.status, part.header("x-rangeway-cache")), (206, Some("hit")));
            assert!(part.body == bytes, "{path}: {spec}");
        }
        let headed = head(&url, &[]);
        assert_eq!(headed.header("content-length"), Some(len.to_string().as_str()), "{path}");
        assert_eq!(asked(&origin), 0, "{path}: warm downloads ask the origin nothing");
    }

    // Cut before its end: the client sees a cut body, and nothing of it is kept — the next
    // download is the origin's again, whole, and then kept.
    let object = test_bytes(len, 95);
    origin.put_with_headers("/streamed-cut.bin", object.clone(), &fresh);
    origin.set_behaviour("/streamed-cut.bin", Behaviour::ChunkedCutAfter(MIB as u64));
    let url = proxy.url("/streamed-cut.bin");
    let cut = support::http::request(proxy.addr(), &RawRequest::get("/streamed-cut.bin"));
    let cut = cut.map(|answer| (answer.complete, answer.body.len()));
    assert!(matches!(cut, Err(_) | Ok((false, _))), "a cut body is no complete answer: {cut:?}");
    origin.set_behaviour("/streamed-cut.bin", Behaviour::ChunkedWhole);
    let again = get(&url, &[]);
    assert_eq!((again.status, again.header("x-rangeway-cache")), (200, Some("miss")));
    assert!(again.body == object, "the whole object");
    kept_whole(&proxy, "/streamed-cut.bin", len);
    assert_eq!(get(&url, &[]).header("x-rangeway-cache"), Some("hit"));
}

/// A version the cache can pin by a strong `Last-Modified` (its origin gives no ETag, or a weak
/// one) fills its slices apart, each fill conditional on it; one nothing pins is not kept past
/// its first answer when that is not the whole object, and is never served in pieces.
#[test]
fn versions_are_filled_apart_only_when_pinned() {
    let origin = Origin::start();
    let len = 20 * MIB + 3;
    let cache = TempDir::new("cache-pins-dir");
    let proxy = Proxy::start(&cache_config(&origin.base_url(), cache.path(), "256MiB"));
    let fresh = [("Cache-Control", "max-age=600")];
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for (kind, behaviour) in [("dated", Behaviour::NoEtag), ("weak", Behaviour::WeakEtag)] {
        let object = test_bytes(len, 70);
        let path = format!("/{kind}-far.bin");
        origin.put_modified(&path, object.clone(), &fresh, hour_ago);
        origin.set_behaviour(&path, behaviour);
        let url = proxy.url(&path);
        // The first run of slices, then a range past it: a fill of its own, pinned.
        assert!(range(&url, "bytes=0-99").body == object[..100], "{kind}");
        assert_eq!(asked(&origin), 1);
        let far = range(&url, "bytes=19000000-19000099");
        assert_eq!((far.status, far.header("x-rangeway-cache")), (206, Some("miss")), "{kind}");
        assert!(far.body == object[19_000_000..19_000_100], "{kind}");
        let fills = origin.requests();
        assert_eq!(fills.len(), 1, "{kind}: {fills:?}");
        assert!(fills[0].header("if-unmodified-since").is_some(), "{kind}: pinned to its date");
        origin.clear_requests();
        // From the cache: the slice, or its fill still being written.
        let again = range(&url, "bytes=19000000-19000099");
        assert!(again.body == object[19_000_000..19_000_100], "{kind}");
        assert_eq!(asked(&origin), 0, "{kind}");
    }
    // A weak ETag modified a moment ago pins nothing: the first answer holds 16 of its 20 MiB,
    // so it is the client's and not kept; each download is the origin's, whole.
    let object = test_bytes(len, 71);
    origin.put_with_headers("/weak-new-far.bin", object.clone(), &fresh);
    origin.set_behaviour("/weak-new-far.bin", Behaviour::WeakEtag);
    let url = proxy.url("/weak-new-far.bin");
    for _ in 0..2 {
        let whole = get(&url, &[]);
        assert_eq!((whole.status, whole.header("x-rangeway-cache")), (200, None));
        assert!(whole.body == object);
    }
}

/// An object replaced at its origin between two fills, for each kind of validator that pins a
/// version: the fill after the change is refused (412, or another date), never spliced to the
/// first; every download that completes is one version's, byte for byte.
#[test]
fn an_object_replaced_between_fills_never_mixes_versions() {
    let origin = Origin::start();
    let len = 20 * MIB + 11;
    let cache = TempDir::new("cache-replaced-dir");
    let proxy = Proxy::start(&cache_config(&origin.base_url(), cache.path(), "256MiB"));
    let fresh = [("Cache-Control", "max-age=600")];
    let pinned = [
        ("strong", Behaviour::Normal),
        ("dated", Behaviour::NoEtag),
        ("weak", Behaviour::WeakEtag),
    ];
    for (index, (kind, behaviour)) in pinned.into_iter().enumerate() {
        let (v1, v2) = (test_bytes(len, 80 + index as u64), test_bytes(len, 90 + index as u64));
        let (h1, h2) = (sha256_hex(&v1), sha256_hex(&v2));
        let path = format!("/{kind}-replaced.bin");
        let (two_hours, one_hour) = (Duration::from_secs(7200), Duration::from_secs(3600));
        origin.put_modified(&path, v1.clone(), &fresh, SystemTime::now() - two_hours);
        origin.set_behaviour(&path, behaviour.clone());
        let url = proxy.url(&path);
        assert!(range(&url, "bytes=0-99").body == v1[..100], "{kind}: v1's first run kept");
        origin.put_modified(&path, v2.clone(), &fresh, SystemTime::now() - one_hour);
        origin.set_behaviour(&path, behaviour);
        let mut seen = Vec::new();
        for _ in 0..3 {
            let whole = get(&url, &[]);
            if whole.status == 200 && whole.body.len() == len {
                let digest = sha256_hex(&whole.body);
                assert!(digest == h1 || digest == h2, "{kind}: a download of neither version");
                seen.push(if digest == h1 { "v1" } else { "v2" });
            }
        }
        assert_eq!(seen.last(), Some(&"v2"), "{kind}: the new version once the change was seen");
    }
}

/// `stale-if-error`: with the origin gone, a stored download past its freshness is served whole
/// and byte-exact within the window; without the directive the client gets the origin's failure.
#[test]
fn a_stale_download_is_served_when_the_origin_is_gone_if_it_allows() {
    let origin = Origin::start();
    let object = test_bytes(2 * MIB + 21, 60);
    origin.put_with_headers(
        "/sie.bin",
        object.clone(),
        &[("Cache-Control", "max-age=1, stale-if-error=600")],
    );
    origin.put_with_headers("/strict.bin", object.clone(), &[("Cache-Control", "max-age=1")]);
    let cache = TempDir::new("cache-sie-dir");
    let proxy = Proxy::start(&cache_config(&origin.base_url(), cache.path(), "64MiB"));
    for path in ["/sie.bin", "/strict.bin"] {
        assert!(get(&proxy.url(path), &[]).body == object);
    }
    std::thread::sleep(Duration::from_millis(1500));
    drop(origin);
    let stale = get(&proxy.url("/sie.bin"), &[]);
    assert_eq!((stale.status, stale.header("x-rangeway-cache")), (200, Some("stale")));
    assert!(stale.body == object, "the stored download, byte for byte");
    let part = range(&proxy.url("/sie.bin"), "bytes=2000000-2000099");
    assert_eq!(part.body, &object[2_000_000..2_000_100]);
    let strict = get(&proxy.url("/strict.bin"), &[]);
    assert_eq!(strict.status, 502, "no stale answer the origin did not allow");
}

/// `stale-while-revalidate`: past its freshness and within the window, the stored version is
/// served at once while one validation runs behind; the next request finds it validated.
#[test]
fn a_stale_download_is_served_while_one_validation_runs_behind() {
    let origin = Origin::start();
    let object = test_bytes(MIB + 13, 61);
    let control = [("Cache-Control", "max-age=3, stale-while-revalidate=600")];
    origin.put_with_headers("/swr.bin", object.clone(), &control);
    let cache = TempDir::new("cache-swr-dir");
    let proxy = Proxy::start(&cache_config(&origin.base_url(), cache.path(), "64MiB"));
    let url = proxy.url("/swr.bin");
    assert!(get(&url, &[]).body == object);
    std::thread::sleep(Duration::from_millis(3500));
    origin.clear_requests();
    origin.set_behaviour("/swr.bin", Behaviour::Delayed(Duration::from_millis(800)));
    let started = std::time::Instant::now();
    let stale = get(&url, &[]);
    assert_eq!(stale.header("x-rangeway-cache"), Some("stale"));
    assert!(stale.body == object);
    assert!(started.elapsed() < Duration::from_millis(800), "not waiting for the validation");
    support::wait::until("the validation behind", Duration::from_secs(10), || {
        (origin.requests().len() == 1).then_some(())
    });
    // Its answer, sent 0.8 s after it came, and recorded.
    std::thread::sleep(Duration::from_millis(1200));
    let validated = get(&url, &[]);
    assert_eq!(validated.header("x-rangeway-cache"), Some("hit"));
    assert!(validated.body == object);
    assert_eq!(origin.requests().len(), 1, "one validation for both requests");
}

/// What a request's own `Cache-Control` asks (RFC 9111 §5.2.1): `only-if-cached` is answered
/// from what is stored or with 504, the origin never asked; `max-stale` takes a stored version
/// past its freshness without validation, unless the answer said `must-revalidate`.
#[test]
fn a_request_may_ask_for_stored_answers_only_or_stale_ones() {
    let origin = Origin::start();
    let object = test_bytes(MIB + 31, 62);
    origin.put_with_headers("/fresh.bin", object.clone(), &[("Cache-Control", "max-age=600")]);
    origin.put_with_headers("/brief.bin", object.clone(), &[("Cache-Control", "max-age=1")]);
    let strict = [("Cache-Control", "max-age=1, must-revalidate")];
    origin.put_with_headers("/strict.bin", object.clone(), &strict);
    let cache = TempDir::new("cache-directives-dir");
    let proxy = Proxy::start(&cache_config(&origin.base_url(), cache.path(), "64MiB"));
    let only_cached = [("Cache-Control", "only-if-cached")];
    let missing = get(&proxy.url("/fresh.bin"), &only_cached);
    assert_eq!(missing.status, 504, "not stored yet");
    assert_eq!(asked(&origin), 0, "the origin is not asked");
    for path in ["/fresh.bin", "/brief.bin", "/strict.bin"] {
        assert!(get(&proxy.url(path), &[]).body == object);
    }
    assert_eq!(asked(&origin), 3);
    let stored = get(&proxy.url("/fresh.bin"), &only_cached);
    assert_eq!((stored.status, stored.header("x-rangeway-cache")), (200, Some("hit")));
    assert!(stored.body == object);
    std::thread::sleep(Duration::from_millis(1500));
    let stale = get(&proxy.url("/brief.bin"), &[("Cache-Control", "max-stale=60")]);
    assert_eq!((stale.status, stale.header("x-rangeway-cache")), (200, Some("hit")));
    assert!(stale.body == object);
    assert_eq!(asked(&origin), 0, "stale, as the request allows");
    let refused =
        get(&proxy.url("/strict.bin"), &[("Cache-Control", "max-stale=60, only-if-cached")]);
    assert_eq!(refused.status, 504, "must-revalidate: never served stale");
    let validated = get(&proxy.url("/strict.bin"), &[("Cache-Control", "max-stale=60")]);
    assert!(validated.body == object);
    assert_eq!(asked(&origin), 1, "validated first");
}
