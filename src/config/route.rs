//! `[[routes]]` and their middleware entries.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::cache::{self, RouteCache};
use super::host::split_host_port;
use super::read::{Ctx, Field, Read, Table, suggest};
use super::s3::{self, S3ClientKeys};
use super::tree::{Kind, Node, Origin};

const MAX_PATH_PREFIX_LEN: usize = 1024;
/// How long a download begun with a presigned URL may resume after it expired, by default.
const DEFAULT_PRESIGNED_GRACE: Duration = Duration::from_secs(24 * 3600);
const ROUTE_EXAMPLE: &str = "[[routes]] with path_prefix = \"/files/\" and upstream = \"origin\"";

/// One `[[routes]]`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RouteConfig {
    /// Matched against the request's host without its port; lower case (IPv6 in brackets).
    /// `None` matches any host.
    pub host: Option<String>,
    /// Starts with `/`; free of `..`, `//`, `%`, `\`, control characters and whitespace, so it can
    /// be compared with a normalised request path byte for byte.
    pub path_prefix: String,
    /// The name of an upstream defined in `[upstreams]`.
    pub upstream: String,
    /// Remove `path_prefix` before forwarding (`/files/a.bin` -> `/a.bin`). Default false.
    pub strip_prefix: bool,
    /// The stages, in order; empty for a passthrough route.
    pub middleware: Vec<MiddlewareSpec>,
    /// `s3_client_keys_file`: when set, only requests signed (SigV4) with one of these keys are
    /// served; others get 403.
    pub s3_client_keys: Option<S3ClientKeys>,
    /// `s3_presigned_grace`: how long after a presigned URL expired a download begun with it
    /// may still resume. Default 24h.
    pub s3_presigned_grace: Duration,
    /// `[routes.upstream_resume]`: continue a response whose origin fails mid-body. On, with
    /// the defaults, unless `upstream_resume = false`.
    pub upstream_resume: Option<UpstreamResume>,
    /// `s3_response_overrides`: let clients' `response-content-type`, `response-content-
    /// disposition` and the other `response-*` query parameters reach an S3 upstream, which
    /// then answers with the headers they name. Default false: any client could otherwise make
    /// an object be served as, say, `text/html` inline from rangeway's host.
    pub s3_response_overrides: bool,
    /// `cache`: how the route uses `[cache]`; `None`: it does not. Without the key, on when there
    /// is a `[cache]` and the route's upstream is not a local folder.
    pub cache: Option<RouteCache>,
    /// `[routes.signed_links]`: when set, only signed links are served (`crate::links`).
    pub signed_links: Option<super::links::SignedLinks>,
    /// `[routes.download_limits]`: how many downloads may be under way at once.
    pub download_limits: Option<super::limits::DownloadLimits>,
    /// `[routes.rate_limit]`: how fast responses go out.
    pub rate_limit: Option<super::rate::RateLimit>,
}

/// What a route's defaults depend on outside it.
#[derive(Debug, Default)]
pub(super) struct RouteContext<'a> {
    /// The upstreams' names; `None` when `[upstreams]` itself is broken.
    pub(super) declared: Option<&'a BTreeSet<String>>,
    /// The upstreams that are local folders.
    pub(super) folders: BTreeSet<String>,
    /// Whether there is a `[cache]`.
    pub(super) cache: bool,
}

/// How rangeway continues a response whose origin connection fails mid-body: it asks for the
/// rest (`Range: bytes=N-`, `If-Match` on the strong ETag) and goes on sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamResume {
    /// Continuations one response may use, 1..=100. Default 5.
    pub attempts: u32,
    /// The most time one response may spend waiting for continuations. Default 30s.
    pub deadline: Duration,
    /// The wait before the first continuation, doubled for each next one (at most 5s).
    /// Default 100ms.
    pub backoff: Duration,
}

impl UpstreamResume {
    /// One try, however long it takes: what a fetch made once is bounded by.
    pub const ONCE: Self = Self { attempts: 1, deadline: Duration::MAX, backoff: Duration::ZERO };
}

impl Default for UpstreamResume {
    fn default() -> Self {
        Self { attempts: 5, deadline: Duration::from_secs(30), backoff: Duration::from_millis(100) }
    }
}

