//! The pass-through way: a request the pipeline's steps do not answer — a method other than GET
//! and HEAD that its route lets through (`methods`) — sent to the route's upstream by the one
//! origin client, its body streamed from the client as it arrives (a chunk at a time: at most
//! `max_request_body` in all, no read waiting longer than `client_body_timeout`), and the
//! origin's answer relayed by the deliver step. A request is sent once: another replica is tried
//! only while nothing of it can have reached one — or, for an idempotent method, nothing of its
//! body. A 2xx or 3xx answer to an unsafe method invalidates what the slice cache holds for the
//! target, its `Location` and its `Content-Location` (RFC 9111 §4.4).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Method, StatusCode, header};
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};

use super::Proxy;
use super::admit::Admitted;
use super::answer::respond;
use super::client_session::{ClientSession, ClientWatch};
use super::context::{RequestCtx, ip_text};
use super::hop_by_hop::{end_to_end, forwarded};
use super::identify::upstream_target;
use super::origin_request::{self, client_side};
use super::source::{Sourced, answer_of, relay_hints};
use super::source_body::UpstreamBody;
use super::transport::Transport;
use crate::cache::Selection;
use crate::links::Link;
use crate::range::content_length;
use crate::request_path::NormalizedPath;
use crate::routes::Route;
use crate::routes::origin_client::Sending;

/// How the client frames its request's body, and so how the origin's request frames it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body follows the header.
    Empty,
    /// `Content-Length`, kept upstream.
    Length(u64),
    /// Chunked (HTTP/1.1), or a stream without `Content-Length` (HTTP/2): sent chunked.
    Chunked,
}

impl Framing {
    fn of(request: &RequestHeader) -> Self {
        // `content_length` reads none beside Transfer-Encoding, which overrides it (RFC 9112
        // §6.3), as pingora reads it.
        match content_length(&request.headers) {
            _ if request.headers.contains_key(header::TRANSFER_ENCODING) => Self::Chunked,
            Some(0) => Self::Empty,
            Some(len) => Self::Length(len),
            None if request.version >= http::Version::HTTP_2 => Self::Chunked,
            None => Self::Empty,
        }
    }
}

/// Why a request body was not sent whole: rangeway answers, and the connection ends.
#[derive(Debug, Clone, Copy)]
enum Unsent {
    /// More than `max_request_body`: 413.
    TooLarge,
    /// Nothing for `client_body_timeout`: 408.
    Stalled,
}

impl Proxy {
    /// Passes the request through to its route's upstream, and relays the answer.
    pub(super) async fn pass_through(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        admitted: Admitted,
    ) -> Result<()> {
        let Admitted { route, path, link, .. } = admitted;
        let passed = self.pass(session, ctx, &route, (&path, link.as_ref())).await;
        if !session.request_body_done() {
            // Answered before its body was read whole: the rest would be read as a request.
            session.close_after_response();
        }
        // Named after the way ended: the deliver step names the way its copy took.
        ctx.delivery.transport = Some(Transport::PassThrough);
        passed
    }

    /// The origin asked — the request started, its body sent as it comes — and its answer
    /// relayed; or the body refused.
    async fn pass(
        &self,
        session: &mut impl ClientSession,
        ctx: &mut RequestCtx,
        route: &Arc<Route>,
        (path, link): (&NormalizedPath, Option<&Link>),
    ) -> Result<()> {
        let req = session.req_header();
        let Some(target) = upstream_target(req, route, path, link) else {
            // S3 would act on the bucket itself: nothing a route serves.
            return respond(session, StatusCode::NOT_FOUND, "no object at this path\n", &[]).await;
        };
        ctx.identity.upstream_target = target;
        ctx.identity.client_ip = ctx.client.map(|client| ip_text(client.ip));
        let framing = Framing::of(req);
        ctx.upstream.replica = route.upstream.choose();
        let request = pass_request(session, ctx, route, framing)?;
        ctx.identity.route = Some(Arc::clone(route));
        if let Framing::Length(len) = framing
            && len > self.client_limits.max_request_body
        {
            return refuse_body(session, ctx, Unsent::TooLarge).await;
        }
        let method = session.req_header().method.clone();
        let idempotent = matches!(method, Method::PUT | Method::DELETE | Method::OPTIONS);
        let base = (route.upstream.replica_count() > 1).then(|| request.clone());
        ctx.upstream.asked = Some(Instant::now());
        let watch = ClientWatch::of(session);
        let replicas = (&mut ctx.upstream.replica, &mut ctx.upstream.connect_tries);
        let started = self.origin_client.start_failing_over(
            &route.upstream,
            replicas,
            (request, base.as_ref()),
            idempotent,
        );
        let mut sending = watch.unless_gone(session, Box::pin(started)).await??;
        // Only now, with the origin's connection open: a client is never invited to send a body
        // that rangeway does not read.
        if framing != Framing::Empty && expects_continue(session.req_header()) {
            session.write_continue().await?;
        }
        if let Some(unsent) = self.send_body(session, &mut sending, framing).await? {
            refuse_body(session, ctx, unsent).await?;
            if let Unsent::TooLarge = unsent {
                linger(session).await;
            }
            return Ok(());
        }
        let mut exchange = watch.unless_gone(session, sending.answer(&route.upstream)).await??;
        relay_hints(session, &mut exchange).await?;
        let mut response = answer_of(&exchange)?;
        forwarded(&mut response)?;
        ctx.upstream.answered(route, &response);
        self.invalidate(&method, route, ctx, &response);
        let body = UpstreamBody::origin(Box::new(exchange));
        let sourced = Sourced {
            response,
            body: Some(body),
            stream: None,
            continuable: None,
            base: None,
            policy: None,
            authorized: false,
        };
        self.deliver(session, ctx, route, sourced, &watch).await
    }

