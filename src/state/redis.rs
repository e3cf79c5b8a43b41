//! The shared store: Redis, one server or a cluster.
//!
//! # Keys
//!
//! Every key starts with the configured prefix; the parts that come from clients are hashed, so a
//! key is at most the prefix plus 36 bytes whatever a client sends, and no client input can name
//! another key or steer a key to a cluster slot:
//!
//! - `{prefix}ses:{h(id, object)}`: a [`DownloadSession`] (one download id, one object), as
//!   versioned JSON (see `codec.rs`). Sessions were keyed by id alone (`dl:`) before a session
//!   kept every version it was sent; those keys are never read and expire.
//! - `{prefix}obj:{h(object)}`: an [`ObjectRecord`], likewise.
//! - `{prefix}fct:{h(object)}:{h(stage)}`: what a route's stage learned about the object (see
//!   `facts.rs`), a hash of one field per fact, merged by `redis/facts.lua`.
//! - `{prefix}downloads`: a sorted set of `h(id, object)` scored by the session's `updated_at`,
//!   for listing; entries older than the TTL are dropped as sessions are recorded.
//! - `{prefix}id:{h(id)}`: the same, for the sessions of one download id.
//!
//! `h` is the first 16 bytes of SHA-256, in hex. Every key has the TTL, refreshed on each write.
//! The values keep the id and object key in full, and a read whose value names another id or object
//! (a hash collision) reads as absent.
//!
//! # Round trips
//!
//! A lookup is two GETs and a record is two scripts plus the index updates, sent together: as one
//! pipeline to a single server; on a cluster, where a pipeline cannot span hash slots, as
//! concurrent commands on the cluster's multiplexed connections. Either way one round trip.
//!
//! # Outages
//!
//! Each operation has a timeout. After an operation fails for want of Redis, the store fails the
//! next ones at once, without waiting on Redis, except for one probe every
//! [`RedisOptions::probe_interval`]: an outage costs requests nothing but their resume state, and
//! a recovered Redis is used again within that interval. The connections reconnect by themselves.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fingerprint::fingerprint;
use async_trait::async_trait;
use futures_util::future::join_all;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value};
use serde::de::DeserializeOwned;
use tracing::debug;

mod epoch;

use self::epoch::Epoch;
use super::codec::{self, Decoded};
use super::facts::{MAX_FIELDS, StageFacts};
use super::interval::IntervalSet;
use super::losses::{Loss, Losses};
use super::model::{
    Delivery, DownloadSession, Ending, MAX_SESSION_VERSIONS, MAX_VERSIONS, ObjectRecord,
    UNREAD_SLACK,
};
use super::share::ClientGroup;
use super::{
    DownloadHold, DownloadLimits, Held, Lookup, MAX_PAGE, StateStore, StoreError, StoreHealth,
    unix_now,
};
use crate::values::redis_url::RedisUrl;
use crate::values::{Problem, wrong};

/// One Redis server, or the seed nodes of a Redis Cluster (one scheme, database 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single(RedisUrl),
    Cluster(Vec<RedisUrl>),
}

impl RedisTarget {
    /// A `redis_url`: one server, or a cluster named by one seed (`redis+cluster://`).
    pub(crate) fn parse(text: &str) -> Result<Self, Problem> {
        RedisUrl::parse(text).and_then(|(url, cluster)| match cluster {
            true => url.cluster_node().map(|url| Self::Cluster(vec![url])),
            false => Ok(Self::Single(url)),
        })
    }

    /// The seed nodes of a cluster, which share one scheme.
    pub(crate) fn cluster(nodes: Vec<RedisUrl>) -> Result<Self, Problem> {
        if nodes.iter().any(|node| node.tls() != nodes[0].tls()) {
            return wrong(
                "mixes redis:// and rediss:// nodes",
                "use rediss:// for every node of a TLS cluster, redis:// for every node otherwise",
            );
        }
        Ok(Self::Cluster(nodes))
    }
}

const SESSION_SCRIPT: &str =
    concat!(include_str!("redis/common.lua"), include_str!("redis/session.lua"));
const OBJECT_SCRIPT: &str =
    concat!(include_str!("redis/common.lua"), include_str!("redis/object.lua"));
const FACTS_SCRIPT: &str = include_str!("redis/facts.lua");
const HOLDS_SCRIPT: &str = include_str!("redis/holds.lua");
const SHARE_SCRIPT: &str = include_str!("redis/share.lua");

/// The most evicted sessions remembered by member (`{prefix}evicted`) within `ttl`; past it the
/// oldest are dropped and counted as a loss no id can be traced to.
const MAX_EVICTED: usize = 100_000;

/// Index entries read per round trip while listing active downloads.
const LIST_BATCH: usize = 256;

