//! rangeway's configuration: a TOML file, overridden by `RANGEWAY__SECTION__KEY` environment
//! variables, checked in one pass that reports every problem with its key path, its fix and where
//! the value is. docs/configuration.md is the reference for users. `source.rs` layers the sources
//! with the `config` crate and keeps where each value came from; `raw.rs` holds serde-derived raw
//! structs that take any value, so that deserialising never stops at a bad one; `check.rs` and a
//! file per section make the typed [`Config`], only ever built when everything is good. No error
//! repeats a URL with credentials or a secret.

mod cache;
mod chains;
mod check;
mod errors;
mod raw;
mod route;
mod server;
mod source;
mod state;
mod tls;
mod traces;
mod upstream;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::Path;

// cache/ is the crate's own: its config type is reachable through here.
pub use crate::cache::CacheConfig;
use crate::logging::LogConfig;
use crate::routes::RouteConfig;
use crate::routes::upstream::{UpstreamConfig, UpstreamKind};
use crate::state::StateConfig;
use crate::tls::TlsConfig;
use crate::traces::TracesConfig;
pub use errors::{ConfigError, ConfigErrors};
pub use server::ServerConfig;

use check::{Ctx, Problem, complete, read, wrong};
use rangeway_middleware::chain::{Chain, StageRegistry};
use raw::{Raw, RawConfig};
use source::{Env, Path as KeyPath};

/// The embedded default configuration (`config/default.toml`): one folder upstream, `./data`,
/// served under `/files/`.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// A config file larger than this is certainly a wrong path (a log, a disk image).
const MAX_FILE_LEN: u64 = 4 << 20;

/// A validated configuration: the optional sections are `None` when absent (traces off).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    pub server: ServerConfig,
    pub state: StateConfig,
    pub cache: Option<CacheConfig>,
    pub tls: Option<TlsConfig>,
    pub traces: Option<TracesConfig>,
    pub log: LogConfig,
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    /// In file order, at least one; no two share a host and a prefix.
    pub routes: Vec<RouteConfig>,
}

impl Config {
    /// Loads the file at `path` with the environment overrides, each route's middleware checked
    /// against what the stages of `stages` accept.
    ///
    /// # Errors
    /// One naming the file when it cannot be read or is not TOML, else every problem found.
    pub fn load(path: &Path, stages: &StageRegistry) -> Result<Self, ConfigErrors> {
        let name = path.display().to_string();
        let text = read_file(path)
            .map_err(|(problem, fix)| ConfigErrors(vec![ConfigError::new(&name, problem, fix)]))?;
        Self::from_sources(&text, &name, &Env::process(), stages)
    }

    /// Loads [`DEFAULT_TOML`] with the environment overrides: what runs when no file is given.
    ///
    /// # Errors
    /// As [`Config::load`]; only overrides can be at fault.
    pub fn load_default(stages: &StageRegistry) -> Result<Self, ConfigErrors> {
        Self::from_sources(DEFAULT_TOML, "the embedded default config", &Env::process(), stages)
    }

    /// Validates TOML text without environment overrides (the `*_env` keys are still looked up).
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_toml_str(text: &str, stages: &StageRegistry) -> Result<Self, ConfigErrors> {
        Self::from_sources(text, "the config text", &Env::process().without_overrides(), stages)
    }

    fn from_sources(
        text: &str,
        name: &str,
        env: &Env,
        stages: &StageRegistry,
    ) -> Result<Self, ConfigErrors> {
        let (raw, origins, errors) =
            source::load::<Raw<RawConfig>>(text, name, env).map_err(|e| ConfigErrors(vec![e]))?;
        let mut v = Ctx { errors: Vec::new(), env, origins: &origins, stages, file: name };
        let config = Self::check(&mut v, &raw);
        let errors = [errors, v.errors].concat();
        match config {
            Some(config) if errors.is_empty() => Ok(config),
            // A check returns `None` after reporting why; should one ever not, the load must
            // still fail with something said rather than an empty list.
            None if errors.is_empty() => Err(ConfigErrors(vec![ConfigError::new(
                name,
                "was refused without a reason",
                "report this as a bug of rangeway, with the config",
            )])),
            _ => Err(ConfigErrors(errors)),
        }
    }

    fn check(v: &mut Ctx<'_>, raw: &Raw<RawConfig>) -> Option<Self> {
        let at = KeyPath::default();
        let r = v.table(&at, raw, "[server]")?;
        let server = server::check(v, &at.key("server"), &r.server);
        let state = state::check(v, &at.key("state"), &r.state);
        read! { v, at, r;
            cache: nested(cache::check).opt();
            tls: nested(|v, at, raw| tls::check(v, at, raw, server.as_ref())).opt();
            traces: nested(traces::check).opt();
        }
        let log = traces::check_log(v, &at.key("log"), &r.log);
        let (upstreams, declared) = upstream::check_all(v, r.upstreams.as_ref());
        let folders = upstreams.iter().flatten();
        let folders = folders.filter(|(_, u)| matches!(u.kind, UpstreamKind::Dir { .. }));
        let around = route::RouteContext {
            declared: declared.as_ref(),
            folders: folders.map(|(name, _)| name.clone()).collect(),
            cache: matches!(cache, Some(Some(_))),
        };
        let routes = route::check_all(v, r.routes.as_ref(), &around);
        complete! { Self { server, state, cache, tls, traces, log, upstreams, routes } }
    }

    /// The chain of every route, in route order, built by `registry`.
    ///
    /// # Errors
    /// Every bad option and impossible order of stages (none, with the registry it was loaded by).
    pub fn build_chains(&self, registry: &StageRegistry) -> Result<Vec<Chain>, ConfigErrors> {
        let (mut chains, mut errors) = (Vec::with_capacity(self.routes.len()), Vec::new());
        for (index, route) in self.routes.iter().enumerate() {
            let at = KeyPath::default().key("routes").index(index);
            match chains::chain(registry, &at, &route.middleware) {
                Ok(chain) => chains.push(chain),
                Err(found) => errors.extend(
                    found
                        .into_iter()
                        .map(|(at, problem, fix)| ConfigError::new(at.to_string(), problem, fix)),
                ),
            }
        }
        if errors.is_empty() { Ok(chains) } else { Err(ConfigErrors(errors)) }
    }
}

/// The config file's text. Read through `take` rather than trusting the size in the metadata: the
/// file may be a pipe (`--config <(...)`), whose size is unknown.
fn read_file(path: &Path) -> Result<String, Problem> {
    let fix = "check the path given with --config and its permissions";
    let mut bytes = Vec::new();
    match std::fs::File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return wrong("the config file does not exist", fix);
        }
        Err(e) => return wrong(format!("the config file cannot be opened: {e}"), fix),
        // Opening a directory succeeds on Unix; reading it would fail with a vaguer message.
        Ok(file) if file.metadata().is_ok_and(|m| m.is_dir()) => {
            return wrong("is a directory, not a config file", fix);
        }
        Ok(file) => {
            if let Err(e) = file.take(MAX_FILE_LEN + 1).read_to_end(&mut bytes) {
                return wrong(format!("the config file cannot be read: {e}"), fix);
            }
        }
    }
    if bytes.len() as u64 > MAX_FILE_LEN {
        return wrong("is larger than 4 MiB, too large for a config file", fix);
    }
    String::from_utf8(bytes).or_else(|e| {
        let offset = e.utf8_error().valid_up_to();
        wrong(
            format!("is not UTF-8 text (invalid byte at offset {offset})"),
            "save the file as UTF-8",
        )
    })
}

#[cfg(test)]
mod tests;
