//! Which download a request belongs to: its id, and what its client holds of a version.

use http::{HeaderMap, header};
use pingora_http::RequestHeader;
use rangeway_middleware::rfc9110::{EntityTag, RangeSet, RangeSpec, Validators};

use crate::fingerprint::FingerprintKey;
use crate::range::ClientRange;
use crate::request_path::NormalizedPath;
use crate::state::{Holding, ObjectVersion};

/// The client's name for a download, echoed on every response.
pub const DOWNLOAD_ID: &str = "x-download-id";
/// The same, for lookups: a `HeaderName` is hashed as it is, a `&str` parsed first.
const DOWNLOAD_ID_NAME: http::HeaderName = http::HeaderName::from_static(DOWNLOAD_ID);
/// The end of the contiguous prefix of this version written to this download's connections so
/// far. An upper bound of what a client holds (it may not have read all that was written), never
/// an offset to resume from in place of the client's own.
pub const SENT_PREFIX: &str = "x-sent-prefix";
/// Query parameter naming the download, for clients that cannot set headers.
const DOWNLOAD_ID_PARAM: &str = "download_id";
const MAX_ID_LEN: usize = 128;
/// Derived ids begin with this; a client's id that does is not taken (see [`download_id`]).
const DERIVED: &str = "auto-";

/// The download id and whether rangeway derived it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadId {
    pub id: String,
    pub derived: bool,
}

/// The download id: the client's `X-Download-Id` header or `download_id` query parameter when it
/// is usable (1–128 visible ASCII characters, not in the `auto-` namespace), else one derived from
/// what every piece of the same download shares — client address, User-Agent and path — for the
/// clients that send nothing (curl -C -, wget -c, aria2c).
///
/// A derived id is keyed with `key` (HMAC), so no one without the key can compute another
/// client's id, and a client cannot name one: `auto-` ids are rangeway's own, and one a client
/// sends — its own echoed back, or anyone's — is replaced by the id derived for the request.
///
/// `client` is the client's IP address as text (see `Identified::client_ip`).
pub fn download_id(
    req: &RequestHeader,
    client: Option<&str>,
    object: &str,
    key: &FingerprintKey,
) -> DownloadId {
    let from_header = req.headers.get(DOWNLOAD_ID_NAME).map(|v| v.as_bytes().to_vec());
    let from_query = || {
        req.uri.query()?.split('&').find_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            (name == DOWNLOAD_ID_PARAM)
                .then(|| percent_encoding::percent_decode_str(value).collect::<Vec<u8>>())
        })
    };
    if let Some(id) = from_header.or_else(from_query).filter(|id| is_usable(id)) {
        // is_usable admits ASCII only.
        return DownloadId { id: String::from_utf8_lossy(&id).into_owned(), derived: false };
    }
    let client = client.unwrap_or_default().as_bytes();
    let agent = req.headers.get(header::USER_AGENT).map_or(&b""[..], |v| v.as_bytes());
    let id = key.prefixed_fingerprint(DERIVED, [client, agent, object.as_bytes()], 16);
    DownloadId { id, derived: true }
}

/// The object a download is of: the route, the decoded path and, where the route serves a
/// content coding, the coding — another representation, with downloads of its own.
pub fn object_key(route: &str, path: &NormalizedPath, coding: Option<&str>) -> String {
    let coding_len = coding.map_or(0, |coding| coding.len() + 1);
    let mut key = String::with_capacity(route.len() + 1 + path.written_len() + coding_len);
    key.push_str(route);
    key.push('|');
    // Writing onto a String cannot fail.
    let _ = path.write_to(&mut key);
    if let Some(coding) = coding {
        key.push('|');
        key.push_str(coding);
    }
    key
}

/// What a bare resume asking for `ranges` says its client holds: a client that only ever resumes
/// where its file ends, asking for the rest, holds the bytes before it; any other, pieces.
pub fn holding(req: &RequestHeader, ranges: &RangeSet) -> Holding {
    match ranges.specs() {
        [RangeSpec::From { first }] if resumes_a_prefix(&req.headers) => Holding::Prefix(*first),
        [RangeSpec::From { first } | RangeSpec::Closed { first, .. }] => {
            Holding::Pieces(Some(*first))
        }
        _ => Holding::Pieces(None),
    }
}

