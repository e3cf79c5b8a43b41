//! `rangeway get`: a download client that resumes without ever splicing two versions, fetches
//! in parallel pieces, and verifies what it got against the digests the server publishes.
//!
//! The flow: [`download::attempt`] fills `FILE.part` (its control file, `FILE.part.ctl`, says
//! which version and which bytes are on disk), starting over when the object changed; then the
//! file is checked against every digest stated, decoded when asked (`--decrypt`, `--gunzip`),
//! and renamed to `FILE`. docs/get.md is the user's guide; exit codes are [`GetError`]'s.

mod answer;
mod connect;
mod control;
mod decode;
mod digest;
mod download;
mod error;
mod h3;
mod http1;
mod plan;
mod post;
mod progress;
mod ranges;
mod stream;
mod url;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use decode::Decrypting;
pub use error::GetError;
pub use post::{Posted, Poster};

use crate::connect::{Connector, Proxies};
use crate::control::{Control, with_suffix};
use crate::decode::Decoding;
use crate::digest::{Expected, Of, Running, merge};
use crate::download::{Ended, Settings};
use crate::http1::Request;
use crate::progress::Progress;
use crate::url::Target;

/// A download stops starting over after this many version changes in a row.
const MAX_START_OVERS: usize = 5;

/// `rangeway get`'s arguments.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// The URL to download (http:// or https://).
    pub url: String,
    /// The file to write; by default the URL's last path segment, in the current folder.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Connections in parallel when the server resumes (default 4; 1 when it cannot).
    #[arg(short = 'x', long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub connections: Option<u16>,
    /// Discard a partial download of FILE and start anew (by default it is continued).
    #[arg(long)]
    pub restart: bool,
    /// Check the file against this SHA-256 (hex) as well as what the server states.
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// Decrypt an aes128gcm representation (RFC 8188) after it is downloaded and verified.
    #[arg(long, requires = "key_file")]
    pub decrypt: bool,
    /// The key file for --decrypt: one base64url key, or ID=KEY lines.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Decompress a gzip representation after it is downloaded and verified (asks for gzip).
    #[arg(long)]
    pub gunzip: bool,
    /// A request header, `Name: value` (repeatable).
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub headers: Vec<String>,
    /// The most all connections together may receive a second: 500K, 10M, 1G (bytes).
    #[arg(long, value_name = "RATE")]
    pub limit_rate: Option<String>,
    /// How long failures (network errors, 5xx, 429) are retried without a byte arriving.
    #[arg(long, value_name = "DURATION", default_value = "2m")]
    pub retry_for: String,
    /// How long connecting, or a silent connection, may take before it counts as failed.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub timeout: String,
    /// Trust the certificates in this PEM file too (beside the system's).
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// HTTP/3 (QUIC) for every connection, https only. Without it, HTTP/3 is used once the
    /// server advertises it (Alt-Svc), TCP when it cannot be reached.
    #[arg(long)]
    pub http3: bool,
    /// Print errors only.
    #[arg(short, long)]
    pub quiet: bool,
    /// Show each connection's bytes in the progress line.
    #[arg(short, long)]
    pub verbose: bool,
}

