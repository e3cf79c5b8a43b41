//! Upstreams, built once from config, and the per-request peers they hand to pingora.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::HeaderValue;
use pingora_core::protocols::tls::CaType;
use pingora_core::upstreams::peer::{HttpPeer, PeerOptions};
use pingora_core::utils::tls::{WrappedX509, parse_x509};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::RequestHeader;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::request_path::PathEncoding;
use crate::s3::credentials::S3Credentials;
use crate::s3::sign::Signer;
use crate::values::host::{Host, split_host_port};
use crate::values::http_url::HttpUrl;
use crate::values::small_file::read_small_file;
use crate::values::{Problem, wrong};

/// How long a DNS answer is reused. pingora resolves `HttpPeer` addresses with a blocking call on
/// the event loop, so rangeway resolves names itself, off the loop, and keeps answers briefly.
const DNS_TTL: Duration = Duration::from_secs(30);

/// One `[upstreams.NAME]`. The timeouts apply to `dir` upstreams too, whose origin service is
/// reached over a local socket.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamConfig {
    /// `[A-Za-z0-9_-]+`, as routes name it.
    pub name: String,
    pub kind: UpstreamKind,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub idle_timeout: Duration,
    pub health_check: Option<HealthCheck>,
}

/// A `GET` of `path` every `interval`, answered 2xx within `timeout` by a replica that is up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
}

impl HealthCheck {
    /// A health check's `path`: what a request line can carry after `GET`.
    pub(crate) fn path(path: &str) -> Result<String, Problem> {
        if path.starts_with('/') && path.bytes().all(|b| b.is_ascii_graphic() && b != b'#') {
            return Ok(path.to_owned());
        }
        let fix = "write a path starting with '/', e.g. path = \"/healthz\"";
        wrong(format!("{path:?} is not a request path"), fix)
    }
}

/// An origin over HTTP(S) (`url`), a local folder (`dir`), an S3-compatible store (`url` with
/// `bucket`), or replicas of one origin (`urls`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamKind {
    Http(HttpUpstream),
    Dir { path: PathBuf },
    S3(S3Upstream),
    Replicas(Vec<HttpUpstream>),
}

/// An HTTP(S) origin. `ca_file`, `insecure_skip_verify` and `sni` are only ever set with `tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpUpstream {
    pub tls: bool,
    /// A DNS name (lower case) or an IP address; IPv6 without brackets.
    pub host: String,
    pub port: u16,
    /// Prefix of every upstream path: empty, or `/`-led without a trailing `/` (`/bucket`).
    pub base_path: String,
    pub ca_file: Option<PathBuf>,
    /// Verification off, whatever `ca_file` says: the proxy must log this loudly.
    pub insecure_skip_verify: bool,
    /// `sni` if set, else the url's host when that is a DNS name (SNI cannot carry IP literals,
    /// RFC 6066; the certificate is then checked against the IP).
    pub sni: Option<String>,
    /// `host_header` if set, else the url's authority as written.
    pub host_header: String,
}

/// The TLS keys of an upstream, which apply to its https urls.
#[derive(Debug, Default)]
pub(crate) struct UpstreamTls {
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) insecure_skip_verify: bool,
    /// `sni`, when it is set.
    pub(crate) sni: Option<String>,
}

impl HttpUpstream {
    /// The upstream `url` names, with the TLS keys that apply to it when it is https.
    pub(crate) fn new(url: HttpUrl, tls: &UpstreamTls, host_header: Option<String>) -> Self {
        let name = url.host.is_name().then(|| url.host.bare());
        Self {
            tls: url.tls,
            sni: tls.sni.clone().or(name).filter(|_| url.tls),
            ca_file: tls.ca_file.clone().filter(|_| url.tls),
            insecure_skip_verify: tls.insecure_skip_verify && url.tls,
            host: url.host.bare(),
            port: url.port,
            base_path: url.base_path,
            host_header: host_header.unwrap_or(url.authority),
        }
    }

    /// A `ca_file` that holds PEM certificates; `load_ca` parses them when the upstream is built.
    pub(crate) fn ca_file(file: &str) -> Result<PathBuf, Problem> {
        // CA bundles are a few hundred KiB; the cap only stops a mistyped path to a huge file
        // from being read whole.
        let problem = match read_small_file(file, 16 << 20) {
            Err(problem) => problem,
            Ok(pem) if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") => {
                format!("{file:?} holds no PEM certificate (no -----BEGIN CERTIFICATE----- line)")
            }
            Ok(_) => return Ok(PathBuf::from(file)),
        };
        wrong(problem, "point ca_file at a readable PEM file of CA certificates")
    }

    /// An `sni`: a DNS name, as SNI cannot carry an IP address (RFC 6066).
    pub(crate) fn sni(text: &str) -> Result<String, Problem> {
        match Host::parse(text) {
            Ok(Host::Name(name)) => Ok(name),
            Ok(_) => wrong(
                format!("{text:?} is an IP address, which SNI cannot carry (RFC 6066)"),
                "use a DNS name, or remove sni to send none",
            ),
            Err(e) => wrong(
                format!("{text:?} is not a DNS name: {e}"),
                "write a DNS name, e.g. sni = \"origin.example.com\"",
            ),
        }
    }

    /// A `host_header`: a host and an optional port, which are header-safe ASCII once valid.
    pub(crate) fn host_header(text: &str) -> Result<String, Problem> {
        match split_host_port(text) {
            Ok(_) => Ok(text.to_owned()),
            Err(e) => wrong(
                format!("{text:?} is not a host[:port]: {e}"),
                "write a host with an optional port, e.g. host_header = \"files.example.com\"",
            ),
        }
    }
}

