//! A streaming RFC 8188 `aes128gcm` decoder, for `rangeway decrypt` and for tests: ciphertext
//! chunks in, authenticated plaintext out, in the memory of one record.

use super::keys::KeySet;
use super::record::{
    ContentKey, DELIMITER, FIXED_HEADER_LEN, LAST_DELIMITER, RECORD_OVERHEAD, SALT_LEN, TAG_LEN,
};
use super::{MAX_RECORD_SIZE, MIN_RECORD_SIZE};

/// Why a stream does not decrypt. No variant holds key material; a key id is public (the header
/// carries it in the clear).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecryptError {
    #[error(
        "the header's record size {0} is not between {MIN_RECORD_SIZE} and {MAX_RECORD_SIZE}, \
         the sizes this decoder reads"
    )]
    RecordSize(u32),
    #[error("no key has id \"{0}\", which the header names — add it to the key file as `ID=KEY`")]
    UnknownKeyId(String),
    #[error(
        "record {record} does not authenticate: the key is wrong, or bytes were changed, dropped \
         or reordered"
    )]
    Authentication { record: u64 },
    #[error("record {record} has no delimiter after its data (0x01, or 0x02 for the last record)")]
    Delimiter { record: u64 },
    #[error("the stream ends inside its header: it was truncated")]
    TruncatedHeader,
    #[error(
        "the stream ends after {records} records without the last one (delimiter 0x02): it was \
         truncated"
    )]
    Truncated { records: u64 },
    #[error("bytes follow the last record")]
    TrailingData,
    #[error("the stream already failed to decrypt")]
    Failed,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Header,
    Records,
    Done,
    Failed,
}

/// Decrypts one `aes128gcm` stream: [`push`](Self::push) ciphertext as it comes, then
/// [`finish`](Self::finish). Only authenticated plaintext is ever written out, a record at a
/// time; everything RFC 8188 requires is checked: each record's tag under its place in the
/// sequence (so changed, dropped and reordered records fail), delimiters `0x01` on every record
/// but a last `0x02` one, nothing after it, and a stream that ends without it is truncated. Once
/// an error is returned, every later call fails.
///
/// Records may be padded (zeros after the delimiter), as RFC 8188 allows; rangeway's own are not.
pub struct Decryptor<'k> {
    keys: &'k KeySet,
    state: State,
    /// The header so far, then the current record so far: at most one record.
    buffer: Vec<u8>,
    /// `rs`, once the header is read.
    record_size: usize,
    key: Option<ContentKey>,
    /// The number of the next record.
    sequence: u64,
}

impl std::fmt::Debug for Decryptor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decryptor")
            .field("state", &self.state)
            .field("record_size", &self.record_size)
            .field("sequence", &self.sequence)
            .field("buffered", &self.buffer.len())
            .finish_non_exhaustive()
    }
}

impl<'k> Decryptor<'k> {
    /// A decryptor that takes the key the header's key id names from `keys`.
    pub fn new(keys: &'k KeySet) -> Self {
        Self {
            keys,
            state: State::Header,
            buffer: Vec::new(),
            record_size: 0,
            key: None,
            sequence: 0,
        }
    }