/// Runs a download; its error says what went wrong and which exit code tells it.
pub fn run(args: &GetArgs) -> Result<PathBuf, GetError> {
    let usage = GetError::Usage;
    let url = Target::parse(&args.url).map_err(usage)?;
    let output = match &args.output {
        Some(output) => output.clone(),
        None => PathBuf::from(url.file_name().ok_or_else(|| {
            GetError::Usage(format!("{url} names no file: say where to write it with -o FILE"))
        })?),
    };
    let part = with_suffix(&output, ".part");
    let control_path = Control::path_for(&part);
    let retry_for = duration("--retry-for", &args.retry_for)?;
    let timeout = duration("--timeout", &args.timeout)?;
    let rate = args.limit_rate.as_deref().map(rate).transpose()?;
    let mut extra = Vec::new();
    if let Some(hex) = &args.sha256 {
        extra.push(
            Expected::sha256_hex(hex)
                .ok_or_else(|| GetError::Usage(format!("--sha256 {hex:?}: 64 hex digits")))?,
        );
    }
    let keys = match (&args.key_file, args.decrypt) {
        (Some(path), true) => Some(
            rangeway_middleware::aes128gcm::read_key_file(path)
                .map_err(|e| GetError::Usage(format!("--key-file {}: {e}", path.display())))?,
        ),
        (Some(_), false) => return Err(GetError::Usage("--key-file is for --decrypt".into())),
        _ => None,
    };
    let decoding = Decoding { keys, gunzip: args.gunzip };
    let proxies = Proxies::from_env(|name| std::env::var(name).ok()).map_err(usage)?;
    if args.http3 && !url.tls() {
        return Err(GetError::Usage("--http3 is for https URLs only".into()));
    }
    let connector = Connector::new(args.cacert.as_deref(), proxies, timeout)
        .map_err(usage)?
        .with_http3(args.http3);
    let settings = Settings {
        connections: args.connections.map(usize::from),
        retry_for,
        headers: request_headers(&args.headers, args.gunzip)?,
        rate,
    };
    let mut progress = Progress::new(args.quiet, args.verbose);

    let mut resume =
        if args.restart { None } else { resumable(&part, &control_path, &mut progress) };
    let mut start_overs = 0;
    let (target, version, mut digests, running) = loop {
        let parts = (part.as_path(), control_path.as_path());
        match download::attempt(
            &settings,
            &connector,
            &url,
            parts,
            resume.take(),
            &extra,
            &mut progress,
        )? {
            Ended::Complete { target, version, digests, running } => {
                break (target, version, digests, running);
            }
            Ended::StartOver(why) => {
                start_overs += 1;
                if start_overs > MAX_START_OVERS {
                    return Err(GetError::Network(format!(
                        "{url}: {why}, {MAX_START_OVERS} times in a row"
                    )));
                }
                progress.say(&format!("{why}: starting over"));
            }
        }
    };

    // A digest the server learned while the pieces came in (rangeway publishes one once it has
    // seen every byte) is asked for once more.
    if !digests.iter().any(|d| d.of == Of::Representation) && version.etag.is_some() {
        merge(&mut digests, published_digests(&connector, &target, &settings.headers, &version));
    }
    let running = if running.covers(&digests) { *running } else { hash_file(&part, &digests)? };
    let held = running.check(Of::Representation, &digests).map_err(|mismatch| {
        GetError::Verification(format!(
            "{url}: {mismatch}; the download is kept as {} (run again with --restart to download it anew)",
            part.display()
        ))
    })?;
    let decoded = decoding.keys.is_some() || decoding.gunzip;
    if decoded {
        let decoding_path = with_suffix(&output, ".decoding");
        let mut origin = Running::for_expected(digests.iter().filter(|d| d.of == Of::Origin));
        decode::decode(&decoding, &part, &decoding_path, &mut origin)?;
        let origin_held = origin.check(Of::Origin, &digests).map_err(|mismatch| {
            let _ = std::fs::remove_file(&decoding_path);
            GetError::Verification(format!(
                "{url}: after decoding, {mismatch}; the download is kept as {}",
                part.display()
            ))
        })?;
        rename(&decoding_path, &output)?;
        remove(&part)?;
        report(&mut progress, &output, &held, &origin_held);
    } else {
        rename(&part, &output)?;
        report(&mut progress, &output, &held, &[]);
    }
    remove(&control_path)?;
    Ok(output)
}

fn report(progress: &mut Progress, output: &Path, held: &[String], origin_held: &[String]) {
    let mut checks: Vec<String> = held.to_vec();
    checks.extend(origin_held.iter().map(|check| format!("{check} after decoding")));
    if checks.is_empty() {
        progress.say(&format!(
            "{}: done, not verified: the server published no digest (--sha256 checks a known one)",
            output.display()
        ));
    } else {
        progress.say(&format!("{}: done, verified: {}", output.display(), checks.join(", ")));
    }
}

/// The control file and part file of an earlier run, when both are there and usable.
fn resumable(part: &Path, control_path: &Path, progress: &mut Progress) -> Option<Control> {
    match Control::load(control_path) {
        Ok(Some(control)) if part.exists() && control.version.validator().is_some() => {
            progress.say(&format!(
                "continuing: {} of {} bytes are on disk",
                control.done.total(),
                control.version.length
            ));
            Some(control)
        }
        Ok(_) => None,
        Err(why) => {
            progress.say(&format!("{why}: starting over"));
            None
        }
    }
}

