//! The spans' way out: OpenTelemetry's SDK batching them on a thread of its own, its OTLP/HTTP
//! exporter encoding them (protobuf), and rangeway-get's HTTP client sending them — the same
//! connections `rangeway get` makes (TLS with the system's roots, proxies from the environment),
//! rather than a second HTTP stack in the binary.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Tracer};
use rangeway_get::Poster;

use crate::values::{Problem, wrong};

/// `[traces]`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TracesConfig {
    /// The collector's OTLP/HTTP traces URL (protobuf bodies).
    pub endpoint: String,
    /// The share of requests traced when the client sent no `traceparent`.
    pub sampling: f64,
    pub service_name: String,
    /// More resource attributes (`deployment.environment`, ...).
    pub resource: BTreeMap<String, String>,
}

/// How a collector's URL is written, in examples.
pub(crate) const ENDPOINT_EXAMPLE: &str = "\"http://127.0.0.1:4318/v1/traces\"";

/// A collector's OTLP/HTTP URL. No problem repeats it; one with credentials is refused, as they
/// would end up in error messages.
pub(crate) fn collector(url: &str) -> Result<String, Problem> {
    let fix = format!("give the collector's OTLP/HTTP URL, e.g. {ENDPOINT_EXAMPLE}");
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return wrong("is not an http:// or https:// URL", fix);
    };
    match rest.split('/').next().unwrap_or("") {
        authority if authority.contains('@') => {
            wrong("holds credentials (user:pass@), which would end up in logs", fix)
        }
        "" => wrong("names no host", fix),
        _ => Ok(url.to_owned()),
    }
}

/// How long one export may take, connecting included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why traces cannot be exported. Names no credential (the endpoint may hold none: see config).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    #[error("traces: the HTTP client cannot be made: {0}")]
    Client(String),
    #[error("traces: the OTLP exporter cannot be made: {0}")]
    Exporter(String),
}

/// The running provider, for [`flush`] (a process that ends by `exit` drops nothing).
static RUNNING: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Sends the spans batched so far, when traces are exported.
pub fn flush() {
    if let Some(provider) = RUNNING.get() {
        let _ = provider.force_flush();
    }
}

/// The SDK's provider while spans are exported: dropped, it sends what it holds and stops.
#[derive(Debug)]
pub struct Exporting {
    provider: SdkTracerProvider,
}

impl Drop for Exporting {
    fn drop(&mut self) {
        // Whatever the collector says now, the process is ending.
        let _ = self.provider.shutdown();
    }
}

/// The exporting provider and the tracer the bridge records with, for `config`.
///
/// # Errors
/// When the exporter or its client cannot be made.
pub fn pipeline(config: &TracesConfig) -> Result<(Exporting, Tracer), ExportError> {
    let poster = Poster::new(EXPORT_TIMEOUT).map_err(ExportError::Client)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OtlpClient { poster })
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(config.endpoint.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| ExportError::Exporter(e.to_string()))?;
    let resource = Resource::builder()
        .with_service_name(config.service_name.clone())
        .with_attributes(
            config.resource.iter().map(|(key, value)| KeyValue::new(key.clone(), value.clone())),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        // Whether a request is traced was decided when it arrived (`Traces::start`): every span
        // made is kept.
        .with_sampler(Sampler::AlwaysOn)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("rangeway");
    let _ = RUNNING.set(provider.clone());
    Ok((Exporting { provider }, tracer))
}

/// OTLP's requests through rangeway-get's client.
#[derive(Debug)]
struct OtlpClient {
    poster: Poster,
}

#[async_trait]
impl HttpClient for OtlpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        // The SDK exports from a thread of its own, blocking on this future: a blocking exchange
        // holds up nothing but the next batch.
        let url = request.uri().to_string();
        let headers: Vec<(String, String)> = request
            .headers()
            .iter()
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
            .collect();
        let posted = self.poster.send(request.method().as_str(), &url, &headers, request.body())?;
        Ok(Response::builder().status(posted.status).body(Bytes::from(posted.body))?)
    }
}
