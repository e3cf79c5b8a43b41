//! The digests a server publishes for a representation, and checking a file against them.
//!
//! Read from `Repr-Digest` (RFC 9530), `Digest` (RFC 3230), `x-amz-checksum-sha256` and
//! `x-amz-checksum-crc32` (S3), and `X-Checksum-Crc32` (rangeway); `X-Origin-Digest` and
//! `X-Origin-Checksum-Crc32` state the object's own bytes before a route's transforms.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rangeway_middleware::checksum::parse_repr_digest_sha256;
use sha2::{Digest as _, Sha256};

use crate::http1::Head;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algorithm {
    Sha256,
    Crc32,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "sha-256",
            Self::Crc32 => "crc32",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [Self::Sha256, Self::Crc32].into_iter().find(|a| a.name() == name)
    }
}

/// Which bytes a digest is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Of {
    /// What was downloaded.
    Representation,
    /// The object before the route's transforms: what `--decrypt`/`--gunzip` give back.
    Origin,
}

/// A digest a server stated, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Expected {
    pub(crate) of: Of,
    pub(crate) algorithm: Algorithm,
    pub(crate) value: Vec<u8>,
    /// The header (or `--sha256`) it came from.
    pub(crate) source: String,
}

impl Expected {
    /// Every digest `head` states (a field that does not parse states none).
    pub(crate) fn from_head(head: &Head) -> Vec<Self> {
        let mut found = Vec::new();
        let mut add = |of, algorithm, value: Option<Vec<u8>>, source: &str| {
            if let Some(value) = value {
                found.push(Self { of, algorithm, value, source: source.to_owned() });
            }
        };
        for (of, digest, crc) in [
            (Of::Representation, "repr-digest", "x-checksum-crc32"),
            (Of::Origin, "x-origin-digest", "x-origin-checksum-crc32"),
        ] {
            let sha = parse_repr_digest_sha256(head.all(digest).map(str::as_bytes));
            add(of, Algorithm::Sha256, sha.map(Vec::from), digest);
            add(of, Algorithm::Crc32, head.get(crc).and_then(hex_crc32), crc);
        }
        add(Of::Representation, Algorithm::Sha256, rfc3230_sha256(head), "digest");
        // A multipart upload's checksum is of its parts' checksums (`…-N`): not of the bytes.
        let amz = |name: &str, len: usize| {
            let value = head.get(name).filter(|v| !v.contains('-'))?;
            STANDARD.decode(value).ok().filter(|bytes| bytes.len() == len)
        };
        add(
            Of::Representation,
            Algorithm::Sha256,
            amz("x-amz-checksum-sha256", 32),
            "x-amz-checksum-sha256",
        );
        add(
            Of::Representation,
            Algorithm::Crc32,
            amz("x-amz-checksum-crc32", 4),
            "x-amz-checksum-crc32",
        );
        found
    }

    /// `--sha256 HEX`.
    pub(crate) fn sha256_hex(hex: &str) -> Option<Self> {
        let value = from_hex(hex).filter(|v| v.len() == 32)?;
        Some(Self {
            of: Of::Representation,
            algorithm: Algorithm::Sha256,
            value,
            source: "--sha256".into(),
        })
    }

    /// The control file's form: `OF ALGORITHM SOURCE HEX`.
    pub(crate) fn to_line(&self) -> String {
        let of = match self.of {
            Of::Representation => "representation",
            Of::Origin => "origin",
        };
        format!("{of} {} {} {}", self.algorithm.name(), self.source, to_hex(&self.value))
    }

    pub(crate) fn from_line(line: &str) -> Option<Self> {
        let mut words = line.split(' ');
        let of = match words.next()? {
            "representation" => Of::Representation,
            "origin" => Of::Origin,
            _ => return None,
        };
        let algorithm = Algorithm::parse(words.next()?)?;
        let source = words.next()?.to_owned();
        let value = from_hex(words.next()?)?;
        words.next().is_none().then_some(Self { of, algorithm, value, source })
    }
}

/// Adds `new` digests to `known`, each once.
pub(crate) fn merge(known: &mut Vec<Expected>, new: Vec<Expected>) {
    for expected in new {
        if !known.contains(&expected) {
            known.push(expected);
        }
    }
}

fn hex_crc32(value: &str) -> Option<Vec<u8>> {
    from_hex(value).filter(|bytes| bytes.len() == 4)
}

fn rfc3230_sha256(head: &Head) -> Option<Vec<u8>> {
    head.all("digest").flat_map(|v| v.split(',')).find_map(|item| {
        let (algorithm, value) = item.trim().split_once('=')?;
        let bytes = STANDARD.decode(value.trim()).ok()?;
        (algorithm.eq_ignore_ascii_case("sha-256") && bytes.len() == 32).then_some(bytes)
    })
}

pub(crate) fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

