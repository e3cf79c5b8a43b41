//! `[state]`: where resume state lives, and the key download ids are derived with.

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Duration;

use ::config::{Value, ValueKind};

use super::check::{Ctx, Problem, checked, complete, suggest, type_name, wrong};
use super::raw::{Raw, RawState};
use super::secret::{self, SecretKey};
use super::source::Path;
use crate::values::redis_url::RedisUrl;
use crate::values::secret::Secret;
use crate::values::small_file::read_small_file;

/// A key shorter than this could be guessed from the ids it derives.
const MIN_ID_KEY_LEN: usize = 32;
const ID_KEY_EXAMPLE: &str = "id_key_env = \"RANGEWAY_ID_KEY\"";

/// `[state]`; docs/configuration.md describes each key and its default.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateConfig {
    pub backend: StateBackend,
    /// Lifetime of every stored record, refreshed on use.
    pub ttl: Duration,
    pub key_prefix: String,
    pub id_key: IdKeySource,
    /// The embedded store's bound; with Redis, the size each client's share is a part of.
    pub max_memory: u64,
    /// What one client address (an IPv6 client: its /64) may hold: `client_share` of
    /// `max_memory`, so that no client pushes out the others' records.
    pub max_client_memory: u64,
    /// Where the embedded store keeps its records across a restart (`state::SnapshotFile`).
    pub snapshot_file: Option<PathBuf>,
}

/// Where the secret key download ids are derived with comes from (see `proxy::download`):
/// without it, anyone who knows a client's address and User-Agent could compute its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdKeySource {
    /// `id_key_env` or `id_key_file`, so that every instance of a deployment derives the same
    /// ids. Required with Redis.
    Configured(Secret),
    /// None configured, with the memory store: a random key of the process's own, which lives as
    /// long as the sessions it names.
    Generated,
}

/// The store behind the state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateBackend {
    /// Embedded, per instance.
    Memory,
    Redis(RedisTarget),
}

/// What to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis://` or `rediss://`).
    Single(RedisUrl),
    /// A Redis Cluster, from a list of seed nodes or one `redis+cluster://` URL: all of one
    /// scheme, database 0 (the only one a cluster has).
    Cluster(Vec<RedisUrl>),
}

#[derive(Clone, Copy)]
enum Backend {
    Memory,
    Redis,
}

pub(super) fn check(v: &mut Ctx<'_>, raw: &Raw<RawState>) -> Option<StateConfig> {
    let at = Path::default().key("state");
    let r = v.table(&at, raw, "[state] with backend = \"memory\"")?;
    let key = |key: &str| at.key(key);
    let backend = backend(v, &at, r);
    let ttl = Duration::from_secs(1)..=Duration::from_secs(365 * 24 * 3600);
    let ttl = v.duration(&key("ttl"), &r.ttl, ttl).or(Duration::from_secs(24 * 3600));
    let key_prefix = v.parsed(&key("key_prefix"), &r.key_prefix, "\"rangeway:\"", |prefix| {
        if prefix.len() <= 256 && prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Ok(prefix.to_owned());
        }
        wrong(
            format!("{prefix:?} is not a usable key prefix"),
            "use at most 256 printable ASCII characters without spaces, e.g. \"rangeway:\"",
        )
    });
    let key_prefix = key_prefix.or("rangeway:".to_owned());
    let id_key_env =
        checked(r.id_key_env.as_ref(), |value| id_key_env(v, &key("id_key_env"), value));
    let id_key_file =
        v.parsed(&key("id_key_file"), &r.id_key_file, "\"/etc/rangeway/id_key\"", id_key_file);
    let max_memory = v.size(&key("max_memory"), &r.max_memory, 1 << 20..=1 << 40, "\"256MiB\"");
    let client_share = v.ratio(&key("client_share"), &r.client_share, "0.01").then(|share| {
        if share > 0.0 {
            return Some(share);
        }
        v.fail(
            &key("client_share"),
            "is 0: no client could keep a download's record",
            "write client_share = 0.01 (1 % of max_memory per client address), or more",
        )
    });
    let example = "\"/var/lib/rangeway/sessions\"";
    let snapshot_file = v.parsed(&key("snapshot_file"), &r.snapshot_file, example, |file| {
        if file.is_empty() || file.ends_with('/') {
            let fix = format!(
                "name a file in a folder rangeway may write, e.g. snapshot_file = {example}"
            );
            return wrong("does not name a file", fix);
        }
        Ok(PathBuf::from(file))
    });

    let backend = backend?;
    let snapshot_file = match (snapshot_file.opt(), &backend) {
        (Some(Some(_)), StateBackend::Redis(_)) => v.fail(
            &key("snapshot_file"),
            "is for the memory store: Redis keeps the records itself",
            "remove snapshot_file, or use backend = \"memory\"",
        ),
        (file, _) => file,
    };
    let id_key = id_key(v, &at, id_key_env?, id_key_file.opt()?, &backend)?;
    let (max_memory, client_share) = (max_memory.or(256 << 20)?, client_share.or(0.01)?);
    // Within f64's exact integers: `max_memory` is at most 1 TiB.
    let max_client_memory = Some(((max_memory as f64 * client_share) as u64).max(1));
    let (backend, id_key, max_memory) = (Some(backend), Some(id_key), Some(max_memory));
    complete! { StateConfig {
        backend, ttl, key_prefix, id_key, max_memory, max_client_memory, snapshot_file,
    } }
}

