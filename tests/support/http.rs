//! A raw HTTP/1.1 client that shows exactly what a server sent: status, every header in order,
//! the body as framed on the wire, and whether the framing was complete.
//!
//! Real HTTP client libraries fix up what tests need to see (they merge headers, follow
//! redirects, hide chunking, turn a short body into an error without the bytes), so the
//! comparisons between nginx and rangeway go through this instead.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// A server that sends nothing for this long has failed the test.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A request without a body (rangeway and the test origins only serve GET and HEAD).
#[derive(Clone, Debug)]
pub(crate) struct RawRequest {
    pub(crate) method: String,
    /// The request target as sent: `/path?query`.
    pub(crate) target: String,
    /// Sent in this order and spelling. A `Host` header is added when absent.
    pub(crate) headers: Vec<(String, String)>,
}

impl RawRequest {
    pub(crate) fn new(method: &str, target: &str) -> RawRequest {
        RawRequest { method: method.to_owned(), target: target.to_owned(), headers: Vec::new() }
    }

    pub(crate) fn get(target: &str) -> RawRequest {
        RawRequest::new("GET", target)
    }

    pub(crate) fn head(target: &str) -> RawRequest {
        RawRequest::new("HEAD", target)
    }

    /// Adds a header (builder style).
    pub(crate) fn header(mut self, name: &str, value: &str) -> RawRequest {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    fn has_header(&self, name: &str) -> bool {
        self.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// A response as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) reason: String,
    /// In the order received; names lowercased, values with surrounding whitespace trimmed.
    pub(crate) headers: Vec<(String, String)>,
    /// The body with any chunked framing removed.
    pub(crate) body: Vec<u8>,
    /// The body came with `Transfer-Encoding: chunked`.
    pub(crate) chunked: bool,
    /// The body's framing was complete: all of Content-Length, or the last chunk. False when the
    /// server closed or reset the connection early; `body` then holds what did arrive. A body
    /// delimited by the connection's close is always complete, having no length to fall short of.
    pub(crate) complete: bool,
    /// The interim responses before it (`103 Early Hints`, `100 Continue`...): each status and
    /// its fields, as `headers`.
    pub(crate) interim: Vec<(u16, Vec<(String, String)>)>,
}

impl Response {
    /// The first value of header `name` (any case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// Every value of header `name` (any case), in order.
    pub(crate) fn headers_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
            .collect()
    }
}

/// Sends one request on a new connection with `Connection: close` and reads the response.
///
/// Errors are connection failures, timeouts and unparseable responses; a body cut short is not
/// an error but a response with `complete == false`.
pub(crate) fn request(addr: SocketAddr, request: &RawRequest) -> io::Result<Response> {
    let mut connection = Connection::open(addr)?;
    let mut request = request.clone();
    if !request.has_header("connection") {
        request.headers.push(("Connection".to_owned(), "close".to_owned()));
    }
    connection.send(&request)
}

/// GET `url` (`http://host:port/path`) with `headers`; panics on any error but a short body,
/// naming the URL.
pub(crate) fn get(url: &str, headers: &[(&str, &str)]) -> Response {
    send("GET", url, headers)
}

/// HEAD `url` with `headers`, as [`get`].
pub(crate) fn head(url: &str, headers: &[(&str, &str)]) -> Response {
    send("HEAD", url, headers)
}

/// GET `url` without headers; `None` on any connection error, for tests that count failures.
pub(crate) fn try_get(url: &str) -> Option<Response> {
    let (authority, target) = split_url(url);
    let addr = authority.to_socket_addrs().ok()?.next()?;
    request(addr, &RawRequest::get(target).header("Host", authority)).ok()
}

fn send(method: &str, url: &str, headers: &[(&str, &str)]) -> Response {
    let (authority, target) = split_url(url);
    let addr = authority
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("cannot resolve {authority} in {url}"));
    let mut raw = RawRequest::new(method, target).header("Host", authority);
    for (name, value) in headers {
        raw = raw.header(name, value);
    }
    request(addr, &raw).unwrap_or_else(|err| panic!("{method} {url}: {err}"))
}

/// GETs `url` until `done` holds for the answer, for up to 5 s; returns the last answer.
///
/// rangeway records a request (metrics, the download's state, what its stages learned) in its
/// logging phase, after the response went out: a test that reads what the request left behind
/// waits for it.
pub(crate) fn get_until(url: &str, done: impl Fn(&Response) -> bool) -> Response {
    until(|| get(url, &[]), done)
}

/// HEADs `url` until `done` holds for the answer, as [`get_until`].
pub(crate) fn head_until(url: &str, done: impl Fn(&Response) -> bool) -> Response {
    until(|| head(url, &[]), done)
}

