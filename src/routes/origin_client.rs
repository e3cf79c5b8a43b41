//! Requests rangeway makes to an origin itself: relayed answers (`proxy::relay`), the rest of a
//! version — a broken body's continuation, a stretch of ranges far apart, what a completion pass
//! reads ([`OriginClient::fetch_range`]) — the length of an object whose origin would not say
//! it, and the requests passed through with a body streamed from the client ([`Sending`]).

use std::time::{Duration, Instant};

use http::{HeaderName, header};
use pingora_core::connectors::TransportConnector;
use pingora_core::protocols::Stream;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::v1::client::HttpSession as Http1Session;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use rangeway_middleware::ByteRange;

use super::upstream::Upstream;
use crate::traces;

/// The longest wait between two tries of a fetch.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The most `103 Early Hints` an exchange keeps for its client; an origin that sends more is
/// not let grow the request's memory.
const MAX_HINTS: usize = 4;

/// Reads the answer's header. Interim answers (100, 102, 103 Early Hints) come before the final
/// one: they are not the answer (RFC 9110 §15.2). `103`s are kept for the client (the first
/// [`MAX_HINTS`] of them); the others, which answer what rangeway did not ask (it sends no
/// `Expect`: it answers a client's itself), are dropped.
async fn read_final_header(session: &mut HttpSession) -> Result<Vec<ResponseHeader>> {
    let mut hints = Vec::new();
    loop {
        session.read_response_header().await?;
        let Some(header) = session.response_header() else { return Ok(hints) };
        match header.status.as_u16() {
            103 if hints.len() < MAX_HINTS => hints.push(header.clone()),
            100..=199 if header.status.as_u16() != 101 => {}
            _ => return Ok(hints),
        }
    }
}

/// Why [`OriginClient::fetch_range`] has no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FetchError {
    /// The version is not there any more (412, another ETag).
    Changed,
    /// No answer, or not the one asked for: worth trying again.
    Failed,
}

impl FetchError {
    /// Its name in `rangeway_upstream_resumes_total{outcome}`.
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            Self::Changed => "changed",
            Self::Failed => "failed",
        }
    }
}

/// A version of an object as a request for a range of it pins it: its validator ([`Pin`]) and
/// its length (which the answer's `Content-Range` must name).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pinned<'a> {
    pub(crate) by: Pin<'a>,
    pub(crate) len: u64,
}

/// The strong validator a version is pinned by (RFC 9110 §8.8.1): what a request for a range of
/// it is conditioned on, and what the answer must state again, byte for byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin<'a> {
    /// Its strong ETag, quotes included: `If-Match`.
    ETag(&'a str),
    /// Its `Last-Modified`, as the origin wrote it, where no strong ETag is given and the date is
    /// strong (a minute or more before the answer's `Date`, §8.8.2.2): `If-Unmodified-Since`.
    LastModified(&'a str),
}

impl<'a> Pin<'a> {
    /// The condition a request for the version carries, the field its answer must repeat, and
    /// the value of both.
    fn fields(self) -> (HeaderName, HeaderName, &'a str) {
        match self {
            Self::ETag(etag) => (header::IF_MATCH, header::ETAG, etag),
            Self::LastModified(date) => (header::IF_UNMODIFIED_SINCE, header::LAST_MODIFIED, date),
        }
    }
}

/// How rangeway continues a response whose origin connection fails mid-body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamResume {
    pub attempts: u32,
    pub deadline: Duration,
    /// Doubled for each next continuation.
    pub backoff: Duration,
}

impl UpstreamResume {
    /// One try, however long it takes: what a fetch made once is bounded by.
    pub const ONCE: Self = Self { attempts: 1, deadline: Duration::MAX, backoff: Duration::ZERO };
}

impl Default for UpstreamResume {
    fn default() -> Self {
        Self { attempts: 5, deadline: Duration::from_secs(30), backoff: Duration::from_millis(100) }
    }
}

/// The tries made for one piece of a body, which an [`UpstreamResume`] bounds: a body's
/// continuations count together, from when the first began.
#[derive(Debug)]
pub(crate) struct Tries {
    started: Instant,
    made: u32,
    /// The next try follows a failure: it waits its backoff first.
    pause: bool,
}

impl Tries {
    pub(crate) fn new() -> Self {
        Self { started: Instant::now(), made: 0, pause: false }
    }

    /// The body broke: the next try waits its backoff first.
    pub(crate) fn after_failure(&mut self) {
        self.pause = true;
    }

    pub(crate) fn made(&self) -> u32 {
        self.made
    }
}

