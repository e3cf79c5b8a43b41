//! `[tls]`: the TLS listeners and the certificates they present.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ::config::{Value, ValueKind};

use super::check::{Ctx, Got, complete, push, read};
use super::raw::{Raw, RawCertificate, RawTls};
use super::server::ServerConfig;
use super::source::Path;
use crate::tls::{CertificateFiles, LoadedCertificate};

const CERTIFICATE_EXAMPLE: &str = "[[tls.certificates]] with cert_file = \
    \"/etc/rangeway/example.pem\" and key_file = \"/etc/rangeway/example.key\"";
/// A certificate expiring sooner than this is warned of.
const EXPIRES_SOON: Duration = Duration::from_secs(14 * 24 * 3600);

/// `[tls]`: listeners beside `server.listen`, and at least one certificate, each checked at load
/// (`crate::tls::load`); `default` is the one for clients that name no host it serves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TlsConfig {
    pub listen: Vec<SocketAddr>,
    pub h2: bool,
    pub certificates: Vec<TlsCertificate>,
    pub default: usize,
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
        (&self.listen, self.h2, self.default) == (&other.listen, other.h2, other.default)
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

/// `[tls]`; its listeners must not be `server`'s (when `[server]` could be read).
pub(super) fn check(
    v: &mut Ctx<'_>,
    raw: Option<&Raw<RawTls>>,
    server: Option<&ServerConfig>,
) -> Option<Option<TlsConfig>> {
    let Some(raw) = raw else { return Some(None) };
    let at = Path::default().key("tls");
    let r = v.table(&at, raw, "[tls] with listen = \"0.0.0.0:443\" and a [[tls.certificates]]")?;
    let listen = v.required(&at.key("listen"), r.listen.as_ref(), "add listen = \"0.0.0.0:443\"");
    let listen = listen.and_then(|value| check_listen(v, &at.key("listen"), value, server));
    read! { v, at, r; h2: boolean().or(true); }
    let fix = format!("add {CERTIFICATE_EXAMPLE}");
    let certificates = v.required(&at.key("certificates"), r.certificates.as_ref(), fix);
    let certificates =
        certificates.and_then(|raw| check_certificates(v, &at.key("certificates"), raw));
    let (certificates, default) = certificates.unzip();
    Some(complete! { TlsConfig { listen, h2, certificates, default } })
}

/// One address, or a list of them.
fn check_listen(
    v: &mut Ctx<'_>,
    at: &Path,
    value: &Value,
    server: Option<&ServerConfig>,
) -> Option<Vec<SocketAddr>> {
    let taken = server.map_or_else(Vec::new, |server| {
        vec![("server.listen", server.listen), ("server.admin_listen", server.admin_listen)]
    });
    let items = match &value.kind {
        ValueKind::Array(items) if items.is_empty() => {
            return v.fail(at, "is empty", "give at least one address, e.g. \"0.0.0.0:443\"");
        }
        ValueKind::Array(items) => {
            items.iter().enumerate().map(|(i, item)| (at.index(i), item)).collect()
        }
        _ => vec![(at.clone(), value)],
    };
    let (mut addrs, mut seen) = (Some(Vec::new()), Vec::new());
    for (at, item) in items {
        let addr = match v.socket_addr(&at, item, "0.0.0.0:443") {
            Got::Good(addr)
                if let Some((taken, _)) = taken.iter().find(|(_, other)| *other == addr) =>
            {
                v.fail(
                    &at,
                    format!("{addr} is {taken} already"),
                    "give the TLS listener an address of its own (e.g. port 443 beside 80)",
                )
            }
            Got::Good(addr) if seen.contains(&addr) => {
                v.fail(&at, format!("{addr} is listed twice"), "list each address once")
            }
            addr => addr.ok(),
        };
        seen.extend(addr);
        addrs = push(addrs, addr);
    }
    addrs
}

/// `[[tls.certificates]]`: each checked as a handshake would use it; the default one.
fn check_certificates(
    v: &mut Ctx<'_>,
    at: &Path,
    raw: &Raw<Vec<Raw<RawCertificate>>>,
) -> Option<(Vec<TlsCertificate>, usize)> {
    let fix = format!("write {CERTIFICATE_EXAMPLE}");
    let items = v.shaped(at, raw, "a non-empty list of certificates", &fix)?;
    if items.is_empty() {
        return v.fail(at, "expected a non-empty list of certificates", fix);
    }
    let read: Vec<_> =
        items.iter().enumerate().map(|(i, raw)| certificate(v, &at.index(i), raw)).collect();
    let (certificates, defaults): (Vec<_>, Vec<bool>) = read.into_iter().collect::<Option<_>>()?;
    let mut defaults = defaults.iter().enumerate().filter(|(_, default)| **default).map(|(i, _)| i);
    let first = defaults.next();
    if let (Some(first), Some(second)) = (first, defaults.next()) {
        return v.fail(
            &at.index(second).key("default"),
            format!("tls.certificates[{first}] is the default already"),
            "mark one certificate default = true",
        );
    }
    Some((certificates, first.unwrap_or(0)))
}

fn certificate(
    v: &mut Ctx<'_>,
    at: &Path,
    raw: &Raw<RawCertificate>,
) -> Option<(TlsCertificate, bool)> {
    let r = v.table(at, raw, CERTIFICATE_EXAMPLE)?;
    let mut file = |key: &str, value: &Option<Value>, extension: &str, required: bool| {
        let example = format!("\"/etc/rangeway/example.{extension}\"");
        match v.string(&at.key(key), value, &example) {
            Got::Absent if required => {
                v.fail(&at.key(key), "is missing", format!("add {key} = {example}"))
            }
            got => got.opt().map(|file| file.map(PathBuf::from)),
        }
    };
    let cert = file("cert_file", &r.cert_file, "pem", true);
    let key = file("key_file", &r.key_file, "key", true);
    let ocsp = file("ocsp_file", &r.ocsp_file, "ocsp", false);
    let is_default = v.boolean(&at.key("default"), &r.default).or(false);
    let (cert, key, ocsp, is_default) = (cert.flatten()?, key.flatten()?, ocsp?, is_default?);
    let files = CertificateFiles { cert, key, ocsp };
    match crate::tls::load(&files) {
        Ok(LoadedCertificate { names, not_after, .. }) => {
            Some((TlsCertificate { files, names, not_after }, is_default))
        }
        Err(error) => {
            let message = error.to_string();
            let (problem, fix) =
                message.split_once(" — ").unwrap_or((message.as_str(), "fix the file"));
            v.fail(at, problem, fix)
        }
    }
}
