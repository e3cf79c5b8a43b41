//! Temporary directories that clean up after themselves.

use std::io;
use std::path::{Path, PathBuf};
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh directory under [`std::env::temp_dir`], removed with everything in it on drop.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a new, empty directory whose name starts with `rangeway-<prefix>-`.
    ///
    /// Panics if no directory can be created: a test cannot run without one.
    pub(crate) fn new(prefix: &str) -> TempDir {
        // Tests in one binary run on parallel threads and several test binaries may run at once,
        // so the name combines the process id, a per-process counter and the clock.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        loop {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.subsec_nanos());
            let name = format!(
                "rangeway-{prefix}-{}-{}-{nanos:x}",
                process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let path = base.join(name);
            // `create_dir` (not `create_dir_all`) fails on an existing path, so a directory left
            // behind by an earlier run with a recycled pid is never shared: try another name.
            match std::fs::create_dir(&path) {
                Ok(()) => return TempDir { path },
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => {
                    panic!("cannot create a temporary directory at {}: {err}", path.display())
                }
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `relative` inside this directory.
    pub(crate) fn join(&self, relative: impl AsRef<Path>) -> PathBuf {
        self.path.join(relative)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Drop cannot report errors, and a leftover directory must not fail a test that passed.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