/// `upstream_resume = true` (the defaults), `= false` (off), or a table of settings.
fn read_upstream_resume(ctx: &mut Ctx<'_>, field: Field) -> Read<Option<UpstreamResume>> {
    let header = format!("[{}]", field.path);
    let example = "[routes.upstream_resume] with attempts = 5";
    // An environment variable is text: RANGEWAY__ROUTES__0__UPSTREAM_RESUME=false reads as the
    // bare word would in the file.
    let switch = matches!(
        (&field.node.kind, field.origin()),
        (Kind::Bool(_), _) | (Kind::Str(_), Origin::Env(_))
    );
    if switch {
        return Ok(field.boolean(ctx)?.then(UpstreamResume::default));
    }
    let mut table = Table::new(ctx, &field.path, header, field.node, example)?;
    let defaults = UpstreamResume::default();
    let attempts =
        table.take("attempts").map_or(Ok(defaults.attempts), |f| f.integer(ctx, 1..=100, "5"));
    let deadline = table.take("deadline").map_or(Ok(defaults.deadline), |f| {
        f.duration(
            ctx,
            Duration::from_millis(1)..=Duration::from_secs(3600),
            "from \"1ms\" to \"1h\"",
        )
    });
    let backoff = table.take("backoff").map_or(Ok(defaults.backoff), |f| {
        f.duration(ctx, Duration::ZERO..=Duration::from_secs(5), "from \"0s\" to \"5s\"")
    });
    table.finish(ctx);
    Ok(Some(UpstreamResume { attempts: attempts?, deadline: deadline?, backoff: backoff? }))
}

/// A middleware entry as written: its kind is known to the stage registry (checked at load time),
/// its options are left for that stage to parse.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MiddlewareSpec {
    pub kind: String,
    /// Every key of the entry but `kind`. Each value's origin names the config file or the
    /// environment variable that set it.
    pub options: BTreeMap<String, ::config::Value>,
    /// Where the entry is, for the stage's own errors: `routes[1].middleware[0]`.
    pub path: String,
}

/// Reads `[[routes]]`, checking upstream references against `declared` (every upstream name
/// written, including ones with errors of their own; `None` when `[upstreams]` was unreadable,
/// which is reported already).
pub(super) fn read_all(
    ctx: &mut Ctx<'_>,
    node: Option<Node>,
    around: &RouteContext<'_>,
) -> Read<Vec<RouteConfig>> {
    let Some(node) = node else {
        return Err(ctx.report_at(
            "routes",
            "no routes are defined, so every request would be answered 404",
            format!("add {ROUTE_EXAMPLE}"),
        ));
    };
    let items = match node.kind {
        Kind::Array(items) if items.is_empty() => {
            return Err(ctx.report(
                "routes",
                &node.origin,
                "is empty, so every request would be answered 404",
                format!("add {ROUTE_EXAMPLE}"),
            ));
        }
        Kind::Array(items) => items,
        _ => {
            return Err(ctx.report(
                "routes",
                &node.origin,
                format!("expected an array of tables, found {}", node.type_name()),
                format!("write each route as {ROUTE_EXAMPLE}"),
            ));
        }
    };
    let mut routes = Ok(Vec::with_capacity(items.len()));
    // (host, prefix without its trailing '/') -> index of the first route that claimed it.
    let mut claimed: BTreeMap<(Option<String>, String), usize> = BTreeMap::new();
    for (index, item) in items.into_iter().enumerate() {
        let (claim, route) = read_one(ctx, index, item, around);
        if let Some(Claim { host, prefix }) = claim {
            let key = (host, prefix.trim_end_matches('/').to_owned());
            if let Some(&first) = claimed.get(&key) {
                let host = key.0.map_or("any host".to_owned(), |h| format!("host {h}"));
                routes = Err(ctx.report_at(
                    &format!("routes[{index}].path_prefix"),
                    format!(
                        "{prefix:?} on {host} overlaps routes[{first}] (prefixes that differ only \
                         by a trailing '/' match the same requests)"
                    ),
                    "remove one of the two routes, or give them different prefixes or hosts",
                ));
            } else {
                claimed.insert(key, index);
            }
        }
        match (&mut routes, route) {
            (Ok(list), Ok(route)) => list.push(route),
            (_, Err(reported)) => routes = Err(reported),
            (Err(_), Ok(_)) => {}
        }
    }
    routes
}

/// The requests a route matches, known as soon as its host and prefix are valid, so overlaps are
/// found even while the route's other fields are wrong.
struct Claim {
    host: Option<String>,
    prefix: String,
}

