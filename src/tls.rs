//! TLS termination: the certificates rangeway's TLS listeners present, chosen by the name the
//! client asks for (SNI), and replaced whole on a reload without touching connections in flight.
//!
//! pingora builds its rustls acceptor from files and panics on a bad one; rangeway loads and
//! checks every certificate itself — the chain parses, the key is one rustls can sign with and
//! matches the certificate — when the config is checked, and hands pingora a resolver of its own
//! ([`SniResolver`]) that picks among them at each handshake; the HTTP/3 listener's QUIC
//! handshakes (`crate::h3`) ask the very same resolver, so one reload serves both. [`TlsConfig`]
//! is what the config says of them, and warns of certificates about to expire.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use pingora_rustls::sign::CertifiedKey;
use pingora_rustls::{
    CertificateDer, ClientHello, CryptoProvider, PrivateKeyDer, ResolvesServerCert,
};

/// A certificate file, a key file must not be larger than this: a wrong path, not a PEM.
const MAX_PEM_BYTES: u64 = 1 << 20;
/// A certificate expiring sooner than this is warned of.
const EXPIRES_SOON: Duration = Duration::from_secs(14 * 24 * 3600);

/// Where one certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// PEM: the certificate, then the intermediates that chain it to a root.
    pub cert: PathBuf,
    /// PEM: its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// DER: an OCSP response to staple, when one is kept beside the certificate.
    pub ocsp: Option<PathBuf>,
}

/// Why a certificate cannot be used, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertificateError {
    #[error("{path}: {why} — point it at a readable PEM file")]
    Unreadable { path: String, why: String },
    #[error("{path} holds no certificate — give the PEM certificate chain, leaf first")]
    NoCertificate { path: String },
    #[error("{path}: the certificate cannot be read: {why}")]
    BadCertificate { path: String, why: String },
    #[error("{path} holds no private key — give the PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: String },
    #[error("{path}: the key cannot sign: {why} — use an RSA, ECDSA or Ed25519 key")]
    BadKey { path: String, why: String },
    #[error("{key} is not the key of {cert} — give the key the certificate was issued for")]
    KeyMismatch { cert: String, key: String },
    #[error(
        "{path} names no host (no DNS name in its subjectAltName) — issue it for the names it serves"
    )]
    NoNames { path: String },
}

/// A certificate, ready for handshakes.
#[derive(Debug, Clone)]
pub struct LoadedCertificate {
    key: Arc<CertifiedKey>,
    /// The DNS names of its subjectAltName, lower case; `*.example.com` for a wildcard.
    pub names: Vec<String>,
    /// When it stops being valid.
    pub not_after: SystemTime,
}

/// What the TLS listeners serve (`[tls]`, which `crate::config` checks and builds): listeners
/// beside `server.listen`, and at least one certificate, each checked by [`load`]; `default` is
/// the one for clients that name no host it serves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TlsConfig {
    pub listen: Vec<SocketAddr>,
    pub h2: bool,
    /// HTTP/3 on UDP beside each of `listen`, when on (`crate::h3`).
    pub h3: Option<H3Config>,
    pub certificates: Vec<TlsCertificate>,
    pub default: usize,
}

/// `[tls] h3`: HTTP/3's listeners and what a client may cost on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct H3Config {
    /// The port `Alt-Svc` names, where a balancer maps another to the listeners' (`None`: the
    /// first listener's).
    pub alt_svc_port: Option<u16>,
    /// Request streams a connection may have open at once.
    pub max_streams: u32,
    /// QUIC connections one address may have open (handshakes included).
    pub max_connections_per_client: u32,
    /// A connection with no packet for this long is closed.
    pub idle_timeout: Duration,
    /// Whether 0-RTT data is taken (then GET and HEAD only are answered before the handshake
    /// completes).
    pub early_data: bool,
    /// Past this many handshakes in flight, a new client proves its address first (Retry).
    pub retry_above_handshakes: u32,
}

impl Default for H3Config {
    fn default() -> Self {
        Self {
            alt_svc_port: None,
            max_streams: 100,
            max_connections_per_client: 64,
            idle_timeout: Duration::from_secs(30),
            early_data: false,
            retry_above_handshakes: 64,
        }
    }
}

/// One certificate, as checked at load: the DNS names it serves, and its expiry.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TlsCertificate {
    pub files: CertificateFiles,
    pub names: Vec<String>,
    pub not_after: SystemTime,
}

impl PartialEq for TlsConfig {
    /// Equal when they would serve alike: the same listeners and files (a reload reads the files
    /// again whatever this says).
    fn eq(&self, other: &Self) -> bool {
        (&self.listen, self.h2, &self.h3, self.default)
            == (&other.listen, other.h2, &other.h3, other.default)
            && self
                .certificates
                .iter()
                .map(|c| &c.files)
                .eq(other.certificates.iter().map(|c| &c.files))
    }
}

impl TlsConfig {
    /// What an operator should know before it bites: certificates expired, or expiring within
    /// two weeks of `now`.
    pub fn warnings(&self, now: SystemTime) -> Vec<String> {
        let certificates = self.certificates.iter().enumerate();
        let warnings = certificates.filter_map(|(index, certificate)| {
            let (date, cert) =
                (httpdate::fmt_http_date(certificate.not_after), certificate.files.cert.display());
            let path = format!("tls.certificates[{index}]");
            if certificate.not_after <= now {
                Some(format!("{path}: {cert} expired on {date} — renew it; clients refuse it"))
            } else {
                let soon = certificate.not_after <= now + EXPIRES_SOON;
                soon.then(|| format!("{path}: {cert} expires on {date} — renew it before then"))
            }
        });
        warnings.collect()
    }
}

