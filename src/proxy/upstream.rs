//! Upstreams, built once from config, and the per-request peers they hand to pingora.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use pingora_core::protocols::tls::CaType;
use pingora_core::upstreams::peer::{HttpPeer, PeerOptions};
use pingora_core::utils::tls::{WrappedX509, parse_x509};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::RequestHeader;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::path::PathEncoding;
use crate::config::{Addressing, S3Upstream};
use crate::s3::sign::Signer;

/// How long a DNS answer is reused. pingora resolves `HttpPeer` addresses with a blocking call on
/// the event loop, so rangeway resolves names itself, off the loop, and keeps answers briefly.
const DNS_TTL: Duration = Duration::from_secs(30);

/// An origin rangeway forwards to.
#[derive(Debug)]
pub struct Upstream {
    name: String,
    target: Target,
    /// The authority sent as `Host`.
    host_header: String,
    /// Path prefix of every upstream request, encoded, without a trailing slash.
    base_path: String,
    timeouts: Timeouts,
    /// Set for an S3 upstream: its requests are signed.
    signer: Option<Signer>,
}

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Duration,
    pub write: Duration,
    pub idle: Duration,
}

#[derive(Debug)]
enum Target {
    Tcp {
        host: String,
        port: u16,
        tls: Option<Tls>,
        resolved: Mutex<Option<(SocketAddr, Instant)>>,
    },
    Unix(PathBuf),
}

struct Tls {
    sni: String,
    verify: bool,
    ca: Option<Arc<CaType>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("sni", &self.sni)
            .field("verify", &self.verify)
            .field("private_ca", &self.ca.is_some())
            .finish()
    }
}

/// TLS settings of an https upstream.
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// Server name sent and verified; the URL's host when `None`.
    pub sni: Option<String>,
    /// PEM bundle trusted instead of the system roots.
    pub ca_file: Option<PathBuf>,
    pub insecure_skip_verify: bool,
}

/// Why an upstream could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    #[error("cannot read the CA file {path}: {source}")]
    CaFileUnreadable { path: PathBuf, source: std::io::Error },
    #[error("the CA file {path} holds no usable PEM certificate")]
    CaFileEmpty { path: PathBuf },
    #[error("the CA file {path} holds a certificate that cannot be parsed")]
    CaFileInvalid { path: PathBuf },
}

impl Upstream {
    /// An http(s) origin at `host:port`.
    pub fn http(
        name: &str,
        host: &str,
        port: u16,
        tls: Option<TlsSettings>,
        host_header: String,
        base_path: &str,
        timeouts: Timeouts,
    ) -> Result<Self, UpstreamError> {
        let tls = match tls {
            None => None,
            Some(settings) => Some(Tls {
                sni: settings.sni.unwrap_or_else(|| {
                    host.trim_start_matches('[').trim_end_matches(']').to_owned()
                }),
                verify: !settings.insecure_skip_verify,
                ca: settings.ca_file.as_deref().map(load_ca).transpose()?,
            }),
        };
        Ok(Self {
            name: name.to_owned(),
            target: Target::Tcp { host: host.to_owned(), port, tls, resolved: Mutex::new(None) },
            host_header,
            base_path: base_path.trim_end_matches('/').to_owned(),
            timeouts,
            signer: None,
        })
    }