fn until(send: impl Fn() -> Response, done: impl Fn(&Response) -> bool) -> Response {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let response = send();
        if done(&response) || std::time::Instant::now() > deadline {
            return response;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn split_url(url: &str) -> (&str, &str) {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("the raw client speaks plain http only, not {url}"));
    match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, "/"),
    }
}

/// A persistent connection, for sending several requests in turn (keep-alive tests).
#[derive(Debug)]
pub(crate) struct Connection {
    reader: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Connection {
    pub(crate) fn open(addr: SocketAddr) -> io::Result<Connection> {
        let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Connection { reader: BufReader::new(stream), addr })
    }

    /// A connection from `source` (another loopback address, say: a second client on the same
    /// machine) to `addr`, whose first bytes are `preface` (a PROXY protocol header, say).
    pub(crate) fn open_from(
        source: IpAddr,
        addr: SocketAddr,
        preface: &[u8],
    ) -> io::Result<Connection> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.bind(&SocketAddr::new(source, 0).into())?;
        socket.connect_timeout(&addr.into(), CONNECT_TIMEOUT)?;
        let mut stream = TcpStream::from(socket);
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.set_nodelay(true)?;
        stream.write_all(preface)?;
        Ok(Connection { reader: BufReader::new(stream), addr })
    }

    /// The connection's socket, for what the requests above do not do: reading to its close.
    pub(crate) fn stream(&mut self) -> &mut TcpStream {
        self.reader.get_mut()
    }

    /// Sends `request` as given (plus `Host` when absent) and reads its response.
    pub(crate) fn send(&mut self, request: &RawRequest) -> io::Result<Response> {
        let head = self.head(request);
        self.reader.get_mut().write_all(head.as_bytes())?;
        read_response(&mut self.reader, &request.method)
    }

    /// Sends `request` and reads only its response's status: the body is left unread, so the
    /// response stays under way on the proxy's side (once the socket buffers are full) until
    /// this connection is dropped.
    pub(crate) fn start(&mut self, request: &RawRequest) -> io::Result<u16> {
        let head = self.head(request);
        self.reader.get_mut().write_all(head.as_bytes())?;
        Ok(read_head(&mut self.reader)?.0)
    }

    /// Sends every request at once, before reading any answer (HTTP/1.1 pipelining), then reads
    /// their responses in order.
    pub(crate) fn pipeline(&mut self, requests: &[RawRequest]) -> io::Result<Vec<Response>> {
        let heads: String = requests.iter().map(|request| self.head(request)).collect();
        self.reader.get_mut().write_all(heads.as_bytes())?;
        requests.iter().map(|request| read_response(&mut self.reader, &request.method)).collect()
    }

    /// Sends `head` (a request line and header fields, as they go on the wire, with the blank
    /// line) exactly, and reads the response to a request of `method`.
    pub(crate) fn send_raw(&mut self, method: &str, head: &str) -> io::Result<Response> {
        self.reader.get_mut().write_all(head.as_bytes())?;
        read_response(&mut self.reader, method)
    }

    /// Sends `bytes` as they are, reading nothing: a request begun, or one whose answer
    /// [`Connection::send_raw`] with nothing more to send reads later.
    pub(crate) fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.reader.get_mut().write_all(bytes)
    }

    /// Whether the server closes the connection within `within`, sending nothing more.
    pub(crate) fn closed_within(&mut self, within: Duration) -> io::Result<bool> {
        self.reader.get_mut().set_read_timeout(Some(within))?;
        let mut byte = [0u8; 1];
        let read = self.reader.read(&mut byte);
        self.reader.get_mut().set_read_timeout(Some(IO_TIMEOUT))?;
        match read {
            Ok(0) => Ok(true),
            Ok(_) => Err(invalid("bytes after the response".to_owned())),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(true),
            Err(e) => Err(e),
        }
    }

    fn head(&self, request: &RawRequest) -> String {
        let mut head = format!("{} {} HTTP/1.1\r\n", request.method, request.target);
        if !request.has_header("host") {
            head.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (name, value) in &request.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        head
    }
}

