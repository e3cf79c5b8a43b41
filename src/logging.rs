//! The process's log: tracing's formatter on stderr — text or JSON lines (`[log] format`) —
//! filtered by `RUST_LOG` (default `info`), with the `log` records of pingora and other crates
//! bridged into it; and, with traces on, the bridge that makes rangeway's trace spans
//! OpenTelemetry's (see `traces`).

use std::io::IsTerminal;

use tracing::{Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Layer, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;

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
    tracing_subscriber::registry().with(lines.with_filter(logged)).with(bridge)
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::filter::LevelFilter;

    use super::*;

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
}