fn read_one(
    ctx: &mut Ctx<'_>,
    index: usize,
    node: Node,
    around: &RouteContext<'_>,
) -> (Option<Claim>, Read<RouteConfig>) {
    let declared = around.declared;
    let path = format!("routes[{index}]");
    let mut table = match Table::new(ctx, &path, "[[routes]]", node, ROUTE_EXAMPLE) {
        Ok(table) => table,
        Err(reported) => return (None, Err(reported)),
    };
    let path_prefix = match table.take("path_prefix") {
        Some(field) => read_path_prefix(ctx, field),
        None => Err(ctx.report_at(
            &format!("{path}.path_prefix"),
            "is missing",
            "add path_prefix = \"/files/\"",
        )),
    };
    let host = table.take("host").map(|f| read_host(ctx, f)).transpose();
    let upstream = match table.take("upstream") {
        Some(field) => read_upstream(ctx, field, declared),
        None => Err(ctx.report_at(
            &format!("{path}.upstream"),
            "is missing",
            match declared.and_then(|d| Some((d.iter().next()?, d))) {
                Some((name, all)) => format!("add upstream = \"{name}\" (defined: {})", list(all)),
                None => "define an upstream in [upstreams.NAME] and name it here".to_owned(),
            },
        )),
    };
    let strip_prefix = table.take("strip_prefix").map_or(Ok(false), |f| f.boolean(ctx));
    let middleware = table.take("middleware").map_or(Ok(Vec::new()), |f| read_middleware(ctx, f));
    if let Ok(specs) = &middleware {
        // What each stage accepts is checked here, with everything else, so that `rangeway
        // check` reports a bad option beside, say, an unknown upstream.
        super::chains::check(ctx, &path, specs);
    }
    let s3_client_keys =
        table.take("s3_client_keys_file").map(|f| s3::read_client_keys(ctx, f)).transpose();
    let s3_presigned_grace = match table.take("s3_presigned_grace") {
        None => Ok(DEFAULT_PRESIGNED_GRACE),
        Some(field) if matches!(s3_client_keys, Ok(None)) => Err(ctx.report(
            &field.path,
            field.origin(),
            "has no effect without s3_client_keys_file",
            "add s3_client_keys_file, or remove this key",
        )),
        Some(field) => field.duration(
            ctx,
            Duration::ZERO..=Duration::from_secs(30 * 24 * 3600),
            "from \"0s\" to \"30d\"",
        ),
    };
    // On unless a route turns it off: a body its origin breaks off is otherwise a broken
    // download, as through any other proxy.
    let upstream_resume = table
        .take("upstream_resume")
        .map_or(Ok(Some(UpstreamResume::default())), |f| read_upstream_resume(ctx, f));
    let s3_response_overrides =
        table.take("s3_response_overrides").map_or(Ok(false), |f| f.boolean(ctx));
    let signed_links = table.take("signed_links").map(|f| super::links::read(ctx, f)).transpose();
    let download_limits =
        table.take("download_limits").map(|f| super::limits::read(ctx, f)).transpose();
    let rate_limit = table.take("rate_limit").map(|f| super::rate::read(ctx, f)).transpose();
    let cache_field = table.take("cache");
    let cache = match (&cache_field, around.cache) {
        (Some(field), false) => Err(ctx.report(
            &field.path,
            field.origin(),
            "there is no [cache] for the route to use",
            "add [cache] with dir = \"/var/cache/rangeway\", or remove this key",
        )),
        _ => {
            let folder = upstream.as_ref().is_ok_and(|name| around.folders.contains(name));
            cache::read_route(ctx, cache_field, around.cache && !folder)
        }
    };
    table.finish(ctx);
    let claim = match (&host, &path_prefix) {
        (Ok(host), Ok(prefix)) => Some(Claim { host: host.clone(), prefix: prefix.clone() }),
        _ => None,
    };
    let route = host.and_then(|host| {
        Ok(RouteConfig {
            host,
            path_prefix: path_prefix?,
            upstream: upstream?,
            strip_prefix: strip_prefix?,
            middleware: middleware?,
            s3_client_keys: s3_client_keys?,
            s3_presigned_grace: s3_presigned_grace?,
            upstream_resume: upstream_resume?,
            s3_response_overrides: s3_response_overrides?,
            cache: cache?,
            signed_links: signed_links?,
            download_limits: download_limits?,
            rate_limit: rate_limit?,
        })
    });
    (claim, route)
}

