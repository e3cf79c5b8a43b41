//! What S3 accepts as names: of buckets (which become part of a host name with virtual-host
//! addressing), regions and the key prefix of the folder a route serves.

use crate::values::{Problem, wrong};

/// A region's name: what requests are signed for.
pub(crate) fn region(region: &str) -> Result<String, Problem> {
    if !region.is_empty()
        && region.len() <= 64
        && region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Ok(region.to_owned());
    }
    wrong(
        format!("{region:?} is not a region name"),
        "write the region the bucket is in, e.g. region = \"eu-west-1\" (most S3-compatible \
         stores accept \"us-east-1\")",
    )
}

/// A bucket's name, by S3's naming rules; `_` and capitals too for path-style addressing, as older
/// buckets and S3-compatible stores allow them.
pub(crate) fn bucket(bucket: &str, virtual_host: bool) -> Result<String, Problem> {
    let dns_safe = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-';
    let path_safe = |b: u8| dns_safe(b) || b.is_ascii_uppercase() || b == b'_';
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    if (3..=63).contains(&bucket.len())
        && bucket.bytes().all(|b| if virtual_host { dns_safe(b) } else { path_safe(b) })
        && edge_ok(bucket.as_bytes().first())
        && edge_ok(bucket.as_bytes().last())
        && !bucket.contains("..")
    {
        return Ok(bucket.to_owned());
    }
    let rule = if virtual_host {
        "3 to 63 lower-case letters, digits, '.' and '-', beginning and ending with a letter or \
         digit (it becomes part of a host name)"
    } else {
        "3 to 63 letters, digits, '.', '-' and '_', beginning and ending with a letter or digit"
    };
    wrong(
        format!("{bucket:?} is not a valid bucket name"),
        format!("write the bucket's name: {rule}"),
    )
}

/// A folder of the bucket: segments without `.`/`..`, empty parts or control characters, so that
/// no key can be written above it.
pub(crate) fn key_prefix(prefix: &str) -> Result<Vec<String>, Problem> {
    let segments: Vec<String> =
        prefix.split('/').filter(|s| !s.is_empty()).map(str::to_owned).collect();
    let problem = if prefix.trim_matches('/').contains("//") {
        "has an empty segment (//)"
    } else if segments.iter().any(|s| s == "." || s == "..") {
        "has a '.' or '..' segment"
    } else if prefix.chars().any(|c| c.is_control() || c == '\\') {
        "has a control character or a backslash"
    } else {
        return Ok(segments);
    };
    let fix = "write the folder's key prefix as plain segments, e.g. key_prefix = \"builds/2026\"";
    wrong(problem, fix)
}
