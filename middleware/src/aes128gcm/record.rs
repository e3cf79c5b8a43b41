//! RFC 8188 itself: the header, the content-encryption key and nonce derived from the salt, and
//! sealing and opening one record. Both the stage and the [`Decryptor`](super::Decryptor) use it,
//! so the two cannot drift apart.

use aes_gcm::aead::{Nonce, Tag};
use aes_gcm::{AeadInOut as _, Aes128Gcm, KeyInit as _};
use zeroize::Zeroizing;

use super::keys::hmac_sha256;

/// Length of the salt at the start of the header.
pub(super) const SALT_LEN: usize = 16;
/// Length of the header before the key id: salt, record size (u32), key id length (u8).
pub(super) const FIXED_HEADER_LEN: usize = SALT_LEN + 4 + 1;
/// Length of the AES-GCM tag that ends every record.
pub(super) const TAG_LEN: usize = 16;
/// What a record holds beyond its data: the delimiter octet and the tag.
pub(super) const RECORD_OVERHEAD: usize = 1 + TAG_LEN;
/// Delimiter of every record but the last.
pub(super) const DELIMITER: u8 = 0x01;
/// Delimiter of the last record.
pub(super) const LAST_DELIMITER: u8 = 0x02;

const CEK_INFO: &[u8] = b"Content-Encoding: aes128gcm\x00\x01";
const NONCE_INFO: &[u8] = b"Content-Encoding: nonce\x00\x01";

/// The RFC 8188 header: `salt | rs (u32, big-endian) | idlen (u8) | keyid`.
pub(super) fn header(salt: &[u8; SALT_LEN], record_size: u32, key_id: &[u8]) -> Vec<u8> {
    let mut header = Vec::with_capacity(FIXED_HEADER_LEN + key_id.len());
    header.extend_from_slice(salt);
    header.extend_from_slice(&record_size.to_be_bytes());
    // Key ids are checked to be at most 255 bytes where they are made (`MAX_KEY_ID_LEN`).
    header.push(key_id.len() as u8);
    header.extend_from_slice(key_id);
    header
}

/// The content-encryption key and base nonce of one salt, as RFC 8188 section 2.2 and 2.3 derive
/// them with HKDF-SHA-256 (one block of expand, so one HMAC each).
pub(super) struct ContentKey {
    cipher: Aes128Gcm,
    nonce: [u8; 12],
}

impl ContentKey {
    /// Derives the key from the input keying material and the header's salt.
    pub(super) fn derive(ikm: &[u8], salt: &[u8; SALT_LEN]) -> Self {
        let prk = Zeroizing::new(hmac_sha256(salt, &[ikm]));
        let cek = Zeroizing::new(hmac_sha256(prk.as_ref(), &[CEK_INFO]));
        let nonce = hmac_sha256(prk.as_ref(), &[NONCE_INFO]);
        let mut cek16 = Zeroizing::new([0u8; 16]);
        cek16.copy_from_slice(&cek[..16]);
        let mut base = [0u8; 12];
        base.copy_from_slice(&nonce[..12]);
        Self { cipher: Aes128Gcm::new(&(*cek16).into()), nonce: base }
    }

    /// Record `sequence`'s nonce: the base nonce XOR the sequence number, big-endian in its low
    /// 96 bits (a u64 touches only the low 64).
    fn nonce(&self, sequence: u64) -> Nonce<Aes128Gcm> {
        let mut nonce = self.nonce;
        for (byte, mask) in nonce[4..].iter_mut().zip(sequence.to_be_bytes()) {
            *byte ^= mask;
        }
        nonce.into()
    }

    /// Encrypts record `sequence`'s plaintext (data and delimiter) in place, returning its tag.
    pub(super) fn seal(
        &self,
        sequence: u64,
        plaintext: &mut [u8],
    ) -> Result<Tag<Aes128Gcm>, aes_gcm::Error> {
        self.cipher.encrypt_inout_detached(&self.nonce(sequence), &[], plaintext.into())
    }

    /// Decrypts record `sequence`'s ciphertext in place, failing unless `tag` authenticates it.
    pub(super) fn open(
        &self,
        sequence: u64,
        ciphertext: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), aes_gcm::Error> {
        self.cipher.decrypt_inout_detached(
            &self.nonce(sequence),
            &[],
            ciphertext.into(),
            &(*tag).into(),
        )
    }
}