/// Timing and bounds of a [`RedisStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisOptions {
    /// Bound on [`StateStore::lookup`], the call on the path of every request.
    pub lookup_timeout: Duration,
    /// Bound on every other operation.
    pub timeout: Duration,
    /// Bound on opening a connection to one server.
    pub connect_timeout: Duration,
    /// While Redis is failing, how often one operation goes through to find out whether it is
    /// back; the others fail at once.
    pub probe_interval: Duration,
    /// How long a download under a concurrent-download limit stays counted without its instance
    /// renewing it ([`StateStore::hold`]): the longest an instance killed mid-download holds its
    /// clients' places.
    pub hold_lease: Duration,
    /// How often the store checks whether Redis lost what it held (`redis/epoch.rs`).
    pub loss_check_interval: Duration,
    /// The most download sessions one client address (an IPv6 client: its /64) keeps within
    /// `ttl`; past it, its least recently written are evicted. No bound by default; `[state]`
    /// sets one ([`super::connect`]).
    pub max_client_sessions: usize,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            lookup_timeout: Duration::from_millis(250),
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            probe_interval: Duration::from_millis(500),
            hold_lease: Duration::from_secs(30),
            loss_check_interval: Duration::from_secs(1),
            max_client_sessions: usize::MAX,
        }
    }
}

