//! The `rangeway` binary as a user runs it: `check` on good and bad configs, and `serve` on the
//! embedded default in an empty folder.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::clients::{curl_resume, sha256_file, write_partial};
use support::http::{get, get_until};
use support::ports::{free_ports, wait_for_port};
use support::tmp::TempDir;

fn rangeway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rangeway"))
}

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn check_accepts_the_shipped_configs() {
    for config in ["config/default.toml", "config/examples/cdn.toml"] {
        let out = rangeway()
            .args(["check", "--config"])
            .arg(repo_file(config))
            // cdn.toml's Redis needs the download-id key its instances share.
            .env("RANGEWAY_ID_KEY", "an-example-key-of-more-than-32-characters")
            .output()
            .unwrap();
        assert!(out.status.success(), "{config}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // Without the key, cdn.toml is refused, naming the key and the fix.
    let out = rangeway()
        .args(["check", "--config"])
        .arg(repo_file("config/examples/cdn.toml"))
        .env_remove("RANGEWAY_ID_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("state.id_key_env") && stderr.contains("RANGEWAY_ID_KEY is not set"),
        "{stderr}"
    );
}

/// `secure.toml` runs every stage; its key comes from the environment, and a missing or bad key
/// is a config problem like any other, named with the fix, never echoed.
#[test]
fn check_builds_every_stage_of_a_route() {
    let secure = repo_file("config/examples/secure.toml");
    let key = rangeway().arg("keygen").output().unwrap();
    let key = String::from_utf8(key.stdout).unwrap();
    let good = rangeway()
        .args(["check", "--config"])
        .arg(&secure)
        .env("RANGEWAY_KEY", key.trim())
        .output()
        .unwrap();
    assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));

    let missing = rangeway()
        .args(["check", "--config"])
        .arg(&secure)
        .env_remove("RANGEWAY_KEY")
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("routes[2].middleware[2].key_env"), "{stderr}");
    assert!(stderr.contains("rangeway keygen"), "{stderr}");

    let short = "c2hvcnQta2V5";
    let bad = rangeway()
        .args(["check", "--config"])
        .arg(&secure)
        .env("RANGEWAY_KEY", short)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("16 or 32 bytes"), "{stderr}");
    assert!(!stderr.contains(short), "the key is never echoed: {stderr}");
}

#[test]
fn check_reports_every_problem_and_exits_non_zero() {
    let dir = TempDir::new("cli-check");
    let config = dir.join("bad.toml");
    std::fs::write(
        &config,
        r#"
[server]
listen = "127.0.0.1:99999"
admin_listn = "127.0.0.1:9090"

[upstreams.origin]
url = "ftp://example.com"

[[routes]]
path_prefix = "/files/"
upstream = "orign"
  [[routes.middleware]]
  kind = "gzip"
  level = 42
"#,
    )
    .unwrap();
    let out = rangeway().args(["check", "--config"]).arg(&config).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "server.listen",
        "server.admin_listn",
        "admin_listen",
        "upstreams.origin.url",
        "routes[0].upstream",
        "orign",
        // A stage's bad option, beside the route's unknown upstream.
        "routes[0].middleware[0].level",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in:\n{stderr}");
    }
}

