//! What a request asks for and what the proxy answers with.
//!
//! The RFC 9110 machinery (parsing, resolution, validators, multipart) lives in the sans-I/O
//! `rangeway_middleware::rfc9110`; this module applies it to one proxied exchange:
//! [`ClientRange`] reads the client's request, [`ClientRange::upstream_spec`] plans the Range sent
//! upstream, and [`shape_response`] decides — from the upstream's status and headers — what the
//! client gets. Origins that ignore Range, answer another range than asked, or ignore If-Range are
//! all caught here: their bytes are never passed off as the range the client asked for.

use std::time::SystemTime;

use crate::state::ObjectVersion;
use http::{HeaderMap, Method, header};
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::{
    ContentRange, EntityTag, IgnoreReason, Precondition, RangeLimits, RangeRequest, RangeSet,
    RangeSpec, Resolution, Validators, evaluate_preconditions, if_range_holds, parse_content_range,
    parse_range_header,
};

/// The client's Range header, as far as this request is concerned.
#[derive(Debug, Clone)]
pub enum ClientRange {
    /// No Range header, or a method other than GET (RFC 9110 §14.2: Range is ignored there).
    Absent,
    /// A Range header the server ignores and answers with the whole representation.
    Ignored(IgnoreReason),
    Bytes(RangeSet),
}

impl ClientRange {
    pub fn from_request(method: &Method, headers: &HeaderMap, limits: &RangeLimits) -> Self {
        if method != Method::GET {
            return Self::Absent;
        }
        match parse_range_header(headers, limits) {
            None => Self::Absent,
            Some(RangeRequest::Ignore(reason)) => Self::Ignored(reason),
            Some(RangeRequest::Bytes(set)) => Self::Bytes(set),
        }
    }

    /// The single range to ask the upstream for: one that covers every byte this request can
    /// resolve to, whatever the object's length. `None`: ask for the whole representation.
    ///
    /// Numbers past any object's length are written as what they mean (RFC 9110 §14.1.2): a last
    /// position there is the end (`bytes=N-`), a suffix that long the whole object (`bytes=0-`).
    /// As written, origins that keep offsets in a signed 64-bit number (nginx) refuse them.
    pub fn upstream_spec(&self) -> Option<RangeSpec> {
        let spec = match self {
            Self::Bytes(set) => set.covering_spec()?,
            Self::Absent | Self::Ignored(_) => return None,
        };
        Some(match spec {
            RangeSpec::Closed { first, last } if last >= PAST_ANY_OBJECT => {
                RangeSpec::From { first }
            }
            RangeSpec::Suffix { len } if len >= PAST_ANY_OBJECT => RangeSpec::From { first: 0 },
            spec => spec,
        })
    }
}

/// An offset no object reaches: 8 PiB, past what the state store keeps exactly (2^53).
const PAST_ANY_OBJECT: u64 = 1 << 53;

/// What the proxy does with an upstream response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// Pass the upstream response on unchanged (headers aside), body untouched.
    Forward,
    /// Answer 206 with one range, cut from an upstream body whose first byte is `stream_start`.
    Single { range: ByteRange, complete_len: u64, stream_start: u64 },
    /// Answer 206 multipart/byteranges, cut from an upstream body starting at `stream_start`,
    /// and from the `rest` of the ranges, fetched one after the other past that body (see
    /// [`Asked::part_gap`]); `rest` is empty when the body holds every range.
    Multiple { ranges: Vec<ByteRange>, complete_len: u64, stream_start: u64, rest: Vec<ByteRange> },
    /// Answer 416 with `Content-Range: bytes */complete_len`.
    Unsatisfiable { complete_len: u64 },
    /// Answer 304: a precondition of the client says its copy is current.
    NotModified,
    /// Answer 412: a precondition of the client failed.
    PreconditionFailed,
    /// The upstream's answer cannot be turned into a correct response.
    BadGateway(&'static str),
}

/// The validators of the representation an upstream response carries.
pub fn validators(headers: &HeaderMap) -> Validators {
    Validators {
        etag: headers.get(header::ETAG).and_then(|v| EntityTag::parse(v.as_bytes())),
        last_modified: headers
            .get(header::LAST_MODIFIED)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok()),
    }
}

/// The request, as [`shape_response`] judges an upstream's answer to it.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub method: &'a Method,
    /// The client's request header fields.
    pub headers: &'a HeaderMap,
    pub range: &'a ClientRange,
    /// The Range sent upstream (from [`ClientRange::upstream_spec`]), if any.
    pub sent: Option<&'a RangeSpec>,
    /// The client's If-Range date went upstream beside it, rangeway having found that it holds
    /// ([`IfRangeDate::Forward`]): a 206 is the origin confirming the version.
    pub if_range_date_sent: bool,
    /// The ranges of a multipart answer may be fetched apart, one read per stretch of ranges
    /// less than this apart ([`RangeSet::fetches`]), when the upstream's body holds only the
    /// first stretch.
    pub part_gap: Option<u64>,
    /// The request is a bare resume whose session the store may have lost, with every session
    /// written since this time: the range applies only to a representation last modified before
    /// it (any bytes its client holds are then of this version); any other gets the whole.
    pub lost_sessions_since: Option<SystemTime>,
}