/// An S3-compatible origin, whose requests rangeway signs (AWS Signature V4).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Upstream {
    pub endpoint: HttpUpstream,
    pub bucket: String,
    pub region: String,
    pub addressing: Addressing,
    /// The folder of the bucket the routes serve, as segments; none for the whole bucket.
    pub key_prefix: Vec<String>,
    /// `None` for `anonymous = true`.
    pub credentials: Option<S3Credentials>,
}

/// Where the bucket goes: `https://endpoint/bucket/key` or `https://bucket.endpoint/key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressing {
    Path,
    VirtualHost,
}

/// An origin rangeway forwards to: one server, or replicas holding the same objects.
#[derive(Debug)]
pub struct Upstream {
    name: String,
    replicas: Vec<Replica>,
    /// The next replica round-robin starts from.
    next: AtomicUsize,
    /// Path prefix of every upstream request, encoded, without a trailing slash.
    base_path: String,
    timeouts: Timeouts,
    /// Set for an S3 upstream: its requests are signed.
    signer: Option<Signer>,
    health_check: Option<HealthCheck>,
    /// Milliseconds since the Unix epoch when the next health check is due.
    next_check: AtomicU64,
}

/// One server of an upstream.
#[derive(Debug)]
struct Replica {
    target: Target,
    /// The authority sent as `Host`.
    /// Ready to send: every request to this replica carries it.
    host_header: HeaderValue,
    /// Milliseconds since the Unix epoch until which it gets no requests while another replica
    /// is up: after a failure, for [`PASSIVE_DOWN`]; after a failed health check, until one
    /// passes (`u64::MAX`).
    down_until: AtomicU64,
}

/// How long a replica that failed a request (a connection, a 5xx) is passed over.
pub const PASSIVE_DOWN: Duration = Duration::from_secs(10);

