//! Short, stable names derived from data: download ids, ETags of the `dir` origin, multipart
//! boundaries, store keys.

use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::{Digest, Sha256};

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

/// A secret key for fingerprints only its holder can make (HMAC-SHA-256): download ids derived
/// from what a client sends, which no one else must be able to compute.
#[derive(Clone)]
pub struct FingerprintKey(Hmac<Sha256>);

impl FingerprintKey {
    pub fn new(key: &[u8]) -> Self {
        // HMAC takes a key of any length.
        Self(Hmac::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key")))
    }

    /// A random key, from the operating system's generator.
    pub fn generate() -> Result<Self, getrandom::Error> {
        let mut key = zeroize::Zeroizing::new([0u8; 32]);
        getrandom::fill(key.as_mut())?;
        Ok(Self::new(key.as_ref()))
    }

    /// As [`fingerprint`], keyed.
    pub fn fingerprint<'a>(
        &self,
        parts: impl IntoIterator<Item = &'a [u8]>,
        bytes: usize,
    ) -> String {
        self.prefixed_fingerprint("", parts, bytes)
    }

    /// `prefix` and then the keyed fingerprint, in one string.
    pub fn prefixed_fingerprint<'a>(
        &self,
        prefix: &str,
        parts: impl IntoIterator<Item = &'a [u8]>,
        bytes: usize,
    ) -> String {
        // The key's inner and outer states are computed once; a clone starts from them.
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
    // bytes one by one cost about as many instructions as hashing them (callgrind: 3.7k, 4k).
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
    fn keyed_fingerprints_are_hmac_sha256_and_need_the_key() {
        // RFC 4231, test case 2.
        let key = FingerprintKey::new(b"Jefe");
        assert_eq!(
            key.fingerprint([&b"what do ya want for nothing?"[..]], 32),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let parts = [&b"10.0.0.1"[..], b"curl/8", b"/a"];
        assert_eq!(key.fingerprint(parts, 16), key.fingerprint(parts, 16));
        assert_ne!(
            key.fingerprint(parts, 16),
            FingerprintKey::new(b"other").fingerprint(parts, 16)
        );
        assert_ne!(key.fingerprint(parts, 16), fingerprint(parts, 16));
        let generated = FingerprintKey::generate().expect("random key");
        assert_ne!(generated.fingerprint(parts, 16), key.fingerprint(parts, 16));
        assert!(!format!("{key:?}").contains("Jefe"));
    }
}
