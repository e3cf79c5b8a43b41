//! Responses in flight, so the admin API (and the live page) show a download moving within one
//! long response, not only when it ends and is recorded in the store.
//!
//! Each instance knows its own responses only: on many instances, a download shows the stored
//! state plus what the instance asked is sending now.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rangeway_middleware::ByteRange;

use crate::state::{Delivery, DownloadSession};

/// The responses in flight on this instance that deliver bytes to a download.
#[derive(Debug, Default)]
pub struct LiveResponses {
    entries: Mutex<BTreeMap<u64, Arc<LiveResponse>>>,
    next: AtomicU64,
}

/// One response in flight: what it delivers to which download, from which byte, and how many
/// bytes it has sent so far.
///
/// Bytes count as sent once the client's connection took them: a body is written into the
/// client's socket ahead of the client, as far as the kernel's buffers go (megabytes on a fast
/// path), and the writes then stop until a client reading slower than the origin sends has made
/// room. Counted when written, a slow client's download leapt ahead and then stood still for
/// seconds at a time, and the live page's rate (the bytes between two polls) read 0 B/s. So what
/// the socket still holds (its send queue: neither acknowledged nor sent) is taken off, and the
/// count moves as the client reads.
#[derive(Debug)]
pub struct LiveResponse {
    /// The delivery as it will be recorded, but for its range, bytes and time.
    delivery: Delivery,
    /// Body bytes written to the client's connection.
    sent: AtomicU64,
    /// A duplicate of the client's socket when the response has it to itself (HTTP/1), for what
    /// is still queued in it.
    client: Option<Arc<OwnedFd>>,
}

/// A response's place in [`LiveResponses`]; leaves it when dropped (the response ended).
#[derive(Debug)]
pub struct LiveGuard {
    registry: Arc<LiveResponses>,
    key: u64,
    entry: Arc<LiveResponse>,
}

impl LiveResponses {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a response that makes `delivery` (whose range starts where the response does, and whose
    /// time is when it began), written to `client` (a duplicate of the client's socket, when the
    /// response has the connection to itself).
    pub fn register(
        self: &Arc<Self>,
        delivery: Delivery,
        client: Option<Arc<OwnedFd>>,
    ) -> LiveGuard {
        let entry = Arc::new(LiveResponse { delivery, sent: AtomicU64::new(0), client });
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key, Arc::clone(&entry));
        LiveGuard { registry: Arc::clone(self), key, entry }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<LiveResponse>>> {
        // Nothing panics under the lock; a poisoned map is still a correct map.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn snapshot(&self) -> Vec<Arc<LiveResponse>> {
        self.lock().values().cloned().collect()
    }

    /// `stored` (the store's session of download `id` for `object`, if any) with what this
    /// instance's responses for it have sent so far, merged by the store's own rule; `None` when
    /// neither knows the download.
    pub fn merged(
        &self,
        id: &str,
        object: &str,
        stored: Option<DownloadSession>,
        now: u64,
    ) -> Option<DownloadSession> {
        let lives: Vec<Arc<LiveResponse>> = self
            .snapshot()
            .into_iter()
            .filter(|live| live.delivery.id == id && live.delivery.object == object)
            .collect();
        let recorded = stored.is_some();
        let mut session = lives
            .iter()
            .filter_map(|live| live.delivery(now))
            .fold(stored, |session, delivery| Some(DownloadSession::record(session, &delivery)))?;
        if !recorded {
            // Begun by a response still in flight: when that response began, not now.
            let began = lives.iter().map(|live| live.delivery.now).min();
            session.started_at = began.unwrap_or(session.started_at);
        }
        Some(session)
    }

    /// The sessions of download `id`, those stored (`stored`) and those of responses in flight
    /// alone, with what the responses in flight sent so far; the most recently updated first.
    pub fn merged_all(
        &self,
        id: &str,
        stored: Vec<DownloadSession>,
        now: u64,
    ) -> Vec<DownloadSession> {
        let mut objects: Vec<String> = stored.iter().map(|s| s.object.clone()).collect();
        for live in self.snapshot() {
            if live.delivery.id == id && !objects.contains(&live.delivery.object) {
                objects.push(live.delivery.object.clone());
            }
        }
        let mut stored = stored;
        let mut sessions: Vec<DownloadSession> = objects
            .iter()
            .filter_map(|object| {
                let found =
                    stored.iter().position(|s| &s.object == object).map(|i| stored.remove(i));
                self.merged(id, object, found, now)
            })
            .collect();
        sessions.sort_by_key(|s| std::cmp::Reverse(s.updated_at));
        sessions
    }

    /// The downloads with a response in flight that are not in `listed`, newest first, as
    /// sessions of what those responses sent so far.
    pub fn unlisted(&self, listed: &[DownloadSession], now: u64) -> Vec<DownloadSession> {
        let mut keys: Vec<(String, String)> = Vec::new();
        for live in self.snapshot().iter().rev() {
            let (id, object) = (&live.delivery.id, &live.delivery.object);
            let known = |(i, o): &(String, String)| i == id && o == object;
            if !listed.iter().any(|s| &s.id == id && &s.object == object) && !keys.iter().any(known)
            {
                keys.push((id.clone(), object.clone()));
            }
        }
        keys.iter().filter_map(|(id, object)| self.merged(id, object, None, now)).collect()
    }
}

impl LiveResponse {
    /// What the response has delivered so far, as the store would record it at its end.
    fn delivery(&self, now: u64) -> Option<Delivery> {
        let sent = self.taken();
        let range =
            ByteRange::from_len(self.delivery.range.start(), sent).filter(|r| !r.is_empty())?;
        Some(Delivery { range, bytes: sent, now, ..self.delivery.clone() })
    }
}

impl LiveResponse {
    /// The body bytes the client's connection took: those written, less what its socket still
    /// queues (which may include a little of the header, or TLS's framing: never below 0).
    fn taken(&self) -> u64 {
        let written = self.sent.load(Ordering::Relaxed);
        let queued = self.client.as_ref().and_then(|fd| unsent(fd).ok()).unwrap_or(0);
        written.saturating_sub(queued)
    }
}

/// The bytes a TCP socket's send queue holds: written, not yet acknowledged by the peer
/// (`SIOCOUTQ`, tcp(7)).
#[allow(unsafe_code)]
fn unsent(fd: &OwnedFd) -> rustix::io::Result<u64> {
    /// `SIOCOUTQ`, the same number as `TIOCOUTQ` (asm-generic/ioctls.h).
    const SIOCOUTQ: rustix::ioctl::Opcode = 0x5411;
    // SAFETY: SIOCOUTQ writes one `int` through its argument, which the getter provides.
    let queued = unsafe {
        rustix::ioctl::ioctl(fd.as_fd(), rustix::ioctl::Getter::<SIOCOUTQ, std::ffi::c_int>::new())
    }?;
    Ok(u64::try_from(queued).unwrap_or(0))
}

impl LiveGuard {
    /// Counts `len` more body bytes sent.
    pub fn sent(&self, len: usize) {
        self.entry.sent.fetch_add(len as u64, Ordering::Relaxed);
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Ending, ObjectVersion};

