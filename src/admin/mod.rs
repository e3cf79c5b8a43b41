//! The admin listener: health, readiness and metrics, never on the public port.

pub mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Response, StatusCode, header};
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;

use metrics::Metrics;

/// How long `/readyz` waits for the proxy listener to accept a connection.
const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct Admin {
    metrics: Arc<Metrics>,
    /// The public listener, probed by `/readyz`.
    proxy_addr: SocketAddr,
}

impl Admin {
    pub fn new(metrics: Arc<Metrics>, proxy_addr: SocketAddr) -> Self {
        Self { metrics, proxy_addr }
    }

    async fn proxy_accepts(&self) -> bool {
        matches!(
            tokio::time::timeout(
                READY_PROBE_TIMEOUT,
                tokio::net::TcpStream::connect(self.proxy_addr)
            )
            .await,
            Ok(Ok(_))
        )
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        if req.method != http::Method::GET && req.method != http::Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n");
        }
        match req.uri.path() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => {
                if self.proxy_accepts().await {
                    text(StatusCode::OK, "ready\n")
                } else {
                    text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the proxy listener does not accept connections\n",
                    )
                }
            }
            "/metrics" => {
                let body = self.metrics.render();
                Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
                    .header(header::CONTENT_LENGTH, body.len())
                    .body(body)
                    .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "\n"))
            }
            _ => text(StatusCode::NOT_FOUND, "not found: try /healthz, /readyz or /metrics\n"),
        }
    }
}

fn text(status: StatusCode, body: &str) -> Response<Vec<u8>> {
    let mut response = Response::new(body.as_bytes().to_vec());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
    headers.insert(header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
    response
}
