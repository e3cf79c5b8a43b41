//! The whole pipeline — route, session store, slice cache, stages, ranges — driven through an
//! in-memory client session (`client_session::memory`) against a `dir` origin served in memory
//! (`crate::origin::memory`): no socket anywhere, the middleware crate's sans-I/O style carried
//! up one level. Each answer is compared byte for byte with the file it is of.

use std::io::Read as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pingora_error::Error;
use pingora_http::RequestHeader;
use rangeway_middleware::chain::StageRegistry;
use tokio::sync::watch;

use super::Proxy;
use super::answer::is_client_abort;
use super::client_session::ClientSession;
use super::client_session::memory::MemorySession;
use super::context::RequestCtx;
use super::download::object_key;
use crate::cache::Folder;
use crate::config::Config;
use crate::origin::dir::sample_bytes;
use crate::origin::memory::MemoryOrigins;
use crate::request_path::NormalizedPath;
use crate::state::DownloadSession;

#[path = "../../tests/support/multipart.rs"]
mod multipart;

/// The answers as `multipart` reads them: it names them as the integration tests' client does.
mod http {
    /// An answer as its client got it.
    #[derive(Debug)]
    pub(crate) struct Response {
        pub(crate) status: u16,
        pub(crate) headers: ::http::HeaderMap,
        pub(crate) body: Vec<u8>,
    }

    impl Response {
        pub(crate) fn header(&self, name: &str) -> Option<&str> {
            self.headers.get(name).and_then(|value| value.to_str().ok())
        }
    }
}

use http::Response;

/// Larger than a slice of the cache and than what the relay holds before its header goes out.
const LEN: usize = (1 << 20) + 300_000;

/// The proxy of a config with three routes to one folder (the cached one lets POST through), a
/// slice cache and the embedded store.
struct Pipeline {
    proxy: Proxy,
    origin: Arc<MemoryOrigins>,
    files: Folder,
    _cache: Folder,
}

impl Pipeline {
    fn new() -> Self {
        let (files, cache) = (Folder::new("pipeline-files"), Folder::new("pipeline-cache"));
        let config = format!(
            r#"
            [cache]
            dir = {cache:?}
            slice_size = "1MiB"

            [upstreams.files]
            dir = {files:?}

            [[routes]]
            path_prefix = "/files/"
            upstream = "files"
            strip_prefix = true

            [[routes]]
            path_prefix = "/cached/"
            upstream = "files"
            strip_prefix = true
            cache = true
            methods = ["POST"]

            [[routes]]
            path_prefix = "/gz/"
            upstream = "files"
            strip_prefix = true
              [[routes.middleware]]
              kind = "gzip"
              level = 6
            "#,
            cache = cache.0.display().to_string(),
            files = files.0.display().to_string(),
        );
        let registry = StageRegistry::new();
        let config = Config::from_toml_str(&config, &registry).expect("the config is valid");
        let (proxy, origin) = crate::server::in_memory(&config, &registry).expect("built");
        Self { proxy, origin, files, _cache: cache }
    }

    /// Writes `bytes` as the file `name`, last modified ten days ago: fresh for a day by RFC
    /// 9111's heuristic, so that the cache serves it again without asking the origin.
    fn put(&self, name: &str, bytes: &[u8]) {
        let path = self.files.0.join(name);
        std::fs::write(&path, bytes).expect("write the file");
        let file = std::fs::File::options().write(true).open(&path).expect("open the file");
        let ten_days = Duration::from_secs(10 * 86_400);
        file.set_modified(SystemTime::now() - ten_days).expect("set its mtime");
    }

    /// The answer to a GET of `target` with `fields`.
    async fn get(&self, target: &str, fields: &[(&str, &str)]) -> Response {
        let (session, _) = self.send(MemorySession::new(request(target, fields), client())).await;
        let header = session.response_written().expect("an answer");
        Response {
            status: header.status.as_u16(),
            headers: header.headers.clone(),
            body: session.body().to_vec(),
        }
    }

    /// `session`'s request through the pipeline as pingora's adapter takes it: answered (or
    /// failed, with the error it is recorded with), then recorded.
    async fn send(&self, mut session: MemorySession) -> (MemorySession, Option<Box<Error>>) {
        let mut ctx = Box::<RequestCtx>::default();
        let failed = self.proxy.answer(&mut session, &mut ctx).await.err();
        if let Some(e) = &failed {
            self.proxy.answer_failure(&mut session, e, &ctx).await;
        }
        self.proxy.record(&session, failed.as_deref(), &mut ctx).await;
        (session, failed)
    }

