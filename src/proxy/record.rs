//! The record step of the pipeline, after the response: the store, the stages' learning, the
//! completion pass, metrics, the trace and the access line.

use std::sync::Arc;
use std::time::Duration;

use http::header;
use pingora_error::{Error, ErrorSource};
use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::Chain;
use tracing::Instrument as _;
use tracing::{info, warn};

use super::Proxy;
use super::answer::{error_kind, is_client_abort};
use super::client_session::ClientSession;
use super::completion::Unfinished;
use super::context::RequestCtx;
use super::traced::{StoreCall, store_span};
use super::transport::Transport;
use crate::cache::Outcome;
use crate::client_address::Client;
use crate::links;
use crate::state::DownloadSession;
use crate::traces;

impl Proxy {
    /// The response's end: what it delivered recorded in the store, what its stages learned kept,
    /// a completion pass started if its pieces left a digest unfinished, its metrics counted, its
    /// trace ended and its access line written.
    pub(super) async fn record(
        &self,
        session: &impl ClientSession,
        e: Option<&Error>,
        ctx: &mut RequestCtx,
    ) {
        session.response_ended();
        // What reached the client's connection, not what the body filter handed on.
        let sent = session.body_bytes_sent();
        let mut completed = None;
        let delivery = if sent > 0 { ctx.identity.take_delivery(sent, e.is_none()) } else { None };
        if let Some(delivery) = delivery {
            // A store outage is reported by the store's health, once; the response is done.
            let complete = |s: &DownloadSession| {
                s.of_version(&delivery.version).is_some_and(|sent| sent.is_complete())
            };
            let was_complete = ctx
                .identity
                .download
                .as_ref()
                .and_then(|d| d.session.as_ref())
                .is_some_and(complete);
            // Completed by pieces: one response of the whole version showed the stages all of it.
            let span = store_span(ctx.trace.as_ref(), StoreCall::Record);
            if let Ok(session) = self.store.record(&delivery).instrument(span).await
                && complete(&session)
                && !was_complete
                && delivery.range != ByteRange::whole(delivery.version.size)
            {
                completed = Some(delivery.origin_version);
            }
        }
        // Recorded: the admin API shows the store's record of the response from now on.
        ctx.answer.live = None;
        if let (Some(pass), Some(route), Some(download)) =
            (&ctx.answer.pass, &ctx.identity.route, &ctx.identity.download)
        {
            // A store outage is reported by the store's health; what was learned is learned again.
            let _ = pass.record(self.store.as_ref(), &route.stage_keys, &download.object).await;
            if let Some(key) =
                ctx.delivery.forget_stage.and_then(|index| route.stage_keys.get(index))
            {
                let _ = self.store.forget(&download.object, key).await;
            }
        }
        // A download just completed on a route whose stages only observe: if its pieces left a
        // digest unfinished, finish it from the origin (see completion.rs).
        if let (Some(version), Some(route), Some(download)) =
            (completed, &ctx.identity.route, &ctx.identity.download)
            && ctx.identity.chain().is_some_and(Chain::is_observing_only)
            && route.chain.stages().iter().any(|stage| stage.whole_digests() > 0)
        {
            let unfinished = Unfinished {
                route: Arc::clone(route),
                object: download.object.clone(),
                path: ctx.identity.object_path.clone(),
                target: ctx.identity.upstream_target.clone(),
                version,
            };
            // Its requests to the origin are this response's: in its trace.
            let _within = ctx.trace.as_ref().map(|trace| trace.span.enter());
            self.completions.start(Arc::clone(&self.store), unfinished);
        }
        self.log_access(session, e, ctx);
        // The request's spans end with its access line.
        ctx.trace = None;
    }

