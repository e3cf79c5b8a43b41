//! S3's error answers, made plain for clients and actionable for operators.
//!
//! S3 says what went wrong in an XML body (`<Error><Code>NoSuchKey</Code>…`), after a status that
//! is often not enough: a 403 is the object's policy, rangeway's key, or rangeway's clock. The
//! client's status is decided from S3's status (it goes out before the body); the text the client
//! reads and the line the operator reads come from the code.

use http::StatusCode;

/// At most this much of an error body is kept to find its code; S3's are well under 1 KiB.
pub const MAX_ERROR_BODY: usize = 16 << 10;

/// The status a client gets for S3's `upstream` status, when rangeway rewrites it: `None` for
/// successes and for the answers the range engine handles itself (304, 412, 416).
///
/// A missing object or a refusal keeps its status; throttling stays 503 (with `Retry-After`);
/// anything else — a request S3 found malformed, a redirect to another region, a failure of S3's
/// own — is a 502: the request S3 saw was rangeway's, not the client's.
pub fn client_status(upstream: u16) -> Option<StatusCode> {
    match upstream {
        200..=299 | 304 | 412 | 416 => None,
        403 => Some(StatusCode::FORBIDDEN),
        404 => Some(StatusCode::NOT_FOUND),
        429 | 503 => Some(StatusCode::SERVICE_UNAVAILABLE),
        _ => Some(StatusCode::BAD_GATEWAY),
    }
}

/// The `<Code>` and `<Message>` of an S3 error document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorDocument<'a> {
    pub code: &'a str,
    pub message: &'a str,
}

/// Finds the code (and message) in an error body. Not an XML parser: S3's error documents are
/// flat, and anything else simply has no code.
pub fn parse(body: &[u8]) -> Option<ErrorDocument<'_>> {
    let text = std::str::from_utf8(body).ok()?;
    let element = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let len = text[start..].find('<')?;
        Some(&text[start..start + len])
    };
    let code = element("Code").filter(|c| {
        !c.is_empty() && c.len() <= 64 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
    })?;
    Some(ErrorDocument { code, message: element("Message").unwrap_or_default() })
}

/// What an S3 error means, for the client and for whoever runs rangeway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// The client's body: one line, naming S3's code when there is one.
    pub client: String,
    /// The same for a client that speaks S3 (an SDK reads the code to raise `NoSuchKey`):
    /// an S3 error document with S3's code, or the nearest one for the status.
    pub client_xml: String,
    /// What the operator should fix, when the error is rangeway's configuration's or machine's
    /// rather than the object's.
    pub operator: Option<&'static str>,
}

/// Explains an error answer with `status` (the client's) and S3's `code`, if the body had one.
pub fn explain(status: StatusCode, code: Option<&str>) -> Explanation {
    let (what, operator) = match code.unwrap_or_default() {
        "NoSuchKey" => ("no such object", None),
        "NoSuchBucket" => (
            "the store has no such bucket",
            Some("check the upstream's bucket = (and url): the store does not know that bucket"),
        ),
        "AccessDenied" => (
            "the store denies access to this object",
            Some(
                "if every object is denied, check that the upstream's credentials may \
                  s3:GetObject on the bucket",
            ),
        ),
        "InvalidAccessKeyId" => (
            "the store does not accept rangeway's credentials",
            Some("the store does not know the upstream's access key id: check its credentials"),
        ),
        "SignatureDoesNotMatch" => (
            "the store does not accept rangeway's credentials",
            Some("the upstream's secret key (or region) is wrong: check its credentials"),
        ),
        "RequestTimeTooSkewed" => (
            "the store refused the request: rangeway's clock is off",
            Some("rangeway's clock is more than 15 minutes off the store's: synchronise it (NTP)"),
        ),
        "AuthorizationHeaderMalformed" => (
            "the store refused rangeway's signature",
            Some("the upstream's region is wrong: set region = to the bucket's region"),
        ),
        "ExpiredToken" | "TokenRefreshRequired" | "InvalidToken" => (
            "the store does not accept rangeway's credentials",
            Some("the upstream's session token is expired or invalid: renew its credentials"),
        ),
        "PermanentRedirect" | "TemporaryRedirect" | "IllegalLocationConstraintException" => (
            "the bucket is served elsewhere",
            Some("the bucket is in another region or at another endpoint: check url and region"),
        ),
        "SlowDown" | "ServiceUnavailable" | "RequestLimitExceeded" => {
            ("the store asks for fewer requests; retry shortly", None)
        }
        "InternalError" => ("the store failed; retry", None),
        "InvalidObjectState" => ("the object is archived and cannot be read now", None),
        _ => match status {
            StatusCode::NOT_FOUND => ("no such object", None),
            StatusCode::FORBIDDEN => ("the store denies access", None),
            StatusCode::SERVICE_UNAVAILABLE => ("the store is unavailable; retry shortly", None),
            _ => ("the store could not answer", None),
        },
    };
    let reason = status.canonical_reason().unwrap_or("Error");
    let client = match code {
        Some(code) => format!("{} {reason}: {what} (S3 {code})\n", status.as_u16()),
        None => format!("{} {reason}: {what}\n", status.as_u16()),
    };
    let xml_code = code.unwrap_or(match status {
        StatusCode::NOT_FOUND => "NoSuchKey",
        StatusCode::FORBIDDEN => "AccessDenied",
        StatusCode::SERVICE_UNAVAILABLE => "SlowDown",
        _ => "InternalError",
    });
    Explanation { client, client_xml: document(xml_code, what), operator }
}

