//! The shape step of the pipeline: the client's answer (status, header fields, the plan for its
//! body) made from the source's answer, by RFC 9110 and the download's resume decision.

use std::borrow::Cow;
use std::time::SystemTime;

use http::{Method, StatusCode, header};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use rangeway_middleware::rfc9110::{Validators, content_range};
use rangeway_middleware::{ByteRange, Window};
use tracing::Instrument as _;
use tracing::info;

use super::Proxy;
use super::answer::{
    ACCEPT_BYTES, answer_without_body, refuse_changed, refuse_lost_session, set_partial,
};
use super::client_session::{ClientSession, ClientWatch};
use super::context::{BodyPlan, RequestCtx};
use super::hop_by_hop::forwarded;
use super::origin_digest::OriginDigestCheck;
use super::s3;
use super::shaping::remove_whole_object_checksums;
use super::traced::request_span;
use crate::cache::{CacheBody, OutputWriter};
use crate::range::{
    Asked, IfRangeDate, Shape, body_range, object_version, shape_response, strong_etag, validators,
};
use crate::representation::ChainPass;
use crate::state::ObjectVersion;
use crate::telemetry::live::LiveGuard;
use crate::telemetry::metrics::Unvouched;

/// shape's output: the plan for the client's body and what goes with it through deliver.
#[derive(Debug)]
pub(super) struct Shaped {
    pub(super) body: BodyPlan,
    /// What was served, for the access log: a Content-Range, "multipart", or "-".
    pub(super) served_range: Cow<'static, str>,
    /// The route's middleware running over the upstream body.
    pub(super) pass: Option<ChainPass>,
    pub(super) origin_digest: Option<OriginDigestCheck>,
    /// Keeps the whole slices of the representation the stages make, for the next request.
    pub(super) output_writer: Option<OutputWriter>,
    /// The stretches of a multipart answer still to fetch after the upstream's first answer,
    /// which deliver takes. Kept here rather than handed to deliver through `Proxy::answer`, whose
    /// future would carry them to every response.
    pub(super) rest_parts: Vec<ByteRange>,
    /// This response's progress, shown by the admin API while it is in flight.
    pub(super) live: Option<LiveGuard>,
}

impl Default for Shaped {
    fn default() -> Self {
        Self {
            body: BodyPlan::Forward,
            served_range: Cow::Borrowed("-"),
            pass: None,
            origin_digest: None,
            output_writer: None,
            rest_parts: Vec::new(),
            live: None,
        }
    }
}

impl Shaped {
    /// Whether the answer's body goes to the client exactly as it comes: no stage, no digest
    /// check, no cut, no stretches to join (see `BodyWay::choose`).
    pub(super) fn passes_body_untouched(&self) -> bool {
        self.pass.is_none()
            && self.origin_digest.is_none()
            && matches!(self.body, BodyPlan::Forward)
            && self.rest_parts.is_empty()
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
}

impl Proxy {
    /// The download whose bare resume the source's answer may not follow, to be refused: the
    /// answer is not of the one version the resume may be answered with.
    fn changed_resume(&self, response: &ResponseHeader, ctx: &mut RequestCtx) -> Option<String> {
        if ctx.identity.transforms() {
            // The version a resume may have is the transformed representation's ETag: checked in
            // `transformed_response`.
            return None;
        }
        let download = ctx.identity.download.as_mut()?;
        let resume_version = download.resume_version.take()?;
        let status = response.status.as_u16();
        let answered = object_version(status, &response.headers, &validators(&response.headers));
        let changed = status == 412
            || (matches!(status, 200 | 206)
                && !answered.is_some_and(|v| v.same_as(&resume_version)));
        if !changed {
            return None;
        }
        // The object is not the one version the client may hold: no answer with bytes of another
        // is safe. A range of it would be spliced by every client; so would the whole object
        // (wget -c skips a 200's first bytes up to its file length and appends the rest). The
        // resume is refused: curl -C - leaves its file as it is, wget and aria2c stop with an
        // error.
        let route = ctx.identity.route.as_ref().map_or("-", |r| r.name.as_str());
        self.metrics.resume_refused(route);
        info!(route, download = %download.id, "the object changed since this download began: refusing the resume");
        Some(download.id.clone())
    }

