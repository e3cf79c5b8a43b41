//! What one request knows as it goes through the phases: its route, what the client asked, what
//! was asked upstream, its download, the body's plan.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::header;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use rangeway_middleware::ByteRange;
use rangeway_middleware::Window;
use rangeway_middleware::chain::Chain;
use rangeway_middleware::rfc9110::{
    ContentRange, MultipartBody, RangeSpec, Validators, parse_content_range,
};

use super::download::{DOWNLOAD_ID, SENT_PREFIX};
use super::origin_digest::OriginDigestCheck;
use super::s3;
use super::transport::Transport;
use crate::range::{ClientRange, IfRangeDate};
use crate::representation::{ChainPass, StoredFacts};
use crate::routes::Route;
use crate::state::{Delivery, DownloadSession, Ending, ObjectVersion, unix_now};
use crate::telemetry::live::LiveGuard;
use crate::telemetry::metrics::ActiveDownload;

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

/// Per-request state.
#[derive(Debug)]
pub struct RequestCtx {
    pub(super) started: Instant,
    pub(super) route: Option<Arc<Route>>,
    pub(super) upstream_target: String,
    /// The client's IP address as text, formatted once: the derived download id, the
    /// download's record and `X-Forwarded-For` all write it.
    pub(super) client_ip: Option<String>,
    /// The client as `client_address` found it (`None` off TCP, a Unix socket).
    pub(super) client: Option<crate::client_address::Client>,
    pub(super) client_range: ClientRange,
    pub(super) sent_range: Option<RangeSpec>,
    pub(super) body: BodyPlan,
    /// What was served, for the access log: a Content-Range, "multipart", or "-".
    pub(super) served_range: Cow<'static, str>,
    pub(super) upstream_status: Option<u16>,
    /// When the upstream was first asked (before connecting), and how long its answer's header
    /// took from then: the access line's `upstream_ms`.
    pub(super) upstream_asked: Option<Instant>,
    pub(super) upstream_header: Option<Duration>,
    pub(super) refusal: Option<&'static str>,
    /// Its spans, when the request is traced.
    pub(super) trace: Option<super::traced::RequestTrace>,
    pub(super) _active: Option<ActiveDownload>,
    /// The download's place under its route's concurrent-download limits, held to the end.
    pub(super) under_way: Option<super::under_way::Place>,
    /// On a route with a rate limit: how its body is paced.
    pub(super) pacer: Option<super::pace::Pacer>,
    pub(super) download: Option<DownloadCtx>,
    pub(super) origin_digest: Option<OriginDigestCheck>,
    /// On a route with middleware: what the store knows of the object and its stages.
    pub(super) known: Option<StoredFacts>,
    /// The object's path on the upstream, as the stages are told it.
    pub(super) object_path: String,
    /// On a route that transforms: the origin's strong ETag the planned range was made for, sent
    /// upstream as If-Range so that a changed object comes whole.
    pub(super) planned_for: Option<String>,
    /// The route's middleware running over the upstream body.
    pub(super) pass: Option<ChainPass>,
    /// A stage whose stored index proved wrong, to be forgotten after the response.
    pub(super) forget_stage: Option<usize>,
    /// The route serves its output as a content coding this client does not accept: the body is
    /// passed through untouched, as on a route without middleware.
    pub(super) coding_declined: bool,
    /// This response's progress, shown by the admin API while it is in flight.
    pub(super) live: Option<LiveGuard>,
    /// Replicas the request could not be sent to (see `Upstream::retry_elsewhere`).
    pub(super) connect_tries: usize,
    /// Which replica of the route's upstream the request went to.
    pub(super) replica: usize,
    /// Body bytes that went to the client by splice(2) (pingora's writer is told of them after).
    pub(super) spliced: u64,
    /// The way the body went, once the deliver step chose it (see transport.rs).
    pub(super) transport: Option<Transport>,
    /// What the slice cache did for the request, on a route that uses it.
    pub(super) cache: Option<crate::cache::Outcome>,
    /// Keeps the whole slices of the representation the stages make, for the next request.
    pub(super) output_writer: Option<crate::cache::OutputWriter>,
    /// How the client's If-Range, when it is a date, goes upstream.
    pub(super) if_range_date: IfRangeDate,
    /// The ranges of a multipart answer are fetched apart, in stretches this far apart at least.
    pub(super) part_gap: Option<u64>,
    /// A bare resume whose session the store may have lost.
    pub(super) lost_session: Option<LostSession>,
    /// The stretches of a multipart answer still to fetch after the upstream's first answer.
    pub(super) rest_parts: Vec<ByteRange>,
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

/// What the request knows of its download: who it is, what the store said, what was delivered.
#[derive(Debug)]
pub(super) struct DownloadCtx {
    pub(super) id: String,
    pub(super) object: String,
    /// The session as the store had it before this request; `None` when new or unknown.
    pub(super) session: Option<DownloadSession>,
    /// For a bare resume, the one version it may be answered with (see
    /// `DownloadSession::resumable`); its strong ETag goes upstream as `If-Match`.
    pub(super) resume_version: Option<ObjectVersion>,
    /// The upstream's answer is not the version the resume may have: it is refused (412).
    pub(super) changed: bool,
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
    fn ended(&self, sent: u64, finished: bool) -> Option<(ByteRange, Ending)> {
        if self.parts {
            return Some((self.range, Ending::Parts));
        }
        let range = ByteRange::from_len(self.range.start(), sent.min(self.range.len()))?;
        let whole = finished && range == self.range;
        Some((range, if whole { Ending::Whole } else { Ending::Cut }))
    }
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            route: None,
            upstream_target: String::new(),
            client_ip: None,
            client: None,
            client_range: ClientRange::Absent,
            sent_range: None,
            body: BodyPlan::Forward,
            served_range: Cow::Borrowed("-"),
            upstream_status: None,
            upstream_asked: None,
            upstream_header: None,
            refusal: None,
            trace: None,
            _active: None,
            under_way: None,
            pacer: None,
            download: None,
            origin_digest: None,
            known: None,
            object_path: String::new(),
            planned_for: None,
            pass: None,
            forget_stage: None,
            coding_declined: false,
            live: None,
            connect_tries: 0,
            replica: 0,
            spliced: 0,
            transport: None,
            cache: None,
            output_writer: None,
            if_range_date: IfRangeDate::NotADate,
            part_gap: None,
            lost_session: None,
            rest_parts: Vec::new(),
        }
    }
}