    /// Streams the client's body to the origin as it arrives, a chunk at a time; `Some` when it
    /// stopped short: past `max_request_body`, or stalled.
    async fn send_body(
        &self,
        session: &mut impl ClientSession,
        sending: &mut Sending,
        framing: Framing,
    ) -> Result<Option<Unsent>> {
        if framing == Framing::Empty {
            return Ok(None);
        }
        let limits = &self.client_limits;
        let mut read = 0u64;
        loop {
            let chunk = match tokio::time::timeout(limits.body_timeout, session.read_body()).await {
                Err(_) => return Ok(Some(Unsent::Stalled)),
                Ok(chunk) => chunk.map_err(|e| e.into_down())?,
            };
            let Some(chunk) = chunk else { return Ok(None) };
            read += chunk.len() as u64;
            if read > limits.max_request_body {
                return Ok(Some(Unsent::TooLarge));
            }
            sending.write_body(chunk).await?;
        }
    }

    /// RFC 9111 §4.4: a 2xx or 3xx answer to an unsafe method changed the target, and perhaps
    /// what its `Location` and `Content-Location` name when they are on the upstream asked: what
    /// the slice cache holds of each is dropped (with any query), for every route of the
    /// upstream, whichever asked it.
    fn invalidate(
        &self,
        method: &Method,
        route: &Route,
        ctx: &RequestCtx,
        answer: &ResponseHeader,
    ) {
        let Some(cache) = &self.cache else { return };
        let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE);
        if safe || !(answer.status.is_success() || answer.status.is_redirection()) {
            return;
        }
        let target = ctx.identity.upstream_target.as_str();
        let host = route.upstream.host_header(ctx.upstream.replica).as_bytes();
        let named = [header::LOCATION, header::CONTENT_LOCATION]
            .into_iter()
            .filter_map(|name| path_on_upstream(answer.headers.get(name)?, host, target));
        let own = target.split('?').next().unwrap_or_default().to_owned();
        for path in std::iter::once(own).chain(named) {
            cache.purge(&Selection::Object { upstream: route.upstream.name().to_owned(), path });
        }
    }
}

/// The request for the origin: the client's end-to-end fields, completed as every origin request
/// is (`origin_request::complete`: Host, forwarding fields; signed where it is sent), framed as
/// the client's body is. Made before the request is its route's in `ctx.identity`: the route's
/// stages do not run on this way, and nothing is planned for them (a PUT keeps its `If-Match`).
fn pass_request(
    session: &impl ClientSession,
    ctx: &RequestCtx,
    route: &Route,
    framing: Framing,
) -> Result<RequestHeader> {
    let mut request = end_to_end(session.req_header());
    origin_request::complete(&mut request, route, ctx, client_side(session))?;
    // rangeway answers the client's expectation itself, and sends the body without waiting.
    request.headers.remove(header::EXPECT);
    if framing == Framing::Chunked {
        request.headers.remove(header::CONTENT_LENGTH);
        request.headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    Ok(RequestHeader::from(request))
}

/// Answers a body rangeway does not send whole (413, 408); the connection ends with the answer.
async fn refuse_body(
    session: &mut impl ClientSession,
    ctx: &mut RequestCtx,
    unsent: Unsent,
) -> Result<()> {
    let (status, message, refusal) = match unsent {
        Unsent::TooLarge => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is larger than max_request_body allows\n",
            "its body is larger than max_request_body",
        ),
        Unsent::Stalled => (
            StatusCode::REQUEST_TIMEOUT,
            "the request body stalled for longer than client_body_timeout\n",
            "its body stalled for longer than client_body_timeout",
        ),
    };
    ctx.refusal = Some(refusal);
    session.close_after_response();
    respond(session, status, message, &[(header::CONNECTION, "close")]).await
}

