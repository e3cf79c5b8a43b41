//! An in-process HTTP/1.1 origin that serves objects correctly, or misbehaves on request.
//!
//! nginx is the reference for a well-behaved origin; this one exists for what nginx will not do:
//! ignore or misanswer a Range, cut a body short, fail, stall, drop validators, and change an
//! object between two requests. It also records every request, so tests can assert what the
//! proxy sent upstream.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// How the origin answers requests for an object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Behaviour {
    /// Correct HTTP: ranges, validators, conditional requests.
    #[default]
    Normal,
    /// Ignores Range (and If-Range): always 200 with the whole object, and no Accept-Ranges.
    IgnoreRange,
    /// Answers a satisfiable single range with a 206 for a range moved by this many bytes:
    /// towards the start when the requested range starts at least that far in, else towards the
    /// end (clipped to the object). Content-Range and body agree with each other, just not with
    /// the request. Requests without a Range get a correct 200.
    WrongRange(u64),
    /// Sends the headers of the correct answer (full Content-Length), then this many body bytes,
    /// then closes the connection.
    CutAfter(u64),
    /// Answers every request with this final status and a short text body (none for HEAD, 204
    /// and 304). For outages: 500, 502, 503.
    Status(u16),
    /// The correct answer, with the body written `chunk` bytes at a time and `delay` before each
    /// chunk after the first.
    Slow { chunk: usize, delay: Duration },
    /// The correct answer without an ETag: the object has only Last-Modified as a validator, so
    /// If-Match never matches (except `*`) and If-Range works only with the date.
    NoEtag,
    /// The correct answer with a weak ETag (`W/` before the object's), as nginx sends with gzip
    /// on and many application servers always: If-Match and If-Range never match it.
    WeakEtag,
    /// The correct answer, but a HEAD's leaves Content-Length off (Node's `http` does).
    NoLengthOnHead,
    /// The correct answer framed with `Transfer-Encoding: chunked` and no Content-Length.
    Chunked,
    /// The whole object, whatever the Range, chunked and without `Accept-Ranges`: a body whose
    /// length no answer gives, as an application server streams one.
    ChunkedWhole,
    /// As [`Behaviour::ChunkedWhole`], but closes the connection after this many body bytes,
    /// without the last chunk: a body of no length cut off.
    ChunkedCutAfter(u64),
    /// The correct answer, after an interim response with this status (100, 102, or 103 Early
    /// Hints with a `Link` field, as CDNs send).
    Interim(u16),
    /// The correct answer, its header sent after this long.
    Delayed(Duration),
    /// Reads the request and never answers: the connection stays open, silent, until the client
    /// closes it ([`Origin::closed_while_silent`] counts those).
    Silent,
    /// The correct answer's header and this many bytes of its body, then silence until the
    /// client closes the connection (counted as for [`Behaviour::Silent`]).
    SilentAfter(u64),
    /// The object built from the host it was asked for, as a web application behind a proxy
    /// builds its links: `http://HOST/` (the request's `X-Forwarded-Host`, else its `Host`) over
    /// the start of the body and in `Content-Location`, the ETag and length the object's.
    ReflectHost,
    /// Takes a request of another method than GET and HEAD: 200, its body `LEN SHA256-HEX` of
    /// the request body it read, with these fields (a `Location`, say). GET and HEAD as `Normal`.
    TakesBodies(Vec<(String, String)>),
    /// Reads the request, its body too, and closes the connection without an answer.
    HangUp,
    /// The correct answer, or by the roll of a seeded die per response: a 503 (only to ranged
    /// requests: continuations), a body cut at a random byte, or a body that stalls at a random
    /// byte and is then cut.
    Faulty(Faults),
}

/// How often a [`Behaviour::Faulty`] origin fails, in percent of responses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Faults {
    pub(crate) seed: u64,
    /// Of ranged requests, answered 503.
    pub(crate) error_percent: u64,
    /// Of bodies, cut at a random byte.
    pub(crate) cut_percent: u64,
    /// Of bodies, stalled at a random byte for `stall`, then cut.
    pub(crate) stall_percent: u64,
    pub(crate) stall: Duration,
}

