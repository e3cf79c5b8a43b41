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
                if seen.version != *version {
                    seen.version = version.clone();
                }
                seen.last_seen = now;
                seen
            }
            None => SeenVersion { version: version.clone(), first_seen: now, last_seen: now },
        };
        self.versions.insert(0, entry);
        self.versions.truncate(MAX_VERSIONS);
        if self.current != *version {
            self.current = version.clone();
        }
        self.seen_at = now;
    }
}

/// How many versions one download session remembers what was sent of.
pub const MAX_SESSION_VERSIONS: usize = 8;

/// How much of a response rangeway wrote whole a client may still not have read when it stops:
/// what fits between rangeway's write and the client's read (rangeway's socket buffer, the
/// network, the client's socket buffer; Linux grows each to 4-6 MiB at most by default). A client
/// that stopped can hold anything from this far before the end of such a response to its end.
pub const UNREAD_SLACK: u64 = 16 << 20;

/// One download: the requests made under one download id for one object, over one or many
/// connections, by one client — or by several that share a derived id (see
/// `docs/architecture.md`, "Download sessions").
///
/// It keeps, for every version of the object it was sent, what was sent of it; no version ever
/// replaces another, so a bare resume can be checked against every version its client may hold
/// ([`DownloadSession::resumable`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadSession {
    pub id: String,
    /// The key of the object downloaded.
    pub object: String,
    /// The route and client of the latest response.
    pub route: String,
    pub client: String,
    /// What was sent of each version, the version sent to most recently first; at most
    /// [`MAX_SESSION_VERSIONS`].
    pub versions: Vec<VersionSent>,
    /// A version was dropped from `versions` to keep it bounded: what was sent of it is not known
    /// any more, so no bare resume can be shown safe.
    pub forgot: bool,
    /// Body bytes sent, counting bytes sent more than once; saturates at [`MAX_EXACT`].
    pub bytes: u64,
    /// Unix seconds.
    pub started_at: u64,
    /// Unix seconds.
    pub updated_at: u64,
}

/// What a download was sent of one version of its object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSent {
    pub version: ObjectVersion,
    /// The bytes written to the clients' connections: never less than what any client holds of
    /// this version (more, by what was written and not read).
    pub sent: IntervalSet,
    /// Where the last byte of a client that holds a prefix of this version may be: anywhere in a
    /// response that broke off, and within [`UNREAD_SLACK`] of the end of one written whole.
    pub ends: IntervalSet,
    /// A response of this version was not the whole version written whole: a client may hold
    /// pieces of it, and ask for others.
    pub partial: bool,
    /// `sent` or `stops` had no room for a range (see [`IntervalSet::MAX_INTERVALS`]): they
    /// under-state, so this version is taken to be held by anyone.
    pub overflowed: bool,
}

/// What a bare resume (a Range without If-Range or If-Match) says its client holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// A client that only ever resumes where its file ends (`curl -C -`, `wget -c`), asking for
    /// the rest from this offset: it holds the bytes before it, of one version.
    Prefix(u64),
    /// Any other client: it may hold pieces anywhere, and asks for bytes from this offset on
    /// (`None`: not known before the object's length, for a suffix or several ranges).
    Pieces(Option<u64>),
}

/// Which versions a bare resume may be answered with ([`DownloadSession::resumable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumable<'s> {
    /// Whatever the origin has: no version sent under this id can be what the client holds.
    Any,
    /// This version only: it is the one version sent under this id the client may hold.
    Only(&'s ObjectVersion),
    /// None: the client may hold any of several versions, or one the session forgot.
    Neither,
}

impl DownloadSession {
    /// A session that begins with `delivery`, ignoring whatever came before it.
    pub fn begin(delivery: &Delivery) -> Self {
        let mut session = Self {
            id: delivery.id.clone(),
            object: delivery.object.clone(),
            route: delivery.route.clone(),
            client: delivery.client.clone(),
            versions: Vec::new(),
            forgot: false,
            bytes: 0,
            started_at: delivery.now,
            updated_at: delivery.now,
        };
        session.add(delivery);
        session
    }

