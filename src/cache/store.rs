//! What the cache keeps on disk and the index of it: where each slice lives, what it holds, what
//! everything costs, which to evict — and which version of each object is the current one.
//!
//! Layout, under the configured directory:
//!
//! ```text
//! v1/<vv>/<version>/meta.json     what the origin said of the version (see `Meta`)
//! v1/<vv>/<version>/<index>       slice `index`: a header, then its bytes of the object
//! v1/<vv>/<version>/<index>.part  a slice being written (never read after a restart)
//! ```
//!
//! `<version>` is the hex of a hash of the upstream, the object's upstream target, its strong
//! ETag and the slice size; `<vv>` its first two digits. A slice file is written under a `.part`
//! name and renamed once complete, header last: a kill at any moment leaves either a complete
//! slice or a `.part` file, which the start-up scan deletes. The header carries the slice's
//! length and CRC32, checked the first time a slice is read after a start (and on every read of
//! one served through user space), so a file damaged at rest is a miss, never a wrong byte.
//!
//! **Bounds.** Everything kept counts, at its size on disk as `du` finds it (`st_blocks`, read
//! back after each write; estimated in whole blocks while a slice is being written): the cache
//! folder and `v1/`, each `<vv>/` folder, each version's folder and `meta.json`, each slice. Each
//! of those is also one entry (an inode) against the bound on entries. Eviction takes the least
//! recently used slice or version until both bounds hold: a version is used whenever one of its
//! slices is, and later, so its slices go before it; evicting a version deletes its folder, and
//! a `<vv>/` folder left empty goes with it. A version with slices being written is passed over.
//! The in-memory index holds one record per entry, so the bound on entries bounds it too.
//!
//! All changes to the folders happen under the index's lock: a version folder is never made in a
//! `<vv>/` being deleted, and what the index counts is what the disk holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::{self, Write as _};
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::Version;
use crate::telemetry::metrics::Metrics;

/// The first bytes of every slice file.
const MAGIC: &[u8; 8] = b"RWSLICE1";
/// Header: magic, the data's length (u64 LE), its CRC32 (u32 LE), reserved.
pub(crate) const HEADER_LEN: u64 = 32;
const FORMAT_DIR: &str = "v1";
const META: &str = "meta.json";
const PART: &str = "part";

/// One version of one object, as its slices are keyed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct VersionKey([u8; 16]);

impl VersionKey {
    pub(crate) fn of(upstream: &str, target: &str, etag: &str, slice_size: u64) -> Self {
        let size = slice_size.to_le_bytes();
        let parts = [upstream.as_bytes(), target.as_bytes(), etag.as_bytes(), &size];
        let mut key = [0; 16];
        key.copy_from_slice(&crate::fingerprint::digest(parts)[..16]);
        Self(key)
    }

    pub(crate) fn hex(self) -> String {
        crate::fingerprint::hex(&self.0, self.0.len())
    }

    fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 32 {
            return None;
        }
        let mut key = [0; 16];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(key))
    }

    /// The `<vv>` folder it is in.
    fn prefix(self) -> u8 {
        self.0[0]
    }
}

impl std::fmt::Debug for VersionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VersionKey({})", self.hex())
    }
}

/// One slice of one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SliceId {
    pub(crate) version: VersionKey,
    pub(crate) index: u64,
}

/// The most the cache may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Bytes on disk, in whole blocks.
    pub(crate) bytes: u64,
    /// Files and folders.
    pub(crate) entries: u64,
}

/// What something kept costs: its bytes on disk and its entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cost {
    pub(crate) bytes: u64,
    pub(crate) entries: u64,
}

impl Cost {
    const NONE: Self = Self { bytes: 0, entries: 0 };

    /// One file or folder of `bytes` on disk.
    fn entry(bytes: u64) -> Self {
        Self { bytes, entries: 1 }
    }

    fn add(&mut self, other: Self) {
        self.bytes += other.bytes;
        self.entries += other.entries;
    }

    fn sub(&mut self, other: Self) {
        self.bytes = self.bytes.saturating_sub(other.bytes);
        self.entries = self.entries.saturating_sub(other.entries);
    }
}

/// What the LRU order holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Slice(SliceId),
    Version(VersionKey),
}

/// A complete slice in the index.
#[derive(Debug)]
struct Entry {
    len: u64,
    crc: u32,
    /// Checked against its CRC since this process started.
    verified: bool,
    /// When it was last used, in the index's own ticks: the eviction order.
    used: u64,
    /// Its file's bytes on disk.
    disk: u64,
}

/// A version in the index: what is known of it, its folder and `meta.json`, its slices.
#[derive(Debug)]
struct VersionEntry {
    version: Arc<Version>,
    /// The indexes of its complete slices.
    slices: BTreeSet<u64>,
    /// The indexes of its slices being written: it is not evicted meanwhile.
    writing: BTreeSet<u64>,
    /// Its folder's and its `meta.json`'s bytes on disk.
    dir_bytes: u64,
    meta_bytes: u64,
    used: u64,
}

