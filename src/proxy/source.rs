//! The source step of the pipeline: the request rangeway sends for the client's, asked of the
//! slice cache (which answers as the origin would, or says to ask the origin) or of the origin
//! itself, another replica when one cannot be reached. What comes back is the source's answer:
//! its header, and its body to read (source_body.rs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use rangeway_middleware::ByteRange;

use super::Proxy;
use super::client_session::ClientSession;
use super::client_session::ClientWatch;
use super::context::RequestCtx;
use super::hop_by_hop::{answer_to_forward, end_to_end, forwarded};
use super::origin_request::{self, client_side};
use super::source_body::{BodySource, UpstreamBody};
use crate::cache::{Bypass, CacheAnswer, CacheBody, Outcome};
use crate::range::{Continuable, body_range};
use crate::routes::Route;
use crate::routes::UpstreamResume;
use crate::routes::origin_client::Exchange;

/// source's record of the upstream, for the steps after it and for `record`.
#[derive(Debug, Default)]
pub(super) struct UpstreamRecord {
    /// Which replica of the route's upstream the request went to.
    pub(super) replica: usize,
    /// Replicas the request could not be sent to (see `Upstream::retry_elsewhere`).
    pub(super) connect_tries: usize,
    /// When the upstream was first asked (before connecting), and how long its answer's header
    /// took from then: the access line's `upstream_ms`.
    pub(super) asked: Option<Instant>,
    pub(super) header_took: Option<Duration>,
    pub(super) status: Option<u16>,
    /// What the slice cache did for the request, on a route that uses it (a `Hit` too when
    /// shape finds the transformed representation kept whole).
    pub(super) cache: Option<Outcome>,
}

impl UpstreamRecord {
    /// The source answered `response` for `route`: its header is in. A replica answering 5xx is
    /// as good as down: passed over for a while.
    pub(super) fn answered(&mut self, route: &Route, response: &ResponseHeader) {
        if response.status.is_server_error() {
            route.upstream.failed(self.replica);
        }
        self.status = Some(response.status.as_u16());
        self.header_took = self.asked.map(|asked| asked.elapsed());
    }
}

/// The origin's answer on `exchange`, as the client's answer starts from
/// ([`answer_to_forward`]).
pub(super) fn answer_of(exchange: &Exchange) -> Result<ResponseHeader> {
    let header = exchange.session.response_header();
    header
        .map(answer_to_forward)
        .ok_or_else(|| Error::explain(ErrorType::InvalidHTTPHeader, "no response header"))
}

/// The source's answer, before it is shaped into the client's.
pub(super) struct Sourced {
    pub(super) response: ResponseHeader,
    /// `None` for an answer without a body (a cached HEAD, 304, 412, 416).
    pub(super) body: Option<UpstreamBody>,
    /// Where the body sits in the object, when the answer says.
    pub(super) stream: Option<ByteRange>,
    /// What a broken body can be continued with: its strong ETag and length.
    pub(super) continuable: Option<Continuable>,
    /// The request continuations, other replicas and the stretches of a multipart answer are
    /// asked with (their Host and Range set): kept only where there are such to ask.
    pub(super) base: Option<RequestHeader>,
    /// How a broken body is continued; `None` on routes that do not continue bodies.
    pub(super) policy: Option<UpstreamResume>,
    /// The client's own `Authorization` goes upstream with the request (see
    /// [`client_authorized`]): with its continuations and stretches too.
    pub(super) authorized: bool,
}

impl Sourced {
    /// Its body is `kept`, a transformed representation the slice cache keeps whole for the
    /// answer (found as the answer is shaped): its bytes, not the origin's — which a cache body
    /// fetches only as it is read, so none are.
    pub(super) fn answer_with_kept(&mut self, kept: Box<CacheBody>) {
        self.body = Some(UpstreamBody::Cache(kept));
    }
}

