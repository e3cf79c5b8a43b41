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
//! - `laid`: on a cluster, when the slots' markers (below) were first all laid.
//!
//! Each instance also watches, on every primary of a cluster, `run_id` (another process: a restart
//! or a failover; on a cluster also a primary at a new address) and `evicted_keys` (`INFO
//! stats`: keys evicted under `maxmemory`), losses it cannot trace to ids.
//!
//! On a Redis Cluster the epoch lives on the one node that owns its slot, and cannot tell of
//! another node that is flushed while its process goes on, or that restarts while no instance
//! watches. So every hash slot has a marker of its own, `{prefix}ep{TAG}`, where TAG is a short
//! hash tag of that slot (the shortest strings, one per slot, found at start): 16,384 small keys
//! that never expire. A lookup reads the marker of its session's slot (`EXISTS`) instead of the
//! epoch's id, from the node that holds the session: a node that lost the session lost the marker
//! with it. Each instance lays every missing marker (`SET NX`) at its first check and again after
//! a loss it saw; once it has, a lookup that finds its marker missing is a flush, counted before
//! that lookup asks whether its session may be lost. Markers an instance lays where others were
//! found went while no instance watched: a flush too, when the epoch says they were all laid once
//! (`laid`) or the epoch itself was gone.
//!
//! A prefix with a hash tag puts every key, the epoch's too, in one slot: one marker. A prefix
//! whose braces would take the markers out of their slots (a `{` never closed) has none; its
//! lookups read the epoch's id, as on a single server.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use futures_util::future::join_all;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::{Cmd, Script, Value};
use tracing::debug;

use super::{Conn, StoreError, instance_id};
use crate::state::losses::{Loss, Losses};

/// Sets `lost_at` to the later of its value and ARGV[1].
const PUBLISH_LOSS: &str = r"
local stored = tonumber(redis.call('HGET', KEYS[1], 'lost_at') or '0') or 0
if tonumber(ARGV[1]) > stored then redis.call('HSET', KEYS[1], 'lost_at', ARGV[1]) end
return 1
";

/// A Redis Cluster's hash slots.
const SLOTS: usize = 16_384;

/// What the slots' tags are made of: no brace, so that a tag in braces is a hash tag whole.
const TAG_CHARS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The longest tag tried: some tag of at most three of [`TAG_CHARS`] falls in every slot.
const MAX_TAG_LEN: u32 = 3;

/// A short hash tag in each slot (by Redis's own reckoning: CRC16-XMODEM mod 16384, as the
/// client routes keys), so that each slot can hold a marker of its own.
static SLOT_TAGS: LazyLock<HashMap<Slot, String>> = LazyLock::new(slot_tags);

pub(super) struct Epoch {
    key: String,
    prefix: String,
    /// Whether the store is a cluster: then each slot has its marker.
    cluster: bool,
    publish: Script,
    known: Mutex<Known>,
}

/// What a lookup reads beside its session to tell whether the store lost it, and what this
/// instance knew when the lookup was sent ([`Known::named`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guard {
    /// The epoch's id (`HGET`): a single server, or a prefix whose braces leave no marker in the
    /// session's slot.
    Id(u64),
    /// The marker of the session's slot (`EXISTS`).
    Marker(u64),
}

/// Whether this instance laid every slot's marker.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Markers {
    /// Not yet: a missing marker tells nothing, and those laid were lost if the others were there.
    #[default]
    Unlaid,
    /// Laid, or found there: a missing one was lost.
    Laid,
    /// A loss was counted since they were laid: laid again at the next check, not counted twice.
    Relay,
}

/// What this instance saw at its last check.
#[derive(Debug, Default)]
struct Known {
    id: Option<String>,
    /// By node (`""` for a single server): its `run_id` and `evicted_keys`.
    servers: HashMap<String, Server>,
    /// The latest `lost_at` read or written.
    lost_at: u64,
    /// On a cluster, the slots' markers.
    markers: Markers,
    /// Counts the times the epoch was named or the markers laid: a lookup sent before either
    /// read what was there before, and its missing id or marker tells nothing.
    named: u64,
}

/// One Redis process as `INFO` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Server {
    run_id: String,
    evicted_keys: Option<u64>,
}