/// A `<vv>/` folder: its bytes on disk and how many versions it holds.
#[derive(Debug, Default)]
struct Prefix {
    bytes: u64,
    versions: u64,
}

#[derive(Debug, Default)]
struct Index {
    slices: HashMap<SliceId, Entry>,
    versions: HashMap<VersionKey, VersionEntry>,
    /// The current version of each object (upstream, target): the one a request is answered by.
    objects: HashMap<(String, String), VersionKey>,
    prefixes: HashMap<u8, Prefix>,
    /// By last use: what eviction takes first.
    by_use: BTreeMap<u64, Item>,
    tick: u64,
    /// `v1/`'s bytes on disk (it grows with the `<vv>/` folders in it).
    format_dir_bytes: u64,
    /// Everything kept, the cache folder and `v1/` included.
    used: Cost,
    /// Promised to slices being written.
    reserved: Cost,
}

/// Where things are, and what a size costs in whole blocks.
#[derive(Debug)]
struct Layout {
    root: PathBuf,
    /// The file system's block size: what a file's bytes are rounded up to before it is written.
    block: u64,
}

impl Layout {
    fn prefix_dir(&self, prefix: u8) -> PathBuf {
        self.root.join(format!("{prefix:02x}"))
    }

    fn version_dir(&self, version: VersionKey) -> PathBuf {
        self.prefix_dir(version.prefix()).join(version.hex())
    }

    fn slice_path(&self, id: SliceId) -> PathBuf {
        self.version_dir(id.version).join(id.index.to_string())
    }

    /// A file of `len` bytes, in whole blocks.
    fn blocks(&self, len: u64) -> u64 {
        len.div_ceil(self.block) * self.block
    }
}

/// What a file or folder takes on disk, as `du` counts it.
fn on_disk(path: &Path) -> u64 {
    fs::symlink_metadata(path).map_or(0, |meta| meta.blocks() * 512)
}

/// A complete slice, open for reading.
#[derive(Debug)]
pub(crate) struct OpenSlice {
    pub(crate) file: File,
    pub(crate) len: u64,
    pub(crate) crc: u32,
    /// Whether it must be checked against `crc` before any byte of it is served.
    pub(crate) unverified: bool,
}

/// What the disk holds.
#[derive(Debug)]
pub(crate) struct SliceStore {
    layout: Layout,
    bounds: Bounds,
    index: Mutex<Index>,
    metrics: Arc<Metrics>,
}

/// What the start-up scan found.
#[derive(Debug, Default)]
pub(crate) struct Scanned {
    pub(crate) objects: usize,
    pub(crate) slices: usize,
    /// Files and folders deleted: slices being written when the process stopped, damaged ones,
    /// versions without their metadata or replaced by a newer one.
    pub(crate) removed: usize,
    /// Slices and versions evicted to bring what was there within the bounds.
    pub(crate) evicted: u64,
}

