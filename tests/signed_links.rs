//! Routes of signed links: links made by `rangeway sign`, used by curl; refused when not genuine
//! (403) — a path, a term or an origin's query parameter changed — or expired (410), except a
//! resume of a download begun before the link expired, within the route's grace, of bytes that
//! download began, pinned to its version as every resume is.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::clients::{CLIENT_TIMEOUT, ClientRun, run, sha256_file, sha256_hex};
use support::data::test_bytes;
use support::http::get_until;
use support::origin::Origin;
use support::proxy::{Instance as _, ProxyProcess};
use support::tmp::TempDir;
use support::wait::until;

const OLD_KEY: &str = "2026-11 0123456789abcdef0123456789abcdef-old";
const NEW_KEY: &str = "2026-12 fedcba9876543210fedcba9876543210-new";

/// The upstream and a route `/files/` of signed links with `grace`, keys from `keys`.
fn body(origin: &Origin, keys: &Path, grace: &str) -> String {
    format!(
        "[upstreams.origin]\nurl = \"{}\"\n\n[[routes]]\npath_prefix = \"/files/\"\nupstream = \"origin\"\n[routes.signed_links]\nkeys_file = \"{}\"\ngrace = \"{grace}\"\n",
        origin.base_url(),
        keys.display()
    )
}

/// A folder with a keys file holding `keys` and the config `sign` reads (a route of signed links
/// with `grace`): the folder, the keys file, the config.
fn signing(
    origin: &Origin,
    keys: &str,
    grace: &str,
) -> (TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = TempDir::new("links");
    let keys_file = dir.join("link-keys");
    std::fs::write(&keys_file, keys).expect("write the keys");
    let config = dir.join("sign.toml");
    std::fs::write(&config, body(origin, &keys_file, grace)).expect("write the config");
    (dir, keys_file, config)
}

/// `rangeway sign --config CONFIG ARGS...`: the link's path and query.
fn sign(config: &Path, args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rangeway"));
    command.args(["sign", "--config"]).arg(config).args(args);
    let signed = run(command, CLIENT_TIMEOUT);
    signed.assert_success();
    signed.stdout.trim().to_owned()
}

fn curl(args: &[&str]) -> ClientRun {
    let mut command = Command::new("curl");
    command.arg("-sS").args(args);
    run(command, CLIENT_TIMEOUT)
}

/// A download of `url` into `file` begun and stopped after a second, part way.
fn begin(url: &str, file: &std::path::Path) {
    let path = file.to_str().expect("a UTF-8 path");
    let started = curl(&["--limit-rate", "500K", "-m", "1", "-o", path, url]);
    assert_eq!(started.code(), Some(28), "cut by -m 1: {started}");
}

/// Waits until the second after `link`'s expiry has passed.
fn wait_expired(link: &str) {
    let expires = link.split("rw-expires=").nth(1).and_then(|rest| rest.split('&').next());
    let expires: u64 = expires.and_then(|e| e.parse().ok()).expect("an expiry in the link");
    let now = || {
        let elapsed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        elapsed.map_or(0, |e| e.as_secs())
    };
    until("the link to expire", Duration::from_secs(5), || (now() > expires + 1).then_some(()));
}

fn status(url: &str, extra: &[&str]) -> String {
    curl(&[extra, &["-o", "/dev/null", "-w", "%{http_code}", url]].concat()).stdout
}

/// `rangeway sign` run with `args` that it refuses: what it says.
fn sign_refused(config: &Path, args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rangeway"));
    command.args(["sign", "--config"]).arg(config).args(args);
    let refused = run(command, CLIENT_TIMEOUT);
    assert_eq!(refused.code(), Some(2), "{refused}");
    refused.stderr
}