    /// The session after `delivery`, given the one stored before it (if any): the stored one with
    /// the delivery added to its version's record, or a new one when the stored one is of
    /// another download (a colliding store key).
    pub fn record(stored: Option<Self>, delivery: &Delivery) -> Self {
        match stored {
            Some(mut session) => {
                session.record_in_place(delivery);
                session
            }
            None => Self::begin(delivery),
        }
    }

    /// [`Self::record`], on a session the store holds in place.
    pub fn record_in_place(&mut self, delivery: &Delivery) {
        if self.id == delivery.id && self.object == delivery.object {
            self.add(delivery);
        } else {
            *self = Self::begin(delivery);
        }
    }

    /// Which versions a bare resume whose client says `holding` may be answered with.
    ///
    /// A version may be held by the client when the client's claim is one a client sent that
    /// version could make ([`VersionSent::may_be_held`]). When no version sent under this id may
    /// be held, the client's bytes did not come through this session, and any version may follow
    /// them; when exactly one may, only that one; when several may, or a forgotten one, none can
    /// be shown safe.
    pub fn resumable(&self, holding: Holding) -> Resumable<'_> {
        if holding == Holding::Prefix(0) {
            return Resumable::Any;
        }
        if self.forgot {
            return Resumable::Neither;
        }
        let mut held = self.versions.iter().filter(|sent| sent.may_be_held(holding));
        match (held.next(), held.next()) {
            (None, _) => Resumable::Any,
            (Some(sent), None) => Resumable::Only(&sent.version),
            (Some(_), Some(_)) => Resumable::Neither,
        }
    }

    /// What was sent of the version sent to most recently.
    pub fn latest(&self) -> Option<&VersionSent> {
        self.versions.first()
    }

    /// What was sent of `version`, if any of it was.
    pub fn of_version(&self, version: &ObjectVersion) -> Option<&VersionSent> {
        self.versions.iter().find(|sent| sent.version.same_as(version))
    }

    /// Whether the version sent to most recently was sent in full.
    pub fn is_complete(&self) -> bool {
        self.latest().is_some_and(VersionSent::is_complete)
    }

    /// Adds what `other`, the same download recorded by another process (its predecessor during
    /// an upgrade), holds: every version either was sent, with what either sent of it. The result
    /// claims no less than both did, so a bare resume either could vouch for is checked against
    /// both.
    pub fn merge(&mut self, other: &DownloadSession) {
        let newer = other.updated_at > self.updated_at;
        // The newer session's versions first: the one sent to most recently leads.
        let mine = std::mem::take(&mut self.versions);
        let (mut versions, theirs) =
            if newer { (other.versions.clone(), mine) } else { (mine, other.versions.clone()) };
        for sent in &theirs {
            match versions.iter_mut().find(|mine| mine.version.same_as(&sent.version)) {
                Some(mine) => mine.merge(sent),
                None => versions.push(sent.clone()),
            }
        }
        if versions.len() > MAX_SESSION_VERSIONS {
            versions.truncate(MAX_SESSION_VERSIONS);
            self.forgot = true;
        }
        self.versions = versions;
        self.forgot |= other.forgot;
        self.bytes = self.bytes.saturating_add(other.bytes).min(MAX_EXACT);
        self.started_at = self.started_at.min(other.started_at);
        if newer {
            self.route.clone_from(&other.route);
            self.client.clone_from(&other.client);
            self.updated_at = other.updated_at;
        }
    }

    fn add(&mut self, delivery: &Delivery) {
        let mut sent = match self.versions.iter().position(|s| s.version.same_as(&delivery.version))
        {
            Some(index) => self.versions.remove(index),
            None => VersionSent::new(delivery.version.clone()),
        };
        // The same bytes may come with a new description (content type, strength).
        if sent.version != delivery.version {
            sent.version = delivery.version.clone();
        }
        sent.add(delivery.range, delivery.ending);
        self.versions.insert(0, sent);
        if self.versions.len() > MAX_SESSION_VERSIONS {
            self.versions.truncate(MAX_SESSION_VERSIONS);
            self.forgot = true;
        }
        self.route.clone_from(&delivery.route);
        self.client.clone_from(&delivery.client);
        self.bytes = self.bytes.saturating_add(delivery.bytes).min(MAX_EXACT);
        self.updated_at = delivery.now;
    }
}

