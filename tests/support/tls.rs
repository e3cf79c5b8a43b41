//! A throwaway PKI made with the `openssl` command line, for HTTPS origins in tests.
//!
//! rustls (through webpki) accepts only X.509 v3 certificates, requires a subjectAltName on the
//! server certificate (the CN is ignored), and rejects a CA certificate presented as the
//! end-entity; every certificate here is made to satisfy that, so a failed handshake in a test
//! means what the test meant it to mean.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::tmp::TempDir;

/// A certificate and its private key, both PEM files (the key in PKCS#8).
#[derive(Clone, Debug)]
pub(crate) struct TlsFiles {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// A test CA with server certificates, plus a second CA that signed nothing here.
///
/// The files live in a temporary directory removed on drop, so keep the `TestPki` alive as long as
/// a server uses its files.
#[derive(Debug)]
pub(crate) struct TestPki {
    dir: TempDir,
    ca: TlsFiles,
    other_ca: TlsFiles,
    localhost: TlsFiles,
    wrong_name: TlsFiles,
}

const CA_EXTENSIONS: &str = "\
basicConstraints = critical, CA:true
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
";

// keyUsage digitalSignature is what an ECDSA key needs for a TLS 1.2/1.3 handshake.
const LEAF_EXTENSIONS: &str = "\
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
";

impl TestPki {
    /// Makes the CAs and certificates; panics with openssl's output if any step fails.
    pub(crate) fn new() -> TestPki {
        let dir = TempDir::new("pki");
        let ca = make_ca(&dir, "ca", "rangeway test CA");
        let other_ca = make_ca(&dir, "other-ca", "rangeway unrelated test CA");
        let localhost =
            make_leaf(&dir, "localhost", &ca, "localhost", "DNS:localhost, IP:127.0.0.1");
        let wrong_name = make_leaf(&dir, "wrong-name", &ca, "wrong.example", "DNS:wrong.example");
        TestPki { dir, ca, other_ca, localhost, wrong_name }
    }

    /// Another server certificate from [`Self::ca_cert`], made now: its files are named `name`,
    /// its subject's CN is `name`, its subjectAltName `san` (`DNS:a.example, DNS:*.b.example`),
    /// valid until `days` days from now (negative: expired).
    pub(crate) fn leaf(&self, name: &str, san: &str, days: i32) -> TlsFiles {
        make_leaf_for(&self.dir, name, &self.ca, name, san, days)
    }

    /// An OCSP response from [`Self::ca_cert`], signed with its key, saying that `leaf` (which it
    /// signed) is good for a week: the DER file a server staples.
    pub(crate) fn ocsp_response(&self, leaf: &TlsFiles) -> PathBuf {
        let name = leaf.cert.file_stem().and_then(|s| s.to_str()).expect("a named certificate");
        let serial = Command::new("openssl")
            .args(["x509", "-noout", "-serial", "-in"])
            .arg(&leaf.cert)
            .output()
            .expect("run openssl");
        let serial = String::from_utf8_lossy(&serial.stdout);
        let serial = serial.trim().trim_start_matches("serial=");
        // The responder's database: one valid certificate, by serial.
        let index = self.dir.join(format!("{name}.ocsp-index"));
        std::fs::write(&index, format!("V\t301231235959Z\t\t{serial}\tunknown\t/CN={name}\n"))
            .expect("write the OCSP index");
        let request = self.dir.join(format!("{name}.ocsp-request"));
        let response = self.dir.join(format!("{name}.ocsp"));
        let mut ask = Command::new("openssl");
        ask.args(["ocsp", "-no_nonce", "-issuer"])
            .arg(&self.ca.cert)
            .arg("-cert")
            .arg(&leaf.cert)
            .arg("-reqout")
            .arg(&request);
        run(ask);
        let mut answer = Command::new("openssl");
        answer
            .args(["ocsp", "-ndays", "7", "-index"])
            .arg(&index)
            .arg("-rsigner")
            .arg(&self.ca.cert)
            .arg("-rkey")
            .arg(&self.ca.key)
            .arg("-CA")
            .arg(&self.ca.cert)
            .arg("-reqin")
            .arg(&request)
            .arg("-respout")
            .arg(&response);
        run(answer);
        response
    }

    /// A server certificate signed by an intermediate CA that [`Self::ca_cert`] signed: its
    /// certificate file holds the leaf, then the intermediate (the chain a server sends).
    pub(crate) fn chained(&self, name: &str, san: &str) -> TlsFiles {
        let intermediate = make_leaf_for(
            &self.dir,
            &format!("{name}-intermediate"),
            &self.ca,
            "rangeway test intermediate CA",
            "",
            3650,
        );
        let leaf = make_leaf_for(&self.dir, name, &intermediate, name, san, 3650);
        let mut chain = std::fs::read(&leaf.cert).expect("read the leaf");
        chain.extend(std::fs::read(&intermediate.cert).expect("read the intermediate"));
        std::fs::write(&leaf.cert, chain).expect("write the chain");
        leaf
    }

