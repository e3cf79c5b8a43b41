//! Request path normalisation (`NormalizedPath`) on arbitrary paths, prefixes and bases.
//!
//! Input: one byte choosing the upstream base and where the path is cut for an ancestor, one byte
//! giving the length of a route prefix, the prefix, then the path. Checks what route matching and
//! the upstream request rely on: no panic; an accepted path has only segments that are non-empty,
//! not `.` or `..`, and free of `/`, `\` and control characters; the path written upstream reads
//! back as the same path, stays under the base, carries no dot-segment, and no byte that would end
//! or break a request target (`?`, `#`, space, control, non-ASCII); `strip` succeeds exactly when
//! `starts_with` holds and leaves what follows the prefix; every ancestor cut at a `/` is a prefix.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rangeway::request_path::{NormalizedPath, PathEncoding, PathError};

/// Upstream bases as `HttpUpstream::base_path` holds them, and with the trailing slashes
/// `to_upstream` trims.
const BASES: &[&str] = &["", "/bucket", "/a%20b/c", "/", "/bucket/"];

fuzz_target!(|input: &[u8]| {
    let [control, prefix_len, rest @ ..] = input else { return };
    let (prefix, raw) = rest.split_at(usize::from(*prefix_len).min(rest.len()));
    let (prefix, raw) = (String::from_utf8_lossy(prefix), String::from_utf8_lossy(raw));
    let base = BASES[usize::from(control % 8) % BASES.len()];

    let path = match NormalizedPath::parse(&raw) {
        Ok(path) => path,
        Err(error) => {
            assert_eq!(error == PathError::NotAbsolute, !raw.starts_with('/'), "{raw:?}: {error}");
            return;
        }
    };
    for segment in path.segments() {
        assert!(!segment.is_empty() && segment != "." && segment != "..", "{raw:?}: {segment:?}");
        assert!(!segment.contains(['/', '\\']), "{raw:?}: {segment:?}");
        assert!(!segment.chars().any(char::is_control), "{raw:?}: {segment:?}");
    }
    check_upstream(&path, base);
    // Display is the decoded path; it reads back the same unless a segment holds a '%', which
    // would be decoded a second time.
    if !path.segments().iter().any(|segment| segment.contains('%')) {
        assert_eq!(NormalizedPath::parse(&path.to_string()), Ok(path.clone()), "{raw:?}");
    }

    // Every path starts with itself and with the root.
    check_prefix(&path, &path);
    let root = NormalizedPath::parse("/").expect("the root parses");
    assert!(path.starts_with(&root));
    check_prefix(&path, &root);
    // An ancestor: the path cut just after one of its slashes.
    let slashes: Vec<usize> = raw.match_indices('/').map(|(at, _)| at).collect();
    let cut = slashes[usize::from(control / 8) % slashes.len()];
    let ancestor = NormalizedPath::parse(&raw[..=cut]).expect("a cut accepted path parses");
    assert!(path.starts_with(&ancestor), "{raw:?} does not start with {ancestor}");
    check_prefix(&path, &ancestor);
    if let Ok(prefix) = NormalizedPath::parse(&prefix) {
        check_prefix(&path, &prefix);
    }
});

/// What is sent upstream: `base` (trimmed of trailing slashes), then the path's segments, each
/// percent-encoded into one visible-ASCII `pchar` run.
fn check_upstream(path: &NormalizedPath, base: &str) {
    for encoding in [PathEncoding::Http, PathEncoding::S3] {
        check_upstream_encoded(path, base, encoding);
    }
}

fn check_upstream_encoded(path: &NormalizedPath, base: &str, encoding: PathEncoding) {
    let own = path.to_upstream("", encoding);
    let written = path.to_upstream(base, encoding);
    assert_eq!(written, format!("{}{own}", base.trim_end_matches('/')), "{path:?} under {base:?}");
    assert!(own.starts_with('/'), "{own:?}");
    assert!(
        own.bytes().all(|b| b.is_ascii_graphic() && !b"?#\\".contains(&b)),
        "{own:?} would not be read as one path"
    );
    for piece in own[1..].split('/').filter(|piece| !piece.is_empty()) {
        let decoded = percent_encoding::percent_decode_str(piece).decode_utf8_lossy();
        assert!(decoded != "." && decoded != "..", "{own:?} has a dot-segment");
    }
    assert_eq!(NormalizedPath::parse(&own).as_ref(), Ok(path), "{own:?} reads back otherwise");
}

fn check_prefix(path: &NormalizedPath, prefix: &NormalizedPath) {
    let stripped = path.strip(prefix);
    assert_eq!(path.starts_with(prefix), stripped.is_some(), "{path:?} and {prefix:?}");
    let Some(rest) = stripped else { return };
    let joined: Vec<&String> = prefix.segments().iter().chain(rest.segments()).collect();
    assert_eq!(joined, path.segments().iter().collect::<Vec<_>>());
    let http = PathEncoding::Http;
    let (own, rest_own) = (path.to_upstream("", http), rest.to_upstream("", http));
    if rest.segments().is_empty() {
        assert_eq!(rest_own, "/");
    } else {
        // The stripped path written upstream is what followed the prefix, trailing slash and all.
        let prefix_own = prefix.to_upstream("", http);
        assert_eq!(own, format!("{}{rest_own}", prefix_own.trim_end_matches('/')));
    }
}