#[test]
fn a_link_signs_the_origin_query_it_carries() {
    let origin = Origin::start();
    let object = test_bytes(100_000, 52);
    origin.put("/files/v.bin", object.clone());
    let (dir, keys, config) = signing(&origin, &format!("{NEW_KEY}\n"), "1h");
    let proxy = ProxyProcess::start(&body(&origin, &keys, "1h"));
    let query = "versionId=3&response-content-disposition=attachment%3B%20filename%3Dv.bin";

    let link = sign(&config, &["/files/v.bin", "--query", query]);
    assert!(link.starts_with(&format!("/files/v.bin?{query}&rw-expires=")), "{link}");
    let file = dir.join("v.bin");
    let fetched = curl(&["-o", file.to_str().unwrap(), "-w", "%{http_code}", &proxy.url(&link)]);
    assert_eq!(fetched.stdout, "200", "{fetched}");
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    // The origin got the signed query, and nothing of the link.
    let targets: Vec<String> = origin.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(targets, [format!("/files/v.bin?{query}")]);
    // The same query written otherwise (escapes in lower case, its parameters in another
    // order), and rangeway's own download_id added: the same link.
    let reordered = link.replace(
        query,
        "response-content-disposition=attachment%3b%20filename%3dv.bin&versionId=3",
    );
    assert_eq!(status(&proxy.url(&reordered), &[]), "200", "{reordered}");
    assert_eq!(status(&proxy.url(&format!("{link}&download_id=mine")), &[]), "200");

    let tampered = [
        ("a changed parameter", link.replace("versionId=3", "versionId=2")),
        ("an added parameter", format!("{link}&versionId=2")),
        ("another added parameter", link.replace("versionId=3", "acl&versionId=3")),
        ("a removed parameter", link.replace("versionId=3&", "")),
        ("a space for a plus", link.replace("%20filename", "+filename")),
    ];
    for (what, tampered) in &tampered {
        assert_eq!(status(&proxy.url(tampered), &[]), "403", "{what}: {tampered}");
    }
    let refused = proxy.metric("rangeway_links_refused_total", "reason=\"bad_signature\"");
    assert_eq!(refused, tampered.len() as u64);
    // A link signed without the query does not take one added to it.
    let bare = sign(&config, &["/files/v.bin"]);
    assert_eq!(status(&proxy.url(&bare), &[]), "200");
    assert_eq!(status(&proxy.url(&format!("{bare}&versionId=3")), &[]), "403");

    // What `sign` will not put in a link's query, and why.
    for (query, says) in [
        ("rw-id=x", "is a signed link's own"),
        ("download_id=x", "--download-id"),
        ("a=b c", "percent-encode it (%20)"),
        ("a=100%", "%25"),
    ] {
        let said = sign_refused(&config, &["/files/v.bin", "--query", query]);
        assert!(said.contains(says), "{query}: {said}");
    }
}

#[test]
fn genuine_links_only_and_keys_rotate() {
    let origin = Origin::start();
    let object = test_bytes(1_000_000, 51);
    // The origin matches targets as sent: rangeway sends the path percent-encoded.
    origin.put("/files/a%20b.bin", object.clone());
    let (dir, keys, config) =
        signing(&origin, &format!("# the newest last\n{OLD_KEY}\n{NEW_KEY}\n"), "1h");
    let log = dir.join("rangeway.log");
    let proxy = ProxyProcess::start_logged(&body(&origin, &keys, "1h"), &[], &log);
    let url = |link: &str| proxy.url(link);

    let link = sign(&config, &["/files/a b.bin", "--expires-in", "1h"]);
    assert!(link.starts_with("/files/a%20b.bin?rw-expires="), "{link}");
    assert!(link.contains("&rw-key=2026%2D12&"), "signed with the newest key: {link}");
    let file = dir.join("a.bin");
    let fetched = curl(&["-o", file.to_str().unwrap(), "-w", "%{http_code}", &url(&link)]);
    assert_eq!(fetched.stdout, "200", "{fetched}");
    assert_eq!(sha256_file(&file), sha256_hex(&object));
    // The older key of the ring still signs good links; the route's other paths need one too.
    let old = sign(&config, &["/files/a b.bin", "--key-id", "2026-11"]);
    assert_eq!(status(&url(&old), &[]), "200");

    let signature = link.rsplit_once("rw-sig=").unwrap().1.to_owned();
    let tampered = [
        ("no link", "/files/a%20b.bin".to_owned()),
        ("another path", link.replace("a%20b.bin", "other.bin")),
        ("a later expiry", link.replacen("rw-expires=1", "rw-expires=2", 1)),
        ("an unknown key", link.replace("rw-key=2026%2D12", "rw-key=2027")),
        ("another key's name", link.replace("rw-key=2026%2D12", "rw-key=2026%2D11")),
        ("a changed signature", link.replace(&signature, &signature.to_ascii_uppercase())),
    ];
    for (what, tampered) in tampered {
        assert_eq!(status(&url(&tampered), &[]), "403", "{what}: {tampered}");
    }
    // Bound to a client prefix: 127.0.0.1 is in 127.0.0.0/8, not in 192.0.2.0/24.
    let mine = sign(&config, &["/files/a b.bin", "--client", "127.0.0.0/8"]);
    assert_eq!(status(&url(&mine), &[]), "200");
    let theirs = sign(&config, &["/files/a b.bin", "--client", "192.0.2.0/24"]);
    assert_eq!(status(&url(&theirs), &[]), "403");

    // The origin never sees the link's parameters.
    for request in origin.requests() {
        assert!(!request.target.contains("rw-"), "{}", request.target);
    }
    // Neither a whole signature nor a key is in the log.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("rw-sig="), "the links are logged, shortened:\n{text}");
    assert!(!text.contains(&signature), "a whole signature in the log:\n{text}");
    for key in [OLD_KEY, NEW_KEY] {
        assert!(!text.contains(key.split_once(' ').unwrap().1), "a key in the log");
    }

    // A key taken out of the file at a reload no longer verifies its links.
    std::fs::write(&keys, format!("{NEW_KEY}\n")).unwrap();
    proxy.signal("HUP");
    support::wait::log_line(&log, "SIGHUP: reloaded");
    assert_eq!(status(&url(&old), &[]), "403");
    assert_eq!(status(&url(&link), &[]), "200");
}

