//! [`ClientSession`] for an HTTP/3 request: one bidirectional stream of a QUIC connection that
//! `crate::h3` accepted. It has no socket of its own — the connection's packets go out through
//! the listener's UDP socket, encrypted per packet — so the kernel's ways are not for it
//! (`kernel_sends` is `false`), and a client's going is its stream stopped or its connection
//! ended (quinn's `stopped()`), as HTTP/2's is its stream reset or its connection closed.
//!
//! The client is the address that made the handshake, whatever address its packets come from
//! after a migration: its downloads, limits and access line stay one client's.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use h3::error::Code;
use h3::server::RequestStream;
use http::{HeaderName, Method, header};
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};

use super::ClientSession;
use crate::client_socket::ClientSocket;
use crate::h3_transport::{Acknowledged, BidiStream, BodyHandoff, StreamHandle};

/// A request's stream, as h3 hands it over.
pub(crate) type H3Stream = RequestStream<BidiStream, Bytes>;

/// The connection an HTTP/3 request came on.
#[derive(Debug, Clone)]
pub(crate) struct H3Client {
    /// The address of the handshake: the client's identity for the connection's life.
    pub(crate) peer: std::net::SocketAddr,
    pub(crate) connection: quinn::Connection,
    /// Whether the request may have come in 0-RTT data, which an attacker can replay: only GET
    /// and HEAD are answered then (RFC 8470 §5.1).
    pub(crate) early: bool,
}

/// Fields a response must not carry over HTTP/3 (RFC 9114 §4.2): what they say is the
/// connection's, and QUIC frames it.
const CONNECTION_FIELDS: [HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// An HTTP/3 request and the response the pipeline writes on its stream.
pub(crate) struct H3Session {
    request: RequestHeader,
    stream: H3Stream,
    peer: SocketAddr,
    connection: quinn::Connection,
    /// The final response's header, once sent.
    response: Option<ResponseHeader>,
    /// The request's body was read to its end.
    body_done: bool,
    /// The response's stream was finished.
    ended: bool,
    /// The client's rest of the request is not wanted (`close_after_response`).
    stop_reading: bool,
    sent: u64,
    write_timeout: Duration,
    /// Resolves when the client stops the response, its connection ends, or the response has
    /// been acknowledged whole; `None` once it has resolved.
    stopped: Option<Acknowledged>,
    /// The client stopped the stream or closed the connection.
    gone: bool,
    /// Where each body chunk is offered to the stream, which hands it to quinn uncopied.
    body: Option<BodyHandoff>,
}

impl H3Session {
    /// The session of `request` on `stream`, of which the transport kept `handle`.
    pub(crate) fn new(
        request: http::Request<()>,
        stream: H3Stream,
        client: &H3Client,
        handle: Option<StreamHandle>,
    ) -> Self {
        let (mut parts, ()) = request.into_parts();
        let (stopped, body) = handle.map(|h| (h.stopped, h.body)).unzip();
        parts.version = http::Version::HTTP_3;
        Self {
            request: RequestHeader::from(parts),
            stream,
            peer: SocketAddr::Inet(client.peer),
            connection: client.connection.clone(),
            response: None,
            body_done: false,
            ended: false,
            stop_reading: false,
            sent: 0,
            write_timeout: Duration::from_secs(60),
            stopped,
            gone: false,
            body,
        }
    }

    /// What resolves once the response has been acknowledged whole (or the client stopped it):
    /// `None` when that has happened already.
    pub(crate) fn acknowledged(self) -> Option<Acknowledged> {
        self.stopped
    }

    /// Whether a request that may have come in 0-RTT data must wait for the handshake: any but
    /// GET and HEAD, which change nothing if replayed.
    pub(crate) fn too_early(&self, client: &H3Client) -> bool {
        client.early && !matches!(self.request.method, Method::GET | Method::HEAD)
    }

    /// The stream's end once the pipeline is done with it: finished when its response was
    /// whole, reset when it was cut (the client must not take a cut body for a whole one, and
    /// only a reset says so once a length was promised or none was).
    pub(crate) async fn end(&mut self, whole: bool) {
        if self.stop_reading && !self.body_done {
            self.stream.stop_sending(Code::H3_NO_ERROR);
        }
        if self.ended || (whole && self.response.is_some() && self.finish().await.is_ok()) {
            return;
        }
        self.stream.stop_stream(Code::H3_INTERNAL_ERROR);
        self.ended = true;
    }

    async fn finish(&mut self) -> Result<()> {
        timed(self.write_timeout, self.stream.finish()).await?;
        self.ended = true;
        Ok(())
    }
}

/// `write`'s outcome within `timeout`, an error of the client's when it fails or takes longer.
async fn timed<T, E>(
    timeout: Duration,
    write: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => {
            Err(Error::because(ErrorType::WriteError, "writing to the HTTP/3 client", e)
                .into_down())
        }
        Err(_) => Err(Error::explain(
            ErrorType::WriteTimedout,
            "the HTTP/3 client took nothing for client_write_timeout",
        )
        .into_down()),
    }
}

