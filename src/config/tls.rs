//! `[tls]`: the TLS listeners and the certificates they present.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::read::{Ctx, Field, Read, Table};
use super::server::ServerConfig;
use super::tree::{Kind, Node};
use crate::tls::{CertificateFiles, LoadedCertificate};

const EXAMPLE: &str = "[tls] with listen = \"0.0.0.0:443\" and a [[tls.certificates]]";
const CERTIFICATE_EXAMPLE: &str = "[[tls.certificates]] with cert_file = \"/etc/rangeway/example.pem\" and key_file = \"/etc/rangeway/example.key\"";
/// A certificate expiring sooner than this is warned of.
const EXPIRES_SOON: Duration = Duration::from_secs(14 * 24 * 3600);

/// `[tls]`, when there is one.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TlsConfig {
    /// The TLS listeners, beside `server.listen` (plain HTTP).
    pub listen: Vec<SocketAddr>,
    /// Whether HTTP/2 is offered (ALPN `h2`, then `http/1.1`). Default true.
    pub h2: bool,
    /// At least one; checked at load (see `crate::tls::load`).
    pub certificates: Vec<TlsCertificate>,
    /// Which of them clients get that name no host, or one no certificate serves.
    pub default: usize,
}

/// One certificate, as checked at load.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TlsCertificate {
    pub files: CertificateFiles,
    /// The DNS names it serves.
    pub names: Vec<String>,
    pub not_after: SystemTime,
}

impl PartialEq for TlsConfig {
    /// Equal when they would serve alike: the same listeners and files (a reload reads the files
    /// again whatever this says).
    fn eq(&self, other: &Self) -> bool {
        self.listen == other.listen
            && self.h2 == other.h2
            && self.default == other.default
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
        self.certificates
            .iter()
            .enumerate()
            .filter_map(|(index, certificate)| {
                let date = httpdate::fmt_http_date(certificate.not_after);
                let path = format!("tls.certificates[{index}]");
                let cert = certificate.files.cert.display();
                if certificate.not_after <= now {
                    Some(format!("{path}: {cert} expired on {date} — renew it; clients refuse it"))
                } else if certificate.not_after <= now + EXPIRES_SOON {
                    Some(format!("{path}: {cert} expires on {date} — renew it before then"))
                } else {
                    None
                }
            })
            .collect()
    }
}

/// `[tls]`; its listeners must not be `server`'s (when `[server]` could be read).
pub(super) fn read(
    ctx: &mut Ctx<'_>,
    node: Option<Node>,
    server: Option<&ServerConfig>,
) -> Read<Option<TlsConfig>> {
    let Some(node) = node else { return Ok(None) };
    let mut table = Table::new(ctx, "tls", "[tls]", node, EXAMPLE)?;
    let listen = match table.take("listen") {
        Some(field) => read_listen(ctx, field, server),
        None => Err(ctx.report_at("tls.listen", "is missing", "add listen = \"0.0.0.0:443\"")),
    };
    let h2 = table.take("h2").map_or(Ok(true), |f| f.boolean(ctx));
    let certificates = match table.take("certificates") {
        Some(field) => read_certificates(ctx, field),
        None => Err(ctx.report_at(
            "tls.certificates",
            "is missing",
            format!("add {CERTIFICATE_EXAMPLE}"),
        )),
    };
    table.finish(ctx);
    let (certificates, default) = certificates?;
    Ok(Some(TlsConfig { listen: listen?, h2: h2?, certificates, default }))
}

