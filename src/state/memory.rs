//! The embedded store: one instance's state in its own memory, bounded in bytes and time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::facts::{StageFacts, merge_fields};
use super::losses::Losses;
use super::model::{Delivery, DownloadSession, ObjectRecord, VersionSent};
use super::share::ClientGroup;
use super::{Lookup, MAX_PAGE, StateStore, StoreError, StoreHealth, unix_now};

/// Sessions and object records in a map behind a mutex.
///
/// Every entry lives `ttl` from its last write; expired entries read as absent and are removed as
/// writes come (the oldest first, cheaply: with one TTL for all, write order is expiry order).
/// The entries' estimated size is bounded by a [`MemoryBudget`]: past it, a write evicts the
/// entries written longest ago — first those of its own client, once the client holds its share.
/// Every evicted session is traced in the store's [`Losses`], so that its download's next bare
/// resume is not taken for a new one. The lock is never held across an await, and no operation
/// under it is more than O(log n) except [`StateStore::downloads`], which walks the entries (an
/// admin call).
#[derive(Debug)]
pub struct MemoryStore {
    ttl: Duration,
    budget: MemoryBudget,
    inner: Mutex<Inner>,
    health: StoreHealth,
    losses: Losses,
}

/// How much memory the embedded store may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// The most bytes, the evicted-id filter's included.
    pub max_bytes: usize,
    /// The most bytes of records one client address (an IPv6 client: its /64) may hold.
    pub per_client: usize,
}

impl MemoryBudget {
    /// The share of `max_bytes` that the filter of evicted ids takes, per generation (of two).
    const FILTER_SHARE: usize = 64;

    fn filter_bytes(self) -> usize {
        self.max_bytes / Self::FILTER_SHARE
    }

    fn records(self) -> usize {
        self.max_bytes.saturating_sub(2 * self.filter_bytes())
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Every key by the sequence number of its last write: the front is the least recently
    /// written, and also the first to expire. With its expiry, which the sweep of every write
    /// reads without hashing the key to find its entry.
    order: BTreeMap<u64, (Key, Instant)>,
    next_write: u64,
    /// The estimated size of every entry ([`approx_size`]).
    bytes: usize,
    /// What each client's writes hold.
    clients: HashMap<ClientGroup, ClientShare>,
}

/// What one client's writes hold: their size, and their write sequence numbers, oldest first.
#[derive(Debug, Default)]
struct ClientShare {
    bytes: usize,
    written: BTreeSet<u64>,
}

#[derive(Debug, Clone)]
enum Key {
    /// A download id and the object it downloads.
    Download(String, String),
    Object(String),
    /// An object and a stage key.
    Facts(String, String),
}

/// A key as borrowed strings: what lookups find an entry by, without copying the strings into
/// a [`Key`]. `Key` hashes and compares as its `KeyRef`, so the map takes either (as `&dyn
/// AsKeyRef`, the one type both borrow as).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum KeyRef<'a> {
    Download(&'a str, &'a str),
    Object(&'a str),
    Facts(&'a str, &'a str),
}

trait AsKeyRef {
    fn key_ref(&self) -> KeyRef<'_>;
}

impl AsKeyRef for Key {
    fn key_ref(&self) -> KeyRef<'_> {
        match self {
            Key::Download(id, object) => KeyRef::Download(id, object),
            Key::Object(object) => KeyRef::Object(object),
            Key::Facts(object, stage) => KeyRef::Facts(object, stage),
        }
    }
}

impl AsKeyRef for KeyRef<'_> {
    fn key_ref(&self) -> KeyRef<'_> {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn AsKeyRef + 'a> for Key {
    fn borrow(&self) -> &(dyn AsKeyRef + 'a) {
        self
    }
}

impl Hash for dyn AsKeyRef + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key_ref().hash(state);
    }
}

impl PartialEq for dyn AsKeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key_ref() == other.key_ref()
    }
}

impl Eq for dyn AsKeyRef + '_ {}