impl VersionSent {
    fn new(version: ObjectVersion) -> Self {
        Self {
            version,
            sent: IntervalSet::new(),
            ends: IntervalSet::new(),
            partial: false,
            overflowed: false,
        }
    }

    /// Whether a client sent (some of) this version could make the claim `holding`.
    ///
    /// A prefix client holding bytes `0..n` of this version was sent all of them, and its last
    /// byte `n - 1` is one where a response left it. Any other client of it holds pieces, and
    /// asks for one it lacks: anything at all when a response of this version was not written
    /// whole from its first byte to its last, else what follows the last byte it read of such a
    /// response.
    pub fn may_be_held(&self, holding: Holding) -> bool {
        let left_at = |end: u64| end.checked_sub(1).is_some_and(|last| self.ends.contains(last));
        self.overflowed
            || match holding {
                Holding::Prefix(end) => self.sent.contiguous_prefix_end() >= end && left_at(end),
                Holding::Pieces(from) => {
                    self.partial || from.map_or(!self.ends.is_empty(), left_at)
                }
            }
    }

    /// Whether every byte of the version was sent.
    pub fn is_complete(&self) -> bool {
        self.sent.covers(self.version.size)
    }

    /// Adds what `other`, of the same version, sent and where its clients may have stopped.
    fn merge(&mut self, other: &VersionSent) {
        for range in other.sent.iter() {
            self.overflowed |= self.sent.insert(range).is_err();
        }
        for range in other.ends.iter() {
            self.overflowed |= self.ends.insert(range).is_err();
        }
        self.partial |= other.partial;
        self.overflowed |= other.overflowed;
    }

    fn add(&mut self, range: ByteRange, ending: Ending) {
        let ends = match ending {
            // A client that read all but `UNREAD_SLACK` has its last byte one before that.
            Ending::Whole => ByteRange::new(
                range.end().saturating_sub(UNREAD_SLACK + 1).max(range.start()),
                range.end(),
            ),
            Ending::Cut => Some(range),
            Ending::Parts => None,
        };
        let whole_version =
            ending == Ending::Whole && range.start() == 0 && range.end() >= self.version.size;
        self.partial |= !whole_version;
        if ending == Ending::Parts {
            return;
        }
        // A set with no room under-states: this version is then taken to be held by anyone.
        let sent = self.sent.insert(range);
        let ended = ends.map_or(Ok(()), |ends| self.ends.insert(ends));
        self.overflowed |= sent.is_err() || ended.is_err();
    }
}

/// How a response's body ended, which is what its client can hold of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every byte of the range was written: the client holds it, but for what it had not read
    /// yet when it stopped (at most [`UNREAD_SLACK`]).
    Whole,
    /// It broke off (or is still going): the client holds a prefix of the range, of any length.
    Cut,
    /// A multipart answer: the client holds pieces somewhere in the range.
    Parts,
}

/// What one response sent to a download, reported after the response.
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
    /// The bytes of the representation written to the client (for [`Ending::Parts`], the span of
    /// the parts).
    pub range: ByteRange,
    pub ending: Ending,
    /// Body bytes sent.
    pub bytes: u64,
    /// Unix seconds.
    pub now: u64,
}

impl Delivery {
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
    use proptest::prelude::*;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn version(etag: &str, size: u64) -> ObjectVersion {
        ObjectVersion {
            etag: Some(format!("\"{etag}\"")),
            strong: true,
            size,
            last_modified: Some(1_700_000_000),
            content_type: Some("application/octet-stream".to_owned()),
        }
    }

    fn delivery(version: &ObjectVersion, range: (u64, u64), ending: Ending, now: u64) -> Delivery {
        let range = ByteRange::new(range.0, range.1).expect("start <= end");
        Delivery {
            id: "d1".to_owned(),
            object: "files|/a.bin".to_owned(),
            route: "files".to_owned(),
            client: "127.0.0.1".to_owned(),
            version: version.clone(),
            origin_version: version.clone(),
            range,
            ending,
            bytes: range.len(),
            now,
        }
    }