/// Makes `request` ask for `range` of the version `pin` names, and of nothing else: `Range` and
/// the pin's condition, no other. `None` for an empty range or a validator that is no header
/// value.
pub(crate) fn pinned_range(
    request: &mut RequestHeader,
    range: ByteRange,
    pin: Pin<'_>,
) -> Option<()> {
    let asked = format!("bytes={}-{}", range.start(), range.last()?);
    request.insert_header(header::RANGE, asked).ok()?;
    for name in [
        header::IF_MATCH,
        header::IF_UNMODIFIED_SINCE,
        header::IF_RANGE,
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
    ] {
        request.remove_header(&name);
    }
    let (condition, _, value) = pin.fields();
    request.insert_header(condition, value).ok()?;
    Some(())
}

/// A connection pool of rangeway's own, apart from the proxy's. HTTP/1 only, as rangeway's
/// upstreams are; the pool holds connections rather than sessions, so that one whose body was
/// spliced past pingora's reader can go back to it.
pub(crate) struct OriginClient {
    dialer: Dialer,
}

/// Where an origin client's connections come from, chosen once, when it is made.
enum Dialer {
    /// The network: pingora's connector, and its pool.
    Network(TransportConnector),
    /// Origins served in this process over in-memory pipes, by the address of the socket they
    /// stand for; a connection a request (the pipeline's tests).
    #[cfg(test)]
    Memory(std::sync::Arc<crate::origin::memory::MemoryOrigins>),
}

impl Dialer {
    /// A connection to `peer`, and whether it was pooled.
    async fn connect(&self, peer: &HttpPeer) -> Result<(Stream, bool)> {
        match self {
            Self::Network(transport) => match transport.reused_stream(peer).await {
                Some(stream) => Ok((stream, true)),
                // Connecting (TLS's handshake with it) is an 8 KiB future, boxed so that every
                // future that makes an exchange — and every response's, which pingora boxes and
                // moves — does not carry it for the pooled case.
                None => Ok((Box::pin(transport.new_stream(peer)).await?, false)),
            },
            #[cfg(test)]
            Self::Memory(origins) => Ok((origins.dial(peer.address())?, false)),
        }
    }

    /// Keeps `stream`, whose exchange is over, for the next request to `peer`.
    fn release(&self, stream: Stream, peer: &HttpPeer) {
        match self {
            Self::Network(transport) => {
                transport.release_stream(stream, peer.reuse_hash(), peer.options.idle_timeout);
            }
            #[cfg(test)]
            Self::Memory(_) => {}
        }
    }
}

impl std::fmt::Debug for OriginClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginClient").finish_non_exhaustive()
    }
}

/// One request and the connection it went on.
pub(crate) struct Exchange {
    pub(crate) session: HttpSession,
    peer: Box<HttpPeer>,
    /// Its `origin` span, when the response it is for is traced: it ends with the exchange.
    attempt: tracing::Span,
    /// The `103 Early Hints` that came before the answer, for a client's request to relay.
    hints: Vec<ResponseHeader>,
}

impl Exchange {
    /// The `103 Early Hints` that came before the answer, taken: each relayed once.
    pub(crate) fn take_hints(&mut self) -> Vec<ResponseHeader> {
        std::mem::take(&mut self.hints)
    }

    /// Says in its span how the exchange ended — `bytes` of body read, and `how` (`complete`,
    /// `cut`, `client_gone`) — and ends the span: a continuation's begins after it.
    pub(crate) fn ended(&mut self, bytes: u64, how: &'static str) {
        self.attempt.record("rangeway.bytes", traces::int(bytes));
        self.attempt.record("rangeway.ended", how);
        if how == "cut" {
            self.attempt.record("otel.status_code", "ERROR");
        }
        self.attempt = tracing::Span::none();
    }

    /// How long the connection may be silent, as configured for its upstream.
    pub(crate) fn read_timeout(&self) -> Option<std::time::Duration> {
        self.peer.options.read_timeout
    }
}

/// A request started ([`OriginClient::start_failing_over`]): its header written, its body
/// being written by the caller, its answer not read yet.
pub(crate) struct Sending {
    session: HttpSession,
    peer: Box<HttpPeer>,
    attempt: tracing::Span,
    asked: Instant,
    replica: usize,
}

impl Sending {
    /// Writes `chunk` of the request's body.
    pub(crate) async fn write_body(&mut self, chunk: bytes::Bytes) -> Result<()> {
        // Written chunked, an empty chunk would be the body's end (a client's reader hands some).
        if chunk.is_empty() {
            return Ok(());
        }
        self.session.write_request_body(chunk, false).await.map_err(|e| e.into_up())
    }

