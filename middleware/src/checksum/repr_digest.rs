//! `Repr-Digest` and `Want-Repr-Digest` (RFC 9530): Structured Field dictionaries (RFC 9651)
//! keyed by hash algorithm, read as far as finding `sha-256`.
//!
//! The dictionary is parsed in full, as RFC 9651 §4.2 requires: a field that does not parse is
//! ignored whole, never half-read. Values other than the one looked up are checked for syntax and
//! skipped.

use base64::Engine as _;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};

/// RFC 9651 §4.2.7: decoders should not insist on padding, nor on zero pad bits.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// RFC 9530's name for SHA-256.
const SHA_256: &[u8] = b"sha-256";

/// The `Repr-Digest` value stating a SHA-256 digest: `sha-256=:<base64>:`.
pub fn repr_digest(sha256: &[u8; 32]) -> String {
    format!("sha-256=:{}:", STANDARD.encode(sha256))
}

/// The SHA-256 digest a `Repr-Digest` (or `Content-Digest`) field states, from all its lines;
/// `None` when it states none, or the field does not parse.
pub fn parse_repr_digest_sha256<'a, I>(lines: I) -> Option<[u8; 32]>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    match find(lines, SHA_256)? {
        Item::Bytes(encoded) => LENIENT.decode(encoded).ok()?.try_into().ok(),
        _ => None,
    }
}

/// The preference, 0 to 10, a `Want-Repr-Digest` field gives SHA-256 (0: not acceptable);
/// `None` when it names no SHA-256, names it with a value outside 0 to 10, or does not parse.
pub fn want_repr_digest_sha256<'a, I>(lines: I) -> Option<u8>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    match find(lines, SHA_256)? {
        Item::Integer(weight) => u8::try_from(weight).ok().filter(|&weight| weight <= 10),
        _ => None,
    }
}

/// The value the dictionary holds for `key` (the last one, if repeated: §4.2.2).
fn find<'a, I>(lines: I, key: &[u8]) -> Option<Item<'a>>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let mut found = None;
    for line in lines {
        // Lines combine with commas (§4.2); each is a run of whole members, so parsing them one
        // by one is the same, and empty lines add none.
        let mut parser = Parser { input: line };
        parser.skip_sp();
        if parser.input.is_empty() {
            continue;
        }
        for (member_key, item) in parser.dictionary()? {
            if member_key == key {
                found = Some(item);
            }
        }
    }
    found
}

/// The bare items this module looks at; the rest are only checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item<'a> {
    /// A byte sequence, still base64-encoded.
    Bytes(&'a [u8]),
    Integer(i64),
    Other,
}

