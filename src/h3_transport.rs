//! h3 over quinn: the QUIC side of `h3::quic`'s traits, for the listener's connections. It lies
//! beneath both the listener (`crate::h3`) and the request's session
//! (`proxy/client_session/h3.rs`), which share its stream handles.
//!
//! hyperium's h3-quinn does the same and keeps each stream's quinn handle to itself; rangeway
//! needs two things of a request stream that go past h3's API, kept for its request in a
//! [`StreamHandle`]. Its `stopped()`, which resolves when the client stops reading the response
//! (its fetch aborted, while the origin may keep rangeway waiting: `ClientSession::stream_gone`)
//! and once the response has been acknowledged whole (what a draining connection waits for
//! before it closes). And a way for the body's chunks to reach quinn as the `Bytes` they are:
//! h3 hands a DATA frame over as a `Buf` only, which quinn would copy into its send buffer; the
//! session offers each chunk beside it ([`BodyHandoff`]), and the stream gives quinn that chunk
//! itself when the frame's payload is it. A connection hands the handle of the request stream h3
//! accepted last through [`LastAccepted::take`]: h3's `accept` accepts one request stream and
//! returns it.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h3::error::Code;
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};
use quinn::VarInt;

/// Resolves when the client stops a response stream, its connection ends, or the response has
/// been acknowledged whole.
pub(crate) type Acknowledged = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// A stream being accepted or opened: quinn's futures borrow the connection, so each is boxed
/// with a clone of it.
type Pending<T> = Pin<Box<dyn Future<Output = Result<T, quinn::ConnectionError>> + Send + Sync>>;

/// What a request has of its stream beyond h3's `RequestStream`.
pub(crate) struct StreamHandle {
    pub(crate) stopped: Acknowledged,
    pub(crate) body: BodyHandoff,
}

/// The body chunk a request is writing, offered to its stream so that quinn takes the chunk
/// itself rather than a copy of the frame's payload.
#[derive(Clone, Default)]
pub(crate) struct BodyHandoff(Arc<Mutex<Option<Bytes>>>);

impl BodyHandoff {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Bytes>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `body` is the payload of the DATA frame written next.
    pub(crate) fn offer(&self, body: &Bytes) {
        *self.slot() = Some(body.clone());
    }

    /// The frame is written (or abandoned).
    pub(crate) fn clear(&self) {
        *self.slot() = None;
    }

    /// The offered chunk's bytes that `rest` is, when `rest` is the unwritten end of it: the same
    /// memory, so no copy is needed.
    fn covering(&self, rest: &[u8]) -> Option<Bytes> {
        let slot = self.slot();
        let offered = slot.as_ref()?;
        let (start, end) = (offered.as_ptr() as usize, offered.as_ptr() as usize + offered.len());
        let (from, to) = (rest.as_ptr() as usize, rest.as_ptr() as usize + rest.len());
        (!rest.is_empty() && from >= start && to == end).then(|| offered.slice(from - start..))
    }
}

/// The handle of the request stream accepted last, for the connection to take.
#[derive(Clone, Default)]
pub(crate) struct LastAccepted(Arc<Mutex<Option<StreamHandle>>>);

impl LastAccepted {
    /// The handle of the stream h3 accepted last.
    pub(crate) fn take(&self) -> Option<StreamHandle> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Keeps `stream`'s handle; the body's handoff is returned for the stream's writer.
    fn put(&self, stream: &quinn::SendStream) -> BodyHandoff {
        let stopped = stream.stopped();
        let stopped: Acknowledged = Box::pin(async move {
            // Whatever ended it: the client's STOP_SENDING, the connection's end, or the last
            // acknowledgement.
            let _ = stopped.await;
        });
        let body = BodyHandoff::default();
        let handle = StreamHandle { stopped, body: body.clone() };
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
        body
    }
}

/// A QUIC connection as h3 drives it.
pub(crate) struct Transport {
    connection: quinn::Connection,
    accepting_bi: Option<Pending<(quinn::SendStream, quinn::RecvStream)>>,
    accepting_uni: Option<Pending<quinn::RecvStream>>,
    opener: Opener,
    accepted: LastAccepted,
}

impl Transport {
    /// `connection`, the handle of each request stream it accepts left in `accepted`.
    pub(crate) fn new(connection: quinn::Connection, accepted: LastAccepted) -> Self {
        let opener = Opener::new(connection.clone());
        Self { connection, accepting_bi: None, accepting_uni: None, opener, accepted }
    }
}

/// `pending`'s outcome, a new one made by `start` when there is none.
fn poll_pending<T>(
    pending: &mut Option<Pending<T>>,
    cx: &mut Context<'_>,
    start: impl FnOnce() -> Pending<T>,
) -> Poll<Result<T, quinn::ConnectionError>> {
    let outcome = ready!(pending.get_or_insert_with(start).as_mut().poll(cx));
    *pending = None;
    Poll::Ready(outcome)
}

