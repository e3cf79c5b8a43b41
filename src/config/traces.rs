//! `[traces]`: OpenTelemetry traces exported over OTLP/HTTP, off without the section; and
//! `[log]`: the log's format.

use std::collections::BTreeMap;

use super::check::Ctx;
use super::raw::{Raw, RawLog, RawTraces};
use super::source::Path;

const DEFAULT_SERVICE: &str = "rangeway";
const EXAMPLE: &str = "[traces] with endpoint = \"http://127.0.0.1:4318/v1/traces\"";

/// `[traces]`: where spans go and how many requests make them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TracesConfig {
    /// The collector's OTLP/HTTP traces URL (protobuf bodies), e.g.
    /// `http://127.0.0.1:4318/v1/traces`.
    pub endpoint: String,
    /// The share of requests traced, 0 to 1, when the client sent no `traceparent`; a client's
    /// `traceparent` decides for its own request (its sampled flag). Default 1.
    pub sampling: f64,
    /// `service.name` of every span. Default `rangeway`.
    pub service_name: String,
    /// More resource attributes (`deployment.environment`, `service.instance.id`, ...).
    pub resource: BTreeMap<String, String>,
}

/// `[log]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LogConfig {
    pub format: LogFormat,
}

/// How log lines are written (on stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `key=value` lines for people.
    #[default]
    Text,
    /// One JSON object per line, fields at the top level (docs/operations.md lists them).
    Json,
}

pub(super) fn check(v: &mut Ctx<'_>, raw: Option<&Raw<RawTraces>>) -> Option<Option<TracesConfig>> {
    let Some(raw) = raw else { return Some(None) };
    let at = Path::default().key("traces");
    let r = v.table(&at, raw, EXAMPLE)?;
    let endpoint = match &r.endpoint {
        Some(value) => v.parsed(&at.key("endpoint"), value, "\"http://127.0.0.1:4318/v1/traces\"", |url| match endpoint_problem(url) {
            None => Ok(url.to_owned()),
            Some(problem) => Err((
                problem.to_owned(),
                "give the collector's OTLP/HTTP URL, e.g. \"http://127.0.0.1:4318/v1/traces\"".to_owned(),
            )),
        }).ok(),
        None => v.fail(
            &at.key("endpoint"),
            "is missing",
            "add endpoint = \"http://127.0.0.1:4318/v1/traces\" (the collector's OTLP/HTTP URL), or remove [traces]",
        ),
    };
    let sampling = v.ratio(&at.key("sampling"), &r.sampling, "0.01").or(1.0);
    let service_name = v.parsed(&at.key("service_name"), &r.service_name, "\"rangeway\"", |name| {
        match name.trim() {
            "" => Err(("is empty".to_owned(), "name the service, e.g. \"rangeway\"".to_owned())),
            _ => Ok(name.to_owned()),
        }
    });
    let resource = r.resource.as_ref().map_or(Some(BTreeMap::new()), |raw| {
        let example = "{ \"deployment.environment\" = \"production\" }";
        let entries = v.shaped(
            &at.key("resource"),
            raw,
            "a table of strings",
            &format!("write resource = {example}"),
        )?;
        let attributes: Vec<_> = entries
            .iter()
            .map(|(key, value)| {
                Some((
                    key.clone(),
                    v.string(&at.key("resource").key(key), value, "\"production\"").ok()?,
                ))
            })
            .collect();
        attributes.into_iter().collect()
    });
    Some(Some(TracesConfig {
        endpoint: endpoint?,
        sampling: sampling?,
        service_name: service_name.or_else(|| DEFAULT_SERVICE.to_owned())?,
        resource: resource?,
    }))
}

/// What is wrong with `url` as a collector's address, if anything. Never repeats the URL, which
/// may hold credentials; a URL that does is refused (they would end up in error messages).
fn endpoint_problem(url: &str) -> Option<&'static str> {
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return Some("is not an http:// or https:// URL");
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.contains('@') {
        return Some("holds credentials (user:pass@), which would end up in logs");
    }
    if authority.is_empty() {
        return Some("names no host");
    }
    None
}

pub(super) fn check_log(v: &mut Ctx<'_>, raw: &Raw<RawLog>) -> Option<LogConfig> {
    let at = Path::default().key("log");
    let r = v.table(&at, raw, "[log] with format = \"json\"")?;
    let formats = [("text", LogFormat::Text), ("json", LogFormat::Json)];
    let format = v.choice(&at.key("format"), &r.format, "\"json\"", &formats, |other| {
        (
            format!("{other:?} is not a log format"),
            "use \"text\" (key=value lines) or \"json\" (one object per line)".to_owned(),
        )
    });
    Some(LogConfig { format: format.or(LogFormat::Text)? })
}
