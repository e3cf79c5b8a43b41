//! The proxy as pingora's HTTP application. pingora's listeners hand it each request of a
//! connection — HTTP/1.1 one after another, or each stream of HTTP/2 — and it reads the header
//! and takes the request the pipeline's way: `Proxy::answer`, `Proxy::answer_failure` when that
//! fails, `Proxy::record`; then it gives a connection that can take another request back.
//!
//! pingora's own proxy application (`pingora-proxy`) is not used: rangeway answers every request
//! itself, and that application's phases, cache and upstream proxying, none of which ran, still
//! made each request's future many kilobytes that pingora boxes (a copy of the whole) per
//! request; see docs/benchmarks.md, "Rangeway's own HTTP application".

use std::sync::Arc;

use async_trait::async_trait;
use http::Method;
use pingora_core::apps::{
    HttpPersistentSettings, HttpServerApp, HttpServerOptions, ReusedHttpStream,
};
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::http::v2::server::H2Options;
use pingora_core::server::ShutdownWatch;
use pingora_error::ErrorType;
use tracing::debug;

use super::Proxy;
use super::client_session::{AltSvc, answer_pipelined};
use super::context::RequestCtx;

/// The proxy behind pingora's TCP listeners (plain and TLS), with the HTTP options they take.
#[derive(Debug)]
pub struct ProxyApp {
    proxy: Proxy,
    h2_options: H2Options,
    server_options: HttpServerOptions,
}

impl ProxyApp {
    pub fn new(proxy: Proxy, h2_options: H2Options, server_options: HttpServerOptions) -> Self {
        Self { proxy, h2_options, server_options }
    }

    /// Reads `session`'s request header: false when there is none to answer — the connection
    /// closed or broke, its header was refused (400, or 405 for CONNECT, whose tunnel rangeway
    /// does not make and whose framing it would misread), or the server is stopping (a
    /// kept-alive connection waiting for its next request then closes).
    async fn read_request(session: &mut ServerSession, shutdown: &ShutdownWatch) -> bool {
        // pingora's watch, whose waits tokio spreads over several locks: connections waiting on
        // every thread do not all take one.
        let mut stopping = shutdown.clone();
        let read = tokio::select! {
            // A request already read is answered, stopping or not.
            biased;
            read = session.read_request() => read,
            _ = stopping.wait_for(|stopping| *stopping) => return false,
        };
        let refusal = match read {
            Ok(true) if session.req_header().method == Method::CONNECT => Some(405),
            Ok(true) => return true,
            Ok(false) => return false,
            Err(e) if *e.etype() == ErrorType::InvalidHTTPHeader => Some(400),
            Err(e) => {
                // A connection cut or timed out: the admission counts its cause.
                debug!(error = %e, "no request read");
                None
            }
        };
        if let Some(status) = refusal
            && let Err(e) = session.respond_error(status).await
        {
            debug!(error = %e, status, "the refusal could not be written");
        }
        session.shutdown().await;
        false
    }
}

#[async_trait]
impl HttpServerApp for ProxyApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if !Self::read_request(&mut session, shutdown).await {
            return None;
        }
        if *shutdown.borrow() {
            // Stopping soon: this connection takes no other request.
            session.set_keepalive(None);
        }
        answer_pipelined(&mut session);
        // Boxed: every step's state is in the request's future, which pingora boxes, and the
        // context is a large part of what they share.
        let mut ctx = Box::<RequestCtx>::default();
        let client = &mut AltSvc::new(&mut session, self.proxy.alt_svc.as_ref());
        let failed = self.proxy.answer(client, &mut ctx).await.err();
        let reusable = match &failed {
            Some(e) => self.proxy.answer_failure(client, e, &ctx).await,
            None => true,
        };
        self.proxy.record(&session, failed.as_deref(), &mut ctx).await;
        if !reusable {
            return None;
        }
        let settings = HttpPersistentSettings::for_session(&session);
        let reused = session.finish().await.ok().flatten()?;
        Some(ReusedHttpStream::from_reusable_stream(reused, settings))
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        Some(&self.server_options)
    }

    fn h2_options(&self) -> Option<H2Options> {
        Some(self.h2_options.clone())
    }
}