impl Epoch {
    pub(super) fn new(prefix: &str, cluster: bool) -> Self {
        if cluster {
            // Found now rather than on the first lookup, whose time is bounded.
            LazyLock::force(&SLOT_TAGS);
        }
        Self {
            key: format!("{prefix}epoch"),
            prefix: prefix.to_owned(),
            cluster,
            publish: Script::new(PUBLISH_LOSS),
            known: Mutex::new(Known::default()),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn id_command(&self) -> Cmd {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&self.key).arg("id");
        cmd
    }

    /// The marker of `slot`, unless the prefix's braces put it in another slot (then no key
    /// under the prefix can mark `slot` but by chance).
    fn marker(&self, slot: Slot) -> Option<String> {
        let marker = format!("{}ep{{{}}}", self.prefix, SLOT_TAGS.get(&slot)?);
        (Slot::for_key(&marker) == slot).then_some(marker)
    }

    /// What a lookup of the session at `session_key` reads beside it, and how: on a cluster, the
    /// marker in the session's own slot, on the node that holds the session, so that a node that
    /// lost its data is seen by the lookups of the sessions it lost.
    pub(super) fn guard(&self, session_key: &str) -> (Guard, Cmd) {
        if self.cluster
            && let Some(marker) = self.marker(Slot::for_key(session_key))
        {
            let mut exists = redis::cmd("EXISTS");
            exists.arg(marker);
            return (Guard::Marker(self.known().named), exists);
        }
        (Guard::Id(self.known().named), self.id_command())
    }

    /// What a lookup read of `guard` says. Called before the lookup asks `losses`, so that a loss
    /// found here counts for that lookup too.
    pub(super) fn saw(&self, guard: Guard, reply: &Value, losses: &Losses, now: u64) {
        let named = match guard {
            Guard::Id(named) | Guard::Marker(named) => named,
        };
        if self.known().named != named {
            return;
        }
        match guard {
            Guard::Id(_) => self.saw_id(reply, losses, now),
            Guard::Marker(_) => self.saw_marker(reply, losses, now),
        }
    }

    /// A marker missing once every one was laid is a flush of its node.
    fn saw_marker(&self, reply: &Value, losses: &Losses, now: u64) {
        if *reply != Value::Int(0) {
            return;
        }
        let mut known = self.known();
        if known.markers == Markers::Laid {
            // Counted once: the next check lays the markers again.
            known.markers = Markers::Relay;
            drop(known);
            losses.untraced(Loss::Flushed, now);
        }
    }

    /// What a lookup read of the id says: another id, or none, after one was known, is a flush.
    fn saw_id(&self, reply: &Value, losses: &Losses, now: u64) {
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
        let stored_laid = field(&fields, "laid").is_some();
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
            if stored_id.is_some() && known.id.as_deref() != stored_id {
                known.named += 1;
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
            if !lost.is_empty() && known.markers == Markers::Laid {
                // A node may have come back without its markers: laid again below.
                known.markers = Markers::Relay;
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

        let mut named = false;
        if stored_id.is_none() {
            // Named by whichever instance comes first; every instance then knows that name.
            let mut create = redis::cmd("HSETNX");
            create.arg(&self.key).arg("id").arg(instance_id()?);
            let replies =
                conn.query_all(&[create, self.id_command()]).await.map_err(super::map_error)?;
            named = matches!(replies.first(), Some(Ok(Value::Int(1))));
            if let Some(Ok(Value::BulkString(id))) = replies.get(1) {
                let mut known = self.known();
                known.id = Some(String::from_utf8_lossy(id).into_owned());
                known.named += 1;
            }
        }
        if self.cluster
            && let Err(err) = self.lay(conn, losses, now, stored_laid, named).await
        {
            // Not an outage (a slot on the move, say): laid at the next check.
            debug!(%err, "the slots' markers were not all laid");
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

    /// Lays the slots' markers, unless this instance laid them and has seen no loss since.
    /// `stored_laid`: the epoch says they were all laid once; `named`: this check named the
    /// epoch.
    async fn lay(
        &self,
        conn: &Conn,
        losses: &Losses,
        now: u64,
        stored_laid: bool,
        named: bool,
    ) -> Result<(), StoreError> {
        let markers = self.known().markers;
        if markers == Markers::Laid {
            return Ok(());
        }
        let (laid, found) = self.lay_markers(conn).await?;
        {
            let mut known = self.known();
            known.markers = Markers::Laid;
            known.named += 1;
        }
        // Missing where others were found, they went with their node's data while no instance
        // watched: laid by an earlier instance (as the epoch says), or before the epoch itself
        // was lost. On a cluster being laid for the first time, neither holds.
        if markers == Markers::Unlaid && laid > 0 && (stored_laid || (named && found > 0)) {
            losses.untraced(Loss::Flushed, now);
        }
        if !stored_laid {
            let mut set = redis::cmd("HSET");
            set.arg(&self.key).arg("laid").arg(now);
            conn.query(&set).await.map_err(super::map_error)?;
        }
        Ok(())
    }

    /// Sets every slot's marker where it is missing (`SET NX`, no TTL), to the epoch's id: how
    /// many were set, and how many were there already.
    async fn lay_markers(&self, conn: &Conn) -> Result<(usize, usize), StoreError> {
        let Conn::Cluster(cluster) = conn else { return Ok((0, 0)) };
        let value = self.known().id.clone().unwrap_or_else(|| "1".to_owned());
        // One pipeline for each range of slots a node serves: 16,384 commands sent one by one
        // take the cluster client seconds, and hold up the lookups queued behind them.
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let slots = cluster
            .clone()
            .route_command(slots, RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary))
            .await
            .map_err(super::map_error)?;
        let ranges = slot_ranges(&slots)?;
        let served: usize = ranges.iter().map(|(first, last)| usize::from(last - first) + 1).sum();
        if served < SLOTS {
            // A marker left out would be missed as lost: laid once the cluster is whole.
            return Err(StoreError::Unavailable(format!(
                "the cluster serves {served} of its {SLOTS} slots"
            )));
        }
        let sends = ranges.into_iter().filter_map(|(first, last)| {
            let mut pipe = redis::pipe();
            for marker in (first..=last).filter_map(|n| self.marker(Slot::new(n)?)) {
                pipe.cmd("SET").arg(marker).arg(&value).arg("NX");
            }
            let (count, slot) = (pipe.len(), Slot::new(first)?);
            let route =
                SingleNodeRoutingInfo::SpecificNode(Route::with_slot(slot, SlotAddr::Master));
            let mut cluster = cluster.clone();
            (count > 0)
                .then_some(async move { cluster.route_pipeline(pipe, 0, count, route).await })
        });
        let (mut laid, mut found) = (0, 0);
        for replies in join_all(sends).await {
            for reply in replies.map_err(super::map_error)? {
                match reply {
                    Value::Okay => laid += 1,
                    Value::Nil => found += 1,
                    // A slot moved meanwhile: laid again at the next check.
                    Value::ServerError(err) => return Err(super::map_error(err.into())),
                    other => return Err(super::unexpected(&other)),
                }
            }
        }
        Ok((laid, found))
    }
}

/// The ranges of slots, first and last, that `CLUSTER SLOTS` says are served.
fn slot_ranges(reply: &Value) -> Result<Vec<(u16, u16)>, StoreError> {
    let Value::Array(entries) = reply else { return Err(super::unexpected(reply)) };
    entries
        .iter()
        .map(|entry| match entry {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(first), Value::Int(last), ..] => {
                    let slot = |n: &i64| u16::try_from(*n).ok().filter(|&n| usize::from(n) < SLOTS);
                    slot(first).zip(slot(last)).filter(|(f, l)| f <= l).ok_or_else(|| {
                        StoreError::Corrupt(format!("CLUSTER SLOTS names slots {first}-{last}"))
                    })
                }
                _ => Err(super::unexpected(entry)),
            },
            other => Err(super::unexpected(other)),
        })
        .collect()
}

/// One tag a slot: the shortest strings of [`TAG_CHARS`], each kept for the slot it is the first
/// to fall in.
fn slot_tags() -> HashMap<Slot, String> {
    let mut tags = HashMap::with_capacity(SLOTS);
    for len in 1..=MAX_TAG_LEN {
        for n in 0..TAG_CHARS.len().pow(len) {
            let tag = tag(n, len);
            tags.entry(Slot::for_key(&tag)).or_insert(tag);
            if tags.len() == SLOTS {
                return tags;
            }
        }
    }
    tags
}

/// The `n`th string of `len` characters of [`TAG_CHARS`].
fn tag(mut n: usize, len: u32) -> String {
    let base = TAG_CHARS.len();
    let mut reversed = Vec::new();
    for _ in 0..len {
        reversed.push(char::from(TAG_CHARS[n % base]));
        n /= base;
    }
    reversed.into_iter().rev().collect()
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
    fn slots_are_reckoned_as_redis_does() {
        let slot = |n| Slot::new(n).unwrap();
        assert_eq!(Slot::for_key("foo"), slot(12182));
        assert_eq!(Slot::for_key("bar"), slot(5061));
        // CRC16-XMODEM's check value (below 16384, its own slot).
        assert_eq!(Slot::for_key("123456789"), slot(0x31C3));
        assert_eq!(Slot::for_key("{foo}.bar"), slot(12182), "a hash tag");
        assert_eq!(Slot::for_key("{}foo"), slot(9500), "an empty tag is none: the key whole");
    }

    #[test]
    fn every_slot_has_a_short_tag_of_its_own() {
        assert_eq!(SLOT_TAGS.len(), SLOTS);
        for n in 0..u16::try_from(SLOTS).unwrap() {
            let slot = Slot::new(n).unwrap();
            let tag = SLOT_TAGS.get(&slot).unwrap_or_else(|| panic!("slot {n} has no tag"));
            assert!((1..=3).contains(&tag.len()) && !tag.contains(['{', '}']), "{tag:?}");
            assert_eq!(Slot::for_key(tag), slot, "{tag}");
            assert_eq!(Slot::for_key(format!("x{{{tag}}}y")), slot, "{{{tag}}}");
        }
    }

    #[test]
    fn a_sessions_marker_is_in_its_slot() {
        let epoch = Epoch::new("rangeway:", true);
        for key in ["rangeway:ses:0123456789abcdef0123456789abcdef", "rangeway:ses:"] {
            let (guard, cmd) = epoch.guard(key);
            assert!(matches!(guard, Guard::Marker(_)), "{guard:?}");
            let marker = epoch.marker(Slot::for_key(key)).unwrap();
            assert!(marker.starts_with("rangeway:ep{") && marker.ends_with('}'), "{marker}");
            assert_eq!(Slot::for_key(&marker), Slot::for_key(key));
            assert_eq!(cmd.args_iter().count(), 2);
        }
        let markers = |prefix: &str| {
            let epoch = Epoch::new(prefix, true);
            SLOT_TAGS.keys().filter_map(|&slot| epoch.marker(slot)).count()
        };
        assert_eq!(markers("rangeway:"), SLOTS);
        // Every key of a prefix with a hash tag is in the tag's slot: one marker.
        assert_eq!(markers("rw:{prod}:"), 1);
        let tagged = Epoch::new("rw:{prod}:", true);
        assert_eq!(tagged.guard("rw:{prod}:ses:ab").0, Guard::Marker(0));
        // A single server reads the epoch's id.
        assert_eq!(Epoch::new("rangeway:", false).guard("rangeway:ses:ab").0, Guard::Id(0));
    }

    #[test]
    fn the_served_slots_are_read_from_cluster_slots() {
        let node =
            || Value::Array(vec![Value::BulkString(b"127.0.0.1".to_vec()), Value::Int(7000)]);
        let range = |first, last| Value::Array(vec![Value::Int(first), Value::Int(last), node()]);
        let reply = Value::Array(vec![range(0, 5460), range(5461, 16383)]);
        assert_eq!(slot_ranges(&reply).unwrap(), vec![(0, 5460), (5461, 16383)]);
        for wrong in [
            Value::Array(vec![range(0, 16384)]),
            Value::Array(vec![range(-1, 5)]),
            Value::Array(vec![range(9, 5)]),
            Value::Array(vec![Value::Int(0)]),
            Value::Nil,
        ] {
            assert!(slot_ranges(&wrong).is_err(), "{wrong:?}");
        }
    }

    #[test]
    fn a_marker_found_missing_once_all_were_laid_is_a_flush_counted_once() {
        let epoch = Epoch::new("p:", true);
        let losses = Losses::new("test".to_owned(), 100, None);
        let flushes =
            || losses.untraced_totals().find(|(l, _)| *l == Loss::Flushed).map(|(_, n)| n);
        // Not laid yet: nothing to compare with.
        epoch.saw(Guard::Marker(0), &Value::Int(0), &losses, 1000);
        assert_eq!(losses.untraced_since(1000), None);
        // Sent before the markers were laid, read after: what it read predates them.
        let sent_before = epoch.guard("p:ses:ab").0;
        epoch.known().markers = Markers::Laid;
        epoch.known().named += 1;
        epoch.saw(sent_before, &Value::Int(0), &losses, 1000);
        assert_eq!(losses.untraced_since(1000), None);
        let guard = epoch.guard("p:ses:ab").0;
        epoch.saw(guard, &Value::Int(1), &losses, 1000);
        assert_eq!(losses.untraced_since(1000), None);
        epoch.saw(guard, &Value::Int(0), &losses, 1001);
        assert_eq!(losses.untraced_since(1001), Some(1001));
        assert_eq!(epoch.known().markers, Markers::Relay);
        epoch.saw(guard, &Value::Int(0), &losses, 1002);
        assert_eq!(flushes(), Some(1));
    }

    #[test]
    fn a_lookup_that_finds_the_epoch_gone_reports_a_flush_once() {
        let epoch = Epoch::new("p:", false);
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
