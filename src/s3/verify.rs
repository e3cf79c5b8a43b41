//! Checking the SigV4 signature of a client's request, on routes that admit only holders of a
//! configured key (`s3_client_keys_file`).
//!
//! The request is signed again with the secret of the key the client names, over exactly the
//! fields it says it signed, at the time it says it signed; the two signatures must be equal.
//! Header signatures (what SDKs and the AWS CLI send) and presigned URLs (query-string
//! signatures: `generate_presigned_url`, `aws s3 presign`) are both accepted; what to do with an
//! expired presigned URL is the proxy's decision (a resume may be let through).

/// The query parameter that makes a request presigned.
pub const PRESIGNED_SIGNATURE: &str = "X-Amz-Signature";
/// The longest a presigned URL may be valid, as S3 allows (7 days).
const MAX_PRESIGNED_EXPIRY: u64 = 7 * 24 * 3600;

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation,
    SigningSettings, UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use http::HeaderMap;

use crate::s3::credentials::S3ClientKeys;

/// How far a client's clock may be from rangeway's, as S3 allows.
const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// Why a request was refused; each is answered 403 with S3's code for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    #[error("this route admits only requests signed with AWS Signature V4")]
    Unsigned,
    #[error("the Authorization field is not a SigV4 header signature")]
    Malformed,
    #[error("the access key is not one this route admits")]
    UnknownKey,
    #[error("the request was signed more than 15 minutes from rangeway's time")]
    Skewed,
    #[error("the signature does not match the request")]
    Mismatch,
}

impl Refusal {
    /// Its name in `rangeway_s3_clients_refused_total{reason}`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Unsigned => "unsigned",
            Self::Malformed => "malformed",
            Self::UnknownKey => "unknown_key",
            Self::Skewed => "skewed",
            Self::Mismatch => "mismatch",
        }
    }

    /// S3's error code for it, for the client's SDK.
    pub fn code(self) -> &'static str {
        match self {
            Self::Unsigned => "AccessDenied",
            Self::Malformed => "AuthorizationHeaderMalformed",
            Self::UnknownKey => "InvalidAccessKeyId",
            Self::Skewed => "RequestTimeTooSkewed",
            Self::Mismatch => "SignatureDoesNotMatch",
        }
    }
}

/// The parts of `Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…`.
struct Authorization<'a> {
    key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse_authorization(value: &str) -> Option<Authorization<'_>> {
    let rest = value.strip_prefix("AWS4-HMAC-SHA256 ")?;
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let (name, value) = part.trim().split_once('=')?;
        match name {
            "Credential" => credential = Some(value),
            "SignedHeaders" => signed = Some(value),
            "Signature" => signature = Some(value),
            _ => return None,
        }
    }
    let mut scope = credential?.split('/');
    let (key_id, date, region, service, terminator) =
        (scope.next()?, scope.next()?, scope.next()?, scope.next()?, scope.next()?);
    let signature = signature?;
    let valid = terminator == "aws4_request"
        && scope.next().is_none()
        && date.len() == 8
        && signature.len() == 64
        && signature.bytes().all(|b| b.is_ascii_hexdigit());
    valid.then(|| Authorization {
        key_id,
        date,
        region,
        service,
        signed_headers: signed.unwrap_or_default().split(';').collect(),
        signature,
    })
}

/// `YYYYMMDDTHHMMSSZ` (SigV4's `x-amz-date`) as a time.
fn parse_amz_date(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = text.get(range)?;
        digits.bytes().all(|d| d.is_ascii_digit()).then(|| digits.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
    let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).ok()?))
}

/// A genuine presigned request: until when it was valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presigned {
    /// Unix seconds: its `X-Amz-Date` plus `X-Amz-Expires`.
    pub expires: u64,
}

/// Whether `target` (path and query, as received) is presigned.
pub fn is_presigned(target: &str) -> bool {
    target
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|p| p.starts_with("X-Amz-Signature=")))
}

