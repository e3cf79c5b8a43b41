//! The proxy's side of S3 upstreams: which parts of a client's query reach S3, and S3's error
//! answers turned into plain ones.

use bytes::Bytes;
use http::{StatusCode, header};
use pingora_error::Result;
use pingora_http::ResponseHeader;
use tracing::warn;

use crate::s3::error::{self, MAX_ERROR_BODY};

/// The query parameters of a GetObject/HeadObject that choose what is read, and — where the
/// route allows them (`overrides`) — the `response-*` ones that set the answer's headers.
/// Everything else — a client's presigned-URL signature, SDK markers such as `x-id`,
/// `partNumber` (which would change what a Range means) — stays with rangeway.
fn forwarded_parameter(name: &str, overrides: bool) -> bool {
    name == "versionId" || (overrides && name.starts_with("response-"))
}

/// The part of a client's query sent to S3 (still encoded as the client wrote it; the signer
/// canonicalises it).
pub(super) fn upstream_query(query: &str, overrides: bool) -> String {
    query
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(name, _)| name);
            forwarded_parameter(name, overrides)
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// An S3 error answer on its way to the client: S3's XML is read for its code, and replaced by a
/// line of text.
#[derive(Debug)]
pub(super) struct ErrorBody {
    status: StatusCode,
    /// The client speaks S3: answer with an S3 error document rather than text.
    xml: bool,
    kept: Vec<u8>,
}

impl ErrorBody {
    /// Turns `response`, an S3 error, into the client's `status` with a body to come: text, or
    /// an S3 error document for a client that speaks S3 (`xml`).
    pub(super) fn start(
        response: &mut ResponseHeader,
        status: StatusCode,
        xml: bool,
    ) -> Result<Self> {
        response.set_status(status)?;
        for name in [
            header::CONTENT_LENGTH,
            header::CONTENT_RANGE,
            header::ETAG,
            header::LAST_MODIFIED,
            header::ACCEPT_RANGES,
            header::CONTENT_ENCODING,
        ] {
            response.remove_header(&name);
        }
        let media_type = if xml { "application/xml" } else { "text/plain; charset=utf-8" };
        response.insert_header(header::CONTENT_TYPE, media_type)?;
        response.insert_header(header::TRANSFER_ENCODING, "chunked")?;
        if status == StatusCode::SERVICE_UNAVAILABLE
            && !response.headers.contains_key(header::RETRY_AFTER)
        {
            response.insert_header(header::RETRY_AFTER, "1")?;
        }
        Ok(Self { status, xml, kept: Vec::new() })
    }

    /// Keeps what fits of S3's body.
    pub(super) fn push(&mut self, chunk: &[u8]) {
        let room = MAX_ERROR_BODY.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    /// The client's body, once S3's is read; the operator hears of errors that are theirs to
    /// fix. Returns the code too, for the access log.
    pub(super) fn finish(&self, route: &str, upstream: &str) -> (Bytes, Option<String>) {
        let document = error::parse(&self.kept);
        let explanation = error::explain(self.status, document.map(|d| d.code));
        if let Some(fix) = explanation.operator {
            let (code, message) = document.map_or(("-", ""), |d| (d.code, d.message));
            // S3's message is the store's own prose (never a key); capped, as it is not ours.
            let message: String = message.chars().take(200).collect();
            warn!(
                route,
                upstream,
                code,
                store_message = message,
                "the S3 upstream refused rangeway's request: {fix}"
            );
        }
        let body = if self.xml { explanation.client_xml } else { explanation.client };
        (Bytes::from(body), document.map(|d| d.code.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_parameters_reach_s3() {
        assert_eq!(upstream_query("versionId=3&x-id=GetObject", false), "versionId=3");
        let presigned =
            "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab&response-content-type=a%2Fb";
        // The headers of the answer are the operator's to let clients choose, not anyone's.
        assert_eq!(upstream_query(presigned, false), "");
        assert_eq!(upstream_query(presigned, true), "response-content-type=a%2Fb");
        assert_eq!(upstream_query("partNumber=2&uploadId=x", true), "");
        assert_eq!(upstream_query("versionId", false), "versionId");
    }

    #[test]
    fn the_error_body_is_replaced_by_its_explanation() {
        let mut response = ResponseHeader::build(404, None).unwrap();
        response.insert_header(header::CONTENT_LENGTH, 120).unwrap();
        response.insert_header(header::CONTENT_TYPE, "application/xml").unwrap();
        let mut body = ErrorBody::start(&mut response, StatusCode::NOT_FOUND, false).unwrap();
        assert!(response.headers.get(header::CONTENT_LENGTH).is_none());
        body.push(b"<Error><Code>NoSuch");
        body.push(b"Key</Code><Message>The specified key does not exist.</Message></Error>");
        let (text, code) = body.finish("/s3/", "store");
        assert_eq!(&text[..], b"404 Not Found: no such object (S3 NoSuchKey)\n");
        assert_eq!(code.as_deref(), Some("NoSuchKey"));

        let mut response = ResponseHeader::build(503, None).unwrap();
        let mut body =
            ErrorBody::start(&mut response, StatusCode::SERVICE_UNAVAILABLE, true).unwrap();
        assert_eq!(response.headers.get(header::RETRY_AFTER).unwrap(), "1");
        assert_eq!(response.headers.get(header::CONTENT_TYPE).unwrap(), "application/xml");
        body.push(&vec![b'x'; 2 * MAX_ERROR_BODY]);
        assert_eq!(body.kept.len(), MAX_ERROR_BODY);
        let (xml, code) = body.finish("/s3/", "store");
        assert_eq!(code, None);
        assert!(xml.starts_with(b"<?xml") && xml.windows(15).any(|w| w == b"<Code>SlowDown<"));
    }
}