    fn recorded(deliveries: &[Delivery]) -> DownloadSession {
        deliveries.iter().fold(None, |s, d| Some(DownloadSession::record(s, d))).expect("one")
    }

    #[test]
    fn versions_are_kept_side_by_side_newest_first() {
        let (v1, v2) = (version("a", 100 * MIB), version("b", 100 * MIB));
        let s = recorded(&[
            delivery(&v1, (0, 40 * MIB), Ending::Cut, 10),
            delivery(&v2, (0, 100 * MIB), Ending::Whole, 16),
            delivery(&v1, (40 * MIB, 50 * MIB), Ending::Cut, 20),
        ]);
        let versions: Vec<_> = s.versions.iter().map(|v| v.version.clone()).collect();
        assert_eq!(versions, [v1.clone(), v2.clone()]);
        assert_eq!(s.of_version(&v1).map(|v| v.sent.contiguous_prefix_end()), Some(50 * MIB));
        assert!(s.of_version(&v2).is_some_and(VersionSent::is_complete));
        assert!(!s.is_complete(), "the latest version, v1, is unfinished");
        assert_eq!((s.bytes, s.started_at, s.updated_at), (150 * MIB, 10, 20));
    }

    #[test]
    fn a_merged_session_vouches_for_no_more_than_either_did() {
        // During an upgrade, the old process sent 8 MiB of v1, the new one 15 MiB of v2.
        let (v1, v2) = (version("1", 64 * MIB), version("2", 64 * MIB));
        let old = recorded(&[delivery(&v1, (0, 8 * MIB), Ending::Cut, 1)]);
        let new = recorded(&[delivery(&v2, (0, 15 * MIB), Ending::Cut, 2)]);
        let mut merged = new.clone();
        merged.merge(&old);
        assert_eq!(
            merged,
            recorded(&[
                delivery(&v1, (0, 8 * MIB), Ending::Cut, 1),
                delivery(&v2, (0, 15 * MIB), Ending::Cut, 2),
            ])
        );
        let mut other_way = old;
        other_way.merge(&new);
        assert_eq!(other_way.versions, merged.versions, "the newer session's versions lead");
        assert_eq!(merged.resumable(Holding::Prefix(5 * MIB)), Resumable::Neither);
        assert_eq!(merged.resumable(Holding::Prefix(15 * MIB)), Resumable::Only(&v2));
    }

    #[test]
    fn a_neighbours_whole_download_of_a_new_version_moves_nothing() {
        // A stopped at 8 MiB of v1; the object changed; B, at the same address, downloaded v2
        // whole. A's resume may still be holding v1.
        let (v1, v2) = (version("1", 32 * MIB), version("2", 32 * MIB));
        let s = recorded(&[
            delivery(&v1, (0, 8 * MIB), Ending::Cut, 1),
            delivery(&v2, (0, 32 * MIB), Ending::Whole, 2),
        ]);
        assert_eq!(s.resumable(Holding::Prefix(8 * MIB)), Resumable::Only(&v1));
        assert_eq!(s.resumable(Holding::Pieces(Some(8 * MIB))), Resumable::Only(&v1));
        // Within the end B may not have read, either could be held.
        assert_eq!(s.resumable(Holding::Pieces(Some(30 * MIB))), Resumable::Neither);
    }

    #[test]
    fn a_restarted_download_is_resumable_past_what_the_old_version_left() {
        // 8 MiB of v1, the object changed, a fresh download got 15 MiB of v2 and broke off.
        let (v1, v2) = (version("1", 64 * MIB), version("2", 64 * MIB));
        let s = recorded(&[
            delivery(&v1, (0, 8 * MIB), Ending::Cut, 1),
            delivery(&v2, (0, 15 * MIB), Ending::Cut, 2),
        ]);
        assert_eq!(s.resumable(Holding::Prefix(15 * MIB)), Resumable::Only(&v2));
        // Within what v1 left, the prefix could be either's.
        assert_eq!(s.resumable(Holding::Prefix(5 * MIB)), Resumable::Neither);
        // Beyond anything sent under this id: not from here, any version may follow.
        assert_eq!(s.resumable(Holding::Prefix(20 * MIB)), Resumable::Any);
        // A client that holds nothing mixes nothing.
        assert_eq!(s.resumable(Holding::Prefix(0)), Resumable::Any);
    }

