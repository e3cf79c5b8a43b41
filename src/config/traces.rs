//! `[traces]`: OpenTelemetry traces over OTLP/HTTP, off without the section; `[log]`: the format.

use std::collections::BTreeMap;

use ::config::Value;

use super::check::{Ctx, complete, push, read, wrong};
use super::raw::{Raw, RawLog, RawTraces};
use super::source::Path;
use crate::logging::{LogConfig, LogFormat};
use crate::traces::{self, ENDPOINT_EXAMPLE, TracesConfig};

pub(super) fn check(v: &mut Ctx<'_>, at: &Path, raw: &Raw<RawTraces>) -> Option<TracesConfig> {
    let r = v.table(at, raw, &format!("[traces] with endpoint = {ENDPOINT_EXAMPLE}"))?;
    let fix = format!(
        "add endpoint = {ENDPOINT_EXAMPLE} (the collector's OTLP/HTTP URL), or remove [traces]"
    );
    let service = |name: &str| match name.trim() {
        "" => wrong("is empty", "name the service, e.g. \"rangeway\""),
        _ => Ok(name.to_owned()),
    };
    read! { v, at, r;
        endpoint: parsed(ENDPOINT_EXAMPLE, traces::collector).need(v, &at.key("endpoint"), fix);
        sampling: ratio().or(1.0);
        service_name: parsed("\"rangeway\"", service).or("rangeway".to_owned());
        resource: nested(resource).or(BTreeMap::new());
    }
    complete! { TracesConfig { endpoint, sampling, service_name, resource } }
}

fn resource(
    v: &mut Ctx<'_>,
    at: &Path,
    raw: &Raw<BTreeMap<String, Value>>,
) -> Option<BTreeMap<String, String>> {
    let fix = "write resource = { \"deployment.environment\" = \"production\" }";
    let mut attributes = Some(BTreeMap::new());
    for (key, value) in v.shaped(at, raw, "a table of strings", fix)? {
        let value = v.string(&at.key(key), value, "\"production\"").ok();
        attributes = push(attributes, value.map(|value| (key.clone(), value)));
    }
    attributes
}

pub(super) fn check_log(v: &mut Ctx<'_>, at: &Path, raw: &Raw<RawLog>) -> Option<LogConfig> {
    let r = v.table(at, raw, "[log] with format = \"json\"")?;
    let formats = [("text", LogFormat::Text), ("json", LogFormat::Json)];
    let (what, fix) =
        ("a log format", "use \"text\" (key=value lines) or \"json\" (one object per line)");
    read! { v, at, r; format: choice("\"json\"", &formats, what, fix).or(LogFormat::Text); }
    complete! { LogConfig { format } }
}
