//! HTTP/3 for `rangeway get`: asked for (`--http3`), or once a server advertises it (`Alt-Svc:
//! h3=...`). Each of a download's connections is a QUIC connection of its own (quinn, with the
//! same rustls and roots as TLS over TCP, ALPN `h3`), behind the blocking calls HTTP/1.1's
//! connection has — `send`, `read_body`, `reusable` — so that the download's threads, pieces and
//! checks are the same whatever carries them. quinn and h3 are async: each connection drives
//! them on a runtime of its own, one thread, which keeps acknowledging and receiving while the
//! download's thread writes what came.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use h3::client::{RequestStream, SendRequest};

use crate::http1::{Head, Request};
use crate::url::Target;

type Stream = RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

/// The most a QUIC handshake is given, whatever `--timeout` says.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// One QUIC connection to an origin, one exchange at a time.
pub(crate) struct Connection {
    sender: SendRequest<h3_quinn::OpenStreams, Bytes>,
    driver: tokio::task::JoinHandle<()>,
    /// The exchange under way, while its body has not been read to its end.
    stream: Option<Stream>,
    /// Body bytes received and not yet read.
    pending: Bytes,
    timeout: Duration,
    /// The connection failed: it is not used again.
    broken: bool,
    /// Kept for the connection's life: dropping it would close the connection's socket.
    _endpoint: quinn::Endpoint,
    /// Last, so that it outlives what runs on it.
    runtime: tokio::runtime::Runtime,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl Connection {
    /// A QUIC connection to `target`'s host on `port` (the origin's, or the one its Alt-Svc
    /// named), TLS with `tls` (which offers `h3`); `timeout` for the handshake and each read.
    pub(crate) fn connect(
        tls: &Arc<rustls::ClientConfig>,
        target: &Target,
        port: u16,
        timeout: Duration,
    ) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rangeway-get-h3")
            .enable_all()
            .build()?;
        let crypto = Arc::new(
            quinn::crypto::rustls::QuicClientConfig::try_from(Arc::clone(tls)).map_err(other)?,
        );
        // Each address in turn, as over TCP. A path that drops UDP says nothing (no reset, no
        // refusal): a handshake is given a few seconds, so that a download falls back to TCP
        // soon where HTTP/3 was only advertised.
        let handshake = timeout.min(HANDSHAKE_TIMEOUT);
        let mut last = None;
        for addr in (target.bare_host(), port).to_socket_addrs()? {
            let local = match addr {
                SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
                SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
            };
            let crypto = Arc::clone(&crypto);
            let attempt = runtime.block_on(async {
                let mut endpoint = quinn::Endpoint::client(local)?;
                endpoint.set_default_client_config(quinn::ClientConfig::new(crypto));
                let connecting = endpoint.connect(addr, target.bare_host()).map_err(other)?;
                let connected = tokio::time::timeout(handshake, connecting)
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the QUIC handshake"))?
                    .map_err(other)?;
                io::Result::Ok((endpoint, connected))
            });
            match attempt {
                Ok(connected) => {
                    last = Some(Ok(connected));
                    break;
                }
                Err(e) => last = Some(Err(e)),
            }
        }
        let (endpoint, connected) = last
            .unwrap_or_else(|| Err(other(format!("{} resolves to no address", target.host()))))?;
        let (mut driver, sender) = runtime
            .block_on(h3::client::new(h3_quinn::Connection::new(connected)))
            .map_err(other)?;
        let driver = runtime.spawn(async move {
            // Its end is the connection's: the next exchange finds out.
            let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
        });
        Ok(Self {
            sender,
            driver,
            stream: None,
            pending: Bytes::new(),
            timeout,
            broken: false,
            _endpoint: endpoint,
            runtime,
        })
    }

    /// Sends `request` (no body: `rangeway get` sends GET and HEAD) and reads its response's
    /// head.
    pub(crate) fn send(&mut self, request: &Request<'_>) -> io::Result<Head> {
        let target = request.target;
        let uri = format!("https://{}{}", target.authority(), target.path());
        let mut built = http::Request::builder().method(request.method).uri(uri);
        for (name, value) in request.headers {
            built = built.header(name.as_str(), value.as_str());
        }
        let built = built.body(()).map_err(other)?;
        self.stream = None;
        self.pending = Bytes::new();
        let (sender, timeout) = (&mut self.sender, self.timeout);
        let exchanged = self.runtime.block_on(async {
            let mut stream = sender.send_request(built).await.map_err(other)?;
            stream.finish().await.map_err(other)?;
            let response = tokio::time::timeout(timeout, stream.recv_response())
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the response's head"))?
                .map_err(other)?;
            io::Result::Ok((stream, response))
        });
        let (stream, response) = exchanged.inspect_err(|_| self.broken = true)?;
        let fields = response.headers().iter().map(|(name, value)| {
            (name.as_str(), String::from_utf8_lossy(value.as_bytes()).into_owned())
        });
        let head = Head::from_fields(response.status().as_u16(), fields);
        if request.method != "HEAD" {
            self.stream = Some(stream);
        }
        Ok(head)
    }

    /// Reads body bytes into `buf`: 0 at the body's end. A stream reset before its end is an
    /// error, never a clean end.
    pub(crate) fn read_body(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pending.is_empty() {
            let Some(stream) = self.stream.as_mut() else { return Ok(0) };
            let timeout = self.timeout;
            let received = self.runtime.block_on(async {
                match tokio::time::timeout(timeout, stream.recv_data()).await {
                    Ok(Ok(Some(mut chunk))) => Ok(Some(chunk.copy_to_bytes(chunk.remaining()))),
                    Ok(Ok(None)) => Ok(None),
                    Ok(Err(e)) => Err(other(e)),
                    Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "the body")),
                }
            });
            match received.inspect_err(|_| self.broken = true)? {
                Some(chunk) => self.pending = chunk,
                None => {
                    self.stream = None;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.advance(n);
        Ok(n)
    }

    /// Whether the last body was read to its end on a connection still open.
    pub(crate) fn reusable(&self) -> bool {
        !self.broken
            && self.stream.is_none()
            && self.pending.is_empty()
            && !self.driver.is_finished()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The port `Alt-Svc` names for HTTP/3 on the same host (`h3=":443"`), if it names one: another
/// host's alternative is not taken (the certificate would be checked for the origin's name).
pub(crate) fn advertised_port(alt_svc: &str) -> Option<u16> {
    alt_svc.split(',').find_map(|entry| {
        let (protocol, rest) = entry.trim().split_once('=')?;
        if protocol.trim() != "h3" {
            return None;
        }
        let authority = rest.split(';').next()?.trim().trim_matches('"');
        authority.strip_prefix(':')?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_h3_on_the_same_host_is_taken_from_alt_svc() {
        assert_eq!(advertised_port("h3=\":443\"; ma=86400"), Some(443));
        assert_eq!(advertised_port("h3-29=\":8443\", h3=\":8443\"; ma=60"), Some(8443));
        assert_eq!(advertised_port("h2=\":443\""), None);
        assert_eq!(advertised_port("h3=\"alt.example:443\""), None);
        assert_eq!(advertised_port("clear"), None);
        assert_eq!(advertised_port("h3=\":notaport\""), None);
    }
}
