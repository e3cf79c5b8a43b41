//! `[state]`: where resume state lives.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::host::{Host, split_host_port};
use super::read::{Ctx, Field, Read, Table, read_small_file, suggest};
use super::secret::{self, Secret, SecretKey};
use super::tree::{self, Kind, Node, Origin};

const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
const MIN_TTL: Duration = Duration::from_secs(1);
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
const DEFAULT_KEY_PREFIX: &str = "rangeway:";
const DEFAULT_MAX_MEMORY: u64 = 256 << 20;
const MIN_MAX_MEMORY: u64 = 1 << 20;
const MAX_MAX_MEMORY: u64 = 1 << 40;
const DEFAULT_CLIENT_SHARE: f64 = 0.01;
const MAX_KEY_PREFIX_LEN: usize = 256;
const DEFAULT_REDIS_PORT: u16 = 6379;
const BACKENDS: [&str; 2] = ["memory", "redis"];
const REDIS_EXAMPLE: &str = "redis_url = \"redis://127.0.0.1:6379/0\"";
/// A key shorter than this could be guessed from the ids it derives.
const MIN_ID_KEY_LEN: usize = 32;
const ID_KEY_EXAMPLE: &str = "id_key_env = \"RANGEWAY_ID_KEY\"";
/// A key file larger than this is a wrong path.
const MAX_ID_KEY_FILE_LEN: u64 = 4096;

/// `[state]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateConfig {
    pub backend: StateBackend,
    /// Lifetime of every stored record, refreshed on use. Default 24h; 1s to 365d.
    pub ttl: Duration,
    /// Prefix of every key. Default `rangeway:`.
    pub key_prefix: String,
    /// The key download ids are derived with.
    pub id_key: IdKeySource,
    /// The most memory the records may take: the embedded store's bound (evicting the least
    /// recently used past it); with Redis, the size each client's share is a part of. Default
    /// 256 MiB, at least 1 MiB.
    pub max_memory: u64,
    /// What one client address (an IPv6 client: its /64) may hold of `max_memory`, so that no
    /// client pushes out the others' records: `client_share` (default 0.01) of it.
    pub max_client_memory: u64,
    /// Where the embedded store keeps its records across a restart or an upgrade of rangeway
    /// (`state::SnapshotFile`); with the memory backend only. None by default: a restart then
    /// forgets every download under way.
    pub snapshot_file: Option<PathBuf>,
}

/// Where the secret key that derived download ids are made with comes from (see
/// `proxy::download`): without it, anyone who knows a client's address and User-Agent could
/// compute that client's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdKeySource {
    /// `id_key_env` or `id_key_file`: read from that environment variable or file at load time,
    /// so that every instance of a deployment derives the same ids. Required with Redis.
    Configured(Secret),
    /// None configured, with the memory store: a random key of the process's own, which lives as
    /// long as the sessions it names.
    Generated,
}

/// The store behind the state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateBackend {
    /// Embedded, per instance: the default when no `redis_url` is given.
    Memory,
    Redis(RedisTarget),
}

/// What to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis://` or `rediss://`).
    Single(RedisUrl),
    /// A Redis Cluster, from a list of seed nodes or one `redis+cluster://` URL. All nodes share
    /// one scheme, and use database 0 (the only one a cluster has).
    Cluster(Vec<RedisUrl>),
}

/// A validated Redis URL.
///
/// [`RedisUrl::as_str`] is the URL to hand to the client, credentials included, with the scheme
/// `redis://` or `rediss://` (`redis+cluster://` is rewritten, the cluster mode being carried by
/// [`RedisTarget::Cluster`]). `Display` and `Debug` show it without credentials, query or fragment,
/// so it can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    url: String,
    tls: bool,
    host: Host,
    port: u16,
    db: u32,
    has_credentials: bool,
}