impl SliceStore {
    /// Opens the cache at `dir`, creating it, and indexes what a previous run left there: each
    /// version's `meta.json` read by `parse`, the newest version of each object kept. Evicts
    /// what does not fit the bounds.
    pub(crate) fn open(
        dir: &Path,
        bounds: Bounds,
        metrics: &Arc<Metrics>,
        parse: impl Fn(VersionKey, &[u8]) -> Option<Version>,
    ) -> io::Result<(Self, Scanned)> {
        let root = dir.join(FORMAT_DIR);
        fs::create_dir_all(&root)?;
        // A probe that the folder can be written, so a read-only one is found here, once.
        let probe = root.join(".probe");
        File::create(&probe)?.write_all(b"ok")?;
        fs::remove_file(&probe)?;
        let block = fs::metadata(&root)?.blksize().max(512);
        let store = Self {
            layout: Layout { root, block },
            bounds,
            index: Mutex::new(Index::default()),
            metrics: Arc::clone(metrics),
        };
        let scanned = {
            let mut index = store.lock();
            index.format_dir_bytes = on_disk(&store.layout.root);
            index.used = Cost { bytes: on_disk(dir) + index.format_dir_bytes, entries: 2 };
            let mut scanned = store.scan(&mut index, &parse)?;
            scanned.objects = index.objects.len();
            scanned.evicted = index.make_room(&store.layout, bounds, Cost::NONE);
            scanned
        };
        store.report(scanned.evicted);
        Ok((store, scanned))
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the gauges to what is kept now, and counts `evicted`.
    fn report(&self, evicted: u64) {
        let used = self.lock().used;
        self.metrics.cache_disk(used.bytes, used.entries);
        if evicted > 0 {
            self.metrics.cache_evicted(evicted);
        }
    }

    fn scan(
        &self,
        index: &mut Index,
        parse: &impl Fn(VersionKey, &[u8]) -> Option<Version>,
    ) -> io::Result<Scanned> {
        let mut scanned = Scanned::default();
        let layout = &self.layout;
        for prefix_dir in fs::read_dir(&layout.root)? {
            let prefix_dir = prefix_dir?.path();
            let prefix = prefix_dir
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|name| name.len() == 2)
                .and_then(|name| u8::from_str_radix(name, 16).ok());
            let Some(prefix) = prefix.filter(|_| prefix_dir.is_dir()) else { continue };
            let bytes = on_disk(&prefix_dir);
            index.prefixes.insert(prefix, Prefix { bytes, versions: 0 });
            index.used.add(Cost::entry(bytes));
            for version_dir in fs::read_dir(&prefix_dir)? {
                let version_dir = version_dir?.path();
                let key = version_dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(VersionKey::from_hex)
                    .filter(|key| key.prefix() == prefix);
                let meta = fs::read(version_dir.join(META)).ok();
                let version = key.zip(meta).and_then(|(key, meta)| parse(key, &meta));
                let Some(version) = version.filter(|v| Some(v.key) == key) else {
                    // Slices without what the origin said of them cannot be served.
                    let _ =
                        fs::remove_dir_all(&version_dir).or_else(|_| fs::remove_file(&version_dir));
                    scanned.removed += 1;
                    continue;
                };
                let key = version.key;
                let object = (version.upstream.clone(), version.target.clone());
                // The newest answer of an object is what it is; older versions' slices go.
                if let Some(&known) = index.objects.get(&object) {
                    let newer = index.versions.get(&known).is_some_and(|entry| {
                        entry.version.freshness.response_time >= version.freshness.response_time
                    });
                    if newer {
                        let _ = fs::remove_dir_all(&version_dir);
                        scanned.removed += 1;
                        continue;
                    }
                    index.drop_version(layout, known);
                    scanned.removed += 1;
                }
                let mut entry = VersionEntry {
                    version: Arc::new(version),
                    slices: BTreeSet::new(),
                    writing: BTreeSet::new(),
                    dir_bytes: on_disk(&version_dir),
                    meta_bytes: on_disk(&version_dir.join(META)),
                    used: 0,
                };
                for file in fs::read_dir(&version_dir)? {
                    let path = file?.path();
                    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    if name == META {
                        continue;
                    }
                    let slice = name.parse::<u64>().ok().and_then(|i| {
                        let header = read_header(&File::open(&path).ok()?)?;
                        let meta = fs::metadata(&path).ok()?;
                        (meta.len() == HEADER_LEN + header.0).then_some((i, header, meta))
                    });
                    let Some((i, (len, crc), meta)) = slice else {
                        let _ = fs::remove_file(&path);
                        scanned.removed += 1;
                        continue;
                    };
                    let id = SliceId { version: key, index: i };
                    let disk = meta.blocks() * 512;
                    let used = index.next_tick();
                    index.by_use.insert(used, Item::Slice(id));
                    index.slices.insert(id, Entry { len, crc, verified: false, used, disk });
                    index.used.add(Cost::entry(disk));
                    entry.slices.insert(i);
                    scanned.slices += 1;
                }
                // Read again: the deletions above do not shrink it, but a file system may.
                entry.dir_bytes = on_disk(&version_dir);
                entry.used = index.next_tick();
                index.by_use.insert(entry.used, Item::Version(key));
                index.used.add(Cost { bytes: entry.dir_bytes + entry.meta_bytes, entries: 2 });
                index.objects.insert(object, key);
                index.versions.insert(key, entry);
                if let Some(prefix) = index.prefixes.get_mut(&prefix) {
                    prefix.versions += 1;
                }
            }
            index.remove_prefix_if_empty(layout, prefix);
        }
        Ok(scanned)
    }

    /// The current version of `object`, counted as used; `None` when there is none.
    pub(crate) fn current(&self, object: &(String, String)) -> Option<Arc<Version>> {
        let mut index = self.lock();
        let key = *index.objects.get(object)?;
        index.touch_version(key);
        index.versions.get(&key).map(|entry| Arc::clone(&entry.version))
    }

    /// Every current version, for the admin API.
    pub(crate) fn versions(&self) -> Vec<Arc<Version>> {
        self.lock().versions.values().map(|entry| Arc::clone(&entry.version)).collect()
    }

