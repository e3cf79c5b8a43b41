//! The process's log: tracing's formatter on stderr, filtered by `RUST_LOG` (default `info`), with
//! the `log` records of pingora and other crates bridged into it.

use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::admission::HEADER_TIMED_OUT;

/// Installs the log for the process; a second call changes nothing.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let format = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = tracing_subscriber::registry()
        .with(SlowClientsUnlogged)
        .with(filter)
        .with(format)
        .try_init();
}

/// Drops pingora's ERROR line for a connection cut because its request header was too slow (see
/// `admission`): one per connection, so its volume would be in the hands of whoever opens slow
/// connections. They are counted instead, and logged by rangeway at debug.
pub struct SlowClientsUnlogged;

impl<S: Subscriber> Layer<S> for SlowClientsUnlogged {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        // pingora's line comes through the `log` bridge, whose events carry its target in a
        // field rather than in the metadata: the message alone tells them, as rangeway itself
        // never logs it at ERROR.
        if *event.metadata().level() != Level::ERROR {
            return true;
        }
        let mut message = MessageMentions { needle: HEADER_TIMED_OUT, found: false };
        event.record(&mut message);
        !message.found
    }
}

/// Whether an event's message mentions `needle`.
struct MessageMentions {
    needle: &'static str,
    found: bool,
}

impl Visit for MessageMentions {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.found |= format!("{value:?}").contains(self.needle);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.found |= value.contains(self.needle);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::Registry;

    use super::*;

    /// Keeps the messages of the events it sees.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            struct Message(String);
            impl Visit for Message {
                fn record_debug(&mut self, _: &Field, value: &dyn fmt::Debug) {
                    self.0.push_str(&format!("{value:?}"));
                }
            }
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push(message.0);
        }
    }

    #[test]
    fn only_pingoras_error_for_a_slow_header_is_dropped() {
        let seen = Seen::default();
        let subscriber = Registry::default().with(SlowClientsUnlogged).with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            let slow = format!("Downstream ReadError cause: {HEADER_TIMED_OUT} (10s)");
            tracing::error!(target: "pingora_proxy", "Fail to proxy: {slow}");
            tracing::error!(target: "pingora_proxy", "Fail to proxy: Downstream ReadError");
            tracing::warn!(target: "pingora_proxy", "{slow}");
            tracing::error!(target: "rangeway", "something else went wrong");
        });
        let seen = seen.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen.iter().all(|m| !m.starts_with("Fail to proxy: Downstream ReadError cause")));
    }
}