fn list(names: &BTreeSet<String>) -> String {
    names.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

fn read_path_prefix(ctx: &mut Ctx<'_>, field: Field) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let prefix = field.string(ctx, "\"/files/\"")?;
    let problem = if !prefix.starts_with('/') {
        "does not start with '/'"
    } else if prefix.contains("..") {
        "contains '..'"
    } else if prefix.contains("//") {
        "contains '//'"
    } else if prefix.contains('%') {
        "contains '%' (write the decoded character; requests are matched after decoding)"
    } else if prefix.contains('\\') {
        "contains '\\'"
    } else if prefix.contains('\0') {
        "contains a NUL character"
    } else if prefix.split('/').any(|s| s == ".") {
        "has a '.' segment"
    } else if prefix.chars().any(|c| c.is_control() || c.is_whitespace() || c == '?' || c == '#') {
        "contains whitespace, a control character, '?' or '#'"
    } else if prefix.len() > MAX_PATH_PREFIX_LEN {
        "is longer than 1024 bytes"
    } else {
        return Ok(prefix);
    };
    Err(ctx.report(
        &path,
        &origin,
        format!("{prefix:?} {problem}"),
        "write a normalised path that starts with '/', e.g. \"/files/\"",
    ))
}

fn read_host(ctx: &mut Ctx<'_>, field: Field) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let text = field.string(ctx, "\"dl.example.com\"")?;
    match split_host_port(&text) {
        Ok((host, None)) => Ok(host.to_string()),
        Ok((host, Some(_))) => Err(ctx.report(
            &path,
            &origin,
            format!("{text:?} has a port"),
            format!("write host = \"{host}\": hosts are matched without the port"),
        )),
        Err(e) => Err(ctx.report(
            &path,
            &origin,
            format!("{text:?} is not a host: {e}"),
            "write a DNS name or an IP address, e.g. host = \"dl.example.com\"",
        )),
    }
}

fn read_upstream(
    ctx: &mut Ctx<'_>,
    field: Field,
    declared: Option<&BTreeSet<String>>,
) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let name = field.string(ctx, "\"origin\"")?;
    let Some(declared) = declared.filter(|d| !d.contains(&name)) else {
        return Ok(name);
    };
    let fix = if declared.is_empty() {
        format!("define [upstreams.{name}] with url = \"http://...\" or dir = \"...\"")
    } else {
        let define = format!("define [upstreams.{name}], or use one of: {}", list(declared));
        match suggest(&name, declared.iter().map(String::as_str)) {
            Some(near) => format!("did you mean \"{near}\"? Otherwise {define}"),
            None => define,
        }
    };
    Err(ctx.report(&path, &origin, format!("no upstream named {name:?}"), fix))
}

fn read_middleware(ctx: &mut Ctx<'_>, field: Field) -> Read<Vec<MiddlewareSpec>> {
    let Field { path, node, .. } = field;
    let items = match node.kind {
        Kind::Array(items) => items,
        _ => {
            return Err(ctx.report(
                &path,
                &node.origin,
                format!("expected an array of tables, found {}", node.type_name()),
                "write middleware = [] for none, or one [[routes.middleware]] table per stage",
            ));
        }
    };
    let mut specs = Ok(Vec::with_capacity(items.len()));
    for (index, item) in items.into_iter().enumerate() {
        let spec = read_spec(ctx, format!("{path}[{index}]"), item);
        match (&mut specs, spec) {
            (Ok(list), Ok(spec)) => list.push(spec),
            (_, Err(reported)) => specs = Err(reported),
            (Err(_), Ok(_)) => {}
        }
    }
    specs
}

fn read_spec(ctx: &mut Ctx<'_>, path: String, node: Node) -> Read<MiddlewareSpec> {
    let mut table = Table::new(
        ctx,
        &path,
        "[[routes.middleware]]",
        node,
        "[[routes.middleware]] with kind = \"checksum\"",
    )?;
    let kind = table.take("kind");
    // Everything else is the stage's to parse; there are no unknown keys at this level.
    let options =
        table.drain().into_iter().map(|(key, node)| (key, node.to_value(ctx.file))).collect();
    let kind = match kind {
        Some(field) => read_kind(ctx, field)?,
        None => {
            return Err(ctx.report_at(
                &format!("{path}.kind"),
                "is missing",
                kind_fix(&ctx.known_kinds, "set kind to"),
            ));
        }
    };
    Ok(MiddlewareSpec { kind, options, path })
}

fn read_kind(ctx: &mut Ctx<'_>, field: Field) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let kind = field.string(ctx, "\"checksum\"")?;
    if ctx.known_kinds.contains(&kind.as_str()) {
        return Ok(kind);
    }
    let fix = match suggest(&kind, ctx.known_kinds.iter().copied()) {
        Some(near) => {
            format!("did you mean \"{near}\"? {}", kind_fix(&ctx.known_kinds, "Otherwise use"))
        }
        None => kind_fix(&ctx.known_kinds, "use"),
    };
    Err(ctx.report(&path, &origin, format!("unknown middleware kind {kind:?}"), fix))
}

/// `lead` followed by the kinds there are, or, when none are, how to do without.
fn kind_fix(known_kinds: &[&str], lead: &str) -> String {
    if known_kinds.is_empty() {
        return "no middleware kinds are built in yet: remove this entry (middleware = [])"
            .to_owned();
    }
    let mut kinds = known_kinds.to_vec();
    kinds.sort_unstable();
    kinds.dedup();
    format!("{lead} one of: {}", kinds.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_fixes() {
        assert_eq!(
            kind_fix(&[], "use"),
            "no middleware kinds are built in yet: remove this entry (middleware = [])"
        );
        assert_eq!(kind_fix(&["gzip", "checksum", "gzip"], "use"), "use one of: checksum, gzip");
    }
}