    /// Takes the next ciphertext chunk, appending the plaintext of every record it completes to
    /// `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), DecryptError> {
        let result = self.take(input, out);
        self.fail_on(result)
    }

    /// Ends the stream, appending the last record's plaintext to `out`; fails when the stream
    /// was truncated.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), DecryptError> {
        let result = match self.state {
            State::Done => Ok(()),
            State::Failed => Err(DecryptError::Failed),
            State::Header => Err(DecryptError::TruncatedHeader),
            State::Records if self.buffer.is_empty() => {
                Err(DecryptError::Truncated { records: self.sequence })
            }
            // What is buffered is shorter than a record (a full one is opened as it completes),
            // which `open_record` accepts only as the last one.
            State::Records => self.open_record(out),
        };
        self.fail_on(result)
    }

    fn fail_on(&mut self, result: Result<(), DecryptError>) -> Result<(), DecryptError> {
        if result.is_err() {
            self.state = State::Failed;
            self.buffer.clear();
        }
        result
    }

    fn take(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), DecryptError> {
        while !input.is_empty() {
            let wanted = match self.state {
                State::Failed => return Err(DecryptError::Failed),
                State::Done => return Err(DecryptError::TrailingData),
                State::Header => match self.buffer.get(FIXED_HEADER_LEN - 1) {
                    Some(&id_len) => FIXED_HEADER_LEN + usize::from(id_len),
                    None => FIXED_HEADER_LEN,
                },
                State::Records => self.record_size,
            };
            let take = (wanted - self.buffer.len()).min(input.len());
            self.buffer.extend_from_slice(&input[..take]);
            input = &input[take..];
            if self.buffer.len() < wanted {
                continue;
            }
            match self.state {
                // The fixed part is in: the key id's length is known now, and may be 0.
                State::Header if wanted == FIXED_HEADER_LEN && self.buffer[wanted - 1] != 0 => {}
                State::Header => self.read_header()?,
                _ => self.open_record(out)?,
            }
        }
        Ok(())
    }

    /// Reads the whole header in the buffer: the record size and the key.
    fn read_header(&mut self) -> Result<(), DecryptError> {
        let (fixed, key_id) = self.buffer.split_at(FIXED_HEADER_LEN);
        let (salt, rest) = fixed.split_at(SALT_LEN);
        let salt: [u8; SALT_LEN] = salt.try_into().map_err(|_| DecryptError::TruncatedHeader)?;
        let record_size = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
        if !(MIN_RECORD_SIZE..=MAX_RECORD_SIZE).contains(&record_size) {
            return Err(DecryptError::RecordSize(record_size));
        }
        let key = self
            .keys
            .get(key_id)
            .ok_or_else(|| DecryptError::UnknownKeyId(key_id.escape_ascii().to_string()))?;
        self.key = Some(ContentKey::derive(key.bytes(), &salt));
        // Fits usize: at most MAX_RECORD_SIZE.
        self.record_size = record_size as usize;
        self.buffer.clear();
        self.buffer.reserve_exact(self.record_size);
        self.state = State::Records;
        Ok(())
    }

    /// Decrypts the record in the buffer: a full one, or at the end a shorter last one.
    fn open_record(&mut self, out: &mut Vec<u8>) -> Result<(), DecryptError> {
        let record = self.sequence;
        let Some(key) = &self.key else { return Err(DecryptError::TruncatedHeader) };
        if self.buffer.len() < RECORD_OVERHEAD {
            return Err(DecryptError::Truncated { records: record });
        }
        let full = self.buffer.len() == self.record_size;
        let tag_at = self.buffer.len() - TAG_LEN;
        let (plaintext, tag) = self.buffer.split_at_mut(tag_at);
        let tag: &[u8; TAG_LEN] =
            (&*tag).try_into().map_err(|_| DecryptError::Authentication { record })?;
        key.open(record, plaintext, tag).map_err(|_| DecryptError::Authentication { record })?;
        // The delimiter is the last non-zero byte: padding, if any, is zeros after it.
        let end = plaintext
            .iter()
            .rposition(|&byte| byte != 0)
            .ok_or(DecryptError::Delimiter { record })?;
        match plaintext[end] {
            LAST_DELIMITER => self.state = State::Done,
            // A record before the last fills its `rs` bytes; a shorter one ends the stream
            // without its last record.
            DELIMITER if full => {}
            DELIMITER => return Err(DecryptError::Truncated { records: record + 1 }),
            _ => return Err(DecryptError::Delimiter { record }),
        }
        out.extend_from_slice(&plaintext[..end]);
        self.buffer.clear();
        self.sequence += 1;
        Ok(())
    }
}
