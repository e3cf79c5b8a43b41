//! Entity tags (RFC 9110 §8.8.3) and the lists `If-Match` / `If-None-Match` carry (§13.1.1–2).

use std::fmt;

use super::syntax::{is_ows, trim_ows, trim_ows_start};

/// An entity tag: an opaque validator, weak (`W/"…"`) or strong (`"…"`).
///
/// `==` compares the wire forms (weakness and tag both); validation uses [`strong_eq`] or
/// [`weak_eq`], which is what the RFC means by "match".
///
/// The opaque tag is kept as text. `etagc` admits `obs-text` (bytes 0x80–0xFF); such bytes are
/// accepted when they form UTF-8 and refused otherwise, so a tag can always be written back
/// exactly. A refused tag is no validator at all, which every caller treats the safe way.
///
/// [`strong_eq`]: EntityTag::strong_eq
/// [`weak_eq`]: EntityTag::weak_eq
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntityTag {
    weak: bool,
    /// Between the quotes; every byte is an `etagc`.
    tag: String,
}

impl EntityTag {
    /// `"tag"`; `None` when `tag` has a byte outside `etagc` (a `"`, a control or a space).
    pub fn strong(tag: &str) -> Option<Self> {
        Self::new(false, tag)
    }

    /// `W/"tag"`; `None` when `tag` has a byte outside `etagc`.
    pub fn weak(tag: &str) -> Option<Self> {
        Self::new(true, tag)
    }

    fn new(weak: bool, tag: &str) -> Option<Self> {
        tag.bytes().all(is_etagc).then(|| Self { weak, tag: tag.to_owned() })
    }

    /// Parses an `ETag` value: `"abc"` or `W/"abc"`, OWS around it allowed, nothing else.
    pub fn parse(value: &[u8]) -> Option<Self> {
        match Self::parse_prefix(trim_ows(value))? {
            (tag, b"") => Some(tag),
            _ => None,
        }
    }

    /// One entity-tag at the start of `input` and what follows it.
    fn parse_prefix(input: &[u8]) -> Option<(Self, &[u8])> {
        // `weak = %s"W/"`: case-sensitive, so `w/"x"` is not an entity tag.
        let (weak, quoted) = match input.strip_prefix(b"W/") {
            Some(quoted) => (true, quoted),
            None => (false, input),
        };
        let inner = quoted.strip_prefix(b"\"")?;
        // DQUOTE is not an etagc, so the first one closes the tag.
        let close = inner.iter().position(|&b| b == b'"')?;
        let (opaque, rest) = (&inner[..close], &inner[close + 1..]);
        if !opaque.iter().all(|&b| is_etagc(b)) {
            return None;
        }
        let tag = std::str::from_utf8(opaque).ok()?.to_owned();
        Some((Self { weak, tag }, rest))
    }

    pub const fn is_weak(&self) -> bool {
        self.weak
    }

    pub const fn is_strong(&self) -> bool {
        !self.weak
    }

    /// The opaque tag, without quotes or `W/`.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Strong comparison (§8.8.3.2): both strong and the same tag. Needed wherever the bytes
    /// matter — `If-Match`, `If-Range`, resuming.
    pub fn strong_eq(&self, other: &Self) -> bool {
        !self.weak && !other.weak && self.tag == other.tag
    }

    /// Weak comparison (§8.8.3.2): the same tag, weakness ignored. For `If-None-Match`.
    pub fn weak_eq(&self, other: &Self) -> bool {
        self.tag == other.tag
    }
}

/// The wire form, `"abc"` or `W/"abc"`.
impl fmt::Display for EntityTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let weak = if self.weak { "W/" } else { "" };
        write!(f, "{weak}\"{}\"", self.tag)
    }
}

/// `etagc = %x21 / %x23-7E / obs-text`.
const fn is_etagc(byte: u8) -> bool {
    matches!(byte, 0x21 | 0x23..=0x7E | 0x80..=0xFF)
}

