//! AWS Signature V4 for the requests rangeway sends to an S3 upstream.
//!
//! The signature is computed over the request as it leaves rangeway — after the proxy has set its
//! own Range, If-Match and If-Range — which is why no client's signature could be passed on.
//! Only the headers S3 reads are signed (Host, the range and precondition fields, `x-amz-*`), so
//! fields a hop may rewrite (Via, X-Forwarded-*, User-Agent) cannot break it.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use http::header::{self, HeaderName};
use pingora_http::RequestHeader;

use crate::s3::credentials::S3Credentials;

/// Client `x-amz-*` request fields passed on to S3 (and signed): the ones that ask for something
/// of a read, not the ones that authenticate the client's own request.
const FORWARDED_AMZ: [&str; 3] =
    ["x-amz-checksum-mode", "x-amz-request-payer", "x-amz-expected-bucket-owner"];

/// Request fields covered by the signature besides `x-amz-*`.
const SIGNED: [HeaderName; 7] = [
    header::HOST,
    header::RANGE,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_RANGE,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
];

/// Why a request could not be signed. Never carries a key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    #[error("the request cannot be signed: {0}")]
    Signing(String),
    #[error("the request field {0} is not text, which a signature cannot cover")]
    NotText(HeaderName),
}

/// Signs requests for one S3 upstream.
pub struct Signer {
    region: String,
    /// `None`: the bucket is public and requests go unsigned.
    identity: Option<Identity>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("region", &self.region)
            .field("anonymous", &self.identity.is_none())
            .finish()
    }
}

impl Signer {
    pub fn new(region: &str, credentials: Option<&S3Credentials>) -> Self {
        let identity = credentials.map(|c| {
            Identity::from(Credentials::new(
                c.access_key_id.expose(),
                c.secret_access_key.expose(),
                c.session_token.as_ref().map(|t| t.expose().to_owned()),
                None,
                "rangeway",
            ))
        });
        Self { region: region.to_owned(), identity }
    }

    /// Makes `request` S3's: the client's own authentication fields go, and, unless the bucket is
    /// public, the request is signed for `now`. Call it last, once every signed field is set.
    pub fn sign(&self, request: &mut RequestHeader, now: SystemTime) -> Result<(), SignError> {
        let foreign: Vec<HeaderName> = request
            .headers
            .keys()
            .filter(|name| {
                name.as_str().starts_with("x-amz-") && !FORWARDED_AMZ.contains(&name.as_str())
            })
            .cloned()
            .collect();
        for name in foreign.iter().chain([&header::AUTHORIZATION]) {
            request.remove_header(name);
        }
        let Some(identity) = &self.identity else {
            return Ok(());
        };
        let mut signed = Vec::new();
        for (name, value) in &request.headers {
            if SIGNED.contains(name) || name.as_str().starts_with("x-amz-") {
                let value = value.to_str().map_err(|_| SignError::NotText(name.clone()))?;
                signed.push((name.as_str(), value));
            }
        }
        let uri = request.uri.path_and_query().map_or("/", |p| p.as_str());
        let method = request.method.as_str();
        let mut settings = SigningSettings::default();
        // The path is sent encoded once, exactly as signed (S3 neither decodes twice nor
        // normalises `.` segments in keys).
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let params = v4::SigningParams::builder()
            .identity(identity)
            .region(&self.region)
            .name("s3")
            .time(now)
            .settings(settings)
            .build()
            .map_err(|e| SignError::Signing(e.to_string()))?
            .into();
        let signable =
            SignableRequest::new(method, uri, signed.into_iter(), SignableBody::Bytes(&[]))
                .map_err(|e| SignError::Signing(e.to_string()))?;
        let (instructions, _signature) =
            sign(signable, &params).map_err(|e| SignError::Signing(e.to_string()))?.into_parts();
        let (headers, _) = instructions.into_parts();
        for field in headers {
            request
                .insert_header(field.name(), field.value())
                .map_err(|e| SignError::Signing(e.to_string()))?;
        }
        Ok(())
    }
}