/// How a client's If-Range with an HTTP-date is sent on (RFC 9110 §13.1.5). rangeway's rule for
/// dates is stricter than an origin's exact match ([`if_range_holds`]), so rangeway decides, by
/// the validators it knows of the object, and sends upstream only what it decided: judging the
/// origin's answer by another rule than the origin's would refuse answers the origin was right to
/// give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfRangeDate {
    /// None, or an entity tag, which origins compare as rangeway does: sent on as it is.
    NotADate,
    /// It holds by what rangeway knows: the date goes upstream with the Range, and the origin
    /// confirms (206) or refuses (200) the version.
    Forward,
    /// It does not hold by what rangeway knows, or nothing is known: the whole object is asked
    /// for, and the range is cut from it when the answer shows that the date holds.
    AskWhole,
}

impl IfRangeDate {
    /// For a range request with `headers`, and the validators rangeway knows of the object.
    pub fn decide(headers: &HeaderMap, known: Option<&Validators>, now: SystemTime) -> Self {
        let Some(value) = headers.get(header::IF_RANGE) else { return Self::NotADate };
        let value = value.as_bytes().trim_ascii_start();
        if value.starts_with(b"\"") || value.starts_with(b"W/") {
            return Self::NotADate;
        }
        match known {
            Some(known) if if_range_holds(headers, known, now) => Self::Forward,
            _ => Self::AskWhole,
        }
    }
}

/// Decides the client's answer from the upstream's status and headers.
///
/// `validators` are the answer's, from [`validators`] (the caller needs them too: parsed once).
pub fn shape_response(
    asked: &Asked<'_>,
    status: u16,
    response: &HeaderMap,
    validators: &Validators,
    now: SystemTime,
) -> Shape {
    let Asked {
        method,
        headers: request,
        range: client,
        sent,
        if_range_date_sent,
        part_gap,
        lost_sessions_since,
    } = *asked;
    if !matches!(status, 200 | 206) {
        // 304, 412, 416, errors: the upstream has already answered the question asked.
        return Shape::Forward;
    }
    // The upstream was sent the client's preconditions too; evaluating them again here makes the
    // answer right even behind an origin that ignores them.
    match evaluate_preconditions(method, request, validators) {
        Precondition::Proceed => {}
        Precondition::NotModified => return Shape::NotModified,
        Precondition::Failed => return Shape::PreconditionFailed,
    }
    let ClientRange::Bytes(set) = client else {
        return if status == 206 {
            Shape::BadGateway("the upstream answered 206 to a request without a range")
        } else {
            Shape::Forward
        };
    };
    let predates_lost_sessions = lost_sessions_since
        .is_none_or(|since| validators.last_modified.is_some_and(|modified| modified < since));
    let range_applies = predates_lost_sessions
        && (if_range_holds(request, validators, now) || (status == 206 && if_range_date_sent));

    if status == 200 {
        if !range_applies {
            return Shape::Forward;
        }
        // The upstream sent the whole representation (it ignored Range or we asked for all of
        // it): cut the range out ourselves when its length is known.
        let Some(complete_len) = content_length(response) else {
            return Shape::Forward;
        };
        return resolve(set, complete_len, ByteRange::whole(complete_len), false, None);
    }

    // 206
    if sent.is_none() {
        return Shape::BadGateway("the upstream answered 206 to a request without a range");
    }
    if !range_applies {
        // If-Range failed, so the client must get the whole representation — but the upstream
        // sent a part: it did not evaluate the If-Range it was given.
        return Shape::BadGateway("the upstream answered 206 although If-Range did not match");
    }
    let Some((got, complete_len)) = stated_range(response) else {
        return Shape::BadGateway("the upstream's 206 has no usable Content-Range");
    };
    if let Some(len) = content_length(response)
        && len != got.len()
    {
        return Shape::BadGateway(
            "the upstream's 206 Content-Length disagrees with its Content-Range",
        );
    }
    let Some(complete_len) = complete_len else {
        return Shape::BadGateway("the upstream's 206 does not say the representation's length");
    };
    resolve(set, complete_len, got, true, part_gap)
}

