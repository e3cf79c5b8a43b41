//! The `aes128gcm` stage: RFC 8188 encrypted content encoding, resumable at any byte, and a
//! streaming [`Decryptor`] for it.
//!
//! The output is RFC 8188 to the letter, so any `aes128gcm` decoder holding the key reads it: a
//! header `salt (16) | rs (u32) | idlen (u8) | keyid`, then records of `rs` bytes (the last one
//! shorter), each the AES-128-GCM encryption of up to `rs - 17` data bytes and a delimiter
//! (`0x01`, or `0x02` for the last record), with no padding. The input keying material is the
//! configured key itself; the header's key id names it, so keys can be rotated.
//!
//! Ranges need no index: with `H = 21 + idlen` and `P = rs - 17`, record `i` starts at output
//! byte `H + i·rs` and holds input bytes `i·P..(i + 1)·P`, so the output is
//! `H + L + 17·max(1, ⌈L/P⌉)` bytes for an input of `L`, and any output range is made by
//! encrypting the records it touches.
//!
//! # The salt, and why a version without a strong ETag is not range-able
//!
//! RFC 8188 derives the content key and nonce from the salt. A random salt would make every
//! response different, so a resumed download would splice two encryptions. The salt is instead
//! HMAC-SHA-256, keyed with the key, over a length-prefixed encoding of everything that pins the
//! input bytes and their layout: the route, object path, strong ETag, object length, the identity
//! of the stages before this one, the key id and the record size, cut to 16 bytes. The same
//! object version gets the same bytes every time; anything different gets a different key and
//! nonce, so no nonce is ever used for two plaintexts.
//!
//! That holds only while the strong ETag pins the bytes. Without one, two requests may see
//! different bytes under the same path, and a derived salt would reuse nonces across them. So
//! then the salt is random for each response, and the representation is not range-able:
//! [`plan`](StageFactory::plan) refuses anything but the whole output and
//! [`start`](StageFactory::start) anywhere but byte 0.
//!
//! # I/O
//!
//! [`Aes128GcmFactory::from_options`] reads the key: the environment variable `key_env` or the
//! file `key_file`, once, when the configuration is built. It is this crate's only I/O, and never
//! happens on the body path.

mod decrypt;
mod keys;
mod record;

use std::path::Path;

use bytes::{BufMut as _, Bytes, BytesMut};
use zeroize::Zeroizing;

use crate::ByteRange;
use crate::chain::{
    Form, OptionError, Stage, StageContext, StageError, StageFactory, StageOptions, StagePlan,
    StageState,
};
use record::{
    ContentKey, DELIMITER, FIXED_HEADER_LEN, LAST_DELIMITER, RECORD_OVERHEAD, SALT_LEN, header,
};

pub use decrypt::{DecryptError, Decryptor};
pub use keys::{
    Key, KeyError, KeySet, MAX_KEY_ID_LEN, generate_key, parse_key_file, read_key_file,
};

/// The kind name of the stage.
pub const KIND: &str = "aes128gcm";

/// The default record size: 64 KiB of data per record, 17 bytes of overhead.
pub const DEFAULT_RECORD_SIZE: u32 = 65_553;

/// The smallest record size: one data byte, the delimiter and the tag.
pub const MIN_RECORD_SIZE: u32 = 18;

/// The largest record size this stage writes and its [`Decryptor`] reads. Every request holds up
/// to one record, a range re-encrypts up to a record at each end, and a decoder cannot release a
/// byte of a record before its tag is checked: 16 MiB keeps all of that bounded while being far
/// past where larger records stop paying (the 17 bytes of overhead are 0.03 % at 64 KiB).
pub const MAX_RECORD_SIZE: u32 = 16 << 20;

/// The version of the output format, in the identity: bump it when anything that shapes the
/// output (the salt's encoding, say) changes, so that ETags change with it.
const FORMAT_VERSION: &str = "v1";

/// What the salt is derived over, ahead of the encoded fields.
const SALT_LABEL: &[u8] = b"rangeway aes128gcm salt v1";