impl RedisUrl {
    /// The full URL for the Redis client. Contains the password, if any: never log it.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// Whether the connection uses TLS (`rediss://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The database number (0 when the URL names none).
    pub fn db(&self) -> u32 {
        self.db
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let credentials = if self.has_credentials { "***@" } else { "" };
        write!(f, "{scheme}://{credentials}{}:{}/{}", self.host, self.port, self.db)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

pub(super) fn read(ctx: &mut Ctx<'_>, node: Option<Node>) -> Read<StateConfig> {
    let mut table = match node {
        Some(node) => {
            Table::new(ctx, "state", "[state]", node, "[state] with backend = \"memory\"")?
        }
        None => Table::empty("state", "[state]"),
    };
    let backend = table.take("backend").map(|f| backend_name(ctx, f));
    let redis_url = table.take("redis_url").map(|f| redis_target(ctx, f));
    let ttl = table
        .take("ttl")
        .map_or(Ok(DEFAULT_TTL), |f| f.duration(ctx, MIN_TTL..=MAX_TTL, "from \"1s\" to \"365d\""));
    let key_prefix =
        table.take("key_prefix").map_or(Ok(DEFAULT_KEY_PREFIX.to_owned()), |f| key_prefix(ctx, f));
    let id_key_env = table.take("id_key_env").map(|f| id_key_env(ctx, f));
    let id_key_file = table.take("id_key_file").map(|f| id_key_file(ctx, f));
    let max_memory = table.take("max_memory").map_or(Ok(DEFAULT_MAX_MEMORY), |f| {
        f.size(ctx, MIN_MAX_MEMORY..=MAX_MAX_MEMORY, "\"256MiB\"")
    });
    let client_share = table.take("client_share").map_or(Ok(DEFAULT_CLIENT_SHARE), |f| {
        let path = f.path.clone();
        let share = f.ratio(ctx, "0.01")?;
        if share > 0.0 {
            return Ok(share);
        }
        Err(ctx.report_at(
            &path,
            "is 0: no client could keep a download's record",
            "write client_share = 0.01 (1 % of max_memory per client address), or more",
        ))
    });
    let snapshot_file = table.take("snapshot_file").map(|f| snapshot_file(ctx, f));
    table.finish(ctx);

    let backend = match (backend.transpose()?, redis_url) {
        // Without `backend`, a `redis_url` means Redis: an operator who wrote one and forgot
        // `backend` wants shared state, and silently running per-instance would break resumes
        // behind a load balancer.
        (None | Some(Backend::Redis), Some(target)) => StateBackend::Redis(target?),
        // An explicit "memory" wins over a redis_url (still checked, so that switching back to
        // Redis is one edit): the example config of the original design reads this way, and it lets an operator
        // turn Redis off with RANGEWAY__STATE__BACKEND=memory without touching the file.
        (Some(Backend::Memory), Some(target)) => {
            target?;
            StateBackend::Memory
        }
        (None | Some(Backend::Memory), None) => StateBackend::Memory,
        (Some(Backend::Redis), None) => {
            return Err(ctx.report_at(
                "state.redis_url",
                "is required when backend = \"redis\"",
                format!(
                    "add {REDIS_EXAMPLE} (or a list of node URLs for a cluster), or use \
                     backend = \"memory\""
                ),
            ));
        }
    };
    let snapshot_file = match (snapshot_file.transpose(), &backend) {
        (Ok(Some(_)), StateBackend::Redis(_)) => Err(ctx.report_at(
            "state.snapshot_file",
            "is for the memory store: Redis keeps the records itself",
            "remove snapshot_file, or use backend = \"memory\"",
        )),
        (file, _) => file,
    };
    let id_key = match (id_key_env.transpose()?, id_key_file.transpose()?, &backend) {
        (Some(_), Some(_), _) => {
            return Err(ctx.report_at(
                "state.id_key_file",
                "is given with id_key_env: the key would come from two places",
                "keep one of id_key_env and id_key_file",
            ));
        }
        (Some(key), None, _) | (None, Some(key), _) => IdKeySource::Configured(key),
        (None, None, StateBackend::Memory) => IdKeySource::Generated,
        (None, None, StateBackend::Redis(_)) => {
            return Err(ctx.report_at(
                "state.id_key_env",
                "is required with backend = \"redis\": every instance sharing the store must \
                 derive the same download ids, from a secret key",
                format!(
                    "add {ID_KEY_EXAMPLE} and export RANGEWAY_ID_KEY with {MIN_ID_KEY_LEN} or \
                     more random characters (e.g. from `openssl rand -hex 32`), the same for \
                     every instance; or id_key_file = \"/path/to/key\" naming a file that \
                     holds them"
                ),
            ));
        }
    };
    let (max_memory, client_share) = (max_memory?, client_share?);
    Ok(StateConfig {
        backend,
        ttl: ttl?,
        key_prefix: key_prefix?,
        id_key,
        max_memory,
        max_client_memory: share_of(max_memory, client_share),
        snapshot_file: snapshot_file?,
    })
}

/// `snapshot_file`: a path, its folder created at start if missing.
fn snapshot_file(ctx: &mut Ctx<'_>, field: Field) -> Read<PathBuf> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let file = field.string(ctx, "\"/var/lib/rangeway/sessions\"")?;
    if file.is_empty() || file.ends_with('/') {
        return Err(ctx.report(
            &path,
            &origin,
            "does not name a file",
            "name a file in a folder rangeway may write, e.g. snapshot_file = \"/var/lib/rangeway/sessions\"",
        ));
    }
    Ok(PathBuf::from(file))
}

/// `share` (from 0 to 1) of `bytes`, at least one byte.
fn share_of(bytes: u64, share: f64) -> u64 {
    // Within f64's exact integers: `bytes` is at most 1 TiB.
    ((bytes as f64 * share) as u64).max(1)
}

fn id_key_env(ctx: &mut Ctx<'_>, field: Field) -> Read<Secret> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let key = SecretKey {
        example: ID_KEY_EXAMPLE,
        holds: "the key",
        source_hint: " (e.g. from `openssl rand -hex 32`), the same for every instance",
        otherwise: "or remove id_key_env (with the memory store only)",
    };
    let (var, secret) = secret::read_env(ctx, field, &key)?;
    if secret.expose().len() < MIN_ID_KEY_LEN {
        return Err(ctx.report(
            &path,
            &origin,
            format!("the key in {var} is shorter than {MIN_ID_KEY_LEN} characters"),
            "use a longer random key, e.g. from `openssl rand -hex 32`",
        ));
    }
    Ok(secret)
}

/// `id_key_file`: a file holding the key (a line of printable ASCII; one trailing newline is
/// allowed). Its content is never shown.
fn id_key_file(ctx: &mut Ctx<'_>, field: Field) -> Read<Secret> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let file = field.string(ctx, "\"/etc/rangeway/id_key\"")?;
    let fix = "write a key of 32 or more printable characters into it, e.g. \
               `openssl rand -hex 32 > FILE`, the same file for every instance";
    let bytes = read_small_file(&file, MAX_ID_KEY_FILE_LEN)
        .map_err(|problem| ctx.report(&path, &origin, problem, fix))?;
    let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    if text.len() < MIN_ID_KEY_LEN || !text.iter().all(u8::is_ascii_graphic) {
        return Err(ctx.report(
            &path,
            &origin,
            format!(
                "{file:?} does not hold a key of {MIN_ID_KEY_LEN} or more printable characters \
                 without spaces"
            ),
            fix,
        ));
    }
    Ok(Secret::new(String::from_utf8_lossy(text).into_owned()))
}

enum Backend {
    Memory,
    Redis,
}

fn backend_name(ctx: &mut Ctx<'_>, field: Field) -> Read<Backend> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let name = field.string(ctx, "\"memory\"")?;
    match name.as_str() {
        "memory" => Ok(Backend::Memory),
        "redis" => Ok(Backend::Redis),
        _ => Err(ctx.report(
            &path,
            &origin,
            format!("unknown backend {name:?}"),
            match suggest(&name, BACKENDS) {
                Some(near) => format!("did you mean \"{near}\"?"),
                None => "use \"memory\" or \"redis\"".to_owned(),
            },
        )),
    }
}

fn key_prefix(ctx: &mut Ctx<'_>, field: Field) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let prefix = field.string(ctx, "\"rangeway:\"")?;
    if prefix.len() > MAX_KEY_PREFIX_LEN || !prefix.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ctx.report(
            &path,
            &origin,
            format!("{prefix:?} is not a usable key prefix"),
            format!(
                "use at most {MAX_KEY_PREFIX_LEN} printable ASCII characters without spaces, \
                 e.g. \"rangeway:\""
            ),
        ));
    }
    Ok(prefix)
}