/// A request as the origin received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordedRequest {
    /// Which connection it came on, numbered from 1 in order of accept: equal numbers on two
    /// requests mean the client reused the connection.
    pub(crate) connection: u64,
    pub(crate) method: String,
    /// The request target as sent, query included.
    pub(crate) target: String,
    /// In the order received; names lowercased.
    pub(crate) headers: Vec<(String, String)>,
    /// The body's length, as read (framed by Content-Length or chunked).
    pub(crate) body_len: u64,
    /// The body's SHA-256 in hex (that of no bytes when there was none).
    pub(crate) body_sha256: String,
}

impl RecordedRequest {
    /// The first value of header `name` (any case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// The running origin; stops, closing every connection and joining its threads, on drop.
#[derive(Debug)]
pub(crate) struct Origin {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    content: Mutex<Content>,
    requests: Mutex<Vec<RecordedRequest>>,
    /// Clones of the open connections, so that drop can shut them down and wake their threads
    /// out of blocking reads (a proxy keeps idle upstream connections open indefinitely).
    open: Mutex<HashMap<u64, TcpStream>>,
    stopping: AtomicBool,
    /// Responses a `Faulty` origin has rolled for.
    rolls: AtomicU64,
    /// Object bytes put into answer bodies, counted as they are handed to the socket.
    body_bytes: AtomicU64,
    /// Connections a silent answer was waiting on when the client closed them.
    closed_while_silent: AtomicU64,
}

#[derive(Debug, Default)]
struct Content {
    objects: HashMap<String, Object>,
    behaviours: HashMap<String, Behaviour>,
    global: Behaviour,
}

#[derive(Clone, Debug)]
struct Object {
    body: Bytes,
    etag: String,
    last_modified: SystemTime,
    /// Sent on every answer with a body, e.g. a digest the origin publishes.
    extra_headers: Vec<(String, String)>,
}

/// Chunk size for `Behaviour::Chunked`: small enough that a test object spans several chunks.
const CHUNK_SIZE: usize = 16 * 1024;

impl Origin {
    /// Starts an origin with no objects on 127.0.0.1 and a port of the system's choosing.
    pub(crate) fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the test origin");
        let addr = listener.local_addr().expect("test origin address");
        let shared = Arc::new(Shared::default());
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("test-origin-accept".to_owned())
                .spawn(move || accept_loop(&listener, &shared))
                .expect("spawn the test origin's accept thread")
        };
        Origin { addr, shared, acceptor: Some(acceptor) }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub(crate) fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// [`Self::base_url`] followed by `path` (which starts with `/`).
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// Serves `body` at `path` from now on, replacing any earlier object there, and returns the
    /// new strong ETag (`"` + 16 hex digits of the body's SHA-256 + `"`). Last-Modified becomes
    /// now, which is the same second as the old version's when replaced quickly: as on real
    /// stores, only the ETag reliably tells versions apart.
    pub(crate) fn put(&self, path: &str, body: impl Into<Bytes>) -> String {
        self.put_with_headers(path, body, &[])
    }

    /// Like [`Origin::put`], with header fields sent on every answer about the object (200, 206,
    /// HEAD), e.g. `Repr-Digest`.
    pub(crate) fn put_with_headers(
        &self,
        path: &str,
        body: impl Into<Bytes>,
        headers: &[(&str, &str)],
    ) -> String {
        self.put_modified(path, body, headers, SystemTime::now())
    }

    /// Like [`Origin::put_with_headers`], last modified at `last_modified`.
    pub(crate) fn put_modified(
        &self,
        path: &str,
        body: impl Into<Bytes>,
        headers: &[(&str, &str)],
        last_modified: SystemTime,
    ) -> String {
        assert!(path.starts_with('/'), "object paths start with '/': {path:?}");
        let body = body.into();
        let digest = Sha256::digest(&body);
        let mut etag = String::from("\"");
        for byte in &digest[..8] {
            let _ = write!(etag, "{byte:02x}");
        }
        etag.push('"');
        let extra_headers =
            headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
        let object = Object { body, etag: etag.clone(), last_modified, extra_headers };
        lock(&self.shared.content).objects.insert(path.to_owned(), object);
        etag
    }