/// Checks a presigned request (`method`, the target as received, its header fields) against
/// `keys`: signed again with the secret of the key its `X-Amz-Credential` names, over the same
/// query (less the signature's own parameters), fields and time. Expired or not, a genuine one
/// is `Ok`; its expiry says which.
pub fn verify_presigned(
    keys: &S3ClientKeys,
    method: &str,
    target: &str,
    headers: &HeaderMap,
    now: SystemTime,
) -> Result<Presigned, Refusal> {
    let (path, query) = target.split_once('?').ok_or(Refusal::Unsigned)?;
    let (mut auth, mut rest) = (std::collections::HashMap::new(), Vec::new());
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name.starts_with("X-Amz-") && name != "X-Amz-Security-Token" {
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| Refusal::Malformed)?;
            if auth.insert(name, value.into_owned()).is_some() {
                return Err(Refusal::Malformed);
            }
        } else {
            rest.push(pair);
        }
    }
    let field = |name: &str| auth.get(name).map(String::as_str).ok_or(Refusal::Malformed);
    if field("X-Amz-Algorithm")? != "AWS4-HMAC-SHA256" || auth.len() != 6 {
        return Err(Refusal::Malformed);
    }
    let mut scope = field("X-Amz-Credential")?.split('/');
    let (Some(key_id), Some(date), Some(region), Some(service), Some("aws4_request"), None) =
        (scope.next(), scope.next(), scope.next(), scope.next(), scope.next(), scope.next())
    else {
        return Err(Refusal::Malformed);
    };
    let signature = field(PRESIGNED_SIGNATURE)?;
    let amz_date = field("X-Amz-Date")?;
    let signed_at = parse_amz_date(amz_date)
        .filter(|_| amz_date.starts_with(date))
        .ok_or(Refusal::Malformed)?;
    let lifetime = field("X-Amz-Expires")?
        .parse::<u64>()
        .ok()
        .filter(|secs| (1..=MAX_PRESIGNED_EXPIRY).contains(secs))
        .ok_or(Refusal::Malformed)?;
    if signed_at.duration_since(now).is_ok_and(|ahead| ahead > MAX_SKEW) {
        return Err(Refusal::Skewed);
    }
    let secret = keys.secret(key_id).ok_or(Refusal::UnknownKey)?;
    let signed_headers: Vec<&str> = field("X-Amz-SignedHeaders")?.split(';').collect();
    if !signed_headers.contains(&"host") {
        return Err(Refusal::Malformed);
    }
    let mut joined = Vec::with_capacity(signed_headers.len());
    for name in &signed_headers {
        let values: Vec<&str> =
            headers.get_all(*name).iter().filter_map(|v| v.to_str().ok()).collect();
        if values.is_empty() {
            return Err(Refusal::Mismatch);
        }
        joined.push((*name, values.join(",")));
    }
    let identity = Identity::from(Credentials::new(key_id, secret.expose(), None, None, "client"));
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    settings.excluded_headers = None;
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(Duration::from_secs(lifetime));
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(signed_at)
        .settings(settings)
        .build()
        .map_err(|_| Refusal::Malformed)?
        .into();
    let unsigned = match rest.is_empty() {
        true => path.to_owned(),
        false => format!("{path}?{}", rest.join("&")),
    };
    let signable = SignableRequest::new(
        method,
        &unsigned,
        joined.iter().map(|(n, v)| (*n, v.as_str())),
        SignableBody::UnsignedPayload,
    )
    .map_err(|_| Refusal::Malformed)?;
    let (instructions, _) = sign(signable, &params).map_err(|_| Refusal::Malformed)?.into_parts();
    let expected = instructions
        .params()
        .iter()
        .find(|(name, _)| *name == PRESIGNED_SIGNATURE)
        .map(|(_, value)| value.as_ref())
        .ok_or(Refusal::Malformed)?;
    if !same(expected, signature) {
        return Err(Refusal::Mismatch);
    }
    let signed = signed_at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(Presigned { expires: signed.saturating_add(lifetime) })
}