/// State in Redis, shared by every rangeway instance that uses the same Redis and prefix.
pub struct RedisStore {
    conn: Conn,
    keys: Keys,
    /// The TTL in milliseconds, as `PX` takes it.
    ttl_ms: u64,
    ttl_secs: u64,
    options: RedisOptions,
    session_script: Script,
    object_script: Script,
    facts_script: Script,
    holds_script: Script,
    share_script: Script,
    /// Names this store's holds apart from other instances' (random, per process).
    instance: String,
    health: Arc<StoreHealth>,
    breaker: Arc<Breaker>,
    losses: Arc<Losses>,
    epoch: Arc<Epoch>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("store", &self.health.name())
            .field("prefix", &self.keys.prefix)
            .field("ttl_secs", &self.ttl_secs)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on `target`, connecting in the background: returns before Redis answers, and
    /// whether or not it does (see [`super::connect`]).
    ///
    /// Must be called inside a tokio runtime, which then drives the connections: it must live as
    /// long as the store.
    pub fn connect(
        target: &RedisTarget,
        ttl: Duration,
        key_prefix: &str,
        options: RedisOptions,
    ) -> Result<Self, StoreError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            StoreError::Unavailable("the Redis store needs a tokio runtime to run on".to_owned())
        })?;
        let refused = |what: &str, err: RedisError| {
            StoreError::Unavailable(format!("the Redis client refuses {what}: {err}"))
        };
        let (conn, name) = match target {
            RedisTarget::Single(url) => {
                let client =
                    redis::Client::open(url.as_str()).map_err(|e| refused(&url.to_string(), e))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(options.connect_timeout))
                    .set_response_timeout(Some(options.timeout))
                    // Each reconnection tries twice, then waits for the next operation (the
                    // breaker's probe) to try again: no loop of its own hammering a dead server.
                    .set_number_of_retries(1)
                    .set_max_delay(options.probe_interval);
                let manager = ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| refused(&url.to_string(), e))?;
                (Conn::Single(manager), format!("redis {url}"))
            }
            RedisTarget::Cluster(nodes) => {
                let names = nodes.iter().map(RedisUrl::to_string).collect::<Vec<_>>().join(", ");
                // A request fails after two retries, 10 to 100 ms apart, where the client's default
                // is sixteen with waits of up to minutes: the store's timeouts and the breaker's
                // probes are how an outage is ridden out.
                let client = ClusterClientBuilder::new(nodes.iter().map(RedisUrl::as_str))
                    .retries(2)
                    .min_retry_wait(10)
                    .max_retry_wait(100)
                    .build()
                    .map_err(|e| refused(&names, e))?;
                // Connects in the background, and reconnects to the seed nodes by itself when
                // every node was lost.
                let config = ClusterConfig::new()
                    .set_connection_timeout(options.connect_timeout)
                    .set_response_timeout(options.timeout);
                let conn = client.get_pending_async_connection_with_config(config);
                (Conn::Cluster(conn), format!("redis cluster {names}"))
            }
        };
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let store = Self {
            conn,
            keys: Keys { prefix: key_prefix.to_owned() },
            ttl_ms,
            ttl_secs: ttl.as_secs().max(1),
            options,
            session_script: Script::new(SESSION_SCRIPT),
            object_script: Script::new(OBJECT_SCRIPT),
            facts_script: Script::new(FACTS_SCRIPT),
            holds_script: Script::new(HOLDS_SCRIPT),
            share_script: Script::new(SHARE_SCRIPT),
            instance: instance_id()?,
            health: Arc::new(StoreHealth::unknown(name.clone())),
            breaker: Arc::new(Breaker::new(options.probe_interval)),
            losses: Arc::new(Losses::new(name, ttl.as_secs(), None)),
            epoch: Arc::new(Epoch::new(key_prefix, matches!(target, RedisTarget::Cluster(_)))),
        };
        // Connect now rather than on the first request, and say at start-up whether Redis is
        // there: a `PING`, through the same health accounting as every operation.
        let (conn, health, breaker) =
            (store.conn.clone(), Arc::clone(&store.health), Arc::clone(&store.breaker));
        let limit = options.connect_timeout + options.timeout;
        runtime.spawn(async move {
            let ping = async { conn.query(&redis::cmd("PING")).await.map_err(map_error) };
            let _ = guarded(&health, &breaker, limit, ping).await;
        });
        runtime.spawn(watch_losses(
            store.conn.clone(),
            Arc::downgrade(&store.epoch),
            Arc::clone(&store.losses),
            Arc::clone(&store.health),
            Arc::clone(&store.breaker),
            options,
        ));
        Ok(store)
    }

    /// Runs `cmd`, an `EVALSHA` of `script`, loading the script first where Redis has not got it
    /// (a restarted server, a new cluster node).
    async fn run_script(&self, script: &Script, cmd: &Cmd) -> Result<Value, StoreError> {
        match self.conn.query(cmd).await {
            Err(err) if is_noscript(&err) => {
                self.conn.load(script).await.map_err(map_error)?;
                self.conn.query(cmd).await.map_err(map_error)
            }
            other => other.map_err(map_error),
        }
    }

    /// The holds script's `op` on `route`'s keys and the lease's length; the op's own arguments
    /// follow.
    fn holds_command(&self, route: &str, op: &str) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.holds_script.get_hash()).arg(3);
        for key in self.keys.holds(route) {
            cmd.arg(key);
        }
        let lease_ms = u64::try_from(self.options.hold_lease.as_millis()).unwrap_or(u64::MAX);
        cmd.arg(op).arg(lease_ms.max(1));
        cmd
    }

    /// The lease of `hold` by this instance, as holds.lua names it: "instance|client|download".
    fn lease(&self, hold: &DownloadHold) -> String {
        let client = hold.client.map(|ip| ip.to_string()).unwrap_or_default();
        format!("{}|{client}|{}", self.instance, hashed(&hold.download))
    }

    /// `op` ("release" or "renew") on the leases of `holds`: one script call per route, all in
    /// one round trip.
    async fn leases(&self, op: &str, holds: &[DownloadHold]) -> Result<(), StoreError> {
        let mut by_route: Vec<(&str, Cmd)> = Vec::new();
        for hold in holds {
            let at = match by_route.iter().position(|(route, _)| *route == hold.route) {
                Some(at) => at,
                None => {
                    by_route.push((&hold.route, self.holds_command(&hold.route, op)));
                    by_route.len() - 1
                }
            };
            by_route[at].1.arg(self.lease(hold));
        }
        if by_route.is_empty() {
            return Ok(());
        }
        let cmds: Vec<Cmd> = by_route.into_iter().map(|(_, cmd)| cmd).collect();
        self.guarded(self.options.timeout, async {
            let replies = self.conn.query_all(&cmds).await.map_err(map_error)?;
            if replies.iter().any(|reply| matches!(reply, Err(err) if is_noscript(err))) {
                // Every call is safe to run again (a release or renewal twice is one).
                self.conn.load(&self.holds_script).await.map_err(map_error)?;
                for cmd in &cmds {
                    self.conn.query(cmd).await.map_err(map_error)?;
                }
                return Ok(());
            }
            replies.into_iter().try_for_each(|reply| reply.map(drop).map_err(map_error))
        })
        .await
    }

    async fn guarded<T>(
        &self,
        limit: Duration,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        guarded(&self.health, &self.breaker, limit, op).await
    }

    /// A stored value: absent when missing, of another format, unreadable (counted in the health)
    /// or naming another id or object (see the module doc).
    fn read<T: DeserializeOwned>(
        &self,
        reply: Value,
        is_for: impl FnOnce(&T) -> bool,
    ) -> Result<Option<T>, StoreError> {
        let bytes = match reply {
            Value::Nil => return Ok(None),
            Value::BulkString(bytes) => bytes,
            other => return Err(unexpected(&other)),
        };
        match codec::decode::<T>(&bytes) {
            Decoded::Value(value) => Ok(is_for(&value).then_some(value)),
            Decoded::OtherFormat(format) => {
                debug!(format, "a stored record of another format reads as absent");
                Ok(None)
            }
            Decoded::Invalid(err) => {
                self.health.unreadable();
                debug!(%err, "an unreadable stored record reads as absent");
                Ok(None)
            }
        }
    }

    fn read_session(
        &self,
        reply: Value,
        id: &str,
        object: &str,
    ) -> Result<Option<DownloadSession>, StoreError> {
        self.read(reply, |s: &DownloadSession| s.id == id && s.object == object)
    }

    fn read_object(&self, reply: Value, object: &str) -> Result<Option<ObjectRecord>, StoreError> {
        self.read(reply, |r: &ObjectRecord| r.key == object)
    }

    fn record_commands(&self, delivery: &Delivery) -> Result<Vec<Cmd>, StoreError> {
        let fresh_session = codec::encode(&DownloadSession::begin(delivery))?;
        let fresh_object = codec::encode(&ObjectRecord::new(
            &delivery.object,
            &delivery.origin_version,
            delivery.now,
        ))?;
        let member = session_member(&delivery.id, &delivery.object);
        let mut session = evalsha(&self.session_script, &self.keys.session_of(&member));
        session
            .arg(fresh_session)
            .arg(self.ttl_ms)
            .arg(match delivery.ending {
                Ending::Whole => "whole",
                Ending::Cut => "cut",
                Ending::Parts => "parts",
            })
            .arg(delivery.range.start())
            .arg(delivery.range.end())
            .arg(delivery.bytes)
            .arg(delivery.now)
            .arg(IntervalSet::MAX_INTERVALS)
            .arg(MAX_SESSION_VERSIONS)
            .arg(UNREAD_SLACK);
        let mut object = evalsha(&self.object_script, &self.keys.object(&delivery.object));
        object.arg(fresh_object).arg(self.ttl_ms).arg(MAX_VERSIONS);

        let [add, prune, expire] = self.index_commands(&self.keys.index(), &member, delivery.now);
        let [add_id, prune_id, expire_id] =
            self.index_commands(&self.keys.id_index(&delivery.id), &member, delivery.now);
        let mut commands = vec![session, object, add, prune, expire, add_id, prune_id, expire_id];
        if let Some(client) = ClientGroup::of(&delivery.client) {
            let mut share = evalsha(&self.share_script, &self.keys.client(client));
            share
                .arg(&member)
                .arg(delivery.now)
                .arg(self.ttl_ms)
                .arg(self.ttl_secs)
                .arg(self.options.max_client_sessions.max(1));
            commands.push(share);
        }
        Ok(commands)
    }

    /// Drops the sessions `members` (a client's past its share) and remembers them as evicted
    /// for `ttl`, so that their downloads' resumes are not taken for new ones (see
    /// `state::losses`).
    async fn evict(&self, members: &[String], now: u64) -> Result<(), StoreError> {
        let evicted = self.keys.evicted();
        let mut commands = Vec::with_capacity(members.len() + 4);
        let mut add = redis::cmd("ZADD");
        add.arg(&evicted);
        for member in members {
            let mut del = redis::cmd("DEL");
            del.arg(self.keys.session_of(member));
            commands.push(del);
            add.arg(now).arg(member);
        }
        commands.push(add);
        let mut prune = redis::cmd("ZREMRANGEBYSCORE");
        prune.arg(&evicted).arg("-inf").arg(format!("({}", now.saturating_sub(self.ttl_secs)));
        commands.push(prune);
        let mut trim = redis::cmd("ZREMRANGEBYRANK");
        trim.arg(&evicted).arg(0).arg(-(i64::try_from(MAX_EVICTED).unwrap_or(i64::MAX) + 1));
        commands.push(trim);
        let mut expire = redis::cmd("PEXPIRE");
        expire.arg(&evicted).arg(self.ttl_ms);
        commands.push(expire);
        let replies = self.conn.query_all(&commands).await.map_err(map_error)?;
        for reply in &replies {
            if let Err(err) = reply {
                return Err(map_error(err.clone()));
            }
        }
        // The trim's count: evicted sessions no longer remembered by member.
        let trimmed = replies.get(members.len() + 2).and_then(|r| r.as_ref().ok());
        if trimmed.is_some_and(|count| !matches!(count, Value::Int(0))) {
            self.losses.untraced(Loss::Evicted, now);
        }
        for _ in members {
            self.losses.count_eviction();
        }
        Ok(())
    }

    /// Adds `member` to the listing `index` as updated `now`, and drops what expired from it.
    fn index_commands(&self, index: &str, member: &str, now: u64) -> [Cmd; 3] {
        let mut add = redis::cmd("ZADD");
        add.arg(index).arg(now).arg(member);
        // Sessions last `ttl` from their last update: index entries older than that are gone.
        let mut prune = redis::cmd("ZREMRANGEBYSCORE");
        prune.arg(index).arg("-inf").arg(format!("({}", now.saturating_sub(self.ttl_secs)));
        let mut expire = redis::cmd("PEXPIRE");
        expire.arg(index).arg(self.ttl_ms);
        [add, prune, expire]
    }

    /// The sessions listed in `index` from position `from` to `to` (newest first), in one round
    /// trip after the listing's, and how many entries the listing held there.
    async fn sessions_listed(
        &self,
        index: &str,
        from: usize,
        to: usize,
    ) -> Result<(Vec<DownloadSession>, usize), StoreError> {
        let mut range = redis::cmd("ZREVRANGE");
        range.arg(index).arg(redis_index(from)).arg(redis_index(to));
        let members: Vec<String> = match self.conn.query(&range).await.map_err(map_error)? {
            Value::Array(items) => items
                .into_iter()
                .filter_map(|item| match item {
                    Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
                    _ => None,
                })
                .collect(),
            other => return Err(unexpected(&other)),
        };
        if members.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let gets: Vec<Cmd> = members
            .iter()
            .map(|member| {
                let mut get = redis::cmd("GET");
                get.arg(self.keys.session_of(member));
                get
            })
            .collect();
        let replies = self.conn.query_all(&gets).await.map_err(map_error)?;
        let mut sessions = Vec::with_capacity(members.len());
        for reply in replies {
            sessions.extend(self.read(reply.map_err(map_error)?, |_: &DownloadSession| true)?);
        }
        Ok((sessions, members.len()))
    }

    async fn record_once(&self, delivery: &Delivery) -> Result<DownloadSession, StoreError> {
        let commands = self.record_commands(delivery)?;
        let mut replies = self.conn.query_all(&commands).await.map_err(map_error)?;
        // After a restart or SCRIPT FLUSH, or on a new cluster node, the scripts must be loaded
        // again: load those reported missing, and run them again (they did not run).
        let share = commands.len() - 1;
        let script_of = |i: usize| match i {
            0 => Some(&self.session_script),
            1 => Some(&self.object_script),
            i if i == share && i >= 8 => Some(&self.share_script),
            _ => None,
        };
        let missing: Vec<usize> = (0..commands.len())
            .filter(|&i| script_of(i).is_some())
            .filter(|&i| matches!(replies.get(i), Some(Err(e)) if is_noscript(e)))
            .collect();
        if !missing.is_empty() {
            for &i in &missing {
                if let Some(script) = script_of(i) {
                    self.conn.load(script).await.map_err(map_error)?;
                }
            }
            let again: Vec<Cmd> =
                missing.iter().filter_map(|&i| commands.get(i).cloned()).collect();
            let answers = self.conn.query_all(&again).await.map_err(map_error)?;
            for (i, answer) in missing.into_iter().zip(answers) {
                if let Some(slot) = replies.get_mut(i) {
                    *slot = answer;
                }
            }
        }
        let given_up = match replies.get(share) {
            Some(Ok(reply)) if share >= 8 => {
                redis::from_redis_value_ref::<Vec<String>>(reply).map_err(|_| unexpected(reply))?
            }
            _ => Vec::new(),
        };
        let mut replies = replies.into_iter();
        let session = replies.next().ok_or_else(|| short_reply(0))?.map_err(map_error)?;
        // The object and index updates matter less than the session, but their failure is still
        // a failure of the store, reported as one.
        for reply in replies {
            reply.map_err(map_error)?;
        }
        if !given_up.is_empty() {
            self.evict(&given_up, delivery.now).await?;
        }
        let bytes = match session {
            Value::BulkString(bytes) => bytes,
            other => return Err(unexpected(&other)),
        };
        match codec::decode::<DownloadSession>(&bytes) {
            Decoded::Value(session) => Ok(session),
            Decoded::OtherFormat(_) | Decoded::Invalid(_) => Err(StoreError::Corrupt(
                "the session script returned an unreadable session".to_owned(),
            )),
        }
    }

    async fn list(
        &self,
        active_only: bool,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DownloadSession>, StoreError> {
        let limit = limit.min(MAX_PAGE);
        let mut page = Vec::with_capacity(limit);
        // Without the filter the offset indexes the sorted set directly; with it, active sessions
        // are counted as they are read.
        let (mut cursor, mut to_skip) = if active_only { (0, offset) } else { (offset, 0) };
        while page.len() < limit {
            let batch = if active_only { LIST_BATCH } else { limit - page.len() };
            let to = cursor.saturating_add(batch - 1);
            let (sessions, listed) = self.sessions_listed(&self.keys.index(), cursor, to).await?;
            if listed == 0 {
                break;
            }
            cursor = cursor.saturating_add(listed);
            for session in sessions.into_iter().filter(|s| !(active_only && s.is_complete())) {
                if to_skip > 0 {
                    to_skip -= 1;
                } else if page.len() < limit {
                    page.push(session);
                }
            }
            if listed < batch {
                break;
            }
        }
        Ok(page)
    }
}