/// Whether a range request asks for anything but one range from byte 0: a client asking for
/// bytes past the start may be continuing something it began.
pub fn continues_past_start(range: &ClientRange) -> bool {
    match range {
        ClientRange::Bytes(set) => !matches!(
            set.specs(),
            [RangeSpec::From { first: 0 } | RangeSpec::Closed { first: 0, .. }]
        ),
        _ => false,
    }
}

/// Whether the client is one that resumes only at the end of its file (`bytes=N-`, N its
/// length), as `curl -C -` and `wget -c` do; told by its User-Agent's product (RFC 9110
/// §10.1.5), which the derived id includes, so that every client under one derived id is the
/// same program. Clients that download in pieces (aria2c, browsers, SDKs) are not.
fn resumes_a_prefix(headers: &HeaderMap) -> bool {
    let product = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.as_bytes().split(|b| *b == b'/' || b.is_ascii_whitespace()).next())
        .unwrap_or_default();
    [&b"curl"[..], b"Wget"].iter().any(|name| product.eq_ignore_ascii_case(name))
}

/// The query without rangeway's own `download_id` parameter: it names the download to rangeway
/// and would only disturb the origin (a signed URL's signature covers its query).
pub fn without_download_id(query: &str) -> String {
    query
        .split('&')
        .filter(|pair| pair.split_once('=').map_or(*pair, |(name, _)| name) != DOWNLOAD_ID_PARAM)
        .collect::<Vec<_>>()
        .join("&")
}

fn is_usable(id: &[u8]) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
        && id.iter().all(|b| b.is_ascii_graphic())
        && !id.starts_with(DERIVED.as_bytes())
}