    /// Ends the request's body and reads the answer's header, interim answers passed over: the
    /// whole header within the upstream's `read_timeout`, not each read, so that an origin that
    /// answers a byte at a time does not hold the client longer than one that does not answer.
    pub(crate) async fn answer(self, upstream: &Upstream) -> Result<Exchange> {
        let Self { mut session, peer, attempt, asked, replica } = self;
        let answered = async {
            session.finish_request_body().await?;
            let header = read_final_header(&mut session);
            match peer.options.read_timeout {
                Some(limit) => tokio::time::timeout(limit, header).await.unwrap_or_else(|_| {
                    Error::e_explain(
                        ErrorType::ReadTimedout,
                        format!("the response header took longer than read_timeout ({limit:?})"),
                    )
                }),
                None => header.await,
            }
        };
        let hints = match answered.await {
            Ok(hints) => hints,
            Err(error) => {
                return Err(AttemptFailed::failed(upstream, replica, &attempt, error, true).error);
            }
        };
        if let Some(answer) = session.response_header() {
            attempt.record("http.response.status_code", traces::int(answer.status.as_u16()));
        }
        attempt.record("rangeway.first_byte_ms", asked.elapsed().as_secs_f64() * 1000.0);
        Ok(Exchange { session, peer, attempt, hints })
    }
}

/// Why a request could not be started or answered, and whether any of it was written.
struct AttemptFailed {
    error: Box<Error>,
    wrote: bool,
}

impl AttemptFailed {
    /// `replica` failed with `error`: passed over for a while, the attempt's span told, the
    /// error the upstream's — as pingora marks those of its own proxying, it is answered and
    /// counted as one (502/504, `rangeway_upstream_errors_total`).
    fn failed(
        upstream: &Upstream,
        replica: usize,
        attempt: &tracing::Span,
        error: Box<Error>,
        wrote: bool,
    ) -> Self {
        upstream.failed(replica);
        attempt.record("rangeway.ended", "failed");
        attempt.record("otel.status_code", "ERROR");
        Self { error: error.into_up(), wrote }
    }
}

/// Sends `request` with `send` to `*replica`; while it fails where `send` says another replica
/// may be asked instead, asks the others as [`Upstream::retry_elsewhere`] allows (`tried`
/// counts them), each with `base` and its Host; `*replica` ends as the one asked last.
async fn failing_over<T, F>(
    upstream: &Upstream,
    (replica, tried): (&mut usize, &mut usize),
    (request, base): (RequestHeader, Option<&RequestHeader>),
    send: impl Fn(usize, RequestHeader) -> F,
) -> Result<T>
where
    F: std::future::Future<Output = std::result::Result<T, (Box<Error>, bool)>>,
{
    let mut sent = send(*replica, request).await;
    while let (Err((_, true)), Some(base)) = (&sent, base) {
        if !upstream.retry_elsewhere(*replica, tried) {
            break;
        }
        *replica = upstream.choose();
        let mut request = base.clone();
        request.insert_header(header::HOST, upstream.host_header(*replica).clone())?;
        sent = send(*replica, request).await;
    }
    sent.map_err(|(error, _)| error)
}

impl OriginClient {
    pub(crate) fn new() -> Self {
        Self { dialer: Dialer::Network(TransportConnector::new(None)) }
    }

    /// A client that reaches `origins` in memory, and no network.
    #[cfg(test)]
    pub(crate) fn in_memory(origins: std::sync::Arc<crate::origin::memory::MemoryOrigins>) -> Self {
        Self { dialer: Dialer::Memory(origins) }
    }

    /// Sends `request` (made by [`Upstream::request`] for `replica`) to that replica of
    /// `upstream`, signed when it is an S3 upstream, and reads the answer's header. Within a
    /// traced response (the current span), it is an `origin` span of that trace, `what` it is
    /// for (`first`, `range`, `length`), and says so to the origin (`traceparent`).
    pub(crate) async fn send(
        &self,
        upstream: &Upstream,
        replica: usize,
        mut request: RequestHeader,
        what: &'static str,
    ) -> Result<Exchange> {
        let attempt = traces::origin_attempt(&tracing::Span::current(), &mut request, what);
        upstream.authorize(&mut request)?;
        self.exchange(upstream, replica, request, attempt).await
    }

