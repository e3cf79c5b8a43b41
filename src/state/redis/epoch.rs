//! Telling when Redis lost what it held, so that a session it lost is not read as one never
//! begun (see `state::losses`).
//!
//! The key `{prefix}epoch` is a hash no instance gives a TTL:
//!
//! - `id`: a random name, set by the first instance to find the hash missing. Every lookup reads
//!   it beside the session; a hash gone or named anew means the data went with it (`FLUSHALL`,
//!   a restart without persistence, the key evicted).
//! - `run_id`: the Redis process that last answered a check (`INFO server`). Another one means a
//!   restart or a failover, which may have lost the writes since the last persistence or
//!   replication.
//! - `lost_at`: the latest loss any instance knew of (a write that failed while Redis was
//!   unreachable is known only to the instance that made it), so that every instance sharing the
//!   store treats it alike.
//!
//! Each instance also watches, on every primary of a cluster, `run_id` (another process: a restart
//! or a failover; on a cluster also a primary at a new address) and `evicted_keys` (`INFO
//! stats`: keys evicted under `maxmemory`), losses it cannot trace to ids.
//!
//! On a Redis Cluster the epoch lives on the node that owns its slot: a node that is flushed
//! while its process goes on, or that restarts while no instance watches, is not seen.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{Cmd, Script, Value};

use super::{Conn, StoreError, instance_id};
use crate::state::losses::{Loss, Losses};

/// Sets `lost_at` to the later of its value and ARGV[1].
const PUBLISH_LOSS: &str = r"
local stored = tonumber(redis.call('HGET', KEYS[1], 'lost_at') or '0') or 0
if tonumber(ARGV[1]) > stored then redis.call('HSET', KEYS[1], 'lost_at', ARGV[1]) end
return 1
";

pub(super) struct Epoch {
    key: String,
    publish: Script,
    known: Mutex<Known>,
}

/// What this instance saw at its last check.
#[derive(Debug, Default)]
struct Known {
    id: Option<String>,
    /// By node (`""` for a single server): its `run_id` and `evicted_keys`.
    servers: HashMap<String, Server>,
    /// The latest `lost_at` read or written.
    lost_at: u64,
}

/// One Redis process as `INFO` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Server {
    run_id: String,
    evicted_keys: Option<u64>,
}

