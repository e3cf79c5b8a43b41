//! A complete slice's bytes as `Bytes` without a copy: the file mapped read-only, so that a
//! reader in user space (HTTP/3, TLS) hands the page cache's own pages on to the one copy its
//! encryption makes, where a read would copy them into a buffer first.
//!
//! Mapping a file is safe only while nobody shortens it: a page past its end would raise
//! SIGBUS. The store never writes a complete slice again — a slice is written under its `.part`
//! name and renamed whole, and deleted by unlink, which leaves a mapping whole (store.rs).

use std::fs::File;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use rustix::mm::{MapFlags, ProtFlags};

use super::store::HEADER_LEN;

/// The `len` bytes of the complete slice `file` holds after its header, mapped and faulted in
/// on a blocking thread (`MAP_POPULATE`), so that reading them later does not wait on the disk
/// on the runtime's threads.
pub(super) async fn slice_bytes(file: Arc<File>, len: u64) -> io::Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    let mapped = tokio::task::spawn_blocking(move || Mapping::of(&file, HEADER_LEN + len))
        .await
        .map_err(io::Error::other)??;
    let header = usize::try_from(HEADER_LEN).map_err(io::Error::other)?;
    Ok(Bytes::from_owner(mapped).slice(header..))
}

/// A read-only mapping of a whole file, unmapped when dropped.
struct Mapping {
    at: *mut std::ffi::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone; its pages may be read from
// any thread.
#[allow(unsafe_code)]
unsafe impl Send for Mapping {}
#[allow(unsafe_code)]
unsafe impl Sync for Mapping {}

impl Mapping {
    #[allow(unsafe_code)]
    fn of(file: &File, len: u64) -> io::Result<Self> {
        // A file shorter than its record (damaged at rest) is an error here, not a SIGBUS later.
        if file.metadata()?.len() < len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let len = usize::try_from(len).map_err(io::Error::other)?;
        // SAFETY: a new mapping (no address asked for) of `len` bytes of a file at least that
        // long, which nobody shortens (see the module's documentation).
        let at = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED | MapFlags::POPULATE,
                file,
                0,
            )
        }?;
        Ok(Self { at, len })
    }
}

impl AsRef<[u8]> for Mapping {
    #[allow(unsafe_code)]
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` readable bytes at `at`, mapped for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.at.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapping {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, unmapped once; no `Bytes` borrows it any more.
        let _ = unsafe { rustix::mm::munmap(self.at, self.len) };
    }
}