/// The validators of a version as rangeway recorded it.
pub fn validators_of(version: &ObjectVersion) -> Validators {
    Validators {
        etag: version.etag.as_deref().and_then(|etag| EntityTag::parse(etag.as_bytes())),
        last_modified: version
            .last_modified
            .map(|secs| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(target: &str, headers: &[(&'static str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", target.as_bytes(), None).unwrap();
        for (name, value) in headers {
            req.insert_header(*name, *value).unwrap();
        }
        req
    }

    #[test]
    fn object_keys_name_the_route_the_decoded_path_and_a_coding() {
        let path = |raw| NormalizedPath::parse(raw).unwrap();
        assert_eq!(object_key("files", &path("/a%20b/c.bin"), None), "files|/a b/c.bin");
        assert_eq!(object_key("files", &path("/dir/"), Some("gzip")), "files|/dir/|gzip");
        assert_eq!(object_key("r", &path("/"), None), "r|/");
        assert_eq!(object_key("r", &path("/x/./y//"), None), "r|/x/y/");
        // Sized exactly: the key is made on every GET.
        for raw in ["/", "/a", "/a/", "/a%20b/c.bin", "/x/./y//"] {
            let path = path(raw);
            assert_eq!(path.written_len(), path.to_string().len(), "{raw}");
        }
    }

    #[test]
    fn ids_come_from_the_client_or_from_what_pieces_share() {
        let key = FingerprintKey::new(b"a key of the tests' own");
        let ip = Some("10.0.0.1");
        let id = |req: &RequestHeader, ip: Option<&str>, object: &str| {
            download_id(req, ip, object, &key).id
        };
        let explicit = request("/a", &[(DOWNLOAD_ID, "job-42")]);
        assert_eq!(
            download_id(&explicit, ip, "/a", &key),
            DownloadId { id: "job-42".into(), derived: false }
        );
        // A space is not a usable id character: the id is derived instead.
        let query = request("/a?x=1&download_id=job%2043", &[]);
        assert!(download_id(&query, ip, "/a", &key).derived);
        let query = request("/a?download_id=job-43", &[]);
        assert_eq!(id(&query, ip, "/a"), "job-43");
        let curl = request("/a", &[("user-agent", "curl/8")]);
        let resumed = request("/a", &[("user-agent", "curl/8"), ("range", "bytes=5-")]);
        assert_eq!(id(&curl, ip, "/a"), id(&resumed, ip, "/a"));
        assert_ne!(id(&curl, ip, "/a"), id(&curl, ip, "/b"));
        assert_ne!(id(&curl, ip, "/a"), id(&curl, Some("10.0.0.2"), "/a"));
        let hostile = request("/a", &[(DOWNLOAD_ID, &"x".repeat(500))]);
        assert!(id(&hostile, ip, "/a").starts_with("auto-"));
        // Keyed: another key derives other ids, and the plain hash of the parts is not one.
        let other = FingerprintKey::new(b"another deployment's key");
        assert_ne!(download_id(&curl, ip, "/a", &other).id, id(&curl, ip, "/a"));
        assert!(
            !id(&curl, ip, "/a").contains(&crate::fingerprint::fingerprint(
                [&b"10.0.0.1"[..], b"curl/8", b"/a"],
                16
            ))
        );
    }

    #[test]
    fn derived_ids_cannot_be_named_by_clients() {
        let key = FingerprintKey::new(b"a key of the tests' own");
        let ip = Some("10.0.0.1");
        let victim = request("/a", &[("user-agent", "curl/8")]);
        let victims = download_id(&victim, ip, "/a", &key).id;
        // Another client naming the victim's id (as a header or a parameter) gets its own.
        let attacker_ip = Some("10.6.6.6");
        for forged in [
            request("/a", &[("user-agent", "curl/8"), (DOWNLOAD_ID, &victims)]),
            request(&format!("/a?download_id={victims}"), &[("user-agent", "curl/8")]),
        ] {
            let got = download_id(&forged, attacker_ip, "/a", &key);
            assert!(got.derived);
            assert_ne!(got.id, victims);
        }
        // The victim echoing its own id back keeps it.
        let echoed = request("/a", &[("user-agent", "curl/8"), (DOWNLOAD_ID, &victims)]);
        assert_eq!(download_id(&echoed, ip, "/a", &key).id, victims);
    }

    #[test]
    fn a_resume_says_what_its_client_holds() {
        let set = |value: &str| match rangeway_middleware::rfc9110::parse_range(
            value.as_bytes(),
            &Default::default(),
        ) {
            rangeway_middleware::rfc9110::RangeRequest::Bytes(set) => set,
            other => panic!("{other:?}"),
        };
        let curl = request("/a", &[("user-agent", "curl/8.5.0")]);
        let wget = request("/a", &[("user-agent", "Wget/1.21.3")]);
        let aria = request("/a", &[("user-agent", "aria2/1.36.0")]);
        let none = request("/a", &[]);
        assert_eq!(holding(&curl, &set("bytes=100-")), Holding::Prefix(100));
        assert_eq!(holding(&wget, &set("bytes=100-")), Holding::Prefix(100));
        assert_eq!(holding(&curl, &set("bytes=100-200")), Holding::Pieces(Some(100)));
        assert_eq!(holding(&aria, &set("bytes=100-")), Holding::Pieces(Some(100)));
        assert_eq!(holding(&none, &set("bytes=100-")), Holding::Pieces(Some(100)));
        assert_eq!(holding(&curl, &set("bytes=-100")), Holding::Pieces(None));
        assert_eq!(holding(&curl, &set("bytes=0-1,5-")), Holding::Pieces(None));
        let lookalike = request("/a", &[("user-agent", "curly/1")]);
        assert_eq!(holding(&lookalike, &set("bytes=100-")), Holding::Pieces(Some(100)));
    }

    #[test]
    fn the_download_id_parameter_stays_with_rangeway() {
        assert_eq!(without_download_id("a=1&download_id=x&b=2"), "a=1&b=2");
        assert_eq!(without_download_id("download_id=x"), "");
        assert_eq!(without_download_id("download_idx=1&c"), "download_idx=1&c");
    }
}
