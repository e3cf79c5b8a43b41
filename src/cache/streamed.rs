//! Keeping an answer that comes without a length (chunked, or ended by the origin's close): its
//! body is staged as it streams — to its client, or read to its end by a task of its own — and
//! becomes a version, sliced, once its end gives the length. Until then nothing of it is
//! visible: the slices of a version are laid out by its length, and a reader meanwhile goes to
//! the origin as before the object was known.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::sync::Arc;

use tracing::Instrument as _;

use super::{Inner, Version, fill};
use crate::routes::origin_client::Exchange;

/// The most of one answer without a length that is staged, as a share of the cache's size: a
/// body past it streams on to its client but is not kept. The staged bytes are not counted
/// against the cache's bounds until they are sliced, so this is what they may overshoot by.
const STAGED_SHARE: u64 = 8;

/// An answer without a length, kept as it streams: fed its body in order ([`Self::push`]),
/// kept at its end ([`Self::finish`]); dropped before it, nothing is kept.
pub(crate) struct StreamedFill {
    inner: Arc<Inner>,
    /// The version it becomes, its length not known yet.
    version: Version,
    /// The object's key among those whose answers may not be cached (a variant's when it
    /// varies), which it leaves once kept.
    object: (String, String),
    /// The body so far, in a file that has no name (see `SliceStore::stage`); `None` once past
    /// the bound or a write failed.
    staged: Option<File>,
    len: u64,
    max_len: u64,
}

impl std::fmt::Debug for StreamedFill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamedFill").field("len", &self.len).finish_non_exhaustive()
    }
}

impl StreamedFill {
    /// The fill of `version` (whose `len` is not known yet), the answer for `object`; `None` when
    /// the cache cannot stage it.
    pub(super) fn new(
        inner: &Arc<Inner>,
        version: Version,
        object: (String, String),
    ) -> Option<Self> {
        let staged = match inner.store.stage() {
            Ok(file) => file,
            Err(e) => {
                inner.write_failed(&e);
                return None;
            }
        };
        let max_len = inner.store.max_bytes() / STAGED_SHARE;
        Some(Self {
            inner: Arc::clone(inner),
            version,
            object,
            staged: Some(staged),
            len: 0,
            max_len,
        })
    }

    /// The body's next bytes.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        let Some(staged) = &self.staged else { return };
        let len = self.len + chunk.len() as u64;
        if len > self.max_len {
            self.staged = None;
            return;
        }
        if let Err(e) = staged.write_all_at(chunk, self.len) {
            self.inner.write_failed(&e);
            self.staged = None;
            return;
        }
        self.len = len;
    }

    /// The body has ended with what was pushed: the version is kept, its slices cut from the
    /// staged bytes by a blocking task (a large body is a long copy).
    pub(crate) fn finish(self) {
        let Self { inner, mut version, object, staged, len, .. } = self;
        let Some(staged) = staged else { return };
        version.len = len;
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            span.in_scope(|| inner.keep_staged(version, &object, &staged));
        });
    }

    /// Reads `exchange`'s body to its end into the fill, for an answer no client reads (its
    /// request asked for what the cache's did not).
    pub(super) fn drain(mut self, mut exchange: Exchange) {
        let drained = async move {
            loop {
                match exchange.session.read_response_body().await {
                    Ok(Some(chunk)) => self.push(&chunk),
                    Ok(None) => break self.finish(),
                    // Cut: not kept.
                    Err(_) => break,
                }
                if self.staged.is_none() {
                    break;
                }
            }
        };
        tokio::spawn(drained.in_current_span());
    }
}

impl Inner {
    /// `version`, its body staged in `staged`, recorded as what `object` is, and each of its slices
    /// written from the staged bytes ([`fill::from_staged`]).
    fn keep_staged(self: &Arc<Self>, version: Version, object: &(String, String), staged: &File) {
        let version = Arc::new(version);
        self.uncacheable.lock().unwrap_or_else(|p| p.into_inner()).remove(object);
        self.note_varies(&version);
        self.keep(Arc::clone(&version));
        fill::from_staged(self, &version, staged);
    }
}
