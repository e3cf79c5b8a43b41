//! Requests rangeway makes to an origin itself: the rest of an object for a completion pass, the
//! length of an object whose origin would not say it, whole responses on routes that continue a
//! body its origin broke off (`relay`).

use http::header;
use pingora_core::connectors::http::Connector;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_http::RequestHeader;

use super::upstream::Upstream;

/// A connection pool of rangeway's own, apart from the proxy's.
pub(super) struct OriginClient {
    connector: Connector,
}

impl std::fmt::Debug for OriginClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginClient").finish_non_exhaustive()
    }
}

/// One request and the connection it went on.
pub(super) struct Exchange {
    pub(super) session: HttpSession,
    peer: Box<HttpPeer>,
}

impl Exchange {
    /// How long the connection may be silent, as configured for its upstream.
    pub(super) fn read_timeout(&self) -> Option<std::time::Duration> {
        self.peer.options.read_timeout
    }
}

impl OriginClient {
    pub(super) fn new() -> Self {
        Self { connector: Connector::new(None) }
    }

    /// Sends `request` (made by [`Upstream::request`] for `replica`) to that replica of
    /// `upstream`, signed when it is an S3 upstream, and reads the answer's header.
    pub(super) async fn send(
        &self,
        upstream: &Upstream,
        replica: usize,
        mut request: RequestHeader,
    ) -> Result<Exchange> {
        upstream.authorize(&mut request)?;
        self.exchange(upstream, replica, request).await
    }

    /// Sends `request` as it is (already authorized) and reads the answer's header. A replica
    /// that cannot be reached is passed over for a while (one that answers 5xx is, by whoever
    /// reads the answer).
    pub(super) async fn exchange(
        &self,
        upstream: &Upstream,
        replica: usize,
        request: RequestHeader,
    ) -> Result<Exchange> {
        let exchanged = async {
            let peer = upstream.peer(replica).await?;
            let (mut session, _) = self.connector.get_http_session(peer.as_ref()).await?;
            session.write_request_header(Box::new(request)).await?;
            session.finish_request_body().await?;
            session.read_response_header().await?;
            Ok(Exchange { session, peer })
        };
        let exchanged: Result<Exchange> = exchanged.await;
        if exchanged.is_err() {
            upstream.failed(replica);
        }
        exchanged
    }

    /// Returns the connection of an exchange whose body was read to its end to the pool.
    pub(super) async fn release(&self, exchange: Exchange) {
        let idle = exchange.peer.options.idle_timeout;
        self.connector.release_http_session(exchange.session, exchange.peer.as_ref(), idle).await;
    }

    /// The length of the object at `target` (path and query), by a HEAD: `None` when the origin
    /// does not answer 200 with a Content-Length.
    pub(super) async fn length(&self, upstream: &Upstream, target: &str) -> Result<Option<u64>> {
        let replica = upstream.choose();
        let request = upstream.request("HEAD", target, replica)?;
        let exchange = self.send(upstream, replica, request).await?;
        let length = exchange
            .session
            .response_header()
            .filter(|r| r.status.as_u16() == 200)
            .and_then(|r| r.headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok());
        self.release(exchange).await;
        Ok(length)
    }
}