    /// Sends a request's first `request` (made for `*replica`) as [`Self::send`] does. When that
    /// replica cannot be reached, the others are tried as [`Upstream::retry_elsewhere`] allows
    /// (`tried` counts them), each with `base` and its Host (`base` given when there are
    /// others); `*replica` ends as the one asked last.
    pub(crate) async fn send_failing_over(
        &self,
        upstream: &Upstream,
        replicas: (&mut usize, &mut usize),
        request: RequestHeader,
        base: Option<&RequestHeader>,
    ) -> Result<Exchange> {
        let send = move |replica, request| async move {
            self.send(upstream, replica, request, "first").await.map_err(|e| (e, true))
        };
        failing_over(upstream, replicas, (request, base), send).await
    }

    /// Starts `request` — a request whose body the caller streams ([`Sending`]) — on `*replica`,
    /// signed and traced as [`Self::send`] does, and fails over to the other replicas as
    /// [`Self::send_failing_over`] does while nothing of it can have reached one: the connection
    /// failed. An `idempotent` request (RFC 9110 §9.2.2) also fails over when its header could
    /// not be written whole, as none of its body went yet.
    pub(crate) async fn start_failing_over(
        &self,
        upstream: &Upstream,
        replicas: (&mut usize, &mut usize),
        (request, base): (RequestHeader, Option<&RequestHeader>),
        idempotent: bool,
    ) -> Result<Sending> {
        let start = move |replica, mut request: RequestHeader| async move {
            let attempt = traces::origin_attempt(&tracing::Span::current(), &mut request, "first");
            upstream.authorize(&mut request).map_err(|e| (e, false))?;
            self.start(upstream, replica, request, attempt)
                .await
                .map_err(|AttemptFailed { error, wrote }| (error, idempotent || !wrote))
        };
        failing_over(upstream, replicas, (request, base), start).await
    }

    /// Sends `request` as it is (already authorized, its `traceparent` set for `attempt`, its
    /// span) and reads the answer's header.
    async fn exchange(
        &self,
        upstream: &Upstream,
        replica: usize,
        request: RequestHeader,
        attempt: tracing::Span,
    ) -> Result<Exchange> {
        let sending = self.start(upstream, replica, request, attempt).await.map_err(|n| n.error)?;
        sending.answer(upstream).await
    }

    /// Connects to `replica` and writes `request`'s header (already authorized, its
    /// `traceparent` set for `attempt`, its span): the request whose body follows. A replica
    /// that cannot be reached is passed over for a while (one that answers 5xx is, by whoever
    /// reads the answer).
    async fn start(
        &self,
        upstream: &Upstream,
        replica: usize,
        request: RequestHeader,
        attempt: tracing::Span,
    ) -> std::result::Result<Sending, AttemptFailed> {
        let asked = Instant::now();
        let peer = match upstream.peer(replica).await {
            Ok(peer) => peer,
            Err(error) => {
                return Err(AttemptFailed::failed(upstream, replica, &attempt, error, false));
            }
        };
        let (stream, reused) = match self.dialer.connect(peer.as_ref()).await {
            Ok(connected) => connected,
            Err(error) => {
                return Err(AttemptFailed::failed(upstream, replica, &attempt, error, false));
            }
        };
        attempt.record("rangeway.connection_reused", reused);
        attempt.record("rangeway.connect_ms", asked.elapsed().as_secs_f64() * 1000.0);
        let mut h1 = Http1Session::new_with_options(stream, peer.as_ref());
        // pingora's session does not take the peer's read timeout (its own proxying sets it):
        // without it, a body pingora reads waits on a silent origin forever.
        h1.read_timeout = peer.options.read_timeout;
        let mut session = HttpSession::H1(h1);
        if let Err(error) = session.write_request_header(Box::new(request)).await {
            return Err(AttemptFailed::failed(upstream, replica, &attempt, error, true));
        }
        Ok(Sending { session, peer, attempt, asked, replica })
    }

