//! Checking the SigV4 signature of a client's request, on routes that admit only holders of a
//! configured key (`s3_client_keys_file`).
//!
//! The request is signed again with the secret of the key the client names, over exactly the
//! fields it says it signed, at the time it says it signed; the two signatures must be equal.
//! Only header signatures (what SDKs and the AWS CLI send) are accepted, not presigned URLs.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use http::HeaderMap;

use crate::config::S3ClientKeys;

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
    // Compared in full whatever differs first, so timing says nothing of the right signature.
    let same = expected.len() == auth.signature.len()
        && expected.bytes().zip(auth.signature.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
    if same { Ok(()) } else { Err(Refusal::Mismatch) }
}

#[cfg(test)]
mod tests {
    use super::*;

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