fn misuse(what: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InternalError, what)
}

impl ClientSession for H3Session {
    fn req_header(&self) -> &RequestHeader {
        &self.request
    }

    fn peer(&self) -> Option<&SocketAddr> {
        Some(&self.peer)
    }

    fn is_tls(&self) -> bool {
        true
    }

    fn version(&self) -> http::Version {
        http::Version::HTTP_3
    }

    async fn read_body(&mut self) -> Result<Option<Bytes>> {
        if self.body_done {
            return Ok(None);
        }
        match self.stream.recv_data().await {
            Ok(Some(mut chunk)) => Ok(Some(chunk.copy_to_bytes(chunk.remaining()))),
            Ok(None) => {
                self.body_done = true;
                Ok(None)
            }
            Err(e) => {
                Err(Error::because(ErrorType::ReadError, "reading the HTTP/3 request body", e)
                    .into_down())
            }
        }
    }

    fn request_body_done(&mut self) -> bool {
        self.body_done
    }

    /// Nothing: a client's body is sent under the stream's flow control.
    async fn write_continue(&mut self) -> Result<()> {
        Ok(())
    }

    /// Nothing: h3's server writes a final answer only.
    async fn write_interim(&mut self, _header: Box<ResponseHeader>) -> Result<()> {
        Ok(())
    }

    fn set_write_timeout(&mut self, timeout: Duration) {
        self.write_timeout = timeout;
    }

    /// The stream's, not the connection's: the rest of the request's body is refused at the
    /// response's end (STOP_SENDING), and the connection's other streams go on.
    fn close_after_response(&mut self) {
        self.stop_reading = true;
    }

    async fn write_header(&mut self, header: Box<ResponseHeader>, end: bool) -> Result<()> {
        if self.response.is_some() {
            return Err(misuse("a second response header"));
        }
        let mut response = http::Response::new(());
        *response.status_mut() = header.status;
        *response.headers_mut() = header.headers.clone();
        for name in &CONNECTION_FIELDS {
            response.headers_mut().remove(name);
        }
        timed(self.write_timeout, self.stream.send_response(response)).await?;
        self.response = Some(*header);
        if end {
            self.finish().await?;
        }
        Ok(())
    }

    /// As `write_header`: h3 sends a header as soon as it is written.
    async fn write_header_now(&mut self, header: Box<ResponseHeader>) -> Result<()> {
        self.write_header(header, false).await
    }

    async fn write_body(&mut self, body: Option<Bytes>, end: bool) -> Result<()> {
        if self.ended {
            return Err(misuse("a body after the response's end"));
        }
        if let Some(body) = body.filter(|body| !body.is_empty()) {
            let len = body.len() as u64;
            if let Some(handoff) = &self.body {
                handoff.offer(&body);
            }
            let sent = timed(self.write_timeout, self.stream.send_data(body)).await;
            if let Some(handoff) = &self.body {
                handoff.clear();
            }
            sent?;
            self.sent += len;
        }
        if end {
            self.finish().await?;
        }
        Ok(())
    }

    fn response_written(&self) -> Option<&ResponseHeader> {
        self.response.as_ref()
    }

    fn body_bytes_sent(&self) -> u64 {
        self.sent
    }

    fn kernel_sends(&self) -> bool {
        false
    }

    fn connection_socket(&self) -> Option<io::Result<Arc<ClientSocket>>> {
        None
    }

    /// The stream stopped by the client (STOP_SENDING), or its connection ended. Called before
    /// the response's end, so never resolved by the response's acknowledgement.
    async fn stream_gone(&mut self) {
        if self.gone {
            return;
        }
        match self.stopped.as_mut() {
            Some(stopped) => stopped.await,
            // No `stopped()` to watch: the connection's end, then.
            None => {
                self.connection.closed().await;
            }
        }
        self.stopped = None;
        self.gone = true;
    }

    fn note_sent_aside(&self, _bytes: u64) -> bool {
        false
    }

    fn unaccounted(&self) -> u64 {
        0
    }

    fn bound_unsent(&self, _kernel_way: bool) {}

    fn response_ended(&self) {}
}