/// RFC 9651 §4.2 parsing over one field line.
struct Parser<'a> {
    input: &'a [u8],
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.input.first().copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let matched = self.peek() == Some(byte);
        if matched {
            self.input = &self.input[1..];
        }
        matched
    }

    fn take_while(&mut self, pred: impl Fn(u8) -> bool) -> &'a [u8] {
        let len = self.input.iter().take_while(|&&b| pred(b)).count();
        let (taken, rest) = self.input.split_at(len);
        self.input = rest;
        taken
    }

    fn skip_sp(&mut self) {
        self.take_while(|b| b == b' ');
    }

    fn skip_ows(&mut self) {
        self.take_while(|b| b == b' ' || b == b'\t');
    }

    /// §4.2.2, then the end of the line (trailing spaces allowed, §4.2).
    fn dictionary(&mut self) -> Option<Vec<(&'a [u8], Item<'a>)>> {
        let mut members = Vec::new();
        loop {
            let key = self.key()?;
            let item = if self.eat(b'=') {
                self.item_or_inner_list()?
            } else {
                self.parameters()?;
                Item::Other
            };
            members.push((key, item));
            self.skip_ows();
            if self.input.is_empty() {
                return Some(members);
            }
            if !self.eat(b',') {
                return None;
            }
            self.skip_ows();
            if self.input.is_empty() {
                return None;
            }
        }
    }

    /// §4.2.1.1: an item, or an inner list, with its parameters.
    fn item_or_inner_list(&mut self) -> Option<Item<'a>> {
        if self.eat(b'(') {
            loop {
                self.skip_sp();
                if self.eat(b')') {
                    break;
                }
                self.bare_item()?;
                self.parameters()?;
                if !matches!(self.peek(), Some(b' ' | b')')) {
                    return None;
                }
            }
            self.parameters()?;
            return Some(Item::Other);
        }
        let item = self.bare_item()?;
        self.parameters()?;
        Some(item)
    }

    /// §4.2.3.2.
    fn parameters(&mut self) -> Option<()> {
        while self.eat(b';') {
            self.skip_sp();
            self.key()?;
            if self.eat(b'=') {
                self.bare_item()?;
            }
        }
        Some(())
    }

    /// §4.2.3.3.
    fn key(&mut self) -> Option<&'a [u8]> {
        if !matches!(self.peek(), Some(b'a'..=b'z' | b'*')) {
            return None;
        }
        Some(
            self.take_while(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')),
        )
    }

    /// §4.2.3.1.
    fn bare_item(&mut self) -> Option<Item<'a>> {
        match self.peek()? {
            b'-' | b'0'..=b'9' => self.number(),
            b'"' => self.string().map(|()| Item::Other),
            b'*' | b'A'..=b'Z' | b'a'..=b'z' => {
                self.take_while(|b| is_tchar(b) || b == b':' || b == b'/');
                Some(Item::Other)
            }
            b':' => self.byte_sequence(),
            b'?' => {
                self.input = &self.input[1..];
                (self.eat(b'0') || self.eat(b'1')).then_some(Item::Other)
            }
            b'@' => {
                self.input = &self.input[1..];
                match self.number()? {
                    Item::Integer(_) => Some(Item::Other),
                    _ => None,
                }
            }
            b'%' => self.display_string().map(|()| Item::Other),
            _ => None,
        }
    }

    /// §4.2.4: an integer of at most 15 digits, or a decimal of at most 12 + 3.
    fn number(&mut self) -> Option<Item<'a>> {
        let negative = self.eat(b'-');
        let whole = self.take_while(|b| b.is_ascii_digit());
        if whole.is_empty() {
            return None;
        }
        if self.eat(b'.') {
            let fraction = self.take_while(|b| b.is_ascii_digit());
            return (whole.len() <= 12 && (1..=3).contains(&fraction.len())).then_some(Item::Other);
        }
        if whole.len() > 15 {
            return None;
        }
        // At most 15 digits: no overflow.
        let value = whole.iter().fold(0i64, |value, &digit| value * 10 + i64::from(digit - b'0'));
        Some(Item::Integer(if negative { -value } else { value }))
    }

    /// §4.2.5.
    fn string(&mut self) -> Option<()> {
        self.eat(b'"').then_some(())?;
        loop {
            match self.peek()? {
                b'"' => {
                    self.input = &self.input[1..];
                    return Some(());
                }
                b'\\' => {
                    self.input = &self.input[1..];
                    if !(self.eat(b'"') || self.eat(b'\\')) {
                        return None;
                    }
                }
                0x20..=0x7e => self.input = &self.input[1..],
                _ => return None,
            }
        }
    }

    /// §4.2.7: the base64 text between colons, checked for its alphabet.
    fn byte_sequence(&mut self) -> Option<Item<'a>> {
        self.eat(b':').then_some(())?;
        let encoded =
            self.take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
        self.eat(b':').then_some(Item::Bytes(encoded))
    }

    /// §4.2.10: `%"…"` with lowercase `%xx` escapes (its UTF-8 is not checked: never used).
    fn display_string(&mut self) -> Option<()> {
        (self.eat(b'%') && self.eat(b'"')).then_some(())?;
        loop {
            match self.peek()? {
                b'"' => {
                    self.input = &self.input[1..];
                    return Some(());
                }
                b'%' => {
                    self.input = &self.input[1..];
                    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
                    match self.input {
                        [high, low, rest @ ..] if hex(*high) && hex(*low) => self.input = rest,
                        _ => return None,
                    }
                }
                0x20..=0x7e => self.input = &self.input[1..],
                _ => return None,
            }
        }
    }
}

