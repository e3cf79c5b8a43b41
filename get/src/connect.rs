//! Connections to an origin: straight, or through the proxy the usual environment variables
//! name (`http_proxy`, `https_proxy`, `all_proxy`, `no_proxy`; upper case too), with TLS
//! (rustls, the system's roots plus `--cacert`) for https; over QUIC (HTTP/3, h3.rs) to an https
//! origin reached straight, when asked (`--http3`) or once the origin advertised it (`Alt-Svc`).

use std::collections::HashMap;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use rustls::pki_types::ServerName;

use crate::http1::{self, Head, Request};
use crate::stream::Stream;
use crate::url::Target;

/// The proxies the environment names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Proxies {
    http: Option<Target>,
    https: Option<Target>,
    /// Hosts (and their subdomains) reached directly; `*` for all.
    no_proxy: Vec<String>,
}

impl Proxies {
    /// From variables read by `var` (lower case first, as curl): a proxy URL that does not
    /// parse is an error naming the variable.
    pub(crate) fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let read = |name: &str| {
            var(name).or_else(|| var(&name.to_ascii_uppercase())).filter(|v| !v.trim().is_empty())
        };
        let proxy = |name: &str| -> Result<Option<Target>, String> {
            match read(name) {
                None => Ok(None),
                Some(url) => {
                    let url = if url.contains("://") { url } else { format!("http://{url}") };
                    Target::parse(&url).map(Some).map_err(|e| format!("{name}: {e}"))
                }
            }
        };
        let all = proxy("all_proxy")?;
        let no_proxy = read("no_proxy")
            .map(|list| {
                list.split(',')
                    .map(|host| host.trim().trim_start_matches('.').to_ascii_lowercase())
                    .filter(|host| !host.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            http: proxy("http_proxy")?.or_else(|| all.clone()),
            https: proxy("https_proxy")?.or(all),
            no_proxy,
        })
    }

    /// The proxy for `target`, if it goes through one.
    pub(crate) fn for_target(&self, target: &Target) -> Option<&Target> {
        let host = target.bare_host().to_ascii_lowercase();
        let direct = self.no_proxy.iter().any(|entry| {
            entry == "*"
                || host == *entry
                || host.strip_suffix(entry.as_str()).is_some_and(|sub| sub.ends_with('.'))
        });
        if direct {
            return None;
        }
        if target.tls() { self.https.as_ref() } else { self.http.as_ref() }
    }
}

/// A connection to an origin, over HTTP/1.1 or HTTP/3: one exchange at a time.
pub(crate) enum Connection {
    H1(http1::Connection),
    H3(Box<crate::h3::Connection>),
}

impl Connection {
    /// Sends `request` and reads the head of its final response.
    pub(crate) fn send(&mut self, request: &Request<'_>) -> io::Result<Head> {
        match self {
            Self::H1(connection) => connection.send(request),
            Self::H3(connection) => connection.send(request),
        }
    }

    /// Reads body bytes into `buf`: 0 at the body's end; a body cut short is an error.
    pub(crate) fn read_body(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::H1(connection) => connection.read_body(buf),
            Self::H3(connection) => connection.read_body(buf),
        }
    }

    /// Whether the last body was read to its end on a connection that may carry the next.
    pub(crate) fn reusable(&self) -> bool {
        match self {
            Self::H1(connection) => connection.reusable(),
            Self::H3(connection) => connection.reusable(),
        }
    }
}

/// Makes connections, the same way for every request of a download.
pub(crate) struct Connector {
    tls: Arc<rustls::ClientConfig>,
    /// TLS 1.3 offering `h3`, for QUIC.
    h3_tls: Arc<rustls::ClientConfig>,
    proxies: Proxies,
    timeout: Duration,
    /// `--http3`: every https connection over QUIC.
    http3: bool,
    /// The HTTP/3 port each origin (host, port) advertised.
    advertised: Mutex<HashMap<(String, u16), u16>>,
}