    /// The store's session of download `id` of `path`, on the route `/files/`.
    async fn stored(&self, id: &str, path: &str) -> Option<DownloadSession> {
        let path = NormalizedPath::parse(path).expect("a path");
        let object = object_key("/files/", &path, None);
        self.proxy.store.lookup(id, &object, &[]).await.expect("the store answers").session
    }
}

fn request(target: &str, fields: &[(&str, &str)]) -> RequestHeader {
    let mut request = RequestHeader::build("GET", target.as_bytes(), None).expect("a request");
    request.insert_header("host", "dl.example").expect("a host");
    for (name, value) in fields {
        request.append_header(name.to_string(), *value).expect("a field");
    }
    request
}

fn client() -> std::net::SocketAddr {
    "192.0.2.10:40000".parse().expect("an address")
}

#[tokio::test]
async fn a_whole_download() {
    let pipeline = Pipeline::new();
    let file = sample_bytes(LEN);
    pipeline.put("whole.bin", &file);
    let whole = pipeline.get("/files/whole.bin", &[]).await;
    assert_eq!(whole.status, 200);
    assert_eq!(whole.header("content-length"), Some(LEN.to_string().as_str()));
    assert_eq!(whole.header("accept-ranges"), Some("bytes"));
    assert!(whole.body == file, "the file, byte for byte");
    assert_eq!(pipeline.origin.requests(), 1);
}

#[tokio::test]
async fn a_resume_continues_the_download_the_store_recorded() {
    let pipeline = Pipeline::new();
    let file = sample_bytes(LEN);
    pipeline.put("resume.bin", &file);
    let id = [("x-download-id", "resume-1")];
    let first = pipeline.get("/files/resume.bin", &[id[0], ("range", "bytes=0-99999")]).await;
    assert_eq!(first.status, 206);
    assert!(first.body == file[..100_000]);
    let stored = pipeline.stored("resume-1", "/files/resume.bin").await.expect("its session");
    assert_eq!(stored.bytes, 100_000);
    assert!(!stored.is_complete());

    let rest = pipeline.get("/files/resume.bin", &[id[0], ("range", "bytes=100000-")]).await;
    assert_eq!(rest.status, 206);
    let range = format!("bytes 100000-{}/{LEN}", LEN - 1);
    assert_eq!(rest.header("content-range"), Some(range.as_str()));
    assert!(rest.body == file[100_000..], "the rest of the file, byte for byte");
    let stored = pipeline.stored("resume-1", "/files/resume.bin").await.expect("its session");
    assert!(stored.is_complete(), "{stored:?}");
}

#[tokio::test]
async fn a_resume_of_a_changed_file_is_refused() {
    let pipeline = Pipeline::new();
    let file = sample_bytes(LEN);
    pipeline.put("changed.bin", &file);
    let id = ("x-download-id", "changed-1");
    let first = pipeline.get("/files/changed.bin", &[id, ("range", "bytes=0-99999")]).await;
    assert_eq!(first.status, 206);
    pipeline.put("changed.bin", &file[..LEN - 1]);
    let rest = pipeline.get("/files/changed.bin", &[id, ("range", "bytes=100000-")]).await;
    assert_eq!(rest.status, 412, "{:?}", rest.headers);
    assert!(rest.body.is_empty());
}

/// The parts of a multipart answer to `ranges`, each checked against `file` byte for byte.
fn assert_parts(answer: &Response, ranges: &[(usize, usize)], file: &[u8]) {
    assert_eq!(answer.status, 206);
    let content_type = answer.header("content-type").unwrap_or_default();
    assert!(content_type.starts_with("multipart/byteranges; boundary="), "{content_type}");
    let parts = multipart::parts(answer);
    assert_eq!(parts.len(), ranges.len());
    for (part, &(first, last)) in parts.iter().zip(ranges) {
        assert_eq!(part.content_range, format!("bytes {first}-{last}/{}", file.len()));
        assert!(part.body == file[first..=last], "bytes {first}-{last}, byte for byte");
    }
}

#[tokio::test]
async fn a_multipart_answer_holds_each_range() {
    let pipeline = Pipeline::new();
    let file = sample_bytes(LEN);
    pipeline.put("parts.bin", &file);
    // Close together: one request to the origin, cut into the parts.
    let near = pipeline.get("/files/parts.bin", &[("range", "bytes=0-99,1000-1999")]).await;
    assert_parts(&near, &[(0, 99), (1000, 1999)], &file);
    assert_eq!(pipeline.origin.requests(), 1);
    // Far apart, of a version the store now knows: each stretch asked for apart, pinned to it.
    let far = pipeline.get("/files/parts.bin", &[("range", "bytes=0-99,500000-500999")]).await;
    assert_parts(&far, &[(0, 99), (500_000, 500_999)], &file);
    assert_eq!(pipeline.origin.requests(), 3);
}

