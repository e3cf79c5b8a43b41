//! Short, stable names derived from data: download ids, ETags of the `dir` origin, multipart
//! boundaries, store keys.

use aes::Aes128;
use cmac::Cmac;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::{Digest, Sha256};

use crate::values::secret::Secret;
use crate::values::small_file::read_small_file;
use crate::values::{Problem, wrong};

/// A configured download id key shorter than this could be guessed from the ids it derives.
pub const MIN_KEY_LEN: usize = 32;

/// The first `bytes` bytes (at most 32) of the SHA-256 of `parts`, as lower-case hex.
///
/// Parts are separated by a 0 byte, so `["ab", "c"]` and `["a", "bc"]` differ (parts here never
/// hold one: header values, normalised paths, fixed-width numbers); one part is hashed as it is.
pub fn fingerprint<'a>(parts: impl IntoIterator<Item = &'a [u8]>, bytes: usize) -> String {
    hex(&digest(parts), bytes)
}

/// The SHA-256 of `parts`, separated as [`fingerprint`] separates them.
pub fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> [u8; 32] {
    let mut hash = Sha256::new();
    feed(parts, |part| hash.update(part));
    hash.finalize().into()
}

/// The key held in a file (`id_key_file`): a line of printable ASCII, one trailing newline
/// allowed. Its content is never shown.
pub(crate) fn read_key_file(file: &str) -> Result<Secret, Problem> {
    let fix = "write a key of 32 or more printable characters into it, e.g. \
               `openssl rand -hex 32 > FILE`, the same file for every instance";
    // A key file larger than 4 KiB is a wrong path.
    let bytes = read_small_file(file, 4096).or_else(|problem| wrong(problem, fix))?;
    let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    if text.len() < MIN_KEY_LEN || !text.iter().all(u8::is_ascii_graphic) {
        let problem = format!(
            "{file:?} does not hold a key of {MIN_KEY_LEN} or more printable characters without spaces"
        );
        return wrong(problem, fix);
    }
    Ok(Secret::new(String::from_utf8_lossy(text).into_owned()))
}

/// A secret key for fingerprints only its holder can make: download ids derived from what a
/// client sends, which no one else must be able to compute.
///
/// The fingerprint is AES-128-CMAC (NIST SP 800-38B, RFC 4493): a 16-byte pseudo-random tag,
/// all a download id keeps. It was HMAC-SHA-256, cut to 16 bytes; a download id is derived on
/// every GET, and CMAC over an id's few dozen bytes is a few AES blocks (the CPU's AES
/// instructions) against HMAC's two SHA-256 compressions (`benches/download_id.rs` has both side by side).
#[derive(Clone)]
pub struct FingerprintKey(Cmac<Aes128>);

/// What the configured key (any length) is extracted with, HKDF-style (RFC 5869 §2.2: the
/// salt keys an HMAC-SHA-256 of the key), into the 16 bytes AES-128 takes.
const KEY_SALT: &[u8] = b"rangeway download id key";

impl FingerprintKey {
    pub fn new(key: &[u8]) -> Self {
        let mut extract = <Hmac<Sha256>>::new_from_slice(KEY_SALT)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key"));
        extract.update(key);
        let extracted = zeroize::Zeroizing::new(<[u8; 32]>::from(extract.finalize().into_bytes()));
        Self::from_aes_key(&extracted[..16])
    }

    fn from_aes_key(key: &[u8]) -> Self {
        Self(Cmac::new_from_slice(key).unwrap_or_else(|_| unreachable!("AES-128 takes 16 bytes")))
    }

