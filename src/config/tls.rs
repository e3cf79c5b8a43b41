//! `[tls]`: the TLS listeners and the certificates they present.

use std::net::SocketAddr;
use std::path::PathBuf;

use ::config::{Value, ValueKind};

use super::check::{Ctx, complete, read, secs, wrong};
use super::raw::{Raw, RawCertificate, RawH3, RawTls};
use super::server::ServerConfig;
use super::source::Path;
use crate::tls::{CertificateFiles, H3Config, LoadedCertificate, TlsCertificate, TlsConfig};
use crate::values::listen_addr;

const CERTIFICATE_EXAMPLE: &str = "[[tls.certificates]] with cert_file = \
    \"/etc/rangeway/example.pem\" and key_file = \"/etc/rangeway/example.key\"";

/// `[tls]`; its listeners must not be `server`'s (when `[server]` could be read).
pub(super) fn check(
    v: &mut Ctx<'_>,
    at: &Path,
    raw: &Raw<RawTls>,
    server: Option<&ServerConfig>,
) -> Option<TlsConfig> {
    let r = v.table(at, raw, "[tls] with listen = \"0.0.0.0:443\" and a [[tls.certificates]]")?;
    let no_certificate = format!("add {CERTIFICATE_EXAMPLE}");
    read! { v, at, r;
        listen: nested(|v, at, value| check_listen(v, at, value, server))
            .need(v, &at.key("listen"), "add listen = \"0.0.0.0:443\"");
        h2: boolean().or(true);
        h3: switch(false, "[tls.h3] with max_streams = 100", check_h3);
        certificates: nested(check_certificates).need(v, &at.key("certificates"), no_certificate);
    }
    let (certificates, default) = certificates.unzip();
    complete! { TlsConfig { listen, h2, h3, certificates, default } }
}

/// `[tls] h3`: `true` (the defaults below), `false` (off, the default) or a table of them.
fn check_h3(v: &mut Ctx<'_>, at: &Path, r: &RawH3) -> Option<H3Config> {
    let d = H3Config::default();
    read! { v, at, r;
        alt_svc_port: integer(1..=u16::MAX, "443").opt();
        max_streams: integer(1..=10_000, "100").or(d.max_streams);
        max_connections_per_client: integer(1..=1_000_000, "64").or(d.max_connections_per_client);
        idle_timeout: duration(secs(1)..=secs(3600)).or(d.idle_timeout);
        early_data: boolean().or(d.early_data);
        retry_above_handshakes: integer(0..=1_000_000, "64").or(d.retry_above_handshakes);
    }
    complete! { H3Config {
        alt_svc_port, max_streams, max_connections_per_client, idle_timeout, early_data,
        retry_above_handshakes,
    } }
}

/// One address, or a list of them, each the TLS listener's own.
fn check_listen(
    v: &mut Ctx<'_>,
    at: &Path,
    value: &Value,
    server: Option<&ServerConfig>,
) -> Option<Vec<SocketAddr>> {
    let taken = server.map_or_else(Vec::new, |server| {
        vec![("server.listen", server.listen), ("server.admin_listen", server.admin_listen)]
    });
    let (example, mut seen) = ("0.0.0.0:443", Vec::new());
    let listen = |text: &str| {
        let addr = listen_addr::parse(text, example)?;
        if let Some((taken, _)) = taken.iter().find(|(_, other)| *other == addr) {
            let fix = "give the TLS listener an address of its own (e.g. port 443 beside 80)";
            return wrong(format!("{addr} is {taken} already"), fix);
        } else if seen.contains(&addr) {
            return wrong(format!("{addr} is listed twice"), "list each address once");
        }
        seen.push(addr);
        Ok(addr)
    };
    match &value.kind {
        ValueKind::Array(items) if items.is_empty() => {
            v.fail(at, "is empty", "give at least one address, e.g. \"0.0.0.0:443\"")
        }
        ValueKind::Array(_) => v.strings(at, value, "a string", "\"0.0.0.0:443\"", listen).ok(),
        _ => v.parsed(at, value, "\"0.0.0.0:443\"", listen).ok().map(|addr| vec![addr]),
    }
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
    match *(0..defaults.len()).filter(|&i| defaults[i]).collect::<Vec<_>>() {
        [] => Some((certificates, 0)),
        [default] => Some((certificates, default)),
        [first, second, ..] => v.fail(
            &at.index(second).key("default"),
            format!("tls.certificates[{first}] is the default already"),
            "mark one certificate default = true",
        ),
    }
}

fn certificate(
    v: &mut Ctx<'_>,
    at: &Path,
    raw: &Raw<RawCertificate>,
) -> Option<(TlsCertificate, bool)> {
    let r = v.table(at, raw, CERTIFICATE_EXAMPLE)?;
    let (cert, key) = ("\"/etc/rangeway/example.pem\"", "\"/etc/rangeway/example.key\"");
    read! { v, at, r;
        cert_file: string(cert).need(v, &at.key("cert_file"), format!("add cert_file = {cert}"));
        key_file: string(key).need(v, &at.key("key_file"), format!("add key_file = {key}"));
        ocsp_file: string("\"/etc/rangeway/example.ocsp\"").opt();
        default: boolean().or(false);
    }
    let ocsp = ocsp_file?.map(PathBuf::from);
    let files = CertificateFiles { cert: cert_file?.into(), key: key_file?.into(), ocsp };
    let is_default = default?;
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
