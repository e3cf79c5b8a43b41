//! What a URL names for a download: scheme, host, port and the request target.

use std::fmt;

use http::Uri;
use percent_encoding::percent_decode_str;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    tls: bool,
    /// As in the URL: an IPv6 address keeps its brackets.
    host: String,
    port: u16,
    /// Path and query, at least `/`.
    path: String,
    /// `user:password` from the URL, if any (proxy URLs).
    userinfo: Option<String>,
}

impl Target {
    /// An `http://` or `https://` URL; `None` with the reason otherwise.
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(format!("{url:?}: scheme {other:?} (http and https only)")),
            None => return Err(format!("{url:?} has no scheme: write http://{url}")),
        };
        let authority = uri.authority().ok_or_else(|| format!("{url:?} names no host"))?;
        let userinfo = authority.as_str().rsplit_once('@').map(|(info, _)| info.to_owned());
        let host = authority.host();
        if host.is_empty() {
            return Err(format!("{url:?} names no host"));
        }
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let path = if path.is_empty() { "/".to_owned() } else { path.to_owned() };
        Ok(Self { tls, host, port, path, userinfo })
    }

    /// Where `location` (a redirect's) points from here.
    pub(crate) fn join(&self, location: &str) -> Result<Self, String> {
        let scheme = if self.tls { "https" } else { "http" };
        if location.starts_with("http://") || location.starts_with("https://") {
            return Self::parse(location);
        }
        if let Some(rest) = location.strip_prefix("//") {
            return Self::parse(&format!("{scheme}://{rest}"));
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            let dir = self.path.split('?').next().unwrap_or("/");
            format!("{}{location}", &dir[..=dir.rfind('/').unwrap_or(0)])
        };
        Ok(Self { path, ..self.clone() })
    }

    pub(crate) fn tls(&self) -> bool {
        self.tls
    }

    pub(crate) fn host(&self) -> &str {
        &self.host
    }

    /// The host without IPv6 brackets: what TLS names (SNI) and DNS resolve.
    pub(crate) fn bare_host(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn userinfo(&self) -> Option<&str> {
        self.userinfo.as_deref()
    }

    /// `host` or `host:port` (the port only when not the scheme's own): the Host field.
    pub(crate) fn authority(&self) -> String {
        if self.port == if self.tls { 443 } else { 80 } {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The last segment of the path, percent-decoded: a file name for the download, when it
    /// makes one.
    pub(crate) fn file_name(&self) -> Option<String> {
        let path = self.path.split('?').next()?;
        let last = path.rsplit('/').next()?;
        let name = percent_decode_str(last).decode_utf8().ok()?;
        (!name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']))
            .then(|| name.into_owned())
    }
}

/// The URL, without its userinfo.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority(), self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_port_path_and_a_file_name() {
        let target = Target::parse("https://example.com/files/a%20b.iso?x=1").expect("parses");
        assert_eq!(
            (target.host(), target.port(), target.path()),
            ("example.com", 443, "/files/a%20b.iso?x=1")
        );
        assert_eq!(target.authority(), "example.com");
        assert_eq!(target.file_name().as_deref(), Some("a b.iso"));
        let v6 = Target::parse("http://[::1]:8080").expect("parses");
        assert_eq!((v6.host(), v6.bare_host(), v6.path()), ("[::1]", "::1", "/"));
        assert_eq!(v6.to_string(), "http://[::1]:8080/");
        assert_eq!(v6.file_name(), None);
        let proxy = Target::parse("http://u:p@proxy:3128").expect("parses");
        assert_eq!((proxy.userinfo(), proxy.host()), (Some("u:p"), "proxy"));
        assert!(Target::parse("ftp://x/y").is_err());
        assert!(Target::parse("example.com/x").is_err());
    }

    #[test]
    fn redirects_resolve_against_the_url_they_came_from() {
        let from = Target::parse("http://a:81/d/e/f?q").expect("parses");
        assert_eq!(from.join("g").expect("joins").to_string(), "http://a:81/d/e/g");
        assert_eq!(from.join("/g").expect("joins").to_string(), "http://a:81/g");
        assert_eq!(from.join("//b/g").expect("joins").to_string(), "http://b/g");
        assert_eq!(from.join("https://c/g").expect("joins").to_string(), "https://c/g");
    }
}
