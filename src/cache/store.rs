//! The slices on disk and the index of them: where each lives, what it holds, which to evict.
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

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

/// A complete slice in the index.
#[derive(Debug)]
struct Entry {
    len: u64,
    crc: u32,
    /// Checked against its CRC since this process started.
    verified: bool,
    /// When it was last used, in the index's own ticks: the eviction order.
    used: u64,
}

#[derive(Debug, Default)]
struct Index {
    slices: HashMap<SliceId, Entry>,
    /// By last use: what eviction takes first.
    by_use: BTreeMap<u64, SliceId>,
    tick: u64,
    /// Bytes on disk of complete slices (headers included).
    used_bytes: u64,
    /// Bytes promised to slices being written.
    reserved: u64,
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
    root: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
}

/// What the start-up scan found.
#[derive(Debug, Default)]
pub(crate) struct Scanned {
    /// Each version's stored facts, as written.
    pub(crate) metas: Vec<(VersionKey, Vec<u8>)>,
    pub(crate) slices: usize,
    pub(crate) bytes: u64,
    /// Files deleted: slices being written when the process stopped, and damaged ones.
    pub(crate) removed: usize,
}

impl SliceStore {
    /// Opens the cache at `dir`, creating it, and indexes what a previous run left there.
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> io::Result<(Self, Scanned)> {
        let root = dir.join(FORMAT_DIR);
        fs::create_dir_all(&root)?;
        // A probe that the folder can be written, so a read-only one is found here, once.
        let probe = root.join(".probe");
        File::create(&probe)?.write_all(b"ok")?;
        fs::remove_file(&probe)?;
        let store = Self { root, max_bytes, index: Mutex::new(Index::default()) };
        let scanned = store.scan()?;
        Ok((store, scanned))
    }

    fn scan(&self) -> io::Result<Scanned> {
        let mut scanned = Scanned::default();
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        for prefix in fs::read_dir(&self.root)? {
            let prefix = prefix?.path();
            if !prefix.is_dir() {
                continue;
            }
            for version_dir in fs::read_dir(&prefix)? {
                let version_dir = version_dir?.path();
                let key =
                    version_dir.file_name().and_then(|n| n.to_str()).and_then(VersionKey::from_hex);
                let Some(key) = key else {
                    let _ = fs::remove_dir_all(&version_dir);
                    continue;
                };
                let Ok(meta) = fs::read(version_dir.join(META)) else {
                    // Slices without what the origin said of them cannot be served.
                    let _ = fs::remove_dir_all(&version_dir);
                    scanned.removed += 1;
                    continue;
                };
                scanned.metas.push((key, meta));
                for file in fs::read_dir(&version_dir)? {
                    let path = file?.path();
                    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    if name == META {
                        continue;
                    }
                    let slice = name.parse::<u64>().ok().and_then(|i| {
                        let header = read_header(&File::open(&path).ok()?)?;
                        let size = fs::metadata(&path).ok()?.len();
                        (size == HEADER_LEN + header.0).then_some((i, header))
                    });
                    match slice {
                        Some((i, (len, crc))) => {
                            let id = SliceId { version: key, index: i };
                            index.tick += 1;
                            let used = index.tick;
                            index.by_use.insert(used, id);
                            index.slices.insert(id, Entry { len, crc, verified: false, used });
                            index.used_bytes += HEADER_LEN + len;
                            scanned.slices += 1;
                            scanned.bytes += HEADER_LEN + len;
                        }
                        None => {
                            let _ = fs::remove_file(&path);
                            scanned.removed += 1;
                        }
                    }
                }
            }
        }
        Ok(scanned)
    }

    fn version_dir(&self, version: VersionKey) -> PathBuf {
        let hex = version.hex();
        self.root.join(&hex[..2]).join(hex)
    }

    fn slice_path(&self, id: SliceId) -> PathBuf {
        self.version_dir(id.version).join(id.index.to_string())
    }

    /// Writes what the origin said of a version, atomically.
    pub(crate) fn write_meta(&self, version: VersionKey, meta: &[u8]) -> io::Result<()> {
        let dir = self.version_dir(version);
        fs::create_dir_all(&dir)?;
        let part = dir.join(format!("{META}.{PART}"));
        fs::write(&part, meta)?;
        fs::rename(part, dir.join(META))
    }

    /// Whether a slice is complete.
    pub(crate) fn has(&self, id: SliceId) -> bool {
        self.index.lock().unwrap_or_else(|p| p.into_inner()).slices.contains_key(&id)
    }