/// How long the rest of a body cut past `max_request_body` is still read, and dropped, after
/// the 413: a connection closed while its client still sends is reset, and the answer lost with
/// it (RFC 9112 §9.6). Long enough for what is in flight on any path, short against a download.
const LINGER: Duration = Duration::from_secs(2);

/// Reads and drops what the client still sends of its body, for [`LINGER`] at most.
async fn linger(session: &mut impl ClientSession) {
    let drained = async { while let Ok(Some(_)) = session.read_body().await {} };
    let _ = tokio::time::timeout(LINGER, drained).await;
}

/// Whether an HTTP/1.1 client waits for `100 Continue` before its body (RFC 9110 §10.1.1; an
/// HTTP/1.0 client's expectation is ignored).
fn expects_continue(request: &RequestHeader) -> bool {
    request.version == http::Version::HTTP_11
        && request
            .headers
            .get(header::EXPECT)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The path a `Location` or `Content-Location` names on the upstream asked (whose Host was
/// `host`), resolved against the request's `target`: `None` for another host, or a relative
/// reference with dot segments (not resolved: nothing is invalidated for it).
fn path_on_upstream(value: &HeaderValue, host: &[u8], target: &str) -> Option<String> {
    let reference = value.to_str().ok()?.split(['?', '#']).next()?;
    // An absolute URI (`scheme://`), or a network-path reference (`//`): an authority, a path.
    let after_authority = reference.strip_prefix("//").or_else(|| {
        let (scheme, rest) = reference.split_once("://")?;
        let scheme_byte = |b: u8| b.is_ascii_alphanumeric() || b"+-.".contains(&b);
        scheme.bytes().all(scheme_byte).then_some(rest)
    });
    if let Some(rest) = after_authority {
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let path = if path.is_empty() { "/" } else { path };
        return authority.as_bytes().eq_ignore_ascii_case(host).then(|| path.to_owned());
    }
    if reference.starts_with('/') {
        return Some(reference.to_owned());
    }
    if reference.is_empty() || reference.split('/').any(|segment| segment == "." || segment == "..")
    {
        return None;
    }
    let path = target.split('?').next().unwrap_or_default();
    let directory = &path[..path.rfind('/').map_or(0, |slash| slash + 1)];
    Some(format!("{directory}{reference}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_resolved_on_the_upstream_asked_only() {
        let resolve = |value: &'static str| {
            path_on_upstream(&HeaderValue::from_static(value), b"origin:8080", "/a/b/c?x=1")
        };
        assert_eq!(resolve("/a/other?q#f").as_deref(), Some("/a/other"));
        assert_eq!(resolve("/a//b").as_deref(), Some("/a//b"));
        assert_eq!(resolve("http://ORIGIN:8080/d/e").as_deref(), Some("/d/e"));
        assert_eq!(resolve("https://origin:8080").as_deref(), Some("/"));
        assert_eq!(resolve("//origin:8080/f").as_deref(), Some("/f"));
        assert_eq!(resolve("sibling").as_deref(), Some("/a/b/sibling"));
        assert_eq!(resolve("d/e").as_deref(), Some("/a/b/d/e"));
        for elsewhere in ["http://other:8080/a/b/c", "//origin/f", "../up", "./here", ""] {
            assert_eq!(resolve(elsewhere), None, "{elsewhere}");
        }
    }

    #[test]
    fn a_body_is_framed_as_the_client_framed_it() {
        let framing = |version, fields: &[(&str, &str)]| {
            let mut request = RequestHeader::build("POST", b"/", None).expect("a request");
            request.set_version(version);
            for (name, value) in fields {
                request.append_header(name.to_string(), *value).expect("a field");
            }
            Framing::of(&request)
        };
        let h1 = http::Version::HTTP_11;
        assert_eq!(framing(h1, &[]), Framing::Empty);
        assert_eq!(framing(h1, &[("content-length", "0")]), Framing::Empty);
        assert_eq!(framing(h1, &[("content-length", "12")]), Framing::Length(12));
        let chunked = [("content-length", "12"), ("transfer-encoding", "chunked")];
        assert_eq!(framing(h1, &chunked), Framing::Chunked);
        assert_eq!(framing(http::Version::HTTP_2, &[]), Framing::Chunked);
        assert_eq!(framing(http::Version::HTTP_2, &[("content-length", "3")]), Framing::Length(3));
    }
}
