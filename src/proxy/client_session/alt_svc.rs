//! `Alt-Svc` on the answers of the TLS listeners while HTTP/3 is on (RFC 7838): the client
//! learns that the same origin speaks HTTP/3 on UDP, and its next connection can take it. Never
//! on plain HTTP, whose origin (`http://`) HTTP/3 does not serve.
//!
//! A session wrapped: every header the pipeline writes through it gets the field, whichever step
//! wrote it (an error, a refusal, a body); the rest goes to the session as it is.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, header};
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};

use super::ClientSession;
use crate::client_socket::ClientSocket;

/// `session`, whose response headers say `alt_svc` when there is one.
pub(in crate::proxy) struct AltSvc<'s, S> {
    session: &'s mut S,
    alt_svc: Option<&'s HeaderValue>,
}

impl<'s, S: ClientSession> AltSvc<'s, S> {
    /// `session`, advertising `alt_svc` when it is over TLS.
    pub(in crate::proxy) fn new(session: &'s mut S, alt_svc: Option<&'s HeaderValue>) -> Self {
        let alt_svc = alt_svc.filter(|_| session.is_tls());
        Self { session, alt_svc }
    }

    fn advertise(&self, header: &mut ResponseHeader) -> Result<()> {
        match self.alt_svc {
            Some(value) => header.insert_header(header::ALT_SVC, value.clone()),
            None => Ok(()),
        }
    }
}

impl<S: ClientSession> ClientSession for AltSvc<'_, S> {
    fn req_header(&self) -> &RequestHeader {
        self.session.req_header()
    }

    fn peer(&self) -> Option<&SocketAddr> {
        self.session.peer()
    }

    fn is_tls(&self) -> bool {
        self.session.is_tls()
    }

    fn version(&self) -> http::Version {
        self.session.version()
    }

    async fn read_body(&mut self) -> Result<Option<Bytes>> {
        self.session.read_body().await
    }

    fn request_body_done(&mut self) -> bool {
        self.session.request_body_done()
    }

    async fn write_continue(&mut self) -> Result<()> {
        self.session.write_continue().await
    }

    async fn write_interim(&mut self, header: Box<ResponseHeader>) -> Result<()> {
        self.session.write_interim(header).await
    }

    fn set_write_timeout(&mut self, timeout: Duration) {
        self.session.set_write_timeout(timeout);
    }

    fn close_after_response(&mut self) {
        self.session.close_after_response();
    }

    async fn write_header(&mut self, mut header: Box<ResponseHeader>, end: bool) -> Result<()> {
        self.advertise(&mut header)?;
        self.session.write_header(header, end).await
    }

    async fn write_header_now(&mut self, mut header: Box<ResponseHeader>) -> Result<()> {
        self.advertise(&mut header)?;
        self.session.write_header_now(header).await
    }

    async fn write_body(&mut self, body: Option<Bytes>, end: bool) -> Result<()> {
        self.session.write_body(body, end).await
    }

    fn response_written(&self) -> Option<&ResponseHeader> {
        self.session.response_written()
    }

    fn body_bytes_sent(&self) -> u64 {
        self.session.body_bytes_sent()
    }

    fn kernel_sends(&self) -> bool {
        self.session.kernel_sends()
    }

    fn connection_socket(&self) -> Option<io::Result<Arc<ClientSocket>>> {
        self.session.connection_socket()
    }

    async fn stream_gone(&mut self) {
        self.session.stream_gone().await;
    }

    fn note_sent_aside(&self, bytes: u64) -> bool {
        self.session.note_sent_aside(bytes)
    }

    fn unaccounted(&self) -> u64 {
        self.session.unaccounted()
    }

    fn bound_unsent(&self, kernel_way: bool) {
        self.session.bound_unsent(kernel_way);
    }

    fn response_ended(&self) {
        self.session.response_ended();
    }
}