impl RequestCtx {
    /// Whether the answer's body goes to the client exactly as it comes: no stage, no digest
    /// check, no cut, no stretches to join (see `BodyWay::choose`).
    pub(super) fn passes_body_untouched(&self) -> bool {
        self.pass.is_none()
            && self.origin_digest.is_none()
            && matches!(self.body, BodyPlan::Forward)
            && self.rest_parts.is_empty()
    }

    /// The way the answer took, for its access line and metrics: its body's, once chosen; before
    /// that, `Relay` for a request handed to its route (`route`, set as it is identified: a
    /// refusal of its download, an error of its source), `Pingora` for one answered before.
    pub(super) fn transport_taken(&self) -> Transport {
        match (self.transport, &self.route) {
            (Some(way), _) => way,
            (None, Some(_)) => Transport::Relay,
            (None, None) => Transport::Pingora,
        }
    }

    pub(super) fn route_name(&self) -> &str {
        self.route.as_ref().map_or("-", |r| r.name.as_str())
    }

    /// The route's middleware as this request runs it: none on a passthrough route, or when the
    /// client declined the route's content coding.
    pub(super) fn chain(&self) -> Option<&Chain> {
        self.route
            .as_ref()
            .map(|route| &route.chain)
            .filter(|chain| !chain.stages().is_empty() && !self.coding_declined)
    }

    /// The bytes a multipart answer is made of, when the response is one.
    pub(super) fn multipart_span(&self) -> Option<ByteRange> {
        match &self.body {
            BodyPlan::Multipart(multipart) => Some(multipart.span()),
            _ => None,
        }
    }

    /// The next body chunk is byte `to` of the object: a stretch of a multipart answer fetched
    /// after a gap (see `plan_parts`).
    pub(super) fn skip_to(&mut self, to: u64) -> Result<()> {
        match &mut self.body {
            BodyPlan::Multipart(multipart) => multipart
                .skip_to(to)
                .map_err(|e| Error::because(ErrorType::InternalError, "multipart body", e)),
            _ => Err(Error::explain(ErrorType::InternalError, "a gap in a body not multipart")),
        }
    }

    /// Whether the route's middleware changes the bytes for this request.
    pub(super) fn transforms(&self) -> bool {
        self.chain().is_some_and(|chain| !chain.is_observing_only())
    }

    /// What this response delivered to its download, once `sent` body bytes went out (none is
    /// an empty range), `finished` when the response ended without an error.
    pub(super) fn delivery(&self, sent: u64, finished: bool) -> Option<Delivery> {
        let download = self.download.as_ref()?;
        let delivering = download.delivering.as_ref()?;
        let (range, ending) = delivering.ended(sent, finished)?;
        let origin_version = download.origin_version.as_ref().unwrap_or(&delivering.version);
        let versions = (delivering.version.clone(), origin_version.clone());
        let client = self.client_ip.clone().unwrap_or_default();
        self.delivered(versions, client, range, ending, sent)
    }

    /// As [`Self::delivery`], for the record made after the response: the versions and the
    /// client's address are moved out, not copied (the download is not delivering any more).
    pub(super) fn take_delivery(&mut self, sent: u64, finished: bool) -> Option<Delivery> {
        let download = self.download.as_mut()?;
        let (range, ending) = download.delivering.as_ref()?.ended(sent, finished)?;
        let version = download.delivering.take()?.version;
        let origin_version = download.origin_version.take().unwrap_or_else(|| version.clone());
        let client = self.client_ip.take().unwrap_or_default();
        self.delivered((version, origin_version), client, range, ending, sent)
    }

    fn delivered(
        &self,
        (version, origin_version): (ObjectVersion, ObjectVersion),
        client: String,
        range: ByteRange,
        ending: Ending,
        sent: u64,
    ) -> Option<Delivery> {
        let download = self.download.as_ref()?;
        Some(Delivery {
            id: download.id.clone(),
            object: download.object.clone(),
            route: self.route_name().to_owned(),
            client,
            version,
            origin_version,
            range,
            ending,
            bytes: sent,
            now: unix_now(),
        })
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
            (206, _) => parts.or_else(|| {
                match parse_content_range(response.headers.get(header::CONTENT_RANGE)?.as_bytes())?
                {
                    ContentRange::Satisfied { range, .. } => Some(range),
                    ContentRange::Unsatisfied { .. } => None,
                }
            }),
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

/// `ip` as text, for `RequestCtx::client_ip`. An IPv4 address is written digit by digit: through
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