/// Resolves the client's ranges against the representation's length and checks that the bytes
/// the upstream is sending (`available`) hold all of them. `partial`: the upstream is sending a
/// 206 for `available`, which can be forwarded as it is when it is exactly the range asked for.
///
/// With `part_gap`, the ranges past `available` may be fetched apart: the stretches of them that
/// [`RangeSet::fetches`] makes, past the end of `available`, are the answer's `rest`.
fn resolve(
    set: &RangeSet,
    complete_len: u64,
    available: ByteRange,
    partial: bool,
    part_gap: Option<u64>,
) -> Shape {
    let stream_start = available.start();
    match set.resolve(complete_len) {
        Resolution::Unsatisfiable => Shape::Unsatisfiable { complete_len },
        Resolution::Single(range) if available.contains_range(&range) => {
            if partial && range == available {
                // Exactly what the upstream is sending: no cutting needed.
                Shape::Forward
            } else {
                Shape::Single { range, complete_len, stream_start }
            }
        }
        Resolution::Multiple(ranges) if ranges.iter().all(|r| available.contains_range(r)) => {
            Shape::Multiple { ranges, complete_len, stream_start, rest: Vec::new() }
        }
        Resolution::Multiple(ranges) if ranges[0].start() >= stream_start => {
            let rest = part_gap.map(|gap| {
                set.fetches(complete_len, gap)
                    .into_iter()
                    .filter_map(|fetch| {
                        ByteRange::new(fetch.start().max(available.end()), fetch.end())
                    })
                    .filter(|fetch| !fetch.is_empty())
                    .collect::<Vec<_>>()
            });
            match rest {
                Some(rest) if ranges.iter().all(|range| held(range, available, &rest)) => {
                    Shape::Multiple { ranges, complete_len, stream_start, rest }
                }
                _ => Shape::BadGateway("the upstream's 206 does not cover the ranges asked for"),
            }
        }
        Resolution::Single(_) | Resolution::Multiple(_) => {
            Shape::BadGateway("the upstream's 206 does not cover the range asked for")
        }
    }
}

/// Whether every byte of `range` is in the body (`available`) or in the stretches fetched after it
/// (`rest`, which start at or past the body's end, in order).
fn held(range: &ByteRange, available: ByteRange, rest: &[ByteRange]) -> bool {
    let from_body = available.intersect(range).map_or(0, |r| r.len());
    let from_rest: u64 =
        rest.iter().filter_map(|fetch| fetch.intersect(range)).map(|r| r.len()).sum();
    from_body + from_rest == range.len()
}

/// What a broken body can be continued with: the stream's end and the version it is of.
pub struct Continuable {
    /// One past the last byte of the object the upstream body runs to.
    pub end: u64,
    pub complete_len: u64,
    pub etag: String,
}

impl Continuable {
    /// For an answer whose body is `stream` of the object: `None` without a strong ETag, which
    /// alone can show that a continuation is of the same version.
    pub fn of(stream: ByteRange, headers: &HeaderMap) -> Option<Self> {
        let etag = strong_etag(headers)?;
        let complete_len = stated_range(headers).and_then(|(_, len)| len).unwrap_or(stream.end());
        Some(Self { end: stream.end(), complete_len, etag: etag.to_owned() })
    }
}

/// The answer's strong ETag, quotes included: which alone shows that two answers are of one
/// version (RFC 9110 §8.8.1).
pub fn strong_etag(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::ETAG).and_then(|v| v.to_str().ok()).filter(|etag| etag.starts_with('"'))
}

/// Which bytes of the object a 200 or 206 body holds, when its header says.
pub fn body_range(status: u16, headers: &HeaderMap) -> Option<ByteRange> {
    match status {
        200 => content_length(headers).map(ByteRange::whole),
        206 => stated_range(headers).map(|(range, _)| range),
        _ => None,
    }
}

/// The bytes a 206's `Content-Range` says its body holds, and the object's length when it says
/// (`bytes a-b/*` does not); `None` without a satisfied range.
pub fn stated_range(headers: &HeaderMap) -> Option<(ByteRange, Option<u64>)> {
    match parse_content_range(headers.get(header::CONTENT_RANGE)?.as_bytes())? {
        ContentRange::Satisfied { range, complete_len } => Some((range, complete_len)),
        ContentRange::Unsatisfied { .. } => None,
    }
}

/// Ranges less than this apart are read through as one; farther apart, each stretch is fetched
/// on its own, so that what a multipart answer costs the origin stays within the bytes asked for
/// and a gap per stretch (a client asking for the first and the last byte of a large object
/// pulled all of it). About what a request of its own costs on a fast link.
pub const PART_GAP: u64 = 64 << 10;

/// The one range from the first of `ranges` (sorted, as resolved) to the end of the last: what a
/// chain produces once for a multipart answer.
pub fn covering(ranges: &[ByteRange]) -> Option<ByteRange> {
    ByteRange::new(ranges.first()?.start(), ranges.last()?.end())
}

/// The object version an upstream 200 or 206 describes: its validators and complete length.
/// `validators` are the answer's, from [`validators`].
pub fn object_version(
    status: u16,
    headers: &HeaderMap,
    validators: &Validators,
) -> Option<ObjectVersion> {
    let size = match status {
        200 => content_length(headers)?,
        206 => stated_range(headers)?.1?,
        _ => return None,
    };
    let Validators { etag, last_modified } = validators;
    Some(ObjectVersion {
        strong: etag.as_ref().is_some_and(EntityTag::is_strong),
        // The field's own text is the tag's (it parsed whole): not formatted again.
        etag: etag.as_ref().map(|tag| match headers.get(header::ETAG).map(|v| v.to_str()) {
            Some(Ok(text)) => text.trim_matches([' ', '\t']).to_owned(),
            _ => tag.to_string(),
        }),
        size,
        last_modified: last_modified
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs()),
        content_type: headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    })
}

/// The length of a body framed by `Content-Length` (not chunked).
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return None;
    }
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

#[cfg(test)]
mod tests;
