//! What one request knows as it goes through the steps: what the whole request carries, and each
//! step's output (its type in its step's module) for the steps after it and for `record`; the
//! types more than one step share (the body's plan, the download).

use std::net::IpAddr;
use std::time::{Instant, SystemTime};

use pingora_error::Result;
use pingora_http::ResponseHeader;
use rangeway_middleware::ByteRange;
use rangeway_middleware::Window;
use rangeway_middleware::rfc9110::{MultipartBody, Validators};

use super::deliver::Delivered;
use super::download::{DOWNLOAD_ID, SENT_PREFIX};
use super::identify::Identified;
use super::s3;
use super::shape::Shaped;
use super::source::UpstreamRecord;
use crate::range::body_range;
use crate::state::{DownloadSession, Ending, ObjectVersion};

/// What the proxy does to the upstream body on its way to the client.
#[derive(Debug, Default)]
pub(super) enum BodyPlan {
    /// Forward every chunk as it is.
    #[default]
    Forward,
    /// Forward only the bytes inside one range.
    Window(Window),
    /// Build a multipart/byteranges body from the ranges.
    Multipart(Box<MultipartBody>),
    /// Send nothing: the answer has no content (304, 412, 416, refused upstream answers).
    Discard,
    /// Send an explanation of an S3 error in place of its XML.
    S3Error(Box<s3::ErrorBody>),
}

/// Per-request state: what the whole request carries, and what each step of the pipeline left
/// for the steps after it and for `record`. Each step's facts are its own type, in its own
/// module.
#[derive(Debug)]
pub(super) struct RequestCtx {
    pub(super) started: Instant,
    /// The client as admit's `client_address` found it (`None` off TCP, a Unix socket).
    pub(super) client: Option<crate::client_address::Client>,
    /// Why the request was refused, for its access line.
    pub(super) refusal: Option<&'static str>,
    /// Its spans, when the request is traced.
    pub(super) trace: Option<super::traced::RequestTrace>,
    /// identify's output: the route, what the client asked and what the source is asked, the
    /// download.
    pub(super) identity: Identified,
    /// source's record of the upstream: which replica, when asked, what it answered.
    pub(super) upstream: UpstreamRecord,
    /// shape's output: the plan for the body and what goes with it.
    pub(super) answer: Shaped,
    /// deliver's: how the body went.
    pub(super) delivery: Delivered,
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            client: None,
            refusal: None,
            trace: None,
            identity: Identified::default(),
            upstream: UpstreamRecord::default(),
            answer: Shaped::default(),
            delivery: Delivered::default(),
        }
    }
}

/// A bare resume past byte 0 with no session found, where the store may have lost it: the client
/// may hold bytes of any version sent since `since` (every session written before it would have
/// expired by now). Served as asked only when the answer was last modified before that; else a
/// client that resumes at its file's end (`curl -C -`, `wget -c`, which appends the tail of a
/// 200) is refused with 412, and any other gets the whole representation (a 200 is a valid
/// answer to any range request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LostSession {
    pub(super) since: SystemTime,
    pub(super) refuse: bool,
}

impl LostSession {
    /// Whether an answer with `validators` is of a version the client may hold no other of.
    pub(super) fn predated_by(self, validators: &Validators) -> bool {
        validators.last_modified.is_some_and(|modified| modified < self.since)
    }
}

/// What the request knows of its download: who it is and what the store said (identify), what
/// the response delivers (shape).
#[derive(Debug)]
pub(super) struct DownloadCtx {
    pub(super) id: String,
    pub(super) object: String,
    /// The session as the store had it before this request; `None` when new or unknown.
    pub(super) session: Option<DownloadSession>,
    /// For a bare resume, the one version it may be answered with (see
    /// `DownloadSession::resumable`); its strong ETag goes upstream as `If-Match`.
    pub(super) resume_version: Option<ObjectVersion>,
    /// What this response delivers.
    pub(super) delivering: Option<Delivering>,
    /// The origin's version behind it (the same on a route that does not transform).
    pub(super) origin_version: Option<ObjectVersion>,
}

/// What a response delivers to its download.
#[derive(Debug)]
pub(super) struct Delivering {
    pub(super) version: ObjectVersion,
    /// The bytes of the version the response sends: one stretch, or the span of a multipart
    /// answer's parts.
    pub(super) range: ByteRange,
    pub(super) parts: bool,
}

impl Delivering {
    /// The bytes delivered once `sent` body bytes went out, and how the response ended: `None`
    /// when none of a single stretch went out.
    pub(super) fn ended(&self, sent: u64, finished: bool) -> Option<(ByteRange, Ending)> {
        if self.parts {
            return Some((self.range, Ending::Parts));
        }
        let range = ByteRange::from_len(self.range.start(), sent.min(self.range.len()))?;
        let whole = finished && range == self.range;
        Some((range, if whole { Ending::Whole } else { Ending::Cut }))
    }
}

impl DownloadCtx {
    /// Labels the client's response with its download, and notes what it delivers: the version,
    /// and which of its bytes (`parts`: the span of a multipart answer's parts).
    pub(super) fn note_response(
        &mut self,
        response: &mut ResponseHeader,
        version: Option<ObjectVersion>,
        parts: Option<ByteRange>,
    ) -> Result<()> {
        response.insert_header(DOWNLOAD_ID, self.id.as_str())?;
        // The hint speaks of the version being delivered only.
        let sent = self.session.as_ref().zip(version.as_ref()).and_then(|(s, v)| s.of_version(v));
        if let Some(sent) = sent {
            response.insert_header(SENT_PREFIX, sent.sent.contiguous_prefix_end())?;
        }
        let range = match (response.status.as_u16(), &version) {
            (200, Some(version)) => Some(ByteRange::whole(version.size)),
            (206, _) => parts.or_else(|| body_range(206, &response.headers)),
            _ => None,
        };
        self.delivering = version.zip(range).map(|(version, range)| Delivering {
            version,
            range,
            parts: parts.is_some(),
        });
        Ok(())
    }
}

/// `ip` as text, for `Identified::client_ip`. An IPv4 address is written digit by digit: through
/// `Display`, which formats each octet with padding support, it was a visible part of a small
/// request's instructions (see docs/benchmarks.md, "Instructions per request").
pub(super) fn ip_text(ip: IpAddr) -> String {
    let IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut text = String::with_capacity(15);
    for (index, octet) in v4.octets().into_iter().enumerate() {
        if index > 0 {
            text.push('.');
        }
        if octet >= 100 {
            text.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            text.push(char::from(b'0' + octet / 10 % 10));
        }
        text.push(char::from(b'0' + octet % 10));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_text_writes_what_display_writes() {
        for ip in ["0.0.0.0", "10.0.0.1", "127.0.0.1", "192.168.100.9", "255.255.255.255"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
        for octet in 0..=255u8 {
            let ip = IpAddr::from([octet, 255 - octet, octet / 7, 9]);
            assert_eq!(ip_text(ip), ip.to_string());
        }
        for ip in ["::1", "2001:db8::7", "::ffff:10.0.0.1"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }
}
