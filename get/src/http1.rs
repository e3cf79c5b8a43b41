//! HTTP/1.1 on one connection: a request out, a response head in, its body read by its framing
//! (Content-Length, chunked, or to the close), and whether the connection may be used again.
//!
//! A download client needs exactly this much, and to see every byte count: a body that ends
//! before its length is an error here, never a clean end.

use std::io::{self, BufRead, BufReader, Read, Write};

use crate::stream::Stream;
use crate::url::Target;

/// The most a response head may take.
const MAX_HEAD: usize = 64 << 10;
const MAX_HEADERS: usize = 128;

/// A response's status and header fields (names lowercased, in order).
#[derive(Clone, Debug, Default)]
pub(crate) struct Head {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of `name` (lowercase).
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Every value of `name` (lowercase), in order.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers.iter().filter(move |(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// A head of another protocol's (HTTP/3's), from its fields.
    pub(crate) fn from_fields<'a>(
        status: u16,
        fields: impl Iterator<Item = (&'a str, String)>,
    ) -> Self {
        let headers = fields.map(|(name, value)| (name.to_ascii_lowercase(), value)).collect();
        Self { status, headers }
    }

    #[cfg(test)]
    pub(crate) fn new(status: u16, headers: &[(&str, &str)]) -> Self {
        let headers = headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), (*v).to_owned()));
        Self { status, headers: headers.collect() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// No body, or read to its end.
    Done,
    Length(u64),
    /// Bytes left of the current chunk (0: a chunk-size line comes next).
    Chunked(u64),
    UntilClose,
}

/// A connection to one origin (or through one proxy), one exchange at a time.
pub(crate) struct Connection {
    reader: BufReader<Stream>,
    /// Requests go in absolute form (a plain-HTTP proxy).
    absolute_form: bool,
    /// Sent with every request in absolute form: the proxy's credentials.
    proxy_authorization: Option<String>,
    body: Body,
    keep_alive: bool,
}

/// A request: its method, target, header fields beyond Host, and body (sent with its length
/// when there is one).
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    pub(crate) target: &'a Target,
    pub(crate) headers: &'a [(String, String)],
    pub(crate) body: &'a [u8],
}

impl Connection {
    pub(crate) fn new(stream: Stream, absolute_form: bool) -> Self {
        Self {
            reader: BufReader::with_capacity(64 << 10, stream),
            absolute_form,
            proxy_authorization: None,
            body: Body::Done,
            keep_alive: false,
        }
    }

    pub(crate) fn set_proxy_authorization(&mut self, value: Option<String>) {
        self.proxy_authorization = value;
    }

    /// Asks a proxy for a tunnel to `authority` (`host:port`): the answer's status.
    pub(crate) fn connect_tunnel(
        &mut self,
        authority: &str,
        headers: &[(String, String)],
    ) -> io::Result<u16> {
        let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        self.reader.get_mut().write_all(head.as_bytes())?;
        Ok(read_head(&mut self.reader)?.status)
    }

    /// The connection's stream, for a tunnel's TLS (nothing is buffered: the origin speaks only
    /// after the client's hello).
    pub(crate) fn into_stream(self) -> Stream {
        self.reader.into_inner()
    }

    /// Sends `request` and reads the head of its final response (interim 1xx skipped).
    pub(crate) fn send(&mut self, request: &Request<'_>) -> io::Result<Head> {
        let target = request.target;
        let path = if self.absolute_form { target.to_string() } else { target.path().to_owned() };
        let mut head =
            format!("{} {path} HTTP/1.1\r\nHost: {}\r\n", request.method, target.authority());
        if let Some(credentials) = self.proxy_authorization.as_ref().filter(|_| self.absolute_form)
        {
            head.push_str(&format!("Proxy-Authorization: {credentials}\r\n"));
        }
        for (name, value) in request.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !request.body.is_empty() {
            head.push_str(&format!("Content-Length: {}\r\n", request.body.len()));
        }
        head.push_str("\r\n");
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(request.body)?;
        stream.flush()?;
        let response = loop {
            let response = read_head(&mut self.reader)?;
            if !(100..200).contains(&response.status) || response.status == 101 {
                break response;
            }
        };
        self.keep_alive = !response
            .all("connection")
            .flat_map(|v| v.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("close"));
        self.body = framing(request.method, &response)?;
        Ok(response)
    }

    /// Reads body bytes into `buf`: 0 at the body's end. A connection closed before the body's
    /// declared end is an `UnexpectedEof` error.
    pub(crate) fn read_body(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.body == Body::UntilClose {
            // Such a body ends the connection with it.
            self.keep_alive = false;
        }
        read_body(&mut self.reader, &mut self.body, buf)
    }

    /// Whether the last body was read to its end on a connection the server keeps open.
    pub(crate) fn reusable(&self) -> bool {
        self.keep_alive && matches!(self.body, Body::Done | Body::Length(0))
    }
}

fn framing(method: &str, head: &Head) -> io::Result<Body> {
    if method == "HEAD" || matches!(head.status, 204 | 304) {
        return Ok(Body::Done);
    }
    let chunked = head
        .all("transfer-encoding")
        .flat_map(|v| v.split(','))
        .last()
        .is_some_and(|coding| coding.trim().eq_ignore_ascii_case("chunked"));
    if chunked {
        return Ok(Body::Chunked(0));
    }
    let mut lengths = head.all("content-length").flat_map(|v| v.split(',')).map(str::trim);
    match lengths.next() {
        None => Ok(Body::UntilClose),
        Some(first) => {
            let length: u64 =
                first.parse().map_err(|_| invalid(format!("Content-Length {first:?}")))?;
            if lengths.any(|other| other != first) {
                return Err(invalid("Content-Length fields that disagree".into()));
            }
            Ok(Body::Length(length))
        }
    }
}