// As its `KeyRef`, which `Borrow` requires.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key_ref().hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.key_ref() == other.key_ref()
    }
}

impl Eq for Key {}

#[derive(Debug)]
struct Entry {
    value: Value,
    expires: Instant,
    written: u64,
    /// The estimated size, as counted in [`Inner::bytes`].
    size: usize,
    /// The client whose share the entry counts in.
    client: Option<ClientGroup>,
}

#[derive(Debug)]
enum Value {
    Download(Arc<DownloadSession>),
    Object(ObjectRecord),
    /// Stored as Redis stores them, so both stores merge by one rule.
    Facts(BTreeMap<String, Vec<u8>>),
}

/// One entry as a snapshot keeps it (`state::snapshot`).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SavedEntry {
    /// Unix seconds.
    expires: u64,
    client: Option<ClientGroup>,
    record: SavedRecord,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SavedRecord {
    Download(DownloadSession),
    Object(ObjectRecord),
    Facts { object: String, stage: String, fields: BTreeMap<String, Vec<u8>> },
}

impl MemoryStore {
    /// A store whose entries live `ttl` after their last write, within `budget`.
    pub fn new(ttl: Duration, budget: MemoryBudget) -> Self {
        let name = "memory".to_owned();
        Self {
            ttl,
            budget,
            inner: Mutex::new(Inner::default()),
            health: StoreHealth::always_up(name.clone()),
            losses: Losses::new(name, ttl.as_secs(), Some(budget.filter_bytes())),
        }
    }

    /// What the records take, as the budget counts them.
    pub fn estimated_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Every live entry, the least recently written first.
    pub(super) fn saved_entries(&self) -> Vec<SavedEntry> {
        let (now, unix) = (Instant::now(), unix_now());
        let inner = self.lock();
        inner
            .order
            .values()
            .filter_map(|(key, _)| {
                let entry = inner.entries.get(key).filter(|entry| entry.expires > now)?;
                let record = match (key, &entry.value) {
                    (Key::Download(..), Value::Download(session)) => {
                        SavedRecord::Download(DownloadSession::clone(session))
                    }
                    (Key::Object(_), Value::Object(record)) => SavedRecord::Object(record.clone()),
                    (Key::Facts(object, stage), Value::Facts(fields)) => SavedRecord::Facts {
                        object: object.clone(),
                        stage: stage.clone(),
                        fields: fields.clone(),
                    },
                    _ => return None,
                };
                let left = entry.expires.saturating_duration_since(now).as_secs();
                Some(SavedEntry {
                    expires: unix.saturating_add(left),
                    client: entry.client,
                    record,
                })
            })
            .collect()
    }

