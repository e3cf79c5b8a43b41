//! The `dir` upstream: a local folder served as an HTTP origin.
//!
//! It listens on a Unix socket of its own and the proxy reaches it like any other HTTP origin, so
//! a `dir` route goes through exactly the same proxy path (range planning, checks, metrics) as a
//! route to a bucket. It is a careful origin in its own right: strong ETags, Last-Modified, the
//! RFC 9110 preconditions, single and multiple ranges, HEAD.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::fingerprint::fingerprint;
use async_trait::async_trait;
use bytes::BytesMut;
use http::{Method, StatusCode, header};
use pingora_core::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::ShutdownWatch;
use pingora_http::ResponseHeader;
use rangeway_middleware::ByteRange;
use rangeway_middleware::rfc9110::{
    EntityTag, MultipartBody, MultipartPlan, Precondition, RangeLimits, Resolution, Validators,
    content_range, evaluate_preconditions, if_range_holds, unsatisfied_content_range,
};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tracing::{debug, info};

use crate::range::ClientRange;
use crate::request_path::NormalizedPath;

/// Bytes read from disk per body chunk.
const CHUNK: usize = 64 * 1024;

/// The sample object written into an empty folder, so a first run has something to download.
pub const SAMPLE_NAME: &str = "sample.bin";
const SAMPLE_LEN: usize = 16 * 1024 * 1024;

/// A folder served over HTTP.
#[derive(Debug)]
pub struct DirOrigin {
    root: PathBuf,
    range_limits: RangeLimits,
}

impl DirOrigin {
    /// Serves `root`, which must exist (see [`prepare_folder`]).
    pub fn new(root: &Path, range_limits: RangeLimits) -> std::io::Result<Self> {
        Ok(Self { root: root.canonicalize()?, range_limits })
    }

    async fn serve(&self, session: &mut ServerSession) -> pingora_error::Result<()> {
        let req = session.req_header();
        let method = req.method.clone();
        if method != Method::GET && method != Method::HEAD {
            return answer(session, StatusCode::METHOD_NOT_ALLOWED, &[]).await;
        }
        let Ok(path) = NormalizedPath::parse(req.uri.path()) else {
            return answer(session, StatusCode::BAD_REQUEST, &[]).await;
        };
        let Some(file) = self.open(&path).await else {
            return answer(session, StatusCode::NOT_FOUND, &[]).await;
        };
        let (mut file, meta) = file;
        let len = meta.len();
        let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
        let validators =
            Validators { etag: Some(etag_of(&meta)), last_modified: Some(whole_seconds(mtime)) };
        let etag = validators.etag.as_ref().map(ToString::to_string).unwrap_or_default();
        let last_modified = httpdate::fmt_http_date(whole_seconds(mtime));
        let common = [
            (header::ETAG, etag.as_str()),
            (header::LAST_MODIFIED, last_modified.as_str()),
            (header::ACCEPT_RANGES, "bytes"),
        ];

        let req = session.req_header();
        match evaluate_preconditions(&method, &req.headers, &validators) {
            Precondition::Proceed => {}
            Precondition::NotModified => {
                return answer(session, StatusCode::NOT_MODIFIED, &common).await;
            }
            Precondition::Failed => {
                return answer(session, StatusCode::PRECONDITION_FAILED, &common).await;
            }
        }
        let resolution = match ClientRange::from_request(&method, &req.headers, &self.range_limits)
        {
            ClientRange::Bytes(set)
                if if_range_holds(&req.headers, &validators, SystemTime::now()) =>
            {
                Some(set.resolve(len))
            }
            _ => None,
        };
        let content_type = content_type_of(&path);
        let head_only = method == Method::HEAD;

        let mut response;
        let mut multipart = None;
        let body_range = match resolution {
            None => {
                response = ResponseHeader::build(StatusCode::OK, Some(8))?;
                response.insert_header(header::CONTENT_TYPE, content_type)?;
                response.insert_header(header::CONTENT_LENGTH, len)?;
                ByteRange::whole(len)
            }
            Some(Resolution::Unsatisfiable) => {
                let range = unsatisfied_content_range(len);
                return answer(
                    session,
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    &[
                        (header::CONTENT_RANGE, range.as_str()),
                        common[0].clone(),
                        common[2].clone(),
                    ],
                )
                .await;
            }
            Some(Resolution::Single(range)) => {
                response = ResponseHeader::build(StatusCode::PARTIAL_CONTENT, Some(8))?;
                response.insert_header(header::CONTENT_TYPE, content_type)?;
                response.insert_header(header::CONTENT_RANGE, content_range(range, len))?;
                response.insert_header(header::CONTENT_LENGTH, range.len())?;
                range
            }
            Some(Resolution::Multiple(ranges)) => {
                let boundary = format!("dir-{}", etag.trim_matches('"'));
                let internal = |e| {
                    pingora_error::Error::because(
                        pingora_error::ErrorType::InternalError,
                        "multipart",
                        e,
                    )
                };
                let plan = MultipartPlan::new(&ranges, len, Some(content_type), &boundary)
                    .map_err(internal)?;
                response = ResponseHeader::build(StatusCode::PARTIAL_CONTENT, Some(8))?;
                response.insert_header(header::CONTENT_TYPE, plan.content_type_header())?;
                response.insert_header(header::CONTENT_LENGTH, plan.total_len())?;
                // One pass over the bytes from the first range's start to the last one's end.
                let span = plan.span();
                multipart = Some(MultipartBody::new(plan, span.start()).map_err(internal)?);
                span
            }
        };
        for (name, value) in &common {
            response.insert_header(name.clone(), *value)?;
        }
        let empty = head_only || (body_range.is_empty() && multipart.is_none());
        session.write_response_header(Box::new(response)).await?;
        if empty {
            return Ok(());
        }
        file.seek(std::io::SeekFrom::Start(body_range.start())).await.map_err(|e| {
            pingora_error::Error::because(pingora_error::ErrorType::FileReadError, "seek", e)
        })?;
        let mut remaining = body_range.len();
        while remaining > 0 {
            let want = remaining.min(CHUNK as u64) as usize;
            let mut buf = BytesMut::zeroed(want);
            let read = file.read(&mut buf).await.map_err(|e| {
                pingora_error::Error::because(pingora_error::ErrorType::FileReadError, "read", e)
            })?;
            if read == 0 {
                // The file shrank under us: end the connection rather than send a short body.
                return pingora_error::Error::e_explain(
                    pingora_error::ErrorType::FileReadError,
                    "file truncated while serving",
                );
            }
            buf.truncate(read);
            remaining -= read as u64;
            let chunk = buf.freeze();
            let out = match multipart.as_mut() {
                Some(m) => m.push(chunk),
                None => Some(chunk),
            };
            if let Some(out) = out {
                session.write_response_body(out, false).await?;
            }
        }
        if let Some(tail) = multipart.as_mut().and_then(MultipartBody::finish) {
            session.write_response_body(tail, false).await?;
        }
        session.finish_body().await?;
        Ok(())
    }

