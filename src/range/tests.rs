use super::*;
use http::HeaderValue;
use std::time::Duration;

const NOW: SystemTime = SystemTime::UNIX_EPOCH;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

fn client(range: &str) -> ClientRange {
    ClientRange::from_request(&Method::GET, &headers(&[("range", range)]), &RangeLimits::default())
}

fn shape(
    range: &str,
    request: &[(&'static str, &str)],
    status: u16,
    response: &[(&'static str, &str)],
) -> Shape {
    let client = client(range);
    let sent = client.upstream_spec();
    let mut request = headers(request);
    request.insert("range", HeaderValue::from_str(range).unwrap());
    let asked = Asked {
        method: &Method::GET,
        headers: &request,
        range: &client,
        sent: sent.as_ref(),
        if_range_date_sent: false,
        part_gap: None,
        lost_sessions_since: None,
    };
    let response = headers(response);
    shape_response(&asked, status, &response, &validators(&response), NOW)
}

fn r(start: u64, end: u64) -> ByteRange {
    ByteRange::new(start, end).unwrap()
}

#[test]
fn a_matching_206_is_forwarded() {
    let got = shape(
        "bytes=0-99",
        &[],
        206,
        &[("content-range", "bytes 0-99/1000"), ("content-length", "100")],
    );
    assert_eq!(got, Shape::Forward);
}

#[test]
fn a_200_to_a_range_is_sliced() {
    let got = shape("bytes=10-19", &[], 200, &[("content-length", "1000"), ("etag", "\"a\"")]);
    assert_eq!(got, Shape::Single { range: r(10, 20), complete_len: 1000, stream_start: 0 });
    // Even when the range is the whole representation the client gets its 206.
    let got = shape("bytes=0-", &[], 200, &[("content-length", "1000")]);
    assert_eq!(got, Shape::Single { range: r(0, 1000), complete_len: 1000, stream_start: 0 });
}

#[test]
fn a_200_without_length_is_forwarded_whole() {
    let got = shape("bytes=10-19", &[], 200, &[("transfer-encoding", "chunked")]);
    assert_eq!(got, Shape::Forward);
}

#[test]
fn a_wider_206_is_trimmed() {
    let got = shape("bytes=10-19", &[], 206, &[("content-range", "bytes 0-99/1000")]);
    assert_eq!(got, Shape::Single { range: r(10, 20), complete_len: 1000, stream_start: 0 });
}

#[test]
fn a_wrong_206_is_refused() {
    let got = shape("bytes=10-19", &[], 206, &[("content-range", "bytes 15-24/1000")]);
    assert!(matches!(got, Shape::BadGateway(_)), "{got:?}");
    let got = shape("bytes=10-19", &[], 206, &[]);
    assert!(matches!(got, Shape::BadGateway(_)), "{got:?}");
    let got = shape(
        "bytes=10-19",
        &[],
        206,
        &[("content-range", "bytes 10-19/1000"), ("content-length", "5")],
    );
    assert!(matches!(got, Shape::BadGateway(_)), "{got:?}");
}

#[test]
fn an_unsolicited_206_is_refused() {
    let asked = Asked {
        method: &Method::GET,
        headers: &HeaderMap::new(),
        range: &ClientRange::Absent,
        sent: None,
        if_range_date_sent: false,
        part_gap: None,
        lost_sessions_since: None,
    };
    let response = headers(&[("content-range", "bytes 0-9/10")]);
    let got = shape_response(&asked, 206, &response, &validators(&response), NOW);
    assert!(matches!(got, Shape::BadGateway(_)), "{got:?}");
}

#[test]
fn multiple_ranges_from_a_200() {
    let got = shape("bytes=0-1,500-501", &[], 200, &[("content-length", "1000")]);
    assert_eq!(
        got,
        Shape::Multiple {
            ranges: vec![r(0, 2), r(500, 502)],
            complete_len: 1000,
            stream_start: 0,
            rest: Vec::new()
        }
    );
}

#[test]
fn unsatisfiable_against_the_real_length() {
    let got = shape("bytes=5000-", &[], 200, &[("content-length", "1000")]);
    assert_eq!(got, Shape::Unsatisfiable { complete_len: 1000 });
}

#[test]
fn if_range_mismatch_serves_the_whole() {
    let got = shape(
        "bytes=10-19",
        &[("if-range", "\"old\"")],
        200,
        &[("content-length", "1000"), ("etag", "\"new\"")],
    );
    assert_eq!(got, Shape::Forward);
    let got = shape(
        "bytes=10-19",
        &[("if-range", "\"old\"")],
        206,
        &[("content-range", "bytes 10-19/1000"), ("etag", "\"new\"")],
    );
    assert!(matches!(got, Shape::BadGateway(_)), "{got:?}");
    let got = shape(
        "bytes=10-19",
        &[("if-range", "\"same\"")],
        200,
        &[("content-length", "1000"), ("etag", "\"same\"")],
    );
    assert_eq!(got, Shape::Single { range: r(10, 20), complete_len: 1000, stream_start: 0 });
}

#[test]
fn preconditions_are_enforced_behind_a_careless_origin() {
    let got = shape(
        "bytes=0-1",
        &[("if-match", "\"x\"")],
        200,
        &[("content-length", "10"), ("etag", "\"y\"")],
    );
    assert_eq!(got, Shape::PreconditionFailed);
    let got = shape(
        "bytes=0-1",
        &[("if-none-match", "\"y\"")],
        200,
        &[("content-length", "10"), ("etag", "\"y\"")],
    );
    assert_eq!(got, Shape::NotModified);
}

#[test]
fn range_only_applies_to_get() {
    let h = headers(&[("range", "bytes=0-1")]);
    assert!(matches!(
        ClientRange::from_request(&Method::HEAD, &h, &RangeLimits::default()),
        ClientRange::Absent
    ));
}

#[test]
fn the_upstream_is_asked_for_one_covering_range() {
    assert_eq!(
        client("bytes=0-1,500-501").upstream_spec().map(|s| s.to_string()).as_deref(),
        Some("0-501")
    );
    assert_eq!(client("bytes=-5").upstream_spec().map(|s| s.to_string()).as_deref(), Some("-5"));
    assert_eq!(client("bytes=0-1,-5").upstream_spec(), None);
    assert!(client("bytes=abc").upstream_spec().is_none());
}

#[test]
fn a_resume_whose_session_may_be_lost_is_cut_only_from_an_older_version() {
    let client = client("bytes=500-");
    let request = HeaderMap::new();
    let asked = |since| Asked {
        method: &Method::GET,
        headers: &request,
        range: &client,
        sent: None,
        if_range_date_sent: false,
        part_gap: None,
        lost_sessions_since: Some(since),
    };
    let since = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let whole = |modified: Option<&str>| {
        let mut response = headers(&[("content-length", "1000")]);
        if let Some(modified) = modified {
            response.insert("last-modified", HeaderValue::from_str(modified).unwrap());
        }
        shape_response(&asked(since), 200, &response, &validators(&response), NOW)
    };
    // Last modified in 2020, before every session the store could have lost: the range is cut.
    let got = whole(Some("Wed, 01 Jan 2020 00:00:00 GMT"));
    assert!(matches!(got, Shape::Single { .. }), "{got:?}");
    // Modified since (2024), or not known: the whole object.
    assert_eq!(whole(Some("Mon, 01 Jan 2024 00:00:00 GMT")), Shape::Forward);
    assert_eq!(whole(None), Shape::Forward);
}

#[test]
fn versions_from_200_and_206() {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_LENGTH, "100".parse().unwrap());
    headers.insert(header::ETAG, "\"v1\"".parse().unwrap());
    let v = object_version(200, &headers, &validators(&headers)).unwrap();
    assert_eq!((v.size, v.etag.as_deref(), v.strong), (100, Some("\"v1\""), true));
    headers.insert(header::CONTENT_RANGE, "bytes 0-9/5000".parse().unwrap());
    headers.insert(header::ETAG, "W/\"v1\"".parse().unwrap());
    let v = object_version(206, &headers, &validators(&headers)).unwrap();
    assert_eq!((v.size, v.strong), (5000, false));
    assert!(object_version(304, &headers, &validators(&headers)).is_none());
}