    /// An S3 bucket (or a folder of one): its endpoint, addressed by path or by virtual host, with
    /// every request signed.
    pub fn s3(name: &str, config: &S3Upstream, timeouts: Timeouts) -> Result<Self, UpstreamError> {
        let endpoint = &config.endpoint;
        let bucket = &config.bucket;
        let (host, host_header, sni, mut base_path) = match config.addressing {
            Addressing::Path => (
                endpoint.host.clone(),
                endpoint.host_header.clone(),
                endpoint.sni.clone(),
                format!("/{}", PathEncoding::S3.encode(bucket)),
            ),
            Addressing::VirtualHost => {
                // The name the certificate must cover is the bucket's own host, unless `sni`
                // was set to something else on purpose.
                let sni = match &endpoint.sni {
                    Some(sni) if *sni != endpoint.host => sni.clone(),
                    _ => format!("{bucket}.{}", endpoint.host),
                };
                (
                    format!("{bucket}.{}", endpoint.host),
                    format!("{bucket}.{}", endpoint.host_header),
                    Some(sni),
                    String::new(),
                )
            }
        };
        for segment in &config.key_prefix {
            base_path.push('/');
            base_path.push_str(&PathEncoding::S3.encode(segment).to_string());
        }
        let tls = endpoint.tls.then(|| TlsSettings {
            sni,
            ca_file: endpoint.ca_file.clone(),
            insecure_skip_verify: endpoint.insecure_skip_verify,
        });
        let mut upstream =
            Self::http(name, &host, endpoint.port, tls, host_header, &base_path, timeouts)?;
        upstream.signer = Some(Signer::new(&config.region, config.credentials.as_ref()));
        Ok(upstream)
    }

