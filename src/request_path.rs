//! Request path normalisation.
//!
//! A client path is decoded once, checked, and split into segments; everything downstream of this
//! module (route matching, prefix stripping, the upstream path, the `dir` origin) works on those
//! segments, so a path can never be interpreted two ways. Anything that could step outside a route's
//! upstream prefix is refused rather than resolved: `..` in any spelling, encoded slashes or
//! backslashes, and NUL.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// Characters left as they are when a segment is written back into an upstream path: RFC 3986's
/// unreserved set plus the sub-delims and `:`/`@` that `pchar` allows. Everything else (space,
/// `%`, `?`, `#`, non-ASCII...) is percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'!')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')')
    .remove(b'*')
    .remove(b'+')
    .remove(b',')
    .remove(b';')
    .remove(b'=')
    .remove(b':')
    .remove(b'@');

/// Characters SigV4 leaves as they are in an S3 object key: RFC 3986's unreserved set only. S3
/// reads `+` in a path as itself but some stores as a space, and signs the path as sent: writing
/// every other byte as `%XX` makes the path sent and the path signed one and the same.
const S3_KEY_SEGMENT: &AsciiSet =
    &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// How segments are written into an upstream path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathEncoding {
    /// RFC 3986 `pchar`: sub-delims, `:` and `@` as they are.
    Http,
    /// AWS SigV4's URI encoding: everything but the unreserved set percent-encoded.
    S3,
}

impl PathEncoding {
    fn set(self) -> &'static AsciiSet {
        match self {
            Self::Http => SEGMENT,
            Self::S3 => S3_KEY_SEGMENT,
        }
    }

    /// `segment` written in this encoding.
    pub fn encode(self, segment: &str) -> impl fmt::Display + '_ {
        utf8_percent_encode(segment, self.set())
    }
}

/// A decoded, checked request path: non-empty segments that are neither `.` nor `..`, and a note
/// of whether the client wrote a trailing slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalizedPath {
    segments: Vec<String>,
    trailing_slash: bool,
}

/// Why a path was refused. Every variant is answered with 400 Bad Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    #[error("the path does not start with '/'")]
    NotAbsolute,
    #[error("the path contains a '..' segment")]
    DotDot,
    #[error("the path contains a backslash")]
    Backslash,
    #[error("the path contains an encoded '/'")]
    EncodedSlash,
    #[error("the path contains a NUL or control byte")]
    Control,
    #[error("the path is not valid UTF-8 once decoded")]
    NotUtf8,
}

impl NormalizedPath {
    /// Decodes and checks the path part of a request target (without the query).
    pub fn parse(raw: &str) -> Result<Self, PathError> {
        let rest = raw.strip_prefix('/').ok_or(PathError::NotAbsolute)?;
        let mut segments = Vec::new();
        for raw_segment in rest.split('/') {
            if raw_segment.is_empty() {
                continue; // "//" collapses
            }
            if raw_segment.bytes().all(|byte| byte.is_ascii_graphic() && !b"%\\".contains(&byte)) {
                // Nothing to decode or refuse (the common case, checked in one pass).
                match raw_segment {
                    "." => continue,
                    ".." => return Err(PathError::DotDot),
                    _ => segments.push(raw_segment.to_owned()),
                }
                continue;
            }
            let decoded =
                percent_decode_str(raw_segment).decode_utf8().map_err(|_| PathError::NotUtf8)?;
            if decoded.contains('/') {
                return Err(PathError::EncodedSlash);
            }
            if decoded.contains('\\') {
                return Err(PathError::Backslash);
            }
            if decoded.chars().any(char::is_control) {
                return Err(PathError::Control);
            }
            match &*decoded {
                "." => continue,
                ".." => return Err(PathError::DotDot),
                _ => segments.push(decoded.into_owned()),
            }
        }
        let trailing_slash = !segments.is_empty() && raw.ends_with('/');
        Ok(Self { segments, trailing_slash })
    }

    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// Whether `prefix` (itself normalised) is this path or one of its ancestors.
    pub fn starts_with(&self, prefix: &NormalizedPath) -> bool {
        self.segments.starts_with(&prefix.segments)
    }

    /// This path with the leading segments of `prefix` removed.
    pub fn strip(&self, prefix: &NormalizedPath) -> Option<NormalizedPath> {
        let rest = self.segments.strip_prefix(prefix.segments.as_slice())?;
        Some(Self {
            segments: rest.to_vec(),
            trailing_slash: self.trailing_slash && !rest.is_empty(),
        })
    }

    /// The path written for an upstream: `base` (already encoded, without trailing slash) followed
    /// by every segment percent-encoded.
    pub fn to_upstream(&self, base: &str, encoding: PathEncoding) -> String {
        let mut out = String::with_capacity(
            base.len() + 1 + self.segments.iter().map(|s| s.len() + 1).sum::<usize>(),
        );
        out.push_str(base.trim_end_matches('/'));
        for segment in &self.segments {
            out.push('/');
            out.extend(utf8_percent_encode(segment, encoding.set()));
        }
        if self.segments.is_empty() || self.trailing_slash {
            out.push('/');
        }
        out
    }