    /// Records `version` as the current one of its object, with `meta` (what the origin said of
    /// it) written beside its slices: a version of the object kept before is dropped, unless it
    /// is this one, whose facts are updated. A version there is no room for is not kept.
    pub(crate) fn keep(&self, version: Arc<Version>, meta: &[u8]) -> io::Result<()> {
        let mut index = self.lock();
        let (kept, evicted) = index.keep(&self.layout, self.bounds, version, meta);
        let evicted = evicted + index.make_room(&self.layout, self.bounds, Cost::NONE);
        drop(index);
        self.report(evicted);
        kept
    }

    /// Drops `object`'s current version (its slices and metadata deleted); `None` when it had
    /// none.
    pub(crate) fn remove_object(&self, object: &(String, String)) -> Option<Arc<Version>> {
        let dropped = {
            let mut index = self.lock();
            let key = *index.objects.get(object)?;
            index.drop_version(&self.layout, key)
        };
        self.report(0);
        dropped
    }

    /// Drops a version (its slices and metadata deleted), when it is kept.
    pub(crate) fn remove_version(&self, version: VersionKey) {
        self.lock().drop_version(&self.layout, version);
        self.report(0);
    }

    /// Whether a slice is complete.
    pub(crate) fn has(&self, id: SliceId) -> bool {
        self.lock().slices.contains_key(&id)
    }

    /// Opens a complete slice, counting it as used; `None` when it is not (or no longer) there.
    pub(crate) fn open_slice(&self, id: SliceId) -> Option<OpenSlice> {
        let (len, crc, unverified) = {
            let mut index = self.lock();
            let tick = index.next_tick();
            let entry = index.slices.get_mut(&id)?;
            let before = std::mem::replace(&mut entry.used, tick);
            let facts = (entry.len, entry.crc, !entry.verified);
            index.by_use.remove(&before);
            index.by_use.insert(tick, Item::Slice(id));
            index.touch_version(id.version);
            facts
        };
        match File::open(self.layout.slice_path(id)) {
            Ok(file) => Some(OpenSlice { file, len, crc, unverified }),
            Err(_) => {
                self.lock().forget_slice(id);
                self.report(0);
                None
            }
        }
    }

    /// Checks a slice's bytes against its CRC; the first check since start is remembered. A
    /// slice that fails is deleted: `false`.
    pub(crate) fn verify(&self, id: SliceId, slice: &OpenSlice) -> bool {
        let good = crc_of(&slice.file, slice.len).is_ok_and(|crc| crc == slice.crc);
        if good {
            if let Some(entry) = self.lock().slices.get_mut(&id) {
                entry.verified = true;
            }
        } else {
            self.remove(id);
        }
        good
    }

