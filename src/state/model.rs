//! What the store keeps: object versions and download sessions, and how a delivery updates them.
//!
//! Both stores apply the same rules; the Redis store runs them in Lua (`redis/*.lua`), where they
//! must stay in step with [`DownloadSession::record`] and [`ObjectRecord::observe`] here.

use rangeway_middleware::ByteRange;
use serde::{Deserialize, Serialize};

use super::StoreError;
use super::interval::IntervalSet;

/// The largest number the store keeps: 2^53. Redis's Lua and many JSON readers hold numbers as
/// IEEE doubles, which are exact only up to here; past it a size or offset would be silently
/// rounded. That is 8 PiB, so only a broken or hostile origin comes near it, and a delivery that
/// does is refused ([`StoreError::Rejected`]) rather than recorded wrong.
pub const MAX_EXACT: u64 = 1 << 53;

/// How many distinct versions of an object its record remembers, newest first.
pub const MAX_VERSIONS: usize = 8;

/// One version of an object, as the origin described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectVersion {
    /// The ETag in its wire form, quotes and `W/` included, e.g. `"\"abc\""`.
    pub etag: Option<String>,
    /// Whether `etag` is a strong validator.
    pub strong: bool,
    /// The complete length in bytes.
    pub size: u64,
    /// `Last-Modified`, in seconds since the Unix epoch.
    pub last_modified: Option<u64>,
    pub content_type: Option<String>,
}

impl ObjectVersion {
    /// Whether `self` and `other` are the same bytes as far as the origin told: same ETag, size
    /// and Last-Modified. The content type and strength are descriptions, not identity.
    pub fn same_as(&self, other: &ObjectVersion) -> bool {
        self.etag == other.etag
            && self.size == other.size
            && self.last_modified == other.last_modified
    }
}

/// A version of an object and when it was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenVersion {
    pub version: ObjectVersion,
    /// Unix seconds.
    pub first_seen: u64,
    /// Unix seconds.
    pub last_seen: u64,
}

/// What is known of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    /// The object's identity (route and path), as the proxy names it.
    pub key: String,
    /// The version seen last.
    pub current: ObjectVersion,
    /// When `current` was seen last, Unix seconds.
    pub seen_at: u64,
    /// Distinct versions, the one seen most recently first; at most [`MAX_VERSIONS`].
    pub versions: Vec<SeenVersion>,
}

impl ObjectRecord {
    /// A record of an object seen for the first time.
    pub fn new(key: &str, version: &ObjectVersion, now: u64) -> Self {
        Self {
            key: key.to_owned(),
            current: version.clone(),
            seen_at: now,
            versions: vec![SeenVersion {
                version: version.clone(),
                first_seen: now,
                last_seen: now,
            }],
        }
    }

    /// Notes that the object was seen as `version` at `now`: it becomes current and moves to the
    /// front of the history, which forgets the version seen longest ago past [`MAX_VERSIONS`].
    pub fn observe(&mut self, version: &ObjectVersion, now: u64) {
        let entry = match self.versions.iter().position(|seen| seen.version.same_as(version)) {
            Some(index) => {
                let mut seen = self.versions.remove(index);
                // The same bytes may come with a new description (content type, strength).
                seen.version = version.clone();
                seen.last_seen = now;
                seen
            }
            None => SeenVersion { version: version.clone(), first_seen: now, last_seen: now },
        };
        self.versions.insert(0, entry);
        self.versions.truncate(MAX_VERSIONS);
        self.current = version.clone();
        self.seen_at = now;
    }
}

/// One download: a client fetching one object, in one or many requests and connections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadSession {
    pub id: String,
    /// The key of the object downloaded.
    pub object: String,
    /// The route and client of the request that began the session.
    pub route: String,
    pub client: String,
    /// The version the download began on; a delivery of another version starts a new session.
    pub version: ObjectVersion,
    /// The bytes of the representation delivered so far.
    pub delivered: IntervalSet,
    /// Body bytes sent, counting bytes sent more than once; saturates at [`MAX_EXACT`].
    pub bytes: u64,
    /// Unix seconds.
    pub started_at: u64,
    /// Unix seconds.
    pub updated_at: u64,
    /// `delivered` covers the whole of `version`.
    pub complete: bool,
}

impl DownloadSession {
    /// A session that begins with `delivery`, ignoring whatever came before it.
    pub fn begin(delivery: &Delivery) -> Self {
        let mut session = Self {
            id: delivery.id.clone(),
            object: delivery.object.clone(),
            route: delivery.route.clone(),
            client: delivery.client.clone(),
            version: delivery.version.clone(),
            delivered: IntervalSet::new(),
            bytes: 0,
            started_at: delivery.now,
            updated_at: delivery.now,
            complete: false,
        };
        session.add(delivery);
        session
    }

    /// The session after `delivery`, given the one stored before it (if any).
    ///
    /// A delivery of the same version goes on with the stored session. A piece of another version
    /// leaves an unfinished session as it is: the client may still hold pieces of the version it
    /// began on, and the next resume must be checked against that one. (aria2c resumes by asking
    /// for the object without a Range first, then fills its gaps with ranged requests; were the
    /// session to follow that first answer, the gaps would be filled from the new version.) A new
    /// session begins when the stored one is finished, belongs to another download, or when the
    /// delivery is a whole version: a client that received all of it holds nothing older.
    pub fn record(stored: Option<Self>, delivery: &Delivery) -> Self {
        match stored {
            Some(session) if !session.is_of(delivery) => Self::begin(delivery),
            Some(mut session) if session.version.same_as(&delivery.version) => {
                session.add(delivery);
                session
            }
            Some(session) if !session.complete && !delivery.is_whole() => session,
            _ => Self::begin(delivery),
        }
    }

