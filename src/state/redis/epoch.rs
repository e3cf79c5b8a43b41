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
//! Each instance also watches `evicted_keys` (`INFO stats`): keys evicted under `maxmemory` are
//! a loss it cannot trace to ids.
//!
//! On a Redis Cluster the epoch lives on the node that owns its slot, and `INFO` is not read:
//! a node of the cluster that loses its data without the epoch's is not seen.

use std::sync::{Mutex, PoisonError};

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
    run_id: Option<String>,
    evicted_keys: Option<u64>,
    /// The latest `lost_at` read or written.
    lost_at: u64,
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
        let mut read = vec![hgetall(&self.key)];
        let single = matches!(conn, Conn::Single(_));
        if single {
            read.push(info("server"));
            read.push(info("stats"));
        }
        let mut replies = conn.query_all(&read).await.map_err(super::map_error)?.into_iter();
        let fields = fields(replies.next().transpose().map_err(super::map_error)?);
        let server = replies.next().transpose().map_err(super::map_error)?.map(info_text);
        let stats = replies.next().transpose().map_err(super::map_error)?.map(info_text);
        let run_id =
            server.as_deref().and_then(|text| info_field(text, "run_id")).map(str::to_owned);
        let evicted = stats.as_deref().and_then(|text| info_field(text, "evicted_keys"));
        let evicted = evicted.and_then(|n| n.parse::<u64>().ok());

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
                // Counters restart with the process: compared only within one.
                if known.run_id.as_ref() != Some(run_id) {
                    known.evicted_keys = None;
                }
                if let (Some(before), Some(now_evicted)) = (known.evicted_keys, evicted)
                    && now_evicted > before
                {
                    lost.push(Loss::Evicted);
                }
                known.run_id = Some(run_id.clone());
                known.evicted_keys = evicted;
            }
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
