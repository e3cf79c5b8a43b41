//! The source's body, read: from the origin's connection (through pingora's reader, or from its
//! socket once pingora's buffer is drained) or from the slice cache; continued where the origin
//! breaks it off (`[routes.upstream_resume]`: the rest asked with `Range` and `If-Match` on its
//! strong ETag, of the same version or not at all); followed by the stretches of a multipart
//! answer fetched apart. The deliver step reads it piece by piece, and so does the splice.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pingora_core::protocols::http::client::HttpSession;
use pingora_error::{Error, ErrorType, OrErr, Result};
use pingora_http::RequestHeader;
use rangeway_middleware::ByteRange;
use tracing::{info, warn};

use super::Proxy;
use super::splice::OriginSocket;
use crate::cache::{CacheAnswer, CacheBody, SliceCache, StreamedFill};
use crate::range::{Continuable, content_length};
use crate::routes::UpstreamResume;
use crate::routes::origin_client::{Exchange, OriginClient, Pin, Pinned, Tries, pinned_range};
use crate::routes::{Route, RouteCache};
use crate::telemetry::metrics::Metrics;

/// What the relay's reader ([`BodyReader`]) reads next.
pub(super) enum Piece {
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
pub(super) const READ_BYTES: usize = 256 * 1024;

/// The rest of a body of known length, read from the origin's socket by rangeway (lent by the
/// exchange's stream for each read).
pub(super) struct DirectBody {
    left: u64,
    timeout: Duration,
}

/// Who reads the rest of an exchange's body.
pub(super) enum BodySource {
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
            .filter(|_| OriginSocket::of(exchange.session.stream()).is_some())
            .map(|left| DirectBody {
                left,
                // As pingora: no read timeout configured, none applied.
                timeout: exchange.read_timeout().unwrap_or(Duration::MAX),
            });
        direct.map_or(Self::Pingora, Self::Direct)
    }
}

/// Where the relay reads an upstream answer's body from.
pub(super) enum UpstreamBody {
    /// The origin's answer on `exchange`; `fill`: the cache keeps it as it streams.
    Origin { exchange: Box<Exchange>, source: BodySource, fill: Option<Box<StreamedFill>> },
    /// The slice cache's.
    Cache(Box<CacheBody>),
}

impl UpstreamBody {
    /// The origin's answer on `exchange`, its body not read yet.
    pub(super) fn origin(exchange: Box<Exchange>) -> Self {
        Self::Origin { exchange, source: BodySource::Unread, fill: None }
    }

    /// The next chunk, of at most `max` bytes where rangeway reads the socket itself.
    pub(super) async fn next_chunk(&mut self, max: usize) -> Result<Option<Bytes>> {
        match self {
            Self::Origin { exchange, source, fill: None } => {
                next_chunk(exchange, source, max).await
            }
            Self::Origin { exchange, source, fill } => {
                let read = next_chunk(exchange, source, max).await;
                feed(fill, &read, exchange.session.response_done());
                read
            }
            Self::Cache(body) => body.next_chunk().await,
        }
    }

    /// Whether the body has been read to its end.
    pub(super) fn done(&mut self) -> bool {
        match self {
            Self::Origin { exchange, source, .. } => match source {
                BodySource::Direct(body) => body.left == 0,
                _ => exchange.session.response_done(),
            },
            Self::Cache(body) => body.is_done(),
        }
    }

    /// Says in the origin exchange's span how it ended (see [`Exchange::ended`]).
    pub(super) fn ended(&mut self, bytes: u64, how: &'static str) {
        if let Self::Origin { exchange, .. } = self {
            exchange.ended(bytes, how);
        }
    }

    /// Gives an origin connection whose body was read to its end back to the pool.
    pub(super) async fn release(self, client: &OriginClient) {
        match self {
            Self::Origin { exchange, source: BodySource::Direct(_), .. } => {
                client.release_read_past(*exchange);
            }
            Self::Origin { exchange, .. } => client.release(*exchange).await,
            Self::Cache(_) => {}
        }
    }
}