    /// The client's answer from the source's: refused (the object changed, the session may be
    /// lost), an S3 error spoken back, a 416 given its length, the transformed representation's,
    /// or the RFC 9110 answer to what the client asked (200, 206, multipart, 304, 412, 416).
    /// A transformed representation the slice cache keeps is returned: its bytes are the body.
    pub(super) async fn shape(
        &self,
        session: &impl ClientSession,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        watch: &ClientWatch,
    ) -> Result<Option<Box<CacheBody>>> {
        if let Some(id) = self.changed_resume(response, ctx) {
            refuse_changed(response, ctx, &id)?;
            return Ok(None);
        }
        let status = response.status.as_u16();
        let answer_validators = validators(&response.headers);
        let version = object_version(status, &response.headers, &answer_validators);
        let origin_digest =
            if status == 200 { OriginDigestCheck::for_response(&response.headers) } else { None };
        if let Some(lost) = ctx.identity.lost_session
            && lost.refuse
            && matches!(status, 200 | 206)
            && !lost.predated_by(&answer_validators)
        {
            let route = ctx.identity.route_name().to_owned();
            self.unvouched(ctx, &route, Unvouched::Refused);
            refuse_lost_session(response, ctx)?;
            return Ok(None);
        }
        if self.shape_unusual(session, response, ctx, status).await? {
            return Ok(None);
        }
        if ctx.identity.route.as_ref().is_some_and(|route| route.chain.content_coding().is_some()) {
            // The answer depends on Accept-Encoding, coded or not.
            response.append_header(header::VARY, "Accept-Encoding")?;
        }
        if let Some(route) = ctx.identity.route.clone().filter(|_| ctx.identity.transforms()) {
            let result = self.transformed_response(session, response, ctx, &route, version);
            if result.is_ok() && !matches!(ctx.answer.body, BodyPlan::Discard) {
                ctx.answer.origin_digest = origin_digest;
            }
            self.go_live(watch, ctx);
            return result;
        }
        self.shape_plain(session, response, ctx, &answer_validators, version, origin_digest)?;
        self.go_live(watch, ctx);
        Ok(None)
    }