impl quic::Connection<Bytes> for Transport {
    type RecvStream = RecvStream;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::RecvStream, ConnectionErrorIncoming>> {
        let connection = &self.connection;
        let accepted = poll_pending(&mut self.accepting_uni, cx, || {
            let connection = connection.clone();
            Box::pin(async move { connection.accept_uni().await })
        });
        Poll::Ready(ready!(accepted).map(RecvStream).map_err(connection_error))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        let connection = &self.connection;
        let accepted = poll_pending(&mut self.accepting_bi, cx, || {
            let connection = connection.clone();
            Box::pin(async move { connection.accept_bi().await })
        });
        let (send, recv) = ready!(accepted).map_err(connection_error)?;
        let body = self.accepted.put(&send);
        let send = SendStream { body: Some(body), ..SendStream::new(send) };
        Poll::Ready(Ok(BidiStream { send, recv: RecvStream(recv) }))
    }

    fn opener(&self) -> Self::OpenStreams {
        Opener::new(self.connection.clone())
    }
}

impl quic::OpenStreams<Bytes> for Transport {
    type BidiStream = BidiStream;
    type SendStream = SendStream;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        self.opener.poll_open_bidi(cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        self.opener.poll_open_send(cx)
    }

    fn close(&mut self, code: Code, reason: &[u8]) {
        self.opener.close(code, reason);
    }
}

/// Opens the server's streams (h3's control and QPACK streams).
pub(crate) struct Opener {
    connection: quinn::Connection,
    opening_bi: Option<Pending<(quinn::SendStream, quinn::RecvStream)>>,
    opening_uni: Option<Pending<quinn::SendStream>>,
}

impl Opener {
    fn new(connection: quinn::Connection) -> Self {
        Self { connection, opening_bi: None, opening_uni: None }
    }
}

impl Clone for Opener {
    /// The connection's, with no stream being opened.
    fn clone(&self) -> Self {
        Self::new(self.connection.clone())
    }
}

impl quic::OpenStreams<Bytes> for Opener {
    type BidiStream = BidiStream;
    type SendStream = SendStream;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        let connection = &self.connection;
        let opened = poll_pending(&mut self.opening_bi, cx, || {
            let connection = connection.clone();
            Box::pin(async move { connection.open_bi().await })
        });
        let (send, recv) = ready!(opened).map_err(stream_connection_error)?;
        Poll::Ready(Ok(BidiStream { send: SendStream::new(send), recv: RecvStream(recv) }))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        let connection = &self.connection;
        let opened = poll_pending(&mut self.opening_uni, cx, || {
            let connection = connection.clone();
            Box::pin(async move { connection.open_uni().await })
        });
        Poll::Ready(ready!(opened).map(SendStream::new).map_err(stream_connection_error))
    }

    fn close(&mut self, code: Code, reason: &[u8]) {
        self.connection.close(var_int(code.value()), reason);
    }
}

/// A request stream, both ways.
pub(crate) struct BidiStream {
    send: SendStream,
    recv: RecvStream,
}

impl quic::BidiStream<Bytes> for BidiStream {
    type SendStream = SendStream;
    type RecvStream = RecvStream;

    fn split(self) -> (Self::SendStream, Self::RecvStream) {
        (self.send, self.recv)
    }
}

impl quic::RecvStream for BidiStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Self::Buf>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.recv.recv_id()
    }
}

impl quic::SendStream<Bytes> for BidiStream {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<Bytes>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code);
    }

    fn send_id(&self) -> StreamId {
        self.send.send_id()
    }
}

/// A stream's sending side: the frame h3 handed over, written as quinn takes it.
pub(crate) struct SendStream {
    stream: quinn::SendStream,
    writing: Option<WriteBuf<Bytes>>,
    /// A request stream's: the body chunk its session offers.
    body: Option<BodyHandoff>,
}

impl SendStream {
    fn new(stream: quinn::SendStream) -> Self {
        Self { stream, writing: None, body: None }
    }
}