#[async_trait]
impl StateStore for RedisStore {
    async fn lookup(
        &self,
        download_id: &str,
        object: &str,
        stages: &[String],
    ) -> Result<Lookup, StoreError> {
        let mut commands = Vec::with_capacity(4 + stages.len());
        let session_key = self.keys.session(download_id, object);
        let (guard, guard_command) = self.epoch.guard(&session_key);
        let mut session = redis::cmd("GET");
        session.arg(session_key);
        commands.push(session);
        let mut record = redis::cmd("GET");
        record.arg(self.keys.object(object));
        commands.push(record);
        for stage in stages {
            let mut facts = redis::cmd("HGETALL");
            facts.arg(self.keys.facts(object, stage));
            commands.push(facts);
        }
        commands.push(guard_command);
        let mut evicted = redis::cmd("ZSCORE");
        evicted.arg(self.keys.evicted()).arg(session_member(download_id, object));
        commands.push(evicted);
        self.guarded(self.options.lookup_timeout, async {
            let replies = self.conn.query_all(&commands).await.map_err(map_error)?;
            let mut replies = replies.into_iter();
            let session = replies.next().ok_or_else(|| short_reply(0))?.map_err(map_error)?;
            let record = replies.next().ok_or_else(|| short_reply(1))?.map_err(map_error)?;
            let mut facts = Vec::with_capacity(stages.len());
            for index in 0..stages.len() {
                let reply = replies.next().ok_or_else(|| short_reply(2 + index))?;
                facts.push(read_facts(reply.map_err(map_error)?)?);
            }
            let now = unix_now();
            let epoch = replies.next().ok_or_else(|| short_reply(2 + stages.len()))?;
            self.epoch.saw(guard, &epoch.map_err(map_error)?, &self.losses, now);
            let evicted = replies.next().ok_or_else(|| short_reply(3 + stages.len()))?;
            // A score: a string in RESP2, a double in RESP3.
            let evicted_at = redis::from_redis_value::<Option<f64>>(evicted.map_err(map_error)?)
                .map_err(|err| StoreError::Corrupt(err.to_string()))?
                .map(|at| at as u64);
            let session = self.read_session(session, download_id, object)?;
            let session_may_be_lost = session.is_none()
                && (evicted_at.is_some_and(|at| now < at.saturating_add(self.ttl_secs))
                    || self.losses.may_have_lost(download_id, object, now));
            Ok(Lookup {
                session,
                object: self.read_object(record, object)?,
                facts,
                session_may_be_lost,
            })
        })
        .await
    }

