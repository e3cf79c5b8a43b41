//! The route table: which upstream serves a request, and under which path; each route as
//! configured ([`RouteConfig`]), the settings it carries and the rules its prefix, host and
//! methods follow; the upstreams, built once from config; their active health checks. Built by
//! the server, read by the proxy and the admin API.

pub mod health;
pub(crate) mod origin_client;
pub mod upstream;

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use ::config::ValueKind;
use http::Method;
use rangeway_middleware::chain::{Chain, OptionValue, StageOptions};

use crate::links::SignedLinks;
use crate::request_path::NormalizedPath;
use crate::s3::credentials::S3ClientKeys;
use crate::state::DownloadLimits;
use crate::values::host::split_host_port;
use crate::values::{Problem, wrong};
pub use origin_client::UpstreamResume;
use upstream::Upstream;

/// One `[[routes]]` entry, resolved against its upstream.
#[derive(Debug)]
pub struct Route {
    /// The name used in logs and metrics: the configured prefix, with the host when there is one.
    pub name: String,
    host: Option<String>,
    prefix: NormalizedPath,
    strip_prefix: bool,
    pub upstream: Arc<Upstream>,
    /// The route's middleware; empty for a passthrough route.
    pub chain: Chain,
    /// Under which key the state store keeps what each stage learned: the stage's place, the
    /// identity of its input and its own.
    pub stage_keys: Vec<String>,
    /// When set, only requests signed with one of these keys are served.
    pub s3_client_keys: Option<S3ClientKeys>,
    /// How long a download begun with a presigned URL may resume after it expired.
    pub s3_presigned_grace: Duration,
    /// When set, a body its origin breaks off is continued (see `relay`).
    pub upstream_resume: Option<UpstreamResume>,
    /// Whether clients' `response-*` query parameters reach an S3 upstream.
    pub s3_response_overrides: bool,
    /// How the route uses the slice cache; `None`: it does not.
    pub cache: Option<RouteCache>,
    /// When set, only signed links are served.
    pub signed_links: Option<SignedLinks>,
    /// When set, how many downloads may be under way at once.
    pub download_limits: Option<DownloadLimits>,
    /// When set, how fast responses go out.
    pub rate_limit: Option<RateLimit>,
    /// The methods it answers: GET and HEAD, then those passed through to its upstream.
    pub methods: Vec<Method>,
}

/// One `[[routes]]` as configured, which [`Route::new`] and its fields are built from.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RouteConfig {
    /// Lower case (IPv6 in brackets), matched without the port; `None` matches any host.
    pub host: Option<String>,
    /// Normalised (no `..`, `//`, `%`, `\`, control characters or whitespace), so that it can be
    /// compared with a normalised request path byte for byte.
    pub path_prefix: String,
    /// The name of an upstream in `[upstreams]`.
    pub upstream: String,
    pub strip_prefix: bool,
    /// The stages, in order; empty for a passthrough route.
    pub middleware: Vec<MiddlewareSpec>,
    pub s3_client_keys: Option<S3ClientKeys>,
    pub s3_presigned_grace: Duration,
    pub upstream_resume: Option<UpstreamResume>,
    pub s3_response_overrides: bool,
    pub cache: Option<RouteCache>,
    pub signed_links: Option<SignedLinks>,
    pub download_limits: Option<DownloadLimits>,
    pub rate_limit: Option<RateLimit>,
    /// The methods the route answers: GET and HEAD always, first, then those `methods` adds, which
    /// are passed through to the upstream.
    pub methods: Vec<Method>,
}

/// A middleware entry as written: a kind the registry has, and options left for its stage.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MiddlewareSpec {
    pub kind: String,
    /// Every key but `kind`, each value's origin naming the file or the variable that set it.
    pub options: BTreeMap<String, ::config::Value>,
    /// Where the entry is, for the stage's own errors: `routes[1].middleware[0]`.
    pub path: String,
}

impl MiddlewareSpec {
    /// The options as its stage takes them, and the keys of those no stage takes (tables).
    pub(crate) fn stage_options(&self) -> (StageOptions, Vec<&str>) {
        let (mut options, mut tables) = (StageOptions::new(), Vec::new());
        for (key, value) in &self.options {
            match option_value(value) {
                Some(value) => _ = options.insert(key.clone(), value),
                None => tables.push(key.as_str()),
            }
        }
        (options, tables)
    }
}

