//! The embedded store kept across a restart or an upgrade of rangeway (`[state] snapshot_file`).
//!
//! A process that stops on a signal (SIGTERM, SIGINT, or SIGQUIT handing its sockets to a new
//! process) writes every live record to the file as it ends; the next process reads them in at
//! start and removes the file. Beside it, `{file}.lock` is locked (`flock`) by the process that
//! uses the file, for as long as it lives, and says whether that process is `running` or has
//! `saved`:
//!
//! - the lock free, `running` in it and no snapshot: the previous process died without saving
//!   (killed, crashed, the host down) — an untraced loss ([`Loss::Crashed`]);
//! - the lock held, at a start with `--upgrade`: the process taken over from still serves. Until
//!   it saved and exited, any session not found may be one it holds
//!   ([`Losses::await_predecessor`]); then its records are merged with those written meanwhile;
//! - the lock held otherwise: another instance uses the file, which is a start error.
//!
//! Without a configured id key, the key download ids are derived with is kept in `{file}.key`,
//! so that the ids the records are under still name the same downloads after a restart.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::losses::Loss;
use super::memory::{MemoryStore, SavedEntry};
use super::{StateStore, unix_now};
use crate::values::{Problem, wrong};

/// The format this version writes and reads; a snapshot of another is not read.
const FORMAT: u64 = 1;

/// How often a process started with `--upgrade` looks whether its predecessor is gone.
const PREDECESSOR_POLL: Duration = Duration::from_millis(100);

/// What the lock file says of the process that holds (or held) it.
const RUNNING: &str = "running\n";
const SAVED: &str = "saved\n";

/// The length of a generated id key, in hex digits.
const ID_KEY_HEX_LEN: usize = 64;

/// The embedded store and the file it is kept in across restarts.
#[derive(Debug)]
pub struct SnapshotFile {
    path: PathBuf,
    store: Arc<MemoryStore>,
    /// The lock file, locked, once this process has taken the file over; `None` before that and
    /// after the snapshot is saved.
    lock: Mutex<Option<File>>,
}

/// Why the snapshot file cannot be used. None of the messages holds a key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error("state.snapshot_file: cannot use {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "state.snapshot_file: {path} is in use by another running rangeway — give each instance \
         a snapshot_file of its own, or start this one with --upgrade to take over from it"
    )]
    InUse { path: PathBuf },
    #[error(
        "state.snapshot_file: {path} does not hold a key of {ID_KEY_HEX_LEN} hex digits — remove \
         it (downloads under way then begin again), or configure id_key_file"
    )]
    BadKey { path: PathBuf },
}

/// The first line of a snapshot; one [`SavedEntry`] a line follows.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    v: u64,
    /// Unix seconds.
    saved_at: u64,
    /// The saving store's losses ([`super::Losses::saved`]).
    untraced_at: u64,
    evicted_at: u64,
}

impl SnapshotFile {
    /// A `snapshot_file`: a file's name (its folder is created when missing); `example` is how
    /// the key is written.
    pub(crate) fn path(file: &str, example: &str) -> Result<PathBuf, Problem> {
        if file.is_empty() || file.ends_with('/') {
            let fix = format!(
                "name a file in a folder rangeway may write, e.g. snapshot_file = {example}"
            );
            return wrong("does not name a file", fix);
        }
        Ok(PathBuf::from(file))
    }