/// Why an `aes128gcm` stage cannot be built from a key set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Aes128GcmConfigError {
    #[error(
        "{0} is not between {MIN_RECORD_SIZE} and {MAX_RECORD_SIZE} — use e.g. \
         {DEFAULT_RECORD_SIZE}, the default (64 KiB of data per record)"
    )]
    RecordSize(u64),
    #[error("no key with id {id:?} — the keys' ids are {known}")]
    UnknownKeyId { id: String, known: String },
    #[error(
        "the key has no id, so `key_id` cannot name it — write the key as `ID=KEY` to give it one, \
         or drop `key_id`"
    )]
    BareKey,
}

impl Aes128GcmConfigError {
    /// The option the error is about.
    fn key(&self) -> &'static str {
        match self {
            Aes128GcmConfigError::RecordSize(_) => "record_size",
            Aes128GcmConfigError::UnknownKeyId { .. } | Aes128GcmConfigError::BareKey => "key_id",
        }
    }
}

/// Why a pass of the stage cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncryptError {
    #[error("the input runs past its {len} bytes")]
    InputPastEnd { len: u64 },
    #[error(
        "the input ended at byte {offset}, inside record {record}, short of its {len} bytes: a \
         record cannot be encrypted before all of it is there"
    )]
    EndedInsideRecord { offset: u64, record: u64, len: u64 },
    #[error("AES-GCM refused record {record}")]
    Cipher { record: u64 },
}

impl From<EncryptError> for StageError {
    fn from(error: EncryptError) -> Self {
        StageError::Other(Box::new(error))
    }
}

fn check_record_size(record_size: u64) -> Result<u32, Aes128GcmConfigError> {
    u32::try_from(record_size)
        .ok()
        .filter(|size| (MIN_RECORD_SIZE..=MAX_RECORD_SIZE).contains(size))
        .ok_or(Aes128GcmConfigError::RecordSize(record_size))
}

/// The key that encrypts: the one `key_id` names, else the first.
fn select_key<'k>(
    keys: &'k KeySet,
    key_id: Option<&'k str>,
) -> Result<(&'k str, &'k Key), Aes128GcmConfigError> {
    let Some(id) = key_id else { return Ok(keys.first()) };
    if let Some(key) = keys.get(id.as_bytes()) {
        return Ok((id, key));
    }
    if keys.first().0.is_empty() {
        return Err(Aes128GcmConfigError::BareKey);
    }
    let known: Vec<String> = keys.ids().map(|id| format!("{id:?}")).collect();
    Err(Aes128GcmConfigError::UnknownKeyId { id: id.to_owned(), known: known.join(", ") })
}

/// The `aes128gcm` stage, configured.
///
/// Options:
/// - `key_env`: the name of an environment variable holding the key, or
/// - `key_file`: the path of a key file (exactly one of the two). Either holds the text
///   [`parse_key_file`] reads: one base64url key of 16 or 32 bytes, or several as `ID=KEY` lines.
/// - `key_id`: the id of the key that encrypts; default the only (or first) one.
/// - `record_size`: RFC 8188's `rs`, from [`MIN_RECORD_SIZE`] to [`MAX_RECORD_SIZE`]; default
///   [`DEFAULT_RECORD_SIZE`].
///
/// Its `Debug` shows the key's fingerprint, never the key.
#[derive(Clone, Debug)]
pub struct Aes128GcmFactory {
    key: Key,
    key_id: String,
    record_size: u32,
    identity: String,
}

impl Aes128GcmFactory {
    /// A stage encrypting with the key `key_id` names in `keys` (the first when `None`), in
    /// records of `record_size` bytes.
    pub fn new(
        keys: &KeySet,
        key_id: Option<&str>,
        record_size: u64,
    ) -> Result<Self, Aes128GcmConfigError> {
        let record_size = check_record_size(record_size)?;
        let (key_id, key) = select_key(keys, key_id)?;
        Ok(Self::build(key.clone(), key_id.to_owned(), record_size))
    }

