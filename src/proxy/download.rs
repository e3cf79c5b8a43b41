//! Which download a request belongs to, and which object version an upstream answer is.

use std::net::IpAddr;

use crate::fingerprint::fingerprint;
use http::{HeaderMap, header};
use pingora_http::RequestHeader;
use rangeway_middleware::rfc9110::{ContentRange, EntityTag, Validators, parse_content_range};

use crate::range::{content_length, validators};
use crate::state::ObjectVersion;

/// The client's name for a download, echoed on every response.
pub const DOWNLOAD_ID: &str = "x-download-id";
/// The end of the contiguous prefix delivered so far: where a client that lost its partial file's
/// length would resume.
pub const RESUME_OFFSET: &str = "x-resume-offset";
/// Query parameter naming the download, for clients that cannot set headers.
const DOWNLOAD_ID_PARAM: &str = "download_id";
const MAX_ID_LEN: usize = 128;

/// The download id: the client's `X-Download-Id` header or `download_id` query parameter when it
/// is usable (1–128 visible ASCII characters), else one derived from what every piece of the same
/// download shares — client address, User-Agent and path — for the clients that send nothing
/// (curl -C -, wget -c, aria2c).
pub fn download_id(req: &RequestHeader, client: Option<IpAddr>, object: &str) -> String {
    let from_header = req.headers.get(DOWNLOAD_ID).map(|v| v.as_bytes().to_vec());
    let from_query = || {
        req.uri.query()?.split('&').find_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            (name == DOWNLOAD_ID_PARAM)
                .then(|| percent_encoding::percent_decode_str(value).collect::<Vec<u8>>())
        })
    };
    if let Some(id) = from_header.or_else(from_query).filter(|id| is_usable(id)) {
        // is_usable admits ASCII only.
        return String::from_utf8_lossy(&id).into_owned();
    }
    let client = client.map(|ip| ip.to_string()).unwrap_or_default();
    let agent = req.headers.get(header::USER_AGENT).map_or(&b""[..], |v| v.as_bytes());
    format!("auto-{}", fingerprint([client.as_bytes(), agent, object.as_bytes()], 16))
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
    (1..=MAX_ID_LEN).contains(&id.len()) && id.iter().all(|b| b.is_ascii_graphic())
}

/// The object version an upstream 200 or 206 describes: its validators and complete length.
pub fn object_version(status: u16, headers: &HeaderMap) -> Option<ObjectVersion> {
    let size = match status {
        200 => content_length(headers)?,
        206 => match parse_content_range(headers.get(header::CONTENT_RANGE)?.as_bytes())? {
            ContentRange::Satisfied { complete_len: Some(len), .. } => len,
            _ => return None,
        },
        _ => return None,
    };
    let Validators { etag, last_modified } = validators(headers);
    Some(ObjectVersion {
        strong: etag.as_ref().is_some_and(EntityTag::is_strong),
        etag: etag.map(|e| e.to_string()),
        size,
        last_modified: last_modified
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs()),
        content_type: headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    })
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
    fn ids_come_from_the_client_or_from_what_pieces_share() {
        let ip = Some("10.0.0.1".parse().unwrap());
        let explicit = request("/a", &[(DOWNLOAD_ID, "job-42")]);
        assert_eq!(download_id(&explicit, ip, "/a"), "job-42");
        // A space is not a usable id character: the id is derived instead.
        let query = request("/a?x=1&download_id=job%2043", &[]);
        assert!(download_id(&query, ip, "/a").starts_with("auto-"));
        let query = request("/a?download_id=job-43", &[]);
        assert_eq!(download_id(&query, ip, "/a"), "job-43");
        let curl = request("/a", &[("user-agent", "curl/8")]);
        let resumed = request("/a", &[("user-agent", "curl/8"), ("range", "bytes=5-")]);
        assert_eq!(download_id(&curl, ip, "/a"), download_id(&resumed, ip, "/a"));
        assert_ne!(download_id(&curl, ip, "/a"), download_id(&curl, ip, "/b"));
        assert_ne!(
            download_id(&curl, ip, "/a"),
            download_id(&curl, Some("10.0.0.2".parse().unwrap()), "/a")
        );
        let hostile = request("/a", &[(DOWNLOAD_ID, &"x".repeat(500))]);
        assert!(download_id(&hostile, ip, "/a").starts_with("auto-"));
    }

    #[test]
    fn the_download_id_parameter_stays_with_rangeway() {
        assert_eq!(without_download_id("a=1&download_id=x&b=2"), "a=1&b=2");
        assert_eq!(without_download_id("download_id=x"), "");
        assert_eq!(without_download_id("download_idx=1&c"), "download_idx=1&c");
    }

    #[test]
    fn versions_from_200_and_206() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "100".parse().unwrap());
        headers.insert(header::ETAG, "\"v1\"".parse().unwrap());
        let v = object_version(200, &headers).unwrap();
        assert_eq!((v.size, v.etag.as_deref(), v.strong), (100, Some("\"v1\""), true));
        headers.insert(header::CONTENT_RANGE, "bytes 0-9/5000".parse().unwrap());
        headers.insert(header::ETAG, "W/\"v1\"".parse().unwrap());
        let v = object_version(206, &headers).unwrap();
        assert_eq!((v.size, v.strong), (5000, false));
        assert!(object_version(304, &headers).is_none());
    }
}