/// The digests of bytes fed in order.
#[derive(Clone, Default)]
pub(crate) struct Running {
    sha256: Option<Sha256>,
    crc32: Option<crc32fast::Hasher>,
    fed: u64,
}

impl Running {
    /// Computes what `expected` needs (nothing when it is empty).
    pub(crate) fn for_expected<'a>(expected: impl IntoIterator<Item = &'a Expected>) -> Self {
        let mut running = Self::default();
        for e in expected {
            match e.algorithm {
                Algorithm::Sha256 => running.sha256 = Some(Sha256::new()),
                Algorithm::Crc32 => running.crc32 = Some(crc32fast::Hasher::new()),
            }
        }
        running
    }

    /// Whether it computes every algorithm of `expected`.
    pub(crate) fn covers<'a>(&self, expected: impl IntoIterator<Item = &'a Expected>) -> bool {
        expected.into_iter().all(|e| match e.algorithm {
            Algorithm::Sha256 => self.sha256.is_some(),
            Algorithm::Crc32 => self.crc32.is_some(),
        })
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.sha256.is_none() && self.crc32.is_none()
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        if let Some(sha) = self.sha256.as_mut() {
            sha.update(bytes);
        }
        if let Some(crc) = self.crc32.as_mut() {
            crc.update(bytes);
        }
        self.fed += bytes.len() as u64;
    }

    /// Feeds `file`'s bytes from where feeding stopped up to `until`, `block` at a time.
    pub(crate) fn feed_from(
        &mut self,
        file: &File,
        until: u64,
        block: &mut [u8],
    ) -> io::Result<()> {
        while self.fed < until {
            let len = (until - self.fed).min(block.len() as u64) as usize;
            file.read_exact_at(&mut block[..len], self.fed)?;
            self.update(&block[..len]);
        }
        Ok(())
    }

    /// Checks every `expected` digest of `of` against what was fed.
    pub(crate) fn check<'a>(
        self,
        of: Of,
        expected: impl IntoIterator<Item = &'a Expected>,
    ) -> Result<Vec<String>, Mismatch> {
        let sha256 = self.sha256.map(|sha| sha.finalize().to_vec());
        let crc32 = self.crc32.map(|crc| crc.finalize().to_be_bytes().to_vec());
        let mut held = Vec::new();
        for e in expected.into_iter().filter(|e| e.of == of) {
            let got = match e.algorithm {
                Algorithm::Sha256 => sha256.as_ref(),
                Algorithm::Crc32 => crc32.as_ref(),
            };
            let Some(got) = got else { continue };
            if *got != e.value {
                return Err(Mismatch { expected: e.clone(), got: got.clone() });
            }
            held.push(format!("{} ({})", e.algorithm.name(), e.source));
        }
        Ok(held)
    }
}

/// A digest that does not match.
#[derive(Debug)]
pub(crate) struct Mismatch {
    expected: Expected,
    got: Vec<u8>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} mismatch: {} states {}, the file's is {}",
            self.expected.algorithm.name(),
            self.expected.source,
            to_hex(&self.expected.value),
            to_hex(&self.got)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    #[test]
    fn every_published_form_is_read() {
        let sha_b64 = STANDARD.encode(from_hex(HELLO_SHA256).expect("hex"));
        let head = Head::new(
            200,
            &[
                ("Repr-Digest", &format!("sha-512=:AAAA:, sha-256=:{sha_b64}:")),
                ("X-Checksum-Crc32", "3610a686"),
                ("Digest", &format!("MD5=abc, SHA-256={sha_b64}")),
                ("x-amz-checksum-crc32", "NhCmhg=="),
                ("x-amz-checksum-sha256", "bm90LWEtZGlnZXN0-3"),
                ("X-Origin-Digest", &format!("sha-256=:{sha_b64}:")),
            ],
        );
        let found = Expected::from_head(&head);
        let sources: Vec<_> = found.iter().map(|e| e.source.as_str()).collect();
        assert_eq!(
            sources,
            [
                "repr-digest",
                "x-checksum-crc32",
                "x-origin-digest",
                "digest",
                "x-amz-checksum-crc32"
            ]
        );
        let mut running = Running::for_expected(&found);
        running.update(b"hel");
        running.update(b"lo");
        let held = running.clone().check(Of::Representation, &found).expect("all match");
        assert_eq!(held.len(), 4);
        running.update(b"!");
        let mismatch = running.check(Of::Representation, &found).expect_err("no longer");
        assert!(
            mismatch.to_string().starts_with("sha-256 mismatch: repr-digest states 2cf24dba"),
            "{mismatch}"
        );
    }

    #[test]
    fn digests_round_trip_through_the_control_file_form() {
        let expected = Expected::sha256_hex(HELLO_SHA256).expect("hex");
        assert_eq!(Expected::from_line(&expected.to_line()), Some(expected));
        assert_eq!(Expected::sha256_hex("abc"), None);
        assert_eq!(Expected::from_line("representation md5 x 00"), None);
    }
}
