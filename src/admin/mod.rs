//! The admin listener, never on the public port: health, readiness, metrics, the JSON API
//! over downloads and objects (`/v1/...`, behind a bearer token when one is configured), and the
//! live downloads page that shows the API (`/ui`).
//!
//! It answers only requests addressed to it: a `Host` that is its own address, `localhost` or a
//! name in `server.admin_hosts`. A web page can point a name of its own at 127.0.0.1 (DNS
//! rebinding) and have a browser read `/ui` and `/metrics`, which need no token; that browser
//! still sends the page's name in `Host`, and is answered 421.

mod ui;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Response, StatusCode, header};
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use serde_json::{Value, json};

use crate::cache::{Selection, SliceCache};
use crate::representation::current_digests;
use crate::request_path::NormalizedPath;
use crate::routes::{Route, RouteSwitch};
use crate::state::{DownloadSession, StateStore, unix_now};
use crate::telemetry::live::LiveResponses;
use crate::telemetry::metrics::Metrics;
use crate::values::host::Host;
use crate::values::secret::AdminToken;
use crate::values::{Problem, wrong};

/// Most downloads one `/v1/downloads` page lists.
const MAX_PAGE: usize = 1000;

/// How long `/readyz` waits for the proxy listener to accept a connection.
const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct Admin {
    metrics: Arc<Metrics>,
    /// The public listener, probed by `/readyz`.
    proxy_addr: SocketAddr,
    store: Arc<dyn StateStore>,
    routes: Arc<RouteSwitch>,
    token: Option<AdminToken>,
    live: Arc<LiveResponses>,
    cache: Option<Arc<SliceCache>>,
    /// `server.admin_listen`'s address: a `Host` naming it is this listener.
    listen_ip: Option<IpAddr>,
    /// `server.admin_hosts`: the other names it answers to.
    hosts: Vec<String>,
}

impl Admin {
    pub fn new(
        metrics: Arc<Metrics>,
        proxy_addr: SocketAddr,
        store: Arc<dyn StateStore>,
        routes: Arc<RouteSwitch>,
        token: Option<AdminToken>,
        live: Arc<LiveResponses>,
    ) -> Self {
        Self {
            metrics,
            proxy_addr,
            store,
            routes,
            token,
            live,
            cache: None,
            listen_ip: None,
            hosts: Vec::new(),
        }
    }

    /// The admin API, answering the `Host` names of `listen` (its address), `localhost` and
    /// `hosts` (`server.admin_hosts`).
    pub(crate) fn with_hosts(mut self, listen: SocketAddr, hosts: Vec<String>) -> Self {
        self.listen_ip = Some(listen.ip());
        self.hosts = hosts;
        self
    }

    /// Whether the request is addressed to this listener. A request without `Host` (an HTTP/1.0
    /// probe) is: no browser sends one.
    fn addressed_here(&self, session: &ServerSession) -> bool {
        let req = session.req_header();
        let host = match req.headers.get(header::HOST) {
            Some(value) => value.to_str().unwrap_or(""),
            None => match req.uri.host() {
                Some(host) => host,
                None => return true,
            },
        };
        let host = host_without_port(host).to_ascii_lowercase();
        if host == "localhost" || self.hosts.contains(&host) {
            return true;
        }
        let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() else {
            return false;
        };
        // The address the client connected to is this listener's, whatever admin_listen's
        // wildcard covers (a pod's IP, as Kubernetes probes and Prometheus use it).
        let local = session.server_addr().and_then(|addr| addr.as_inet()).map(|addr| addr.ip());
        [self.listen_ip, local]
            .into_iter()
            .flatten()
            .any(|own| own.to_canonical() == ip.to_canonical())
    }

    /// The admin API, with the slice cache to show and purge.
    pub(crate) fn with_cache(mut self, cache: Option<Arc<SliceCache>>) -> Self {
        self.cache = cache;
        self
    }

