//! `[traces]`: OpenTelemetry traces exported over OTLP/HTTP, off without the section; and
//! `[log]`: the log's format.

use std::collections::BTreeMap;

use super::read::{Ctx, Read, Table};
use super::tree::{Kind, Node};

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

pub(super) fn read(ctx: &mut Ctx<'_>, node: Option<Node>) -> Read<Option<TracesConfig>> {
    let Some(node) = node else { return Ok(None) };
    let mut table = Table::new(ctx, "traces", "[traces]", node, EXAMPLE)?;
    let endpoint = match table.take("endpoint") {
        Some(field) => {
            let (path, origin) = (field.path.clone(), field.origin().clone());
            let url = field.string(ctx, "\"http://127.0.0.1:4318/v1/traces\"")?;
            match endpoint_problem(&url) {
                None => Ok(url),
                Some(problem) => Err(ctx.report(
                    &path,
                    &origin,
                    problem,
                    "give the collector's OTLP/HTTP URL, e.g. \"http://127.0.0.1:4318/v1/traces\"",
                )),
            }
        }
        None => Err(ctx.report_at(
            "traces.endpoint",
            "is missing",
            "add endpoint = \"http://127.0.0.1:4318/v1/traces\" (the collector's OTLP/HTTP URL), or remove [traces]",
        )),
    };
    let sampling = table.take("sampling").map_or(Ok(1.0), |f| f.ratio(ctx, "0.01"));
    let service_name = table.take("service_name").map_or(Ok(DEFAULT_SERVICE.to_owned()), |f| {
        let (path, origin) = (f.path.clone(), f.origin().clone());
        let name = f.string(ctx, "\"rangeway\"")?;
        match name.trim().is_empty() {
            false => Ok(name),
            true => {
                Err(ctx.report(&path, &origin, "is empty", "name the service, e.g. \"rangeway\""))
            }
        }
    });
    let resource = table.take("resource").map_or(Ok(BTreeMap::new()), |field| {
        let (path, origin) = (field.path.clone(), field.origin().clone());
        let fix = "write resource = { \"deployment.environment\" = \"production\" }";
        let Kind::Table(entries) = field.node.kind else {
            return Err(ctx.report(&path, &origin, "expected a table of strings", fix));
        };
        let mut attributes = BTreeMap::new();
        let mut bad = None;
        for (key, value) in entries {
            match value.kind {
                Kind::Str(text) => {
                    attributes.insert(key, text);
                }
                _ => {
                    let at = format!("{path}.{key}");
                    bad = Some(ctx.report(&at, &value.origin, "expected a string", fix));
                }
            }
        }
        bad.map_or(Ok(attributes), Err)
    });
    table.finish(ctx);
    Ok(Some(TracesConfig {
        endpoint: endpoint?,
        sampling: sampling?,
        service_name: service_name?,
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

pub(super) fn read_log(ctx: &mut Ctx<'_>, node: Option<Node>) -> Read<LogConfig> {
    let Some(node) = node else { return Ok(LogConfig::default()) };
    let mut table = Table::new(ctx, "log", "[log]", node, "[log] with format = \"json\"")?;
    let format = table.take("format").map_or(Ok(LogFormat::Text), |f| {
        let (path, origin) = (f.path.clone(), f.origin().clone());
        match f.string(ctx, "\"json\"")?.as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(ctx.report(
                &path,
                &origin,
                format!("{other:?} is not a log format"),
                "use \"text\" (key=value lines) or \"json\" (one object per line)",
            )),
        }
    });
    table.finish(ctx);
    Ok(LogConfig { format: format? })
}