impl quic::SendStream<Bytes> for SendStream {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        let Self { stream, writing, body } = self;
        if let Some(data) = writing {
            while data.has_remaining() {
                let rest = data.chunk();
                let written = match body.as_ref().and_then(|body| body.covering(rest)) {
                    // The body's own chunk: quinn keeps it as it is. `write_chunks` is
                    // cancel-safe, so a future made for each poll loses nothing.
                    Some(chunk) => {
                        let mut chunks = [chunk];
                        let written = ready!(pin!(stream.write_chunks(&mut chunks)).poll(cx));
                        written.map_err(write_error)?.bytes
                    }
                    // Frame headers, and whatever is not the offered chunk: copied.
                    None => {
                        ready!(Pin::new(&mut *stream).poll_write(cx, rest)).map_err(write_error)?
                    }
                };
                data.advance(written);
            }
        }
        *writing = None;
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<Bytes>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        if self.writing.is_some() {
            // h3 waits for poll_ready between frames: this is its misuse, not the peer's.
            let misuse = "a frame written before the last one went".to_owned();
            let connection_error = ConnectionErrorIncoming::InternalError(misuse);
            return Err(StreamErrorIncoming::ConnectionErrorIncoming { connection_error });
        }
        self.writing = Some(data.into());
        Ok(())
    }

    fn poll_finish(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        Poll::Ready(self.stream.finish().map_err(|e| StreamErrorIncoming::Unknown(Box::new(e))))
    }

    fn reset(&mut self, reset_code: u64) {
        // Reset already, or finished and gone: nothing to do either way.
        let _ = self.stream.reset(var_int(reset_code));
    }

    fn send_id(&self) -> StreamId {
        stream_id(self.stream.id())
    }
}

/// A stream's receiving side.
pub(crate) struct RecvStream(quinn::RecvStream);

impl quic::RecvStream for RecvStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Self::Buf>, StreamErrorIncoming>> {
        // `read_chunk` is cancel-safe: a future made for each poll loses nothing.
        let chunk = ready!(pin!(self.0.read_chunk(usize::MAX, true)).poll(cx));
        Poll::Ready(chunk.map(|chunk| chunk.map(|chunk| chunk.bytes)).map_err(read_error))
    }

    fn stop_sending(&mut self, error_code: u64) {
        // Stopped already, or read to its end: nothing to do either way.
        let _ = self.0.stop(var_int(error_code));
    }

    fn recv_id(&self) -> StreamId {
        stream_id(self.0.id())
    }
}

/// h3's error code as QUIC carries it; a code too large for QUIC (none h3 defines) is sent as
/// the largest there is.
fn var_int(code: u64) -> VarInt {
    VarInt::from_u64(code).unwrap_or(VarInt::MAX)
}

fn stream_id(id: quinn::StreamId) -> StreamId {
    // Both are QUIC variable-length integers: every quinn id is one of h3's.
    StreamId::try_from(u64::from(id)).unwrap_or_else(|_| unreachable!("a QUIC stream id"))
}

fn connection_error(error: quinn::ConnectionError) -> ConnectionErrorIncoming {
    match error {
        quinn::ConnectionError::ApplicationClosed(close) => {
            ConnectionErrorIncoming::ApplicationClose { error_code: close.error_code.into_inner() }
        }
        quinn::ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        other => ConnectionErrorIncoming::Undefined(Arc::new(other)),
    }
}

fn stream_connection_error(error: quinn::ConnectionError) -> StreamErrorIncoming {
    StreamErrorIncoming::ConnectionErrorIncoming { connection_error: connection_error(error) }
}

fn read_error(error: quinn::ReadError) -> StreamErrorIncoming {
    match error {
        quinn::ReadError::Reset(code) => {
            StreamErrorIncoming::StreamTerminated { error_code: code.into_inner() }
        }
        quinn::ReadError::ConnectionLost(error) => stream_connection_error(error),
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

fn write_error(error: quinn::WriteError) -> StreamErrorIncoming {
    match error {
        quinn::WriteError::Stopped(code) => {
            StreamErrorIncoming::StreamTerminated { error_code: code.into_inner() }
        }
        quinn::WriteError::ConnectionLost(error) => stream_connection_error(error),
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_offered_chunk_s_own_unwritten_end_is_handed_over() {
        let handoff = BodyHandoff::default();
        let offered = Bytes::from(vec![7u8; 1000]);
        assert!(handoff.covering(&offered).is_none(), "nothing offered yet");
        handoff.offer(&offered);
        let whole = handoff.covering(&offered).expect("the whole chunk");
        assert_eq!(whole.as_ptr(), offered.as_ptr(), "the same memory, not a copy");
        let rest = handoff.covering(&offered[300..]).expect("its unwritten end");
        assert_eq!((rest.as_ptr(), rest.len()), (offered[300..].as_ptr(), 700));
        // The same bytes elsewhere, a part short of the end, nothing: copied as before.
        let copy = offered.to_vec();
        assert!(handoff.covering(&copy).is_none());
        assert!(handoff.covering(&offered[..500]).is_none());
        assert!(handoff.covering(&offered[1000..]).is_none());
        handoff.clear();
        assert!(handoff.covering(&offered).is_none(), "cleared");
    }
}