impl Proxy {
    /// Asks the source what the plan in `ctx.identity` says: the slice cache on a route that uses
    /// one, else the origin. Every wait on either ends when the client goes (`watch`).
    pub(super) async fn source(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        route: &Arc<Route>,
        watch: &ClientWatch,
    ) -> Result<Sourced> {
        let policy = route.upstream_resume;
        let authorized = client_authorized(session, route);
        ctx.upstream.replica = route.upstream.choose();
        // The relay speaks HTTP/1.1 to origins, whatever its client speaks.
        let mut request = end_to_end(session.req_header());
        origin_request::complete(&mut request, route, ctx, client_side(session))?;
        // Not signed here: an S3 request is signed once, last, where it is sent (its
        // `traceparent` set first when it is traced), by `OriginClient::send`.
        let request = RequestHeader::from(request);
        let asks_again = policy.is_some()
            || route.upstream.replica_count() > 1
            || ctx.identity.part_gap.is_some();
        let base = asks_again.then(|| request.clone());
        ctx.upstream.asked = Some(Instant::now());
        // The kernel ways and the cache's answer are boxed futures: carried inline, their state
        // would be in every response's future, which pingora boxes and moves, also where a small
        // answer needs none of it; see docs/benchmarks.md, "Boxed futures".
        let cached = match (&self.cache, route.cache) {
            (Some(cache), Some(use_of)) => {
                let asked = (&request, authorized);
                let answer =
                    cache.answer(route, use_of, asked, &self.origin_client, ctx.upstream.replica);
                Some(watch.unless_gone(session, Box::pin(answer)).await?)
            }
            (None, Some(_)) => Some(CacheAnswer::Bypass(Bypass::Off)),
            _ => None,
        };
        let (response, body) = match cached {
            Some(CacheAnswer::Served { header, body, outcome }) => {
                ctx.upstream.cache = Some(outcome);
                (*header, body.map(UpstreamBody::Cache))
            }
            // The origin's answer to the cache's own request, read as if it were to this one's.
            Some(CacheAnswer::Origin { header, mut exchange, outcome, fill }) => {
                ctx.upstream.cache = Some(outcome);
                relay_hints(session, &mut exchange).await?;
                let body = UpstreamBody::Origin { exchange, source: BodySource::Unread, fill };
                (answer_to_forward(&header), Some(body))
            }
            bypassed => {
                if let Some(CacheAnswer::Bypass(why)) = bypassed {
                    ctx.upstream.cache = Some(Outcome::Bypass(why));
                }
                // Its span and `traceparent` when traced (in the request's span), then signed.
                let first = self.origin_client.send_failing_over(
                    &route.upstream,
                    (&mut ctx.upstream.replica, &mut ctx.upstream.connect_tries),
                    request,
                    base.as_ref(),
                );
                let mut exchange = watch.unless_gone(session, first).await??;
                relay_hints(session, &mut exchange).await?;
                let response = answer_of(&exchange)?;
                let exchange = Box::new(exchange);
                (response, Some(UpstreamBody::origin(exchange)))
            }
        };
        ctx.upstream.answered(route, &response);
        let stream = body_range(response.status.as_u16(), &response.headers);
        let continuable = stream.and_then(|stream| Continuable::of(stream, &response.headers));
        Ok(Sourced { response, body, stream, continuable, base, policy, authorized })
    }
}

/// Writes to the client the `103 Early Hints` the origin sent before its answer, each as it
/// leaves this hop (its connection's fields dropped): the answer to the client's request, or
/// to the cache's when that is the client's too. Never stored: the cache keeps final answers.
pub(super) async fn relay_hints(
    session: &mut impl ClientSession,
    exchange: &mut Exchange,
) -> Result<()> {
    for mut hints in exchange.take_hints() {
        forwarded(&mut hints)?;
        session.write_interim(Box::new(hints)).await?;
    }
    Ok(())
}

/// Whether the client's own `Authorization` goes upstream with its request: not to an S3
/// upstream, where rangeway signs with its own keys.
fn client_authorized(session: &impl ClientSession, route: &Route) -> bool {
    session.req_header().headers.contains_key(header::AUTHORIZATION) && !route.upstream.is_s3()
}