    /// The CA certificate that signed [`Self::localhost`] and [`Self::wrong_name`]: the trust
    /// anchor to configure (`ca_file`, `curl --cacert`).
    pub(crate) fn ca_cert(&self) -> &Path {
        &self.ca.cert
    }

    /// A self-signed CA unrelated to [`Self::ca_cert`]: trusting it instead must fail verification.
    pub(crate) fn other_ca_cert(&self) -> &Path {
        &self.other_ca.cert
    }

    /// Server certificate for `localhost` and `127.0.0.1` (SAN `DNS:localhost, IP:127.0.0.1`).
    pub(crate) fn localhost(&self) -> &TlsFiles {
        &self.localhost
    }

    /// Server certificate from the same CA but for `wrong.example` only: valid chain, wrong name.
    pub(crate) fn wrong_name(&self) -> &TlsFiles {
        &self.wrong_name
    }
}

fn make_ca(dir: &TempDir, name: &str, common_name: &str) -> TlsFiles {
    let config = write_config(dir, name, common_name, CA_EXTENSIONS);
    let files = files(dir, name);
    let mut req = Command::new("openssl");
    req.args(["req", "-x509", "-new", "-extensions", "ext", "-nodes", "-sha256", "-days", "3650"])
        .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"])
        .args(["-set_serial", &serial()])
        .arg("-config")
        .arg(&config)
        .arg("-keyout")
        .arg(&files.key)
        .arg("-out")
        .arg(&files.cert);
    run(req);
    files
}

fn make_leaf(dir: &TempDir, name: &str, ca: &TlsFiles, common_name: &str, san: &str) -> TlsFiles {
    make_leaf_for(dir, name, ca, common_name, san, 3650)
}

/// A certificate `ca` signs: a server's for the names of `san`, or (`san` empty) an intermediate
/// CA's.
fn make_leaf_for(
    dir: &TempDir,
    name: &str,
    ca: &TlsFiles,
    common_name: &str,
    san: &str,
    days: i32,
) -> TlsFiles {
    let extensions = match san {
        "" => CA_EXTENSIONS.to_owned() + "authorityKeyIdentifier = keyid:always\n",
        san => format!("{LEAF_EXTENSIONS}subjectAltName = {san}\n"),
    };
    let config = write_config(dir, name, common_name, &extensions);
    let files = files(dir, name);
    let csr = dir.join(format!("{name}.csr"));
    let mut req = Command::new("openssl");
    req.args(["req", "-new", "-nodes"])
        .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"])
        .arg("-config")
        .arg(&config)
        .arg("-keyout")
        .arg(&files.key)
        .arg("-out")
        .arg(&csr);
    run(req);
    // `x509 -req` copies no extensions from the request; they come from the config's `ext`
    // section, so the SAN and key usages are exactly the ones written above.
    let mut sign = Command::new("openssl");
    sign.args(["x509", "-req", "-extensions", "ext", "-sha256", "-days", &days.to_string()])
        .args(["-set_serial", &serial()])
        .arg("-in")
        .arg(&csr)
        .arg("-CA")
        .arg(&ca.cert)
        .arg("-CAkey")
        .arg(&ca.key)
        .arg("-extfile")
        .arg(&config)
        .arg("-out")
        .arg(&files.cert);
    run(sign);
    files
}

fn files(dir: &TempDir, name: &str) -> TlsFiles {
    TlsFiles { cert: dir.join(format!("{name}.pem")), key: dir.join(format!("{name}.key")) }
}

/// A config of our own, so that nothing from the system's openssl.cnf (default extensions,
/// prompts) ends up in the certificates.
fn write_config(dir: &TempDir, name: &str, common_name: &str, extensions: &str) -> PathBuf {
    let path = dir.join(format!("{name}.cnf"));
    let text = format!(
        "[req]\nprompt = no\ndistinguished_name = dn\n\n[dn]\nCN = {common_name}\n\n[ext]\n{extensions}"
    );
    std::fs::write(&path, text).expect("write an openssl config");
    path
}

/// A serial number unique among the certificates one CA signs here, which RFC 5280 requires and
/// openssl 1.1 would otherwise want a serial file for.
fn serial() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let nanos =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos());
    format!("0x{nanos:x}{:04x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn run(mut command: Command) {
    let output = command.output().expect("run openssl (scripts/deps.sh installs it)");
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
