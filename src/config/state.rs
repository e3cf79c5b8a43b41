//! `[state]`: where resume state lives, and the key download ids are derived with.

use std::borrow::Cow;

use ::config::{Value, ValueKind};

use super::check::{Ctx, DAY, complete, read, secs, suggest, type_name, wrong};
use super::raw::{Raw, RawState};
use super::source::Path;
use crate::fingerprint::{IdKeySource, MIN_KEY_LEN as MIN_ID_KEY_LEN, env_key, read_key_file};
use crate::state::{RedisTarget, SnapshotFile, StateBackend, StateConfig};
use crate::values::redis_url::RedisUrl;
use crate::values::secret::{Secret, SecretVar};

const ID_KEY_EXAMPLE: &str = "id_key_env = \"RANGEWAY_ID_KEY\"";

pub(super) fn check(v: &mut Ctx<'_>, at: &Path, raw: &Raw<RawState>) -> Option<StateConfig> {
    let r = v.table(at, raw, "[state] with backend = \"memory\"")?;
    let backend = backend(v, at, r);
    let snapshot = "\"/var/lib/rangeway/sessions\"";
    read! { v, at, r;
        ttl: duration(secs(1)..=secs(365 * DAY)).or(secs(DAY));
        key_prefix: parsed("\"rangeway:\"", StateConfig::key_prefix).or("rangeway:".to_owned());
        id_key_env: nested(id_key_env).opt();
        id_key_file: parsed("\"/etc/rangeway/id_key\"", read_key_file).opt();
        max_memory: size(1 << 20..=1 << 40, "\"256MiB\"").or(256 << 20);
        client_share: ratio().then(|share| some_share(v, at, share)).or(0.01);
        snapshot_file: parsed(snapshot, |file| SnapshotFile::path(file, snapshot)).opt();
    }
    let backend = backend?;
    let snapshot_file = match (snapshot_file, &backend) {
        (Some(Some(_)), StateBackend::Redis(_)) => v.fail(
            &at.key("snapshot_file"),
            "is for the memory store: Redis keeps the records itself",
            "remove snapshot_file, or use backend = \"memory\"",
        ),
        (file, _) => file,
    };
    let id_key = id_key(v, at, id_key_env?, id_key_file?, &backend)?;
    let (max_memory, client_share) = (max_memory?, client_share?);
    // Within f64's exact integers: `max_memory` is at most 1 TiB.
    let max_client_memory = Some(((max_memory as f64 * client_share) as u64).max(1));
    let (backend, id_key, max_memory) = (Some(backend), Some(id_key), Some(max_memory));
    complete! { StateConfig {
        backend, ttl, key_prefix, id_key, max_memory, max_client_memory, snapshot_file,
    } }
}

fn some_share(v: &mut Ctx<'_>, at: &Path, share: f64) -> Option<f64> {
    if share > 0.0 {
        return Some(share);
    }
    v.fail(
        &at.key("client_share"),
        "is 0: no client could keep a download's record",
        "write client_share = 0.01 (1 % of max_memory per client address), or more",
    )
}

/// `backend` and `redis_url`, which together say where state lives.
fn backend(v: &mut Ctx<'_>, at: &Path, r: &RawState) -> Option<StateBackend> {
    let backend = v.parsed(&at.key("backend"), &r.backend, "\"memory\"", |name| {
        if let known @ ("memory" | "redis") = name {
            return Ok(known == "redis");
        }
        let fix = match suggest(name, ["memory", "redis"]) {
            Some(near) => format!("did you mean \"{near}\"?"),
            None => "use \"memory\" or \"redis\"".to_owned(),
        };
        wrong(format!("unknown backend {name:?}"), fix)
    });
    let redis_url = r.redis_url.as_ref().map(|value| redis_target(v, &at.key("redis_url"), value));
    Some(match (backend.opt()?, redis_url) {
        // Without `backend`, a `redis_url` means Redis: an operator who wrote one and forgot
        // `backend` wants shared state, and silently running per-instance would break resumes
        // behind a load balancer.
        (None | Some(true), Some(target)) => StateBackend::Redis(target?),
        // An explicit "memory" wins over a redis_url (still checked, so that switching back to
        // Redis is one edit), as in the original design's example, and so that
        // RANGEWAY__STATE__BACKEND=memory turns Redis off.
        (Some(false), Some(target)) => target.map(|_| StateBackend::Memory)?,
        (None | Some(false), None) => StateBackend::Memory,
        (Some(true), None) => {
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
    let key = SecretVar {
        example: ID_KEY_EXAMPLE,
        holds: "the key",
        source_hint: " (e.g. from `openssl rand -hex 32`), the same for every instance",
        otherwise: "or remove id_key_env (with the memory store only)",
    };
    let (var, secret) = v.secret(at, value, &key)?;
    v.check(at, env_key(&var, secret))
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
        ValueKind::String(text) => v.check(at, RedisTarget::parse(text)),
        ValueKind::Array(items) if items.is_empty() => {
            v.fail(at, "the list of cluster nodes is empty", list_fix)
        }
        ValueKind::Array(_) => {
            let example = "\"redis://HOST:6379/0\", or a list of node URLs for a cluster";
            let nodes = v.strings(at, &*value, "a URL string", example, |text| {
                RedisUrl::parse(text).and_then(|(url, _)| url.cluster_node())
            });
            v.check(at, RedisTarget::cluster(nodes.or(Vec::new())?))
        }
        _ => v.fail(
            at,
            format!("expected a URL string or a list of them, found {}", type_name(&value)),
            list_fix,
        ),
    }
}