    /// Whether `delivery` belongs to this download: the same id for the same object (a client may
    /// give one id to downloads of several objects).
    fn is_of(&self, delivery: &Delivery) -> bool {
        self.id == delivery.id && self.object == delivery.object
    }

    fn add(&mut self, delivery: &Delivery) {
        // A full set drops the range: `delivered` only ever under-states what was sent (see
        // IntervalSet), so this costs at most a late `complete`, never a wrong one.
        let _ = self.delivered.insert(delivery.range);
        self.bytes = self.bytes.saturating_add(delivery.bytes).min(MAX_EXACT);
        self.updated_at = delivery.now;
        self.complete = self.delivered.covers(self.version.size);
    }
}

/// What one response delivered to a download, reported after the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: String,
    /// The key of the object delivered.
    pub object: String,
    pub route: String,
    pub client: String,
    /// The version of the representation delivered: the download's.
    pub version: ObjectVersion,
    /// The version of the object at the origin, for the object's record: the same as `version`
    /// on a route that does not transform the body.
    pub origin_version: ObjectVersion,
    /// The bytes of the representation delivered.
    pub range: ByteRange,
    /// Body bytes sent.
    pub bytes: u64,
    /// Unix seconds.
    pub now: u64,
}

impl Delivery {
    /// Whether this delivery is the whole of its version.
    pub fn is_whole(&self) -> bool {
        self.range.start() == 0 && self.range.end() >= self.version.size
    }

    /// Refuses numbers the store cannot keep exactly (see [`MAX_EXACT`]).
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        let numbers = [
            self.version.size,
            self.version.last_modified.unwrap_or(0),
            self.origin_version.size,
            self.origin_version.last_modified.unwrap_or(0),
            self.range.end(),
            self.bytes,
            self.now,
        ];
        if numbers.iter().any(|&n| n > MAX_EXACT) {
            return Err(StoreError::Rejected("a size, offset or time exceeds 2^53"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(etag: &str, size: u64) -> ObjectVersion {
        ObjectVersion {
            etag: Some(format!("\"{etag}\"")),
            strong: true,
            size,
            last_modified: Some(1_700_000_000),
            content_type: Some("application/octet-stream".to_owned()),
        }
    }

    fn delivery(version: &ObjectVersion, start: u64, end: u64, now: u64) -> Delivery {
        let range = ByteRange::new(start, end).expect("start <= end");
        Delivery {
            id: "d1".to_owned(),
            object: "files|/a.bin".to_owned(),
            route: "files".to_owned(),
            client: "127.0.0.1".to_owned(),
            version: version.clone(),
            origin_version: version.clone(),
            range,
            bytes: range.len(),
            now,
        }
    }

    #[test]
    fn a_session_moves_to_a_new_version_only_when_nothing_older_can_be_held() {
        let v1 = version("a", 100);
        let s = DownloadSession::record(None, &delivery(&v1, 0, 40, 10));
        let v2 = ObjectVersion { last_modified: Some(1), ..v1.clone() };

        // A piece of another version while unfinished: the session stays on v1.
        let kept = DownloadSession::record(Some(s.clone()), &delivery(&v2, 0, 60, 15));
        assert_eq!(kept, s);
        // The whole of another version: a new session.
        let whole = DownloadSession::record(Some(s.clone()), &delivery(&v2, 0, 100, 16));
        assert_eq!(
            (whole.version.clone(), whole.complete, whole.started_at),
            (v2.clone(), true, 16)
        );

        let s = DownloadSession::record(Some(s), &delivery(&v1, 40, 100, 20));
        assert!(s.complete);
        assert_eq!((s.bytes, s.started_at, s.updated_at), (100, 10, 20));
        // Finished: a piece of another version begins anew.
        let n = DownloadSession::record(Some(s), &delivery(&v2, 50, 60, 40));
        assert_eq!((n.bytes, n.started_at, n.delivered.total()), (10, 40, 10));
        assert_eq!(n.version, v2);
    }

    #[test]
    fn an_empty_object_is_complete_at_once() {
        let s = DownloadSession::record(None, &delivery(&version("e", 0), 0, 0, 1));
        assert!(s.complete);
    }

    #[test]
    fn object_history_is_newest_first_and_bounded() {
        let mut record = ObjectRecord::new("k", &version("0", 1), 0);
        for i in 1..20u64 {
            record.observe(&version(&i.to_string(), 1), i);
        }
        assert_eq!(record.versions.len(), MAX_VERSIONS);
        assert_eq!(record.versions[0].version, version("19", 1));
        record.observe(&version("15", 1), 100);
        assert_eq!(record.versions[0].first_seen, 15);
        assert_eq!(record.versions[0].last_seen, 100);
        assert_eq!(record.versions[1].version, version("19", 1));
        assert_eq!(record.current, version("15", 1));
        assert_eq!(record.seen_at, 100);
    }

    #[test]
    fn numbers_past_2_pow_53_are_refused() {
        let ok = delivery(&version("a", MAX_EXACT), 0, MAX_EXACT, 1);
        assert!(ok.check().is_ok());
        let mut too_big = ok.clone();
        too_big.version.size = MAX_EXACT + 1;
        assert!(matches!(too_big.check(), Err(StoreError::Rejected(_))));
        let mut too_big = ok;
        too_big.version.last_modified = Some(u64::MAX);
        assert!(too_big.check().is_err());
    }
}
