//! Key material: parsing a key file (or an environment variable holding the same text), making a
//! new key, and keeping key bytes out of memory once dropped and out of every message.

use std::fmt;
use std::io::Read as _;
use std::path::Path;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE_NO_PAD};
use base64::engine::{DecodePaddingMode, Engine};
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;
use zeroize::Zeroizing;

/// The longest key id the RFC 8188 header can carry: its length is one octet.
pub const MAX_KEY_ID_LEN: usize = 255;

/// base64url, padded or not: keys are written by hand and by tools that differ on padding.
const BASE64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A key is a line of about 30 bytes, so this is tens of thousands of keys; a larger file is a
/// wrong path (a disk image, `/dev/zero`), which would otherwise be read until memory runs out.
pub(super) const MAX_KEY_FILE_LEN: u64 = 1 << 20;

/// What a key fingerprint is derived over; changing it changes every stage identity.
const FINGERPRINT_LABEL: &[u8] = b"rangeway key id";

/// Why key material cannot be used. No variant holds or prints key bytes: messages name the line
/// and what is wrong with it, never its content.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("cannot read it: {0}")]
    Read(#[source] std::io::Error),
    #[error("it is not UTF-8 text — write one base64url key per line")]
    NotUtf8,
    #[error(
        "it is larger than {MAX_KEY_FILE_LEN} bytes, too large for a key file — check the path"
    )]
    TooLarge,
    #[error("it holds no key — write a base64url key (`rangeway keygen` makes one)")]
    Empty,
    #[error(
        "line {line}: the key is not base64url — use the characters A-Z a-z 0-9 - _, with or \
         without = padding (`rangeway keygen` makes one)"
    )]
    Base64 { line: usize },
    #[error(
        "line {line}: the key is {len} bytes — use 16 or 32 bytes of key material \
         (`rangeway keygen` makes one)"
    )]
    Length { line: usize, len: usize },
    #[error(
        "line {line}: the key id must be 1 to {MAX_KEY_ID_LEN} visible ASCII characters other \
         than '=' — write `ID=KEY`"
    )]
    KeyId { line: usize },
    #[error("line {line}: key id {id:?} is used twice — give each key its own id")]
    DuplicateId { line: usize, id: String },
    #[error(
        "line {line}: a key without an id must be the only key — write each key as `ID=KEY` to \
         hold several"
    )]
    BareAmongSeveral { line: usize },
    #[error("cannot get random bytes from the operating system: {0}")]
    Random(getrandom::Error),
}

/// Key material: 16 or 32 bytes, zeroed when dropped. Its `Debug` shows the length and the
/// fingerprint, never a key byte.
#[derive(Clone)]
pub struct Key {
    bytes: Zeroizing<Vec<u8>>,
}

impl Key {
    /// Decodes base64url key material (padded or not) of 16 or 32 bytes; `line` is for messages.
    fn decode(text: &str, line: usize) -> Result<Self, KeyError> {
        let bytes = Zeroizing::new(
            BASE64URL.decode(text.as_bytes()).map_err(|_| KeyError::Base64 { line })?,
        );
        match bytes.len() {
            16 | 32 => Ok(Self { bytes }),
            len => Err(KeyError::Length { line, len }),
        }
    }

