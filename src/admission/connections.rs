//! The places of `max_connections`: every client connection holds one while it is open, and an
//! idle one (between two requests) gives its place up to a new connection when none is free.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::task::AtomicWaker;

/// The client connections open on every listener, and which of them are idle (between two
/// requests), longest idle first.
#[derive(Debug)]
pub(super) struct Connections {
    state: Mutex<ConnectionsState>,
    /// `rangeway_client_connections`.
    gauge: prometheus::IntGauge,
}

#[derive(Debug, Default)]
struct ConnectionsState {
    open: usize,
    /// Idle connections by when they became idle (a sequence number).
    idle: BTreeMap<u64, Arc<Presence>>,
    next_idle: u64,
}

/// What [`Connections::admit`] decided.
pub(super) enum Admitted {
    Free(Place),
    /// The longest idle connection was told to close; the new one has its place.
    InPlaceOfIdle(Place),
    /// `max_connections` are open and none is idle.
    Full,
}

/// What the registry and a connection share: whether it is idle, and its being told to close.
#[derive(Debug, Default)]
pub(super) struct Presence {
    /// Its key in the idle set, 0 when it is not there. Changed under the registry's lock only.
    idle_key: AtomicU64,
    /// Closed to make room: its place went to a new connection.
    evicted: AtomicBool,
    /// Its task, waiting to read its next request.
    pub(super) waker: AtomicWaker,
}

impl Connections {
    pub(super) fn new(gauge: prometheus::IntGauge) -> Self {
        Self { state: Mutex::default(), gauge }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ConnectionsState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn admit(self: &Arc<Self>, max: usize) -> Admitted {
        let mut state = self.lock();
        let place = || Place { connections: Arc::clone(self), presence: Arc::default() };
        if state.open < max {
            state.open += 1;
            self.gauge.set(state.open as i64);
            return Admitted::Free(place());
        }
        let Some((_, idle)) = state.idle.pop_first() else { return Admitted::Full };
        idle.idle_key.store(0, Ordering::Relaxed);
        idle.evicted.store(true, Ordering::Release);
        idle.waker.wake();
        Admitted::InPlaceOfIdle(place())
    }
}

/// A connection's place among all open ones, given back when the connection ends.
#[derive(Debug)]
pub(super) struct Place {
    connections: Arc<Connections>,
    pub(super) presence: Arc<Presence>,
}

impl Place {
    pub(super) fn idle(&self) {
        let mut state = self.connections.lock();
        if self.presence.idle_key.load(Ordering::Relaxed) != 0
            || self.presence.evicted.load(Ordering::Acquire)
        {
            return;
        }
        state.next_idle += 1;
        let key = state.next_idle;
        self.presence.idle_key.store(key, Ordering::Relaxed);
        state.idle.insert(key, Arc::clone(&self.presence));
    }

    pub(super) fn busy(&self) {
        if self.presence.idle_key.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut state = self.connections.lock();
        let key = self.presence.idle_key.swap(0, Ordering::Relaxed);
        state.idle.remove(&key);
    }

    pub(super) fn evicted(&self) -> bool {
        self.presence.evicted.load(Ordering::Acquire)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.connections.lock();
        let key = self.presence.idle_key.swap(0, Ordering::Relaxed);
        if key != 0 {
            state.idle.remove(&key);
        }
        // An evicted connection's place is the new connection's already.
        if !self.presence.evicted.load(Ordering::Acquire) {
            state.open -= 1;
            self.connections.gauge.set(state.open as i64);
        }
    }
}