fn read_body(reader: &mut impl BufRead, body: &mut Body, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match *body {
            Body::Done => return Ok(0),
            Body::Length(0) => {
                *body = Body::Done;
                return Ok(0);
            }
            Body::Length(left) => {
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let read = reader.read(&mut buf[..want])?;
                if read == 0 {
                    return Err(cut(format!("the body ended {left} bytes early")));
                }
                *body = Body::Length(left - read as u64);
                return Ok(read);
            }
            Body::Chunked(0) => {
                let size = read_chunk_size(reader)?;
                if size == 0 {
                    read_trailers(reader)?;
                    *body = Body::Done;
                    return Ok(0);
                }
                *body = Body::Chunked(size);
            }
            Body::Chunked(left) => {
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let read = reader.read(&mut buf[..want])?;
                if read == 0 {
                    return Err(cut("the chunked body ended early".into()));
                }
                let left = left - read as u64;
                if left == 0 {
                    expect_crlf(reader)?;
                }
                *body = Body::Chunked(left);
                return Ok(read);
            }
            Body::UntilClose => {
                let read = match reader.read(buf) {
                    // A TLS peer that closes without close_notify ends such a body too.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => 0,
                    read => read?,
                };
                if read == 0 {
                    *body = Body::Done;
                }
                return Ok(read);
            }
        }
    }
}

fn read_head(reader: &mut impl BufRead) -> io::Result<Head> {
    let mut raw = Vec::with_capacity(1024);
    loop {
        let before = raw.len();
        let read =
            reader.by_ref().take((MAX_HEAD - raw.len()) as u64 + 1).read_until(b'\n', &mut raw)?;
        if read == 0 {
            return Err(cut(if before == 0 {
                "the connection closed before an answer".into()
            } else {
                "the connection closed within the answer's head".into()
            }));
        }
        if raw.len() > MAX_HEAD {
            return Err(invalid(format!("a response head over {MAX_HEAD} bytes")));
        }
        if raw.ends_with(b"\n\n") || raw.ends_with(b"\r\n\r\n") {
            break;
        }
    }
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut fields);
    match response.parse(&raw) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(invalid("an incomplete response head".into())),
        Err(e) => return Err(invalid(format!("a response head that does not parse: {e}"))),
    }
    let status = response.code.unwrap_or_default();
    let headers = response
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).trim().to_owned()))
        .collect();
    Ok(Head { status, headers })
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    reader.by_ref().take(4097).read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\n") {
        return Err(if line.len() > 4096 {
            invalid("a chunk line over 4 KiB".into())
        } else {
            cut("the chunked body ended early".into())
        });
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_owned())
}

fn read_chunk_size(reader: &mut impl BufRead) -> io::Result<u64> {
    let line = read_line(reader)?;
    let size = line.split(';').next().unwrap_or_default().trim();
    u64::from_str_radix(size, 16).map_err(|_| invalid(format!("a chunk size {size:?}")))
}

fn read_trailers(reader: &mut impl BufRead) -> io::Result<()> {
    while !read_line(reader)?.is_empty() {}
    Ok(())
}

fn expect_crlf(reader: &mut impl BufRead) -> io::Result<()> {
    if read_line(reader)?.is_empty() {
        Ok(())
    } else {
        Err(invalid("chunk data longer than its size".into()))
    }
}

fn cut(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, message)
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_of(head_and_body: &str, method: &str) -> io::Result<Vec<u8>> {
        let mut reader = BufReader::new(head_and_body.as_bytes());
        let head = read_head(&mut reader)?;
        let mut body = framing(method, &head)?;
        let (mut out, mut buf) = (Vec::new(), [0; 3]);
        loop {
            let read = read_body(&mut reader, &mut body, &mut buf)?;
            if read == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..read]);
        }
    }

    #[test]
    fn bodies_are_read_by_their_framing() {
        let length = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA";
        assert_eq!(body_of(length, "GET").expect("read"), b"hello");
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nhell\r\n1\r\no\r\n0\r\nT: v\r\n\r\n";
        assert_eq!(body_of(chunked, "GET").expect("read"), b"hello");
        let close = "HTTP/1.1 200 OK\r\n\r\nhello";
        assert_eq!(body_of(close, "GET").expect("read"), b"hello");
        assert_eq!(body_of(length, "HEAD").expect("read"), b"");
    }

    #[test]
    fn a_body_cut_short_or_framed_badly_is_an_error_not_an_end() {
        let short = "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello";
        assert_eq!(body_of(short, "GET").map_err(|e| e.kind()), Err(io::ErrorKind::UnexpectedEof));
        let chunk_cut = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nhello";
        assert!(body_of(chunk_cut, "GET").is_err());
        let two = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!";
        assert_eq!(body_of(two, "GET").map_err(|e| e.kind()), Err(io::ErrorKind::InvalidData));
        let head_cut = "HTTP/1.1 200 OK\r\nContent-Len";
        assert!(read_head(&mut BufReader::new(head_cut.as_bytes())).is_err());
    }

    #[test]
    fn heads_keep_every_field_lowercased() {
        let text =
            "HTTP/1.1 206 Partial Content\r\nETag: \"a\"\r\nDigest: x=1\r\ndigest: y=2\r\n\r\n";
        let head = read_head(&mut BufReader::new(text.as_bytes())).expect("parses");
        assert_eq!(head.status, 206);
        assert_eq!(head.get("etag"), Some("\"a\""));
        assert_eq!(head.all("digest").collect::<Vec<_>>(), ["x=1", "y=2"]);
    }
}