/// An S3 error document. `code` and `message` are rangeway's own text (or a code `parse`
/// accepted), which needs no escaping.
pub fn document(code: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>{message}</Message></Error>\n"
    )
}

/// Whether a request comes from an S3 client (an SDK, the AWS CLI), which reads errors as S3
/// error documents: it signs, or sends the fields only SDKs send.
pub fn speaks_s3(request: &http::HeaderMap) -> bool {
    request
        .get(http::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes().starts_with(b"AWS4-HMAC-SHA256 "))
        || request.contains_key("x-amz-content-sha256")
        || request.contains_key("x-amz-date")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages_are_found() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match</Message><AWSAccessKeyId>AKIDEXAMPLE</AWSAccessKeyId><StringToSign>x</StringToSign></Error>"#;
        let doc = parse(body).expect("a code");
        assert_eq!(doc.code, "SignatureDoesNotMatch");
        assert!(doc.message.starts_with("The request signature"));
        assert_eq!(parse(b"<Error><Code></Code></Error>"), None);
        assert_eq!(parse(b"<html>502</html>"), None);
        assert_eq!(parse(b"<Code>a b</Code>"), None, "not a code S3 writes");
        assert_eq!(parse(&[0xff, 0xfe]), None);
    }

    #[test]
    fn statuses() {
        assert_eq!(client_status(200), None);
        assert_eq!(client_status(206), None);
        assert_eq!(client_status(304), None);
        assert_eq!(client_status(412), None);
        assert_eq!(client_status(416), None);
        assert_eq!(client_status(404), Some(StatusCode::NOT_FOUND));
        assert_eq!(client_status(403), Some(StatusCode::FORBIDDEN));
        assert_eq!(client_status(503), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(client_status(400), Some(StatusCode::BAD_GATEWAY));
        assert_eq!(client_status(301), Some(StatusCode::BAD_GATEWAY));
        assert_eq!(client_status(500), Some(StatusCode::BAD_GATEWAY));
    }

    #[test]
    fn explanations_name_the_code_and_the_fix() {
        let e = explain(StatusCode::NOT_FOUND, Some("NoSuchKey"));
        assert_eq!(e.client, "404 Not Found: no such object (S3 NoSuchKey)\n");
        assert_eq!(e.operator, None);
        let e = explain(StatusCode::FORBIDDEN, Some("RequestTimeTooSkewed"));
        assert!(e.client.contains("clock"), "{}", e.client);
        assert!(e.operator.is_some_and(|fix| fix.contains("NTP")));
        let e = explain(StatusCode::FORBIDDEN, Some("SignatureDoesNotMatch"));
        assert!(e.operator.is_some_and(|fix| fix.contains("secret key")));
        let e = explain(StatusCode::FORBIDDEN, None);
        assert_eq!(e.client, "403 Forbidden: the store denies access\n");
        assert_eq!(parse(e.client_xml.as_bytes()).map(|d| d.code), Some("AccessDenied"));
        let e = explain(StatusCode::NOT_FOUND, Some("NoSuchKey"));
        assert_eq!(
            parse(e.client_xml.as_bytes()),
            Some(ErrorDocument { code: "NoSuchKey", message: "no such object" })
        );
    }
}