    /// Takes over `path` for `store`, restoring what the previous process saved there. With
    /// `upgrade` and the previous process still running, that happens once it exited (see the
    /// module's documentation), in a thread of its own.
    pub fn open(
        store: Arc<MemoryStore>,
        path: &Path,
        upgrade: bool,
    ) -> Result<Arc<Self>, SnapshotError> {
        if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(folder).map_err(io_error(folder))?;
        }
        let lock_path = sibling(path, "lock");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        let kept = Arc::new(Self { path: path.to_owned(), store, lock: Mutex::new(None) });
        if try_lock(&lock).map_err(io_error(&lock_path))? {
            kept.take_over(lock).map_err(io_error(path))?;
            return Ok(kept);
        }
        if !upgrade {
            return Err(SnapshotError::InUse { path: path.to_owned() });
        }
        kept.store.losses().await_predecessor();
        let waiting = Arc::clone(&kept);
        std::thread::Builder::new()
            .name("rangeway-snapshot".into())
            .spawn(move || waiting.wait_for_predecessor(lock))
            .map_err(io_error(path))?;
        Ok(kept)
    }

    /// Writes every live record to the file, and lets the next process have it. Once: a second
    /// call, or one before this process took the file over, writes nothing.
    pub fn save(&self) -> Result<usize, SnapshotError> {
        let mut held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(lock) = held.as_mut() else { return Ok(0) };
        let entries = self.store.saved_entries();
        let (untraced_at, evicted_at) = self.store.losses().saved();
        let header = Header { v: FORMAT, saved_at: unix_now(), untraced_at, evicted_at };
        let partial = sibling(&self.path, "tmp");
        write_snapshot(&partial, &header, &entries).map_err(io_error(&partial))?;
        std::fs::rename(&partial, &self.path).map_err(io_error(&self.path))?;
        set_state(lock, SAVED).map_err(io_error(&self.path))?;
        // Unlocked as it closes: a successor waiting for it takes over now.
        *held = None;
        info!(path = %self.path.display(), records = entries.len(), "saved the embedded store's records");
        Ok(entries.len())
    }

    /// The key download ids are derived with, kept beside the snapshot: read, or made and
    /// written (readable by this user only) by the first process to use the file.
    pub fn id_key(path: &Path) -> Result<Vec<u8>, SnapshotError> {
        let key_path = sibling(path, "key");
        let bad = || SnapshotError::BadKey { path: key_path.clone() };
        let created = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&key_path);
        match created {
            Ok(mut file) => {
                let mut random = [0u8; ID_KEY_HEX_LEN / 2];
                getrandom::fill(&mut random)
                    .map_err(|e| io_error(&key_path)(io::Error::other(e.to_string())))?;
                let key: String = random.iter().map(|b| format!("{b:02x}")).collect();
                file.write_all(key.as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(io_error(&key_path))?;
                Ok(key.into_bytes())
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let mut key = Vec::new();
                File::open(&key_path)
                    .and_then(|f| f.take(ID_KEY_HEX_LEN as u64 + 1).read_to_end(&mut key))
                    .map_err(io_error(&key_path))?;
                (key.len() == ID_KEY_HEX_LEN && key.iter().all(u8::is_ascii_hexdigit))
                    .then_some(key)
                    .ok_or_else(bad)
            }
            Err(e) => Err(io_error(&key_path)(e)),
        }
    }

    /// Restores what the previous process saved, or notes that it saved nothing though it ran;
    /// then marks the file as this process's.
    fn take_over(&self, mut lock: File) -> io::Result<()> {
        let mut state = String::new();
        (&lock).take(64).read_to_string(&mut state).unwrap_or_default();
        let losses = self.store.losses();
        match self.restore() {
            Ok(Some(restored)) => {
                info!(path = %self.path.display(), records = restored, "restored the embedded store's records");
            }
            Ok(None) if state == RUNNING => losses.untraced(Loss::Crashed, unix_now()),
            Ok(None) => {}
            Err(problem) => {
                warn!(path = %self.path.display(), %problem, "the snapshot cannot be read whole: what it held may be lost");
                losses.untraced(Loss::Crashed, unix_now());
            }
        }
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        set_state(&mut lock, RUNNING)?;
        *self.lock.lock().unwrap_or_else(PoisonError::into_inner) = Some(lock);
        Ok(())
    }

    /// Reads the snapshot into the store: how many records it restored, `None` without a file.
    fn restore(&self) -> Result<Option<usize>, String> {
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let mut lines = BufReader::new(file).lines();
        let header = lines.next().ok_or("it is empty")?.map_err(|e| e.to_string())?;
        let header: Header = serde_json::from_str(&header).map_err(|e| e.to_string())?;
        if header.v != FORMAT {
            return Err(format!("format {} is not this version's ({FORMAT})", header.v));
        }
        self.store.losses().carry_over((header.untraced_at, header.evicted_at));
        let mut restored = 0;
        let mut batch = Vec::with_capacity(RESTORE_BATCH);
        for line in lines {
            let line = line.map_err(|e| e.to_string())?;
            batch.push(serde_json::from_str::<SavedEntry>(&line).map_err(|e| e.to_string())?);
            if batch.len() == RESTORE_BATCH {
                restored += self.store.restore(batch.drain(..));
            }
        }
        restored += self.store.restore(batch);
        Ok(Some(restored))
    }

    fn wait_for_predecessor(&self, lock: File) {
        loop {
            match try_lock(&lock) {
                Ok(true) => break,
                Ok(false) => std::thread::sleep(PREDECESSOR_POLL),
                Err(e) => {
                    warn!(path = %self.path.display(), error = %e, "cannot wait for the process taken over from: what it holds may be lost");
                    self.store.losses().untraced(Loss::Crashed, unix_now());
                    self.store.losses().predecessor_done();
                    return;
                }
            }
        }
        if let Err(e) = self.take_over(lock) {
            warn!(path = %self.path.display(), error = %e, "cannot take the snapshot file over: this process's records will not be kept");
        }
        self.store.losses().predecessor_done();
    }
}

/// Records restored under one hold of the store's lock.
const RESTORE_BATCH: usize = 1024;

fn write_snapshot(path: &Path, header: &Header, entries: &[SavedEntry]) -> io::Result<()> {
    let file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    let mut out = BufWriter::new(file);
    serde_json::to_writer(&mut out, header)?;
    out.write_all(b"\n")?;
    for entry in entries {
        serde_json::to_writer(&mut out, entry)?;
        out.write_all(b"\n")?;
    }
    out.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()
}

fn set_state(lock: &mut File, state: &str) -> io::Result<()> {
    lock.set_len(0)?;
    lock.rewind()?;
    lock.write_all(state.as_bytes())?;
    lock.sync_data()
}

/// Whether this process now holds the lock on `file`; `false` while another one does.
fn try_lock(file: &File) -> io::Result<bool> {
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `{path}.{suffix}`.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

fn io_error(path: &Path) -> impl Fn(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io { path: path.to_owned(), source }
}