impl Connector {
    /// TLS trusting the system's roots and the certificates in `ca_file`; `timeout` for
    /// connecting and for every read and write.
    pub(crate) fn new(
        ca_file: Option<&Path>,
        proxies: Proxies,
        timeout: Duration,
    ) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        // Unreadable system certificates are skipped: `--cacert` may be all there is.
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(path) = ca_file {
            let pem =
                std::fs::read(path).map_err(|e| format!("--cacert {}: {e}", path.display()))?;
            let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("--cacert {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!("--cacert {}: no PEM certificate in it", path.display()));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| format!("--cacert {}: {e}", path.display()))?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut h3 = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        h3.alpn_protocols = vec![b"h3".to_vec()];
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            tls: Arc::new(config),
            h3_tls: Arc::new(h3),
            proxies,
            timeout,
            http3: false,
            advertised: Mutex::default(),
        })
    }

    /// The same, over HTTP/3 for every https connection (`--http3`).
    pub(crate) fn with_http3(mut self, http3: bool) -> Self {
        self.http3 = http3;
        self
    }

    fn advertised(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16), u16>> {
        self.advertised.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes the HTTP/3 port `head`'s `Alt-Svc` advertises for `target`'s origin: its next
    /// connections go over QUIC.
    pub(crate) fn note_alt_svc(&self, target: &Target, head: &Head) {
        let port = head.all("alt-svc").find_map(crate::h3::advertised_port);
        if let Some(port) = port.filter(|_| target.tls()) {
            self.advertised().insert((target.bare_host().to_owned(), target.port()), port);
        }
    }

    /// The port to reach `target` over QUIC at, when it is to be: an https origin reached
    /// straight (QUIC does not go through an HTTP proxy), asked for or advertised.
    fn h3_port(&self, target: &Target) -> Option<u16> {
        if !target.tls() || self.proxies.for_target(target).is_some() {
            return None;
        }
        if self.http3 {
            return Some(target.port());
        }
        self.advertised().get(&(target.bare_host().to_owned(), target.port())).copied()
    }

    /// A connection for requests to `target`.
    pub(crate) fn connect(&self, target: &Target) -> io::Result<Connection> {
        if self.http3 && !target.tls() {
            return Err(io::Error::other(format!("{target}: HTTP/3 is for https URLs only")));
        }
        if self.http3 && self.proxies.for_target(target).is_some() {
            let why = "HTTP/3 cannot go through the proxy the environment names (set no_proxy)";
            return Err(io::Error::other(format!("{target}: {why}")));
        }
        if let Some(port) = self.h3_port(target) {
            match crate::h3::Connection::connect(&self.h3_tls, target, port, self.timeout) {
                Ok(connection) => return Ok(Connection::H3(Box::new(connection))),
                Err(e) if self.http3 => return Err(e),
                // Advertised but not reachable (UDP blocked on the way): TCP, from now on.
                Err(_) => {
                    self.advertised().remove(&(target.bare_host().to_owned(), target.port()));
                }
            }
        }
        let Some(proxy) = self.proxies.for_target(target) else {
            let tcp = self.tcp(target)?;
            return Ok(Connection::H1(http1::Connection::new(self.secure(target, tcp)?, false)));
        };
        let tcp = self.tcp(proxy)?;
        let authorization = proxy.userinfo().map(|info| {
            let info = percent_encoding::percent_decode_str(info).decode_utf8_lossy();
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(info.as_bytes()))
        });
        if !target.tls() {
            // A plain-HTTP proxy takes requests in absolute form; its credentials go with each.
            let mut connection = http1::Connection::new(Stream::Plain(tcp), true);
            connection.set_proxy_authorization(authorization);
            return Ok(Connection::H1(connection));
        }
        let mut tunnel = http1::Connection::new(Stream::Plain(tcp), false);
        let authority = format!("{}:{}", target.host(), target.port());
        let headers: Vec<(String, String)> =
            authorization.into_iter().map(|a| ("Proxy-Authorization".to_owned(), a)).collect();
        let answer = tunnel.connect_tunnel(&authority, &headers)?;
        if !(200..300).contains(&answer) {
            return Err(io::Error::other(format!(
                "the proxy {proxy} refused the tunnel to {authority}: {answer}"
            )));
        }
        let Stream::Plain(tcp) = tunnel.into_stream() else { unreachable!("made plain above") };
        Ok(Connection::H1(http1::Connection::new(self.secure(target, tcp)?, false)))
    }

    fn tcp(&self, target: &Target) -> io::Result<TcpStream> {
        let mut last = None;
        for addr in (target.bare_host(), target.port()).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, self.timeout) {
                Ok(tcp) => {
                    tcp.set_read_timeout(Some(self.timeout))?;
                    tcp.set_write_timeout(Some(self.timeout))?;
                    tcp.set_nodelay(true)?;
                    return Ok(tcp);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::other(format!("{} resolves to no address", target.host()))
        }))
    }

    fn secure(&self, target: &Target, tcp: TcpStream) -> io::Result<Stream> {
        if !target.tls() {
            return Ok(Stream::Plain(tcp));
        }
        let name = ServerName::try_from(target.bare_host().to_owned())
            .map_err(|e| io::Error::other(format!("{}: {e}", target.host())))?;
        let tls =
            rustls::ClientConnection::new(self.tls.clone(), name).map_err(io::Error::other)?;
        Ok(Stream::Tls(Box::new(rustls::StreamOwned::new(tls, tcp))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn proxies_come_from_the_usual_variables_and_no_proxy_goes_direct() {
        let proxies = Proxies::from_env(env(&[
            ("http_proxy", "http://p:3128"),
            ("HTTPS_PROXY", "s:3129"),
            ("no_proxy", "localhost, .internal.example"),
        ]))
        .expect("parses");
        let of = |url: &str| {
            proxies.for_target(&Target::parse(url).expect("a URL")).map(ToString::to_string)
        };
        assert_eq!(of("http://example.com/a").as_deref(), Some("http://p:3128/"));
        assert_eq!(of("https://example.com/a").as_deref(), Some("http://s:3129/"));
        assert_eq!(of("http://localhost:8080/a"), None);
        assert_eq!(of("http://x.internal.example/a"), None);
        assert_eq!(of("http://notinternal.example/a").as_deref(), Some("http://p:3128/"));
        let bad = Proxies::from_env(env(&[("https_proxy", "ftp://x")]));
        assert!(bad.is_err_and(|e| e.starts_with("https_proxy")));
        let all = Proxies::from_env(env(&[("ALL_PROXY", "http://a:1"), ("NO_PROXY", "*")]))
            .expect("parses");
        assert_eq!(all.for_target(&Target::parse("http://b/").expect("a URL")), None);
    }
}
