//! What a store may have forgotten.
//!
//! A bare resume with no session behind it is served whatever version the origin has now: with
//! nothing sent under its id, no version can be the client's. That reading holds only while the
//! store has lost no session. [`Losses`] is what a store knows of its own losses, so that a
//! missing session can be told apart from a forgotten one:
//!
//! - **Traced**: the store dropped a session it can name (the embedded store's evictions). The
//!   ids are kept as fingerprints in a bounded filter ([`EvictedIds`]) for `ttl`, the longest the
//!   session would have lived; only those ids are affected (and a few others, at the filter's
//!   false-positive rate).
//! - **Untraced**: the store cannot say which sessions it lost (a Redis flush, restart, failover
//!   or eviction; a write that failed). For `ttl` after the latest such loss, every missing
//!   session may be a lost one.
//!
//! What the proxy does with a session that may be lost is in `docs/ranges-and-resume.md`: the
//! whole representation, unless the object's version provably predates every session the store
//! could have lost.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tracing::warn;

/// Why a store lost sessions it cannot name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Loss {
    /// The store's data is gone: Redis flushed, or restarted without persistence.
    Flushed,
    /// Another Redis process answers (a restart or a failover): writes since its last
    /// persistence or replication may be gone.
    Restarted,
    /// Keys evicted that no id can be traced to: by Redis under `maxmemory`, or by rangeway
    /// past the evicted sessions it remembers by member.
    Evicted,
    /// A write or a lookup failed: a session may not have been stored, or not read.
    Failed,
    /// Another instance sharing the store reported a loss.
    Reported,
    /// rangeway stopped without saving its embedded store (killed, crashed, the host down):
    /// found at the next start.
    Crashed,
}

impl Loss {
    const ALL: [Self; 6] = [
        Self::Flushed,
        Self::Restarted,
        Self::Evicted,
        Self::Failed,
        Self::Reported,
        Self::Crashed,
    ];

    /// A short, stable name for logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flushed => "flushed",
            Self::Restarted => "restarted",
            Self::Evicted => "evicted",
            Self::Failed => "failed",
            Self::Reported => "reported",
            Self::Crashed => "crashed",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|l| *l == self).unwrap_or(0)
    }
}

/// Quiet time after which a loss is logged again: one line per burst, not per failed write.
const LOG_QUIET_SECS: u64 = 60;

/// A store's losses, shared by every request that uses the store.
#[derive(Debug)]
pub struct Losses {
    store: String,
    ttl_secs: u64,
    /// Unix seconds of the latest untraced loss; 0 while there was none.
    untraced_at: AtomicU64,
    untraced: [AtomicU64; Loss::ALL.len()],
    logged_at: AtomicU64,
    evicted: Option<Mutex<EvictedIds>>,
    evictions: AtomicU64,
    evictions_logged_at: AtomicU64,
    /// Unix seconds of the latest eviction; 0 while there was none.
    evicted_at: AtomicU64,
    /// The store waits for what its predecessor saved (an upgrade): any session may be there.
    awaiting_predecessor: AtomicBool,
}

impl Losses {
    /// The losses of the store named `store` (as log lines name it), whose records live `ttl_secs`
    /// after their last write. With `evicted_filter_bytes`, evicted ids are traced in a filter of
    /// that many bytes per generation (two generations).
    pub fn new(store: String, ttl_secs: u64, evicted_filter_bytes: Option<usize>) -> Self {
        Self {
            store,
            ttl_secs: ttl_secs.max(1),
            untraced_at: AtomicU64::new(0),
            untraced: Default::default(),
            logged_at: AtomicU64::new(0),
            evicted: evicted_filter_bytes.map(|bytes| Mutex::new(EvictedIds::new(bytes))),
            evictions: AtomicU64::new(0),
            evictions_logged_at: AtomicU64::new(0),
            evicted_at: AtomicU64::new(0),
            awaiting_predecessor: AtomicBool::new(false),
        }
    }