    #[test]
    fn a_version_downloaded_whole_holds_back_only_its_unread_end() {
        let (v1, v2) = (version("1", 100 * MIB), version("2", 100 * MIB));
        let s = recorded(&[
            delivery(&v1, (0, 100 * MIB), Ending::Whole, 1),
            delivery(&v2, (0, 5 * MIB), Ending::Cut, 2),
        ]);
        assert_eq!(s.resumable(Holding::Prefix(5 * MIB)), Resumable::Only(&v2));
        assert_eq!(s.resumable(Holding::Prefix(90 * MIB)), Resumable::Only(&v1));
        assert_eq!(s.resumable(Holding::Pieces(Some(50 * MIB))), Resumable::Only(&v2));
        assert_eq!(s.resumable(Holding::Pieces(Some(95 * MIB))), Resumable::Neither);
        // Clients of several pieces may ask for anything they lack of v2.
        let s = recorded(&[
            delivery(&v1, (0, 100 * MIB), Ending::Whole, 1),
            delivery(&v2, (50 * MIB, 60 * MIB), Ending::Whole, 2),
        ]);
        assert_eq!(s.resumable(Holding::Pieces(Some(MIB))), Resumable::Only(&v2));
        assert_eq!(s.resumable(Holding::Pieces(None)), Resumable::Neither);
    }

    #[test]
    fn overflow_and_forgetting_hold_everything_back() {
        let v = |i: u64| version(&i.to_string(), 100);
        let mut s = recorded(&[delivery(&v(0), (0, 10), Ending::Cut, 0)]);
        for i in 1..=MAX_SESSION_VERSIONS as u64 {
            s = DownloadSession::record(Some(s), &delivery(&v(i), (0, 10), Ending::Cut, i));
        }
        assert_eq!(s.versions.len(), MAX_SESSION_VERSIONS);
        assert!(s.forgot);
        assert_eq!(s.resumable(Holding::Prefix(60)), Resumable::Neither);

        let mut sent = VersionSent::new(v(1));
        for i in 0..=IntervalSet::MAX_INTERVALS as u64 {
            sent.add(ByteRange::new(i * 10, i * 10 + 5).expect("valid"), Ending::Whole);
        }
        assert!(sent.overflowed);
        assert!(sent.may_be_held(Holding::Prefix(1 << 40)));
    }

    #[test]
    fn multipart_answers_mark_pieces_only() {
        let v = version("m", 100);
        let s = recorded(&[delivery(&v, (0, 100), Ending::Parts, 1)]);
        let sent = s.latest().expect("recorded");
        assert!(sent.partial && sent.sent.is_empty() && sent.ends.is_empty());
        assert_eq!(s.resumable(Holding::Pieces(Some(50))), Resumable::Only(&v));
        assert_eq!(s.resumable(Holding::Prefix(50)), Resumable::Any);
    }

    /// One client of a shared download id, as the model check sees it.
    #[derive(Debug, Clone, Copy)]
    enum Client {
        /// Holds bytes `0..len` of version `of` (a `curl -C -` or `wget -c`).
        Prefix { of: u64, len: u64 },
        /// Holds the chunks set in `held` (of [`CHUNKS`] chunks) of version `of` (an aria2c).
        Pieces { of: u64, held: u16 },
    }

    const CHUNKS: u64 = 12;
    /// A chunk: a few of them make the slack, so it matters where a client stops.
    const CHUNK: u64 = UNREAD_SLACK / 4;
    const SIZE: u64 = CHUNKS * CHUNK;

