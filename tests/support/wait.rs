//! Waiting for something to happen rather than for time to pass: a test polls the thing itself
//! (a metric, the admin API, a log line, the origin's recorded requests) until it shows what the
//! test waits for, and fails naming it when a deadline passes first.
//!
//! A sleep is right only where the delay is the point: a fault injected or traffic shaped on
//! purpose (a client dribbling bytes, one that stops reading), or a pause whose length is tested.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

/// Long enough for anything a test waits for on a loaded machine; a test that needs it all has
/// failed.
pub(crate) const WITHIN: Duration = Duration::from_secs(5);

/// How often a condition is checked.
const POLL: Duration = Duration::from_millis(20);

/// Checks `check` every 20 ms until it gives `Some`, and returns what it gave; panics saying the
/// test waited in vain for `what` once `within` has passed.
pub(crate) fn until<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "waited {within:?} in vain for {what}");
        thread::sleep(POLL);
    }
}

/// The text of the log file `log` once `done` holds for it; panics after `within` showing the log
/// and naming `what` the test waited for.
pub(crate) fn log_until(
    log: &Path,
    what: &str,
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        // The file is created before the process starts: a failed read is a failed test.
        let text = std::fs::read_to_string(log)
            .unwrap_or_else(|e| panic!("cannot read the log {}: {e}", log.display()));
        if done(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "waited {within:?} in vain for {what} in the log:\n{text}"
        );
        thread::sleep(POLL);
    }
}

/// The text of the log file `log` once it holds `needle`, within [`WITHIN`].
pub(crate) fn log_line(log: &Path, needle: &str) -> String {
    log_until(log, &format!("{needle:?}"), WITHIN, |text| text.contains(needle))
}