    /// A new slice file to write, of `len` bytes of the object, under its `.part` name: room
    /// reserved for it (the least recently used evicted until it fits). `None` when it cannot
    /// fit (slices being written hold the rest) or its version is not kept.
    pub(crate) fn claim(&self, id: SliceId, len: u64) -> io::Result<Option<(File, PathBuf)>> {
        let layout = &self.layout;
        let need = Cost::entry(layout.blocks(HEADER_LEN + len));
        let mut index = self.lock();
        // Marked as being written first, so that making room does not evict its version.
        let Some(version) = index.versions.get_mut(&id.version) else { return Ok(None) };
        version.writing.insert(id.index);
        let evicted = index.make_room(layout, self.bounds, need);
        let claimed = if index.fits(self.bounds, need) {
            let part = layout.version_dir(id.version).join(format!("{}.{PART}", id.index));
            let created = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&part)
                // The header's place: written last, once the bytes and their CRC are.
                .and_then(|file| file.write_all_at(&[0; HEADER_LEN as usize], 0).map(|()| file));
            match created {
                Ok(file) => {
                    index.reserved.add(need);
                    Ok(Some((file, part)))
                }
                Err(e) => {
                    let _ = fs::remove_file(&part);
                    Err(e)
                }
            }
        } else {
            Ok(None)
        };
        if !matches!(claimed, Ok(Some(_)))
            && let Some(version) = index.versions.get_mut(&id.version)
        {
            version.writing.remove(&id.index);
        }
        drop(index);
        self.report(evicted);
        claimed
    }

    /// Gives back the room claimed for slice `id` of `len` bytes, which will not be written.
    pub(crate) fn unclaim(&self, id: SliceId, len: u64) {
        let mut index = self.lock();
        index.reserved.sub(Cost::entry(self.layout.blocks(HEADER_LEN + len)));
        if let Some(entry) = index.versions.get_mut(&id.version) {
            entry.writing.remove(&id.index);
        }
    }

    /// Completes a slice written to `part` (`len` bytes after the header, of CRC32 `crc`): its
    /// header, then its final name, then the index. Its claim becomes its size on disk. An error
    /// when its version was dropped meanwhile; the claim is the caller's to give back then.
    pub(crate) fn complete(
        &self,
        id: SliceId,
        file: &File,
        part: &Path,
        len: u64,
        crc: u32,
    ) -> io::Result<()> {
        let mut header = [0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&len.to_le_bytes());
        header[16..20].copy_from_slice(&crc.to_le_bytes());
        file.write_all_at(&header, 0)?;
        let layout = &self.layout;
        let mut index = self.lock();
        if !index.versions.get(&id.version).is_some_and(|v| v.writing.contains(&id.index)) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the slice's version was dropped"));
        }
        fs::rename(part, layout.slice_path(id))?;
        let disk = file.metadata().map_or(0, |meta| meta.blocks() * 512);
        let dir_bytes = on_disk(&layout.version_dir(id.version));
        index.reserved.sub(Cost::entry(layout.blocks(HEADER_LEN + len)));
        let used = index.next_tick();
        index.by_use.insert(used, Item::Slice(id));
        if let Some(old) = index.slices.insert(id, Entry { len, crc, verified: true, used, disk }) {
            index.by_use.remove(&old.used);
            index.used.sub(Cost::entry(old.disk));
        }
        index.used.add(Cost::entry(disk));
        if let Some(entry) = index.versions.get_mut(&id.version) {
            entry.writing.remove(&id.index);
            entry.slices.insert(id.index);
            let before = std::mem::replace(&mut entry.dir_bytes, dir_bytes);
            index.used.sub(Cost { bytes: before, entries: 0 });
            index.used.add(Cost { bytes: dir_bytes, entries: 0 });
        }
        index.touch_version(id.version);
        // Its blocks may be more than the estimate claimed.
        let evicted = index.make_room(layout, self.bounds, Cost::NONE);
        drop(index);
        self.report(evicted);
        Ok(())
    }

    /// A file without a name in the cache's folder, for a body staged before it is sliced
    /// (`super::streamed`): its bytes go with its last descriptor, so a kill leaves nothing.
    pub(crate) fn stage(&self) -> io::Result<File> {
        static STAGED: AtomicU64 = AtomicU64::new(0);
        let n = STAGED.fetch_add(1, Ordering::Relaxed);
        let path = self.layout.root.join(format!("staged.{}.{n}", std::process::id()));
        let file = fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        fs::remove_file(&path)?;
        Ok(file)
    }

    /// The bound on bytes kept.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.bounds.bytes
    }

    /// Deletes a slice.
    pub(crate) fn remove(&self, id: SliceId) {
        self.lock().forget_slice(id);
        let _ = fs::remove_file(self.layout.slice_path(id));
        self.report(0);
    }

    /// The complete slices of a version, by index.
    pub(crate) fn slices_of(&self, version: VersionKey) -> Vec<u64> {
        let index = self.lock();
        index.versions.get(&version).map_or_else(Vec::new, |v| v.slices.iter().copied().collect())
    }

    /// What is kept: bytes on disk and entries.
    pub(crate) fn used(&self) -> Cost {
        self.lock().used
    }
}

impl Index {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Marks a version used, after whatever of it was used just before.
    fn touch_version(&mut self, key: VersionKey) {
        let tick = self.next_tick();
        if let Some(entry) = self.versions.get_mut(&key) {
            let before = std::mem::replace(&mut entry.used, tick);
            self.by_use.remove(&before);
            self.by_use.insert(tick, Item::Version(key));
        }
    }

