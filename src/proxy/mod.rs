//! The proxy: rangeway's request pipeline, and the HTTP application pingora's listeners run it
//! as (app.rs).
//!
//! pingora reads the request header and hands the session — to the steps a `ClientSession`
//! (client_session/), their one view of the client, which another listener can implement — to
//! [`Proxy::answer`], the one function a request's way through rangeway is read in: admit
//! (admit.rs: client limits, HTTP's rules, the path, the route, S3 client keys and signed links)
//! → identify (identify.rs: what to ask the source, the download and what the store knows of it,
//! the resume decision) → source (source.rs, source_body.rs: the slice cache or the origin, a
//! broken body continued) → shape (shape.rs, shaping.rs: the RFC 9110 answer; a transformed
//! representation the cache keeps becomes the source's body) → deliver (deliver/: the body's way
//! chosen once, transport.rs; each chunk through the stages and cut, transform.rs; the body
//! written, spliced or sent from the cache's files) → record (record.rs: the store, the metrics,
//! the trace, the access line). A method other than GET and
//! HEAD that its route lets through takes the pass-through way after admit (pass_through.rs:
//! its body streamed to the origin, the answer delivered). pingora's own proxying never runs.
//! Each way an answer can take is followed step by step in `LIFECYCLE.md` beside this file;
//! `docs/architecture.md` has the whole.

mod admit;
mod answer;
mod app;
mod client_session;
mod completion;
mod context;
mod deliver;
pub mod download;
mod grace;
mod hop_by_hop;
mod identify;
mod negotiation;
mod origin_digest;
mod origin_request;
mod pace;
mod pass_through;
#[cfg(test)]
mod pipeline_tests;
mod plan;
mod record;
mod s3;
mod shape;
mod shaping;
mod source;
mod source_body;
mod splice;
mod traced;
mod transform;
mod transport;
mod under_way;

use std::sync::Arc;

use http::Method;
use pingora_error::Result;
use rangeway_middleware::rfc9110::RangeLimits;
use tracing::Instrument as _;

use crate::admission::ClientLimits;
use crate::cache::SliceCache;
use crate::fingerprint::FingerprintKey;
use crate::h3_transport::{Acknowledged, StreamHandle};
use crate::ip_net::IpNet;
use crate::routes::RouteSwitch;
use crate::routes::origin_client::OriginClient;
use crate::state::StateStore;
use crate::telemetry::live::LiveResponses;
use crate::telemetry::metrics::Metrics;
use crate::traces::Traces;
use client_session::H3Session;
use client_session::{ClientSession, ClientWatch};
pub(crate) use client_session::{H3Client, H3Stream};
use completion::Completions;
use context::RequestCtx;
use traced::{RequestTrace, request_span};

pub use app::ProxyApp;

/// The proxy, built once from config and shared by every request. A clone shares all it keeps
/// (its tables and counts are behind `Arc`s): pingora's listeners answer through one, the
/// HTTP/3 listener through another, and a client's downloads count across both.
#[derive(Debug, Clone)]
pub struct Proxy {
    routes: Arc<RouteSwitch>,
    range_limits: RangeLimits,
    metrics: Arc<Metrics>,
    store: Arc<dyn StateStore>,
    completions: Arc<Completions>,
    origin_client: Arc<OriginClient>,
    live: Arc<LiveResponses>,
    client_limits: ClientLimits,
    /// Derived download ids are keyed with it.
    id_key: FingerprintKey,
    /// The slice cache, when one is configured and open.
    cache: Option<Arc<SliceCache>>,
    /// The downloads under way, for routes with concurrent-download limits.
    under_way: Arc<under_way::UnderWay>,
    /// The rates shaped responses share (per client, per route).
    rates: Arc<pace::SharedRates>,
    /// Which requests are traced, when traces are on.
    traces: Option<Traces>,
    /// `server.trusted_proxies`: peers whose `X-Forwarded-For` names the client.
    trusted_proxies: Vec<IpNet>,
    /// `Alt-Svc` for the answers over TLS while HTTP/3 is on.
    alt_svc: Option<http::HeaderValue>,
}