/// `backend` and `redis_url`, which together say where state lives.
fn backend(v: &mut Ctx<'_>, at: &Path, r: &RawState) -> Option<StateBackend> {
    let backends = [("memory", Backend::Memory), ("redis", Backend::Redis)];
    let backend = v.choice(&at.key("backend"), &r.backend, "\"memory\"", &backends, |name| {
        let fix = match suggest(name, ["memory", "redis"]) {
            Some(near) => format!("did you mean \"{near}\"?"),
            None => "use \"memory\" or \"redis\"".to_owned(),
        };
        (format!("unknown backend {name:?}"), fix)
    });
    let redis_url = r.redis_url.as_ref().map(|value| redis_target(v, &at.key("redis_url"), value));
    Some(match (backend.opt()?, redis_url) {
        // Without `backend`, a `redis_url` means Redis: an operator who wrote one and forgot
        // `backend` wants shared state, and silently running per-instance would break resumes
        // behind a load balancer.
        (None | Some(Backend::Redis), Some(target)) => StateBackend::Redis(target?),
        // An explicit "memory" wins over a redis_url (still checked, so that switching back to
        // Redis is one edit): the example config of the original design reads this way, and it
        // lets an operator turn Redis off with RANGEWAY__STATE__BACKEND=memory.
        (Some(Backend::Memory), Some(target)) => target.map(|_| StateBackend::Memory)?,
        (None | Some(Backend::Memory), None) => StateBackend::Memory,
        (Some(Backend::Redis), None) => {
            return v.fail(
                &at.key("redis_url"),
                "is required when backend = \"redis\"",
                "add redis_url = \"redis://127.0.0.1:6379/0\" (or a list of node URLs for a \
                 cluster), or use backend = \"memory\"",
            );
        }
    })
}

/// The download ids' key: from `id_key_env` or `id_key_file`, one at most; with the memory
/// store, a key of the process's own when neither is set.
fn id_key(
    v: &mut Ctx<'_>,
    at: &Path,
    from_env: Option<Secret>,
    from_file: Option<Secret>,
    backend: &StateBackend,
) -> Option<IdKeySource> {
    Some(match (from_env, from_file, backend) {
        (Some(_), Some(_), _) => {
            return v.fail(
                &at.key("id_key_file"),
                "is given with id_key_env: the key would come from two places",
                "keep one of id_key_env and id_key_file",
            );
        }
        (Some(key), None, _) | (None, Some(key), _) => IdKeySource::Configured(key),
        (None, None, StateBackend::Memory) => IdKeySource::Generated,
        (None, None, StateBackend::Redis(_)) => {
            return v.fail(
                &at.key("id_key_env"),
                "is required with backend = \"redis\": every instance sharing the store must derive \
                 the same download ids, from a secret key",
                format!(
                    "add {ID_KEY_EXAMPLE} and export RANGEWAY_ID_KEY with {MIN_ID_KEY_LEN} or more \
                     random characters (e.g. from `openssl rand -hex 32`), the same for every \
                     instance; or id_key_file = \"/path/to/key\" naming a file that holds them"
                ),
            );
        }
    })
}