#[test]
fn past_its_expiry_a_link_serves_only_bytes_its_download_began() {
    let origin = Origin::start();
    let object = test_bytes(100_000, 55);
    origin.put("/files/one.bin", object.clone());
    let (dir, keys, config) = signing(&origin, &format!("{NEW_KEY}\n"), "1h");
    let proxy = ProxyProcess::start(&body(&origin, &keys, "1h"));
    let link = sign(&config, &["/files/one.bin", "--expires-in", "2s"]);
    let url = proxy.url(&link);
    let id = ["-H", "X-Download-Id: one-byte"];

    // One byte fetched in time, and recorded.
    assert_eq!(status(&url, &[&id[..], &["-r", "0-0"]].concat()), "206");
    get_until(&proxy.admin_url("/v1/downloads/one-byte"), |r| r.status == 200);
    wait_expired(&link);

    // Not a way to download the object again, or bytes never begun: 410.
    for range in [&[][..], &["-r", "0-"], &["-r", "0-99"], &["-r", "50000-"], &["-r", "-100"]] {
        assert_eq!(status(&url, &[&id[..], range].concat()), "410", "{range:?}");
    }
    // The rest of the byte begun: served, byte-exact.
    let file = dir.join("rest.bin");
    let path = file.to_str().unwrap();
    let rest = curl(&[&id[..], &["-r", "1-", "-o", path, "-w", "%{http_code}", &url]].concat());
    assert_eq!(rest.stdout, "206", "{rest}");
    assert_eq!(sha256_file(&file), sha256_hex(&object[1..]));
    assert_eq!(proxy.metric("rangeway_resumed_past_expiry_total", "by=\"link\""), 1);
    assert_eq!(proxy.metric("rangeway_links_refused_total", "reason=\"expired\""), 5);
}

#[test]
fn an_expired_link_resumes_only_the_download_it_began_within_the_grace() {
    let origin = Origin::start();
    let object = test_bytes(20_000_000, 53);
    origin.put("/files/big.bin", object.clone());
    let (dir, keys, config) = signing(&origin, &format!("{NEW_KEY}\n"), "1h");
    let proxy = ProxyProcess::start(&body(&origin, &keys, "1h"));
    let no_grace = dir.join("no-grace.toml");
    std::fs::write(&no_grace, body(&origin, &keys, "0s")).unwrap();
    let strict = ProxyProcess::start(&body(&origin, &keys, "0s"));

    // A download begun with a link good for 2 s, stopped part way.
    let link = sign(&config, &["/files/big.bin", "--expires-in", "2s"]);
    let file = dir.join("big.bin");
    begin(&proxy.url(&link), &file);
    let strict_file = dir.join("strict.bin");
    let strict_link = sign(&no_grace, &["/files/big.bin", "--expires-in", "2s"]);
    begin(&strict.url(&strict_link), &strict_file);
    wait_expired(&link);

    // A new download with it: 410, with a body that says what to do.
    let fresh = curl(&["-w", "%{http_code}", &proxy.url(&link)]);
    assert!(fresh.stdout.ends_with("410"), "{fresh}");
    assert!(fresh.stdout.contains("expired"), "{fresh}");
    // Under another download id, nothing began before the expiry: 410.
    assert_eq!(status(&proxy.url(&link), &["-H", "X-Download-Id: another", "-r", "100-"]), "410");
    // The download that began: resumed where it stopped, byte-exact.
    let held = std::fs::metadata(&file).unwrap().len();
    assert!(held > 0 && (held as usize) < object.len(), "held {held}");
    let resumed =
        curl(&["-C", "-", "-w", "%{http_code}", "-o", file.to_str().unwrap(), &proxy.url(&link)]);
    assert_eq!(resumed.stdout, "206", "{resumed}");
    assert_eq!(sha256_file(&file), sha256_hex(&object), "resumed past the expiry");
    assert_eq!(proxy.metric("rangeway_resumed_past_expiry_total", "by=\"link\""), 1);
    // Without grace, the same resume is refused.
    let refused = curl(&[
        "-C",
        "-",
        "-w",
        "%{http_code}",
        "-o",
        strict_file.to_str().unwrap(),
        &strict.url(&strict_link),
    ]);
    assert!(refused.stdout.ends_with("410") || refused.code() == Some(22), "{refused}");

    // Within the grace, a resume of a changed object is refused as every such resume is.
    let second = dir.join("second.bin");
    let link = sign(&config, &["/files/big.bin", "--expires-in", "2s"]);
    begin(&proxy.url(&link), &second);
    wait_expired(&link);
    origin.put("/files/big.bin", test_bytes(20_000_000, 54));
    let changed =
        curl(&["-C", "-", "-w", "%{http_code}", "-o", second.to_str().unwrap(), &proxy.url(&link)]);
    assert_eq!(changed.stdout, "412", "{changed}");
}