    /// [`SliceStore::keep`], under the lock: what happened, and how many were evicted.
    fn keep(
        &mut self,
        layout: &Layout,
        bounds: Bounds,
        version: Arc<Version>,
        meta: &[u8],
    ) -> (io::Result<()>, u64) {
        let key = version.key;
        let object = (version.upstream.clone(), version.target.clone());
        if let Some(&old) = self.objects.get(&object)
            && old != key
        {
            self.drop_version(layout, old);
        }
        let dir = layout.version_dir(key);
        if let Some(entry) = self.versions.get_mut(&key) {
            let meta_bytes = match write_meta(&dir, meta) {
                Ok(bytes) => bytes,
                Err(e) => return (Err(e), 0),
            };
            let before = std::mem::replace(&mut entry.meta_bytes, meta_bytes);
            entry.version = version;
            self.used.sub(Cost { bytes: before, entries: 0 });
            self.used.add(Cost { bytes: meta_bytes, entries: 0 });
            self.touch_version(key);
            return (Ok(()), 0);
        }
        let prefix = key.prefix();
        let new_prefix = !self.prefixes.contains_key(&prefix);
        let need = Cost {
            bytes: layout.block * (1 + u64::from(new_prefix)) + layout.blocks(meta.len() as u64),
            entries: 2 + u64::from(new_prefix),
        };
        let evicted = self.make_room(layout, bounds, need);
        if !self.fits(bounds, need) {
            return (Ok(()), evicted);
        }
        // Evicting may have emptied (and deleted) the `<vv>/` folder: asked again.
        let new_prefix = !self.prefixes.contains_key(&prefix);
        let prefix_dir = layout.prefix_dir(prefix);
        let made = (|| {
            if new_prefix {
                fs::create_dir_all(&prefix_dir)?;
            }
            fs::create_dir(&dir)?;
            write_meta(&dir, meta)
        })();
        let meta_bytes = match made {
            Ok(bytes) => bytes,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                if new_prefix {
                    let _ = fs::remove_dir(&prefix_dir);
                }
                return (Err(e), evicted);
            }
        };
        if new_prefix {
            self.prefixes.insert(prefix, Prefix::default());
            self.used.add(Cost::entry(0));
            self.format_dir_changed(layout);
        }
        self.version_added(layout, prefix);
        let dir_bytes = on_disk(&dir);
        let used = self.next_tick();
        self.by_use.insert(used, Item::Version(key));
        self.used.add(Cost { bytes: dir_bytes + meta_bytes, entries: 2 });
        let slices = BTreeSet::new();
        let entry =
            VersionEntry { version, slices, writing: BTreeSet::new(), dir_bytes, meta_bytes, used };
        self.versions.insert(key, entry);
        self.objects.insert(object, key);
        (Ok(()), evicted)
    }

    fn fits(&self, bounds: Bounds, need: Cost) -> bool {
        self.used.bytes + self.reserved.bytes + need.bytes <= bounds.bytes
            && self.used.entries + self.reserved.entries + need.entries <= bounds.entries
    }

    /// Evicts the least recently used slices and versions until `need` fits beside what is kept
    /// and claimed, or nothing more can go: how many went.
    fn make_room(&mut self, layout: &Layout, bounds: Bounds, need: Cost) -> u64 {
        let mut evicted = 0;
        let mut passed_over = Vec::new();
        while !self.fits(bounds, need) {
            let Some((tick, item)) = self.by_use.pop_first() else { break };
            match item {
                Item::Slice(id) => {
                    // Unlinked: a reader holding it open reads on; its space is the kernel's to
                    // free.
                    self.forget_slice(id);
                    let _ = fs::remove_file(layout.slice_path(id));
                }
                Item::Version(key) => {
                    if self.versions.get(&key).is_some_and(|v| !v.writing.is_empty()) {
                        passed_over.push((tick, item));
                        continue;
                    }
                    self.drop_version(layout, key);
                }
            }
            evicted += 1;
        }
        self.by_use.extend(passed_over);
        evicted
    }

    /// Forgets a complete slice (its file is the caller's to delete).
    fn forget_slice(&mut self, id: SliceId) {
        if let Some(entry) = self.slices.remove(&id) {
            self.by_use.remove(&entry.used);
            self.used.sub(Cost::entry(entry.disk));
            if let Some(version) = self.versions.get_mut(&id.version) {
                version.slices.remove(&id.index);
            }
        }
    }

    /// Drops a version: its slices, its metadata and its folder, deleted; its object then has
    /// none. What it was, when it was kept.
    fn drop_version(&mut self, layout: &Layout, key: VersionKey) -> Option<Arc<Version>> {
        let entry = self.versions.remove(&key)?;
        for index in &entry.slices {
            if let Some(slice) = self.slices.remove(&SliceId { version: key, index: *index }) {
                self.by_use.remove(&slice.used);
                self.used.sub(Cost::entry(slice.disk));
            }
        }
        self.by_use.remove(&entry.used);
        self.used.sub(Cost { bytes: entry.dir_bytes + entry.meta_bytes, entries: 2 });
        let object = (entry.version.upstream.clone(), entry.version.target.clone());
        if self.objects.get(&object) == Some(&key) {
            self.objects.remove(&object);
        }
        // Slices being written in it lose their folder: their completion fails, and their
        // readers read from the origin.
        let _ = fs::remove_dir_all(layout.version_dir(key));
        if let Some(prefix) = self.prefixes.get_mut(&key.prefix()) {
            prefix.versions = prefix.versions.saturating_sub(1);
        }
        self.remove_prefix_if_empty(layout, key.prefix());
        Some(entry.version)
    }

    /// Deletes a `<vv>/` folder that holds no version.
    fn remove_prefix_if_empty(&mut self, layout: &Layout, prefix: u8) {
        if self.prefixes.get(&prefix).is_none_or(|p| p.versions > 0) {
            return;
        }
        if fs::remove_dir(layout.prefix_dir(prefix)).is_ok()
            && let Some(gone) = self.prefixes.remove(&prefix)
        {
            self.used.sub(Cost::entry(gone.bytes));
            self.format_dir_changed(layout);
        }
    }

    /// A version folder was made in `<vv>/`: counted, and the folder's size read again.
    fn version_added(&mut self, layout: &Layout, prefix: u8) {
        let bytes = on_disk(&layout.prefix_dir(prefix));
        if let Some(entry) = self.prefixes.get_mut(&prefix) {
            let before = std::mem::replace(&mut entry.bytes, bytes);
            entry.versions += 1;
            self.used.sub(Cost { bytes: before, entries: 0 });
            self.used.add(Cost { bytes, entries: 0 });
        }
    }

    /// A `<vv>/` folder was made or deleted in `v1/`: its size read again.
    fn format_dir_changed(&mut self, layout: &Layout) {
        let bytes = on_disk(&layout.root);
        let before = std::mem::replace(&mut self.format_dir_bytes, bytes);
        self.used.sub(Cost { bytes: before, entries: 0 });
        self.used.add(Cost { bytes, entries: 0 });
    }
}

