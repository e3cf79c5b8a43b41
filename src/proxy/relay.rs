//! Relaying a response with rangeway's own upstream client: every GET and HEAD (see
//! transport.rs), so that a body its origin breaks off can be continued
//! (`[routes.upstream_resume]`, on by default), the stretches of ranges far apart fetched one after
//! another, and a body cost fewer copies than pingora's proxying makes — spliced from socket to
//! socket when untouched (see splice.rs), read from the origin's socket straight into the chunks
//! a route's middleware takes otherwise.
//!
//! pingora proxies a response once: when the origin connection fails after the first byte went to
//! the client, the client's download is cut, and only the client can resume it. Here rangeway
//! sends the upstream request itself and takes the answer through the very phases pingora would
//! (the upstream and client response filters, then every chunk through the body filter with its
//! window, multipart cut and stages), so the answer is the same — or, for a large body passed on
//! untouched, splices it without reading it. When the body breaks at byte N of its stream on an
//! `upstream_resume` route, rangeway asks for the rest — `Range: bytes=N-END` with `If-Match` on
//! the strong ETag, signed again for S3 — and feeds it to the same body filter (or splice): the
//! stages go on at that input offset and the client sees one uninterrupted response. A changed
//! object (412, another ETag), an answer without a strong validator or a length, or no
//! continuation within the route's attempts and deadline: the client connection is cut, never
//! padded or joined to another version.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, header};
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::{HttpTask, ServerSession};
use pingora_error::{Error, ErrorSource, ErrorType, OrErr, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::{ContentRange, parse_content_range};
use tracing::{info, warn};

use super::Proxy;
use super::context::RequestCtx;
use super::hop_by_hop::{answer_to_forward, end_to_end};
use super::origin_request::{self, client_side};
use super::pace::Pacer;
use super::shaping::upstream_stream;
use super::splice::{Pipe, RawSocket, SpliceError, Timeouts, splice};
use super::transport::{BodyFrom, KernelBody};
use crate::admission::ClientConnection;
use crate::cache::{Bypass, CacheAnswer, CacheBody, Outcome, Segment, SliceCache};
use crate::config::RouteCache;
use crate::config::UpstreamResume;
use crate::range::content_length;
use crate::routes::Route;
use crate::routes::origin_client::{Exchange, OriginClient, Pinned, Tries, pinned_range};
use crate::telemetry::metrics::Metrics;

/// What a broken body can be continued with: the stream's end and the version it is of.
pub(super) struct Continuable {
    /// One past the last byte of the object the upstream body runs to.
    end: u64,
    complete_len: u64,
    etag: String,
}

impl Continuable {
    /// For an answer whose body is `stream` of the object: `None` without a strong ETag, which
    /// alone can show that a continuation is of the same version.
    fn of(stream: ByteRange, headers: &http::HeaderMap) -> Option<Self> {
        let etag = Self::etag(headers)?;
        let complete_len = match headers
            .get(header::CONTENT_RANGE)
            .and_then(|v| parse_content_range(v.as_bytes()))
        {
            Some(ContentRange::Satisfied { complete_len: Some(len), .. }) => len,
            _ => stream.end(),
        };
        Some(Self { end: stream.end(), complete_len, etag: etag.to_owned() })
    }

    /// The answer's strong ETag, which alone can show that another answer is of the same version.
    pub(super) fn etag(headers: &http::HeaderMap) -> Option<&str> {
        headers.get(header::ETAG).and_then(|v| v.to_str().ok()).filter(|etag| etag.starts_with('"'))
    }
}

impl Proxy {
    /// Answers the request with rangeway's own upstream client, continuing the body when its
    /// origin fails mid-way. Called instead of pingora's proxying.
    pub(super) async fn relay(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<()> {
        let policy = ctx.transport.resume();
        let route = ctx
            .route
            .clone()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route chosen"))?;
        ctx.replica = route.upstream.choose();
        // The relay speaks HTTP/1.1 to origins, whatever its client speaks.
        let mut request = end_to_end(session.req_header());
        origin_request::complete(&mut request, &route, ctx, client_side(session))?;
        // Not signed here: an S3 request is signed once, last, where it is sent (its
        // `traceparent` set first when it is traced), by `OriginClient::send`.
        let request = RequestHeader::from(request);
        // What other replicas, continuations and the stretches of a multipart answer fetched
        // apart are asked with: the same fields, another Host (and Range). Kept only where there
        // are such to ask.
        let asks_again =
            policy.is_some() || route.upstream.replica_count() > 1 || ctx.part_gap.is_some();
        let base = asks_again.then(|| request.clone());
        ctx.upstream_asked = Some(Instant::now());
        // Every wait on the origin (or on the cache's fetches) below ends when the client goes.
        let watch = ClientWatch::of(session);
        // The slice cache answers as the origin would, or says to ask the origin. (The kernel ways
        // and the cache's answer are boxed futures: carried inline, their state would be in every
        // response's future, which pingora boxes and moves, also where a small answer needs none
        // of it; see docs/benchmarks.md, "Boxed futures".)
        let cached = match (&self.cache, route.cache) {
            (Some(cache), Some(use_of)) => {
                let asked = (&request, client_authorized(session, &route));
                let answer = cache.answer(&route, use_of, asked, &self.origin_client, ctx.replica);
                Some(watch.unless_gone(session, Box::pin(answer)).await?)
            }
            (None, Some(_)) => Some(CacheAnswer::Bypass(Bypass::Off)),
            _ => None,
        };
        let (mut response, body) = match cached {
            Some(CacheAnswer::Served { header, body, outcome }) => {
                ctx.cache = Some(outcome);
                (*header, body.map(UpstreamBody::Cache))
            }
            bypassed => {
                if let Some(CacheAnswer::Bypass(why)) = bypassed {
                    ctx.cache = Some(Outcome::Bypass(why));
                }
                let first = self.first_exchange(&route, ctx, request, base.as_ref());
                let exchange = watch.unless_gone(session, first).await??;
                let response =
                    exchange.session.response_header().map(answer_to_forward).ok_or_else(|| {
                        Error::explain(ErrorType::InvalidHTTPHeader, "no response header")
                    })?;
                let exchange = Box::new(exchange);
                (response, Some(UpstreamBody::Origin { exchange, source: BodySource::Unread }))
            }
        };
        let stream = upstream_stream(response.status.as_u16(), &response.headers);
        let continuable = stream.and_then(|stream| Continuable::of(stream, &response.headers));
        self.check_resume_version(&response, ctx);
        self.shape(session, &mut response, ctx).await?;
        // A transformed representation the cache holds: its bytes, not the origin's (which a
        // cache body fetches only as it is read: nothing, then).
        let body = match ctx.cached_output.take() {
            Some(output) => Some(UpstreamBody::Cache(output)),
            None => body,
        };
        let head_only = session.req_header().method == Method::HEAD;
        let mut pump = Pump {
            client: Arc::clone(&self.origin_client),
            metrics: Arc::clone(&self.metrics),
            route: Arc::clone(&route),
            continuable,
            policy,
            base,
            parts: std::mem::take(&mut ctx.rest_parts).into(),
            at: stream.map_or(0, |s| s.start()),
            attempt_from: stream.map_or(0, |s| s.start()),
            replica: ctx.replica,
            cache: self
                .cache
                .clone()
                .zip(route.cache)
                .map(|(cache, use_of)| (cache, use_of, client_authorized(session, &route))),
            read_max: READ_BYTES,
        };
        let from = match &body {
            Some(UpstreamBody::Origin { exchange, .. }) => Some(BodyFrom::Origin(exchange)),
            Some(UpstreamBody::Cache(_)) => Some(BodyFrom::Cache),
            None => None,
        };
        // The origin's rate field is for rangeway, not the client.
        let origin_header = route.rate_limit.as_ref().and_then(|l| l.origin_header.as_ref());
        let origin_rate = origin_header.and_then(|name| {
            let value = response.headers.get(name)?.to_str().ok()?.trim().parse::<u64>().ok();
            value.filter(|rate| *rate > 0)
        });
        if let Some(name) = origin_header {
            response.remove_header(name);
        }
        ctx.pacer = route.rate_limit.as_ref().filter(|_| !head_only).and_then(|limit| {
            let client = ctx.client.map(|client| client.ip);
            Pacer::new(limit, origin_rate, self.rates.of(&route.name, client, limit))
        });
        if let Some(pacer) = &ctx.pacer {
            pump.read_max = pacer.step().min(READ_BYTES);
        }
        // A shaped origin body is spliced in paced steps; a shaped cache body goes through the
        // relay's paced writer (sendfile has no steps).
        let kernel_way = from
            .filter(|from| ctx.pacer.is_none() || matches!(from, BodyFrom::Origin(_)))
            .and_then(|from| {
                ctx.transport.for_body(session, ctx.passes_body_untouched(), from, &response)
            });
        unsent_bounded(session, kernel_way.is_some());
        let mut body = match (kernel_way, body) {
            (
                Some((way, KernelBody { client, len, pipe: Some(pipe) })),
                Some(UpstreamBody::Origin { exchange, .. }),
            ) => {
                ctx.transport = way;
                let spliced =
                    self.splice(session, ctx, response, (client, len, pipe), *exchange, pump);
                return Box::pin(spliced).await;
            }
            (Some((way, KernelBody { client, len, .. })), Some(UpstreamBody::Cache(cached))) => {
                ctx.transport = way;
                let sent = self.send_files(session, ctx, response, (client, len), cached);
                return Box::pin(sent).await;
            }
            (_, Some(body)) => body,
            (_, None) => {
                // A cached answer without a body (HEAD, 304, 412, 416).
                let mut end = None;
                self.filter_body(&mut end, true, ctx)?;
                session.write_response_header(Box::new(response), end.is_none()).await?;
                if end.is_some() {
                    session.write_response_body(end, true).await?;
                }
                return Ok(());
            }
        };
        if head_only {
            session.write_response_header(Box::new(response), true).await?;
            body.release(&self.origin_client).await;
            return Ok(());
        }
        // The header waits for the first HOLD_BYTES of the body, or all of it, to pass the body
        // filter: a small body it refuses (one failing its origin's digest) is then answered
        // with an error status rather than a cut 200 — what pingora does with the header and
        // body it reads in one go.
        let mut held = Vec::new();
        let (mut held_len, mut pending) = (0, None);
        let done = loop {
            match watch.unless_gone(session, body.next_chunk(pump.read_max)).await? {
                Ok(Some(chunk)) => {
                    held_len += chunk.len();
                    held.push(chunk);
                    if body.done() {
                        break true;
                    }
                    if held_len >= HOLD_BYTES {
                        break false;
                    }
                }
                Ok(None) => break true,
                Err(e) => {
                    pending = Some(e);
                    break false;
                }
            }
        };
        // This exchange's body is all there is to the answer, unless more stretches follow.
        let done = done && pump.parts.is_empty();
        // Filtered in place: what the filter passes on takes the place of what it was given.
        let (count, mut kept) = (held.len(), 0);
        for i in 0..count {
            let mut body = Some(std::mem::take(&mut held[i]));
            self.filter_body(&mut body, done && i + 1 == count, ctx)?;
            if let Some(body) = body {
                held[kept] = body;
                kept += 1;
            }
        }
        held.truncate(kept);
        pump.at += held_len as u64;
        if done {
            // Pooled before the client hears of the end: its next request may want it.
            body.release(&self.origin_client).await;
            if count == 0 {
                // No body: the filter still sees the end (once).
                let mut body = None;
                self.filter_body(&mut body, true, ctx)?;
                held.extend(body);
            }
            session.write_response_header(Box::new(response), false).await?;
            let out = held.len();
            if out == 0 {
                return session.write_response_body(None, true).await;
            }
            for (i, body) in held.into_iter().enumerate() {
                write_out(session, ctx, Some(body), i + 1 == out).await?;
            }
            return Ok(());
        }
        session.write_response_header(Box::new(response), false).await?;
        for body in held {
            write_out(session, ctx, Some(body), false).await?;
        }
        // The rest is read (and continued) by this task between its writes: a download holds the
        // chunk being written and no more (a reader of its own let ahead held three more); the
        // kernel's socket buffers still take the origin's bytes while the client's are written.
        let mut reader = BodyReader { pump, body: Some(body), pending, tries: Tries::new() };
        // While the origin is slow the client is watched, as pingora's proxying watches it: one
        // that hangs up ends the response at once, so that its download is recorded before the
        // client can come back to resume it.
        loop {
            let piece = watch.unless_gone(session, reader.next()).await?;
            match piece {
                Piece::Chunk(chunk) => self.forward(session, ctx, Some(chunk), false).await?,
                Piece::Skip(to) => ctx.skip_to(to)?,
                Piece::End => return self.forward(session, ctx, None, true).await,
                Piece::Broken(e) => return Err(e),
            }
        }
    }

    /// Answers with `response` and splices its body from the origin's socket to the client's
    /// (see splice.rs), continuing it where the origin breaks it off as the relay does.
    async fn splice(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        response: ResponseHeader,
        (client, len, mut pipe): (RawSocket, u64, Pipe),
        exchange: Exchange,
        pump: Pump,
    ) -> Result<()> {
        write_header_now(session, response).await?;
        let spliced = self.splice_body(ctx, &client, &mut pipe, len, exchange, pump).await;
        self.account_sent_aside(session, ctx, spliced).await
    }

    /// Ends a response whose body went past pingora's writer (`ctx.spliced` bytes of it, then
    /// `outcome`). pingora's writer is told of those bytes, as writes its connection swallows:
    /// it then counts them, frames the response as complete and keeps the connection, as for
    /// any other response.
    async fn account_sent_aside(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        outcome: Result<()>,
    ) -> Result<()> {
        if !sent_aside(session, ctx.spliced) {
            return Err(Error::explain(
                ErrorType::InternalError,
                "a spliced response was not accounted",
            ));
        }
        let mut left = ctx.spliced;
        while left > 0 {
            let n = left.min(SENT_ASIDE.len() as u64) as usize;
            session.write_response_body(Some(Bytes::from_static(&SENT_ASIDE[..n])), false).await?;
            left -= n as u64;
        }
        outcome?;
        if unaccounted(session) != 0 {
            // What is left would swallow the next response's bytes: the connection must end.
            session.set_keepalive(None);
            return Err(Error::explain(
                ErrorType::InternalError,
                "a spliced body was not accounted",
            ));
        }
        session.write_response_body(None, true).await
    }

    /// Answers with `response` and sends its body from the cache's files to the client's socket
    /// (sendfile(2)); what is still being fetched goes out as it arrives. Accounted to pingora as
    /// a splice is.
    async fn send_files(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        response: ResponseHeader,
        (client, len): (RawSocket, u64),
        mut body: Box<CacheBody>,
    ) -> Result<()> {
        write_header_now(session, response).await?;
        let write = self.client_limits.write_timeout;
        let live = ctx.live.as_ref();
        let mut sent = 0u64;
        let outcome = async {
            while let Some(segment) =
                client.unless_closed(body.next(true)).await.ok_or_else(client_gone)??
            {
                let written = match segment {
                    Segment::File { file, offset, len } => client
                        .send_file(&file, offset, len, write, |n| {
                            live.inspect(|live| live.sent(n));
                        })
                        .await
                        .map(|()| len),
                    Segment::Bytes(bytes) => client.write_all(&bytes, write).await.map(|()| {
                        live.inspect(|live| live.sent(bytes.len()));
                        bytes.len() as u64
                    }),
                };
                sent += written
                    .or_err(ErrorType::WriteError, "writing the body")
                    .map_err(|e| e.into_down())?;
            }
            Ok::<(), Box<Error>>(())
        }
        .await;
        ctx.spliced = sent;
        let outcome = outcome.and_then(|()| {
            if sent == len {
                Ok(())
            } else {
                Err(Error::explain(ErrorType::InternalError, "a cached body was not its length"))
            }
        });
        self.account_sent_aside(session, ctx, outcome).await
    }

    /// Splices the `len` bytes of body from `exchange` (and its continuations) to `client`.
    async fn splice_body(
        &self,
        ctx: &mut RequestCtx,
        client: &RawSocket,
        pipe: &mut Pipe,
        len: u64,
        mut exchange: Exchange,
        mut pump: Pump,
    ) -> Result<()> {
        let timeouts = Timeouts {
            // As pingora: no read timeout configured, none applied.
            read: exchange.read_timeout().unwrap_or(Duration::MAX),
            write: self.client_limits.write_timeout,
        };
        let (start, mut tries) = (pump.at, Tries::new());
        let mut sent = 0;
        // Where the body of the exchange being spliced began, in `sent`: for its span.
        let mut attempt_from = 0;
        // A shaped body is spliced in paced steps: the kernel still moves every byte.
        let mut pacer = ctx.pacer.take();
        let live = ctx.live.as_ref();
        let outcome = loop {
            let result = async {
                // The bytes that came with the header are in pingora's buffer: they go first.
                // (Without any, pingora waits for the origin's: the client is watched meanwhile.)
                let first = client.unless_closed(exchange.session.read_response_body()).await;
                if let Some(first) = first.ok_or_else(client_gone)?? {
                    if let Some(pacer) = pacer.as_mut() {
                        pacer.wait(first.len()).await;
                    }
                    client
                        .write_all(&first, timeouts.write)
                        .await
                        .or_err(ErrorType::WriteError, "writing the body")
                        .map_err(|e| e.into_down())?;
                    sent += first.len() as u64;
                    live.inspect(|live| live.sent(first.len()));
                }
                let origin =
                    super::transport::plain_socket(exchange.session.stream()).ok_or_else(|| {
                        Error::explain(
                            ErrorType::InternalError,
                            "the origin connection cannot be spliced",
                        )
                    })?;
                let mut left = len - sent;
                let mut delivered = |n: usize| {
                    sent += n as u64;
                    live.inspect(|live| live.sent(n));
                };
                let spliced = match pacer.as_mut() {
                    None => splice(&origin, client, pipe, left, timeouts, delivered).await,
                    Some(pacer) => {
                        let mut spliced = Ok(());
                        while left > 0 && spliced.is_ok() {
                            let step = left.min(pacer.step() as u64);
                            pacer.wait(step as usize).await;
                            spliced =
                                splice(&origin, client, pipe, step, timeouts, &mut delivered).await;
                            left -= step;
                        }
                        spliced
                    }
                };
                spliced.map_err(|e| match e {
                    SpliceError::Upstream(e) => {
                        Error::because(ErrorType::ReadError, "reading the body", e).into_up()
                    }
                    SpliceError::Downstream(e) => {
                        Error::because(ErrorType::WriteError, "writing the body", e).into_down()
                    }
                })
            }
            .await;
            match result {
                Ok(()) => {
                    exchange.ended(sent - attempt_from, "complete");
                    self.origin_client.release_read_past(exchange);
                    break Ok(());
                }
                Err(e) if *e.esource() == ErrorSource::Upstream => {
                    exchange.ended(sent - attempt_from, "cut");
                    pump.at = start + sent;
                    match pump.continued(e, &mut tries).await {
                        Ok(next) => {
                            exchange = next;
                            attempt_from = sent;
                        }
                        Err(e) => break Err(e),
                    }
                }
                Err(e) => {
                    exchange.ended(sent - attempt_from, "client_gone");
                    break Err(e);
                }
            }
        };
        ctx.pacer = pacer;
        ctx.spliced = sent;
        outcome
    }

    /// Sends the request (`request`, made for `ctx.replica`) and reads the answer's header. When
    /// the replica cannot be reached, the others are tried (`Upstream::retry_elsewhere`), with
    /// `base` and their Host (given when there are others).
    async fn first_exchange(
        &self,
        route: &Route,
        ctx: &mut RequestCtx,
        request: RequestHeader,
        base: Option<&RequestHeader>,
    ) -> Result<Exchange> {
        let upstream = &route.upstream;
        // Its span and `traceparent` when traced (in the request's span, the relay's), then
        // signed.
        let mut sent = self.origin_client.send(upstream, ctx.replica, request, "first").await;
        while let (Err(_), Some(base)) = (&sent, base) {
            if !upstream.retry_elsewhere(ctx.replica, &mut ctx.connect_tries) {
                break;
            }
            ctx.replica = upstream.choose();
            let mut request = base.clone();
            request.insert_header(header::HOST, upstream.host_header(ctx.replica).clone())?;
            sent = self.origin_client.send(upstream, ctx.replica, request, "first").await;
        }
        sent
    }

    /// One chunk (or the end) through the body filter, then to the client.
    async fn forward(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        chunk: Option<Bytes>,
        end: bool,
    ) -> Result<()> {
        let mut body = chunk;
        self.filter_body(&mut body, end, ctx)?;
        if body.is_some() || end {
            write_out(session, ctx, body, end).await?;
        }
        Ok(())
    }
}

/// How the relay learns that its client went away while the origin (or the cache's fetch) keeps
/// it waiting: on HTTP/1, plain or TLS, its socket closing; on HTTP/2, its stream reset or its
/// connection gone. Dropping the wait drops the origin's request with it.
enum ClientWatch {
    Socket(RawSocket),
    Stream,
    Unwatched,
}

impl ClientWatch {
    fn of(session: &Session) -> Self {
        match session.as_downstream() {
            ServerSession::H1(h1) => {
                RawSocket::duplicate(h1.stream().id()).map_or(Self::Unwatched, Self::Socket)
            }
            ServerSession::H2(_) => Self::Stream,
            _ => Self::Unwatched,
        }
    }

    /// `work`'s outcome, or a client-gone error as soon as the client is gone.
    async fn unless_gone<T>(
        &self,
        session: &mut Session,
        work: impl Future<Output = T>,
    ) -> Result<T> {
        let gone = async {
            match (self, session.as_downstream_mut()) {
                (Self::Socket(socket), _) => socket.closed().await,
                (Self::Stream, ServerSession::H2(h2)) => {
                    // Its reason does not matter: the stream will not take an answer.
                    let _ = h2.idle().await;
                }
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            done = work => Ok(done),
            () = gone => Err(client_gone()),
        }
    }
}

/// The error a request ends with when its client went away.
fn client_gone() -> Box<Error> {
    Error::explain(ErrorType::ConnectionClosed, "the client hung up").into_down()
}

/// Writes `body` to the client: at once, or on a shaped route paced in steps (`pace.rs`). A traced
/// request counts the time the client held the writes up (pacing not included).
async fn write_out(
    session: &mut Session,
    ctx: &mut RequestCtx,
    body: Option<Bytes>,
    end: bool,
) -> Result<()> {
    if ctx.pacer.is_none()
        && let Some(trace) = ctx.trace.as_mut()
    {
        let (began, len) = (Instant::now(), body.as_ref().map_or(0, Bytes::len));
        let written = session.write_response_body(body, end).await;
        trace.client_wrote(len, began.elapsed());
        return written;
    }
    let Some(pacer) = ctx.pacer.as_mut() else {
        return session.write_response_body(body, end).await;
    };
    let Some(mut body) = body else {
        return session.write_response_body(None, end).await;
    };
    while body.len() > pacer.step() {
        let step = body.split_to(pacer.step());
        pacer.wait(step.len()).await;
        session.write_response_body(Some(step), false).await?;
    }
    pacer.wait(body.len()).await;
    session.write_response_body(Some(body), end).await
}

/// Whether the client's own `Authorization` goes upstream with its request: not to an S3
/// upstream, where rangeway signs with its own keys.
fn client_authorized(session: &Session, route: &Route) -> bool {
    session.req_header().headers.contains_key(header::AUTHORIZATION) && !route.upstream.is_s3()
}

/// What pingora's writer is handed for the bytes that went past it: never read, never sent (see
/// `ClientConnection::note_sent_aside`); zeroed, so it costs no memory until something reads it.
static SENT_ASIDE: [u8; 1 << 20] = [0; 1 << 20];

/// Tells the client connection that `bytes` of body went out past pingora's writer. `false` when
/// it cannot be told (no admission wrapper): pingora's writes would then reach the client.
fn sent_aside(session: &Session, bytes: u64) -> bool {
    let ServerSession::H1(h1) = session.as_downstream() else { return false };
    let Some(watched) = ClientConnection::of(h1.stream()) else { return false };
    watched.note_sent_aside(bytes);
    true
}

/// Bounds the client socket's unsent bytes for a body the kernel sends, and lifts the bound for
/// one rangeway writes (see `ClientConnection::bound_unsent`).
fn unsent_bounded(session: &Session, kernel_way: bool) {
    if let ServerSession::H1(h1) = session.as_downstream()
        && let Some(watched) = ClientConnection::of(h1.stream())
    {
        watched.bound_unsent(kernel_way);
    }
}

/// Bytes the client connection was told went past pingora's writer and it has not written since.
fn unaccounted(session: &Session) -> u64 {
    match session.as_downstream() {
        ServerSession::H1(h1) => {
            ClientConnection::of(h1.stream()).map_or(0, ClientConnection::unaccounted)
        }
        _ => 0,
    }
}

/// Writes the response header and sends it at once, before the body goes out by another way:
/// pingora buffers a header with a Content-Length until body bytes follow, and offers no flush
/// of its own. A failed task after the header is its way to one ("flush what we have and quit").
async fn write_header_now(session: &mut Session, response: ResponseHeader) -> Result<()> {
    const FLUSHED: ErrorType = ErrorType::Custom("HeaderFlushed");
    let ServerSession::H1(h1) = session.as_downstream_mut() else {
        return Err(Error::explain(ErrorType::InternalError, "splicing to a client not on HTTP/1"));
    };
    let tasks =
        vec![HttpTask::Header(Box::new(response), false), HttpTask::Failed(Error::new(FLUSHED))];
    match h1.response_duplex_vec(tasks).await {
        Err(e) if *e.etype() == FLUSHED => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Err(Error::explain(ErrorType::InternalError, "the header was not flushed")),
    }
}

/// How much of a body the relay reads before it sends the header (see `relay`).
const HOLD_BYTES: usize = 64 * 1024;

/// What the relay's reader ([`BodyReader`]) reads next.
enum Piece {
    Chunk(Bytes),
    /// The next chunk is byte `to` of the object: the stretch of a multipart answer fetched
    /// after a gap.
    Skip(u64),
    /// The body is complete.
    End,
    /// The body broke and could not be continued: the client's response is cut.
    Broken(Box<Error>),
}

/// The most read from an origin's socket at once: four times pingora's read size. On a middleware
/// route each chunk costs a read, a call of every stage and a write to the client, so fewer,
/// larger chunks cost a download less CPU than pingora's 64 KiB (see docs/benchmarks.md, "Relay
/// read size"). What a download holds grows with it.
const READ_BYTES: usize = 256 * 1024;

/// The rest of a body of known length, read from the origin's socket by rangeway.
struct DirectBody {
    socket: RawSocket,
    left: u64,
    timeout: Duration,
}

/// Who reads the rest of an exchange's body.
enum BodySource {
    /// pingora, until it has handed over a chunk: its buffer may hold the body's first bytes.
    Unread,
    /// pingora, to the end: a body without a length, or on a TLS connection.
    Pingora,
    /// rangeway, from the socket, straight into the `Bytes` passed on — where pingora would
    /// read into its buffer and copy each chunk out again.
    Direct(DirectBody),
}

impl BodySource {
    /// For `exchange`, as far as its body has been read: once pingora has handed over a chunk
    /// (what came with the header, or a read of its own) nothing of the body is left in its
    /// buffer, and the rest of a body of known length on a plain socket can be read directly.
    fn of(exchange: &Exchange) -> Self {
        let HttpSession::H1(h1) = &exchange.session else { return Self::Pingora };
        let received = h1.body_bytes_received() as u64;
        if received == 0 {
            return Self::Unread;
        }
        let direct = h1
            .resp_header()
            .and_then(|header| content_length(&header.headers))
            .and_then(|len| len.checked_sub(received))
            .filter(|left| *left > 0)
            // Only then: a socket is duplicated and registered for it.
            .and_then(|left| {
                Some((left, super::transport::plain_socket(exchange.session.stream())?))
            })
            .map(|(left, socket)| DirectBody {
                socket,
                left,
                // As pingora: no read timeout configured, none applied.
                timeout: exchange.read_timeout().unwrap_or(Duration::MAX),
            });
        direct.map_or(Self::Pingora, Self::Direct)
    }
}

/// Where the relay reads an upstream answer's body from.
enum UpstreamBody {
    /// The origin's answer on `exchange`.
    Origin { exchange: Box<Exchange>, source: BodySource },
    /// The slice cache's.
    Cache(Box<CacheBody>),
}

impl UpstreamBody {
    /// The next chunk, of at most `max` bytes where rangeway reads the socket itself.
    async fn next_chunk(&mut self, max: usize) -> Result<Option<Bytes>> {
        match self {
            Self::Origin { exchange, source } => next_chunk(exchange, source, max).await,
            Self::Cache(body) => body.next_chunk().await,
        }
    }

    /// Whether the body has been read to its end.
    fn done(&mut self) -> bool {
        match self {
            Self::Origin { exchange, source } => match source {
                BodySource::Direct(body) => body.left == 0,
                _ => exchange.session.response_done(),
            },
            Self::Cache(body) => body.is_done(),
        }
    }

    /// Says in the origin exchange's span how it ended (see [`Exchange::ended`]).
    fn ended(&mut self, bytes: u64, how: &'static str) {
        if let Self::Origin { exchange, .. } = self {
            exchange.ended(bytes, how);
        }
    }

    /// Gives an origin connection whose body was read to its end back to the pool.
    async fn release(self, client: &OriginClient) {
        match self {
            Self::Origin { exchange, source: BodySource::Direct(_) } => {
                client.release_read_past(*exchange);
            }
            Self::Origin { exchange, .. } => client.release(*exchange).await,
            Self::Cache(_) => {}
        }
    }
}

/// The next chunk of `exchange`'s body, read as `source` says (at most `max` bytes when read
/// from the socket directly); `None` at its end.
async fn next_chunk(
    exchange: &mut Exchange,
    source: &mut BodySource,
    max: usize,
) -> Result<Option<Bytes>> {
    let BodySource::Direct(body) = source else {
        let chunk = exchange.session.read_response_body().await?;
        if chunk.is_some() && matches!(source, BodySource::Unread) {
            *source = BodySource::of(exchange);
        }
        return Ok(chunk);
    };
    if body.left == 0 {
        return Ok(None);
    }
    let max = usize::try_from(body.left).unwrap_or(usize::MAX).min(max);
    let chunk = body
        .socket
        .read(max, body.timeout)
        .await
        .or_err(ErrorType::ReadError, "reading the body")
        .map_err(|e| e.into_up())?;
    if chunk.is_empty() {
        let early = "the origin closed the connection before the end of the body";
        return Err(Error::explain(ErrorType::ConnectionClosed, early).into_up());
    }
    body.left -= chunk.len() as u64;
    Ok(Some(chunk))
}

/// Where reading an upstream body has got to, and how to go on: continuing it where it breaks,
/// fetching the stretches of a multipart answer that follow it. The relay reads with it (through
/// its [`BodyReader`]), and so does the splice.
struct Pump {
    client: Arc<OriginClient>,
    metrics: Arc<Metrics>,
    route: Arc<Route>,
    continuable: Option<Continuable>,
    /// How a broken body is continued; `None` on routes that do not continue bodies.
    policy: Option<UpstreamResume>,
    /// The request continuations and stretches are made from (their Host and Range set);
    /// `None` when there are none to make.
    base: Option<RequestHeader>,
    /// The stretches of a multipart answer to fetch after this body, in order.
    parts: std::collections::VecDeque<ByteRange>,
    /// The next byte of the object the body brings.
    at: u64,
    /// Where the body of the exchange being read began: its span counts the bytes from here.
    attempt_from: u64,
    replica: usize,
    /// The slice cache and how the route uses it, when it does: the stretches of a multipart
    /// answer are asked of it.
    cache: Option<(Arc<SliceCache>, RouteCache, bool)>,
    /// The most read from the origin's socket at once: [`READ_BYTES`], or a paced body's step
    /// (a shaped client would otherwise hold a large chunk while it waits for its steps).
    read_max: usize,
}

/// The rest of an upstream body, piece by piece: continued where it breaks, followed by the
/// stretches of a multipart answer.
struct BodyReader {
    pump: Pump,
    /// `None` once the body and every stretch after it have been read.
    body: Option<UpstreamBody>,
    /// The error the last read before this reader failed with.
    pending: Option<Box<Error>>,
    /// The continuations tried, counted from when the reading began.
    tries: Tries,
}

impl BodyReader {
    /// The next piece; after `End` or `Broken` there is none.
    async fn next(&mut self) -> Piece {
        let pump = &mut self.pump;
        loop {
            let Some(body) = self.body.as_mut() else {
                return Piece::Broken(Error::explain(
                    ErrorType::InternalError,
                    "read past the end",
                ));
            };
            let read = match self.pending.take() {
                Some(broke) => Err(broke),
                None => body.next_chunk(pump.read_max).await,
            };
            match read {
                Ok(Some(chunk)) => {
                    pump.at += chunk.len() as u64;
                    return Piece::Chunk(chunk);
                }
                Ok(None) => {
                    body.ended(pump.at - pump.attempt_from, "complete");
                    // Pooled before the client hears of the end: its next request may want it.
                    if let Some(body) = self.body.take() {
                        body.release(&pump.client).await;
                    }
                    let Some(part) = pump.parts.pop_front() else { return Piece::End };
                    return match pump.next_part(part).await {
                        Ok(next) => {
                            self.body = Some(next);
                            pump.attempt_from = pump.at;
                            Piece::Skip(part.start())
                        }
                        Err(broke) => Piece::Broken(broke),
                    };
                }
                // The cache's fetches continue what they can: its error is final.
                Err(broke) if matches!(body, UpstreamBody::Cache(_)) => {
                    self.body = None;
                    return Piece::Broken(broke);
                }
                Err(broke) => {
                    body.ended(pump.at - pump.attempt_from, "cut");
                    match pump.continued(broke, &mut self.tries).await {
                        Ok(next) => {
                            pump.attempt_from = pump.at;
                            self.body = Some(UpstreamBody::Origin {
                                exchange: Box::new(next),
                                source: BodySource::Unread,
                            });
                        }
                        Err(broke) => {
                            self.body = None;
                            return Piece::Broken(broke);
                        }
                    }
                }
            }
        }
    }
}

impl Pump {
    /// The body broke with `broke` at `self.at`: a continuation of it, or the error to cut the
    /// client's response with.
    async fn continued(&mut self, broke: Box<Error>, tries: &mut Tries) -> Result<Exchange> {
        self.route.upstream.failed(self.replica);
        let Some(policy) = self.policy else { return Err(broke) };
        let at = self.at;
        let Some(range) = self
            .continuable
            .as_ref()
            .filter(|c| at < c.end)
            .and_then(|c| ByteRange::new(at, c.end))
        else {
            self.metrics.upstream_resume(&self.route.name, "unresumable");
            info!(route = %self.route.name, at, error = %broke, "the origin broke off a body that cannot be continued (no strong ETag or length): cutting the response");
            return Err(broke);
        };
        tries.after_failure();
        match self.fetch(range, &policy, tries).await {
            Ok(exchange) => {
                self.metrics.upstream_resume(&self.route.name, "resumed");
                let attempts = tries.made();
                info!(route = %self.route.name, at, attempts, "the origin broke off the body; continued it from where it broke");
                Ok(exchange)
            }
            Err(outcome) => {
                self.metrics.upstream_resume(&self.route.name, outcome);
                warn!(route = %self.route.name, at, outcome, error = %broke, "the origin broke off the body and it could not be continued: cutting the response");
                Err(broke)
            }
        }
    }

    /// The next stretch of a multipart answer, `part`, of the version the first was: its
    /// exchange, or the error to cut the client's response with. Tried as often as the route
    /// continues a broken body, once on a route that does not.
    async fn next_part(&mut self, part: ByteRange) -> Result<UpstreamBody> {
        if let Some(body) = self.cached_part(part).await {
            self.at = part.start();
            return Ok(UpstreamBody::Cache(body));
        }
        let once = UpstreamResume { attempts: 1, ..UpstreamResume::default() };
        let policy = self.policy.unwrap_or(once);
        self.at = part.start();
        if let Some(continuable) = self.continuable.as_mut() {
            // A break within the stretch is continued up to its end.
            continuable.end = part.end();
        }
        let exchange =
            self.fetch(part, &policy, &mut Tries::new()).await.map_err(|outcome| {
                warn!(route = %self.route.name, at = part.start(), outcome, "a stretch of a multipart answer could not be fetched: cutting the response");
                Error::explain(ErrorType::ReadError, "fetching a stretch of the ranges asked for")
                    .into_up()
            })?;
        Ok(UpstreamBody::Origin { exchange: Box::new(exchange), source: BodySource::Unread })
    }

    /// `part` of the version the body is of, from the slice cache, on a route that uses one:
    /// `None` when the cache does not answer it with exactly that.
    async fn cached_part(&self, part: ByteRange) -> Option<Box<CacheBody>> {
        let ((cache, use_of, authorized), base, continuable) =
            (self.cache.as_ref()?, self.base.as_ref()?, self.continuable.as_ref()?);
        let mut request = base.clone();
        pinned_range(&mut request, part, &continuable.etag)?;
        let asked = (&request, *authorized);
        let answer = cache.answer(&self.route, *use_of, asked, &self.client, self.replica).await;
        match answer {
            CacheAnswer::Served { header, body, .. } if header.status.as_u16() == 206 => body,
            _ => None,
        }
    }

    /// Asks the origin (perhaps another replica, holding the same version: `If-Match` says so)
    /// for `range` of the version the body is of, within `policy` and the `tries` made before:
    /// the exchange, whose answer is the 206 of exactly that range of that version. `Err` names
    /// the outcome: `changed` or `failed`.
    async fn fetch(
        &mut self,
        range: ByteRange,
        policy: &UpstreamResume,
        tries: &mut Tries,
    ) -> std::result::Result<Exchange, &'static str> {
        let (Some(base), Some(continuable)) = (&self.base, &self.continuable) else {
            return Err("failed");
        };
        let pinned = Pinned { etag: &continuable.etag, len: continuable.complete_len };
        let upstream = &self.route.upstream;
        match self.client.fetch(upstream, base, range, pinned, policy, tries).await {
            Ok((exchange, replica)) => {
                self.replica = replica;
                Ok(exchange)
            }
            Err(failed) => Err(failed.outcome()),
        }
    }
}