    async fn learn(&self, object: &str, stage: &str, facts: &StageFacts) -> Result<(), StoreError> {
        let mut learn = evalsha(&self.facts_script, &self.keys.facts(object, stage));
        learn.arg(&facts.version).arg(self.ttl_ms).arg(MAX_FIELDS);
        for (name, value) in facts.to_fields() {
            learn.arg(name).arg(value);
        }
        self.guarded(self.options.timeout, async {
            self.run_script(&self.facts_script, &learn).await?;
            Ok(())
        })
        .await
    }

    async fn forget(&self, object: &str, stage: &str) -> Result<(), StoreError> {
        let mut del = redis::cmd("DEL");
        del.arg(self.keys.facts(object, stage));
        self.guarded(self.options.timeout, async {
            self.conn.query(&del).await.map_err(map_error)?;
            Ok(())
        })
        .await
    }

    async fn record(&self, delivery: &Delivery) -> Result<Arc<DownloadSession>, StoreError> {
        delivery.check()?;
        let recorded = self.guarded(self.options.timeout, self.record_once(delivery)).await;
        if recorded.as_ref().is_err_and(StoreError::is_outage) {
            // The delivery may not be in its session: its next bare resume cannot be judged.
            self.losses.untraced(Loss::Failed, unix_now());
        }
        recorded.map(Arc::new)
    }