    /// The file for a path, if it is a regular file inside the root (symlinks resolved).
    async fn open(&self, path: &NormalizedPath) -> Option<(tokio::fs::File, std::fs::Metadata)> {
        let mut full = self.root.clone();
        full.extend(path.segments());
        let real = tokio::fs::canonicalize(&full).await.ok()?;
        if !real.starts_with(&self.root) {
            return None;
        }
        let file = tokio::fs::File::open(&real).await.ok()?;
        let meta = file.metadata().await.ok()?;
        meta.is_file().then_some((file, meta))
    }
}

#[async_trait]
impl HttpServerApp for DirOrigin {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        _shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        match session.read_request().await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                debug!(error = %e, "dir origin: cannot read request");
                return None;
            }
        }
        if let Err(e) = self.serve(&mut session).await {
            debug!(error = %e, "dir origin: request failed");
            return None;
        }
        let persistent = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
            Ok(stream) => stream.map(|s| ReusedHttpStream::from_reusable_stream(s, persistent)),
            Err(_) => None,
        }
    }
}

/// An answer without content.
async fn answer(
    session: &mut ServerSession,
    status: StatusCode,
    fields: &[(header::HeaderName, &str)],
) -> pingora_error::Result<()> {
    let mut response = ResponseHeader::build(status, Some(fields.len() + 1))?;
    for (name, value) in fields {
        response.insert_header(name.clone(), *value)?;
    }
    if status != StatusCode::NOT_MODIFIED {
        response.insert_header(header::CONTENT_LENGTH, 0)?;
    }
    session.write_response_header(Box::new(response)).await?;
    session.finish_body().await?;
    Ok(())
}

/// A strong validator: it changes whenever the file is replaced (inode), resized or rewritten
/// (modification time, to the nanosecond).
fn etag_of(meta: &std::fs::Metadata) -> EntityTag {
    let parts = [meta.dev(), meta.ino(), meta.len(), meta.mtime() as u64, meta.mtime_nsec() as u64]
        .map(u64::to_be_bytes);
    let tag = fingerprint(parts.iter().map(|p| &p[..]), 16);
    EntityTag::strong(&tag).expect("hex digits are valid entity-tag characters")
}

/// HTTP dates have one-second resolution; comparisons must use the value as sent.
fn whole_seconds(time: SystemTime) -> SystemTime {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

fn content_type_of(path: &NormalizedPath) -> &'static str {
    let name = path.segments().last().map_or("", String::as_str);
    let ext = name.rsplit_once('.').map_or("", |(_, e)| e).to_ascii_lowercase();
    match ext.as_str() {
        "txt" | "log" | "md" => "text/plain; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "json" => "application/json",
        "gz" => "application/gzip",
        "zip" => "application/zip",
        "tar" => "application/x-tar",
        "iso" => "application/x-iso9660-image",
        "mp4" => "video/mp4",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "pdf" => "application/pdf",
        _ => "application/octet-stream",
    }
}

/// Creates the folder when it is missing and puts a sample object in it when it holds nothing, so
/// the embedded default gives a working download at once. Returns the sample's path if written.
pub fn prepare_folder(root: &Path) -> std::io::Result<Option<PathBuf>> {
    if !root.exists() {
        std::fs::create_dir_all(root)?;
        info!(folder = %root.display(), "created the folder of a dir upstream");
    }
    let has_content = std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .any(|entry| !entry.file_name().to_string_lossy().starts_with('.'));
    if has_content {
        return Ok(None);
    }
    let sample = root.join(SAMPLE_NAME);
    std::fs::write(&sample, sample_bytes(SAMPLE_LEN))?;
    info!(file = %sample.display(), bytes = SAMPLE_LEN, "the folder was empty: wrote a sample object");
    Ok(Some(sample))
}

/// Deterministic, incompressible bytes (xorshift64*), so every run writes the same sample.
pub(crate) fn sample_bytes(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let word = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A fresh socket path for a `dir` origin of this process.
pub fn socket_path(upstream: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("rangeway-{}-{n}-{upstream}.sock", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_deterministic() {
        assert_eq!(sample_bytes(1000), sample_bytes(1000));
        assert_ne!(sample_bytes(16)[..8], sample_bytes(16)[8..]);
    }
}
