//! Reading multipart/byteranges bodies, so answers from two servers can be compared part by part
//! (boundaries and the optional preamble differ between servers; the parts must not).

use super::http::Response;

/// One part: its Content-Range and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) content_range: String,
    pub(crate) body: Vec<u8>,
}

/// The parts of a multipart/byteranges response; panics when the body is malformed.
pub(crate) fn parts(response: &Response) -> Vec<Part> {
    let content_type = response.header("content-type").unwrap_or_default();
    let boundary = content_type
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))
        .unwrap_or_else(|| panic!("no boundary in {content_type:?}"))
        .trim_matches('"');
    let delimiter = format!("--{boundary}");
    let body = &response.body;
    let mut parts = Vec::new();
    let mut at = find(body, delimiter.as_bytes(), 0).expect("a first delimiter");
    loop {
        at += delimiter.len();
        if body[at..].starts_with(b"--") {
            return parts;
        }
        assert!(body[at..].starts_with(b"\r\n"), "delimiter not followed by CRLF");
        at += 2;
        let head_end = find(body, b"\r\n\r\n", at).expect("part headers end");
        let head = String::from_utf8_lossy(&body[at..head_end]).to_string();
        let content_range = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-range").then(|| value.trim().to_owned())
            })
            .unwrap_or_else(|| panic!("part without Content-Range: {head:?}"));
        let data_start = head_end + 4;
        let next =
            find(body, format!("\r\n{delimiter}").as_bytes(), data_start).expect("next delimiter");
        parts.push(Part { content_range, body: body[data_start..next].to_vec() });
        at = next + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack[from..].windows(needle.len()).position(|w| w == needle).map(|p| p + from)
}