    /// `/v1/...`: the downloads and objects the state store knows.
    async fn api(&self, session: &ServerSession, path: &str) -> Response<Vec<u8>> {
        if let Some(token) = &self.token {
            let presented =
                session.req_header().headers.get(header::AUTHORIZATION).and_then(bearer_token);
            if !presented.is_some_and(|p| token.verify(p)) {
                let mut response = json_response(
                    StatusCode::UNAUTHORIZED,
                    &json!({"error": "a bearer token is required"}),
                );
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
                return response;
            }
        }
        let query = session.req_header().uri.query().unwrap_or("");
        let method = &session.req_header().method;
        if path == "/v1/cache" {
            return self.cache_api(method, query);
        }
        if method == http::Method::DELETE {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n");
        }
        let result = if let Some(id) = path.strip_prefix("/v1/downloads/") {
            let id = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
            let object = param(query, "object");
            self.store.download(&id).await.map(|found| {
                // One session per object downloaded under the id: `?object=` picks one, else the
                // most recently updated, with the others named.
                let sessions = self.live.merged_all(&id, found, unix_now());
                let objects: Vec<&str> = sessions.iter().map(|s| s.object.as_str()).collect();
                let chosen = match &object {
                    Some(object) => sessions.iter().find(|s| &s.object == object),
                    None => sessions.first(),
                };
                match chosen {
                    Some(download) => {
                        let mut body = download_json(download);
                        if let Value::Object(fields) = &mut body {
                            fields.insert("objects".into(), json!(objects));
                        }
                        (StatusCode::OK, body)
                    }
                    None => (StatusCode::NOT_FOUND, json!({"error": "no such download"})),
                }
            })
        } else if path == "/v1/downloads" {
            let active = param(query, "active").is_some_and(|v| v == "true" || v == "1");
            let offset = param(query, "offset").and_then(|v| v.parse().ok()).unwrap_or(0);
            let limit =
                param(query, "limit").and_then(|v| v.parse().ok()).unwrap_or(100).min(MAX_PAGE);
            self.store.downloads(active, offset, limit).await.map(|page| {
                // Responses in flight show on top of what the store recorded: downloads that
                // have none recorded yet lead the first page.
                let now = unix_now();
                let fresh = if offset == 0 { self.live.unlisted(&page, now) } else { Vec::new() };
                let items: Vec<Value> = fresh
                    .into_iter()
                    .chain(page.into_iter().filter_map(|s| {
                        let (id, object) = (s.id.clone(), s.object.clone());
                        self.live.merged(&id, &object, Some(s), now)
                    }))
                    .filter(|s| !(active && s.is_complete()))
                    .take(limit)
                    .map(|s| download_json(&s))
                    .collect();
                (StatusCode::OK, json!({"offset": offset, "limit": limit, "downloads": items}))
            })
        } else if path == "/v1/objects" {
            let Some(object) = self.object_key(query) else {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": "give ?path=/route/path/of/the/object (and &host= for a host route), or ?key= with a download's object"}),
                );
            };
            let (object, route, path) = object;
            self.store.lookup("", &object, &route.stage_keys).await.map(|found| {
                match found.object {
                    Some(record) => {
                        let digests: serde_json::Map<String, Value> =
                            current_digests(&route, &path, &record.current, found.facts)
                                .into_iter()
                                .map(|(name, value)| (name.to_owned(), Value::String(value)))
                                .collect();
                        let mut body = serde_json::to_value(&record).unwrap_or(Value::Null);
                        if let Value::Object(fields) = &mut body {
                            fields.insert("digests".to_owned(), Value::Object(digests));
                        }
                        (StatusCode::OK, body)
                    }
                    None => (
                        StatusCode::NOT_FOUND,
                        json!({"error": "no such object known", "object": object}),
                    ),
                }
            })
        } else {
            Ok((
                StatusCode::NOT_FOUND,
                json!({"error": "try /v1/downloads, /v1/downloads/{id}, /v1/objects?path="}),
            ))
        };
        match result {
            Ok((status, body)) => json_response(status, &body),
            Err(e) => {
                json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"error": e.to_string()}))
            }
        }
    }

    /// `/v1/cache`: what the slice cache holds of an object (`?path=` a client path, through the
    /// routes as the proxy's, `&host=` for a host route) or of a prefix of upstream paths
    /// (`?prefix=`, `&upstream=` one upstream's); with DELETE, drops it.
    fn cache_api(&self, method: &http::Method, query: &str) -> Response<Vec<u8>> {
        let Some(cache) = &self.cache else {
            return json_response(StatusCode::NOT_FOUND, &json!({"error": "there is no cache"}));
        };
        let selection = if let Some(raw) = param(query, "path") {
            let decoded = percent_encoding::percent_decode_str(&raw).decode_utf8_lossy();
            let Ok(path) = NormalizedPath::parse(&decoded) else {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": "not a usable path"}),
                );
            };
            let host = param(query, "host").map(|h| h.to_ascii_lowercase());
            let routes = self.routes.current();
            let Some(route) = routes.find(host.as_deref(), &path) else {
                return json_response(
                    StatusCode::NOT_FOUND,
                    &json!({"error": "no route for this path"}),
                );
            };
            Selection::Object {
                upstream: route.upstream.name().to_owned(),
                path: route.upstream_path(&path),
            }
        } else if let Some(prefix) = param(query, "prefix") {
            Selection::Prefix { upstream: param(query, "upstream"), prefix }
        } else {
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({"error": "give ?path=/route/path/of/the/object (and &host= for a host route), or ?prefix=/upstream/path/prefix (and &upstream=NAME)"}),
            );
        };
        if method == http::Method::DELETE {
            let purged = cache.purge(&selection);
            return json_response(StatusCode::OK, &json!({"purged": purged}));
        }
        let objects = cache.listing(&selection);
        if objects.is_empty() && matches!(selection, Selection::Object { .. }) {
            return json_response(StatusCode::NOT_FOUND, &json!({"error": "not in the cache"}));
        }
        json_response(StatusCode::OK, &json!({"objects": objects}))
    }

    /// The store's key of the object that `?key=` (as a download's `object` names it) or a client
    /// path names (`?path=`, through the same routes as the proxy), with its route and path.
    fn object_key(&self, query: &str) -> Option<(String, Arc<Route>, String)> {
        if let Some(key) = param(query, "key") {
            let routes = self.routes.current();
            let (route, path) = routes.find_object(&key)?;
            return Some((key, Arc::clone(route), path.to_string()));
        }
        let raw = param(query, "path")?;
        let decoded = percent_encoding::percent_decode_str(&raw).decode_utf8().ok()?;
        let path = NormalizedPath::parse(&decoded).ok()?;
        let host = param(query, "host").map(|h| h.to_ascii_lowercase());
        let routes = self.routes.current();
        let route = routes.find(host.as_deref(), &path)?;
        Some((format!("{}|{path}", route.name), Arc::clone(route), path.to_string()))
    }

    async fn proxy_accepts(&self) -> bool {
        matches!(
            tokio::time::timeout(
                READY_PROBE_TIMEOUT,
                tokio::net::TcpStream::connect(self.proxy_addr)
            )
            .await,
            Ok(Ok(_))
        )
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if !self.addressed_here(session) {
            return text(
                StatusCode::MISDIRECTED_REQUEST,
                "this admin listener does not answer that Host: use its address or localhost, \
                 or add the name to server.admin_hosts\n",
            );
        }
        let req = session.req_header();
        let path = req.uri.path().to_owned();
        // DELETE only where the API drops something (`/v1/cache`).
        let deletes = req.method == http::Method::DELETE && path.starts_with("/v1/");
        if req.method != http::Method::GET && req.method != http::Method::HEAD && !deletes {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n");
        }
        if path.starts_with("/v1/") || path == "/v1" {
            return self.api(session, &path).await;
        }
        if ui::is_ui_path(&path) {
            return ui::response(&path);
        }
        match path.as_str() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => {
                if self.proxy_accepts().await {
                    text(StatusCode::OK, "ready\n")
                } else {
                    text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the proxy listener does not accept connections\n",
                    )
                }
            }
            "/metrics" => {
                let body = self.metrics.render();
                Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")
                    .header(header::CONTENT_LENGTH, body.len())
                    .body(body)
                    .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "\n"))
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: try /healthz, /readyz, /metrics, /v1/downloads or /ui\n",
            ),
        }
    }
}