impl Epoch {
    pub(super) fn new(prefix: &str) -> Self {
        Self {
            key: format!("{prefix}epoch"),
            publish: Script::new(PUBLISH_LOSS),
            known: Mutex::new(Known::default()),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The command that reads the epoch's id beside a lookup.
    pub(super) fn id_command(&self) -> Cmd {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&self.key).arg("id");
        cmd
    }

    /// What a lookup read of the id says: another id, or none, after one was known, is a flush.
    pub(super) fn saw_id(&self, reply: &Value, losses: &Losses, now: u64) {
        let read = match reply {
            Value::BulkString(bytes) => Some(bytes.as_slice()),
            Value::Nil => None,
            _ => return,
        };
        let mut known = self.known();
        if let Some(id) = &known.id
            && read != Some(id.as_bytes())
        {
            // Forget it: the next check names the new epoch, and this flush is counted once.
            known.id = None;
            drop(known);
            losses.untraced(Loss::Flushed, now);
        }
    }

    /// One check of the epoch, the server's identity and its evictions; losses found are told to
    /// `losses`, and this instance's own losses are published for the others.
    pub(super) async fn check(
        &self,
        conn: &Conn,
        losses: &Losses,
        now: u64,
    ) -> Result<(), StoreError> {
        let read = conn.query_all(&[hgetall(&self.key)]).await.map_err(super::map_error)?;
        let fields = fields(read.into_iter().next().transpose().map_err(super::map_error)?);
        let servers = servers(conn).await?;
        // A single server's identity is kept in the epoch too, so that a restart while no
        // instance watched is seen by the first to come back.
        let run_id = match conn {
            Conn::Single(_) => servers.get("").map(|server| server.run_id.clone()),
            Conn::Cluster(_) => None,
        };

        let stored_id = field(&fields, "id");
        let stored_run = field(&fields, "run_id");
        let stored_lost =
            field(&fields, "lost_at").and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);

        let mut write_run_id = false;
        {
            let mut known = self.known();
            let mut lost = Vec::new();
            match (&known.id, stored_id) {
                (Some(id), Some(stored)) if id != stored => lost.push(Loss::Flushed),
                (Some(_), None) => lost.push(Loss::Flushed),
                _ => {}
            }
            known.id = stored_id.map(str::to_owned);
            if let Some(run_id) = &run_id {
                match stored_run {
                    Some(stored) if stored != run_id => {
                        lost.push(Loss::Restarted);
                        write_run_id = true;
                    }
                    None => write_run_id = true,
                    Some(_) => {}
                }
            }
            for loss in server_losses(&known.servers, &servers) {
                // A single server's restart is seen both ways: counted once.
                if !lost.contains(&loss) {
                    lost.push(loss);
                }
            }
            known.servers = servers;
            if stored_lost > known.lost_at {
                known.lost_at = stored_lost;
                // Another instance's loss, or one this instance published itself.
                if losses.untraced_since(now).is_none_or(|at| at < stored_lost) {
                    lost.push(Loss::Reported);
                }
            }
            drop(known);
            for loss in lost {
                let at = if loss == Loss::Reported { stored_lost } else { now };
                losses.untraced(loss, at);
            }
        }

        if stored_id.is_none() {
            // Named by whichever instance comes first; every instance then knows that name.
            let mut create = redis::cmd("HSETNX");
            create.arg(&self.key).arg("id").arg(instance_id()?);
            let replies =
                conn.query_all(&[create, self.id_command()]).await.map_err(super::map_error)?;
            if let Some(Ok(Value::BulkString(id))) = replies.get(1) {
                self.known().id = Some(String::from_utf8_lossy(id).into_owned());
            }
        }
        if let (true, Some(run_id)) = (write_run_id, &run_id) {
            let mut set = redis::cmd("HSET");
            set.arg(&self.key).arg("run_id").arg(run_id);
            conn.query(&set).await.map_err(super::map_error)?;
        }
        let own = losses.untraced_since(now).unwrap_or(0);
        if own > stored_lost {
            let mut publish = redis::cmd("EVALSHA");
            publish.arg(self.publish.get_hash()).arg(1).arg(&self.key).arg(own);
            match conn.query(&publish).await {
                Err(err) if super::is_noscript(&err) => {
                    conn.load(&self.publish).await.map_err(super::map_error)?;
                    conn.query(&publish).await.map_err(super::map_error)?;
                }
                other => {
                    other.map_err(super::map_error)?;
                }
            }
            self.known().lost_at = own;
        }
        Ok(())
    }
}

/// What changed between two checks of the servers: another process on a node (a restart, or a
/// failover to a replica), a new primary (a failover to another address), or keys evicted.
fn server_losses(before: &HashMap<String, Server>, now: &HashMap<String, Server>) -> Vec<Loss> {
    let mut lost = Vec::new();
    if before.is_empty() {
        return lost;
    }
    for (node, server) in now {
        match before.get(node) {
            None => lost.push(Loss::Restarted),
            Some(seen) if seen.run_id != server.run_id => lost.push(Loss::Restarted),
            // Counters restart with the process: compared only within one.
            Some(seen) => {
                if let (Some(earlier), Some(later)) = (seen.evicted_keys, server.evicted_keys)
                    && later > earlier
                {
                    lost.push(Loss::Evicted);
                }
            }
        }
    }
    lost
}

/// `INFO server` and `INFO stats` of the single server (node `""`), or of every primary of a
/// cluster, by its address.
async fn servers(conn: &Conn) -> Result<HashMap<String, Server>, StoreError> {
    let by_node = |reply: Value| -> Vec<(String, String)> {
        match reply {
            Value::Map(pairs) => {
                pairs.into_iter().map(|(node, info)| (info_text(node), info_text(info))).collect()
            }
            other => vec![(String::new(), info_text(other))],
        }
    };
    let (server, stats) = match conn {
        Conn::Single(_) => {
            let replies =
                conn.query_all(&[info("server"), info("stats")]).await.map_err(super::map_error)?;
            let mut replies = replies.into_iter();
            let mut next = || -> Result<Vec<(String, String)>, StoreError> {
                let reply = replies.next().transpose().map_err(super::map_error)?;
                Ok(reply.map(info_text).map(|text| vec![(String::new(), text)]).unwrap_or_default())
            };
            (next()?, next()?)
        }
        Conn::Cluster(cluster) => {
            let primaries = || RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            let mut cluster = cluster.clone();
            let server = cluster
                .route_command(info("server"), primaries())
                .await
                .map_err(super::map_error)?;
            let stats = cluster
                .route_command(info("stats"), primaries())
                .await
                .map_err(super::map_error)?;
            (by_node(server), by_node(stats))
        }
    };
    Ok(server
        .into_iter()
        .filter_map(|(node, text)| {
            let run_id = info_field(&text, "run_id")?.to_owned();
            let evicted_keys = stats
                .iter()
                .find(|(of, _)| *of == node)
                .and_then(|(_, text)| info_field(text, "evicted_keys")?.parse().ok());
            Some((node, Server { run_id, evicted_keys }))
        })
        .collect())
}

