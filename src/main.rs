//! The `rangeway` command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rangeway::config::{Config, ConfigErrors};
use rangeway::server;
use rangeway_middleware::aes128gcm::{self, Decryptor};
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
    /// Validate a config, report every problem at once, and exit (0 when it is good).
    Check {
        /// The TOML config; without it, the embedded default is checked.
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    rangeway::logging::init();
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
        Command::Check { config } => match load(config.as_deref(), &registry) {
            Ok(loaded) => {
                println!(
                    "{}: ok ({} upstreams, {} routes)",
                    source_name(config.as_deref()),
                    loaded.upstreams.len(),
                    loaded.routes.len()
                );
                ExitCode::SUCCESS
            }
            Err(errors) => config_failure(config.as_deref(), &errors),
        },
        Command::Serve { config, upgrade } => {
            let loaded = match load(config.as_deref(), &registry) {
                Ok(loaded) => loaded,
                Err(errors) => return config_failure(config.as_deref(), &errors),
            };
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

/// `rangeway decrypt`: stdin through a [`Decryptor`] to stdout, one read buffer at a time.
fn decrypt(key_file: &Path) -> ExitCode {
    use std::io::{Read as _, Write as _};
    let keys = match aes128gcm::read_key_file(key_file) {
        Ok(keys) => keys,
        Err(e) => {
            eprintln!("rangeway decrypt: {}: {e}", key_file.display());
            return ExitCode::from(2);
        }
    };
    let mut decryptor = Decryptor::new(&keys);
    let (mut stdin, mut stdout) = (std::io::stdin().lock(), std::io::stdout().lock());
    let mut input = vec![0; 256 << 10];
    let mut output = Vec::with_capacity(input.len());
    loop {
        let read = match stdin.read(&mut input) {
            Ok(0) => break,
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("rangeway decrypt: reading stdin: {e}");
                return ExitCode::FAILURE;
            }
        };
        let pushed = decryptor.push(&input[..read], &mut output);
        if let Err(e) = stdout.write_all(&output) {
            eprintln!("rangeway decrypt: writing stdout: {e}");
            return ExitCode::FAILURE;
        }
        output.clear();
        if let Err(e) = pushed {
            eprintln!("rangeway decrypt: {e}");
            return ExitCode::FAILURE;
        }
    }
    let finished = decryptor.finish(&mut output);
    if let Err(e) = stdout.write_all(&output).and_then(|()| stdout.flush()) {
        eprintln!("rangeway decrypt: writing stdout: {e}");
        return ExitCode::FAILURE;
    }
    match finished {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rangeway decrypt: {e}");
            ExitCode::FAILURE
        }
    }
}

fn source_name(path: Option<&Path>) -> String {
    path.map_or_else(|| "the embedded default config".to_owned(), |p| p.display().to_string())
}

fn config_failure(path: Option<&Path>, errors: &ConfigErrors) -> ExitCode {
    eprintln!("{}: the config has problems; nothing was started:\n{errors}", source_name(path));
    ExitCode::from(2)
}