impl Proxy {
    pub fn new(
        routes: Arc<RouteSwitch>,
        range_limits: RangeLimits,
        metrics: Arc<Metrics>,
        store: Arc<dyn StateStore>,
        live: Arc<LiveResponses>,
        client_limits: ClientLimits,
        id_key: FingerprintKey,
    ) -> Self {
        let origin_client = Arc::new(OriginClient::new());
        let completions = Arc::new(Completions::new(Arc::clone(&origin_client)));
        let under_way = Arc::new(under_way::UnderWay::new(Some(Arc::clone(&store))));
        Self {
            routes,
            range_limits,
            metrics,
            store,
            completions,
            origin_client,
            live,
            client_limits,
            id_key,
            cache: None,
            under_way,
            rates: Arc::default(),
            traces: None,
            trusted_proxies: Vec::new(),
            alt_svc: None,
        }
    }

    /// The proxy, advertising HTTP/3 with `alt_svc` on its answers over TLS (TCP).
    pub(crate) fn with_alt_svc(mut self, alt_svc: Option<http::HeaderValue>) -> Self {
        self.alt_svc = alt_svc;
        self
    }

    /// The proxy, believing the `X-Forwarded-For` of peers in `trusted` (`server.trusted_proxies`).
    pub(crate) fn with_trusted_proxies(mut self, trusted: Vec<IpNet>) -> Self {
        self.trusted_proxies = trusted;
        self
    }

    /// The proxy, tracing requests as `traces` says (`None`: traces are off).
    pub(crate) fn with_traces(mut self, traces: Option<Traces>) -> Self {
        self.traces = traces;
        self
    }

    /// The proxy, with the slice cache its routes use.
    pub(crate) fn with_cache(mut self, cache: Option<Arc<SliceCache>>) -> Self {
        self.cache = cache;
        self
    }

    /// The proxy, asking origins through `client` (its completion passes too).
    #[cfg(test)]
    pub(crate) fn with_origin_client(mut self, client: OriginClient) -> Self {
        self.origin_client = Arc::new(client);
        self.completions = Arc::new(Completions::new(Arc::clone(&self.origin_client)));
        self
    }
}

impl Proxy {
    /// Answers the request: its way through the pipeline's steps. Every step but the last may
    /// answer it itself (a refusal, an error), and the rest is skipped; `record` follows in any
    /// case (`ProxyApp`, `answer_h3`).
    async fn answer(&self, session: &mut impl ClientSession, ctx: &mut RequestCtx) -> Result<()> {
        if let Some(traces) = &self.traces {
            ctx.trace = traces.start(&session.req_header().headers).map(RequestTrace::new);
        }
        let Some(admitted) = self.admit(session, ctx).await? else { return Ok(()) };
        if !matches!(session.req_header().method, Method::GET | Method::HEAD) {
            // A method its route lets through: the steps below answer GET and HEAD only.
            let span = request_span(ctx.trace.as_ref());
            return Box::pin(self.pass_through(session, ctx, admitted)).instrument(span).await;
        }
        let Some(route) = self.identify(session, ctx, admitted).await? else { return Ok(()) };
        let span = request_span(ctx.trace.as_ref());
        async move {
            let watch = ClientWatch::of(session);
            let mut sourced = self.source(session, ctx, &route, &watch).await?;
            if let Some(kept) = self.shape(session, &mut sourced.response, ctx, &watch).await? {
                sourced.answer_with_kept(kept);
            }
            self.deliver(session, ctx, &route, sourced, &watch).await
        }
        .instrument(span)
        .await
    }
}

impl Proxy {
    /// Answers an HTTP/3 request, as pingora's adapter below does an HTTP/1 or HTTP/2 one:
    /// `answer`, `answer_failure` when it fails, then `record`. The stream is finished when its
    /// response is whole, reset otherwise; `handle` is what the transport keeps of the stream,
    /// whose `stopped()` is given back for the caller to wait for the response's
    /// acknowledgement.
    pub(crate) async fn answer_h3(
        &self,
        request: http::Request<()>,
        stream: H3Stream,
        client: &H3Client,
        handle: Option<StreamHandle>,
    ) -> Option<Acknowledged> {
        let mut session = H3Session::new(request, stream, client, handle);
        let mut ctx = RequestCtx::default();
        let answered = match session.too_early(client) {
            // RFC 8470 §5.2: the client sends it again once the handshake is done.
            true => {
                let problem = "rangeway: sent in early data; send it again\n";
                answer::respond(&mut session, http::StatusCode::TOO_EARLY, problem, &[]).await
            }
            false => self.answer(&mut session, &mut ctx).await,
        };
        let whole = match &answered {
            Ok(()) => true,
            Err(e) => self.answer_failure(&mut session, e, &ctx).await,
        };
        session.end(whole).await;
        self.record(&session, answered.err().as_deref(), &mut ctx).await;
        session.acknowledged()
    }
}