    fn build(key: Key, key_id: String, record_size: u32) -> Self {
        let key_id_hex: String = key_id.bytes().map(|byte| format!("{byte:02x}")).collect();
        // The key id in hex: it may hold `|` and `,`, which the identity must not.
        let identity = format!(
            "{KIND}({FORMAT_VERSION},rs={record_size},keyid={key_id_hex},key={})",
            key.fingerprint()
        );
        Self { key, key_id, record_size, identity }
    }

    /// Builds the stage from a route's options, reading the key from the environment or a file
    /// (the crate's only I/O, done here once), and reporting every bad option. No message holds
    /// key material.
    pub fn from_options(options: &StageOptions) -> Result<Self, Vec<OptionError>> {
        Self::from_options_with_env(options, |name| std::env::var(name))
    }

    /// [`from_options`](Self::from_options) with the environment given, so tests need not
    /// change the process's own.
    fn from_options_with_env(
        options: &StageOptions,
        env: impl Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Self, Vec<OptionError>> {
        let mut reader = options.reader();
        let key_env = reader.str("key_env");
        let key_file = reader.str("key_file");
        let key_id = reader.str("key_id");
        let record_size = reader.u64("record_size").unwrap_or(DEFAULT_RECORD_SIZE.into());
        let record_size = check_record_size(record_size)
            .map_err(|error| reader.error(error.key(), error))
            .unwrap_or(DEFAULT_RECORD_SIZE);
        const KEYGEN: &str = "(`rangeway keygen` makes a key)";
        let keys = match (key_env, key_file) {
            (Some(_), Some(_)) => {
                reader.error("key_file", "`key_env` is set too — keep only one of the two");
                None
            }
            (None, None) => {
                reader.error(
                    "key_env",
                    format_args!(
                        "no key — set `key_env` to the name of an environment variable holding \
                         a base64url key, or `key_file` to the path of a key file {KEYGEN}"
                    ),
                );
                None
            }
            (Some(name), None) => match env(name).map(Zeroizing::new) {
                Ok(text) => parse_key_file(&text)
                    .map_err(|error| {
                        reader
                            .error("key_env", format_args!("environment variable {name}: {error}"))
                    })
                    .ok(),
                Err(std::env::VarError::NotPresent) => {
                    reader.error(
                        "key_env",
                        format_args!(
                            "environment variable {name} is not set — export it with a \
                             base64url key {KEYGEN}"
                        ),
                    );
                    None
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    reader.error(
                        "key_env",
                        format_args!("environment variable {name}: {}", KeyError::NotUtf8),
                    );
                    None
                }
            },
            (None, Some(path)) => read_key_file(Path::new(path))
                .map_err(|error| reader.error("key_file", format_args!("{path:?}: {error}")))
                .ok(),
        };
        let chosen = keys.as_ref().and_then(|keys| {
            select_key(keys, key_id).map_err(|error| reader.error(error.key(), error)).ok()
        });
        reader.finish()?;
        // Every way to get here without a key recorded an error, which `finish` returned.
        let (key_id, key) = chosen.ok_or_else(|| vec![OptionError::new("key_env", "no key")])?;
        Ok(Self::build(key.clone(), key_id.to_owned(), record_size))
    }

    /// RFC 8188's `rs`: the length of every record but the last.
    pub fn record_size(&self) -> u32 {
        self.record_size
    }

    /// The id of the key that encrypts, as the header carries it.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    fn layout(&self) -> Layout {
        Layout {
            header: (FIXED_HEADER_LEN + self.key_id.len()) as u64,
            record: self.record_size.into(),
            data: u64::from(self.record_size) - RECORD_OVERHEAD as u64,
        }
    }

    /// The salt for one response: derived when the strong ETag pins the input, else random.
    fn salt(&self, context: &StageContext<'_>) -> Result<[u8; SALT_LEN], StageError> {
        if context.object.strong_etag.is_some() {
            return Ok(derived_salt(&self.key, &self.key_id, self.record_size, context));
        }
        let mut salt = [0u8; SALT_LEN];
        getrandom::fill(&mut salt)
            .map_err(|error| StageError::Other(Box::new(KeyError::Random(error))))?;
        Ok(salt)
    }
}