    /// A loss that names no session, at Unix second `at`.
    pub fn untraced(&self, loss: Loss, at: u64) {
        self.untraced_at.fetch_max(at, Ordering::Relaxed);
        if let Some(count) = self.untraced.get(loss.index()) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        if once_per_burst(&self.logged_at, at) {
            warn!(
                store = %self.store,
                loss = loss.name(),
                "the state store may have lost download sessions: for the next {}s, a bare \
                 resume under an id it does not know is answered with the whole object unless \
                 the object is older than that",
                self.ttl_secs,
            );
        }
    }

    /// A record dropped to make room, traced by the store itself (Redis: by member).
    pub fn count_eviction(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }

    /// The store dropped the session of `id` for `object` at Unix second `now` to make room.
    pub fn evicted(&self, id: &str, object: &str, now: u64) {
        self.count_eviction();
        self.evicted_at.fetch_max(now, Ordering::Relaxed);
        if let Some(filter) = &self.evicted {
            filter.lock().unwrap_or_else(PoisonError::into_inner).insert(
                id,
                object,
                now,
                self.ttl_secs,
            );
        }
        if once_per_burst(&self.evictions_logged_at, now) {
            warn!(
                store = %self.store,
                "the state store is full and evicts the least recently used records: their \
                 downloads' bare resumes are answered with the whole object (raise [state] \
                 max_memory)"
            );
        }
    }

    /// Whether the session of `id` for `object`, found missing at Unix second `now`, may have
    /// been lost rather than never begun.
    pub fn may_have_lost(&self, id: &str, object: &str, now: u64) -> bool {
        if self.untraced_since(now).is_some() || self.awaiting_predecessor.load(Ordering::Relaxed) {
            return true;
        }
        self.evicted.as_ref().is_some_and(|filter| {
            filter.lock().unwrap_or_else(PoisonError::into_inner).contains(
                id,
                object,
                now,
                self.ttl_secs,
            )
        })
    }

    /// The latest untraced loss, while it still matters at `now` (within `ttl` of it).
    pub fn untraced_since(&self, now: u64) -> Option<u64> {
        let at = self.untraced_at.load(Ordering::Relaxed);
        (at != 0 && now < at.saturating_add(self.ttl_secs)).then_some(at)
    }

    /// Until [`Self::predecessor_done`], every session not found may be one the process this one
    /// takes over from (an upgrade) holds and has not handed over yet.
    pub fn await_predecessor(&self) {
        self.awaiting_predecessor.store(true, Ordering::Relaxed);
    }

    /// The predecessor's sessions are in, or it is gone.
    pub fn predecessor_done(&self) {
        self.awaiting_predecessor.store(false, Ordering::Relaxed);
    }

    /// What a snapshot keeps of the losses: the latest untraced loss and the latest eviction, in
    /// Unix seconds (0: none).
    pub fn saved(&self) -> (u64, u64) {
        (self.untraced_at.load(Ordering::Relaxed), self.evicted_at.load(Ordering::Relaxed))
    }

    /// Takes over a predecessor's losses, as [`Self::saved`] gave them: its untraced losses hold
    /// as they were, and its evictions, whose ids the filter does not carry over, become untraced
    /// from when the last happened. Neither is counted or logged again.
    pub fn carry_over(&self, (untraced_at, evicted_at): (u64, u64)) {
        self.untraced_at.fetch_max(untraced_at.max(evicted_at), Ordering::Relaxed);
    }

    /// The records' lifetime, in seconds.
    pub fn ttl_secs(&self) -> u64 {
        self.ttl_secs
    }