/// `tchar` (RFC 9110 §5.6.2).
const fn is_tchar(byte: u8) -> bool {
    matches!(byte,
        b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`'
        | b'|' | b'~' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest as _, Sha256};

    fn lines<'a>(values: &[&'a str]) -> Vec<&'a [u8]> {
        values.iter().map(|value| value.as_bytes()).collect()
    }

    #[test]
    fn formats_rfc_9530_example() {
        // RFC 9530 Appendix B.1: `{"hello": "world"}`.
        let digest: [u8; 32] = Sha256::digest(b"{\"hello\": \"world\"}").into();
        assert_eq!(repr_digest(&digest), "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:");
    }

    #[test]
    fn finds_sha_256_among_other_members() {
        let digest: [u8; 32] = Sha256::digest(b"x").into();
        let value = repr_digest(&digest);
        let found = |values: &[&str]| parse_repr_digest_sha256(lines(values));
        assert_eq!(found(&[&value]), Some(digest));
        let mixed = format!("sha-512=:YWJj:, {value};p=1 ,unixsum=30");
        assert_eq!(found(&[&mixed]), Some(digest));
        assert_eq!(found(&["sha-512=:YWJj:", &value]), Some(digest));
        // Unpadded base64 is accepted.
        let unpadded = format!(
            "sha-256=:{}:",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        );
        assert_eq!(found(&[&unpadded]), Some(digest));
        // Absent, the wrong type or length, or a field that does not parse: nothing.
        assert_eq!(found(&[]), None);
        assert_eq!(found(&["sha-512=:YWJj:"]), None);
        assert_eq!(found(&["sha-256=:YWJj:"]), None);
        assert_eq!(found(&["sha-256=\"abc\""]), None);
        assert_eq!(found(&[&format!("{value},")]), None);
        assert_eq!(found(&[&format!("{value}, SHA-512=:YWJj:")]), None);
        assert_eq!(found(&[&value, "garbage here"]), None);
        assert_eq!(found(&[&value.replace(':', "")]), None);
    }

    #[test]
    fn the_last_of_repeated_keys_wins() {
        let a: [u8; 32] = Sha256::digest(b"a").into();
        let b: [u8; 32] = Sha256::digest(b"b").into();
        let both = format!("{}, {}", repr_digest(&a), repr_digest(&b));
        assert_eq!(parse_repr_digest_sha256(lines(&[&both])), Some(b));
    }

    #[test]
    fn want_repr_digest_weights() {
        let want = |values: &[&str]| want_repr_digest_sha256(lines(values));
        assert_eq!(want(&["sha-256=1"]), Some(1));
        assert_eq!(want(&["sha-512=3, sha-256=10, unixsum=0"]), Some(10));
        assert_eq!(want(&["sha-512=3", "sha-256=0"]), Some(0));
        assert_eq!(want(&["sha-512=3"]), None);
        assert_eq!(want(&["sha-256=11"]), None);
        assert_eq!(want(&["sha-256=-1"]), None);
        assert_eq!(want(&["sha-256"]), None);
        assert_eq!(want(&["sha-256=1.0"]), None);
        assert_eq!(want(&["sha-256=1, sha-512=9999999999999999"]), None);
    }

    #[test]
    fn other_item_types_are_skipped() {
        let value = "a=(1 \"s\" tok:/x ?1 @123 %\"caf%c3%a9\");q=2.5, b=?0, c, \
                     d=\"esc\\\"aped\";x, e=*tok, sha-256=3";
        assert_eq!(want_repr_digest_sha256(lines(&[value])), Some(3));
        for bad in ["a=(1", "a=\"open", "a=%\"%zz\"", "a=?2", "a=1.2345", "a=-", "A=1", "a=@x"] {
            let line = format!("{bad}, sha-256=3");
            assert_eq!(want_repr_digest_sha256(lines(&[&line])), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn no_input_panics(line in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = parse_repr_digest_sha256([line.as_slice()]);
            let _ = want_repr_digest_sha256([line.as_slice()]);
        }
    }
}