    /// The raw key, the RFC 8188 input keying material.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A name for the key that reveals nothing about it: the first 8 bytes of
    /// HMAC-SHA-256(key, "rangeway key id"), in hex. Two keys with the same fingerprint are, in
    /// practice, the same key.
    pub fn fingerprint(&self) -> String {
        let tag = self.hmac(&[FINGERPRINT_LABEL]);
        tag[..8].iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// HMAC-SHA-256 keyed with this key over the concatenation of `parts`.
    pub(super) fn hmac(&self, parts: &[&[u8]]) -> [u8; 32] {
        hmac_sha256(&self.bytes, parts)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("len", &self.bytes.len())
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

/// HMAC-SHA-256 keyed with `key` over the concatenation of `parts`.
pub(super) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256>>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of every length"));
    parts.iter().for_each(|part| mac.update(part));
    mac.finalize().into_bytes().into()
}

/// Keys by id, in the order a key file lists them. A file of one bare key holds it under the
/// empty id, which is what an RFC 8188 header without a key id names.
#[derive(Clone, Debug)]
pub struct KeySet {
    keys: Vec<(String, Key)>,
}

impl KeySet {
    /// The key with this id (the bare key has the empty id).
    pub fn get(&self, id: &[u8]) -> Option<&Key> {
        self.keys.iter().find(|(key_id, _)| key_id.as_bytes() == id).map(|(_, key)| key)
    }

    /// The first key and its id: the one that encrypts unless another is chosen.
    pub fn first(&self) -> (&str, &Key) {
        // A KeySet is only made non-empty (`parse_key_file` refuses an empty one).
        let (id, key) = &self.keys[0];
        (id, key)
    }

    /// The ids, in file order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(id, _)| id.as_str())
    }
}

/// Parses key file text: one key per line, as `ID=KEY` (for rotation: the RFC 8188 header names
/// the id, so a decoder holding several keys picks the right one) or one bare `KEY`. KEY is
/// base64url of 16 or 32 bytes, padded or not; ID is 1 to 255 visible ASCII characters other than
/// `=`. Blank lines and lines starting with `#` are skipped; spaces around a line are ignored.
///
/// A line is `ID=KEY` when an `=` in it is followed by something other than `=`; a bare key's
/// padding `=` only ever ends it, so the two cannot be confused.
pub fn parse_key_file(text: &str) -> Result<KeySet, KeyError> {
    let mut keys: Vec<(String, Key)> = Vec::new();
    let mut bare = false;
    for (index, line) in text.lines().enumerate() {
        let line_number = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (id, material) = match line.split_once('=') {
            Some((id, material)) if !material.trim_start_matches('=').is_empty() => {
                let id = id.trim();
                let valid = !id.is_empty()
                    && id.len() <= MAX_KEY_ID_LEN
                    && id.bytes().all(|byte| byte.is_ascii_graphic());
                if !valid {
                    return Err(KeyError::KeyId { line: line_number });
                }
                (id, material.trim())
            }
            _ => ("", line),
        };
        let key = Key::decode(material, line_number)?;
        if (id.is_empty() && !keys.is_empty()) || bare {
            return Err(KeyError::BareAmongSeveral { line: line_number });
        }
        if keys.iter().any(|(known, _)| known == id) {
            return Err(KeyError::DuplicateId { line: line_number, id: id.to_owned() });
        }
        bare = id.is_empty();
        keys.push((id.to_owned(), key));
    }
    if keys.is_empty() {
        return Err(KeyError::Empty);
    }
    Ok(KeySet { keys })
}

/// Reads and parses a key file (see [`parse_key_file`]) of at most 1 MiB. Meant for
/// configuration time and CLIs: the file's text is zeroed once parsed.
pub fn read_key_file(path: &Path) -> Result<KeySet, KeyError> {
    let file = std::fs::File::open(path).map_err(KeyError::Read)?;
    // Room for the whole file up front, as `fs::read` makes: a buffer that grew would leave
    // copies of the key bytes behind, unzeroed. A pipe has no size to go by and grows anyway.
    let size = file.metadata().map_or(0, |meta| meta.len().min(MAX_KEY_FILE_LEN));
    let mut bytes = Zeroizing::new(Vec::with_capacity(usize::try_from(size).unwrap_or(0) + 1));
    // Through `take`, not trusting the size: a device or a pipe has none.
    file.take(MAX_KEY_FILE_LEN + 1).read_to_end(&mut bytes).map_err(KeyError::Read)?;
    if bytes.len() as u64 > MAX_KEY_FILE_LEN {
        return Err(KeyError::TooLarge);
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| KeyError::NotUtf8)?;
    parse_key_file(text)
}

/// A new random 16-byte key, as unpadded base64url: a line for a key file, or the value of a
/// `key_env` variable.
pub fn generate_key() -> Result<Zeroizing<String>, KeyError> {
    let mut bytes = Zeroizing::new([0u8; 16]);
    getrandom::fill(bytes.as_mut()).map_err(KeyError::Random)?;
    Ok(Zeroizing::new(URL_SAFE_NO_PAD.encode(bytes.as_ref())))
}
