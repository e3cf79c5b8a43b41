//! The embedded store: one instance's state in its own memory, bounded in entries and time.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::facts::{StageFacts, merge_fields};
use super::model::{Delivery, DownloadSession, ObjectRecord};
use super::{Lookup, MAX_PAGE, StateStore, StoreError, StoreHealth};

/// Sessions and object records in a map behind a mutex.
///
/// Every entry lives `ttl` from its last write; expired entries read as absent and are removed as
/// writes come (the oldest first, cheaply: with one TTL for all, write order is expiry order).
/// At `capacity` entries (sessions and objects together), a new entry evicts the one written
/// longest ago. The lock is never held across an await, and no operation under it is more than
/// O(log n) except [`StateStore::downloads`], which walks the entries (an admin call, capped
/// by `capacity`).
#[derive(Debug)]
pub struct MemoryStore {
    ttl: Duration,
    capacity: usize,
    inner: Mutex<Inner>,
    health: StoreHealth,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Every key by the sequence number of its last write: the front is the least recently
    /// written, and also the first to expire. With its expiry, which the sweep of every write
    /// reads without hashing the key to find its entry.
    order: BTreeMap<u64, (Key, Instant)>,
    next_write: u64,
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
}

#[derive(Debug)]
enum Value {
    Download(Arc<DownloadSession>),
    Object(ObjectRecord),
    /// Stored as Redis stores them, so both stores merge by one rule.
    Facts(BTreeMap<String, Vec<u8>>),
}

impl MemoryStore {
    /// Entries kept by [`super::connect`]. A session or object record takes a few hundred bytes,
    /// so this is tens of MiB (a session fragmented into the most intervals adds 16 KiB).
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// A store whose entries live `ttl` after their last write, at most `capacity` of them (at
    /// least one).
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
            health: StoreHealth::always_up("memory".to_owned()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics under the lock; were something to, the maps would still be usable (every
        // method copes with an order entry whose map entry is gone), and better than no state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
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
        (entry.expires > now).then_some(entry.value)
    }

    /// The value under `key` unless it expired, written again: the most recently written entry,
    /// living until `expires`. Updated in place, its key is neither copied nor hashed again.
    fn rewrite(&mut self, key: KeyRef<'_>, expires: Instant, now: Instant) -> Option<&mut Value> {
        let key: &dyn AsKeyRef = &key;
        let entry = self.entries.get_mut(key).filter(|entry| entry.expires > now)?;
        let written = self.next_write;
        self.next_write += 1;
        if let Some((key, _)) = self.order.remove(&entry.written) {
            self.order.insert(written, (key, expires));
        }
        entry.written = written;
        entry.expires = expires;
        Some(&mut entry.value)
    }

    /// Writes `value` under `key`, as the most recently written entry.
    fn put(&mut self, key: Key, value: Value, expires: Instant, now: Instant, capacity: usize) {
        let _ = self.take(key.key_ref(), now);
        self.sweep(now);
        while self.entries.len() >= capacity {
            let Some((_, (oldest, _))) = self.order.pop_first() else { break };
            self.entries.remove(&oldest);
        }
        let written = self.next_write;
        self.next_write += 1;
        self.order.insert(written, (key.clone(), expires));
        self.entries.insert(key, Entry { value, expires, written });
    }

    /// Removes expired entries from the front of the write order.
    fn sweep(&mut self, now: Instant) {
        while let Some((_, (_, expires))) = self.order.first_key_value() {
            if *expires > now {
                break;
            }
            if let Some((_, (key, _))) = self.order.pop_first() {
                self.entries.remove(&key);
            }
        }
    }
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
        Ok(Lookup { session, object: record, facts })
    }

    async fn learn(&self, object: &str, stage: &str, facts: &StageFacts) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let mut map = match inner.take(KeyRef::Facts(object, stage), now) {
            Some(Value::Facts(map)) => map,
            _ => BTreeMap::new(),
        };
        merge_fields(&mut map, &facts.version, facts.to_fields());
        let key = Key::Facts(object.to_owned(), stage.to_owned());
        inner.put(key, Value::Facts(map), now + self.ttl, now, self.capacity);
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
        let mut inner = self.lock();
        inner.sweep(now);
        let (id, object) = (delivery.id.as_str(), delivery.object.as_str());
        let session = match inner.rewrite(KeyRef::Download(id, object), expires, now) {
            Some(Value::Download(session)) => {
                // A copy only while an earlier caller still holds this session.
                Arc::make_mut(session).record_in_place(delivery);
                Arc::clone(session)
            }
            _ => {
                let session = Arc::new(DownloadSession::begin(delivery));
                let value = Value::Download(Arc::clone(&session));
                let key = Key::Download(id.to_owned(), object.to_owned());
                inner.put(key, value, expires, now, self.capacity);
                session
            }
        };
        match inner.rewrite(KeyRef::Object(object), expires, now) {
            Some(Value::Object(record)) => record.observe(&delivery.origin_version, delivery.now),
            _ => {
                let record =
                    ObjectRecord::new(&delivery.object, &delivery.origin_version, delivery.now);
                let key = Key::Object(object.to_owned());
                inner.put(key, Value::Object(record), expires, now, self.capacity);
            }
        }
        Ok(session)
    }

    async fn download(&self, id: &str) -> Result<Vec<DownloadSession>, StoreError> {
        let now = Instant::now();
        let inner = self.lock();
        // An admin call: the walk is bounded by the capacity, as in `downloads`.
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

    #[tokio::test]
    async fn evicts_the_least_recently_written_at_capacity() {
        // Four entries: two downloads of one object, then a third download evicts the oldest.
        let store = MemoryStore::new(Duration::from_secs(60), 4);
        store.record(&delivery("a", "o", 1)).await.expect("record");
        store.record(&delivery("b", "o", 2)).await.expect("record");
        store.record(&delivery("c", "p", 3)).await.expect("record");
        assert!(store.download("a").await.expect("read").is_empty(), "a should be evicted");
        assert_eq!(store.download("b").await.expect("read").len(), 1);
        assert_eq!(store.download("c").await.expect("read").len(), 1);
        assert!(store.object("o").await.expect("read").is_some());
        assert!(store.object("p").await.expect("read").is_some());
        let inner = store.lock();
        assert_eq!((inner.entries.len(), inner.order.len()), (4, 4));
    }

    #[tokio::test]
    async fn expired_entries_read_as_absent_and_are_swept() {
        let store = MemoryStore::new(Duration::from_millis(50), 100);
        store.record(&delivery("a", "o", 1)).await.expect("record");
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(store.lookup("a", "o", &[]).await.expect("read"), Lookup::default());
        let session = store.record(&delivery("a", "o", 2)).await.expect("record");
        assert_eq!(session.started_at, 2, "an expired session does not go on");
        let inner = store.lock();
        assert_eq!((inner.entries.len(), inner.order.len()), (2, 2));
    }
}