    /// Asks `upstream` for `range` of the version `pinned`, within `policy`'s attempts and
    /// deadline and the `tries` made before: `base` (the request as any replica is asked it)
    /// sent to a replica chosen for each try, with its `Host`. A try after a failure waits the
    /// backoff first, doubled for each next one (at most 5 s). The exchange whose answer is
    /// exactly that range of that version, and the replica that gave it. What every request for
    /// a piece of a known version is made with: a broken body's continuation, the stretches of
    /// ranges far apart, a cache fill, a completion pass.
    pub(crate) async fn fetch(
        &self,
        upstream: &Upstream,
        base: &RequestHeader,
        range: ByteRange,
        pinned: Pinned<'_>,
        policy: &UpstreamResume,
        tries: &mut Tries,
    ) -> std::result::Result<(Exchange, usize), FetchError> {
        let mut backoff = policy.backoff;
        loop {
            let left = || policy.deadline.checked_sub(tries.started.elapsed());
            if tries.made >= policy.attempts || left().is_none() {
                return Err(FetchError::Failed);
            }
            tries.made += 1;
            if tries.pause {
                tokio::time::sleep(backoff.min(left().unwrap_or_default())).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            tries.pause = true;
            let replica = upstream.choose();
            let mut request = base.clone();
            request
                .insert_header(header::HOST, upstream.host_header(replica).clone())
                .map_err(|_| FetchError::Failed)?;
            let Some(left) = left() else { return Err(FetchError::Failed) };
            let asked = self.fetch_range(upstream, replica, request, range, pinned);
            match tokio::time::timeout(left, asked).await {
                Ok(Ok(exchange)) => return Ok((exchange, replica)),
                Ok(Err(FetchError::Changed)) => return Err(FetchError::Changed),
                // Not the answer asked for, or none in time: try again.
                Ok(Err(FetchError::Failed)) | Err(_) => {}
            }
        }
    }

    /// Asks `replica` of `upstream` for `range` of the version `pinned`: `request` (made for that
    /// replica; its `Host` is kept) with that `Range` and `If-Match`, signed. The exchange when
    /// the answer is exactly that — a 206 of `range` (or a 200 when `range` is the whole
    /// version), of that ETag and length — ready for its body to be read.
    async fn fetch_range(
        &self,
        upstream: &Upstream,
        replica: usize,
        mut request: RequestHeader,
        range: ByteRange,
        Pinned { by, len: complete_len }: Pinned<'_>,
    ) -> std::result::Result<Exchange, FetchError> {
        pinned_range(&mut request, range, by).ok_or(FetchError::Failed)?;
        let exchange =
            self.send(upstream, replica, request, "range").await.map_err(|_| FetchError::Failed)?;
        let Some(answer) = exchange.session.response_header() else {
            return Err(FetchError::Failed);
        };
        if answer.status.is_server_error() {
            upstream.failed(replica);
        }
        let status = answer.status.as_u16();
        let (_, stated, value) = by.fields();
        let same_version =
            answer.headers.get(stated).map(|v| v.as_bytes()) == Some(value.as_bytes());
        let holds = match status {
            206 => crate::range::stated_range(&answer.headers) == Some((range, Some(complete_len))),
            200 => {
                range == ByteRange::whole(complete_len)
                    && crate::range::content_length(&answer.headers) == Some(complete_len)
            }
            _ => false,
        };
        match (status, same_version, holds) {
            (412, _, _) | (200 | 206, false, _) => Err(FetchError::Changed),
            (_, true, true) => Ok(exchange),
            // A 5xx, another range, an ignored Range: not the answer asked for.
            _ => Err(FetchError::Failed),
        }
    }

    /// Returns the connection of an exchange whose body was read to its end to the pool, when
    /// the origin keeps it open.
    pub(crate) async fn release(&self, exchange: Exchange) {
        // Taken apart before the wait: the exchange's span would otherwise be held across it,
        // and the exchange with it, in this future and every caller's.
        let Some((session, peer)) = reusable(exchange) else { return };
        if let Some(stream) = session.reuse().await {
            self.dialer.release(stream, &peer);
        }
    }

    /// Returns the connection of an exchange whose body was read to its end past pingora's
    /// reader (spliced, or read from the socket by rangeway: pingora saw only its first bytes)
    /// to the pool, when the origin keeps it open.
    pub(crate) fn release_read_past(&self, exchange: Exchange) {
        let Some((session, peer)) = reusable(exchange) else { return };
        if session.will_keepalive() {
            self.dialer.release(session.into_inner(), &peer);
        }
    }

    /// The length of the object at `target` (path and query), by a HEAD: `None` when the origin
    /// does not answer 200 with a Content-Length.
    pub(crate) async fn length(&self, upstream: &Upstream, target: &str) -> Result<Option<u64>> {
        let replica = upstream.choose();
        let request = upstream.request("HEAD", target, replica)?;
        let exchange = self.send(upstream, replica, request, "length").await?;
        let length = exchange
            .session
            .response_header()
            .filter(|r| r.status.as_u16() == 200)
            .and_then(|r| r.headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok());
        self.release(exchange).await;
        Ok(length)
    }
}

/// An HTTP/1 exchange's session, set to keep its connection only if the origin's answer allows,
/// and its peer: what returning the connection to the pool needs.
fn reusable(exchange: Exchange) -> Option<(Http1Session, Box<HttpPeer>)> {
    let Exchange { session: HttpSession::H1(mut session), peer, .. } = exchange else {
        return None;
    };
    session.respect_keepalive();
    Some((session, peer))
}
