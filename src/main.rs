//! The `rangeway` command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rangeway::config::{Config, ConfigErrors};
use rangeway::logging::LogFormat;
use rangeway::{server, traces};
use rangeway_get::Decrypting;
use rangeway_middleware::aes128gcm;
use rangeway_middleware::chain::StageRegistry;

/// rangeway — a reverse proxy that makes every download resumable at any byte.
///
/// It stands in front of object storage, CDNs or plain HTTP origins (or a local folder) and
/// answers Range requests exactly, even when the origin does not.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the proxy (and its admin listener) until stopped.
    ///
    /// SIGTERM drains in-flight downloads for `server.grace_period`, SIGINT stops at once,
    /// SIGHUP reloads the config, SIGQUIT hands the listening sockets to a process started with
    /// `--upgrade`. Logs go to stderr; filter them with RUST_LOG (e.g. RUST_LOG=rangeway=debug).
    Serve {
        /// The TOML config; RANGEWAY__SECTION__KEY environment variables override it.
        /// Without it, the embedded default (config/default.toml, built in) is used.
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Take the listening sockets over from a running rangeway (zero-downtime upgrade):
        /// start this, then send the old process SIGQUIT. Both use `server.upgrade_socket`.
        #[arg(long)]
        upgrade: bool,
    },
    /// Print a new random key for an aes128gcm route: base64url of 16 bytes, for a key file
    /// (alone, or as `ID=KEY` beside older keys) or a `key_env` variable.
    Keygen,
    /// Decrypt what an aes128gcm route delivered (RFC 8188), from stdin to stdout, in constant
    /// memory. Exits non-zero, having written only authenticated records, when the input is
    /// tampered with, truncated, or encrypted under a key id the file does not hold.
    Decrypt {
        /// The key file: one base64url key, or `ID=KEY` lines (the header's key id picks one).
        #[arg(long, value_name = "FILE")]
        key_file: PathBuf,
    },
    /// Print a signed link to PATH for the route of the config that serves it (a route with
    /// `[routes.signed_links]`), signed with its newest key: the path and query to give out.
    /// The signature covers the query given with --query; a link whose query is changed is
    /// refused.
    Sign {
        /// The TOML config; without it, the embedded default.
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The path clients will ask for, e.g. /files/release.iso.
        path: String,
        /// The origin's query parameters the link carries, percent-encoded as they are to
        /// reach the origin, e.g. 'versionId=3&response-content-disposition=attachment'.
        #[arg(long, value_name = "QUERY", default_value = "")]
        query: String,
        /// How long new downloads may begin with the link: 30m, 24h, 7d...
        #[arg(long, value_name = "DURATION", default_value = "24h")]
        expires_in: String,
        /// Only clients at this address or in this prefix may use it (192.0.2.7, 192.0.2.0/24).
        #[arg(long, value_name = "PREFIX")]
        client: Option<String>,
        /// The download id the link is for: a resume past the expiry is that download's only.
        #[arg(long, value_name = "ID")]
        download_id: Option<String>,
        /// The host the link is for, when routes are chosen by host.
        #[arg(long)]
        host: Option<String>,
        /// Sign with this key of the route's keys file rather than the newest.
        #[arg(long, value_name = "ID")]
        key_id: Option<String>,
    },
    /// Download URL to a file, resumably: in parallel pieces, never splicing two versions of an
    /// object, and verified against the digests the server publishes (docs/get.md).
    ///
    /// Exit codes: 0 done; 1 network failures past --retry-for; 2 bad arguments; 3 a digest does
    /// not match; 4 the server answered other than asked; 5 a local file error; 6 an HTTP error
    /// answer (404, 403...); 7 --decrypt or --gunzip failed.
    Get(rangeway_get::GetArgs),
    /// Validate a config, report every problem at once, and exit (0 when it is good).
    Check {
        /// The TOML config; without it, the embedded default is checked.
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A server logs as its config says, once it is read; every other command as by default.
    if !matches!(cli.command, Command::Serve { .. }) {
        rangeway::logging::init(LogFormat::Text, None);
    }
    let registry = StageRegistry::new();
    match cli.command {
        Command::Keygen => match aes128gcm::generate_key() {
            Ok(key) => {
                println!("{}", key.as_str());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("rangeway keygen: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Decrypt { key_file } => decrypt(&key_file),
        Command::Get(args) => match rangeway_get::run(&args) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rangeway get: {e}");
                ExitCode::from(e.exit_code())
            }
        },
        Command::Sign { config, path, query, expires_in, client, download_id, host, key_id } => {
            let loaded = match load(config.as_deref(), &registry) {
                Ok(loaded) => loaded,
                Err(errors) => return config_failure(config.as_deref(), &errors),
            };
            let request =
                SignRequest { path, query, expires_in, client, download_id, host, key_id };
            match sign(&loaded, &request) {
                Ok(link) => {
                    println!("{link}");
                    ExitCode::SUCCESS
                }
                Err(problem) => {
                    eprintln!("rangeway sign: {problem}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Check { config } => match load(config.as_deref(), &registry) {
            Ok(loaded) => {
                println!(
                    "{}: ok ({} upstreams, {} routes)",
                    source_name(config.as_deref()),
                    loaded.upstreams.len(),
                    loaded.routes.len()
                );
                let now = std::time::SystemTime::now();
                for warning in loaded.tls.iter().flat_map(|tls| tls.warnings(now)) {
                    println!("warning: {warning}");
                }
                ExitCode::SUCCESS
            }
            Err(errors) => config_failure(config.as_deref(), &errors),
        },
        Command::Serve { config, upgrade } => {
            let loaded = match load(config.as_deref(), &registry) {
                Ok(loaded) => loaded,
                Err(errors) => {
                    rangeway::logging::init(LogFormat::Text, None);
                    return config_failure(config.as_deref(), &errors);
                }
            };
            // Kept to the end: dropped, it sends the spans it still holds.
            let (_exporting, tracer) = match loaded.traces.as_ref().map(traces::pipeline) {
                Some(Ok((exporting, tracer))) => (Some(exporting), Some(tracer)),
                Some(Err(e)) => {
                    eprintln!("rangeway: cannot start: {e}");
                    return ExitCode::FAILURE;
                }
                None => (None, None),
            };
            rangeway::logging::init(loaded.log.format, tracer);
            match server::run(&loaded, registry, config, upgrade) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rangeway: cannot start: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The config at `path` (or the embedded default), with every route's chain built: a stage's bad
/// option is a config problem like any other.
fn load(path: Option<&Path>, registry: &StageRegistry) -> Result<Config, ConfigErrors> {
    let config = match path {
        Some(path) => Config::load(path, registry),
        None => Config::load_default(registry),
    }?;
    config.build_chains(registry)?;
    Ok(config)
}

/// `rangeway decrypt`: stdin through a [`Decrypting`] reader to stdout, in constant memory.
fn decrypt(key_file: &Path) -> ExitCode {
    use std::io::Write as _;
    let keys = match aes128gcm::read_key_file(key_file) {
        Ok(keys) => keys,
        Err(e) => {
            eprintln!("rangeway decrypt: {}: {e}", key_file.display());
            return ExitCode::from(2);
        }
    };
    let mut plaintext = Decrypting::new(std::io::stdin().lock(), &keys);
    let mut stdout = std::io::stdout().lock();
    match std::io::copy(&mut plaintext, &mut stdout).and_then(|_| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rangeway decrypt: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What `rangeway sign` was asked for.
struct SignRequest {
    path: String,
    query: String,
    expires_in: String,
    client: Option<String>,
    download_id: Option<String>,
    host: Option<String>,
    key_id: Option<String>,
}

/// The signed path and query for `request`, or what is wrong with it.
fn sign(config: &Config, request: &SignRequest) -> Result<String, String> {
    use rangeway::request_path::NormalizedPath;
    let path = NormalizedPath::parse(&request.path)
        .map_err(|e| format!("{}: {e} — give the path clients ask for", request.path))?;
    let lifetime = rangeway::values::units::parse_duration(&request.expires_in)
        .map_err(|e| format!("--expires-in {}: {e}", request.expires_in))?;
    let host = request.host.as_deref().map(str::to_ascii_lowercase);
    let route = config
        .routes
        .iter()
        .filter_map(|route| Some((route, NormalizedPath::parse(&route.path_prefix).ok()?)))
        .filter(|(route, prefix)| {
            rangeway::routes::takes(route.host.as_deref(), prefix, host.as_deref(), &path)
        })
        .min_by_key(|(route, prefix)| rangeway::routes::precedence(route.host.as_deref(), prefix))
        .map(|(route, _)| route)
        .ok_or_else(|| format!("no route serves {path} — check the path (and --host)"))?;
    let signed = route.signed_links.as_ref().ok_or_else(|| {
        format!(
            "the route {} serves {path} without signed links — add [routes.signed_links] to it",
            route.path_prefix
        )
    })?;
    if let Some(client) = request.client.as_deref().filter(|c| !rangeway::links::is_prefix(c)) {
        return Err(format!("--client {client}: give an address or a prefix (192.0.2.0/24)"));
    }
    // A `?` is how a URL writes a query, not part of it.
    let query = request.query.strip_prefix('?').unwrap_or(&request.query);
    if rangeway::proxy::download::without_download_id(query) != query {
        // It never reaches the origin, and a client may name its download by header as well.
        return Err(format!(
            "--query {query}: download_id is not signed — bind the link to a download with \
             --download-id"
        ));
    }
    let key_id = request.key_id.as_deref().unwrap_or(signed.keys.newest());
    let expires = rangeway::state::unix_now().saturating_add(lifetime.as_secs());
    let terms = rangeway::links::LinkTerms {
        expires,
        client: request.client.clone(),
        id: request.download_id.clone(),
    };
    let query = rangeway::links::sign(&signed.keys, key_id, &path.to_string(), query, &terms)
        .map_err(|e| match e {
            rangeway::links::SignError::UnknownKey(_) => format!("--key-id {key_id}: {e}"),
            _ => format!("--query {query}: {e}"),
        })?;
    // The path as a URL writes it; its signature is over the decoded path, as clients send it
    // encoded one way or another.
    const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'/')
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    let written = percent_encoding::utf8_percent_encode(&path.to_string(), KEEP).to_string();
    Ok(format!("{written}?{query}"))
}

fn source_name(path: Option<&Path>) -> String {
    path.map_or_else(|| "the embedded default config".to_owned(), |p| p.display().to_string())
}

fn config_failure(path: Option<&Path>, errors: &ConfigErrors) -> ExitCode {
    eprintln!("{}: the config has problems; nothing was started:\n{errors}", source_name(path));
    ExitCode::from(2)
}