/// The digests a HEAD of the same version states now.
fn published_digests(
    connector: &Connector,
    target: &Target,
    headers: &[(String, String)],
    version: &control::Version,
) -> Vec<Expected> {
    let Ok(mut connection) = connector.connect(target) else { return Vec::new() };
    let Ok(head) = connection.send(&Request { method: "HEAD", target, headers, body: &[] }) else {
        return Vec::new();
    };
    if head.status == 200 && answer::same_version(&head, version) {
        Expected::from_head(&head)
    } else {
        Vec::new()
    }
}

fn hash_file(path: &Path, digests: &[Expected]) -> Result<Running, GetError> {
    let local = |e: std::io::Error| GetError::Local(format!("{}: {e}", path.display()));
    let mut running = Running::for_expected(digests);
    let file = std::fs::File::open(path).map_err(local)?;
    let len = file.metadata().map_err(local)?.len();
    running.feed_from(&file, len, &mut vec![0; 1 << 20]).map_err(local)?;
    Ok(running)
}

/// The user's `-H` headers, after rangeway get's own (a user's header of the same name wins).
fn request_headers(user: &[String], gunzip: bool) -> Result<Vec<(String, String)>, GetError> {
    let mut headers = vec![
        ("User-Agent".to_owned(), concat!("rangeway-get/", env!("CARGO_PKG_VERSION")).to_owned()),
        ("Accept".to_owned(), "*/*".to_owned()),
        ("Accept-Encoding".to_owned(), if gunzip { "gzip" } else { "identity" }.to_owned()),
    ];
    for header in user {
        let (name, value) = header
            .split_once(':')
            .filter(|(name, _)| !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| GetError::Usage(format!("-H {header:?}: write it as 'Name: value'")))?;
        let value = value.trim();
        if value.contains(['\r', '\n']) {
            return Err(GetError::Usage(format!("-H {name}: a value on one line")));
        }
        for managed in ["host", "range", "if-range"] {
            if name.eq_ignore_ascii_case(managed) {
                return Err(GetError::Usage(format!("-H {name}: rangeway get sets it itself")));
            }
        }
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        headers.push((name.to_owned(), value.to_owned()));
    }
    Ok(headers)
}

fn duration(flag: &str, text: &str) -> Result<Duration, GetError> {
    humantime::parse_duration(text)
        .map_err(|e| GetError::Usage(format!("{flag} {text:?}: {e} (e.g. 30s, 2m)")))
}

/// `500K`, `10M`, `1G` (binary multiples) or plain bytes a second.
fn rate(text: &str) -> Result<u64, GetError> {
    let bad = || GetError::Usage(format!("--limit-rate {text:?}: bytes a second, e.g. 500K, 10M"));
    let (digits, shift) = match text.trim().char_indices().last() {
        Some((at, 'k' | 'K')) => (&text[..at], 10),
        Some((at, 'm' | 'M')) => (&text[..at], 20),
        Some((at, 'g' | 'G')) => (&text[..at], 30),
        _ => (text.trim(), 0),
    };
    let value: u64 = digits.trim().parse().map_err(|_| bad())?;
    value.checked_mul(1 << shift).filter(|&rate| rate > 0).ok_or_else(bad)
}

fn rename(from: &Path, to: &Path) -> Result<(), GetError> {
    std::fs::rename(from, to).map_err(|e| {
        GetError::Local(format!("renaming {} to {}: {e}", from.display(), to.display()))
    })
}

fn remove(path: &Path) -> Result<(), GetError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(GetError::Local(format!("{}: {e}", path.display())))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_headers_are_read_as_curl_writes_them() {
        assert_eq!(rate("500K").ok(), Some(500 << 10));
        assert_eq!(rate("10m").ok(), Some(10 << 20));
        assert_eq!(rate("1234").ok(), Some(1234));
        assert!(rate("0").is_err() && rate("fast").is_err() && rate("99999999999G").is_err());
        let headers = request_headers(&["Accept: text/plain".into(), "X-A:  b ".into()], false)
            .expect("good");
        assert!(headers.contains(&("Accept".into(), "text/plain".into())));
        assert!(headers.contains(&("X-A".into(), "b".into())));
        assert_eq!(headers.iter().filter(|(n, _)| n == "Accept").count(), 1);
        for bad in ["NoColon", ": v", "Range: bytes=0-", "Bad Name: v"] {
            assert!(request_headers(&[bad.into()], false).is_err(), "{bad}");
        }
    }
}
