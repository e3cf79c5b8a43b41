//! [`ClientSession`] for pingora's sessions, HTTP/1 (plain or TLS, on rangeway's
//! `ClientConnection`) and HTTP/2: the one place the pipeline names them. The kernel's ways and
//! their accounting are HTTP/1's alone.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pingora_core::protocols::http::{HttpTask, ServerSession};
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};

use super::ClientSession;
use crate::admission::ClientConnection;
use crate::client_socket::{ClientSocket, is_plain};

impl ClientSession for ServerSession {
    fn req_header(&self) -> &RequestHeader {
        self.req_header()
    }

    fn peer(&self) -> Option<&SocketAddr> {
        self.client_addr()
    }

    fn is_tls(&self) -> bool {
        self.digest().is_some_and(|d| d.ssl_digest.is_some())
    }

    fn version(&self) -> http::Version {
        self.req_header().version
    }

    async fn read_body(&mut self) -> Result<Option<Bytes>> {
        self.read_request_body().await
    }

    fn request_body_done(&mut self) -> bool {
        self.is_body_done()
    }

    /// HTTP/1 only: an HTTP/2 client's body is sent under the stream's flow control, and
    /// pingora's HTTP/2 session takes no interim answer.
    async fn write_continue(&mut self) -> Result<()> {
        match self {
            ServerSession::H1(h1) => h1.write_continue_response().await,
            _ => Ok(()),
        }
    }

    async fn write_interim(&mut self, header: Box<ResponseHeader>) -> Result<()> {
        let http_11 = self.req_header().version == http::Version::HTTP_11;
        match self {
            ServerSession::H1(h1) if http_11 => h1.write_response_header(header).await,
            ServerSession::H2(h2) => h2.write_response_header(header, false),
            _ => Ok(()),
        }
    }

    fn set_write_timeout(&mut self, timeout: Duration) {
        self.set_write_timeout(Some(timeout));
    }

    fn close_after_response(&mut self) {
        self.set_keepalive(None);
    }

    /// `end` is not pingora's to be told: it frames the body from the header itself, and ends it
    /// with the body's last write or the session's `finish`.
    async fn write_header(&mut self, header: Box<ResponseHeader>, _end: bool) -> Result<()> {
        self.write_response_header(header).await
    }

    /// pingora buffers a header with a Content-Length until body bytes follow, and offers no
    /// flush of its own: a failed task after the header is its way to one ("flush what we have
    /// and quit").
    async fn write_header_now(&mut self, header: Box<ResponseHeader>) -> Result<()> {
        const FLUSHED: ErrorType = ErrorType::Custom("HeaderFlushed");
        let ServerSession::H1(h1) = self else {
            return Err(Error::explain(
                ErrorType::InternalError,
                "splicing to a client not on HTTP/1",
            ));
        };
        let tasks = vec![HttpTask::Header(header, false), HttpTask::Failed(Error::new(FLUSHED))];
        match h1.response_duplex_vec(tasks).await {
            Err(e) if *e.etype() == FLUSHED => Ok(()),
            Err(e) => Err(e),
            Ok(_) => Err(Error::explain(ErrorType::InternalError, "the header was not flushed")),
        }
    }

    async fn write_body(&mut self, body: Option<Bytes>, end: bool) -> Result<()> {
        match body {
            Some(body) => self.write_response_body(body, end).await,
            None if end => self.write_response_body(Bytes::new(), true).await,
            None => Ok(()),
        }
    }

    /// The final answer's: pingora keeps a `100 Continue` written before it as the header
    /// written, which no answer would follow were it taken for one.
    fn response_written(&self) -> Option<&ResponseHeader> {
        self.response_written().filter(|header| !header.status.is_informational())
    }

    fn body_bytes_sent(&self) -> u64 {
        self.body_bytes_sent() as u64
    }

    fn kernel_sends(&self) -> bool {
        let ServerSession::H1(h1) = self else { return false };
        ClientConnection::of(h1.stream()).is_some() && is_plain(Some(h1.stream()))
    }

    fn connection_socket(&self) -> Option<io::Result<Arc<ClientSocket>>> {
        let ServerSession::H1(h1) = self else { return None };
        Some(match ClientConnection::of(h1.stream()) {
            Some(connection) => connection.socket(),
            // Over TLS the stream wraps the admission's: a duplicate for this request alone.
            None => ClientSocket::duplicate(h1.stream().id()).map(Arc::new),
        })
    }

    async fn stream_gone(&mut self) {
        match self {
            ServerSession::H2(h2) => {
                // Its reason does not matter: the stream will not take an answer.
                let _ = h2.idle().await;
            }
            _ => std::future::pending().await,
        }
    }

    fn note_sent_aside(&self, bytes: u64) -> bool {
        let Some(connection) = connection(self) else { return false };
        connection.note_sent_aside(bytes);
        true
    }

    fn unaccounted(&self) -> u64 {
        connection(self).map_or(0, ClientConnection::unaccounted)
    }

    fn bound_unsent(&self, kernel_way: bool) {
        if let Some(connection) = connection(self) {
            connection.bound_unsent(kernel_way);
        }
    }

    fn response_ended(&self) {
        if let Some(connection) = connection(self) {
            connection.response_ended();
        }
    }
}

/// The admission wrapper of an HTTP/1 session's connection (HTTP/2's streams share theirs).
fn connection(session: &ServerSession) -> Option<&ClientConnection> {
    let ServerSession::H1(h1) = session else { return None };
    ClientConnection::of(h1.stream())
}

/// Readies `session` to be answered: on HTTP/1, requests a client pipelines on its connection
/// are answered in turn (RFC 9112 §9.3.2), where pingora would close the connection after the
/// first and drop the others.
pub(in crate::proxy) fn answer_pipelined(session: &mut ServerSession) {
    if let ServerSession::H1(h1) = session {
        h1.set_pipelining_enabled(true);
    }
}