    /// A random key, from the operating system's generator.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut key = zeroize::Zeroizing::new([0u8; 32]);
        getrandom::fill(key.as_mut())?;
        Ok(Self::new(key.as_ref()))
    }

    /// `prefix` and then the keyed fingerprint of `parts` (separated as [`fingerprint`]
    /// separates them), in one string; `bytes` is at most 16.
    pub fn prefixed_fingerprint<'a>(
        &self,
        prefix: &str,
        parts: impl IntoIterator<Item = &'a [u8]>,
        bytes: usize,
    ) -> String {
        // The key's schedule and subkeys are computed once; a clone starts from them.
        let mut mac = self.0.clone();
        feed(parts, |part| mac.update(part));
        let mut text = String::with_capacity(prefix.len() + 2 * bytes);
        text.push_str(prefix);
        push_hex(&mut text, &mac.finalize().into_bytes(), bytes);
        text
    }
}

impl std::fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FingerprintKey(<redacted>)")
    }
}

fn feed<'a>(parts: impl IntoIterator<Item = &'a [u8]>, mut update: impl FnMut(&[u8])) {
    for (i, part) in parts.into_iter().enumerate() {
        if i > 0 {
            update(&[0]);
        }
        update(part);
    }
}

/// The first `bytes` bytes of `digest` in lower-case hex.
pub(crate) fn hex(digest: &[u8], bytes: usize) -> String {
    let mut hex = String::with_capacity(2 * bytes);
    push_hex(&mut hex, digest, bytes);
    hex
}

fn push_hex(text: &mut String, digest: &[u8], bytes: usize) {
    // By table, not `write!`: a download id is derived on every GET, and formatting the 16
    // bytes one by one cost about as many instructions as hashing them (see docs/benchmarks.md,
    // "Instructions per request").
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in digest.iter().take(bytes) {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_kept_apart_and_lengths_hold() {
        let ab_c = fingerprint([&b"ab"[..], b"c"], 16);
        assert_ne!(ab_c, fingerprint([&b"a"[..], b"bc"], 16));
        assert_eq!(ab_c.len(), 32);
        assert_eq!(fingerprint([&b"x"[..]], 8).len(), 16);
        assert_eq!(ab_c, fingerprint([&b"ab"[..], b"c"], 16));
        // One part: SHA-256 of it, as stored keys were always named.
        assert_eq!(fingerprint([&b"abc"[..]], 16), "ba7816bf8f01cfea414140de5dae2223");
    }

    #[test]
    fn keyed_fingerprints_are_aes_cmac_and_need_the_key() {
        // RFC 4493 §4, example 2 (one block).
        let rfc = FingerprintKey::from_aes_key(&[
            0x2b, 0x7e, 0x15, 0x16, 0x28, 0xae, 0xd2, 0xa6, 0xab, 0xf7, 0x15, 0x88, 0x09, 0xcf,
            0x4f, 0x3c,
        ]);
        let block = [
            0x6b, 0xc1, 0xbe, 0xe2, 0x2e, 0x40, 0x9f, 0x96, 0xe9, 0x3d, 0x7e, 0x11, 0x73, 0x93,
            0x17, 0x2a,
        ];
        assert_eq!(
            rfc.prefixed_fingerprint("", [&block[..]], 16),
            "070a16b46b4d4144f79bdd9dd04a287c"
        );
        let key = FingerprintKey::new(b"Jefe");
        let parts = [&b"10.0.0.1"[..], b"curl/8", b"/a"];
        assert_eq!(
            key.prefixed_fingerprint("", parts, 16),
            key.prefixed_fingerprint("", parts, 16)
        );
        assert_ne!(
            key.prefixed_fingerprint("", parts, 16),
            FingerprintKey::new(b"other").prefixed_fingerprint("", parts, 16)
        );
        assert_ne!(key.prefixed_fingerprint("", parts, 16), fingerprint(parts, 16));
        let prefixed = key.prefixed_fingerprint("auto-", parts, 16);
        assert_eq!(prefixed.strip_prefix("auto-"), Some(&*key.prefixed_fingerprint("", parts, 16)));
        let generated = FingerprintKey::generate().expect("random key");
        assert_ne!(
            generated.prefixed_fingerprint("", parts, 16),
            key.prefixed_fingerprint("", parts, 16)
        );
        assert!(!format!("{key:?}").contains("Jefe"));
    }
}
