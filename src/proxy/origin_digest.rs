//! An upstream body checked against the digest its origin published for it (`Repr-Digest`, S3's
//! `x-amz-checksum-sha256` or `-crc32`): a body that does not match is cut before its last bytes
//! go out, so that the client sees a cut download to resume, never a complete wrong one.

use http::HeaderName;
use rangeway_middleware::checksum::parse_repr_digest_sha256;

const REPR_DIGEST: HeaderName = HeaderName::from_static("repr-digest");
const AMZ_SHA256: HeaderName = HeaderName::from_static("x-amz-checksum-sha256");
const AMZ_CRC32: HeaderName = HeaderName::from_static("x-amz-checksum-crc32");

/// The error of a body that fails the digest its origin published.
pub(super) const ORIGIN_DIGEST_MISMATCH: &str = "OriginDigestMismatch";

/// A full pass of an upstream body checked against the digest its origin published for it.
#[derive(Debug)]
pub(super) struct OriginDigestCheck {
    expected: OriginDigest,
    /// Body bytes still to come; the check is made on the chunk that brings it to zero, before
    /// that chunk goes out (the end-of-body flag may come only with a later, empty call).
    remaining: u64,
}

/// A digest an origin publishes, with the hash running over the body.
#[derive(Debug)]
pub(super) enum OriginDigest {
    Sha256 { expected: [u8; 32], hasher: sha2::Sha256 },
    Crc32 { expected: u32, hasher: crc32fast::Hasher },
}

impl OriginDigestCheck {
    /// For a 200 whose origin states the SHA-256 of its bytes (`Repr-Digest`, or S3's
    /// `x-amz-checksum-sha256` when it is a whole-object checksum), else their CRC32 (S3's
    /// `x-amz-checksum-crc32`), and their length. `Content-MD5` is deprecated and ignored.
    pub(super) fn for_response(headers: &http::HeaderMap) -> Option<Self> {
        use base64::Engine as _;
        // Most answers state none: one pass over their few names says so for less than the
        // three lookups, which each hash a name.
        let digest_names = [REPR_DIGEST, AMZ_SHA256, AMZ_CRC32];
        if !headers.keys().any(|name| digest_names.contains(name)) {
            return None;
        }
        // "…-N" is a checksum of part checksums (multipart upload), not of the bytes.
        let s3 = |name: HeaderName| {
            let value = headers.get(name)?.to_str().ok()?;
            if value.contains('-') {
                return None;
            }
            base64::engine::general_purpose::STANDARD.decode(value).ok()
        };
        let expected = parse_repr_digest_sha256(
            headers.get_all(REPR_DIGEST).iter().map(http::HeaderValue::as_bytes),
        )
        .or_else(|| s3(AMZ_SHA256)?.try_into().ok())
        .map(|expected| OriginDigest::Sha256 { expected, hasher: sha2::Digest::new() })
        .or_else(|| {
            let crc: [u8; 4] = s3(AMZ_CRC32)?.try_into().ok()?;
            let expected = u32::from_be_bytes(crc);
            Some(OriginDigest::Crc32 { expected, hasher: crc32fast::Hasher::new() })
        })?;
        let remaining = crate::range::content_length(headers)?;
        Some(Self { expected, remaining })
    }

    /// Hashes `chunk`; `Err` when it completes the body and the digest does not match.
    pub(super) fn check(&mut self, chunk: &[u8]) -> std::result::Result<(), ()> {
        use sha2::Digest as _;
        match &mut self.expected {
            OriginDigest::Sha256 { hasher, .. } => hasher.update(chunk),
            OriginDigest::Crc32 { hasher, .. } => hasher.update(chunk),
        }
        self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
        if self.remaining > 0 {
            return Ok(());
        }
        let matches = match &mut self.expected {
            OriginDigest::Sha256 { expected, hasher } => {
                let got: [u8; 32] = std::mem::take(hasher).finalize().into();
                got == *expected
            }
            OriginDigest::Crc32 { expected, hasher } => {
                std::mem::take(hasher).finalize() == *expected
            }
        };
        if matches { Ok(()) } else { Err(()) }
    }
}
