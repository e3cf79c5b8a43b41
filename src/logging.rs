//! The process's log: tracing's formatter on stderr — text or JSON lines (`[log] format`) —
//! filtered by `RUST_LOG` (default `info`), with the `log` records of pingora and other crates
//! bridged into it; and, with traces on, the bridge that makes rangeway's trace spans
//! OpenTelemetry's (see `traces`).

use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FilterExt as _, LevelFilter, Targets};
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::admission::HEADER_TIMED_OUT;
use crate::traces;

/// `[log]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LogConfig {
    pub format: LogFormat,
}

/// How log lines are written (on stderr): `key=value` text, or a JSON object per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the log for the process, in `format`, with the traces bridge when there is a
/// `tracer`; a second call changes nothing.
pub fn init(format: LogFormat, tracer: Option<opentelemetry_sdk::trace::Tracer>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = subscriber(filter, format, tracer).try_init();
}

/// The log's subscriber: lines as `filter` keeps them, in `format`, and the traces bridge.
fn subscriber(
    mut logged: EnvFilter,
    format: LogFormat,
    tracer: Option<opentelemetry_sdk::trace::Tracer>,
) -> impl Subscriber + Send + Sync {
    // The trace spans are the bridge's alone: the log's lines are what they were without them.
    if let Ok(off) = format!("{}=off", traces::TARGET).parse() {
        logged = logged.add_directive(off);
    }
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Text => lines.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => {
            lines.json().flatten_event(true).with_current_span(false).with_span_list(false).boxed()
        }
    };
    // The trace spans whatever the log's level: they are made only for requests chosen to be.
    let bridge = tracer.map(|tracer| {
        let spans = Targets::new().with_target(traces::TARGET, Level::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // What a span is, not where in rangeway's source it was made.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(spans)
    });
    tracing_subscriber::registry()
        .with(lines.with_filter(logged.and(SlowClientsUnlogged)))
        .with(bridge)
}

/// Drops pingora's ERROR line for a connection cut because its request header was too slow (see
/// `admission`): one per connection, so its volume would be in the hands of whoever opens slow
/// connections. They are counted instead, and logged by rangeway at debug.
pub struct SlowClientsUnlogged;

impl<S: Subscriber> Filter<S> for SlowClientsUnlogged {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    // No level of its own: the log's stays its `EnvFilter`'s (`And` keeps the lower of the two),
    // so `log` records above it are refused before they are made.
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
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

    /// The log's level is the most any layer wants: `log` records above it (pingora's debug
    /// lines) are refused by the `log` crate before they are made.
    #[test]
    fn the_log_s_level_is_its_filter_s_with_traces_on_or_off() {
        use tracing::subscriber::Subscriber as _;
        for format in [LogFormat::Text, LogFormat::Json] {
            let off = subscriber(EnvFilter::new("info"), format, None);
            assert_eq!(off.max_level_hint(), Some(LevelFilter::INFO));
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
            let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "test");
            let on = subscriber(EnvFilter::new("warn"), format, Some(tracer));
            assert_eq!(on.max_level_hint(), Some(LevelFilter::INFO), "the trace spans are INFO");
        }
    }

    #[test]
    fn only_pingoras_error_for_a_slow_header_is_dropped() {
        let seen = Seen::default();
        let subscriber = Registry::default().with(seen.clone().with_filter(SlowClientsUnlogged));
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