    /// Untraced losses by kind, for `/metrics`.
    pub fn untraced_totals(&self) -> impl Iterator<Item = (Loss, u64)> + '_ {
        Loss::ALL.iter().zip(&self.untraced).map(|(loss, n)| (*loss, n.load(Ordering::Relaxed)))
    }

    /// Records evicted to make room, for `/metrics`.
    pub fn evictions_total(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

/// Whether a burst of events that `logged_at` tracks begins at `now`.
fn once_per_burst(logged_at: &AtomicU64, now: u64) -> bool {
    let last = logged_at.load(Ordering::Relaxed);
    (last == 0 || now >= last.saturating_add(LOG_QUIET_SECS))
        && logged_at
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// Fingerprints of evicted sessions: two Bloom filters, each covering `ttl` from its start, so
/// that an id is remembered for at least `ttl` and at most twice that. Full filters answer
/// "maybe" more often, never "no" for an id put in: the error is on the safe side.
#[derive(Debug)]
struct EvictedIds {
    hasher: RandomState,
    current: Bloom,
    previous: Bloom,
    /// Unix seconds when `current` began; 0 before the first insertion.
    current_since: u64,
}

impl EvictedIds {
    fn new(bytes_per_generation: usize) -> Self {
        let words = (bytes_per_generation / 8).max(1);
        Self {
            hasher: RandomState::new(),
            current: Bloom::new(words),
            previous: Bloom::new(words),
            current_since: 0,
        }
    }

    fn rotate(&mut self, now: u64, ttl: u64) {
        if self.current_since == 0 {
            self.current_since = now;
        }
        if now >= self.current_since.saturating_add(ttl.saturating_mul(2)) {
            self.previous.clear();
            self.current.clear();
            self.current_since = now;
        } else if now >= self.current_since.saturating_add(ttl) {
            std::mem::swap(&mut self.previous, &mut self.current);
            self.current.clear();
            self.current_since = now;
        }
    }

    fn insert(&mut self, id: &str, object: &str, now: u64, ttl: u64) {
        self.rotate(now, ttl);
        let hash = self.hash(id, object);
        self.current.insert(hash);
    }

    fn contains(&mut self, id: &str, object: &str, now: u64, ttl: u64) -> bool {
        if self.current_since == 0 {
            return false;
        }
        self.rotate(now, ttl);
        let hash = self.hash(id, object);
        self.current.contains(hash) || self.previous.contains(hash)
    }

    fn hash(&self, id: &str, object: &str) -> (u64, u64) {
        let first = self.hasher.hash_one((id, object));
        // A second, independent index from the same keyed hash (Kirsch–Mitzenmacher).
        let second = self.hasher.hash_one((first, object, id)) | 1;
        (first, second)
    }
}

/// A Bloom filter of `64 × words` bits with [`Bloom::PROBES`] probes.
#[derive(Debug)]
struct Bloom {
    bits: Vec<u64>,
    empty: bool,
}

impl Bloom {
    /// The number of bits set per entry: the false-positive rate is lowest near 7 at 10 bits
    /// per entry.
    const PROBES: u64 = 7;

    fn new(words: usize) -> Self {
        Self { bits: vec![0; words], empty: true }
    }

    fn clear(&mut self) {
        if !self.empty {
            self.bits.fill(0);
            self.empty = true;
        }
    }

    fn positions(&self, (first, second): (u64, u64)) -> impl Iterator<Item = (usize, u64)> + use<> {
        let bits = (self.bits.len() as u64) * 64;
        (0..Self::PROBES).map(move |i| {
            let bit = first.wrapping_add(i.wrapping_mul(second)) % bits;
            // In range: `bit / 64` is below `bits.len()`.
            (usize::try_from(bit / 64).unwrap_or(0), 1u64 << (bit % 64))
        })
    }

    fn insert(&mut self, hash: (u64, u64)) {
        self.empty = false;
        for (word, mask) in self.positions(hash) {
            if let Some(w) = self.bits.get_mut(word) {
                *w |= mask;
            }
        }
    }

    fn contains(&self, hash: (u64, u64)) -> bool {
        !self.empty
            && self
                .positions(hash)
                .all(|(word, mask)| self.bits.get(word).is_some_and(|w| w & mask != 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 100;

    #[test]
    fn an_untraced_loss_covers_every_id_for_ttl() {
        let losses = Losses::new("test".to_owned(), TTL, None);
        assert!(!losses.may_have_lost("a", "o", 1000));
        losses.untraced(Loss::Flushed, 1000);
        assert!(losses.may_have_lost("a", "o", 1000));
        assert!(losses.may_have_lost("b", "p", 1099));
        assert!(!losses.may_have_lost("a", "o", 1100), "ttl after the loss, nothing lost lives");
        assert_eq!(losses.untraced_since(1050), Some(1000));
        let flushed = losses.untraced_totals().find(|(l, _)| *l == Loss::Flushed);
        assert_eq!(flushed, Some((Loss::Flushed, 1)));
    }

    #[test]
    fn an_older_loss_reported_late_does_not_shorten_the_window() {
        let losses = Losses::new("test".to_owned(), TTL, None);
        losses.untraced(Loss::Failed, 2000);
        losses.untraced(Loss::Reported, 1500);
        assert_eq!(losses.untraced_since(2050), Some(2000));
    }

    #[test]
    fn a_predecessors_losses_carry_over_and_its_handover_covers_every_id() {
        let losses = Losses::new("test".to_owned(), TTL, Some(1024));
        losses.await_predecessor();
        assert!(losses.may_have_lost("a", "o", 1000));
        losses.predecessor_done();
        assert!(!losses.may_have_lost("a", "o", 1000));
        // Its evictions, whose ids are not carried, count as untraced from the last.
        losses.carry_over((900, 950));
        assert_eq!(losses.untraced_since(1000), Some(950));
        assert!(losses.untraced_totals().all(|(_, n)| n == 0), "carried, not counted again");
        losses.evicted("b", "o", 1010);
        assert_eq!(losses.saved(), (950, 1010));
    }

    #[test]
    fn an_eviction_covers_its_own_id_only() {
        let losses = Losses::new("test".to_owned(), TTL, Some(1024));
        losses.evicted("victim", "o", 1000);
        assert!(losses.may_have_lost("victim", "o", 1000));
        assert!(losses.may_have_lost("victim", "o", 1099));
        assert!(!losses.may_have_lost("victim", "other object", 1000));
        assert!(!losses.may_have_lost("someone else", "o", 1000));
        assert_eq!(losses.evictions_total(), 1);
        assert_eq!(losses.untraced_since(1000), None, "an eviction is traced");
    }

    #[test]
    fn an_evicted_id_is_remembered_between_ttl_and_twice_ttl() {
        let losses = Losses::new("test".to_owned(), TTL, Some(1024));
        losses.evicted("a", "o", 1000);
        losses.evicted("b", "o", 1150);
        // `a` moved to the previous generation when `b` began a new one.
        assert!(losses.may_have_lost("a", "o", 1199));
        assert!(losses.may_have_lost("b", "o", 1249));
        // At 1250 the generation of `b` becomes the previous one, and `a`'s is dropped.
        assert!(!losses.may_have_lost("a", "o", 1250));
        assert!(losses.may_have_lost("b", "o", 1250));
        assert!(!losses.may_have_lost("b", "o", 1350 + TTL));
    }

    #[test]
    fn a_full_filter_errs_on_the_safe_side() {
        // 64 bits for thousands of ids: every one put in is still found.
        let losses = Losses::new("test".to_owned(), TTL, Some(8));
        let ids: Vec<String> = (0..2000).map(|i| format!("id-{i}")).collect();
        for id in &ids {
            losses.evicted(id, "o", 1000);
        }
        assert!(ids.iter().all(|id| losses.may_have_lost(id, "o", 1001)));
    }

    #[test]
    fn a_sized_filter_keeps_false_positives_rare() {
        // 10 bits an entry: about 1 % false positives.
        let losses = Losses::new("test".to_owned(), TTL, Some(10_000 * 10 / 8));
        for i in 0..10_000 {
            losses.evicted(&format!("in-{i}"), "o", 1000);
        }
        let false_positives =
            (0..10_000).filter(|i| losses.may_have_lost(&format!("out-{i}"), "o", 1001)).count();
        assert!(false_positives < 300, "{false_positives} of 10000");
    }

    #[test]
    fn bursts_are_logged_once() {
        let logged = AtomicU64::new(0);
        assert!(once_per_burst(&logged, 1000));
        assert!(!once_per_burst(&logged, 1001));
        assert!(!once_per_burst(&logged, 1000 + LOG_QUIET_SECS - 1));
        assert!(once_per_burst(&logged, 1000 + LOG_QUIET_SECS));
    }
}
