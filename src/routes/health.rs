//! Active health checks of upstreams that ask for them (`[upstreams.NAME.health_check]`).
//!
//! Every replica of such an upstream is asked `GET path` every `interval`; one that does not
//! answer 2xx or 3xx within `timeout` gets no requests until a check passes again (unless every
//! replica is down: then they all still get requests, as nothing better exists). Requests that
//! fail mark a replica down for a while without waiting for a check (see `Upstream::failed`).
//! The checks follow reloads: each round looks at the route table in force.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use tracing::{info, warn};

use super::RouteSwitch;
use super::origin_client::OriginClient;
use super::upstream::Upstream;

/// How often the checker looks for checks that are due.
const TICK: Duration = Duration::from_millis(100);

/// The background service running the checks.
pub struct HealthChecks {
    routes: Arc<RouteSwitch>,
    client: OriginClient,
}

impl HealthChecks {
    pub fn new(routes: Arc<RouteSwitch>) -> Self {
        Self { routes, client: OriginClient::new() }
    }

    /// Checks every replica of `upstream` once, at the same time.
    async fn check(&self, upstream: &Upstream) {
        let Some(check) = upstream.health_check() else {
            return;
        };
        let probes = (0..upstream.replica_count()).map(|replica| async move {
            let probe = async {
                let request = upstream.request("GET", &check.path, replica)?;
                let exchange = self.client.send(upstream, replica, request, "health").await?;
                Ok::<_, Box<pingora_error::Error>>(
                    exchange.session.response_header().map(|r| r.status.as_u16()),
                )
            };
            let status = match tokio::time::timeout(check.timeout, probe).await {
                Ok(Ok(status)) => status,
                Ok(Err(_)) | Err(_) => None,
            };
            let healthy = status.is_some_and(|s| (200..400).contains(&s));
            let was_up = upstream.is_up(replica);
            upstream.checked(replica, healthy);
            match (was_up, healthy) {
                (true, false) => {
                    warn!(
                        upstream = upstream.name(),
                        replica,
                        ?status,
                        "a replica failed its health check: no requests until it passes"
                    )
                }
                (false, true) => {
                    info!(
                        upstream = upstream.name(),
                        replica, "a replica passed its health check: back in rotation"
                    )
                }
                _ => {}
            }
        });
        join_all(probes).await;
    }
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                () = tokio::time::sleep(TICK) => {}
            }
            let table = self.routes.current();
            let mut due: Vec<&Arc<Upstream>> = Vec::new();
            for route in table.iter() {
                let upstream = &route.upstream;
                if !due.iter().any(|u| Arc::ptr_eq(u, upstream)) && upstream.health_check_due() {
                    due.push(upstream);
                }
            }
            join_all(due.into_iter().map(|upstream| self.check(upstream))).await;
        }
    }
}