/// `redis_url`: a URL, or a list of cluster nodes. From the environment a list is written as a TOML
/// array, e.g. `RANGEWAY__STATE__REDIS_URL='["redis://a:6379", "redis://b:6379"]'`.
///
/// No message here repeats the URL: it may hold a password.
fn redis_target(ctx: &mut Ctx<'_>, field: Field) -> Read<RedisTarget> {
    let Field { path, node, .. } = field;
    let list_fix =
        "write redis_url = \"redis://HOST:6379/0\", or a list of node URLs for a cluster";
    let node = match (&node.kind, &node.origin) {
        (Kind::Str(text), Origin::Env(var)) if text.trim_start().starts_with('[') => {
            match tree::parse_toml(&format!("v = {text}"), var).ok().and_then(|root| {
                match root.kind {
                    Kind::Table(mut t) => t.remove("v"),
                    _ => None,
                }
            }) {
                Some(parsed) => Node { kind: parsed.kind, origin: node.origin.clone() },
                None => {
                    return Err(ctx.report(
                        &path,
                        &node.origin,
                        "starts with '[' but is not a TOML array of strings",
                        "write it as [\"redis://HOST:6379\", \"redis://HOST2:6379\"]",
                    ));
                }
            }
        }
        _ => node,
    };
    match node.kind {
        Kind::Str(text) => match redis_url(&text) {
            Ok((url, false)) => Ok(RedisTarget::Single(url)),
            Ok((url, true)) => cluster_node(url)
                .map(|url| RedisTarget::Cluster(vec![url]))
                .map_err(|(problem, fix)| ctx.report(&path, &node.origin, problem, fix)),
            Err((problem, fix)) => Err(ctx.report(&path, &node.origin, problem, fix)),
        },
        Kind::Array(items) if items.is_empty() => {
            Err(ctx.report(&path, &node.origin, "the list of cluster nodes is empty", list_fix))
        }
        Kind::Array(items) => {
            let mut nodes = Ok(Vec::with_capacity(items.len()));
            for (i, item) in items.into_iter().enumerate() {
                let parsed = match item.kind {
                    Kind::Str(text) => redis_url(&text).and_then(|(url, _)| cluster_node(url)),
                    _ => Err((
                        format!("expected a URL string, found {}", item.type_name()),
                        list_fix.to_owned(),
                    )),
                };
                match (&mut nodes, parsed) {
                    (Ok(list), Ok(url)) => list.push(url),
                    (_, Err((problem, fix))) => {
                        let item_path = format!("{path}[{i}]");
                        nodes = Err(ctx.report(&item_path, &item.origin, problem, fix));
                    }
                    (Err(_), Ok(_)) => {}
                }
            }
            let nodes = nodes?;
            let first_tls = nodes.first().map(RedisUrl::tls);
            if nodes.iter().any(|n| Some(n.tls) != first_tls) {
                return Err(ctx.report(
                    &path,
                    &node.origin,
                    "mixes redis:// and rediss:// nodes",
                    "use rediss:// for every node of a TLS cluster, redis:// for every node \
                     otherwise",
                ));
            }
            Ok(RedisTarget::Cluster(nodes))
        }
        _ => Err(ctx.report(
            &path,
            &node.origin,
            format!("expected a URL string or a list of them, found {}", node.type_name()),
            list_fix,
        )),
    }
}