    /// What happens next, in the model: the numbers pick a client, a chunk, an outcome.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// The object changes at the origin.
        Change,
        /// Client `who` downloads from the start, with no Range: whole, or broken off.
        Fresh { who: usize, pieces: bool, stop: u64, read: u64 },
        /// Client `who` resumes: asks for what it lacks from chunk `at` on.
        Resume { who: usize, at: u64, stop: u64, read: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            1 => Just(Step::Change),
            3 => (0..3usize, any::<bool>(), 0..=CHUNKS, 0..5u64)
                .prop_map(|(who, pieces, stop, read)| Step::Fresh { who, pieces, stop, read }),
            6 => (0..3usize, 0..CHUNKS, 0..=CHUNKS, 0..5u64)
                .prop_map(|(who, at, stop, read)| Step::Resume { who, at, stop, read }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// No interleaving of three clients sharing one download id — downloading, breaking
        /// off, reading less than was written, resuming, the object changing between any two
        /// requests — ends with a client holding bytes of two versions.
        #[test]
        fn no_interleaving_mixes_versions(steps in proptest::collection::vec(step(), 1..40)) {
            let mut origin = 0u64;
            let mut clients: [Option<Client>; 3] = [None; 3];
            let mut session: Option<DownloadSession> = None;
            let v = |n: u64| version(&n.to_string(), SIZE);
            for (now, step) in (1u64..).zip(steps) {
                // A response sends `from..to` of the origin's version; it is written whole when
                // it reaches its end, and its client read `read` chunks fewer than were written,
                // within the slack, at most what it was sent.
                let send = |from: u64, to: u64, read: u64, session: &mut Option<DownloadSession>| {
                    let to = to.max(from);
                    let whole = to == CHUNKS;
                    let ending = if whole { Ending::Whole } else { Ending::Cut };
                    if to > from {
                        let d = delivery(&v(origin), (from * CHUNK, to * CHUNK), ending, now);
                        *session = Some(DownloadSession::record(session.take(), &d));
                    }
                    // A broken-off response may leave its client anywhere in it; a whole one
                    // within the slack of its end.
                    let unread = if whole { read.min(4) } else { read };
                    to.saturating_sub(unread).max(from)
                };
                match step {
                    Step::Change => origin += 1,
                    Step::Fresh { who, pieces, stop, read } => {
                        let got = send(0, stop, read, &mut session);
                        clients[who] = Some(if pieces {
                            Client::Pieces { of: origin, held: ((1u32 << got) - 1) as u16 }
                        } else {
                            Client::Prefix { of: origin, len: got }
                        });
                    }
                    Step::Resume { who, at, stop, read } => {
                        let Some(client) = clients[who] else { continue };
                        let (holding, from) = match client {
                            Client::Prefix { len, .. } if len < CHUNKS => {
                                (Holding::Prefix(len * CHUNK), len)
                            }
                            Client::Pieces { held, .. } if held & (1 << at) == 0 => {
                                (Holding::Pieces(Some(at * CHUNK)), at)
                            }
                            _ => continue,
                        };
                        let answered = match session.as_ref().map(|s| s.resumable(holding)) {
                            None | Some(Resumable::Any) => true,
                            Some(Resumable::Only(version)) => version.same_as(&v(origin)),
                            Some(Resumable::Neither) => false,
                        };
                        if !answered {
                            continue;
                        }
                        // A client holding nothing yet holds no version.
                        let of = match client {
                            Client::Prefix { len: 0, .. } | Client::Pieces { held: 0, .. } => origin,
                            Client::Prefix { of, .. } | Client::Pieces { of, .. } => of,
                        };
                        prop_assert_eq!(of, origin, "{:?} was sent bytes of another version", client);
                        let got = send(from, stop.max(from + 1).min(CHUNKS), read, &mut session);
                        clients[who] = Some(match client {
                            Client::Prefix { .. } => Client::Prefix { of, len: got },
                            Client::Pieces { held, .. } => {
                                let mut held = held;
                                for chunk in from..got {
                                    held |= 1 << chunk;
                                }
                                Client::Pieces { of, held }
                            }
                        });
                    }
                }
            }
        }
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
        let ok = delivery(&version("a", MAX_EXACT), (0, MAX_EXACT), Ending::Whole, 1);
        assert!(ok.check().is_ok());
        let mut too_big = ok.clone();
        too_big.version.size = MAX_EXACT + 1;
        assert!(matches!(too_big.check(), Err(StoreError::Rejected(_))));
        let mut too_big = ok;
        too_big.version.last_modified = Some(u64::MAX);
        assert!(too_big.check().is_err());
    }
}
