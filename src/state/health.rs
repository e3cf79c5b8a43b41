//! Whether a store answers, and how often it did not.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use tracing::{info, warn};

use super::StoreError;

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// The health of one store, shared by every request that uses it.
///
/// It logs transitions, not requests: one `warn!` when the store stops answering, one `info!` when
/// it answers again, however many requests saw either. Its counters are for `/metrics`.
#[derive(Debug)]
pub struct StoreHealth {
    /// What the log lines name: the backend and where it is, without credentials.
    name: String,
    state: AtomicU8,
    errors: AtomicU64,
    unreadable: AtomicU64,
}

impl StoreHealth {
    /// A store not yet heard from: down until its first answer.
    pub(crate) fn unknown(name: String) -> Self {
        Self::with_state(name, UNKNOWN)
    }

    /// A store that cannot fail (the embedded one).
    pub(crate) fn always_up(name: String) -> Self {
        Self::with_state(name, UP)
    }

    fn with_state(name: String, state: u8) -> Self {
        Self {
            name,
            state: AtomicU8::new(state),
            errors: AtomicU64::new(0),
            unreadable: AtomicU64::new(0),
        }
    }

    /// Whether the store answered its last operation.
    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Relaxed) == UP
    }

    /// Operations that failed, of every kind.
    pub fn errors_total(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Stored values that could not be read (garbage, or not a record at all) and were taken as
    /// absent. Values of another format version are not counted: they are expected during a
    /// rolling upgrade.
    pub fn unreadable_total(&self) -> u64 {
        self.unreadable.load(Ordering::Relaxed)
    }

    /// What the log lines call the store.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn answered(&self) {
        // `swap` makes exactly one of many concurrent requests see the transition and log it.
        if self.state.swap(UP, Ordering::Relaxed) != UP {
            info!(store = %self.name, "state store is up");
        }
    }

    pub(crate) fn failed(&self, error: &StoreError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if error.is_outage() && self.state.swap(DOWN, Ordering::Relaxed) != DOWN {
            warn!(
                store = %self.name,
                kind = error.kind(),
                %error,
                "state store is down: requests are served without resume state until it is back"
            );
        }
    }

    pub(crate) fn unreadable(&self) {
        self.unreadable.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn transitions_and_counters() {
        let health = StoreHealth::unknown("test".to_owned());
        assert!(!health.is_up());
        health.answered();
        assert!(health.is_up());
        health.failed(&StoreError::Rejected("too big"));
        assert!(health.is_up(), "a refused input is no outage");
        health.failed(&StoreError::Timeout(Duration::from_millis(1)));
        health.failed(&StoreError::Unavailable("refused".to_owned()));
        assert!(!health.is_up());
        assert_eq!(health.errors_total(), 3);
        health.answered();
        assert!(health.is_up());
        health.unreadable();
        assert_eq!(health.unreadable_total(), 1);
    }
}