    /// The response counted in the metrics, its trace's span given its fields and ended, and
    /// its access line written.
    fn log_access(&self, session: &impl ClientSession, e: Option<&Error>, ctx: &RequestCtx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let sent = session.body_bytes_sent();
        let route = ctx.identity.route_name();
        let elapsed = ctx.started.elapsed();
        let transport = ctx.delivery.transport_taken(ctx.identity.route.is_some()).name();
        let cache = ctx.upstream.cache.map(Outcome::name);
        self.count(ctx, (status, sent, elapsed), transport, cache);
        let req = session.req_header();
        let asked = req.headers.get(header::RANGE).and_then(|v| v.to_str().ok()).unwrap_or("-");
        let upstream_ms = ctx.upstream.header_took.map(|d| d.as_secs_f64() * 1000.0);
        // Formatted only when the line is written (tracing evaluates fields of enabled events).
        let logged_client = LoggedClient::of(ctx.client, session.peer());
        let client = logged_client.as_ref().map(tracing::field::display);
        let forwarded_by =
            ctx.client.and_then(|client| client.forwarded_by).map(tracing::field::display);
        // The target as the client wrote it in HTTP/1 (HTTP/2 has the authority in the URI).
        // A signed link's signature shortened: the log must not hold a usable link.
        let path = links::redacted(req.uri.path_and_query().map_or("/", |p| p.as_str()));
        let version = tracing::field::debug(session.version());
        let trace_id = ctx.trace.as_ref().and_then(|trace| {
            let span = &trace.span;
            span.record("http.request.method", req.method.as_str());
            span.record("url.path", tracing::field::display(path));
            span.record("network.protocol.version", tracing::field::debug(session.version()));
            span.record("rangeway.route", route);
            if let Some(download) = &ctx.identity.download {
                span.record("rangeway.download_id", download.id.as_str());
            }
            span.record("rangeway.range_asked", asked);
            span.record("rangeway.range_served", &*ctx.answer.served_range);
            span.record("rangeway.transport", transport);
            span.record("rangeway.cache", cache);
            span.record("http.response.status_code", traces::int(status));
            span.record("http.response.body.size", traces::int(sent));
            if let Some(client) = &logged_client {
                span.record("client.address", tracing::field::display(client));
            }
            if e.is_some() || status >= 500 {
                span.record("otel.status_code", "ERROR");
            }
            traces::finish(span, &format!("{} {route}", req.method))
        });
        match e {
            None => info!(
                target: "rangeway::access",
                route, method = %req.method, path = %path, version, status,
                range_asked = asked, range_served = %ctx.answer.served_range, bytes = sent,
                upstream_status = ctx.upstream.status, upstream_ms, total_ms = elapsed.as_secs_f64() * 1000.0,
                transport, cache, client, forwarded_by, refused = ctx.refusal, trace_id,
            ),
            Some(e) if is_client_abort(e) => info!(
                target: "rangeway::access",
                route, method = %req.method, path = %path, version, status,
                range_asked = asked, range_served = %ctx.answer.served_range, bytes = sent,
                total_ms = elapsed.as_secs_f64() * 1000.0, transport, cache, client, forwarded_by, trace_id,
                "client went away before the end of the response"
            ),
            Some(e) => {
                if *e.esource() == ErrorSource::Upstream {
                    self.metrics.upstream_error(route, error_kind(e));
                }
                warn!(
                    target: "rangeway::access",
                    route, method = %req.method, path = %path, version, status,
                    range_asked = asked, range_served = %ctx.answer.served_range, bytes = sent,
                    upstream_status = ctx.upstream.status, total_ms = elapsed.as_secs_f64() * 1000.0,
                    transport, cache, client, forwarded_by, trace_id, error = %e,
                )
            }
        }
    }

    /// The response counted in the metrics: its status, body bytes and time, the way it took,
    /// what the cache did, what was spliced and paced.
    fn count(
        &self,
        ctx: &RequestCtx,
        (status, sent, elapsed): (u16, u64, Duration),
        transport: &'static str,
        cache: Option<&'static str>,
    ) {
        let route = ctx.identity.route_name();
        self.metrics.request(route, status, sent, elapsed, transport);
        if ctx.delivery.spliced > 0 && ctx.delivery.transport == Some(Transport::Splice) {
            self.metrics.spliced(route, ctx.delivery.spliced);
        }
        if let Some(outcome) = cache {
            self.metrics.cache_request(route, outcome);
        }
        if let Some(pacer) = &ctx.delivery.pacer {
            self.metrics.shaped(route, pacer.shaped, pacer.waited);
        }
    }
}

/// The access line's `client`: the connection's peer and port (the PROXY protocol's source when
/// a balancer sent one), or the address alone when a trusted proxy's `X-Forwarded-For` named it.
enum LoggedClient<'a> {
    Peer(&'a pingora_core::protocols::l4::socket::SocketAddr),
    Forwarded(std::net::IpAddr),
}

impl<'a> LoggedClient<'a> {
    fn of(
        client: Option<Client>,
        peer: Option<&'a pingora_core::protocols::l4::socket::SocketAddr>,
    ) -> Option<Self> {
        match client {
            Some(Client { ip, forwarded_by: Some(_) }) => Some(Self::Forwarded(ip)),
            _ => peer.map(Self::Peer),
        }
    }
}

impl std::fmt::Display for LoggedClient<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer(peer) => peer.fmt(f),
            Self::Forwarded(ip) => ip.fmt(f),
        }
    }
}