/// Whether two signatures are equal, compared in full whatever differs first, so that timing
/// says nothing of the right one.
fn same(expected: &str, given: &str) -> bool {
    expected.len() == given.len()
        && expected.bytes().zip(given.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

/// Checks the request (`method`, the target as received, its header fields) against `keys`.
pub fn verify(
    keys: &S3ClientKeys,
    method: &str,
    target: &str,
    headers: &HeaderMap,
    now: SystemTime,
) -> Result<(), Refusal> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Err(Refusal::Unsigned);
    };
    let auth = value.to_str().ok().and_then(parse_authorization).ok_or(Refusal::Malformed)?;
    let secret = keys.secret(auth.key_id).ok_or(Refusal::UnknownKey)?;
    let amz_date = headers.get("x-amz-date").and_then(|v| v.to_str().ok());
    let signed_at = amz_date.and_then(parse_amz_date).ok_or(Refusal::Malformed)?;
    if amz_date.is_some_and(|d| !d.starts_with(auth.date)) {
        return Err(Refusal::Malformed);
    }
    let skew = now.duration_since(signed_at).unwrap_or_else(|e| e.duration());
    if skew > MAX_SKEW {
        return Err(Refusal::Skewed);
    }
    if !auth.signed_headers.contains(&"host") {
        return Err(Refusal::Malformed);
    }
    // The fields as the client signed them: every value of each name, joined with ','.
    let mut joined = Vec::with_capacity(auth.signed_headers.len());
    for name in &auth.signed_headers {
        if *name == "x-amz-date" {
            continue; // the signer writes it from `signed_at`
        }
        let values: Vec<&str> =
            headers.get_all(*name).iter().filter_map(|v| v.to_str().ok()).collect();
        if values.is_empty() {
            return Err(Refusal::Mismatch);
        }
        joined.push((*name, values.join(",")));
    }
    let body = match headers.get("x-amz-content-sha256").and_then(|v| v.to_str().ok()) {
        Some("UNSIGNED-PAYLOAD") | None => SignableBody::UnsignedPayload,
        Some(hash) => SignableBody::Precomputed(hash.to_owned()),
    };
    let identity =
        Identity::from(Credentials::new(auth.key_id, secret.expose(), None, None, "client"));
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    // x-amz-content-sha256 is among the signed fields when the client sent it.
    settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    settings.excluded_headers = None;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(auth.region)
        .name(auth.service)
        .time(signed_at)
        .settings(settings)
        .build()
        .map_err(|_| Refusal::Malformed)?
        .into();
    let signable =
        SignableRequest::new(method, target, joined.iter().map(|(n, v)| (*n, v.as_str())), body)
            .map_err(|_| Refusal::Malformed)?;
    let (_, expected) = sign(signable, &params).map_err(|_| Refusal::Malformed)?.into_parts();
    if same(&expected, auth.signature) { Ok(()) } else { Err(Refusal::Mismatch) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The presigned URL of AWS's own example ("Authenticating Requests: Using Query
    /// Parameters", Signature Version 4), verified at a time it is valid and after it expired.
    #[test]
    fn the_aws_presigned_example() {
        let keys = S3ClientKeys::of(&[(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        )]);
        let target = "/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, "examplebucket.s3.amazonaws.com".parse().unwrap());
        assert!(is_presigned(target));
        let signed = parse_amz_date("20130524T000000Z").unwrap();
        let valid =
            verify_presigned(&keys, "GET", target, &headers, signed + Duration::from_secs(60));
        assert_eq!(valid, Ok(Presigned { expires: 1_369_353_600 + 86_400 }));
        // Expired or not, it is genuine; any change to it is not.
        let later = signed + Duration::from_secs(2 * 86_400);
        assert!(verify_presigned(&keys, "GET", target, &headers, later).is_ok());
        let tampered = target.replace("X-Amz-Expires=86400", "X-Amz-Expires=86401");
        assert_eq!(
            verify_presigned(&keys, "GET", &tampered, &headers, later),
            Err(Refusal::Mismatch)
        );
        assert_eq!(
            verify_presigned(&keys, "HEAD", target, &headers, later),
            Err(Refusal::Mismatch)
        );
        headers.insert(http::header::HOST, "elsewhere.example".parse().unwrap());
        assert_eq!(verify_presigned(&keys, "GET", target, &headers, later), Err(Refusal::Mismatch));
    }

    #[test]
    fn amz_dates() {
        let t = parse_amz_date("20130524T000000Z").unwrap();
        assert_eq!(t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), 1_369_353_600);
        let t = parse_amz_date("20261130T083015Z").unwrap();
        assert_eq!(t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), 1_796_027_415);
        for bad in ["2013052T000000Z", "20131324T000000Z", "20130524 000000Z", "2013-5-24T00000Z"] {
            assert_eq!(parse_amz_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn authorization_fields() {
        let sig = "a".repeat(64);
        let value = format!(
            "AWS4-HMAC-SHA256 Credential=AKID/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-date, Signature={sig}"
        );
        let auth = parse_authorization(&value).unwrap();
        assert_eq!(
            (auth.key_id, auth.date, auth.region, auth.service),
            ("AKID", "20130524", "us-east-1", "s3")
        );
        assert_eq!(auth.signed_headers, ["host", "range", "x-amz-date"]);
        assert!(parse_authorization("AWS AKID:sig").is_none());
        assert!(parse_authorization(&value.replace("aws4_request", "x")).is_none());
        assert!(parse_authorization(&value.replace(&sig, "zz")).is_none());
    }
}