    /// An origin listening on a Unix socket (the `dir` origin runs on one).
    pub fn unix(name: &str, socket: PathBuf, timeouts: Timeouts) -> Self {
        Self {
            name: name.to_owned(),
            target: Target::Unix(socket),
            host_header: "localhost".to_owned(),
            base_path: String::new(),
            timeouts,
            signer: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn host_header(&self) -> &str {
        &self.host_header
    }

    pub fn base_path(&self) -> &str {
        &self.base_path
    }

    /// How request paths are written for this upstream.
    pub fn path_encoding(&self) -> PathEncoding {
        if self.signer.is_some() { PathEncoding::S3 } else { PathEncoding::Http }
    }

    /// Whether this is an S3 upstream.
    pub fn is_s3(&self) -> bool {
        self.signer.is_some()
    }

    /// The last step before `request` goes out: for an S3 upstream, the client's own
    /// authentication fields are dropped and the request is signed. Nothing for other upstreams.
    pub fn authorize(&self, request: &mut RequestHeader) -> Result<()> {
        let Some(signer) = &self.signer else {
            return Ok(());
        };
        signer.sign(request, SystemTime::now()).map_err(|e| {
            Error::because(ErrorType::InternalError, format!("upstream {}", self.name), e)
        })
    }

    /// A request for `target` (path and query) with this upstream's Host, ready for
    /// [`Upstream::authorize`].
    pub fn request(&self, method: &str, target: &str) -> Result<RequestHeader> {
        let mut request = RequestHeader::build(method, target.as_bytes(), Some(4))?;
        request.insert_header(http::header::HOST, self.host_header())?;
        Ok(request)
    }

    pub fn is_tls(&self) -> bool {
        matches!(&self.target, Target::Tcp { tls: Some(_), .. })
    }

    /// Whether certificate checks are off for this upstream (said loudly at start-up).
    pub fn skips_verification(&self) -> bool {
        matches!(&self.target, Target::Tcp { tls: Some(Tls { verify: false, .. }), .. })
    }

    /// The peer for one request. Peers with equal fields share pingora's connection pool.
    pub async fn peer(&self) -> Result<Box<HttpPeer>> {
        let mut peer = match &self.target {
            Target::Unix(path) => HttpPeer::new_uds(&path.to_string_lossy(), false, String::new())?,
            Target::Tcp { host, port, tls, resolved } => {
                let addr = self.resolve(host, *port, resolved).await?;
                let (is_tls, sni) = match tls {
                    Some(tls) => (true, tls.sni.clone()),
                    None => (false, String::new()),
                };
                let mut peer = HttpPeer::new(addr, is_tls, sni);
                if let Some(tls) = tls {
                    peer.options.verify_cert = tls.verify;
                    peer.options.verify_hostname = tls.verify;
                    peer.options.ca.clone_from(&tls.ca);
                }
                peer
            }
        };
        apply_timeouts(&mut peer.options, &self.timeouts);
        Ok(Box::new(peer))
    }

    async fn resolve(
        &self,
        host: &str,
        port: u16,
        cache: &Mutex<Option<(SocketAddr, Instant)>>,
    ) -> Result<SocketAddr> {
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse() {
            return Ok(SocketAddr::new(ip, port));
        }
        if let Some((addr, at)) = *cache.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < DNS_TTL
        {
            return Ok(addr);
        }
        let addr = tokio::net::lookup_host((host, port))
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| {
                Error::explain(
                    ErrorType::ConnectNoRoute,
                    format!("upstream {}: cannot resolve {host}", self.name),
                )
            })?;
        *cache.lock().unwrap_or_else(|p| p.into_inner()) = Some((addr, Instant::now()));
        Ok(addr)
    }
}

fn apply_timeouts(options: &mut PeerOptions, timeouts: &Timeouts) {
    options.connection_timeout = Some(timeouts.connect);
    options.total_connection_timeout = Some(timeouts.connect.saturating_mul(2));
    options.read_timeout = Some(timeouts.read);
    options.write_timeout = Some(timeouts.write);
    options.idle_timeout = Some(timeouts.idle);
}

/// Loads a PEM bundle of trusted certificates, checking each parses so that nothing can fail on it
/// once requests flow.
fn load_ca(path: &Path) -> Result<Arc<CaType>, UpstreamError> {
    let pem = std::fs::read(path)
        .map_err(|source| UpstreamError::CaFileUnreadable { path: path.to_owned(), source })?;
    let mut certs = Vec::new();
    for der in CertificateDer::pem_slice_iter(&pem) {
        let der = der.map_err(|_| UpstreamError::CaFileInvalid { path: path.to_owned() })?;
        // webpki parses the anchor; x509-parser (inside WrappedX509) is then known to succeed on it.
        let mut store = pingora_rustls::RootCertStore::empty();
        store
            .add(der.clone())
            .map_err(|_| UpstreamError::CaFileInvalid { path: path.to_owned() })?;
        if x509_parser::parse_x509_certificate(der.as_ref()).is_err() {
            return Err(UpstreamError::CaFileInvalid { path: path.to_owned() });
        }
        certs.push(WrappedX509::new(der.as_ref().to_vec(), parse_x509));
    }
    if certs.is_empty() {
        return Err(UpstreamError::CaFileEmpty { path: path.to_owned() });
    }
    Ok(Arc::from(certs.into_boxed_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HttpUpstream;

    fn store(addressing: Addressing, tls: bool) -> S3Upstream {
        S3Upstream {
            endpoint: HttpUpstream {
                tls,
                host: "s3.example.com".into(),
                port: 9000,
                base_path: String::new(),
                ca_file: None,
                insecure_skip_verify: false,
                sni: tls.then(|| "s3.example.com".into()),
                host_header: "s3.example.com:9000".into(),
            },
            bucket: "my-bucket".into(),
            region: "eu-west-1".into(),
            addressing,
            key_prefix: vec!["builds".into(), "a b+c".into()],
            credentials: None,
        }
    }

    #[test]
    fn s3_addressing() {
        let t = Duration::from_secs(1);
        let timeouts = Timeouts { connect: t, read: t, write: t, idle: t };
        let path = Upstream::s3("p", &store(Addressing::Path, false), timeouts).unwrap();
        assert_eq!(path.host_header(), "s3.example.com:9000");
        assert_eq!(path.base_path(), "/my-bucket/builds/a%20b%2Bc");
        assert_eq!(path.path_encoding(), PathEncoding::S3);
        assert!(path.is_s3());

        let host = Upstream::s3("v", &store(Addressing::VirtualHost, true), timeouts).unwrap();
        assert_eq!(host.host_header(), "my-bucket.s3.example.com:9000");
        assert_eq!(host.base_path(), "/builds/a%20b%2Bc");
        let Target::Tcp { host: name, tls: Some(tls), .. } = &host.target else {
            panic!("not TLS over TCP: {host:?}");
        };
        assert_eq!(
            (name.as_str(), tls.sni.as_str()),
            ("my-bucket.s3.example.com", "my-bucket.s3.example.com")
        );
    }
}