    async fn download(&self, id: &str) -> Result<Vec<DownloadSession>, StoreError> {
        self.guarded(self.options.timeout, async {
            let index = self.keys.id_index(id);
            let (sessions, _) = self.sessions_listed(&index, 0, MAX_PAGE - 1).await?;
            Ok(sessions.into_iter().filter(|s| s.id == id).collect())
        })
        .await
    }

    async fn downloads(
        &self,
        active_only: bool,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DownloadSession>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.guarded(self.options.timeout, self.list(active_only, offset, limit)).await
    }

    async fn object(&self, object: &str) -> Result<Option<ObjectRecord>, StoreError> {
        let mut get = redis::cmd("GET");
        get.arg(self.keys.object(object));
        self.guarded(self.options.timeout, async {
            let reply = self.conn.query(&get).await.map_err(map_error)?;
            self.read_object(reply, object)
        })
        .await
    }

    fn health(&self) -> &StoreHealth {
        &self.health
    }

    fn losses(&self) -> &Losses {
        &self.losses
    }

    async fn hold(&self, hold: &DownloadHold, limits: &DownloadLimits) -> Result<Held, StoreError> {
        let mut cmd = self.holds_command(&hold.route, "hold");
        cmd.arg(self.lease(hold))
            .arg(limits.per_client.unwrap_or(0))
            .arg(limits.per_route.unwrap_or(0));
        // On the request's path: bounded as the lookup is.
        self.guarded(self.options.lookup_timeout, async {
            let reply = self.run_script(&self.holds_script, &cmd).await?;
            match redis::from_redis_value_ref::<String>(&reply).as_deref() {
                Ok("held") => Ok(Held::Shared),
                Ok("per_client") => Ok(Held::OverClientLimit),
                Ok("per_route") => Ok(Held::OverRouteLimit),
                _ => Err(unexpected(&reply)),
            }
        })
        .await
    }

    async fn release(&self, holds: &[DownloadHold]) -> Result<(), StoreError> {
        self.leases("release", holds).await
    }

    async fn renew(&self, holds: &[DownloadHold]) -> Result<(), StoreError> {
        self.leases("renew", holds).await
    }

    fn hold_lease(&self) -> Option<Duration> {
        Some(self.options.hold_lease)
    }
}