fn read_response(reader: &mut impl BufRead, method: &str) -> io::Result<Response> {
    let mut interim = Vec::new();
    let (status, reason, headers) = loop {
        let (status, reason, headers) = read_head(reader)?;
        // Interim responses (100 Continue, 103 Early Hints) precede the real one; 101 ends HTTP.
        if !(100..200).contains(&status) || status == 101 {
            break (status, reason, headers);
        }
        interim.push((status, headers));
    };
    let mut response = Response {
        status,
        reason,
        headers,
        body: Vec::new(),
        chunked: false,
        complete: true,
        interim,
    };
    // RFC 9112 section 6.3: these never have a body, whatever their headers say.
    if method.eq_ignore_ascii_case("HEAD") || status < 200 || status == 204 || status == 304 {
        return Ok(response);
    }
    let chunked = response
        .headers_all("transfer-encoding")
        .iter()
        .flat_map(|value| value.split(','))
        .next_back()
        .is_some_and(|coding| coding.trim().eq_ignore_ascii_case("chunked"));
    if chunked {
        response.chunked = true;
        response.complete = read_chunked(reader, &mut response.body)?;
    } else if let Some(length) = content_length(&response)? {
        response.complete = read_up_to(reader, &mut response.body, length)?;
    } else {
        read_until_close(reader, &mut response.body)?;
    }
    Ok(response)
}

type Head = (u16, String, Vec<(String, String)>);

fn read_head(reader: &mut impl BufRead) -> io::Result<Head> {
    let status_line = read_line(reader)?.ok_or_else(|| {
        io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before a response")
    })?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let status = parts.next().and_then(|code| code.parse::<u16>().ok());
    let (true, Some(status)) = (version.starts_with("HTTP/1."), status) else {
        return Err(invalid(format!("bad status line {status_line:?}")));
    };
    let reason = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader)?
            .ok_or_else(|| invalid("connection closed inside the response headers".to_owned()))?;
        if line.is_empty() {
            return Ok((status, reason, headers));
        }
        let (name, value) =
            line.split_once(':').ok_or_else(|| invalid(format!("bad header line {line:?}")))?;
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
}

/// One line without its CRLF (or bare LF); `None` at a clean end of stream.
fn read_line(reader: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line)? == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
}

fn content_length(response: &Response) -> io::Result<Option<u64>> {
    let mut length = None;
    for value in response.headers_all("content-length") {
        let parsed =
            value.parse::<u64>().map_err(|_| invalid(format!("bad Content-Length {value:?}")))?;
        if length.is_some_and(|seen| seen != parsed) {
            return Err(invalid("conflicting Content-Length headers".to_owned()));
        }
        length = Some(parsed);
    }
    Ok(length)
}

/// Reads `length` bytes into `body`; false if the connection ended first.
fn read_up_to(reader: &mut impl BufRead, body: &mut Vec<u8>, length: u64) -> io::Result<bool> {
    let mut remaining = length;
    while remaining > 0 {
        let available = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) if cut_short(&err) => return Ok(false),
            Err(err) => return Err(err),
        };
        if available.is_empty() {
            return Ok(false);
        }
        let take = available.len().min(usize::try_from(remaining).unwrap_or(usize::MAX));
        body.extend_from_slice(&available[..take]);
        reader.consume(take);
        remaining -= take as u64;
    }
    Ok(true)
}

/// Decodes a chunked body into `body`; false if the connection ended before the last chunk.
/// Trailer fields are read and dropped.
fn read_chunked(reader: &mut impl BufRead, body: &mut Vec<u8>) -> io::Result<bool> {
    loop {
        let line = match read_line(reader) {
            Ok(Some(line)) => line,
            Ok(None) => return Ok(false),
            Err(err) if cut_short(&err) => return Ok(false),
            Err(err) => return Err(err),
        };
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = u64::from_str_radix(size_text, 16)
            .map_err(|_| invalid(format!("bad chunk size line {line:?}")))?;
        if size == 0 {
            loop {
                match read_line(reader) {
                    Ok(Some(trailer)) if trailer.is_empty() => return Ok(true),
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(false),
                    Err(err) if cut_short(&err) => return Ok(false),
                    Err(err) => return Err(err),
                }
            }
        }
        if !read_up_to(reader, body, size)? {
            return Ok(false);
        }
        match read_line(reader) {
            Ok(Some(end)) if end.is_empty() => {}
            Ok(Some(end)) => return Err(invalid(format!("chunk not followed by CRLF: {end:?}"))),
            Ok(None) => return Ok(false),
            Err(err) if cut_short(&err) => return Ok(false),
            Err(err) => return Err(err),
        }
    }
}

fn read_until_close(reader: &mut impl BufRead, body: &mut Vec<u8>) -> io::Result<()> {
    match reader.read_to_end(body) {
        Ok(_) => Ok(()),
        // A reset after the data is how some servers end a close-delimited body.
        Err(err) if cut_short(&err) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Errors that mean the peer ended the connection, as opposed to a timeout or garbage.
fn cut_short(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}