    /// Stops serving `path` (404 from now on).
    pub(crate) fn remove(&self, path: &str) {
        lock(&self.shared.content).objects.remove(path);
    }

    /// The ETag of the object at `path`, also when [`Behaviour::NoEtag`] hides it.
    pub(crate) fn etag(&self, path: &str) -> Option<String> {
        lock(&self.shared.content).objects.get(path).map(|object| object.etag.clone())
    }

    /// Sets how requests for `path` are answered, overriding the global behaviour. Kept when the
    /// object is replaced or removed.
    pub(crate) fn set_behaviour(&self, path: &str, behaviour: Behaviour) {
        lock(&self.shared.content).behaviours.insert(path.to_owned(), behaviour);
    }

    /// Drops the behaviour set for `path`, so the global one applies again.
    pub(crate) fn clear_behaviour(&self, path: &str) {
        lock(&self.shared.content).behaviours.remove(path);
    }

    /// Sets how requests are answered for paths without a behaviour of their own (including
    /// unknown paths, so `Status` turns the whole origin into an outage).
    pub(crate) fn set_global_behaviour(&self, behaviour: Behaviour) {
        lock(&self.shared.content).global = behaviour;
    }

    /// Every request received so far, in order of arrival.
    pub(crate) fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// How many bytes of objects the origin has put into answer bodies: the upstream work the
    /// requests caused (the short text bodies of errors and 416s are not counted).
    pub(crate) fn body_bytes(&self) -> u64 {
        self.shared.body_bytes.load(Ordering::SeqCst)
    }

    /// How many connections the client closed while a [`Behaviour::Silent`] or
    /// [`Behaviour::SilentAfter`] answer kept them waiting.
    pub(crate) fn closed_while_silent(&self) -> u64 {
        self.shared.closed_while_silent.load(Ordering::SeqCst)
    }

