//! HTTP/3 clients for the tests: aioquic, which nobody here wrote (`tests/h3_client.py`), for
//! downloads, and quinn's client for what the listener does before any request.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;

use super::clients::{CLIENT_TIMEOUT, run};
use super::tls::TestPki;

/// One request over HTTP/3 to `server` with aioquic, trusting `pki`'s CA: `request` as
/// tests/h3_client.py takes it (`path`, `headers`, `out`, ...). The answer's status; an answer
/// whose stream was reset fails.
pub(crate) fn aioquic_get(pki: &TestPki, server: SocketAddr, request: &Value) -> u64 {
    let seen = run(aioquic_command(pki, server, &[request.to_string()], &[]), CLIENT_TIMEOUT);
    seen.assert_success();
    let answer: Value = seen
        .stdout
        .lines()
        .next()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("an answer line: {seen}"));
    assert_eq!(answer["reset"], false, "{seen}");
    answer["status"].as_u64().unwrap_or_else(|| panic!("a status: {seen}"))
}

/// tests/h3_client.py (aioquic) to `server`, trusting `pki`'s CA, with `extra` options: one
/// connection, each of `requests` (JSON, as the script takes them) on a stream of its own.
pub(crate) fn aioquic_command(
    pki: &TestPki,
    server: SocketAddr,
    requests: &[String],
    extra: &[&str],
) -> Command {
    let mut client = Command::new("python3");
    client
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/h3_client.py"))
        .args(["--connect", &server.to_string(), "--ca"])
        .arg(pki.ca_cert())
        .args(extra);
    for request in requests {
        client.args(["--request", request]);
    }
    client
}

/// What a quinn client trusting `pki`'s CA and offering `h3` connects with.
pub(crate) fn quic_client_config(pki: &TestPki) -> quinn::ClientConfig {
    let pem = std::fs::read(pki.ca_cert()).expect("read the CA");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert.expect("a CA certificate")).expect("a usable CA certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("a QUIC client");
    quinn::ClientConfig::new(Arc::new(quic))
}