/// The value of an `If-Match` or `If-None-Match` header: `*` or a list of entity tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntityTagList {
    /// `*`: any current representation.
    Any,
    /// The listed tags; may be empty (`#entity-tag` allows an empty list), which matches nothing.
    Tags(Vec<EntityTag>),
}

impl EntityTagList {
    /// Parses every field line of the header as one list (§5.3: lines of a list header combine).
    ///
    /// Whitespace around commas and empty elements are accepted (§5.6.1). `None` when any element
    /// is not an entity tag, or when `*` is not the only member: no reading of such a header is
    /// safe to guess, and each caller treats an unreadable list the way that cannot serve the wrong
    /// bytes (see [`evaluate_preconditions`](super::evaluate_preconditions)).
    pub fn parse<'a, I>(lines: I) -> Option<Self>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let mut any = false;
        let mut tags = Vec::new();
        for line in lines {
            let line = trim_ows(line);
            if line == b"*" {
                if any {
                    return None;
                }
                any = true;
                continue;
            }
            let mut rest = line;
            loop {
                // Skip separators: OWS and the commas of empty elements.
                let skip = rest.iter().take_while(|&&b| is_ows(b) || b == b',').count();
                rest = &rest[skip..];
                if rest.is_empty() {
                    break;
                }
                let (tag, after) = EntityTag::parse_prefix(rest)?;
                tags.push(tag);
                rest = trim_ows_start(after);
                match rest.first() {
                    None | Some(b',') => {}
                    Some(_) => return None,
                }
            }
        }
        match (any, tags.is_empty()) {
            (true, true) => Some(Self::Any),
            (true, false) => None,
            (false, _) => Some(Self::Tags(tags)),
        }
    }

    /// Whether `current`, the selected representation's entity tag (`None` when it has none),
    /// is in the list by strong comparison — the `If-Match` test (§13.1.1).
    ///
    /// `*` matches whenever there is a representation, with or without a tag; this type is only
    /// ever asked about a representation that exists.
    pub fn strong_match(&self, current: Option<&EntityTag>) -> bool {
        self.any_match(current, EntityTag::strong_eq)
    }

    /// Whether `current` is in the list by weak comparison — the `If-None-Match` test (§13.1.2).
    pub fn weak_match(&self, current: Option<&EntityTag>) -> bool {
        self.any_match(current, EntityTag::weak_eq)
    }

    fn any_match(
        &self,
        current: Option<&EntityTag>,
        same: fn(&EntityTag, &EntityTag) -> bool,
    ) -> bool {
        match self {
            Self::Any => true,
            Self::Tags(tags) => {
                current.is_some_and(|current| tags.iter().any(|tag| same(tag, current)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn strong(tag: &str) -> EntityTag {
        EntityTag::strong(tag).unwrap()
    }

    fn weak(tag: &str) -> EntityTag {
        EntityTag::weak(tag).unwrap()
    }

    #[test]
    fn parses_and_writes_back() {
        assert_eq!(EntityTag::parse(b"\"abc\""), Some(strong("abc")));
        assert_eq!(EntityTag::parse(b" W/\"abc\"\t"), Some(weak("abc")));
        assert_eq!(EntityTag::parse(b"\"\""), Some(strong("")));
        assert_eq!(EntityTag::parse(b"\"a,b\""), Some(strong("a,b")));
        assert_eq!(EntityTag::parse("\"caf\u{e9}\"".as_bytes()), Some(strong("caf\u{e9}")));
        for bad in [
            &b"abc"[..],
            b"\"abc",
            b"abc\"",
            b"w/\"abc\"",
            b"W/abc",
            b"W/ \"abc\"",
            b"\"a\"b\"",
            b"\"a b\"",
            b"\"a\x7fb\"",
            b"\"a\x00b\"",
            b"\"\xff\"",
            b"\"a\" \"b\"",
            b"\"a\",\"b\"",
            b"*",
            b"",
        ] {
            assert_eq!(EntityTag::parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(strong("abc").to_string(), "\"abc\"");
        assert_eq!(weak("abc").to_string(), "W/\"abc\"");
        assert_eq!(EntityTag::strong("a\"b"), None);
        assert_eq!(EntityTag::weak("a b"), None);
    }

    #[test]
    fn comparison_table_of_rfc_9110() {
        // §8.8.3.2, the four rows of its example.
        let rows = [
            (weak("1"), weak("1"), false, true),
            (weak("1"), weak("2"), false, false),
            (weak("1"), strong("1"), false, true),
            (strong("1"), strong("1"), true, true),
        ];
        for (a, b, strong_eq, weak_eq) in rows {
            assert_eq!(a.strong_eq(&b), strong_eq, "{a} {b}");
            assert_eq!(b.strong_eq(&a), strong_eq, "{b} {a}");
            assert_eq!(a.weak_eq(&b), weak_eq, "{a} {b}");
            assert!(a.weak_eq(&a));
        }
        assert!(strong("1").is_strong() && !strong("1").is_weak());
        assert!(weak("1").is_weak() && !weak("1").is_strong());
        assert_eq!(weak("x").tag(), "x");
    }

    #[test]
    fn lists() {
        let parse = |lines: &[&str]| EntityTagList::parse(lines.iter().map(|l| l.as_bytes()));
        assert_eq!(parse(&["*"]), Some(EntityTagList::Any));
        assert_eq!(parse(&[" * "]), Some(EntityTagList::Any));
        assert_eq!(
            parse(&["\"a\", W/\"b\" ,,\"c,d\""]),
            Some(EntityTagList::Tags(vec![strong("a"), weak("b"), strong("c,d")]))
        );
        assert_eq!(
            parse(&["\"a\"", "\"b\""]),
            Some(EntityTagList::Tags(vec![strong("a"), strong("b")]))
        );
        assert_eq!(parse(&[""]), Some(EntityTagList::Tags(vec![])));
        assert_eq!(parse(&[" , ,"]), Some(EntityTagList::Tags(vec![])));
        for bad in [
            &["*", "\"a\""][..],
            &["\"a\"", "*"],
            &["*", "*"],
            &["*, \"a\""],
            &["\"a\" \"b\""],
            &["\"a\";\"b\""],
            &["a"],
            &["\"a\", b"],
            &["\"a"],
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn list_matching() {
        let list = EntityTagList::Tags(vec![weak("a"), strong("b")]);
        assert!(!list.strong_match(Some(&strong("a"))));
        assert!(list.weak_match(Some(&strong("a"))));
        assert!(list.strong_match(Some(&strong("b"))));
        assert!(!list.strong_match(Some(&weak("b"))));
        assert!(list.weak_match(Some(&weak("b"))));
        assert!(!list.weak_match(Some(&strong("c"))));
        assert!(!list.strong_match(None) && !list.weak_match(None));
        assert!(EntityTagList::Any.strong_match(None) && EntityTagList::Any.weak_match(None));
        assert!(!EntityTagList::Tags(vec![]).weak_match(Some(&strong("a"))));
    }

    proptest! {
        #[test]
        fn display_round_trips(is_weak in any::<bool>(), tag in "[!#-~\u{80}-\u{10FFFF}]{0,12}") {
            let etag = if is_weak { EntityTag::weak(&tag) } else { EntityTag::strong(&tag) };
            let etag = etag.unwrap();
            prop_assert_eq!(EntityTag::parse(etag.to_string().as_bytes()), Some(etag));
        }

        #[test]
        fn parsing_arbitrary_bytes_never_panics(
            lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 0..4),
        ) {
            for line in &lines {
                if let Some(tag) = EntityTag::parse(line) {
                    prop_assert_eq!(EntityTag::parse(tag.to_string().as_bytes()), Some(tag));
                }
            }
            let _ = EntityTagList::parse(lines.iter().map(Vec::as_slice));
        }
    }
}