impl Route {
    /// `prefix` must be a valid path: one [`path_prefix`] accepts.
    pub fn new(
        host: Option<String>,
        prefix: &str,
        strip_prefix: bool,
        upstream: Arc<Upstream>,
        chain: Chain,
    ) -> Result<Self, crate::request_path::PathError> {
        let prefix_path = NormalizedPath::parse(prefix)?;
        let name = match &host {
            Some(host) => format!("{host}{prefix}"),
            None => prefix.to_owned(),
        };
        Ok(Self {
            name,
            host: host.map(|h| h.to_ascii_lowercase()),
            prefix: prefix_path,
            strip_prefix,
            upstream,
            stage_keys: stage_keys(&chain),
            chain,
            s3_client_keys: None,
            s3_presigned_grace: Duration::ZERO,
            upstream_resume: None,
            s3_response_overrides: false,
            cache: None,
            signed_links: None,
            download_limits: None,
            rate_limit: None,
            methods: vec![Method::GET, Method::HEAD],
        })
    }

    /// The upstream path for a request path this route matched.
    pub fn upstream_path(&self, path: &NormalizedPath) -> String {
        let base = self.upstream.base_path();
        let encoding = self.upstream.path_encoding();
        if self.strip_prefix {
            // `path` matched `self.prefix`, so stripping succeeds.
            if let Some(rest) = path.strip(&self.prefix) {
                return rest.to_upstream(base, encoding);
            }
        }
        path.to_upstream(base, encoding)
    }
}

/// A route's use of the cache (`cache = true | false | { ... }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RouteCache {
    pub revalidate: Revalidate,
    /// Whether answers to requests with `Authorization` may be stored and served: they are for
    /// one client unless the route (or the origin, RFC 9111 §3.5) says otherwise.
    pub authorized: bool,
}

/// When a stored response is validated with the origin before it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Revalidate {
    /// When RFC 9111 says so: once stale, or on `no-cache`.
    #[default]
    Rfc9111,
    /// Also at the start of every new download.
    EachDownload,
}

/// A route's bandwidth limits, in bytes per second.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    pub rate: Option<u64>,
    pub after: u64,
    pub per_client: Option<u64>,
    pub per_route: Option<u64>,
    pub origin_header: Option<http::HeaderName>,
}

impl RateLimit {
    /// An `origin_header`: the name of the field an origin's answer sets the rate in.
    pub(crate) fn origin_header(name: &str) -> Result<http::HeaderName, Problem> {
        http::HeaderName::from_bytes(name.as_bytes()).or_else(|_| {
            let fix = "write a field name, e.g. \"X-Accel-Limit-Rate\"";
            wrong(format!("{name:?} is not a header name"), fix)
        })
    }
}

/// A `path_prefix`, normalised as a request path is, so that [`Route::new`] can parse it and
/// match requests against it byte for byte.
pub(crate) fn path_prefix(prefix: &str) -> Result<String, Problem> {
    let odd = |c: char| c.is_control() || c.is_whitespace() || c == '?' || c == '#';
    let problem = [
        (!prefix.starts_with('/'), "does not start with '/'"),
        (prefix.contains(".."), "contains '..'"),
        (prefix.contains("//"), "contains '//'"),
        (
            prefix.contains('%'),
            "contains '%' (write the decoded character; requests are matched after decoding)",
        ),
        (prefix.contains('\\'), "contains '\\'"),
        (prefix.contains('\0'), "contains a NUL character"),
        (prefix.split('/').any(|s| s == "."), "has a '.' segment"),
        (prefix.chars().any(odd), "contains whitespace, a control character, '?' or '#'"),
        (prefix.len() > 1024, "is longer than 1024 bytes"),
    ];
    let Some((_, problem)) = problem.into_iter().find(|(wrong, _)| *wrong) else {
        return Ok(prefix.to_owned());
    };
    let fix = "write a normalised path that starts with '/', e.g. \"/files/\"";
    wrong(format!("{prefix:?} {problem}"), fix)
}

/// A route's `host`: a name or an address, matched without the port.
pub(crate) fn host(text: &str) -> Result<String, Problem> {
    match split_host_port(text) {
        Ok((host, None)) => Ok(host.to_string()),
        Ok((host, Some(_))) => wrong(
            format!("{text:?} has a port"),
            format!("write host = \"{host}\": hosts are matched without the port"),
        ),
        Err(e) => wrong(
            format!("{text:?} is not a host: {e}"),
            "write a DNS name or an IP address, e.g. host = \"dl.example.com\"",
        ),
    }
}

