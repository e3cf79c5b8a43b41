//! Origin URLs, `http(s)://host[:port][/base]`: what an HTTP upstream is reached at, and the
//! prefix of every path asked of it.

use super::host::{Host, split_host_port};
use super::{Problem, wrong};

/// How an upstream url is shown in examples.
pub(crate) const URL_EXAMPLE: &str = "\"http://127.0.0.1:9000\"";

/// A checked origin URL.
pub struct HttpUrl {
    pub tls: bool,
    pub host: Host,
    pub port: u16,
    /// `host[:port]` as written (host lower-cased, IPv6 in brackets), the default Host header.
    pub authority: String,
    pub base_path: String,
}

impl HttpUrl {
    /// Parses `http(s)://host[:port][/base]`. Credentials, query and fragment are refused: the
    /// first would be sent nowhere (and logged), the others cannot be prefixed to request paths.
    ///
    /// The url is not repeated in messages, as it might carry credentials.
    pub(crate) fn parse(text: &str) -> Result<Self, Problem> {
        let text = text.trim();
        let example = format!("write it as http(s)://HOST[:PORT][/BASE], e.g. {URL_EXAMPLE}");
        let Some((scheme, rest)) = text.split_once("://") else {
            let host = text.split(['/', ':']).next().unwrap_or("");
            return match !text.contains('@') && Host::parse(host).is_ok() {
                true => wrong(
                    "is not a URL (no scheme://)",
                    format!("add the scheme: \"http://{text}\""),
                ),
                false => wrong("is not a URL (no scheme://)", example),
            };
        };
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "http" => false,
            "https" => true,
            s if s.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) => {
                return wrong(
                    format!("the scheme {s}:// is not supported"),
                    "use http:// or https://; for a local folder use dir = \"...\" instead of url",
                );
            }
            _ => return wrong("the scheme is not supported", example),
        };
        let (rest, fragment) = rest.split_at(rest.find('#').unwrap_or(rest.len()));
        let (rest, query) = rest.split_at(rest.find('?').unwrap_or(rest.len()));
        let (authority, base) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if !fragment.is_empty() {
            return wrong("has a #fragment, which is never sent to a server", "remove it");
        } else if !query.is_empty() {
            return wrong(
                "has a ?query, which cannot be combined with request paths",
                "remove it; for credentials or signing use the upstream's own settings",
            );
        } else if authority.contains('@') {
            return wrong(
                "holds credentials (user:password@)",
                "remove them from the url; credentials in urls end up in logs",
            );
        }
        let (host, port) = split_host_port(authority).or_else(|e| wrong(e, example.clone()))?;
        let authority = port.map_or_else(|| host.to_string(), |port| format!("{host}:{port}"));
        let base_path = check_base_path(base).or_else(|e| wrong(e, example))?;
        let port = port.unwrap_or(if tls { 443 } else { 80 });
        Ok(Self { tls, port, host, authority, base_path })
    }
}

/// The url's path, used as a prefix of every upstream request path. It must be in normal form, or
/// the proxy's path normalisation could be undone by it: no `.`/`..` or empty segments, only valid
/// percent-escapes, no characters that need escaping.
fn check_base_path(base: &str) -> Result<String, String> {
    let trimmed = base.trim_end_matches('/');
    let segment = trimmed.split('/').skip(1).find(|s| matches!(*s, "" | "." | ".."));
    let bytes = trimmed.as_bytes();
    let escape =
        |i: usize| bytes.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
    let byte = bytes.iter().enumerate().find(|&(i, &b)| {
        !(b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@%".contains(&b))
            || (b == b'%' && !escape(i))
    });
    let problem = match (segment, byte) {
        (Some(""), _) => "the path has an empty segment (//)",
        (Some(_), _) => "the path has a '.' or '..' segment",
        (None, Some((_, b'%'))) => "the path has a '%' that is not followed by two hex digits",
        (None, Some(_)) => "the path has a character that must be percent-encoded",
        (None, None) => return Ok(trimmed.to_owned()),
    };
    Err(problem.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls() {
        let url = HttpUrl::parse("http://127.0.0.1:9000").map_err(|e| e.0).expect("valid");
        assert!(!url.tls);
        assert_eq!(
            (url.host.bare(), url.port, url.authority.as_str(), url.base_path.as_str()),
            ("127.0.0.1".into(), 9000, "127.0.0.1:9000", "")
        );

        let url = HttpUrl::parse("HTTPS://S3.Example.com/bucket/").map_err(|e| e.0).expect("valid");
        assert!(url.tls);
        assert_eq!(
            (url.host.bare(), url.port, url.authority.as_str(), url.base_path.as_str()),
            ("s3.example.com".into(), 443, "s3.example.com", "/bucket")
        );

        let url = HttpUrl::parse("http://[::1]:8000/a%20b/c").map_err(|e| e.0).expect("valid");
        assert_eq!(
            (url.host.bare(), url.port, url.authority.as_str(), url.base_path.as_str()),
            ("::1".into(), 8000, "[::1]:8000", "/a%20b/c")
        );

        let bad: &[(&str, &str)] = &[
            ("127.0.0.1:9000", "no scheme"),
            ("ftp://h", "scheme ftp:// is not supported"),
            ("s3://bucket", "scheme s3:// is not supported"),
            ("http://", "host is empty"),
            ("http://:80", "host is empty"),
            ("http://h:0", "port 0"),
            ("http://h:65536", "out of range"),
            ("http://h:x", "not a number"),
            ("http://h/a?x=1", "?query"),
            ("http://h/a#top", "#fragment"),
            ("http://u:p@h", "credentials"),
            ("http://h//a", "empty segment"),
            ("http://h/a/../b", "'..'"),
            ("http://h/a/./b", "'.'"),
            ("http://h/a%zz", "two hex digits"),
            ("http://h/a%2", "two hex digits"),
            ("http://h/a b", "percent-encoded"),
            ("http://h/a\\b", "percent-encoded"),
            ("http://h_.x-/", "starts or ends with '-'"),
        ];
        for &(text, want) in bad {
            let Err((problem, fix)) = HttpUrl::parse(text) else {
                panic!("{text:?} parsed");
            };
            assert!(problem.contains(want), "{text:?}: {problem}");
            assert!(!fix.is_empty());
        }
        let Err((_, fix)) = HttpUrl::parse("127.0.0.1:9000") else {
            panic!("parsed without scheme");
        };
        assert_eq!(fix, "add the scheme: \"http://127.0.0.1:9000\"");
    }

    #[test]
    fn url_errors_never_repeat_credentials() {
        for text in ["http://user:hunter2@h", "hunter2@h:1", "xx://hunter2@h", "ht tp://hunter2@h"]
        {
            let Err((problem, fix)) = HttpUrl::parse(text) else {
                panic!("{text:?} parsed");
            };
            assert!(!problem.contains("hunter2") && !fix.contains("hunter2"), "{text:?}");
        }
    }
}