/// One address, or a list of them.
fn read_listen(
    ctx: &mut Ctx<'_>,
    field: Field,
    server: Option<&ServerConfig>,
) -> Read<Vec<SocketAddr>> {
    let taken = server.map_or_else(Vec::new, |server| {
        vec![("server.listen", server.listen), ("server.admin_listen", server.admin_listen)]
    });
    let Field { path, key, node } = field;
    let (items, listed) = match node.kind {
        Kind::Array(items) if !items.is_empty() => (items, true),
        Kind::Array(_) => {
            return Err(ctx.report(
                &path,
                &node.origin,
                "is empty",
                "give at least one address, e.g. \"0.0.0.0:443\"",
            ));
        }
        _ => (vec![node], false),
    };
    let mut addrs = Vec::new();
    let mut failed = None;
    for (index, item) in items.into_iter().enumerate() {
        let at = if listed { format!("{path}[{index}]") } else { path.clone() };
        let field = Field { path: at.clone(), key, node: item };
        match field.socket_addr(ctx, "0.0.0.0:443") {
            Ok(addr) if let Some((taken, _)) = taken.iter().find(|(_, other)| *other == addr) => {
                failed = Some(ctx.report_at(
                    &at,
                    format!("{addr} is {taken} already"),
                    "give the TLS listener an address of its own (e.g. port 443 beside 80)",
                ));
            }
            Ok(addr) if addrs.contains(&addr) => {
                failed = Some(ctx.report_at(
                    &at,
                    format!("{addr} is listed twice"),
                    "list each address once",
                ));
            }
            Ok(addr) => addrs.push(addr),
            Err(reported) => failed = Some(reported),
        }
    }
    match failed {
        Some(reported) => Err(reported),
        None => Ok(addrs),
    }
}

/// `[[tls.certificates]]`: each checked as a handshake would use it; the default one.
fn read_certificates(ctx: &mut Ctx<'_>, field: Field) -> Read<(Vec<TlsCertificate>, usize)> {
    let items = match field.node.kind {
        Kind::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(ctx.report(
                &field.path,
                &field.node.origin,
                "expected a non-empty list of certificates",
                format!("write {CERTIFICATE_EXAMPLE}"),
            ));
        }
    };
    let mut certificates = Vec::new();
    let mut defaults = Vec::new();
    let mut failed = None;
    for (index, item) in items.into_iter().enumerate() {
        let path = format!("tls.certificates[{index}]");
        let read = read_certificate(ctx, &path, item);
        match read {
            Ok((certificate, is_default)) => {
                if is_default {
                    defaults.push(index);
                }
                certificates.push(certificate);
            }
            Err(reported) => failed = Some(reported),
        }
    }
    if let Some(reported) = failed {
        return Err(reported);
    }
    if defaults.len() > 1 {
        return Err(ctx.report_at(
            &format!("tls.certificates[{}].default", defaults[1]),
            format!("tls.certificates[{}] is the default already", defaults[0]),
            "mark one certificate default = true",
        ));
    }
    Ok((certificates, defaults.first().copied().unwrap_or(0)))
}

fn read_certificate(ctx: &mut Ctx<'_>, path: &str, node: Node) -> Read<(TlsCertificate, bool)> {
    let mut table = Table::new(ctx, path, "[[tls.certificates]]", node, CERTIFICATE_EXAMPLE)?;
    let mut file = |ctx: &mut Ctx<'_>, key: &'static str, example: &str| {
        table.take(key).map(|f| f.string(ctx, example).map(PathBuf::from))
    };
    let cert = file(ctx, "cert_file", "\"/etc/rangeway/example.pem\"");
    let key = file(ctx, "key_file", "\"/etc/rangeway/example.key\"");
    let ocsp = file(ctx, "ocsp_file", "\"/etc/rangeway/example.ocsp\"").transpose();
    let is_default = table.take("default").map_or(Ok(false), |f| f.boolean(ctx));
    table.finish(ctx);
    let cert = cert.unwrap_or_else(|| {
        Err(ctx.report_at(
            &format!("{path}.cert_file"),
            "is missing",
            "add cert_file = \"/etc/rangeway/example.pem\"",
        ))
    });
    let key = key.unwrap_or_else(|| {
        Err(ctx.report_at(
            &format!("{path}.key_file"),
            "is missing",
            "add key_file = \"/etc/rangeway/example.key\"",
        ))
    });
    let files = CertificateFiles { cert: cert?, key: key?, ocsp: ocsp? };
    let is_default = is_default?;
    match crate::tls::load(&files) {
        Ok(LoadedCertificate { names, not_after, .. }) => {
            Ok((TlsCertificate { files, names, not_after }, is_default))
        }
        Err(error) => {
            let message = error.to_string();
            let (problem, fix) =
                message.split_once(" — ").unwrap_or((message.as_str(), "fix the file"));
            Err(ctx.report_at(path, problem, fix))
        }
    }
}