    /// Adds `saved`, written by a predecessor, to what this store holds (in the order given:
    /// the least recently written first). An entry this store holds too is merged with it: a
    /// session holds what both sent ([`DownloadSession::merge`]); of an object's record and a
    /// stage's facts, this store's (the later) is kept.
    pub(super) fn restore(&self, saved: impl IntoIterator<Item = SavedEntry>) -> usize {
        let (now, unix) = (Instant::now(), unix_now());
        let mut inner = self.lock();
        let mut restored = 0;
        for SavedEntry { expires, client, record } in saved {
            let Some(left) = expires.checked_sub(unix).filter(|left| *left > 0) else { continue };
            let expires = now + Duration::from_secs(left).min(self.ttl);
            let (key, value) = match record {
                SavedRecord::Download(mut session) => {
                    let key = KeyRef::Download(&session.id, &session.object);
                    if let Some(Value::Download(held)) = inner.get(key, now) {
                        session.merge(held);
                    }
                    let key = Key::Download(session.id.clone(), session.object.clone());
                    (key, Value::Download(Arc::new(session)))
                }
                SavedRecord::Object(record) => {
                    if inner.get(KeyRef::Object(&record.key), now).is_some() {
                        continue;
                    }
                    (Key::Object(record.key.clone()), Value::Object(record))
                }
                SavedRecord::Facts { object, stage, fields } => {
                    if inner.get(KeyRef::Facts(&object, &stage), now).is_some() {
                        continue;
                    }
                    (Key::Facts(object, stage), Value::Facts(fields))
                }
            };
            self.insert(&mut inner, key, value, expires, client);
            restored += 1;
        }
        restored
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics under the lock; were something to, the maps would still be usable (every
        // method copes with an order entry whose map entry is gone), and better than no state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `value` under `key` within the bounds, evicting what must go to make room.
    fn insert(
        &self,
        inner: &mut Inner,
        key: Key,
        value: Value,
        expires: Instant,
        client: Option<ClientGroup>,
    ) {
        let size = approx_size(&key, &value);
        self.make_room(inner, client, size);
        inner.put(key, value, size, expires, client);
    }

    /// Evicts the least recently written entries until the client `client` holds its share
    /// and the store its budget, with `size` more bytes to come.
    fn make_room(&self, inner: &mut Inner, client: Option<ClientGroup>, size: usize) {
        if let Some(client) = client {
            while let Some(share) = inner.clients.get(&client)
                && share.bytes.saturating_add(size) > self.budget.per_client
            {
                let Some(&oldest) = share.written.first() else { break };
                inner.evict(oldest, &self.losses);
            }
        }
        while inner.bytes.saturating_add(size) > self.budget.records() {
            let Some((&oldest, _)) = inner.order.first_key_value() else { break };
            inner.evict(oldest, &self.losses);
        }
    }
}

impl Inner {
    fn get(&self, key: KeyRef<'_>, now: Instant) -> Option<&Value> {
        let key: &dyn AsKeyRef = &key;
        self.entries.get(key).filter(|e| e.expires > now).map(|e| &e.value)
    }

    /// Removes the entry under `key`, returning its value unless it expired.
    fn take(&mut self, key: KeyRef<'_>, now: Instant) -> Option<Value> {
        let key: &dyn AsKeyRef = &key;
        let entry = self.entries.remove(key)?;
        self.order.remove(&entry.written);
        self.uncount(&entry);
        (entry.expires > now).then_some(entry.value)
    }

    /// The value under `key` unless it expired, changed by `change` and written again: the most
    /// recently written entry, living until `expires`. Updated in place, its key is neither
    /// copied nor hashed again.
    fn update<R>(
        &mut self,
        key: KeyRef<'_>,
        expires: Instant,
        now: Instant,
        change: impl FnOnce(&mut Value) -> R,
    ) -> Option<R> {
        let lookup: &dyn AsKeyRef = &key;
        let entry = self.entries.get_mut(lookup).filter(|entry| entry.expires > now)?;
        let written = self.next_write;
        self.next_write += 1;
        let (stored_key, _) = self.order.remove(&entry.written)?;
        let changed = change(&mut entry.value);
        let size = approx_size(&stored_key, &entry.value);
        self.order.insert(written, (stored_key, expires));
        self.bytes = self.bytes.saturating_sub(entry.size).saturating_add(size);
        if let Some(share) = entry.client.and_then(|client| self.clients.get_mut(&client)) {
            share.written.remove(&entry.written);
            share.written.insert(written);
            share.bytes = share.bytes.saturating_sub(entry.size).saturating_add(size);
        }
        entry.written = written;
        entry.expires = expires;
        entry.size = size;
        Some(changed)
    }

    /// Writes `value` under `key`, as the most recently written entry, counted in `client`'s
    /// share. Room is made beforehand ([`MemoryStore::make_room`]).
    fn put(
        &mut self,
        key: Key,
        value: Value,
        size: usize,
        expires: Instant,
        client: Option<ClientGroup>,
    ) {
        let written = self.next_write;
        self.next_write += 1;
        self.order.insert(written, (key.clone(), expires));
        self.bytes = self.bytes.saturating_add(size);
        if let Some(client) = client {
            let share = self.clients.entry(client).or_default();
            share.bytes = share.bytes.saturating_add(size);
            share.written.insert(written);
        }
        if let Some(replaced) =
            self.entries.insert(key, Entry { value, expires, written, size, client })
        {
            self.order.remove(&replaced.written);
            self.uncount(&replaced);
        }
    }

    /// Drops the entry written at `written` to make room; a session's id is traced in `losses`.
    fn evict(&mut self, written: u64, losses: &Losses) {
        let Some((key, _)) = self.order.remove(&written) else { return };
        if let Some(entry) = self.entries.remove(&key) {
            self.uncount(&entry);
        }
        if let Key::Download(id, object) = &key {
            losses.evicted(id, object, unix_now());
        }
    }

    /// Takes `entry`, removed, out of the counts.
    fn uncount(&mut self, entry: &Entry) {
        self.bytes = self.bytes.saturating_sub(entry.size);
        if let Some(client) = entry.client
            && let Some(share) = self.clients.get_mut(&client)
        {
            share.bytes = share.bytes.saturating_sub(entry.size);
            share.written.remove(&entry.written);
            if share.written.is_empty() {
                self.clients.remove(&client);
            }
        }
    }

    /// Removes expired entries from the front of the write order.
    fn sweep(&mut self, now: Instant) {
        while let Some((_, (_, expires))) = self.order.first_key_value() {
            if *expires > now {
                break;
            }
            if let Some((_, (key, _))) = self.order.pop_first()
                && let Some(entry) = self.entries.remove(&key)
            {
                self.uncount(&entry);
            }
        }
    }
}

/// What an entry costs beyond its own bytes: its slots in the map and the write order, with the
/// room they keep to grow. With [`ALLOCATION`], calibrated against the process's resident memory
/// (docs/benchmarks.md, "The embedded store's bound"): the budget bounds what the store takes
/// of the process, not only of its values.
const ENTRY_OVERHEAD: usize = 960;

/// What the allocator adds to each block it hands out.
const ALLOCATION: usize = 32;

/// The estimated memory of an entry: its key is held twice (the map and the write order).
fn approx_size(key: &Key, value: &Value) -> usize {
    let (key_len, key_blocks) = match key {
        Key::Download(a, b) | Key::Facts(a, b) => (a.len() + b.len(), 4),
        Key::Object(a) => (a.len(), 2),
    };
    let version_len = |v: &super::ObjectVersion| {
        std::mem::size_of_val(v)
            + v.etag.as_ref().map_or(0, |e| e.len() + ALLOCATION)
            + v.content_type.as_ref().map_or(0, |c| c.len() + ALLOCATION)
    };
    let sent_len = |sent: &VersionSent| {
        version_len(&sent.version)
            + (sent.sent.len() + sent.ends.len())
                * std::mem::size_of::<rangeway_middleware::ByteRange>()
            + 2 * ALLOCATION
    };
    let value_len = match value {
        Value::Download(s) => {
            s.id.len()
                + s.object.len()
                + s.route.len()
                + s.client.len()
                + std::mem::size_of::<DownloadSession>()
                + 6 * ALLOCATION
                + s.versions.iter().map(sent_len).sum::<usize>()
        }
        Value::Object(r) => {
            r.key.len()
                + version_len(&r.current)
                + 2 * ALLOCATION
                + r.versions.iter().map(|seen| version_len(&seen.version) + 16).sum::<usize>()
        }
        Value::Facts(map) => {
            map.iter().map(|(name, value)| name.len() + value.len() + 48 + 2 * ALLOCATION).sum()
        }
    };
    ENTRY_OVERHEAD + 2 * key_len + key_blocks * ALLOCATION + value_len
}

#[async_trait]
impl StateStore for MemoryStore {
    async fn lookup(
        &self,
        download_id: &str,
        object: &str,
        stages: &[String],
    ) -> Result<Lookup, StoreError> {
        let now = Instant::now();
        let inner = self.lock();
        let session = match inner.get(KeyRef::Download(download_id, object), now) {
            Some(Value::Download(session)) => Some(DownloadSession::clone(session)),
            _ => None,
        };
        let record = match inner.get(KeyRef::Object(object), now) {
            Some(Value::Object(record)) => Some(record.clone()),
            _ => None,
        };
        let facts = stages
            .iter()
            .map(|stage| match inner.get(KeyRef::Facts(object, stage), now) {
                Some(Value::Facts(map)) => StageFacts::from_fields(
                    map.iter().map(|(name, value)| (name.as_bytes(), value.as_slice())),
                ),
                _ => None,
            })
            .collect();
        let session_may_be_lost =
            session.is_none() && self.losses.may_have_lost(download_id, object, unix_now());
        Ok(Lookup { session, object: record, facts, session_may_be_lost })
    }

    async fn learn(&self, object: &str, stage: &str, facts: &StageFacts) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.sweep(now);
        let mut map = match inner.take(KeyRef::Facts(object, stage), now) {
            Some(Value::Facts(map)) => map,
            _ => BTreeMap::new(),
        };
        merge_fields(&mut map, &facts.version, facts.to_fields());
        let key = Key::Facts(object.to_owned(), stage.to_owned());
        self.insert(&mut inner, key, Value::Facts(map), now + self.ttl, None);
        Ok(())
    }

    async fn forget(&self, object: &str, stage: &str) -> Result<(), StoreError> {
        let _ = self.lock().take(KeyRef::Facts(object, stage), Instant::now());
        Ok(())
    }

    async fn record(&self, delivery: &Delivery) -> Result<Arc<DownloadSession>, StoreError> {
        delivery.check()?;
        let now = Instant::now();
        let expires = now + self.ttl;
        let client = ClientGroup::of(&delivery.client);
        let mut inner = self.lock();
        inner.sweep(now);
        let (id, object) = (delivery.id.as_str(), delivery.object.as_str());
        let updated =
            inner.update(KeyRef::Download(id, object), expires, now, |value| match value {
                Value::Download(session) => {
                    // A copy only while an earlier caller still holds this session.
                    Arc::make_mut(session).record_in_place(delivery);
                    Some(Arc::clone(session))
                }
                _ => None,
            });
        let session = match updated.flatten() {
            Some(session) => session,
            None => {
                let session = Arc::new(DownloadSession::begin(delivery));
                let value = Value::Download(Arc::clone(&session));
                let key = Key::Download(id.to_owned(), object.to_owned());
                self.insert(&mut inner, key, value, expires, client);
                session
            }
        };
        let observed = inner.update(KeyRef::Object(object), expires, now, |value| {
            if let Value::Object(record) = value {
                record.observe(&delivery.origin_version, delivery.now);
            }
        });
        if observed.is_none() {
            let record =
                ObjectRecord::new(&delivery.object, &delivery.origin_version, delivery.now);
            let key = Key::Object(object.to_owned());
            self.insert(&mut inner, key, Value::Object(record), expires, client);
        }
        // The entries updated in place may have grown past the bounds.
        self.make_room(&mut inner, client, 0);
        Ok(session)
    }

    async fn download(&self, id: &str) -> Result<Vec<DownloadSession>, StoreError> {
        let now = Instant::now();
        let inner = self.lock();
        // An admin call: the walk is bounded by the budget, as in `downloads`.
        Ok(inner
            .order
            .values()
            .map(|(key, _)| key)
            .rev()
            .filter(|key| matches!(key, Key::Download(of, _) if of == id))
            .filter_map(|key| match inner.get(key.key_ref(), now) {
                Some(Value::Download(session)) => Some(DownloadSession::clone(session)),
                _ => None,
            })
            .take(MAX_PAGE)
            .collect())
    }

    async fn downloads(
        &self,
        active_only: bool,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DownloadSession>, StoreError> {
        let now = Instant::now();
        let inner = self.lock();
        // Write order is update order: each write of a session sets its `updated_at`.
        Ok(inner
            .order
            .values()
            .map(|(key, _)| key)
            .rev()
            .filter_map(|key| match inner.get(key.key_ref(), now) {
                Some(Value::Download(s)) if !(active_only && s.is_complete()) => {
                    Some(DownloadSession::clone(s))
                }
                _ => None,
            })
            .skip(offset)
            .take(limit.min(MAX_PAGE))
            .collect())
    }

    async fn object(&self, object: &str) -> Result<Option<ObjectRecord>, StoreError> {
        let now = Instant::now();
        let inner = self.lock();
        Ok(match inner.get(KeyRef::Object(object), now) {
            Some(Value::Object(record)) => Some(record.clone()),
            _ => None,
        })
    }

    fn health(&self) -> &StoreHealth {
        &self.health
    }

    fn losses(&self) -> &Losses {
        &self.losses
    }
}

#[cfg(test)]
mod tests {
    use rangeway_middleware::ByteRange;

    use super::*;
    use crate::state::{Ending, ObjectVersion};

    fn delivery(id: &str, object: &str, now: u64) -> Delivery {
        let version = ObjectVersion {
            etag: Some("\"e\"".to_owned()),
            strong: true,
            size: 10,
            last_modified: None,
            content_type: None,
        };
        Delivery {
            id: id.to_owned(),
            object: object.to_owned(),
            route: "r".to_owned(),
            client: "c".to_owned(),
            origin_version: version.clone(),
            version,
            range: ByteRange::new(0, 5).expect("valid"),
            ending: Ending::Cut,
            bytes: 5,
            now,
        }
    }

    fn with_client(id: &str, object: &str, client: &str) -> Delivery {
        Delivery { client: client.to_owned(), ..delivery(id, object, 1) }
    }

    /// The size of one download's two entries (its session and its object's record).
    fn pair_size(id: &str, object: &str) -> usize {
        let d = delivery(id, object, 1);
        approx_size(
            &Key::Download(id.to_owned(), object.to_owned()),
            &Value::Download(Arc::new(DownloadSession::begin(&d))),
        ) + approx_size(
            &Key::Object(object.to_owned()),
            &Value::Object(ObjectRecord::new(object, &d.origin_version, 1)),
        )
    }

    /// A budget whose records hold `pairs` downloads of distinct objects, and one client's
    /// share `client_pairs` of them.
    fn budget(pairs: usize, client_pairs: usize) -> MemoryBudget {
        let pair = pair_size("id-00", "obj-00");
        let records = pairs * pair + pair / 2;
        // The filter's two generations come on top of the records.
        let max_bytes = records * MemoryBudget::FILTER_SHARE / (MemoryBudget::FILTER_SHARE - 2) + 1;
        MemoryBudget { max_bytes, per_client: client_pairs * pair + pair / 2 }
    }

    #[tokio::test]
    async fn saved_records_restore_into_a_successor_and_merge_with_its_own() {
        let budget = MemoryBudget { max_bytes: 1 << 20, per_client: 1 << 20 };
        let (old, new) = (
            MemoryStore::new(Duration::from_secs(60), budget),
            MemoryStore::new(Duration::from_secs(60), budget),
        );
        old.record(&delivery("d", "o", 1)).await.expect("recorded");
        old.record(&delivery("other", "p", 1)).await.expect("recorded");
        // Meanwhile the successor sent the same download the next bytes, of another version.
        let mut later = delivery("d", "o", 2);
        later.version.etag = Some("\"f\"".to_owned());
        later.range = ByteRange::new(5, 10).expect("valid");
        new.record(&later).await.expect("recorded");

        let saved = old.saved_entries();
        assert_eq!(saved.len(), 4, "two sessions and two objects' records");
        let text: Vec<String> =
            saved.iter().map(|e| serde_json::to_string(e).expect("encodes")).collect();
        let read = text.iter().map(|line| serde_json::from_str(line).expect("decodes"));
        assert_eq!(new.restore(read), 3, "the successor's own record of `o` is kept");

        let found = new.lookup("d", "o", &[]).await.expect("looked up");
        let session = found.session.expect("the merged session");
        let etags: Vec<_> = session.versions.iter().map(|s| s.version.etag.clone()).collect();
        assert_eq!(etags, [Some("\"f\"".to_owned()), Some("\"e\"".to_owned())]);
        assert_eq!(session.bytes, 10);
        assert!(new.lookup("other", "p", &[]).await.expect("looked up").session.is_some());
        // The successor's object record is the later word.
        let record = new.object("o").await.expect("looked up").expect("a record");
        assert_eq!(record.seen_at, 2);
    }

    #[tokio::test]
    async fn evicts_the_least_recently_written_past_the_budget_and_traces_it() {
        let store = MemoryStore::new(Duration::from_secs(60), budget(3, 10));
        for i in 0..4 {
            store
                .record(&delivery(&format!("id-0{i}"), &format!("obj-0{i}"), 1))
                .await
                .expect("record");
        }
        assert!(store.download("id-00").await.expect("read").is_empty(), "the oldest is evicted");
        for i in 1..4 {
            assert_eq!(store.download(&format!("id-0{i}")).await.expect("read").len(), 1);
        }
        assert!(store.losses().may_have_lost("id-00", "obj-00", unix_now()));
        assert!(!store.losses().may_have_lost("id-01", "obj-01", unix_now()));
        assert_eq!(store.losses().evictions_total(), 1);
        let inner = store.lock();
        // The first session made room; its object's record, written after it, stays.
        assert_eq!((inner.entries.len(), inner.order.len()), (7, 7));
        assert!(inner.bytes <= store.budget.records());
        let counted: usize = inner.entries.values().map(|e| e.size).sum();
        assert_eq!(inner.bytes, counted, "the running count is the entries' sum");
    }

    #[tokio::test]
    async fn a_client_at_its_share_evicts_its_own_records_not_the_others() {
        let store = MemoryStore::new(Duration::from_secs(60), budget(20, 4));
        store.record(&with_client("victim", "obj-00", "192.0.2.1")).await.expect("record");
        // A flood from one IPv6 /64, each request from another address within it.
        for i in 0..100 {
            let client = format!("2001:db8::{i:x}");
            store
                .record(&with_client(&format!("f-{i:02}"), &format!("ob-{i:02}"), &client))
                .await
                .expect("record");
        }
        assert_eq!(
            store.download("victim").await.expect("read").len(),
            1,
            "the victim's record stays"
        );
        assert_eq!(store.download("f-99").await.expect("read").len(), 1);
        assert!(store.download("f-00").await.expect("read").is_empty());
        assert!(store.losses().may_have_lost("f-00", "ob-00", unix_now()));
        let inner = store.lock();
        assert_eq!(inner.clients.len(), 2, "the /64 is one client");
        let flood = inner.clients.values().map(|c| c.bytes).max().unwrap_or(0);
        assert!(flood <= store.budget.per_client, "{flood} > {}", store.budget.per_client);
    }

    #[tokio::test]
    async fn a_session_that_grows_is_counted_at_its_new_size() {
        let store = MemoryStore::new(Duration::from_secs(60), budget(20, 20));
        let first = delivery("a", "o", 1);
        store.record(&first).await.expect("record");
        let before = store.lock().bytes;
        let mut other = delivery("a", "o", 2);
        other.version.etag = Some("\"a much longer entity tag of another version\"".to_owned());
        store.record(&other).await.expect("record");
        let inner = store.lock();
        assert!(inner.bytes > before);
        let counted: usize = inner.entries.values().map(|e| e.size).sum();
        assert_eq!(inner.bytes, counted);
    }

    #[tokio::test]
    async fn expired_entries_read_as_absent_and_are_swept() {
        let store = MemoryStore::new(Duration::from_millis(50), budget(100, 100));
        store.record(&delivery("a", "o", 1)).await.expect("record");
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(store.lookup("a", "o", &[]).await.expect("read"), Lookup::default());
        let session = store.record(&delivery("a", "o", 2)).await.expect("record");
        assert_eq!(session.started_at, 2, "an expired session does not go on");
        let inner = store.lock();
        assert_eq!((inner.entries.len(), inner.order.len()), (2, 2));
    }
}
