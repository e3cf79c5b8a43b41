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
    pub fn to_upstream(&self, base: &str) -> String {
        let mut out = String::with_capacity(
            base.len() + 1 + self.segments.iter().map(|s| s.len() + 1).sum::<usize>(),
        );
        out.push_str(base.trim_end_matches('/'));
        for segment in &self.segments {
            out.push('/');
            out.extend(utf8_percent_encode(segment, SEGMENT));
        }
        if self.segments.is_empty() || self.trailing_slash {
            out.push('/');
        }
        out
    }
}

impl fmt::Display for NormalizedPath {
    /// The decoded path, for logs and route matching messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.segments.is_empty() {
            return f.write_str("/");
        }
        for segment in &self.segments {
            write!(f, "/{segment}")?;
        }
        if self.trailing_slash {
            f.write_str("/")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn upstream(raw: &str) -> Result<String, PathError> {
        NormalizedPath::parse(raw).map(|p| p.to_upstream(""))
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
        assert_eq!(path.strip(&prefix).unwrap().to_upstream("/base/"), "/base/x/y.bin");
        let filesystem = NormalizedPath::parse("/filesystem").unwrap();
        assert!(!filesystem.starts_with(&prefix));
    }

    proptest! {
        /// Whatever the client sends, an accepted path written upstream under a base stays under
        /// that base and carries no dot-segment or raw control byte.
        #[test]
        fn never_escapes_the_base(raw in "/[a-z./%25\\\\2eEfF0-9c]{0,40}") {
            if let Ok(path) = NormalizedPath::parse(&raw) {
                let written = path.to_upstream("/base");
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