#[test]
fn serve_runs_the_embedded_default_in_an_empty_folder() {
    let work = TempDir::new("cli-serve");
    let [listen, admin] = free_ports::<2>();
    let mut child = rangeway()
        .args(["serve", "--config"])
        .arg(repo_file("config/default.toml"))
        .current_dir(work.path())
        .env("RANGEWAY__SERVER__LISTEN", format!("127.0.0.1:{listen}"))
        .env("RANGEWAY__SERVER__ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
        .env("RANGEWAY__SERVER__ADMIN_TOKEN_ENV", "TEST_ADMIN_TOKEN")
        .env("TEST_ADMIN_TOKEN", "s3cret-token")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let banner: Vec<String> = BufReader::new(stdout).lines().take(2).map(Result::unwrap).collect();
    wait_for_port(format!("127.0.0.1:{listen}").parse().unwrap(), Duration::from_secs(20)).unwrap();
    assert!(banner[1].contains("curl -C -"), "{banner:?}");
    assert!(banner[1].contains(&format!("127.0.0.1:{listen}/files/sample.bin")), "{banner:?}");

    // The sample is in the folder, and a download interrupted at 1 MiB resumes to the same bytes.
    let sample = std::fs::read(work.join("data/sample.bin")).unwrap();
    let file = work.join("download.bin");
    write_partial(&file, &sample, 1024 * 1024);
    curl_resume(&format!("http://127.0.0.1:{listen}/files/sample.bin"), &file).assert_success();
    assert_eq!(sha256_file(&file), sha256_file(&work.join("data/sample.bin")));

    assert_eq!(get(&format!("http://127.0.0.1:{admin}/healthz"), &[]).status, 200);
    assert_eq!(get(&format!("http://127.0.0.1:{admin}/readyz"), &[]).status, 200);
    let counted = "rangeway_requests_total{route=\"/files/\",status=\"206\"} 1";
    let metrics = get_until(&format!("http://127.0.0.1:{admin}/metrics"), |r| {
        String::from_utf8_lossy(&r.body).contains(counted)
    });
    let metrics = String::from_utf8_lossy(&metrics.body);
    assert!(metrics.contains(counted), "{metrics}");
    // The admin API wants the bearer token; health and metrics do not.
    let downloads = format!("http://127.0.0.1:{admin}/v1/downloads");
    assert_eq!(get(&downloads, &[]).status, 401);
    assert_eq!(get(&downloads, &[("Authorization", "Bearer wrong")]).status, 401);
    // The scheme's name is case-insensitive (RFC 9110 §11.1).
    for scheme in ["bearer", "BEARER", "Bearer  "] {
        let value = format!("{scheme} s3cret-token");
        assert_eq!(get(&downloads, &[("Authorization", &value)]).status, 200, "{value}");
    }
    assert_eq!(get(&downloads, &[("Authorization", "Basic s3cret-token")]).status, 401);
    let listed = get(&downloads, &[("Authorization", "Bearer s3cret-token")]);
    assert_eq!(listed.status, 200);
    assert!(
        String::from_utf8_lossy(&listed.body).contains("sample.bin"),
        "the resumed download is listed"
    );
    // The admin port is not the proxy: no route answers there, and the proxy has no /metrics.
    assert_eq!(get(&format!("http://127.0.0.1:{listen}/metrics"), &[]).status, 404);

    Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success() || status.code().is_none(), "{status:?}");
}

/// A server that cannot listen (on an address not of this machine) is an error of
/// `Running::start`, not a handle to a server that is not there.
#[test]
fn a_server_that_cannot_listen_is_an_error() {
    let [admin] = free_ports::<1>();
    // TEST-NET-1 (RFC 5737): no interface here has it, so nothing can bind it.
    let text = format!(
        "[server]\nlisten = \"192.0.2.1:8080\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\n[upstreams.local]\ndir = \"./data\"\n\n[[routes]]\npath_prefix = \"/\"\nupstream = \"local\"\n"
    );
    let registry = rangeway_middleware::chain::StageRegistry::new();
    let config = rangeway::config::Config::from_toml_str(&text, &registry).expect("valid");
    match rangeway::server::Running::start(&config, &registry) {
        Ok(_) => panic!("started though it cannot listen"),
        Err(e) => assert!(e.to_string().contains("192.0.2.1:8080"), "{e}"),
    }
}

/// `rangeway serve` on an address something else listens on stops at once with an error that
/// names the key, rather than running without its proxy.
#[test]
fn serve_on_a_taken_address_exits_with_an_error() {
    let work = TempDir::new("cli-taken");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let [admin] = free_ports::<1>();
    let output = rangeway()
        .args(["serve", "--config"])
        .arg(repo_file("config/default.toml"))
        .current_dir(work.path())
        .env("RANGEWAY__SERVER__LISTEN", taken.local_addr().unwrap().to_string())
        .env("RANGEWAY__SERVER__ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let said = format!("server.listen: cannot listen on {}", taken.local_addr().unwrap());
    assert!(stderr.contains(&said), "{stderr}");
}
