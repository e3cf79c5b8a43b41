//! [`ClientSession`] in memory, for the pipeline's tests: a request given as a header and its
//! body's chunks, the response's header and body collected, no socket (so no kernel way), and a
//! client that goes away when the test says.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use tokio::sync::watch;

use super::ClientSession;
use crate::client_socket::ClientSocket;

/// A request answered into memory.
#[derive(Debug)]
pub(in crate::proxy) struct MemorySession {
    request: RequestHeader,
    /// The request body's chunks not read yet.
    request_body: VecDeque<Bytes>,
    /// `100 Continue` was written.
    continued: bool,
    peer: Option<SocketAddr>,
    header: Option<ResponseHeader>,
    body: Vec<u8>,
    ended: bool,
    keepalive: bool,
    /// Says `true` once the client has gone.
    gone: Option<watch::Receiver<bool>>,
}

impl MemorySession {
    /// The session of `request`, from a client at `peer`.
    pub(in crate::proxy) fn new(request: RequestHeader, peer: std::net::SocketAddr) -> Self {
        Self {
            request,
            request_body: VecDeque::new(),
            continued: false,
            peer: Some(SocketAddr::Inet(peer)),
            header: None,
            body: Vec::new(),
            ended: false,
            keepalive: true,
            gone: None,
        }
    }

    /// The session, its client gone once `gone` says `true`.
    pub(in crate::proxy) fn with_gone(mut self, gone: watch::Receiver<bool>) -> Self {
        self.gone = Some(gone);
        self
    }

    /// The session, its request's body sent in `chunks`.
    pub(in crate::proxy) fn with_body(mut self, chunks: impl IntoIterator<Item = Bytes>) -> Self {
        self.request_body = chunks.into_iter().collect();
        self
    }

    /// Whether `100 Continue` was written.
    pub(in crate::proxy) fn continued(&self) -> bool {
        self.continued
    }

    /// The body written, as the client would have read it.
    pub(in crate::proxy) fn body(&self) -> &[u8] {
        &self.body
    }

    /// Whether the response was ended (its last write said so).
    pub(in crate::proxy) fn ended(&self) -> bool {
        self.ended
    }

    /// Whether the connection would have been kept for another request.
    pub(in crate::proxy) fn keepalive(&self) -> bool {
        self.keepalive
    }
}

fn misuse(what: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InternalError, what)
}

impl ClientSession for MemorySession {
    fn req_header(&self) -> &RequestHeader {
        &self.request
    }

    fn peer(&self) -> Option<&SocketAddr> {
        self.peer.as_ref()
    }

    fn is_tls(&self) -> bool {
        false
    }

    fn version(&self) -> http::Version {
        self.request.version
    }

    async fn read_body(&mut self) -> Result<Option<Bytes>> {
        Ok(self.request_body.pop_front())
    }

    fn request_body_done(&mut self) -> bool {
        self.request_body.is_empty()
    }

    async fn write_continue(&mut self) -> Result<()> {
        if self.header.is_some() {
            return Err(misuse("100 Continue after the response's header"));
        }
        self.continued = true;
        Ok(())
    }

    /// Not kept: no origin served in memory sends one.
    async fn write_interim(&mut self, _header: Box<ResponseHeader>) -> Result<()> {
        Ok(())
    }

    /// Nothing waits on a client in memory.
    fn set_write_timeout(&mut self, _timeout: Duration) {}

    fn close_after_response(&mut self) {
        self.keepalive = false;
    }

    async fn write_header(&mut self, header: Box<ResponseHeader>, end: bool) -> Result<()> {
        if self.header.is_some() {
            return Err(misuse("a second response header"));
        }
        self.header = Some(*header);
        self.ended = end;
        Ok(())
    }

    async fn write_header_now(&mut self, header: Box<ResponseHeader>) -> Result<()> {
        self.write_header(header, false).await
    }

    async fn write_body(&mut self, body: Option<Bytes>, end: bool) -> Result<()> {
        if self.header.is_none() {
            return Err(misuse("a body before its header"));
        }
        if self.ended {
            return Err(misuse("a body after the response's end"));
        }
        self.body.extend_from_slice(body.as_deref().unwrap_or_default());
        self.ended = end;
        Ok(())
    }

    fn response_written(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    fn body_bytes_sent(&self) -> u64 {
        self.body.len() as u64
    }

    fn kernel_sends(&self) -> bool {
        false
    }

    fn connection_socket(&self) -> Option<io::Result<Arc<ClientSocket>>> {
        None
    }

    async fn stream_gone(&mut self) {
        match self.gone.as_mut() {
            Some(gone) => {
                // A sender dropped without saying so leaves the client there.
                if gone.wait_for(|gone| *gone).await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
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