/// Checks every `options.loss_check_interval` whether Redis lost what it held, until the store is
/// dropped.
async fn watch_losses(
    conn: Conn,
    epoch: std::sync::Weak<Epoch>,
    losses: Arc<Losses>,
    health: Arc<StoreHealth>,
    breaker: Arc<Breaker>,
    options: RedisOptions,
) {
    let mut ticks = tokio::time::interval(options.loss_check_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(epoch) = epoch.upgrade() else { return };
        // An outage shows in the health and the breaker as for any operation; what it may have
        // cost is the writes that failed, which count themselves.
        let check = epoch.check(&conn, &losses, unix_now());
        let _ = guarded(&health, &breaker, options.timeout, check).await;
    }
}

/// Runs `op` within `limit`, unless the breaker says Redis is down, and reports the outcome to
/// the health and the breaker.
async fn guarded<T>(
    health: &StoreHealth,
    breaker: &Breaker,
    limit: Duration,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    if !breaker.admit(breaker.now_ms()) {
        let err = StoreError::Unavailable("down, not retried until the next probe".to_owned());
        health.failed(&err);
        return Err(err);
    }
    let result = match tokio::time::timeout(limit, op).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Timeout(limit)),
    };
    match &result {
        Ok(_) => {
            breaker.close();
            health.answered();
        }
        Err(err) => {
            if err.is_outage() {
                breaker.open(breaker.now_ms());
            }
            health.failed(err);
        }
    }
    result
}

/// Fails operations at once while Redis is down, letting one through per interval as a probe.
#[derive(Debug)]
struct Breaker {
    epoch: Instant,
    interval_ms: u64,
    /// When the next probe may go, in ms since `epoch`; 0 while closed (every operation goes).
    retry_at: AtomicU64,
}

impl Breaker {
    fn new(interval: Duration) -> Self {
        Self {
            epoch: Instant::now(),
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            retry_at: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether an operation starting at `now` (see [`Self::now_ms`]) goes to Redis.
    fn admit(&self, now: u64) -> bool {
        let at = self.retry_at.load(Ordering::Relaxed);
        if at == 0 {
            return true;
        }
        // Of the operations arriving once the interval has passed, the one that moves `retry_at`
        // on is the probe.
        now >= at
            && self
                .retry_at
                .compare_exchange(at, self.next_probe(now), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    fn open(&self, now: u64) {
        self.retry_at.store(self.next_probe(now), Ordering::Relaxed);
    }

    fn close(&self) {
        self.retry_at.store(0, Ordering::Relaxed);
    }

    fn next_probe(&self, now: u64) -> u64 {
        // Never 0, which means closed.
        now.saturating_add(self.interval_ms).max(1)
    }
}

/// The connection: a single server's, which reconnects by itself, or a cluster's.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Single(manager) => cmd.query_async(&mut manager.clone()).await,
            Self::Cluster(cluster) => cmd.query_async(&mut cluster.clone()).await,
        }
    }

    /// Loads `script` (on a cluster, into every primary).
    async fn load(&self, script: &Script) -> RedisResult<String> {
        match self {
            Self::Single(manager) => script.load_async(&mut manager.clone()).await,
            Self::Cluster(cluster) => script.load_async(&mut cluster.clone()).await,
        }
    }

    /// Independent commands in one round trip, with a result for each: one pipeline to a single
    /// server; on a cluster, where a pipeline cannot span hash slots, all at once (the cluster
    /// connection pipelines what goes to the same node). The outer error is a failure of the
    /// whole pipeline (a lost connection).
    async fn query_all(&self, cmds: &[Cmd]) -> RedisResult<Vec<RedisResult<Value>>> {
        match self {
            Self::Single(manager) => {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                let replies: Vec<Value> = pipe.query_async(&mut manager.clone()).await?;
                Ok(replies
                    .into_iter()
                    .map(|reply| match reply {
                        Value::ServerError(err) => Err(err.into()),
                        reply => Ok(reply),
                    })
                    .collect())
            }
            Self::Cluster(cluster) => Ok(join_all(cmds.iter().map(|cmd| {
                let mut cluster = cluster.clone();
                async move { cmd.query_async(&mut cluster).await }
            }))
            .await),
        }
    }
}

/// The key layout (see the module doc).
#[derive(Debug)]
struct Keys {
    prefix: String,
}

impl Keys {
    fn session(&self, id: &str, object: &str) -> String {
        self.session_of(&session_member(id, object))
    }

    /// The session key of an index member.
    fn session_of(&self, member: &str) -> String {
        format!("{}ses:{member}", self.prefix)
    }

    /// The index of the sessions of download id `id`.
    fn id_index(&self, id: &str) -> String {
        format!("{}id:{}", self.prefix, hashed(id))
    }

    fn object(&self, object: &str) -> String {
        format!("{}obj:{}", self.prefix, hashed(object))
    }

    fn facts(&self, object: &str, stage: &str) -> String {
        format!("{}fct:{}:{}", self.prefix, hashed(object), hashed(stage))
    }

    fn index(&self) -> String {
        format!("{}downloads", self.prefix)
    }

    /// The sessions of one client address, for its share.
    fn client(&self, client: ClientGroup) -> String {
        format!("{}cli:{}", self.prefix, hashed(&client.key()))
    }

