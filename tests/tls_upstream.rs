//! https origins: verified against a configured CA, with SNI; a wrong CA or a wrong name is a
//! clear 502, never an unverified connection.

mod support;

use support::data::test_bytes;
use support::http::{get, get_until};
use support::nginx::{Nginx, NginxOptions};
use support::proxy::Proxy;
use support::tls::{TestPki, TlsFiles};
use support::tmp::TempDir;

fn https_nginx(root: &TempDir, files: &TlsFiles) -> Nginx {
    Nginx::start(NginxOptions { tls: Some(files.clone()), ..NginxOptions::serving(root.path()) })
}

fn proxy_to(url: &str, ca: &std::path::Path, extra: &str) -> Proxy {
    Proxy::start(&format!(
        "[upstreams.origin]\nurl = \"{url}\"\nca_file = \"{}\"\n{extra}\n[[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        ca.display()
    ))
}

#[test]
fn a_private_ca_verifies_and_ranges_work() {
    let pki = TestPki::new();
    let root = TempDir::new("tls-root");
    let object = test_bytes(100_000, 9);
    std::fs::write(root.join("a.bin"), &object).unwrap();
    let nginx = https_nginx(&root, pki.localhost());
    let proxy = proxy_to(&nginx.base_url(), pki.ca_cert(), "");
    let response = get(&proxy.url("/a.bin"), &[("Range", "bytes=10-19")]);
    assert_eq!(response.status, 206);
    assert_eq!(response.body, object[10..20]);
}

#[test]
fn a_wrong_ca_or_name_is_a_clear_502() {
    let pki = TestPki::new();
    let root = TempDir::new("tls-bad");
    std::fs::write(root.join("a.bin"), b"secret").unwrap();

    let nginx = https_nginx(&root, pki.localhost());
    let proxy = proxy_to(&nginx.base_url(), pki.other_ca_cert(), "");
    let response = get(&proxy.url("/a.bin"), &[]);
    assert_eq!(response.status, 502);
    assert!(String::from_utf8_lossy(&response.body).contains("certificate"), "{:?}", response.body);

    let nginx = https_nginx(&root, pki.wrong_name());
    let proxy = proxy_to(&nginx.base_url(), pki.ca_cert(), "");
    let response = get(&proxy.url("/a.bin"), &[]);
    assert_eq!(response.status, 502);
    let tls_error = "rangeway_upstream_errors_total{kind=\"tls\"";
    let metrics = get_until(&proxy.admin_url("/metrics"), |r| {
        String::from_utf8_lossy(&r.body).contains(tls_error)
    });
    assert!(String::from_utf8_lossy(&metrics.body).contains(tls_error));

    // Only an explicit insecure_skip_verify turns checking off.
    let proxy = proxy_to(&nginx.base_url(), pki.ca_cert(), "insecure_skip_verify = true");
    let response = get(&proxy.url("/a.bin"), &[]);
    assert_eq!(response.status, 200);
    assert_eq!(response.body, b"secret");
}