/// One server of a replicated upstream, as [`Upstream::replicas`] takes it.
#[derive(Debug, Clone)]
pub struct ReplicaSpec {
    pub host: String,
    pub port: u16,
    pub tls: Option<TlsSettings>,
    pub host_header: String,
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
    #[error("the Host header {value:?} holds bytes a header value cannot")]
    HostHeader { value: String },
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
        let spec = ReplicaSpec { host: host.to_owned(), port, tls, host_header };
        Self::replicas(name, vec![spec], base_path, timeouts)
    }

    /// Replicas of one origin, each at `host:port`, sharing `base_path`.
    pub fn replicas(
        name: &str,
        specs: Vec<ReplicaSpec>,
        base_path: &str,
        timeouts: Timeouts,
    ) -> Result<Self, UpstreamError> {
        let replicas = specs
            .into_iter()
            .map(|spec| {
                let ReplicaSpec { host, port, tls, host_header } = spec;
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
                let target = Target::Tcp { host, port, tls, resolved: Mutex::new(None) };
                let host_header = HeaderValue::from_str(&host_header)
                    .map_err(|_| UpstreamError::HostHeader { value: host_header })?;
                Ok(Replica { target, host_header, down_until: AtomicU64::new(0) })
            })
            .collect::<Result<Vec<_>, UpstreamError>>()?;
        Ok(Self {
            name: name.to_owned(),
            replicas,
            next: AtomicUsize::new(0),
            base_path: base_path.trim_end_matches('/').to_owned(),
            timeouts,
            signer: None,
            health_check: None,
            next_check: AtomicU64::new(0),
        })
    }

    /// Probes the replicas in the background (see `health`).
    pub fn with_health_check(mut self, health_check: Option<HealthCheck>) -> Self {
        self.health_check = health_check;
        self
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
            replicas: vec![Replica {
                target: Target::Unix(socket),
                host_header: HeaderValue::from_static("localhost"),
                down_until: AtomicU64::new(0),
            }],
            next: AtomicUsize::new(0),
            base_path: String::new(),
            timeouts,
            signer: None,
            health_check: None,
            next_check: AtomicU64::new(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `Host` sent to `replica`.
    pub fn host_header(&self, replica: usize) -> &HeaderValue {
        &self.replica(replica).host_header
    }

    fn replica(&self, index: usize) -> &Replica {
        // Every upstream has at least one replica; an index from another table wraps.
        &self.replicas[index % self.replicas.len()]
    }

    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    pub fn health_check(&self) -> Option<&HealthCheck> {
        self.health_check.as_ref()
    }

    /// Whether a health check is due now; if so, the next one is scheduled an interval later.
    pub fn health_check_due(&self) -> bool {
        let Some(check) = &self.health_check else {
            return false;
        };
        let now = unix_millis();
        let next = now.saturating_add(check.interval.as_millis() as u64);
        self.next_check
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |due| (due <= now).then_some(next))
            .is_ok()
    }

    /// The replica for the next request: round-robin over those that are up, or over all when
    /// none is.
    pub fn choose(&self) -> usize {
        let count = self.replicas.len();
        if count == 1 {
            return 0;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let now = unix_millis();
        (0..count)
            .map(|offset| (start + offset) % count)
            .find(|&index| self.replicas[index].down_until.load(Ordering::Relaxed) <= now)
            .unwrap_or(start)
    }

    /// `replica` failed a request: passed over for [`PASSIVE_DOWN`], unless a failed health
    /// check holds it down already.
    pub fn failed(&self, replica: usize) {
        if self.replicas.len() == 1 {
            return;
        }
        let until = unix_millis().saturating_add(PASSIVE_DOWN.as_millis() as u64);
        let _ = self.replica(replica).down_until.fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |current| (current != u64::MAX).then_some(current.max(until)),
        );
    }

    /// A request could not be sent to `replica` (nothing reached it): marks it failed, counts
    /// the try in `tried`, and says whether another replica may take the request — each replica
    /// is tried once at most. The one rule of failover, for the relay's first request and the
    /// origin client's alike; the next replica is [`Self::choose`]'s.
    pub fn retry_elsewhere(&self, replica: usize, tried: &mut usize) -> bool {
        self.failed(replica);
        *tried += 1;
        *tried < self.replicas.len()
    }

    /// The outcome of a health check of `replica`.
    pub fn checked(&self, replica: usize, healthy: bool) {
        let down_until = if healthy { 0 } else { u64::MAX };
        self.replica(replica).down_until.store(down_until, Ordering::Relaxed);
    }

    /// Whether `replica` gets requests now.
    pub fn is_up(&self, replica: usize) -> bool {
        self.replica(replica).down_until.load(Ordering::Relaxed) <= unix_millis()
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

    /// Whether `path` (an upstream path, without query) names no object of this S3 upstream but
    /// its bucket (or key prefix) itself, whose GET S3 answers with a listing of keys.
    pub fn names_no_s3_object(&self, path: &str) -> bool {
        self.is_s3()
            && path
                .strip_prefix(self.base_path.as_str())
                .is_some_and(|key| key.trim_matches('/').is_empty())
    }

    /// The last step before `request` goes out: for an S3 upstream, the client's own
    /// authentication fields are dropped and the request is signed. Nothing for other upstreams.
    /// Called once a request, as it goes out: a signature is a few HMACs, and one computed
    /// before the last field is set covers the wrong request (logged at debug, one line a
    /// signature, so that each request can be seen signed once).
    pub fn authorize(&self, request: &mut RequestHeader) -> Result<()> {
        let Some(signer) = &self.signer else {
            return Ok(());
        };
        signer.sign(request, SystemTime::now()).map_err(|e| {
            Error::because(ErrorType::InternalError, format!("upstream {}", self.name), e)
        })?;
        tracing::debug!(upstream = %self.name, path = %request.uri, "signed an S3 request");
        Ok(())
    }

    /// A request for `target` (path and query) with `replica`'s Host, ready for
    /// [`Upstream::authorize`].
    pub fn request(&self, method: &str, target: &str, replica: usize) -> Result<RequestHeader> {
        let mut request = RequestHeader::build(method, target.as_bytes(), Some(4))?;
        request.insert_header(http::header::HOST, self.host_header(replica).clone())?;
        Ok(request)
    }

    pub fn is_tls(&self) -> bool {
        self.replicas.iter().any(|r| matches!(&r.target, Target::Tcp { tls: Some(_), .. }))
    }

    /// Whether certificate checks are off for this upstream (said loudly at start-up).
    pub fn skips_verification(&self) -> bool {
        self.replicas
            .iter()
            .any(|r| matches!(&r.target, Target::Tcp { tls: Some(Tls { verify: false, .. }), .. }))
    }

    /// The peer for one request to `replica`. Peers with equal fields share pingora's connection
    /// pool.
    pub async fn peer(&self, replica: usize) -> Result<Box<HttpPeer>> {
        let mut peer = match &self.replica(replica).target {
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

fn unix_millis() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
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
        assert_eq!(path.host_header(0), "s3.example.com:9000");
        assert_eq!(path.base_path(), "/my-bucket/builds/a%20b%2Bc");
        assert_eq!(path.path_encoding(), PathEncoding::S3);
        assert!(path.is_s3());

        let host = Upstream::s3("v", &store(Addressing::VirtualHost, true), timeouts).unwrap();
        assert_eq!(host.host_header(0), "my-bucket.s3.example.com:9000");
        assert_eq!(host.base_path(), "/builds/a%20b%2Bc");
        let Target::Tcp { host: name, tls: Some(tls), .. } = &host.replicas[0].target else {
            panic!("not TLS over TCP: {host:?}");
        };
        assert_eq!(
            (name.as_str(), tls.sni.as_str()),
            ("my-bucket.s3.example.com", "my-bucket.s3.example.com")
        );
    }
}
