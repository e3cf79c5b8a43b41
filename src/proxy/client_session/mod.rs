//! The client's side of a request as the pipeline sees it: the request read and the response
//! written, whatever listener and protocol carry them. [`ClientSession`] holds exactly what the
//! steps use; pingora's HTTP/1 and HTTP/2 sessions implement it (pingora.rs, the one place the
//! pipeline names them), HTTP/3's request streams do (h3.rs, fed by `crate::h3`'s listener), and
//! the pipeline's tests drive every step through an in-memory one (memory.rs). A session with no
//! socket of its own (HTTP/2, HTTP/3) answers `None` to the kernel's ways and tells the client's
//! going through [`ClientSession::stream_gone`]. alt_svc.rs wraps pingora's sessions to
//! advertise HTTP/3 on the TLS listeners' answers.
//!
//! The steps take it as a generic (`&mut impl ClientSession`), not as a trait object: its writes
//! are called for every chunk of a body, and an object's async methods would box a future for
//! each.

mod alt_svc;
mod h3;
mod pingora;
mod watch;

#[cfg(test)]
pub(super) mod memory;

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};

use crate::client_socket::ClientSocket;

pub(crate) use self::h3::{H3Client, H3Session, H3Stream};
pub(super) use alt_svc::AltSvc;
pub(super) use pingora::answer_pipelined;
pub(super) use watch::{ClientWatch, client_gone};

/// A client's request and the response the pipeline writes for it.
pub(super) trait ClientSession: Send + Sync {
    /// The request's header, as the client sent it.
    fn req_header(&self) -> &RequestHeader;

    /// The connection's peer: the client, or the source a balancer's PROXY header named. `None`
    /// where there is none to name.
    fn peer(&self) -> Option<&SocketAddr>;

    /// Whether the connection is TLS (the origin is told `X-Forwarded-Proto: https`).
    fn is_tls(&self) -> bool;

    /// The protocol the request came in, as the access line and the trace name it.
    fn version(&self) -> http::Version;

    /// The next chunk of the request's body as it arrives; `None` at its end (at once for a
    /// request without one).
    fn read_body(&mut self) -> impl Future<Output = Result<Option<Bytes>>> + Send;

    /// Whether the request's body has been read to its end (or there is none): a response
    /// written before then ends the connection, whose next bytes are the rest of it.
    fn request_body_done(&mut self) -> bool;

    /// Tells an HTTP/1.1 client that asked (`Expect: 100-continue`) to send its body: `100
    /// Continue` (RFC 9110 §10.1.1). Nothing on a session where the client does not wait for it.
    fn write_continue(&mut self) -> impl Future<Output = Result<()>> + Send;

    /// Writes an interim response before the final one — a `103 Early Hints` an origin sent —
    /// where the client can take it: an HTTP/1.1 or HTTP/2 client (RFC 9110 §15.2). Nothing
    /// for an HTTP/1.0 client.
    fn write_interim(
        &mut self,
        header: Box<ResponseHeader>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// How long one write may wait on a client that takes nothing: then the response is cut.
    fn set_write_timeout(&mut self, timeout: Duration);

    /// The connection ends with this response: nothing after it is read.
    fn close_after_response(&mut self);

    /// Writes the response's header, once; `end`: no body follows.
    fn write_header(
        &mut self,
        header: Box<ResponseHeader>,
        end: bool,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Writes the response's header and sends it at once, for a body that goes out past this
    /// session's writer (spliced, or sent from the cache's files where [`Self::kernel_sends`]):
    /// a writer may otherwise hold a header until body bytes follow it.
    fn write_header_now(
        &mut self,
        header: Box<ResponseHeader>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Writes `body` (when there is some), then ends the response when `end` says.
    fn write_body(
        &mut self,
        body: Option<Bytes>,
        end: bool,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The response's header, once written.
    fn response_written(&self) -> Option<&ResponseHeader>;

    /// The body bytes the response sent: through the writer, and those it was told went past it.
    fn body_bytes_sent(&self) -> u64;

    /// Whether the kernel may send a body to the client's socket ([`Self::connection_socket`]) with
    /// splice or sendfile: only a plain socket whose bytes sent past the writer can be accounted
    /// for ([`Self::note_sent_aside`]).
    fn kernel_sends(&self) -> bool;

    /// The socket of the client's connection when the request has it to itself (HTTP/1, plain or
    /// TLS), as a duplicate registered with the reactor on its own: the client watch sees it
    /// close, the kernel's ways send to it, the live view reads what the client took from it.
    /// `None` where the connection carries other requests or is no socket: then
    /// [`Self::stream_gone`] tells when the client goes; an error when it cannot be duplicated.
    fn connection_socket(&self) -> Option<io::Result<Arc<ClientSocket>>>;

    /// Resolves once the client has gone — its stream reset, its connection closed — for a
    /// session without [`Self::connection_socket`]; never where that cannot be told.
    fn stream_gone(&mut self) -> impl Future<Output = ()> + Send;

    /// `bytes` of the body went out past the writer: the writer's next `bytes` are its account
    /// of them, swallowed. `false` when the session cannot account for them.
    fn note_sent_aside(&self, bytes: u64) -> bool;

    /// Bytes noted as sent past the writer that its writes have not accounted for yet.
    fn unaccounted(&self) -> u64;

    /// Bounds the socket's unsent bytes for a body the kernel sends (`true`), or lifts the bound
    /// for one written from rangeway's buffers.
    fn bound_unsent(&self, kernel_way: bool);

    /// The response has ended: the connection is idle until its next request.
    fn response_ended(&self);
}
