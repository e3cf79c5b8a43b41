//! What the cache knows of one version of an object ([`Version`]), kept in memory and written
//! beside its slices ([`Meta`]): its id, status, length, fields and freshness, and what pins a
//! fetch of its slices to it.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::Validators;
use rangeway_middleware::rfc9111::Freshness;
use serde::{Deserialize, Serialize};

use super::NOTHING;
use super::store::{SliceId, VersionKey};
use crate::routes::origin_client::Pin;

/// The format number of a version's stored facts.
const META_FORMAT: u32 = 1;

/// One version of an object, as the cache knows it.
#[derive(Debug)]
pub(crate) struct Version {
    pub(super) key: VersionKey,
    pub(super) upstream: String,
    /// The upstream target (path and query) of the object; for a transformed representation of
    /// it, followed by a space and the chain's identity (a target holds no space).
    pub(super) target: String,
    /// Its name among the object's versions, by which its slices are kept: its strong ETag,
    /// quotes included — what a download pinned to it names — or, without one, a name the cache
    /// gives it (`~` and 32 hex digits), so that its slices meet no other version's whatever
    /// else the origin says of it.
    pub(super) id: String,
    /// The status it answers with: 200 for an object's bytes, or another kept whole (a 404, a
    /// 301 with explicit freshness...), whose body its slices hold.
    pub(super) status: StatusCode,
    pub(super) len: u64,
    pub(super) slice_size: u64,
    /// The origin's answer's end-to-end fields, without its length and range.
    pub(super) headers: HeaderMap,
    pub(super) freshness: Freshness,
    pub(super) validators: Validators,
    /// Its origin answered a ranged request with the whole object: its fills ask for the whole
    /// object and pass over what comes before their slices.
    pub(super) ignores_ranges: bool,
}

impl Version {
    /// What a fetch of a range of it is pinned by, when its slices can be fetched apart: its
    /// strong ETag, else its `Last-Modified` when that is a strong validator (RFC 9110 §8.8.2.2:
    /// a minute or more before its `Date`). `None` for a version nothing pins, or that is no
    /// object's bytes (another status): all of it came with the answer that learned it, and a
    /// slice of it missing means learning it again.
    pub(super) fn pin(&self) -> Option<Pin<'_>> {
        if self.status != StatusCode::OK {
            return None;
        }
        if self.id.starts_with('"') {
            return Some(Pin::ETag(&self.id));
        }
        let (modified, date) = (self.validators.last_modified?, self.freshness.date?);
        let strong = date.duration_since(modified).is_ok_and(|d| d >= Duration::from_secs(60));
        let written = self.headers.get(header::LAST_MODIFIED)?.to_str().ok()?;
        strong.then_some(Pin::LastModified(written))
    }

    pub(super) fn slices(&self) -> u64 {
        self.len.div_ceil(self.slice_size)
    }

    /// The bytes of the object slice `index` holds.
    pub(super) fn slice_range(&self, index: u64) -> ByteRange {
        let start = index * self.slice_size;
        ByteRange::new(start, (start + self.slice_size).min(self.len)).unwrap_or(NOTHING)
    }

    pub(super) fn slice_id(&self, index: u64) -> SliceId {
        SliceId { version: self.key, index }
    }

    pub(super) fn to_meta(&self) -> Meta {
        Meta {
            v: META_FORMAT,
            upstream: self.upstream.clone(),
            target: self.target.clone(),
            id: self.id.clone(),
            status: self.status.as_u16(),
            len: self.len,
            slice_size: self.slice_size,
            headers: self
                .headers
                .iter()
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect(),
            request_time: millis(self.freshness.request_time),
            response_time: millis(self.freshness.response_time),
            ignores_ranges: self.ignores_ranges,
        }
    }

    pub(super) fn from_meta(meta: Meta, slice_size: u64) -> Option<Self> {
        if meta.v != META_FORMAT || meta.slice_size != slice_size {
            return None;
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &meta.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            );
        }
        let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let freshness = Freshness::of(&headers, at(meta.request_time), at(meta.response_time));
        Some(Self {
            key: VersionKey::of(&meta.upstream, &meta.target, &meta.id, slice_size),
            validators: crate::range::validators(&headers),
            status: StatusCode::from_u16(meta.status).ok()?,
            upstream: meta.upstream,
            target: meta.target,
            id: meta.id,
            len: meta.len,
            slice_size,
            headers,
            freshness,
            ignores_ranges: meta.ignores_ranges,
        })
    }
}

/// What is written beside a version's slices.
#[derive(Serialize, Deserialize)]
pub(super) struct Meta {
    v: u32,
    upstream: String,
    target: String,
    /// The version's id ([`Version::id`]), under the name it had when only strong ETags were.
    #[serde(rename = "etag")]
    id: String,
    /// Absent from what was written before other statuses were kept: 200.
    #[serde(default = "ok")]
    status: u16,
    len: u64,
    slice_size: u64,
    headers: Vec<(String, String)>,
    /// Milliseconds since the Unix epoch.
    request_time: u64,
    response_time: u64,
    /// Absent from what was written before origins that ignore ranges were kept: `false`.
    #[serde(default)]
    ignores_ranges: bool,
}

const fn ok() -> u16 {
    200
}

/// A name for a version without a strong ETag ([`Version::id`]): new each time, so that the
/// slices of one answer are never taken for another's.
pub(super) fn unpinned_id() -> Option<String> {
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).ok()?;
    Some(format!("~{}", crate::fingerprint::hex(&random, random.len())))
}

fn millis(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
