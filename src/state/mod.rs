//! Resume state: what rangeway remembers of objects and downloads, in Redis or in memory.
//!
//! The proxy uses a [`StateStore`] twice per request, both times in an async phase: one
//! [`StateStore::lookup`] before it answers (one round trip for the download and its object) and
//! one [`StateStore::record`] after the response. The store is an aid, never a dependency of a
//! response: every operation is bounded by a timeout, an outage is reported by the store's
//! [`StoreHealth`] (once per transition) and as errors the caller serves through.
//!
//! Two implementations pass one contract suite (`tests/state_contract.rs`): [`MemoryStore`], the
//! embedded default for a single instance, and [`RedisStore`], for instances that share state,
//! on one Redis server or a Redis Cluster.

mod codec;
mod facts;
mod health;
mod interval;
mod losses;
mod memory;
mod model;
mod redis;
mod share;
mod snapshot;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use self::facts::{MAX_FIELDS, StageFacts};
pub use self::health::StoreHealth;
pub use self::interval::{IntervalSet, IntervalSetFull};
pub use self::losses::{Loss, Losses};
pub use self::memory::{MemoryBudget, MemoryStore};
pub use self::model::{
    Delivery, DownloadSession, Ending, Holding, MAX_EXACT, MAX_SESSION_VERSIONS, MAX_VERSIONS,
    ObjectRecord, ObjectVersion, Resumable, SeenVersion, UNREAD_SLACK, VersionSent,
};
pub use self::redis::{RedisOptions, RedisStore, RedisTarget};
pub use self::snapshot::{SnapshotError, SnapshotFile};
use crate::fingerprint::IdKeySource;
use crate::values::{Problem, wrong};

/// Concurrent-download limits of a route, `None` for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DownloadLimits {
    pub per_client: Option<usize>,
    pub per_route: Option<usize>,
    pub count: Count,
}

/// What a download limit counts: a download once, however many ranged requests fetch it, or
/// every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Download,
    Request,
}

/// `[state]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateConfig {
    pub backend: StateBackend,
    pub ttl: Duration,
    pub key_prefix: String,
    pub id_key: IdKeySource,
    pub max_memory: u64,
    /// `client_share` of `max_memory`: what one client address (IPv6: its /64) may hold.
    pub max_client_memory: u64,
    pub snapshot_file: Option<PathBuf>,
}

impl StateConfig {
    /// A `key_prefix`: the start of every key the store writes, so printable and short.
    pub(crate) fn key_prefix(prefix: &str) -> Result<String, Problem> {
        if prefix.len() <= 256 && prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Ok(prefix.to_owned());
        }
        wrong(
            format!("{prefix:?} is not a usable key prefix"),
            "use at most 256 printable ASCII characters without spaces, e.g. \"rangeway:\"",
        )
    }
}

/// The store behind the state: embedded, per instance, or Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateBackend {
    Memory,
    Redis(RedisTarget),
}

/// Now, in the Unix seconds the records keep.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The most sessions one [`StateStore::downloads`] call returns.
pub const MAX_PAGE: usize = 1000;

/// Where resume state lives. Every method is bounded in time; none panics on any stored data.
#[async_trait]
pub trait StateStore: Send + Sync + std::fmt::Debug + 'static {
    /// The download `download_id` of the object `object`, the object's record and what the stages
    /// keyed `stages` learned about it, in one round trip: the hot path of every request. Absent is `None`, as is a
    /// record written in a format this version does not read.
    async fn lookup(
        &self,
        download_id: &str,
        object: &str,
        stages: &[String],
    ) -> Result<Lookup, StoreError>;

    /// Adds what the stage keyed `stage` learned about a version of `object` to what is known
    /// (replacing what was known of another version). One round trip; concurrent writers merge.
    async fn learn(&self, object: &str, stage: &str, facts: &StageFacts) -> Result<(), StoreError>;

    /// Drops what the stage keyed `stage` learned about `object`: it proved wrong (a regenerated
    /// segment that does not match its index), and the next full pass learns it again.
    async fn forget(&self, object: &str, stage: &str) -> Result<(), StoreError>;

    /// Adds a delivery to its download (the id's session for its object) and to its object's
    /// record, atomically per download (the connections of one multi-connection download record
    /// at the same time), and returns the session as updated. One round trip. See
    /// [`DownloadSession::record`] and [`ObjectRecord::observe`] for the rules.
    ///
    /// Shared: the embedded store hands out the session it holds rather than a copy, and updates
    /// it in place on the next record once the caller let it go.
    async fn record(&self, delivery: &Delivery) -> Result<Arc<DownloadSession>, StoreError>;

    /// The sessions of download id `id`, one per object downloaded under it, the most recently
    /// updated first (at most [`MAX_PAGE`]).
    async fn download(&self, id: &str) -> Result<Vec<DownloadSession>, StoreError>;

    /// Sessions, the most recently updated first, `offset` of them skipped and at most
    /// `limit.min(MAX_PAGE)` returned. With `active_only`, only those not complete (the offset
    /// then counts active sessions).
    async fn downloads(
        &self,
        active_only: bool,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DownloadSession>, StoreError>;

    async fn object(&self, object: &str) -> Result<Option<ObjectRecord>, StoreError>;

    /// Whether the store answers, and its error counters, for `/healthz` and `/metrics`.
    fn health(&self) -> &StoreHealth;

    /// What the store may have forgotten: whether a session [`Self::lookup`] did not find may
    /// have been lost rather than never begun.
    fn losses(&self) -> &Losses;

    /// Counts `hold` among the downloads under way on its route for every instance sharing the
    /// store, unless it would break one of `limits` (a download already held, by any instance,
    /// joins itself). Held until [`Self::release`], or until a lease of
    /// [`Self::hold_lease`] lapses without a [`Self::renew`]. One round trip.
    ///
    /// A store of this instance's own answers [`Held::Here`]: the instance's count is the count.
    async fn hold(&self, hold: &DownloadHold, limits: &DownloadLimits) -> Result<Held, StoreError> {
        let _ = (hold, limits);
        Ok(Held::Here)
    }

    /// Ends the holds of downloads this instance no longer serves.
    async fn release(&self, holds: &[DownloadHold]) -> Result<(), StoreError> {
        let _ = holds;
        Ok(())
    }

    /// Moves on the leases of downloads this instance still serves (counting again any that
    /// lapsed meanwhile).
    async fn renew(&self, holds: &[DownloadHold]) -> Result<(), StoreError> {
        let _ = holds;
        Ok(())
    }

    /// How long a hold lasts without a renewal; `None` for a store that holds nothing.
    fn hold_lease(&self) -> Option<Duration> {
        None
    }
}