/// A method a route's `methods` adds: a token as clients send it (methods are case-sensitive,
/// RFC 9110 §9.1), never CONNECT (rangeway does not tunnel) nor TRACE (it would reflect a
/// request, its credentials included, to whoever can send one: cross-site tracing).
pub(crate) fn passed_method(text: &str) -> Result<Method, Problem> {
    let upper = text.to_ascii_uppercase();
    let refused = match upper.as_str() {
        "CONNECT" => Some("rangeway does not tunnel connections"),
        "TRACE" => {
            Some("it would reflect a request, its credentials included, to whoever sends one")
        }
        _ => None,
    };
    if let Some(why) = refused {
        return wrong(format!("{upper} is never passed through: {why}"), "remove it");
    }
    let Ok(method) = Method::from_bytes(text.as_bytes()) else {
        let fix = "write a method as clients send it, e.g. \"POST\" (a token: letters, digits and \
                   !#$%&'*+-.^_`|~)";
        return wrong(format!("{text:?} is not a method"), fix);
    };
    let standard = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"];
    if text != upper && standard.contains(&upper.as_str()) {
        let problem = format!("{text:?} is not {upper}: methods are case-sensitive");
        return wrong(problem, format!("write \"{upper}\""));
    }
    Ok(method)
}

/// GET and HEAD, which every route answers, then `added` without them or repeats.
pub(crate) fn answered_methods(added: Vec<Method>) -> Vec<Method> {
    let mut methods = vec![Method::GET, Method::HEAD];
    for method in added {
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    methods
}

fn option_value(value: &::config::Value) -> Option<OptionValue> {
    Some(match &value.kind {
        ValueKind::Boolean(b) => OptionValue::Bool(*b),
        ValueKind::I64(_) | ValueKind::U64(_) | ValueKind::I128(_) | ValueKind::U128(_) => {
            OptionValue::Int(value.clone().into_int().unwrap_or(i64::MAX))
        }
        ValueKind::Float(f) => OptionValue::Float(*f),
        ValueKind::String(s) => OptionValue::Str(s.clone()),
        ValueKind::Array(items) => {
            OptionValue::List(items.iter().map(option_value).collect::<Option<_>>()?)
        }
        ValueKind::Nil | ValueKind::Table(_) => return None,
    })
}

fn stage_keys(chain: &Chain) -> Vec<String> {
    chain
        .stages()
        .iter()
        .enumerate()
        .map(|(index, stage)| {
            let input = chain.input_identity(index).unwrap_or_default();
            format!("{index}|{input}|{}", stage.identity())
        })
        .collect()
}

/// Routes ordered so that the first match is the right one: routes for a host before routes for
/// any host, then longer prefixes (in segments) before shorter ones.
#[derive(Debug)]
pub struct RouteTable {
    routes: Vec<Arc<Route>>,
}

impl RouteTable {
    pub fn new(mut routes: Vec<Route>) -> Self {
        routes.sort_by_key(|r| precedence(r.host.as_deref(), &r.prefix));
        Self { routes: routes.into_iter().map(Arc::new).collect() }
    }

    /// The route for `req`, whose path is `path`. Its host is read only when a route names one
    /// (those come first).
    pub fn for_request(
        &self,
        req: &pingora_http::RequestHeader,
        path: &NormalizedPath,
    ) -> Option<&Arc<Route>> {
        let host = match self.routes.first().is_some_and(|route| route.host.is_some()) {
            true => request_host(req),
            false => None,
        };
        self.find(host.as_deref(), path)
    }

    /// The route for a request to `host` (without port, any case) and `path`.
    pub fn find(&self, host: Option<&str>, path: &NormalizedPath) -> Option<&Arc<Route>> {
        self.routes.iter().find(|route| takes(route.host.as_deref(), &route.prefix, host, path))
    }

    /// The route and path of the object the state store keys `key`: `{route name}|{path}`, as the
    /// proxy names an object it records (a download's `object`).
    pub fn find_object(&self, key: &str) -> Option<(&Arc<Route>, NormalizedPath)> {
        self.routes.iter().find_map(|route| {
            let raw = key.strip_prefix(route.name.as_str())?.strip_prefix('|')?;
            let path = NormalizedPath::parse(raw).ok()?;
            // Only a key the proxy could have written names an object it recorded.
            (path.to_string() == raw && path.starts_with(&route.prefix)).then_some((route, path))
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.routes.iter()
    }
}

/// Which of the routes that take a request serves it: the first by this order — routes for a
/// host before routes for any, then longer prefixes (in segments) before shorter.
pub fn precedence(host: Option<&str>, prefix: &NormalizedPath) -> (bool, std::cmp::Reverse<usize>) {
    (host.is_none(), std::cmp::Reverse(prefix.segments().len()))
}

/// Whether a route for `route_host` (`None`: any) and `prefix` takes a request to `host` and
/// `path`.
pub fn takes(
    route_host: Option<&str>,
    prefix: &NormalizedPath,
    host: Option<&str>,
    path: &NormalizedPath,
) -> bool {
    let host_matches = match (route_host, host) {
        (None, _) => true,
        (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
        (Some(_), None) => false,
    };
    host_matches && path.starts_with(prefix)
}

/// The route table in force. A reload replaces it whole; a request keeps the table (and the
/// routes, upstreams and stages) it began with until it ends.
#[derive(Debug)]
pub struct RouteSwitch(RwLock<Arc<RouteTable>>);

impl RouteSwitch {
    pub fn new(table: RouteTable) -> Self {
        Self(RwLock::new(Arc::new(table)))
    }

    pub fn current(&self) -> Arc<RouteTable> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn replace(&self, table: RouteTable) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(table);
    }
}

/// The host a request is for: the Host header (or the authority of an absolute-form target),
/// lower-cased, without port.
fn request_host(req: &pingora_http::RequestHeader) -> Option<String> {
    let mut host = req.uri.authority().map(|a| a.host().to_owned()).or_else(|| {
        let value = req.headers.get(http::header::HOST)?.to_str().ok()?;
        let authority: http::uri::Authority = value.parse().ok()?;
        Some(authority.host().to_owned())
    })?;
    host.make_ascii_lowercase();
    Some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::upstream::Timeouts;
    use std::time::Duration;

    fn upstream(name: &str) -> Arc<Upstream> {
        let t = Duration::from_secs(1);
        let timeouts = Timeouts { connect: t, read: t, write: t, idle: t };
        Arc::new(Upstream::http(name, "127.0.0.1", 1, None, "h".into(), "/base", timeouts).unwrap())
    }

    fn table() -> RouteTable {
        RouteTable::new(vec![
            Route::new(None, "/", false, upstream("root"), Chain::default()).unwrap(),
            Route::new(None, "/files/", true, upstream("files"), Chain::default()).unwrap(),
            Route::new(None, "/files/big/", false, upstream("big"), Chain::default()).unwrap(),
            Route::new(
                Some("DL.example.com".into()),
                "/files",
                true,
                upstream("host"),
                Chain::default(),
            )
            .unwrap(),
        ])
    }

    fn route(host: Option<&str>, path: &str) -> (String, String) {
        let table = table();
        let path = NormalizedPath::parse(path).unwrap();
        let route = table.find(host, &path).unwrap();
        (route.upstream.name().to_owned(), route.upstream_path(&path))
    }

    #[test]
    fn a_request_finds_its_route_by_host_only_where_a_route_names_one() {
        let request = |host: &str| {
            let mut req = pingora_http::RequestHeader::build("GET", b"/files/a", None).unwrap();
            req.insert_header(http::header::HOST, host).unwrap();
            req
        };
        let path = NormalizedPath::parse("/files/a").unwrap();
        let name = |table: &RouteTable, host: &str| {
            table.for_request(&request(host), &path).map(|r| r.upstream.name().to_owned())
        };
        let table = table();
        assert_eq!(name(&table, "dl.EXAMPLE.com:8080").as_deref(), Some("host"));
        assert_eq!(name(&table, "other.example.com").as_deref(), Some("files"));
        assert_eq!(name(&table, "not a host").as_deref(), Some("files"));
        // Without a route for a host, the Host header is not read: any value routes by path.
        let by_path = RouteTable::new(vec![
            Route::new(None, "/files/", true, upstream("files"), Chain::default()).unwrap(),
        ]);
        assert_eq!(name(&by_path, "dl.example.com").as_deref(), Some("files"));
        assert_eq!(name(&by_path, "not a host").as_deref(), Some("files"));
    }

    #[test]
    fn an_object_key_names_its_route_and_path() {
        let table = table();
        let found = |key: &str| {
            table.find_object(key).map(|(route, path)| (route.name.clone(), path.to_string()))
        };
        assert_eq!(found("/files/|/files/a.bin"), Some(("/files/".into(), "/files/a.bin".into())));
        assert_eq!(found("/|/a|b.bin"), Some(("/".into(), "/a|b.bin".into())));
        assert_eq!(
            found("DL.example.com/files|/files/x"),
            Some(("DL.example.com/files".into(), "/files/x".into()))
        );
        for key in ["/files/|/a.bin", "/|/a/../b", "/|a", "/files/", "other|/a", ""] {
            assert_eq!(found(key), None, "{key}");
        }
    }

    #[test]
    fn longest_prefix_and_host_win() {
        assert_eq!(route(None, "/files/a.bin"), ("files".into(), "/base/a.bin".into()));
        assert_eq!(route(None, "/files/big/a.bin"), ("big".into(), "/base/files/big/a.bin".into()));
        assert_eq!(route(None, "/filesystem"), ("root".into(), "/base/filesystem".into()));
        assert_eq!(
            route(Some("dl.example.com"), "/files/big/x"),
            ("host".into(), "/base/big/x".into())
        );
        assert_eq!(route(Some("other"), "/files/x"), ("files".into(), "/base/x".into()));
        assert_eq!(route(None, "/files"), ("files".into(), "/base/".into()));
    }
}