fn hgetall(key: &str) -> Cmd {
    let mut cmd = redis::cmd("HGETALL");
    cmd.arg(key);
    cmd
}

fn info(section: &str) -> Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    cmd
}

/// A hash as HGETALL returns it (a map in RESP3, pairs in RESP2), as text.
fn fields(reply: Option<Value>) -> Vec<(String, String)> {
    let Some(reply) = reply else { return Vec::new() };
    redis::from_redis_value::<Vec<(String, String)>>(reply).unwrap_or_default()
}

fn field<'f>(fields: &'f [(String, String)], name: &str) -> Option<&'f str> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn info_text(reply: Value) -> String {
    match reply {
        Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Value::VerbatimString { text, .. } => text,
        Value::SimpleString(text) => text,
        _ => String::new(),
    }
}

/// The value of `name` in INFO's `name:value` lines.
fn info_field<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_read_by_name() {
        let text =
            "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\n# Stats\r\nevicted_keys:42\r\n";
        assert_eq!(info_field(text, "run_id"), Some("abc123"));
        assert_eq!(info_field(text, "evicted_keys"), Some("42"));
        assert_eq!(info_field(text, "evicted"), None);
    }

    #[test]
    fn servers_that_changed_are_losses() {
        let server =
            |run_id: &str, evicted| Server { run_id: run_id.to_owned(), evicted_keys: evicted };
        let nodes = |list: &[(&str, Server)]| -> HashMap<String, Server> {
            list.iter().map(|(node, s)| ((*node).to_owned(), s.clone())).collect()
        };
        let before = nodes(&[("a:1", server("r1", Some(0))), ("b:2", server("r2", Some(5)))]);
        assert_eq!(server_losses(&HashMap::new(), &before), vec![], "the first check");
        assert_eq!(server_losses(&before, &before), vec![]);
        let restarted = nodes(&[("a:1", server("r9", Some(0))), ("b:2", server("r2", Some(5)))]);
        assert_eq!(server_losses(&before, &restarted), vec![Loss::Restarted]);
        let evicted = nodes(&[("a:1", server("r1", Some(0))), ("b:2", server("r2", Some(6)))]);
        assert_eq!(server_losses(&before, &evicted), vec![Loss::Evicted]);
        let failed_over = nodes(&[("a:1", server("r1", Some(0))), ("c:3", server("r3", None))]);
        assert_eq!(server_losses(&before, &failed_over), vec![Loss::Restarted]);
    }

    #[test]
    fn a_lookup_that_finds_the_epoch_gone_reports_a_flush_once() {
        let epoch = Epoch::new("p:");
        let losses = Losses::new("test".to_owned(), 100, None);
        // No epoch known yet: nothing to compare with.
        epoch.saw_id(&Value::Nil, &losses, 1000);
        assert_eq!(losses.untraced_since(1000), None);
        epoch.known().id = Some("e1".to_owned());
        epoch.saw_id(&Value::BulkString(b"e1".to_vec()), &losses, 1000);
        assert_eq!(losses.untraced_since(1000), None);
        epoch.saw_id(&Value::Nil, &losses, 1001);
        assert_eq!(losses.untraced_since(1001), Some(1001));
        epoch.saw_id(&Value::Nil, &losses, 1002);
        let flushes = losses.untraced_totals().find(|(l, _)| *l == Loss::Flushed).map(|(_, n)| n);
        assert_eq!(flushes, Some(1));
    }
}