/// Writes a version's `meta.json` in its folder `dir`, atomically: its bytes on disk.
fn write_meta(dir: &Path, meta: &[u8]) -> io::Result<u64> {
    let part = dir.join(format!("{META}.{PART}"));
    fs::write(&part, meta)?;
    let path = dir.join(META);
    fs::rename(part, &path)?;
    Ok(on_disk(&path))
}

/// A slice file's header: its data's length and CRC32; `None` when it is not one.
fn read_header(file: &File) -> Option<(u64, u32)> {
    let mut header = [0u8; HEADER_LEN as usize];
    file.read_exact_at(&mut header, 0).ok()?;
    if &header[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let crc = u32::from_le_bytes(header[16..20].try_into().ok()?);
    Some((len, crc))
}

/// The CRC32 of a slice file's `len` bytes of data.
fn crc_of(file: &File, len: u64) -> io::Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 256 * 1024];
    let mut at = 0;
    while at < len {
        let want = usize::try_from(len - at).unwrap_or(usize::MAX).min(buffer.len());
        let read = file.read_at(&mut buffer[..want], HEADER_LEN + at)?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        hasher.update(&buffer[..read]);
        at += read as u64;
    }
    Ok(hasher.finalize())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::SystemTime;

    use http::HeaderMap;
    use rangeway_middleware::rfc9111::Freshness;

    use super::*;

    const SLICE: u64 = 1 << 20;

    /// A folder under the temp dir, removed with what is in it on drop.
    pub(crate) struct Folder(pub(crate) PathBuf);

    impl Folder {
        pub(crate) fn new(tag: &str) -> Self {
            let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap();
            let name = format!("rangeway-store-{tag}-{}-{}", std::process::id(), nanos.as_nanos());
            let path = std::env::temp_dir().join(name);
            fs::create_dir(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn version(n: usize, len: u64) -> Version {
        let target = format!("/o{n}");
        let now = SystemTime::now();
        Version {
            key: VersionKey::of("up", &target, "\"e\"", SLICE),
            upstream: "up".to_owned(),
            target,
            id: "\"e\"".to_owned(),
            status: http::StatusCode::OK,
            len,
            slice_size: SLICE,
            headers: HeaderMap::new(),
            freshness: Freshness::of(&HeaderMap::new(), now, now),
            validators: Default::default(),
            ignores_ranges: false,
        }
    }

    fn open(dir: &Folder, bounds: Bounds) -> SliceStore {
        let parse = |key, meta: &[u8]| {
            let text = std::str::from_utf8(meta).ok()?;
            let (n, len) = text.split_once(' ')?;
            Some(version(n.parse().ok()?, len.parse().ok()?)).filter(|v| v.key == key)
        };
        SliceStore::open(&dir.0, bounds, &Arc::new(Metrics::new()), parse).unwrap().0
    }

    /// Keeps object `n` of `len` bytes with its first slice written.
    fn keep_with_slice(store: &SliceStore, n: usize, len: u64) -> bool {
        let version = Arc::new(version(n, len));
        let key = version.key;
        store.keep(version, format!("{n} {len}").as_bytes()).unwrap();
        let id = SliceId { version: key, index: 0 };
        let Some((file, part)) = store.claim(id, len.min(SLICE)).unwrap() else { return false };
        let bytes = vec![7u8; usize::try_from(len.min(SLICE)).unwrap()];
        file.write_all_at(&bytes, HEADER_LEN).unwrap();
        store.complete(id, &file, &part, bytes.len() as u64, crc32fast::hash(&bytes)).unwrap();
        true
    }

    /// What `du` and `find` count under `dir`: blocks in bytes, and files and folders (`dir`
    /// included).
    fn du(dir: &Path) -> Cost {
        let mut cost = Cost::entry(on_disk(dir));
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                cost.add(du(&path));
            } else {
                cost.add(Cost::entry(on_disk(&path)));
            }
        }
        cost
    }

    #[test]
    fn everything_kept_is_counted_as_du_counts_it() {
        let dir = Folder::new("count");
        let store = open(&dir, Bounds { bytes: 1 << 30, entries: 10_000 });
        assert_eq!(store.used(), du(&dir.0), "an empty cache: its folder and v1/");
        for n in 0..40 {
            assert!(keep_with_slice(&store, n, 100 + n as u64 * 5000));
        }
        // A version's facts written again (a revalidation) and a slice dropped.
        let again = version(3, 100 + 3 * 5000);
        let key = again.key;
        store.keep(Arc::new(again), b"3 15100 and some more facts").unwrap();
        store.remove(SliceId { version: version(5, 0).key, index: 0 });
        let used = store.used();
        assert_eq!(used, du(&dir.0));
        // Folder, meta.json and slice for each: the folders and files are all counted.
        assert!(used.entries >= 2 + 40 * 3 - 1, "{used:?}");
        assert_eq!(store.slices_of(key), [0]);
        // Dropping everything leaves the cache folder and v1/ alone.
        for n in 0..40 {
            store.remove_object(&("up".to_owned(), format!("/o{n}")));
        }
        assert_eq!(store.used(), du(&dir.0));
        assert_eq!(store.used().entries, 2, "no <vv>/ folder is left empty");
    }

    #[test]
    fn eviction_keeps_both_bounds_and_takes_versions_whole() {
        let dir = Folder::new("evict");
        // Few entries, many bytes: the bound on entries is the one met.
        let bounds = Bounds { bytes: 64 << 20, entries: 40 };
        let store = open(&dir, bounds);
        for n in 0..200 {
            assert!(keep_with_slice(&store, n, 1000));
            let used = store.used();
            assert!(used.entries <= bounds.entries && used.bytes <= bounds.bytes, "{used:?}");
            assert_eq!(used, du(&dir.0), "after object {n}");
        }
        // The most recent are kept, whole; the oldest are gone with their folders.
        let recent = store.current(&("up".to_owned(), "/o199".to_owned())).expect("kept");
        assert_eq!(store.slices_of(recent.key), [0]);
        assert!(store.current(&("up".to_owned(), "/o0".to_owned())).is_none());
        assert!(
            !dir.0
                .join(FORMAT_DIR)
                .join(version(0, 0).key.hex().get(..2).unwrap())
                .join(version(0, 0).key.hex())
                .exists()
        );

        // Few bytes, many entries: the bound on bytes is the one met.
        let dir = Folder::new("evict-bytes");
        let bounds = Bounds { bytes: 6 << 20, entries: 10_000 };
        let store = open(&dir, bounds);
        for n in 0..20 {
            assert!(keep_with_slice(&store, n, SLICE));
            let used = store.used();
            assert!(used.bytes <= bounds.bytes, "{used:?}");
            assert_eq!(used, du(&dir.0));
        }
    }

    #[test]
    fn a_version_being_written_is_not_evicted() {
        let dir = Folder::new("pinned");
        let bounds = Bounds { bytes: 64 << 20, entries: 30 };
        let store = open(&dir, bounds);
        let pinned = version(0, 1000);
        let id = SliceId { version: pinned.key, index: 0 };
        store.keep(Arc::new(pinned), b"0 1000").unwrap();
        let (file, part) = store.claim(id, 1000).unwrap().expect("room");
        for n in 1..100 {
            keep_with_slice(&store, n, 1000);
        }
        file.write_all_at(&[1; 1000], HEADER_LEN).unwrap();
        store.complete(id, &file, &part, 1000, crc32fast::hash(&[1; 1000])).unwrap();
        assert!(store.has(id), "its folder stayed while its slice was written");
        assert!(store.used().entries <= bounds.entries);
        assert_eq!(store.used(), du(&dir.0));
    }

    #[test]
    fn a_restart_counts_what_is_there_and_fits_smaller_bounds() {
        let dir = Folder::new("restart");
        {
            let store = open(&dir, Bounds { bytes: 1 << 30, entries: 10_000 });
            for n in 0..50 {
                keep_with_slice(&store, n, 2000);
            }
            // A slice being written when the process stopped.
            let id = SliceId { version: version(7, 0).key, index: 1 };
            let _ = store.claim(id, 10);
        }
        let store = open(&dir, Bounds { bytes: 1 << 30, entries: 10_000 });
        assert_eq!(store.used(), du(&dir.0));
        assert_eq!(store.used().entries, 2 + 50 * 3 + u64::try_from(prefixes(&dir)).unwrap());
        drop(store);
        let bounds = Bounds { bytes: 1 << 30, entries: 60 };
        let store = open(&dir, bounds);
        assert!(store.used().entries <= bounds.entries);
        assert_eq!(store.used(), du(&dir.0));
    }

    fn prefixes(dir: &Folder) -> usize {
        fs::read_dir(dir.0.join(FORMAT_DIR)).unwrap().count()
    }
}