/// Reads and checks one certificate: its chain parses, it names hosts, the key is one rustls can
/// sign with, and it is the certificate's.
pub fn load(files: &CertificateFiles) -> Result<LoadedCertificate, CertificateError> {
    pingora_rustls::install_default_crypto_provider();
    let cert_path = files.cert.display().to_string();
    let key_path = files.key.display().to_string();
    let chain: Vec<CertificateDer<'static>> = pem_items(&files.cert)?
        .into_iter()
        .filter_map(|item| match item {
            rustls_pemfile::Item::X509Certificate(cert) => Some(cert),
            _ => None,
        })
        .collect();
    let leaf =
        chain.first().ok_or_else(|| CertificateError::NoCertificate { path: cert_path.clone() })?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|e| {
        CertificateError::BadCertificate { path: cert_path.clone(), why: e.to_string() }
    })?;
    let names: Vec<String> = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    x509_parser::extensions::GeneralName::DNSName(dns) => {
                        Some(dns.to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        return Err(CertificateError::NoNames { path: cert_path });
    }
    let not_after = SystemTime::UNIX_EPOCH
        + std::time::Duration::from_secs(
            u64::try_from(parsed.validity().not_after.timestamp()).unwrap_or(0),
        );
    let key: PrivateKeyDer<'static> = pem_items(&files.key)?
        .into_iter()
        .find_map(|item| match item {
            rustls_pemfile::Item::Pkcs8Key(key) => Some(PrivateKeyDer::from(key)),
            rustls_pemfile::Item::Pkcs1Key(key) => Some(PrivateKeyDer::from(key)),
            rustls_pemfile::Item::Sec1Key(key) => Some(PrivateKeyDer::from(key)),
            _ => None,
        })
        .ok_or_else(|| CertificateError::NoKey { path: key_path.clone() })?;
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| CertificateError::BadKey { path: key_path.clone(), why: e.to_string() })?;
    let mut certified = CertifiedKey::new(chain, signing);
    if let Err(pingora_rustls::RusTlsError::InconsistentKeys(why)) = certified.keys_match()
        && why != rustls::InconsistentKeys::Unknown
    {
        return Err(CertificateError::KeyMismatch { cert: cert_path, key: key_path });
    }
    if let Some(ocsp) = &files.ocsp {
        certified.ocsp = Some(read(ocsp)?);
    }
    Ok(LoadedCertificate { key: Arc::new(certified), names, not_after })
}

fn read(path: &Path) -> Result<Vec<u8>, CertificateError> {
    use std::io::Read as _;
    let unreadable =
        |why: String| CertificateError::Unreadable { path: path.display().to_string(), why };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_PEM_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| unreadable(e.to_string()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(unreadable(format!("larger than {} KiB", MAX_PEM_BYTES / 1024)));
    }
    Ok(bytes)
}

fn pem_items(path: &Path) -> Result<Vec<rustls_pemfile::Item>, CertificateError> {
    let bytes = read(path)?;
    rustls_pemfile::read_all(&mut bytes.as_slice()).collect::<Result<Vec<_>, _>>().map_err(|e| {
        CertificateError::BadCertificate { path: path.display().to_string(), why: e.to_string() }
    })
}

/// The certificates of the TLS listeners, by the names they serve.
#[derive(Debug)]
pub struct Certificates {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the name a wildcard stands for the first label of (`example.com` for
    /// `*.example.com`).
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    /// For clients that name no host, or one no certificate serves.
    default: Arc<CertifiedKey>,
}

impl Certificates {
    /// The certificates `loaded` (at least one); `default` is the one for clients that name no
    /// host or one none serves. A name two certificates serve goes to the first.
    pub fn new(loaded: &[LoadedCertificate], default: usize) -> Option<Self> {
        let default = Arc::clone(&loaded.get(default).or_else(|| loaded.first())?.key);
        let (mut exact, mut wildcard) = (HashMap::new(), HashMap::new());
        for certificate in loaded {
            for name in &certificate.names {
                match name.strip_prefix("*.") {
                    Some(parent) => wildcard.entry(parent.to_owned()),
                    None => exact.entry(name.clone()),
                }
                .or_insert_with(|| Arc::clone(&certificate.key));
            }
        }
        Some(Self { exact, wildcard, default })
    }

    /// The certificate for a client that asked for `name`.
    fn choose(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = name.map(str::to_ascii_lowercase) else {
            return Arc::clone(&self.default);
        };
        let found = self.exact.get(&name).or_else(|| {
            let (_, parent) = name.split_once('.')?;
            self.wildcard.get(parent)
        });
        Arc::clone(found.unwrap_or(&self.default))
    }
}

/// Picks the certificate of each handshake by its SNI; [`SniResolver::replace`] swaps them all
/// for handshakes to come (connections already made keep theirs).
#[derive(Debug)]
pub struct SniResolver(RwLock<Arc<Certificates>>);

impl SniResolver {
    pub fn new(certificates: Certificates) -> Self {
        Self(RwLock::new(Arc::new(certificates)))
    }

    pub fn replace(&self, certificates: Certificates) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(certificates);
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let certificates =
            Arc::clone(&self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner));
        Some(certificates.choose(hello.server_name()))
    }
}