    /// An S3 error spoken back to the client in S3's words, or a 416 without the length given
    /// one: `true` when the answer is one of those.
    async fn shape_unusual(
        &self,
        session: &impl ClientSession,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        status: u16,
    ) -> Result<bool> {
        // An Arc, not a copy of the name: the ctx is borrowed mutably below.
        let route_arc = ctx.identity.route.clone();
        if route_arc.as_ref().is_some_and(|r| r.upstream.is_s3())
            && let Some(client_status) = crate::s3::error::client_status(status)
        {
            forwarded(response)?;
            ctx.answer.served_range = format!("S3 error {status}").into();
            let xml = crate::s3::error::speaks_s3(&session.req_header().headers);
            let error = s3::ErrorBody::start(response, client_status, xml)?;
            ctx.answer.body = BodyPlan::S3Error(Box::new(error));
            if session.req_header().method == Method::HEAD {
                response.remove_header(&header::TRANSFER_ENCODING);
            }
            return Ok(true);
        }
        if status == 416
            && !ctx.identity.transforms()
            && !response.headers.contains_key(header::CONTENT_RANGE)
        {
            // An origin that refuses a range without saying the length (S3 does): the client
            // still gets `Content-Range: bytes */LEN` (RFC 9110 §15.5.17), from a HEAD.
            // Boxed: inline, this rare exchange's state would make every call's future (which
            // async_trait boxes, per response) kilobytes larger, all of it copied.
            if let Some(route) = route_arc.as_ref()
                && let Ok(Some(complete_len)) = Box::pin(
                    self.origin_client.length(&route.upstream, &ctx.identity.upstream_target),
                )
                .instrument(request_span(ctx.trace.as_ref()))
                .await
            {
                forwarded(response)?;
                answer_without_body(response, ctx, &Shape::Unsatisfiable { complete_len })?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The RFC 9110 answer to what the client asked, cut from the source's plain answer; the
    /// stages that observe it started; the download told what it delivers.
    fn shape_plain(
        &self,
        session: &impl ClientSession,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        answer_validators: &Validators,
        version: Option<ObjectVersion>,
        origin_digest: Option<OriginDigestCheck>,
    ) -> Result<()> {
        let status = response.status.as_u16();
        let route_arc = ctx.identity.route.clone();
        // The upstream body's place in the object, for stages that observe it (read before the
        // answer is shaped, which may change its Content-Length and Content-Range).
        let upstream_stream =
            ctx.identity.chain().and_then(|_| body_range(status, &response.headers));
        forwarded(response)?;
        let req = session.req_header();
        let asked = Asked {
            method: &req.method,
            headers: &req.headers,
            range: &ctx.identity.client_range,
            sent: ctx.identity.sent_range.as_ref(),
            if_range_date_sent: ctx.identity.if_range_date == IfRangeDate::Forward,
            part_gap: ctx.identity.part_gap,
            lost_sessions_since: ctx.identity.lost_session.filter(|l| !l.refuse).map(|l| l.since),
        };
        let shape =
            shape_response(&asked, status, &response.headers, answer_validators, SystemTime::now());
        self.cut_to_asked(response, ctx, shape)?;
        if response.status == StatusCode::PARTIAL_CONTENT {
            // They are of the whole object (S3 sends them on a whole-object answer rangeway cut
            // a range out of), and clients check them against the part (boto3 fails).
            remove_whole_object_checksums(response);
        }
        // The stages see a body whole from where it starts: not one fetched in stretches.
        if let Some(route) = route_arc.as_ref().filter(|_| ctx.identity.chain().is_some())
            && matches!(response.status.as_u16(), 200 | 206)
            && ctx.answer.rest_parts.is_empty()
        {
            self.observe(session, response, ctx, route, version.as_ref(), upstream_stream)?;
        }
        let parts = ctx.answer.multipart_span();
        if let Some(download) = ctx.identity.download.as_mut() {
            download.note_response(response, version, parts)?;
        }
        // A whole upstream body whose bytes reach the client (whole or cut) is checked against
        // the origin's own digest when it gave one.
        if !matches!(ctx.answer.body, BodyPlan::Discard) {
            ctx.answer.origin_digest = origin_digest;
        }
        Ok(())
    }

    /// The answer as `shape` says: forwarded, cut to one range or to a multipart answer,
    /// refused, or without content.
    fn cut_to_asked(
        &self,
        response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        shape: Shape,
    ) -> Result<()> {
        let status = response.status.as_u16();
        let route_arc = ctx.identity.route.clone();
        let route = route_arc.as_ref().map_or("-", |r| r.name.as_str());
        match shape {
            Shape::Forward => {
                if status == 200 && ctx.identity.lost_session.is_some() {
                    self.unvouched(ctx, route, Unvouched::Whole);
                }
                if let Some(range) = response.headers.get(header::CONTENT_RANGE) {
                    ctx.answer.served_range = range.to_str().unwrap_or("?").to_owned().into();
                }
                if matches!(status, 200 | 206)
                    && response.headers.contains_key(header::CONTENT_LENGTH)
                {
                    // rangeway can cut any range out of a response of known length.
                    response.insert_header(header::ACCEPT_RANGES, ACCEPT_BYTES)?;
                }
            }
            Shape::Single { range, complete_len, stream_start } => {
                if status == 200 {
                    self.metrics.upstream_ignored_range(route);
                }
                let value = content_range(range, complete_len);
                set_partial(response, range.len(), &value)?;
                ctx.answer.served_range = value.into();
                ctx.answer.body = BodyPlan::Window(Window::new(stream_start, range));
            }
            Shape::Multiple { ranges, complete_len, stream_start, rest } => {
                if !rest.is_empty() && strong_etag(&response.headers).is_none() {
                    // The stretches after the first are pinned to its version by its ETag.
                    let reason = "the upstream's answer has no strong ETag to fetch the other \
                                  ranges of the same version with";
                    self.refuse(response, ctx, route, reason)?;
                } else {
                    self.multipart(response, ctx, &ranges, complete_len, stream_start)?;
                    ctx.answer.rest_parts = rest;
                }
            }
            Shape::BadGateway(reason) => self.refuse(response, ctx, route, reason)?,
            shape @ (Shape::Unsatisfiable { .. }
            | Shape::NotModified
            | Shape::PreconditionFailed) => {
                answer_without_body(response, ctx, &shape)?;
            }
        }
        Ok(())
    }
}