    /// Sessions evicted for a client's share, by member, scored by when.
    fn evicted(&self) -> String {
        format!("{}evicted", self.prefix)
    }

    /// The leases, holders and clients of `route`'s downloads under way (see holds.lua), in one
    /// hash slot so that one script may use all three on a cluster.
    fn holds(&self, route: &str) -> [String; 3] {
        let tag = hashed(route);
        ["leases", "holders", "clients"].map(|part| format!("{}lim:{{{tag}}}:{part}", self.prefix))
    }
}

/// A random name for this process's holds, told apart from every other instance's.
fn instance_id() -> Result<String, StoreError> {
    let mut seed = [0u8; 16];
    getrandom::fill(&mut seed).map_err(|err| {
        StoreError::Unavailable(format!("no random instance id for download holds: {err}"))
    })?;
    Ok(fingerprint([&seed[..]], 8))
}

/// The first 128 bits of SHA-256, as 32 hex digits: collisions are out of reach, keys stay short.
fn hashed(part: &str) -> String {
    fingerprint([part.as_bytes()], 16)
}

/// What names the session of download `id` for `object` in keys and indexes.
fn session_member(id: &str, object: &str) -> String {
    fingerprint([id.as_bytes(), object.as_bytes()], 16)
}

/// A facts hash as HGETALL returns it (a map in RESP3, pairs in RESP2).
fn read_facts(reply: Value) -> Result<Option<StageFacts>, StoreError> {
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = match reply {
        Value::Nil => return Ok(None),
        Value::Map(pairs) => pairs
            .into_iter()
            .filter_map(|(name, value)| match (name, value) {
                (Value::BulkString(name), Value::BulkString(value)) => Some((name, value)),
                _ => None,
            })
            .collect(),
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|pair| match pair {
                [Value::BulkString(name), Value::BulkString(value)] => {
                    Some((name.clone(), value.clone()))
                }
                _ => None,
            })
            .collect(),
        other => return Err(unexpected(&other)),
    };
    Ok(StageFacts::from_fields(pairs.iter().map(|(name, value)| (&name[..], &value[..]))))
}

fn evalsha(script: &Script, key: &str) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1).arg(key);
    cmd
}

/// A sorted-set index as Redis takes it (a signed 64-bit integer).
fn redis_index(index: usize) -> i64 {
    i64::try_from(index).unwrap_or(i64::MAX)
}

fn is_noscript(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

fn map_error(err: RedisError) -> StoreError {
    match err.kind() {
        // The store answered, with something rangeway did not ask for: not an outage.
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Corrupt(err.to_string()),
        _ if err.code() == Some("WRONGTYPE") => StoreError::Corrupt(err.to_string()),
        // The client's errors name no URL or credential, only what went wrong.
        _ => StoreError::Unavailable(err.to_string()),
    }
}

fn unexpected(reply: &Value) -> StoreError {
    let kind = match reply {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) | Value::SimpleString(_) | Value::Okay => "a string",
        Value::Array(_) | Value::Set(_) | Value::Map(_) => "a collection",
        Value::ServerError(_) => "an error",
        _ => "another type",
    };
    StoreError::Corrupt(format!("the store answered {kind} where a record was expected"))
}

fn short_reply(index: usize) -> StoreError {
    StoreError::Corrupt(format!("the store's reply has no answer #{index}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded_and_hide_client_input() {
        let keys = Keys { prefix: "rw:".to_owned() };
        let hostile = format!("*{{}}\n\r {}", "x".repeat(10_000));
        for key in [
            keys.session(&hostile, &hostile),
            keys.object(&hostile),
            keys.session("", ""),
            keys.object(""),
            keys.id_index(&hostile),
        ] {
            assert!(key.len() <= "rw:".len() + 36, "{key}");
            assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b':'), "{key}");
        }
        assert_ne!(keys.session("a", "o"), keys.session("b", "o"));
        assert_ne!(keys.session("a", "o"), keys.session("a", "p"));
        assert_eq!(hashed("abc"), "ba7816bf8f01cfea414140de5dae2223");
    }

    #[test]
    fn the_breaker_fails_fast_and_lets_one_probe_through() {
        let breaker = Breaker::new(Duration::from_millis(500));
        assert!(breaker.admit(0));
        breaker.open(1_000);
        assert!(!breaker.admit(1_000));
        assert!(!breaker.admit(1_499));
        assert!(breaker.admit(1_500), "the probe");
        assert!(!breaker.admit(1_501), "one probe per interval");
        assert!(breaker.admit(2_000), "the next probe");
        breaker.close();
        assert!(breaker.admit(2_001));
    }

    #[test]
    fn the_scripts_carry_the_shared_code() {
        for script in [SESSION_SCRIPT, OBJECT_SCRIPT] {
            assert!(script.starts_with("-- Shared by rangeway's scripts"));
            assert!(script.contains("9007199254740992"));
        }
        assert_eq!(super::super::model::MAX_EXACT, 9_007_199_254_740_992);
    }
}