    /// The length of what [`Self::write_to`] writes.
    pub fn written_len(&self) -> usize {
        let slashes = self.segments.len() + usize::from(self.trailing_slash);
        let segments: usize = self.segments.iter().map(String::len).sum();
        slashes.max(1) + segments
    }

    /// Writes the decoded path onto `out`, as `Display` shows it: onto a `String`, without the
    /// formatting machinery `format!` runs per piece (a download's object key is made so on
    /// every GET).
    pub fn write_to(&self, out: &mut impl fmt::Write) -> fmt::Result {
        if self.segments.is_empty() {
            return out.write_str("/");
        }
        for segment in &self.segments {
            out.write_str("/")?;
            out.write_str(segment)?;
        }
        if self.trailing_slash {
            out.write_str("/")?;
        }
        Ok(())
    }
}

impl fmt::Display for NormalizedPath {
    /// The decoded path, for logs and route matching messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn upstream(raw: &str) -> Result<String, PathError> {
        NormalizedPath::parse(raw).map(|p| p.to_upstream("", PathEncoding::Http))
    }

    #[test]
    fn table() {
        let cases: &[(&str, Result<&str, PathError>)] = &[
            ("/", Ok("/")),
            ("/a.bin", Ok("/a.bin")),
            ("//a//b/", Ok("/a/b/")),
            ("/a/./b", Ok("/a/b")),
            ("/a/../b", Err(PathError::DotDot)),
            ("/a/%2e%2e/b", Err(PathError::DotDot)),
            ("/a/%2E%2e", Err(PathError::DotDot)),
            ("/a/.%2e/b", Err(PathError::DotDot)),
            ("/a%2fb", Err(PathError::EncodedSlash)),
            ("/a%5c..%5cb", Err(PathError::Backslash)),
            ("/a\\b", Err(PathError::Backslash)),
            ("/a%00b", Err(PathError::Control)),
            ("/a\u{1}b", Err(PathError::Control)),
            ("/a\u{7f}", Err(PathError::Control)),
            ("/a%ffb", Err(PathError::NotUtf8)),
            ("a", Err(PathError::NotAbsolute)),
            ("/with space/ü.bin", Ok("/with%20space/%C3%BC.bin")),
            ("/with%20space", Ok("/with%20space")),
            ("/100%25", Ok("/100%25")),
            ("/a+b~c", Ok("/a+b~c")),
            ("/q%3Fx%23y", Ok("/q%3Fx%23y")),
        ];
        for (raw, want) in cases {
            assert_eq!(upstream(raw).as_deref(), want.as_deref(), "{raw}");
        }
    }

    #[test]
    fn strip_prefix_keeps_the_rest() {
        let prefix = NormalizedPath::parse("/files/").unwrap();
        let path = NormalizedPath::parse("/files/x/y.bin").unwrap();
        assert!(path.starts_with(&prefix));
        assert_eq!(
            path.strip(&prefix).unwrap().to_upstream("/base/", PathEncoding::Http),
            "/base/x/y.bin"
        );
        let filesystem = NormalizedPath::parse("/filesystem").unwrap();
        assert!(!filesystem.starts_with(&prefix));
    }

    #[test]
    fn s3_keys_are_written_as_sigv4_encodes_them() {
        let key =
            |raw: &str| NormalizedPath::parse(raw).unwrap().to_upstream("/b", PathEncoding::S3);
        assert_eq!(key("/with space/ü.bin"), "/b/with%20space/%C3%BC.bin");
        assert_eq!(key("/a+b~c_d-e.f"), "/b/a%2Bb~c_d-e.f");
        assert_eq!(key("/100%25"), "/b/100%25");
        assert_eq!(key("/q%3Fx%23y=z&w"), "/b/q%3Fx%23y%3Dz%26w");
        assert_eq!(key("/a!$'()*,;:@"), "/b/a%21%24%27%28%29%2A%2C%3B%3A%40");
    }

    proptest! {
        /// Whatever the client sends, an accepted path written upstream under a base stays under
        /// that base and carries no dot-segment or raw control byte.
        #[test]
        fn never_escapes_the_base(raw in "/[a-z./%25\\\\2eEfF0-9c]{0,40}") {
            if let Ok(path) = NormalizedPath::parse(&raw) {
                let written = path.to_upstream("/base", PathEncoding::Http);
                prop_assert!(written.starts_with("/base/"));
                for segment in written.split('/') {
                    prop_assert!(segment != "..");
                    let decoded = percent_decode_str(segment).decode_utf8_lossy();
                    prop_assert!(decoded != ".." && !decoded.contains('/'));
                }
            }
        }
    }
}
