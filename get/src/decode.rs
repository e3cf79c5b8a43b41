//! `--decrypt` and `--gunzip`: the downloaded representation back to the object, streamed in
//! constant memory, with the object's own digests (`X-Origin-Digest`) computed on the way.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;

use rangeway_middleware::aes128gcm::{Decryptor, KeySet};

use crate::digest::Running;
use crate::error::GetError;

/// What to undo, outermost first: decryption, then gzip.
pub(crate) struct Decoding {
    pub(crate) keys: Option<KeySet>,
    pub(crate) gunzip: bool,
}

/// Decodes `input` into `output`, feeding the decoded bytes to `running`.
pub(crate) fn decode(
    decoding: &Decoding,
    input: &Path,
    output: &Path,
    running: &mut Running,
) -> Result<(), GetError> {
    let read_error = |e: io::Error| GetError::Local(format!("{}: {e}", input.display()));
    let file = File::open(input).map_err(read_error)?;
    let out =
        File::create(output).map_err(|e| GetError::Local(format!("{}: {e}", output.display())))?;
    let mut sink = Sink { out: BufWriter::with_capacity(1 << 20, out), running };
    let plain: Box<dyn Read> = match &decoding.keys {
        Some(keys) => Box::new(Decrypting::new(file, keys)),
        None => Box::new(file),
    };
    let copied = if decoding.gunzip {
        io::copy(
            &mut flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(1 << 20, plain)),
            &mut sink,
        )
    } else {
        io::copy(&mut io::BufReader::with_capacity(1 << 20, plain), &mut sink)
    };
    copied.map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidInput => {
            GetError::Decode(format!("{}: {e}", input.display()))
        }
        _ => {
            GetError::Local(format!("decoding {} into {}: {e}", input.display(), output.display()))
        }
    })?;
    let file =
        sink.out.into_inner().map_err(|e| GetError::Local(format!("{}: {e}", output.display())))?;
    file.sync_all().map_err(|e| GetError::Local(format!("{}: {e}", output.display())))
}

/// Writes to the file and to the digests.
struct Sink<'a> {
    out: BufWriter<File>,
    running: &'a mut Running,
}

impl Write for Sink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.out.write(buf)?;
        self.running.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// RFC 8188 records in, authenticated plaintext out: a reader that hands out only what
/// authenticated, and fails (`InvalidData`) on a tampered, truncated or unknown-key input.
pub struct Decrypting<'k, R> {
    input: R,
    decryptor: Decryptor<'k>,
    /// Ciphertext read, plaintext not yet handed out.
    read: Vec<u8>,
    plain: Vec<u8>,
    handed: usize,
    finished: bool,
}

impl<'k, R: Read> Decrypting<'k, R> {
    pub fn new(input: R, keys: &'k KeySet) -> Self {
        Self {
            input,
            decryptor: Decryptor::new(keys),
            read: vec![0; 256 << 10],
            plain: Vec::new(),
            handed: 0,
            finished: false,
        }
    }
}

impl<R: Read> Read for Decrypting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.handed == self.plain.len() && !self.finished {
            self.plain.clear();
            self.handed = 0;
            let read = self.input.read(&mut self.read)?;
            let decrypted = if read == 0 {
                self.finished = true;
                self.decryptor.finish(&mut self.plain)
            } else {
                self.decryptor.push(&self.read[..read], &mut self.plain)
            };
            decrypted.map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("decrypting: {e}"))
            })?;
        }
        let n = buf.len().min(self.plain.len() - self.handed);
        buf[..n].copy_from_slice(&self.plain[self.handed..self.handed + n]);
        self.handed += n;
        Ok(n)
    }
}