    /// Forgets the recorded requests, e.g. after a test's setup.
    pub(crate) fn clear_requests(&self) {
        lock(&self.shared.requests).clear();
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // accept() has no timeout: a connection of our own wakes it to see the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// A test that panicked while a connection thread held a lock must not turn every later
/// assertion into a poison error; the data is still consistent (each update is one statement).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 1;
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            // Transient failures (EMFILE, ECONNABORTED) must not end the origin, but a listener
            // that keeps failing must not keep drop from finishing either.
            Err(_) if shared.stopping.load(Ordering::SeqCst) => break,
            Err(_) => {
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let id = next_id;
        next_id += 1;
        let Ok(registered) = stream.try_clone() else {
            continue;
        };
        lock(&shared.open).insert(id, registered);
        let shared = Arc::clone(shared);
        let handler = thread::Builder::new()
            .name(format!("test-origin-conn-{id}"))
            .spawn(move || {
                serve_connection(&shared, id, stream);
                lock(&shared.open).remove(&id);
            })
            .expect("spawn a test origin connection thread");
        handlers.retain(|handler| !handler.is_finished());
        handlers.push(handler);
    }
    for stream in lock(&shared.open).values() {
        let _ = stream.shutdown(Shutdown::Both);
    }
    for handler in handlers {
        let _ = handler.join();
    }
}

fn serve_connection(shared: &Shared, id: u64, stream: TcpStream) {
    // Header and body go out in separate writes; without nodelay, Nagle's algorithm would hold
    // the body back for the client's delayed ACK.
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Ok(Some(request)) = read_request(&mut reader, id) {
        lock(&shared.requests).push(request.clone());
        match respond(shared, &request, &mut writer) {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
    }
}

/// Reads one request head (and skips a Content-Length body); `None` when the client closed.
fn read_request(reader: &mut impl BufRead, connection: u64) -> io::Result<Option<RecordedRequest>> {
    let Some(request_line) = read_line(reader)? else {
        return Ok(None);
    };
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(_version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad request line {request_line:?}"),
        ));
    };
    let mut request = RecordedRequest {
        connection,
        method: method.to_owned(),
        target: target.to_owned(),
        headers: Vec::new(),
        body_len: 0,
        body_sha256: String::new(),
    };
    loop {
        let line = read_line(reader)?.ok_or(io::ErrorKind::UnexpectedEof)?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, line.clone()))?;
        request.headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut body = BodyDigest::default();
    if request.header("transfer-encoding").is_some_and(|te| te.eq_ignore_ascii_case("chunked")) {
        read_chunked(reader, &mut body)?;
    } else if let Some(length) = request.header("content-length") {
        let length = length
            .parse::<u64>()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad Content-Length"))?;
        let copied = io::copy(&mut reader.take(length), &mut body)?;
        if copied < length {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    request.body_len = body.len;
    request.body_sha256 = hex(&body.sha256.finalize());
    Ok(Some(request))
}

/// A request body's length and SHA-256, taken as it is read: a large upload is not held.
#[derive(Default)]
struct BodyDigest {
    len: u64,
    sha256: Sha256,
}

impl Write for BodyDigest {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.len += bytes.len() as u64;
        self.sha256.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads a chunked body (RFC 9112 §7.1) into `body`, its trailer section skipped.
fn read_chunked(reader: &mut impl BufRead, body: &mut BodyDigest) -> io::Result<()> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    loop {
        let line = read_line(reader)?.ok_or(io::ErrorKind::UnexpectedEof)?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = u64::from_str_radix(size, 16).map_err(|_| bad("bad chunk size"))?;
        if size == 0 {
            while !read_line(reader)?.ok_or(io::ErrorKind::UnexpectedEof)?.is_empty() {}
            return Ok(());
        }
        if io::copy(&mut reader.take(size), body)? < size {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if !read_line(reader)?.ok_or(io::ErrorKind::UnexpectedEof)?.is_empty() {
            return Err(bad("no CRLF after a chunk"));
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(2 * bytes.len()), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

fn read_line(reader: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line)? == 0 {
        return Ok(None);
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
}

/// Writes the response; returns whether the connection may carry another request.
fn respond(shared: &Shared, request: &RecordedRequest, out: &mut TcpStream) -> io::Result<bool> {
    // RFC 9112 §3.2.2: a server accepts a request target in absolute form (what a client sends
    // a forward proxy), and serves its path.
    let origin_form = match request.target.strip_prefix("http://") {
        Some(rest) => &rest[rest.find('/').unwrap_or(rest.len())..],
        None => request.target.as_str(),
    };
    let path = origin_form.split('?').next().unwrap_or_default();
    let (object, behaviour) = {
        let content = lock(&shared.content);
        let behaviour = content.behaviours.get(path).unwrap_or(&content.global).clone();
        (content.objects.get(path).cloned(), behaviour)
    };
    let head_only = request.method == "HEAD";
    if let Behaviour::Delayed(delay) = behaviour {
        std::thread::sleep(delay);
    }
    if behaviour == Behaviour::Silent {
        silent_until_closed(shared, out);
        return Ok(false);
    }
    if let Behaviour::Interim(status) = behaviour {
        let link = if status == 103 { "Link: </hint.css>; rel=preload\r\n" } else { "" };
        out.write_all(format!("HTTP/1.1 {status} Interim\r\n{link}\r\n").as_bytes())?;
    }
    let keep_alive = !request
        .header("connection")
        .is_some_and(|value| value.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
    let mut response = ResponseHead::new(keep_alive);

    if let Behaviour::Status(status) = behaviour {
        return response.send_text(
            out,
            status,
            &format!("test origin: injected {status}\n"),
            head_only,
        );
    }
    // One roll per response of a faulty origin: a 503 for a ranged request, else a cut.
    let faults = match &behaviour {
        Behaviour::Faulty(faults) => {
            let n = shared.rolls.fetch_add(1, Ordering::SeqCst);
            Some((faults.clone(), splitmix64(faults.seed ^ n.wrapping_mul(0x9E37_79B9))))
        }
        _ => None,
    };
    if let Some((faults, roll)) = &faults
        && request.header("range").is_some()
        && roll % 100 < faults.error_percent
    {
        return response.send_text(out, 503, "test origin: injected 503\n", head_only);
    }
    if behaviour == Behaviour::HangUp {
        let _ = out.shutdown(Shutdown::Both);
        return Ok(false);
    }
    if let Behaviour::TakesBodies(fields) = &behaviour
        && !matches!(request.method.as_str(), "GET" | "HEAD")
    {
        for (name, value) in fields {
            response.header(name, value);
        }
        let taken = format!("{} {}", request.body_len, request.body_sha256);
        return response.send_text(out, 200, &taken, false);
    }
    if request.method != "GET" && !head_only {
        response.header("Allow", "GET, HEAD");
        return response.send_text(out, 405, "method not allowed\n", head_only);
    }
    let Some(object) = object else {
        return response.send_text(out, 404, "not found\n", head_only);
    };

    let weak = format!("W/{}", object.etag);
    let etag = match behaviour {
        Behaviour::NoEtag => None,
        Behaviour::WeakEtag => Some(weak.as_str()),
        _ => Some(object.etag.as_str()),
    };
    let last_modified = httpdate::fmt_http_date(object.last_modified);
    if let Some(if_match) = request.header("if-match")
        && !if_match_passes(if_match, etag)
    {
        return response.send_text(out, 412, "", head_only);
    }
    // RFC 9110 section 13.1.4, at the one-second precision of the date.
    let since =
        request.header("if-unmodified-since").and_then(|d| httpdate::parse_http_date(d).ok());
    if request.header("if-match").is_none()
        && since.is_some_and(|since| httpdate::parse_http_date(&last_modified).ok() > Some(since))
    {
        return response.send_text(out, 412, "", head_only);
    }
    let len = object.body.len() as u64;
    let range = match (&behaviour, request.header("range")) {
        (Behaviour::IgnoreRange | Behaviour::ChunkedWhole | Behaviour::ChunkedCutAfter(_), _)
        | (_, None) => None,
        (_, Some(range)) => {
            let if_range = request.header("if-range");
            if if_range.is_none_or(|value| if_range_passes(value, etag, &last_modified)) {
                parse_range(range).map(|spec| spec.resolve(len))
            } else {
                None
            }
        }
    };

    if let Some(etag) = etag {
        response.header("ETag", etag);
    }
    response.header("Last-Modified", &last_modified);
    for (name, value) in &object.extra_headers {
        response.header(name, value);
    }
    let mut object = object;
    if behaviour == Behaviour::ReflectHost {
        let host = request.header("x-forwarded-host").or_else(|| request.header("host"));
        let link = format!("http://{}/", host.unwrap_or_default());
        response.header("Content-Location", &link);
        let mut body = object.body.to_vec();
        let n = link.len().min(body.len());
        body[..n].copy_from_slice(&link.as_bytes()[..n]);
        object.body = Bytes::from(body);
    }
    let chunked = matches!(
        behaviour,
        Behaviour::Chunked | Behaviour::ChunkedWhole | Behaviour::ChunkedCutAfter(_)
    );
    if !chunked && behaviour != Behaviour::IgnoreRange {
        response.header("Accept-Ranges", "bytes");
    }
    let (status, first, last) = match range {
        None => (200, 0, len),
        Some(None) => {
            response.header("Content-Range", &format!("bytes */{len}"));
            return response.send_text(out, 416, "", head_only);
        }
        Some(Some((first, last))) => {
            let (first, last) = match behaviour {
                Behaviour::WrongRange(shift) => shifted(first, last, shift, len),
                _ => (first, last),
            };
            response.header("Content-Range", &format!("bytes {first}-{last}/{len}"));
            (206, first, last + 1)
        }
    };
    // The bounds come from `resolve` and `shifted`, which keep them within the object.
    let start = usize::try_from(first).expect("range start within the object");
    let end = usize::try_from(last).expect("range end within the object");
    let body = object.body.slice(start..end);
    response.header("Content-Type", "application/octet-stream");
    if chunked {
        response.header("Transfer-Encoding", "chunked");
    } else if !(head_only && behaviour == Behaviour::NoLengthOnHead) {
        response.header("Content-Length", &body.len().to_string());
    }
    response.write(out, status)?;
    if head_only {
        return Ok(keep_alive);
    }
    // Counted before writing, so a client that has read the bytes sees them counted.
    let count = |bytes: &[u8]| {
        shared.body_bytes.fetch_add(bytes.len() as u64, Ordering::SeqCst);
    };
    match behaviour {
        Behaviour::CutAfter(sent) => {
            let sent = usize::try_from(sent).unwrap_or(usize::MAX).min(body.len());
            count(&body[..sent]);
            out.write_all(&body[..sent])?;
            // A FIN after the partial body, as when an origin process dies mid-response.
            let _ = out.shutdown(Shutdown::Write);
            Ok(false)
        }
        Behaviour::SilentAfter(sent) => {
            let sent = usize::try_from(sent).unwrap_or(usize::MAX).min(body.len());
            count(&body[..sent]);
            out.write_all(&body[..sent])?;
            silent_until_closed(shared, out);
            Ok(false)
        }
        Behaviour::Slow { chunk, delay } => {
            for (index, piece) in body.chunks(chunk.max(1)).enumerate() {
                if index > 0 {
                    thread::sleep(delay);
                }
                if shared.stopping.load(Ordering::SeqCst) {
                    return Ok(false);
                }
                count(piece);
                out.write_all(piece)?;
            }
            Ok(keep_alive)
        }
        Behaviour::Faulty(_) if !body.is_empty() => {
            let Some((faults, roll)) = faults else { unreachable!("rolled above") };
            let (cut, stall) = ((roll >> 8) % 100, (roll >> 16) % 100);
            let at = usize::try_from((roll >> 24) % body.len() as u64).unwrap_or(0);
            if cut < faults.cut_percent || stall < faults.stall_percent {
                count(&body[..at]);
                out.write_all(&body[..at])?;
                if stall < faults.stall_percent {
                    out.flush()?;
                    thread::sleep(faults.stall);
                }
                let _ = out.shutdown(Shutdown::Write);
                return Ok(false);
            }
            count(&body);
            out.write_all(&body)?;
            Ok(keep_alive)
        }
        Behaviour::Chunked | Behaviour::ChunkedWhole | Behaviour::ChunkedCutAfter(_) => {
            let sent = match behaviour {
                Behaviour::ChunkedCutAfter(sent) => usize::try_from(sent).unwrap_or(usize::MAX),
                _ => body.len(),
            };
            for piece in body[..sent.min(body.len())].chunks(CHUNK_SIZE) {
                out.write_all(format!("{:x}\r\n", piece.len()).as_bytes())?;
                count(piece);
                out.write_all(piece)?;
                out.write_all(b"\r\n")?;
            }
            if sent < body.len() {
                let _ = out.shutdown(Shutdown::Write);
                return Ok(false);
            }
            out.write_all(b"0\r\n\r\n")?;
            Ok(keep_alive)
        }
        _ => {
            count(&body);
            out.write_all(&body)?;
            Ok(keep_alive)
        }
    }
}

/// Waits, sending nothing, until the client closes the connection (or the origin stops).
fn silent_until_closed(shared: &Shared, connection: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    while matches!(connection.read(&mut buf), Ok(n) if n > 0) {}
    if !shared.stopping.load(Ordering::SeqCst) {
        shared.closed_while_silent.fetch_add(1, Ordering::SeqCst);
    }
}

/// Response headers being assembled, with `Date` and connection handling common to all answers.
struct ResponseHead {
    headers: Vec<(String, String)>,
    keep_alive: bool,
}

impl ResponseHead {
    fn new(keep_alive: bool) -> ResponseHead {
        let mut head = ResponseHead { headers: Vec::new(), keep_alive };
        head.header("Date", &httpdate::fmt_http_date(SystemTime::now()));
        head
    }

    /// Adds a field; an object's own `Date` (an answer made earlier) takes the place of now's.
    fn header(&mut self, name: &str, value: &str) {
        if name.eq_ignore_ascii_case("date") {
            self.headers.retain(|(named, _)| !named.eq_ignore_ascii_case("date"));
        }
        self.headers.push((name.to_owned(), value.to_owned()));
    }

    fn write(&mut self, out: &mut TcpStream, status: u16) -> io::Result<()> {
        if !self.keep_alive {
            self.header("Connection", "close");
        }
        let reason = http::StatusCode::from_u16(status)
            .ok()
            .and_then(|code| code.canonical_reason())
            .unwrap_or("Unknown");
        let mut text = format!("HTTP/1.1 {status} {reason}\r\n");
        for (name, value) in &self.headers {
            let _ = write!(text, "{name}: {value}\r\n");
        }
        text.push_str("\r\n");
        out.write_all(text.as_bytes())
    }

    /// A complete response with a small text body (bodiless statuses get no body at all).
    fn send_text(
        mut self,
        out: &mut TcpStream,
        status: u16,
        body: &str,
        head_only: bool,
    ) -> io::Result<bool> {
        let bodiless = status == 204 || status == 304 || status < 200;
        if !bodiless {
            self.header("Content-Type", "text/plain");
            self.header("Content-Length", &body.len().to_string());
        }
        self.write(out, status)?;
        if !bodiless && !head_only {
            out.write_all(body.as_bytes())?;
        }
        Ok(self.keep_alive)
    }
}

/// RFC 9110 section 13.1.1: strong comparison against the current ETag; `*` matches any
/// existing representation, and no ETag matches nothing else.
fn if_match_passes(header: &str, etag: Option<&str>) -> bool {
    header
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || etag.is_some_and(|etag| !tag.starts_with("W/") && tag == etag))
}

/// RFC 9110 section 13.1.5: an entity tag must match strongly; a date must equal Last-Modified
/// exactly.
fn if_range_passes(header: &str, etag: Option<&str>, last_modified: &str) -> bool {
    let header = header.trim();
    if header.starts_with('"') || header.starts_with("W/") {
        etag.is_some_and(|etag| !etag.starts_with("W/") && header == etag)
    } else {
        httpdate::parse_http_date(header).ok() == httpdate::parse_http_date(last_modified).ok()
    }
}

/// One `bytes=` range as written in the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RangeSpec {
    FromTo(u64, u64),
    From(u64),
    Suffix(u64),
}

impl RangeSpec {
    /// The inclusive byte range this selects in an object of `len` bytes; `None` when
    /// unsatisfiable (the 416 case).
    fn resolve(self, len: u64) -> Option<(u64, u64)> {
        match self {
            RangeSpec::FromTo(first, last) if first < len => Some((first, last.min(len - 1))),
            RangeSpec::From(first) if first < len => Some((first, len - 1)),
            RangeSpec::Suffix(count) if count > 0 && len > 0 => {
                Some((len - count.min(len), len - 1))
            }
            _ => None,
        }
    }
}

/// Parses a Range header with exactly one byte range. Anything else (other units, several
/// ranges, bad syntax, last < first) yields `None` and the Range is ignored, as RFC 9110
/// section 14.2 allows; this origin serves no multipart/byteranges.
fn parse_range(header: &str) -> Option<RangeSpec> {
    let (unit, spec) = header.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
        return None;
    }
    let (first, last) = spec.trim().split_once('-')?;
    let number = |text: &str| -> Option<u64> {
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse().ok())
            .flatten()
    };
    match (first.is_empty(), last.is_empty()) {
        (true, false) => number(last).map(RangeSpec::Suffix),
        (false, true) => number(first).map(RangeSpec::From),
        (false, false) => {
            let (first, last) = (number(first)?, number(last)?);
            (first <= last).then_some(RangeSpec::FromTo(first, last))
        }
        (true, true) => None,
    }
}

/// The range `WrongRange(shift)` answers instead of `first..=last` in an object of `len` bytes.
fn shifted(first: u64, last: u64, shift: u64, len: u64) -> (u64, u64) {
    if first >= shift {
        (first - shift, last - shift)
    } else if first.saturating_add(shift) < len {
        (first + shift, last.saturating_add(shift).min(len - 1))
    } else {
        (first, last)
    }
}

/// A well-mixed 64-bit value of `x` (SplitMix64's finaliser), for the faulty origin's dice.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