#[tokio::test]
async fn a_second_download_is_served_from_the_cache() {
    let pipeline = Pipeline::new();
    let file = sample_bytes(LEN);
    pipeline.put("cached.bin", &file);
    let first = pipeline.get("/cached/cached.bin", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-rangeway-cache"), Some("miss"));
    assert!(first.body == file);
    let asked = pipeline.origin.requests();
    assert!(asked > 0);

    let second = pipeline.get("/cached/cached.bin", &[]).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.header("x-rangeway-cache"), Some("hit"));
    assert!(second.body == file, "the file, byte for byte, from the cache");
    assert_eq!(pipeline.origin.requests(), asked, "the origin was not asked again");
}

#[tokio::test]
async fn a_gzip_route_answers_the_file_compressed() {
    let pipeline = Pipeline::new();
    let text: Vec<u8> =
        (0..40_000).flat_map(|n| format!("line {n} of the text\n").into_bytes()).collect();
    pipeline.put("text.txt", &text);
    let answer = pipeline.get("/gz/text.txt", &[]).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some("application/gzip"));
    assert!(answer.body.len() < text.len() / 4, "compressed: {} bytes", answer.body.len());
    let mut decoded = Vec::new();
    flate2::read::GzDecoder::new(answer.body.as_slice())
        .read_to_end(&mut decoded)
        .expect("a gzip member");
    assert!(decoded == text, "the file, byte for byte, once decoded");
}

#[tokio::test]
async fn a_range_past_the_end_is_refused_with_the_length() {
    let pipeline = Pipeline::new();
    pipeline.put("short.bin", &sample_bytes(1000));
    let answer = pipeline.get("/files/short.bin", &[("range", "bytes=5000-")]).await;
    assert_eq!(answer.status, 416);
    assert_eq!(answer.header("content-range"), Some("bytes */1000"));
    assert!(answer.body.is_empty());
}

#[tokio::test]
async fn a_get_with_a_body_is_refused_and_its_connection_closed() {
    let pipeline = Pipeline::new();
    let request = request("/files/any.bin", &[("content-length", "5")]);
    let (session, _) = pipeline.send(MemorySession::new(request, client())).await;
    assert_eq!(session.response_written().map(|r| r.status.as_u16()), Some(400));
    assert!(!session.keepalive());
    assert!(session.ended());
    assert_eq!(pipeline.origin.requests(), 0);
}

#[tokio::test]
async fn a_client_gone_before_the_answer_gets_none() {
    let pipeline = Pipeline::new();
    pipeline.put("gone.bin", &sample_bytes(LEN));
    let (gone, watched) = watch::channel(true);
    let session = MemorySession::new(request("/files/gone.bin", &[]), client()).with_gone(watched);
    let (session, failed) = pipeline.send(session).await;
    assert!(failed.is_some_and(|e| is_client_abort(&e)), "the request ends as the client's");
    assert!(session.response_written().is_none(), "no answer to a client gone");
    assert!(session.body().is_empty());
    drop(gone);
}

/// A POST, its body read from the session chunk by chunk and streamed to the origin; the origin's
/// answer relayed — a `dir` origin takes GET and HEAD only — and, being a 4xx, nothing the cache
/// holds invalidated.
#[tokio::test]
async fn a_post_goes_through_to_the_origin_and_its_answer_comes_back() {
    let pipeline = Pipeline::new();
    let file = sample_bytes(LEN);
    pipeline.put("posted.bin", &file);
    assert_eq!(
        pipeline.get("/cached/posted.bin", &[]).await.header("x-rangeway-cache"),
        Some("miss")
    );
    let asked = pipeline.origin.requests();

    let mut post = RequestHeader::build("POST", b"/cached/posted.bin", None).expect("a request");
    for (name, value) in
        [("host", "dl.example"), ("content-length", "6"), ("expect", "100-continue")]
    {
        post.insert_header(name, value).expect("a field");
    }
    let body = [bytes::Bytes::from_static(b"abc"), bytes::Bytes::from_static(b"def")];
    let session = MemorySession::new(post, client()).with_body(body);
    let (mut session, failed) = pipeline.send(session).await;
    assert!(failed.is_none(), "{failed:?}");
    assert_eq!(session.response_written().map(|r| r.status.as_u16()), Some(405));
    assert!(session.continued(), "the client was told to send its body");
    assert!(session.request_body_done(), "the body was read whole");
    assert!(session.keepalive() && session.ended());
    assert_eq!(pipeline.origin.requests(), asked + 1, "sent once");

    let again = pipeline.get("/cached/posted.bin", &[]).await;
    assert_eq!(again.header("x-rangeway-cache"), Some("hit"));
    assert!(again.body == file);
    assert_eq!(pipeline.origin.requests(), asked + 1, "a refused POST invalidates nothing");
}