/// A cluster has database 0 only; a URL naming another would be silently wrong.
fn cluster_node(url: RedisUrl) -> Result<RedisUrl, (String, String)> {
    if url.db == 0 {
        Ok(url)
    } else {
        Err((
            format!("names database {}, but Redis Cluster has database 0 only", url.db),
            "remove the database number from the URL, or end it with /0".to_owned(),
        ))
    }
}

/// Parses one Redis URL: `redis://[[user]:password@]host[:port][/db][?query][#fragment]`, the
/// scheme being `redis`, `rediss` or `redis+cluster`. Query and fragment are the client's business
/// (`?protocol=resp3`, `#insecure`) and are passed through. Returns whether the scheme asks for a
/// cluster.
fn redis_url(text: &str) -> Result<(RedisUrl, bool), (String, String)> {
    let example =
        "write it as redis://[:PASSWORD@]HOST[:PORT][/DB], e.g. \"redis://127.0.0.1:6379/0\"";
    let fail = |problem: &str| Err((problem.to_owned(), example.to_owned()));
    let Some((scheme, rest)) = text.trim().split_once("://") else {
        return fail("is not a URL (no scheme://)");
    };
    let (tls, cluster) = match scheme.to_ascii_lowercase().as_str() {
        "redis" => (false, false),
        "rediss" => (true, false),
        "redis+cluster" => (false, true),
        "rediss+cluster" => {
            return Err((
                "the scheme rediss+cluster:// is not supported".to_owned(),
                "for a TLS cluster, list the nodes: redis_url = [\"rediss://HOST1:6379\", \
                 \"rediss://HOST2:6379\"]"
                    .to_owned(),
            ));
        }
        // Only well-known schemes are repeated: an unknown "scheme" may be part of a secret
        // pasted in the wrong place.
        s @ ("http" | "https" | "tcp" | "unix" | "redis+unix" | "valkey" | "valkeys") => {
            return Err((
                format!("the scheme {s}:// is not supported"),
                "use redis://, rediss:// (TLS) or redis+cluster://".to_owned(),
            ));
        }
        _ => {
            return fail(
                "the scheme is not supported; use redis://, rediss:// or redis+cluster://",
            );
        }
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (has_credentials, host_port) = match authority.rsplit_once('@') {
        Some((_, host_port)) => (true, host_port),
        None => (false, authority),
    };
    let (host, port) = split_host_port(host_port).map_err(|e| (e, example.to_owned()))?;
    let (path, _query_and_fragment) = tail.split_at(tail.find(['?', '#']).unwrap_or(tail.len()));
    let db = match path.strip_prefix('/') {
        None | Some("") => 0,
        Some(digits) if digits.bytes().all(|b| b.is_ascii_digit()) => match digits.parse::<u32>() {
            Ok(db) => db,
            Err(_) => return fail("the database number is too large"),
        },
        Some(_) => return fail("the path must be a database number, e.g. /0"),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    Ok((
        RedisUrl {
            url: format!("{scheme}://{rest}"),
            tls,
            host,
            port: port.unwrap_or(DEFAULT_REDIS_PORT),
            db,
            has_credentials,
        },
        cluster,
    ))
}