/// Feeds the cache's fill of a body without a length with what was `read` of it: kept at the
/// body's end (`done`, or the end read), dropped unkept when the body is cut.
fn feed(fill: &mut Option<Box<StreamedFill>>, read: &Result<Option<Bytes>>, done: bool) {
    match read {
        Ok(Some(chunk)) => {
            if let Some(fill) = fill.as_mut() {
                fill.push(chunk);
            }
            if !done {
                return;
            }
        }
        Ok(None) => {}
        Err(_) => {
            *fill = None;
            return;
        }
    }
    if let Some(fill) = fill.take() {
        fill.finish();
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
    let socket = OriginSocket::of(exchange.session.stream()).ok_or_else(|| {
        Error::explain(ErrorType::InternalError, "the origin connection cannot be read directly")
    })?;
    let chunk = socket
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
pub(super) struct Pump {
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
    pub(super) parts: std::collections::VecDeque<ByteRange>,
    /// The next byte of the object the body brings.
    pub(super) at: u64,
    /// Where the body of the exchange being read began: its span counts the bytes from here.
    attempt_from: u64,
    replica: usize,
    /// The slice cache and how the route uses it, when it does: the stretches of a multipart
    /// answer are asked of it.
    cache: Option<(Arc<SliceCache>, RouteCache, bool)>,
    /// The most read from the origin's socket at once: [`READ_BYTES`], or a paced body's step
    /// (a shaped client would otherwise hold a large chunk while it waits for its steps).
    pub(super) read_max: usize,
}

/// The rest of an upstream body, piece by piece: continued where it breaks, followed by the
/// stretches of a multipart answer.
pub(super) struct BodyReader {
    pump: Pump,
    /// `None` once the body and every stretch after it have been read.
    body: Option<UpstreamBody>,
    /// The error the last read before this reader failed with.
    pending: Option<Box<Error>>,
    /// The continuations tried, counted from when the reading began.
    tries: Tries,
}

impl BodyReader {
    /// Reads `body`, the rest after what was read of it (`pending`: the error its last read
    /// failed with), with `pump`.
    pub(super) fn new(pump: Pump, body: UpstreamBody, pending: Option<Box<Error>>) -> Self {
        Self { pump, body: Some(body), pending, tries: Tries::new() }
    }

    /// The next piece; after `End` or `Broken` there is none.
    pub(super) async fn next(&mut self) -> Piece {
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
                    // Boxed, as the continuation below: rare and large, they would otherwise grow
                    // every read's future.
                    return match Box::pin(pump.next_part(part)).await {
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
                    match Box::pin(pump.continued(broke, &mut self.tries)).await {
                        Ok(next) => {
                            pump.attempt_from = pump.at;
                            self.body = Some(UpstreamBody::origin(Box::new(next)));
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

/// What the source said of its body, which a pump continues it by: where it sits in the object,
/// its version, the request to ask again with, and the route's policy for that.
pub(super) type SourceTerms =
    (Option<ByteRange>, Option<Continuable>, Option<RequestHeader>, Option<UpstreamResume>);

impl Pump {
    /// The pump of a body the source answered on `route` with `terms`, from `replica`; `parts`:
    /// the stretches of a multipart answer that follow it; `authorized`: the client's own
    /// `Authorization` goes with what the cache is asked.
    pub(super) fn new(
        proxy: &Proxy,
        route: &Arc<Route>,
        (stream, continuable, base, policy): SourceTerms,
        parts: std::collections::VecDeque<ByteRange>,
        replica: usize,
        authorized: bool,
    ) -> Self {
        let at = stream.map_or(0, |s| s.start());
        Self {
            client: Arc::clone(&proxy.origin_client),
            metrics: Arc::clone(&proxy.metrics),
            route: Arc::clone(route),
            continuable,
            policy,
            base,
            parts,
            at,
            attempt_from: at,
            replica,
            cache: proxy
                .cache
                .clone()
                .zip(route.cache)
                .map(|(cache, use_of)| (cache, use_of, authorized)),
            read_max: READ_BYTES,
        }
    }

    /// The body broke with `broke` at `self.at`: a continuation of it, or the error to cut the
    /// client's response with.
    pub(super) async fn continued(
        &mut self,
        broke: Box<Error>,
        tries: &mut Tries,
    ) -> Result<Exchange> {
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
        Ok(UpstreamBody::origin(Box::new(exchange)))
    }

    /// `part` of the version the body is of, from the slice cache, on a route that uses one:
    /// `None` when the cache does not answer it with exactly that.
    async fn cached_part(&self, part: ByteRange) -> Option<Box<CacheBody>> {
        let ((cache, use_of, authorized), base, continuable) =
            (self.cache.as_ref()?, self.base.as_ref()?, self.continuable.as_ref()?);
        let mut request = base.clone();
        pinned_range(&mut request, part, Pin::ETag(&continuable.etag))?;
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
        let pinned = Pinned { by: Pin::ETag(&continuable.etag), len: continuable.complete_len };
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