    /// Opens a complete slice, counting it as used; `None` when it is not (or no longer) there.
    pub(crate) fn open_slice(&self, id: SliceId) -> Option<OpenSlice> {
        let (len, crc, unverified) = {
            let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
            index.tick += 1;
            let tick = index.tick;
            let entry = index.slices.get_mut(&id)?;
            let before = std::mem::replace(&mut entry.used, tick);
            let facts = (entry.len, entry.crc, !entry.verified);
            index.by_use.remove(&before);
            index.by_use.insert(tick, id);
            facts
        };
        match File::open(self.slice_path(id)) {
            Ok(file) => Some(OpenSlice { file, len, crc, unverified }),
            Err(_) => {
                self.forget(id);
                None
            }
        }
    }

    /// Checks a slice's bytes against its CRC; the first check since start is remembered. A
    /// slice that fails is deleted: `false`.
    pub(crate) fn verify(&self, id: SliceId, slice: &OpenSlice) -> bool {
        let good = crc_of(&slice.file, slice.len).is_ok_and(|crc| crc == slice.crc);
        if good {
            let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(entry) = index.slices.get_mut(&id) {
                entry.verified = true;
            }
        } else {
            self.remove(id);
        }
        good
    }

    /// Room for a slice of `len` bytes about to be written: evicts the least recently used
    /// complete slices until it fits, and says how many. `None` when it cannot fit (slices being
    /// written hold the rest).
    pub(crate) fn reserve(&self, len: u64) -> Option<u64> {
        let need = HEADER_LEN + len;
        let mut evicted = Vec::new();
        {
            let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
            while index.used_bytes + index.reserved + need > self.max_bytes {
                let Some((_, id)) = index.by_use.pop_first() else { break };
                if let Some(entry) = index.slices.remove(&id) {
                    index.used_bytes -= HEADER_LEN + entry.len;
                    evicted.push(id);
                }
            }
            let fits = index.used_bytes + index.reserved + need <= self.max_bytes;
            if fits {
                index.reserved += need;
            }
            // Unlinked whether or not it fits: the index no longer has them. A reader holding one
            // open reads on; its space is the kernel's to free.
            for id in &evicted {
                let _ = fs::remove_file(self.slice_path(*id));
            }
            if !fits {
                return None;
            }
        }
        Some(evicted.len() as u64)
    }

    /// Gives back a reservation that was not used.
    pub(crate) fn unreserve(&self, len: u64) {
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        index.reserved = index.reserved.saturating_sub(HEADER_LEN + len);
    }

    /// A new slice file to write, under its `.part` name.
    pub(crate) fn create_part(&self, id: SliceId) -> io::Result<(File, PathBuf)> {
        let dir = self.version_dir(id.version);
        fs::create_dir_all(&dir)?;
        let part = dir.join(format!("{}.{PART}", id.index));
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&part)?;
        // The header's place: written last, once the bytes and their CRC are.
        file.write_all_at(&[0; HEADER_LEN as usize], 0)?;
        Ok((file, part))
    }

    /// Completes a slice written to `part` (`len` bytes after the header, of CRC32 `crc`): its
    /// header, then its final name, then the index. Its reservation becomes its size.
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
        fs::rename(part, self.slice_path(id))?;
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        index.reserved = index.reserved.saturating_sub(HEADER_LEN + len);
        index.tick += 1;
        let used = index.tick;
        index.by_use.insert(used, id);
        if let Some(old) = index.slices.insert(id, Entry { len, crc, verified: true, used }) {
            index.by_use.remove(&old.used);
            index.used_bytes -= HEADER_LEN + old.len;
        }
        index.used_bytes += HEADER_LEN + len;
        Ok(())
    }

    /// Forgets a slice the disk no longer has.
    fn forget(&self, id: SliceId) {
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = index.slices.remove(&id) {
            index.by_use.remove(&entry.used);
            index.used_bytes -= HEADER_LEN + entry.len;
        }
    }

    /// Deletes a slice.
    pub(crate) fn remove(&self, id: SliceId) {
        self.forget(id);
        let _ = fs::remove_file(self.slice_path(id));
    }

    /// Deletes a version: its slices and what the origin said of it.
    pub(crate) fn remove_version(&self, version: VersionKey) {
        {
            let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<SliceId> =
                index.slices.keys().filter(|id| id.version == version).copied().collect();
            for id in ids {
                if let Some(entry) = index.slices.remove(&id) {
                    index.by_use.remove(&entry.used);
                    index.used_bytes -= HEADER_LEN + entry.len;
                }
            }
        }
        let _ = fs::remove_dir_all(self.version_dir(version));
    }

    /// The complete slices of a version, by index.
    pub(crate) fn slices_of(&self, version: VersionKey) -> Vec<u64> {
        let index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        let mut slices: Vec<u64> =
            index.slices.keys().filter(|id| id.version == version).map(|id| id.index).collect();
        slices.sort_unstable();
        slices
    }

    /// Bytes on disk of complete slices.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.index.lock().unwrap_or_else(|p| p.into_inner()).used_bytes
    }
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