/// The salt of a version pinned by a strong ETag: the first 16 bytes of HMAC-SHA-256, keyed with
/// the key, over a label and then, each variable-length field prefixed with its length as a
/// big-endian u64: the key id, the record size (u32), the route, the object path, the strong
/// ETag, the object length (u64) and the identity of the stage's input. The prefixes make the
/// encoding unambiguous, so two different versions never encode alike; the record size and key
/// id are in because the same key and salt under another layout would encrypt different
/// plaintext under the same nonces.
fn derived_salt(
    key: &Key,
    key_id: &str,
    record_size: u32,
    context: &StageContext<'_>,
) -> [u8; SALT_LEN] {
    let object = context.object;
    let etag = object.strong_etag.unwrap_or_default();
    let fields: [&[u8]; 5] = [
        key_id.as_bytes(),
        object.route.as_bytes(),
        object.path.as_bytes(),
        etag.as_bytes(),
        context.input_identity.as_bytes(),
    ];
    let prefixes = fields.map(|field| (field.len() as u64).to_be_bytes());
    let tag = key.hmac(&[
        SALT_LABEL,
        &prefixes[0],
        fields[0],
        &record_size.to_be_bytes(),
        &prefixes[1],
        fields[1],
        &prefixes[2],
        fields[2],
        &prefixes[3],
        fields[3],
        &object.len.to_be_bytes(),
        &prefixes[4],
        fields[4],
    ]);
    let mut salt = [0u8; SALT_LEN];
    salt.copy_from_slice(&tag[..SALT_LEN]);
    salt
}

/// Where records lie, in input and output bytes.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Header length, `21 + idlen`.
    header: u64,
    /// `rs`.
    record: u64,
    /// Data bytes per record, `rs - 17`.
    data: u64,
}

impl Layout {
    /// The number of records for `input_len` bytes: an empty input still has its last record.
    fn records(&self, input_len: u64) -> u64 {
        input_len.div_ceil(self.data).max(1)
    }

    fn output_len(&self, input_len: u64) -> Option<u64> {
        let overhead = self.records(input_len).checked_mul(RECORD_OVERHEAD as u64)?;
        self.header.checked_add(input_len)?.checked_add(overhead)
    }

    /// The record holding output byte `offset` (record 0 for the header, the last one past the
    /// end).
    fn record_at(&self, offset: u64, input_len: u64) -> u64 {
        let last = self.records(input_len) - 1;
        offset.checked_sub(self.header).map_or(0, |body| (body / self.record).min(last))
    }
}

