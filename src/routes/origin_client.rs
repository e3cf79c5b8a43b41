//! Requests rangeway makes to an origin itself: the rest of an object for a completion pass, the
//! length of an object whose origin would not say it, whole responses on routes that continue a
//! body its origin broke off (`relay`).

use http::header;
use pingora_core::connectors::TransportConnector;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::protocols::http::v1::client::HttpSession as Http1Session;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_error::Result;
use pingora_http::RequestHeader;

use super::upstream::Upstream;

/// A connection pool of rangeway's own, apart from the proxy's. HTTP/1 only, as rangeway's
/// upstreams are; the pool holds connections rather than sessions, so that one whose body was
/// spliced past pingora's reader can go back to it.
pub(crate) struct OriginClient {
    transport: TransportConnector,
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
}

impl Exchange {
    /// How long the connection may be silent, as configured for its upstream.
    pub(crate) fn read_timeout(&self) -> Option<std::time::Duration> {
        self.peer.options.read_timeout
    }
}

impl OriginClient {
    pub(crate) fn new() -> Self {
        Self { transport: TransportConnector::new(None) }
    }

    /// Sends `request` (made by [`Upstream::request`] for `replica`) to that replica of
    /// `upstream`, signed when it is an S3 upstream, and reads the answer's header.
    pub(crate) async fn send(
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
    pub(crate) async fn exchange(
        &self,
        upstream: &Upstream,
        replica: usize,
        request: RequestHeader,
    ) -> Result<Exchange> {
        let exchanged = async {
            let peer = upstream.peer(replica).await?;
            let (stream, _) = self.transport.get_stream(peer.as_ref()).await?;
            let mut session =
                HttpSession::H1(Http1Session::new_with_options(stream, peer.as_ref()));
            session.write_request_header(Box::new(request)).await?;
            session.finish_request_body().await?;
            // Interim answers (100, 102, 103 Early Hints) come before the final one: they are
            // not the answer (RFC 9110 §15.2), and rangeway, which sent no Expect and answers
            // with the final response only, drops them.
            loop {
                session.read_response_header().await?;
                let status = session.response_header().map(|r| r.status.as_u16());
                if !matches!(status, Some(100..=199)) || status == Some(101) {
                    break;
                }
            }
            Ok(Exchange { session, peer })
        };
        let exchanged: Result<Exchange> = exchanged.await;
        if exchanged.is_err() {
            upstream.failed(replica);
        }
        exchanged
    }

    /// Returns the connection of an exchange whose body was read to its end to the pool, when
    /// the origin keeps it open.
    pub(crate) async fn release(&self, exchange: Exchange) {
        let Exchange { session: HttpSession::H1(mut session), peer } = exchange else { return };
        session.respect_keepalive();
        if let Some(stream) = session.reuse().await {
            self.transport.release_stream(stream, peer.reuse_hash(), peer.options.idle_timeout);
        }
    }

    /// Returns the connection of an exchange whose body was read to its end past pingora's
    /// reader (spliced, or read from the socket by rangeway: pingora saw only its first bytes)
    /// to the pool, when the origin keeps it open.
    pub(crate) fn release_read_past(&self, exchange: Exchange) {
        let Exchange { session: HttpSession::H1(mut session), peer } = exchange else { return };
        session.respect_keepalive();
        if session.will_keepalive() {
            let stream = session.into_inner();
            self.transport.release_stream(stream, peer.reuse_hash(), peer.options.idle_timeout);
        }
    }

    /// The length of the object at `target` (path and query), by a HEAD: `None` when the origin
    /// does not answer 200 with a Content-Length.
    pub(crate) async fn length(&self, upstream: &Upstream, target: &str) -> Result<Option<u64>> {
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