fn text(status: StatusCode, body: &str) -> Response<Vec<u8>> {
    let mut response = Response::new(body.as_bytes().to_vec());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
    headers.insert(header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
    response
}

/// A download as the API shows it: the stored session (every version it was sent), and what
/// follows from it for the version sent to most recently: its `version`, the bytes `delivered`
/// (written to the download's connections), `complete`, `size`, `percent`, `sent_prefix`.
fn download_json(download: &DownloadSession) -> Value {
    let mut value = serde_json::to_value(download).unwrap_or(Value::Null);
    let (Value::Object(fields), Some(latest)) = (&mut value, download.latest()) else {
        return value;
    };
    let size = latest.version.size;
    let delivered = latest.sent.total();
    let percent =
        if size == 0 { 100.0 } else { (delivered as f64 * 100.0 / size as f64).min(100.0) };
    fields.insert("version".into(), json!(latest.version));
    fields.insert("delivered".into(), json!(latest.sent));
    fields.insert("complete".into(), json!(latest.is_complete()));
    fields.insert("size".into(), json!(size));
    fields.insert("delivered_bytes".into(), json!(delivered));
    fields.insert("percent".into(), json!((percent * 10.0).round() / 10.0));
    fields.insert("sent_prefix".into(), json!(latest.sent.contiguous_prefix_end()));
    value
}

fn json_response(status: StatusCode, body: &Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec_pretty(body).unwrap_or_default();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let len = response.body().len();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    headers.insert(header::CONTENT_LENGTH, http::HeaderValue::from(len));
    headers.insert(header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    response
}

/// The token of an `Authorization: Bearer TOKEN` field; the scheme's name is case-insensitive
/// (RFC 9110 §11.1), and may be followed by more than one space.
fn bearer_token(value: &http::HeaderValue) -> Option<&[u8]> {
    let value = value.as_bytes();
    let space = value.iter().position(|byte| *byte == b' ')?;
    let (scheme, token) = value.split_at(space);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| token.trim_ascii_start())
}

/// A `server.admin_hosts` entry, written as `addressed_here` compares it with `Host`:
/// lower case, IPv6 in brackets, without port.
pub(crate) fn host_entry(text: &str) -> Result<String, Problem> {
    let with_port = text.rsplit_once(':').filter(|(host, port)| {
        !host.is_empty()
            && !host.contains(':')
            && !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
    });
    if let Some((host, _)) = with_port {
        let fix = format!("write {host:?}: names are matched without their port");
        return wrong(format!("{text:?} has a port"), fix);
    }
    Host::parse(&text.to_ascii_lowercase()).map(|host| host.to_string()).or_else(|problem| {
        wrong(
            format!("{text:?}: {problem}"),
            "write a host name as clients put it in Host, without port, e.g. \"rangeway-1.internal\"",
        )
    })
}

/// A `Host` value's host: `name`, `10.0.0.1` or `[::1]`, without the port.
fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The decoded value of query parameter `name`.
fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name)
            .then(|| percent_encoding::percent_decode_str(value).decode_utf8_lossy().into_owned())
    })
}