impl StageFactory for Aes128GcmFactory {
    fn kind(&self) -> &str {
        KIND
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    /// The records `output` touches, from record 0 (whose pass writes the header) when it starts
    /// in the header.
    fn plan(
        &self,
        output: ByteRange,
        input_len: u64,
        context: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        let layout = self.layout();
        let plan_error =
            |reason: &str| StageError::Plan { range: output, input_len, reason: reason.to_owned() };
        let total = layout.output_len(input_len).ok_or(StageError::Overflow(input_len))?;
        if output.end() > total {
            return Err(plan_error("past the end of the output"));
        }
        if context.object.strong_etag.is_none() && output != ByteRange::whole(total) {
            return Err(plan_error(
                "the object has no strong ETag, so each response is encrypted under a random salt \
                 and only the whole output can be produced",
            ));
        }
        let first = layout.record_at(output.start(), input_len);
        // An empty range plans the record at its start.
        let last = layout.record_at(output.end().saturating_sub(1).max(output.start()), input_len);
        // Both lie inside the records, so their starts lie inside the input.
        let start = first * layout.data;
        let end = (last + 1).saturating_mul(layout.data).min(input_len);
        let skip = match first {
            // The pass from input byte 0 writes the header too.
            0 => output.start(),
            _ => output.start() - (layout.header + first * layout.record),
        };
        let input = ByteRange::new(start, end).ok_or_else(|| plan_error("no such records"))?;
        Ok(StagePlan { input, skip })
    }

    fn output_len(&self, input_len: u64, _: &StageContext<'_>) -> Option<u64> {
        self.layout().output_len(input_len)
    }

    fn observes_only(&self) -> bool {
        false
    }

    /// Ciphertext is no longer of the origin's type; RFC 8188 names no media type of its own.
    fn media_type(&self) -> Option<&str> {
        Some("application/octet-stream")
    }

    /// A saved download says it is encrypted, and in what: `NAME.aes128gcm`, or `NAME.gz.aes128gcm`
    /// after gzip (not `NAME.gz`, which no gzip reader opens).
    fn file_extension(&self) -> Option<&str> {
        Some("aes128gcm")
    }

    fn produces(&self) -> Form {
        Form::Encrypted
    }

    /// Starts at any record boundary of the input: the header is written only from byte 0, and
    /// the nonce sequence starts at the record `at_input` begins.
    fn start(
        &self,
        at_input: u64,
        resume: Option<&StageState>,
        context: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError> {
        let layout = self.layout();
        let resume_error = |reason: String| Err(StageError::Resume { offset: at_input, reason });
        if resume.is_some() {
            return resume_error(format!("{KIND} reports no states to resume from"));
        }
        if !at_input.is_multiple_of(layout.data) {
            return resume_error(format!(
                "not a record boundary: records hold {} input bytes each",
                layout.data
            ));
        }
        if context.object.strong_etag.is_none() && at_input != 0 {
            return resume_error(
                "the object has no strong ETag, so each response is encrypted under a random \
                 salt and can only start at byte 0"
                    .to_owned(),
            );
        }
        // Every record starts before the end of the input, but for the empty input's one.
        if let Some(len) = context.input_len
            && at_input >= len
            && at_input != 0
        {
            return resume_error(format!("past the last record of the {len} input bytes"));
        }
        let salt = self.salt(context)?;
        Ok(Box::new(EncryptStage {
            key: ContentKey::derive(self.key.bytes(), &salt),
            header: (at_input == 0)
                .then(|| header(&salt, self.record_size, self.key_id.as_bytes())),
            // Fits usize: at most MAX_RECORD_SIZE.
            data: layout.data as usize,
            sequence: at_input / layout.data,
            pending: Vec::new(),
            offset: at_input,
            input_len: context.input_len,
            done: false,
        }))
    }
}

/// One pass of the stage over a run of records.
struct EncryptStage {
    key: ContentKey,
    /// The header, until it is written ahead of the first record; `None` when the pass starts
    /// past record 0.
    header: Option<Vec<u8>>,
    /// Data bytes per record, `P`.
    data: usize,
    /// The number of the next record to seal.
    sequence: u64,
    /// Input of the next record that arrived in earlier chunks: less than a record, or a whole
    /// one held back until what follows shows it is not the last. Copied out of its chunk, so
    /// that a chunk is let go once pushed (a slice of it would keep all of it — a relay chunk
    /// is four records — until the next push); the buffer is kept for the pass.
    pending: Vec<u8>,
    /// Input offset past the last byte taken.
    offset: u64,
    /// The whole input's length, when known: then the last record is known when it arrives.
    input_len: Option<u64>,
    /// Whether the last record is out.
    done: bool,
}

impl std::fmt::Debug for EncryptStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptStage")
            .field("sequence", &self.sequence)
            .field("offset", &self.offset)
            .field("pending", &self.pending.len())
            .field("input_len", &self.input_len)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// Where sealed records go: one buffer per push, made at the first record with room for all of
/// them, so a push that completes no record allocates nothing.
struct Output {
    buffer: Option<BytesMut>,
    capacity: usize,
}

impl EncryptStage {
    /// Whether a whole record of input ending at `end` can be sealed, and as the last one:
    /// `Some(false)` when input follows it (`more`) or the known length lies past it.
    fn full_record(&self, end: u64, more: bool) -> Option<bool> {
        match self.input_len {
            _ if more => Some(false),
            Some(len) if len > end => Some(false),
            Some(len) if len == end => Some(true),
            _ => None,
        }
    }

    /// Seals the pending input then `data` (together one record's data) into `output`, the
    /// header first if it is due; nothing is pending afterwards.
    fn seal(&mut self, output: &mut Output, data: &[u8], last: bool) -> Result<(), EncryptError> {
        let header = self.header.take();
        let buffer = output.buffer.get_or_insert_with(|| {
            let mut buffer = BytesMut::with_capacity(output.capacity);
            buffer.extend_from_slice(header.as_deref().unwrap_or_default());
            buffer
        });
        let at = buffer.len();
        buffer.extend_from_slice(&self.pending);
        self.pending.clear();
        buffer.extend_from_slice(data);
        buffer.put_u8(if last { LAST_DELIMITER } else { DELIMITER });
        let record = self.sequence;
        let tag = self
            .key
            .seal(record, &mut buffer[at..])
            .map_err(|_| EncryptError::Cipher { record })?;
        buffer.extend_from_slice(&tag);
        self.sequence += 1;
        self.done = last;
        Ok(())
    }

    /// Keeps `piece` of an input chunk for the record it begins or continues.
    fn hold(&mut self, piece: &[u8]) {
        self.pending.extend_from_slice(piece);
    }

    fn output(&self, incoming: usize) -> Output {
        let data = self.pending.len() + incoming;
        let records = data / self.data + 1;
        let header = self.header.as_ref().map_or(0, Vec::len);
        Output { buffer: None, capacity: header + data + records * RECORD_OVERHEAD }
    }
}

impl Stage for EncryptStage {
    fn push(&mut self, chunk: Bytes) -> Result<Option<Bytes>, StageError> {
        if chunk.is_empty() {
            return Ok(None);
        }
        let end =
            self.offset.checked_add(chunk.len() as u64).ok_or(StageError::Overflow(self.offset))?;
        if self.done || self.input_len.is_some_and(|len| end > len) {
            let len = self.input_len.unwrap_or(self.offset);
            return Err(EncryptError::InputPastEnd { len }.into());
        }
        let mut output = self.output(chunk.len());
        let mut at = 0;
        // Complete the record earlier chunks began.
        if !self.pending.is_empty() {
            let take = (self.data - self.pending.len()).min(chunk.len());
            self.offset += take as u64;
            at = take;
            let more = take < chunk.len();
            match self.full_record(self.offset, more) {
                Some(last) if self.pending.len() + take == self.data => {
                    self.seal(&mut output, &chunk[..take], last)?;
                }
                _ => self.hold(&chunk[..take]),
            }
        }
        // Whole records straight from the chunk, encrypted in the output buffer.
        while self.pending.is_empty() && chunk.len() - at >= self.data {
            let record_end = self.offset + self.data as u64;
            let more = chunk.len() - at > self.data;
            let Some(last) = self.full_record(record_end, more) else { break };
            self.seal(&mut output, &chunk[at..at + self.data], last)?;
            at += self.data;
            self.offset = record_end;
        }
        if at < chunk.len() {
            self.offset += (chunk.len() - at) as u64;
            self.hold(&chunk[at..]);
        }
        // A short record is sealed only as the last one, once its end is known to be.
        if !self.done && !self.pending.is_empty() && self.input_len == Some(self.offset) {
            self.seal(&mut output, &[], true)?;
        }
        Ok(output.buffer.map(BytesMut::freeze))
    }

    fn finish(&mut self) -> Result<Option<Bytes>, StageError> {
        if self.done {
            return Ok(None);
        }
        match self.input_len {
            Some(len) if self.offset != len && self.pending.is_empty() => {
                // The planned input ended at a record boundary short of the whole input: every
                // record it touched is out.
                Ok(None)
            }
            Some(len) if self.offset != len => Err(EncryptError::EndedInsideRecord {
                offset: self.offset,
                record: self.sequence,
                len,
            }
            .into()),
            // The input is all here: what is pending (perhaps nothing) is the last record.
            _ => {
                let mut output = self.output(0);
                self.seal(&mut output, &[], true)?;
                Ok(output.buffer.map(BytesMut::freeze))
            }
        }
    }
}

#[cfg(test)]
mod tests;