fn id_key_env(v: &mut Ctx<'_>, at: &Path, value: &Value) -> Option<Secret> {
    let key = SecretKey {
        example: ID_KEY_EXAMPLE,
        holds: "the key",
        source_hint: " (e.g. from `openssl rand -hex 32`), the same for every instance",
        otherwise: "or remove id_key_env (with the memory store only)",
    };
    let (var, secret) = secret::read_env(v, at, value, &key)?;
    if secret.expose().len() < MIN_ID_KEY_LEN {
        return v.fail(
            at,
            format!("the key in {var} is shorter than {MIN_ID_KEY_LEN} characters"),
            "use a longer random key, e.g. from `openssl rand -hex 32`",
        );
    }
    Some(secret)
}

/// `id_key_file`: a file holding the key (a line of printable ASCII; one trailing newline is
/// allowed). Its content is never shown.
fn id_key_file(file: &str) -> Result<Secret, Problem> {
    let fix = "write a key of 32 or more printable characters into it, e.g. \
               `openssl rand -hex 32 > FILE`, the same file for every instance";
    // A key file larger than 4 KiB is a wrong path.
    let bytes = read_small_file(file, 4096).or_else(|problem| wrong(problem, fix))?;
    let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    if text.len() < MIN_ID_KEY_LEN || !text.iter().all(u8::is_ascii_graphic) {
        let problem = format!(
            "{file:?} does not hold a key of {MIN_ID_KEY_LEN} or more printable characters without spaces"
        );
        return wrong(problem, fix);
    }
    Ok(Secret::new(String::from_utf8_lossy(text).into_owned()))
}

/// `redis_url`: a URL, or a list of cluster nodes. From the environment a list is written as a TOML
/// array, e.g. `RANGEWAY__STATE__REDIS_URL='["redis://a:6379", "redis://b:6379"]'`.
///
/// No message here repeats the URL: it may hold a password.
fn redis_target(v: &mut Ctx<'_>, at: &Path, value: &Value) -> Option<RedisTarget> {
    let list_fix =
        "write redis_url = \"redis://HOST:6379/0\", or a list of node URLs for a cluster";
    // From a variable, only a list is read as TOML: any other text is a URL.
    let value = match &value.kind {
        ValueKind::String(text) if text.trim_start().starts_with('[') => v.scalar(at, value),
        _ => Cow::Borrowed(value),
    };
    match &value.kind {
        ValueKind::String(text) if v.set_by_env(at) && text.trim_start().starts_with('[') => v
            .fail(
                at,
                "starts with '[' but is not a TOML array of strings",
                "write it as [\"redis://HOST:6379\", \"redis://HOST2:6379\"]",
            ),
        ValueKind::String(text) => {
            let target = RedisUrl::parse(text).and_then(|(url, cluster)| match cluster {
                true => url.cluster_node().map(|url| RedisTarget::Cluster(vec![url])),
                false => Ok(RedisTarget::Single(url)),
            });
            v.check(at, target)
        }
        ValueKind::Array(items) if items.is_empty() => {
            v.fail(at, "the list of cluster nodes is empty", list_fix)
        }
        ValueKind::Array(_) => {
            let example = "\"redis://HOST:6379/0\", or a list of node URLs for a cluster";
            let nodes = v.strings(at, &*value, "a URL string", example, |text| {
                RedisUrl::parse(text).and_then(|(url, _)| url.cluster_node())
            });
            let nodes = nodes.or(Vec::new())?;
            if nodes.iter().any(|node| node.tls() != nodes[0].tls()) {
                return v.fail(
                    at,
                    "mixes redis:// and rediss:// nodes",
                    "use rediss:// for every node of a TLS cluster, redis:// for every node otherwise",
                );
            }
            Some(RedisTarget::Cluster(nodes))
        }
        _ => v.fail(
            at,
            format!("expected a URL string or a list of them, found {}", type_name(&value)),
            list_fix,
        ),
    }
}