/// A download under way on a route with `[routes.download_limits]`, as a shared store counts it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DownloadHold {
    pub route: String,
    /// The client's address; without one the download counts toward the route's limit only.
    pub client: Option<IpAddr>,
    /// What names the download: its id and object, or one request where limits count requests.
    pub download: String,
}

/// What [`StateStore::hold`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Held {
    /// Counted for every instance sharing the store: release it when the download ends.
    Shared,
    /// The store is this instance's own; nothing was counted.
    Here,
    /// The client has its limit's worth of downloads under way across the instances.
    OverClientLimit,
    /// The route has its limit's worth of downloads under way across the instances.
    OverRouteLimit,
}

/// What [`StateStore::lookup`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lookup {
    pub session: Option<DownloadSession>,
    pub object: Option<ObjectRecord>,
    /// By the stage keys asked for, in their order: the facts stored, of whatever version.
    pub facts: Vec<Option<StageFacts>>,
    /// No session was found, and the store may have lost it rather than never had it (see
    /// [`Losses`]): a resume under this id cannot be vouched for.
    pub session_may_be_lost: bool,
}

/// Why a store operation failed. None of the messages holds a credential.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("the state store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store cannot be reached or refuses to work (connection refused or lost, cluster down,
    /// out of memory, ...).
    #[error("the state store is unavailable: {0}")]
    Unavailable(String),
    /// The store answered something that is not what was asked for: the data under rangeway's
    /// keys was written by something else, or a bug.
    #[error("the state store answered something unreadable: {0}")]
    Corrupt(String),
    /// The input cannot be stored faithfully (see [`MAX_EXACT`]); nothing was written.
    #[error("not recorded: {0}")]
    Rejected(&'static str),
}

impl StoreError {
    /// A short, stable name for logs and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Unavailable(_) => "unavailable",
            Self::Corrupt(_) => "corrupt",
            Self::Rejected(_) => "rejected",
        }
    }

    /// Whether the error says the store is not working, as opposed to one bad value.
    pub fn is_outage(&self) -> bool {
        matches!(self, Self::Timeout(_) | Self::Unavailable(_))
    }
}

/// The store `config` describes.
///
/// Never waits for Redis: a server that is down at start-up is connected to when it comes up,
/// and reported through [`StoreHealth`] meanwhile, so rangeway serves without it. Fails only for a
/// URL the Redis client refuses. Must be called inside the tokio runtime that will drive the
/// store's connections, one that lives as long as the store.
pub async fn connect(config: &StateConfig) -> Result<Arc<dyn StateStore>, StoreError> {
    Ok(match &config.backend {
        StateBackend::Memory => Arc::new(memory_store(config)),
        StateBackend::Redis(target) => {
            let sessions = config.max_client_memory / share::REDIS_RECORD_BYTES;
            let options = RedisOptions {
                max_client_sessions: usize::try_from(sessions).unwrap_or(usize::MAX).max(1),
                ..RedisOptions::default()
            };
            Arc::new(RedisStore::connect(target, config.ttl, &config.key_prefix, options)?)
        }
    })
}

/// The embedded store `config` describes (whatever its backend).
pub fn memory_store(config: &StateConfig) -> MemoryStore {
    let budget = MemoryBudget {
        max_bytes: usize::try_from(config.max_memory).unwrap_or(usize::MAX),
        per_client: usize::try_from(config.max_client_memory).unwrap_or(usize::MAX),
    };
    MemoryStore::new(config.ttl, budget)
}