    fn delivery(id: &str, start: u64) -> Delivery {
        let version = version(100);
        Delivery {
            id: id.to_owned(),
            object: "r|/o".to_owned(),
            route: "r".to_owned(),
            client: "c".to_owned(),
            origin_version: version.clone(),
            version,
            range: ByteRange::new(start, start).expect("empty"),
            ending: Ending::Cut,
            bytes: 0,
            now: 0,
        }
    }

    fn version(size: u64) -> ObjectVersion {
        ObjectVersion {
            etag: Some("\"v\"".to_owned()),
            strong: true,
            size,
            last_modified: None,
            content_type: None,
        }
    }

    #[test]
    fn responses_in_flight_add_to_the_stored_session_until_they_end() {
        let live = Arc::new(LiveResponses::new());
        let guard = live.register(delivery("d", 40), None);
        assert_eq!(live.merged("d", "r|/o", None, 1), None, "nothing sent yet");
        guard.sent(10);
        let session = live.merged("d", "r|/o", None, 7).expect("in flight");
        assert_eq!(session.latest().map(|s| s.sent.total()), Some(10));
        assert_eq!((session.started_at, session.updated_at), (0, 7));
        assert!(!session.is_complete());
        assert_eq!(live.merged_all("d", Vec::new(), 7), [session]);
        assert_eq!(live.merged("d", "r|/other", None, 7), None);
        let listed = live.unlisted(&[], 1);
        assert_eq!(listed.len(), 1);
        assert!(live.unlisted(&listed, 1).is_empty());

        let other = live.register(delivery("e", 0), None);
        other.sent(100);
        assert!(live.merged("e", "r|/o", None, 1).expect("in flight").is_complete());
        drop(guard);
        assert_eq!(live.merged("d", "r|/o", None, 1), None, "gone when the response ends");
        assert_eq!(live.unlisted(&[], 1).len(), 1);
    }
}
