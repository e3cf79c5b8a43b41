//! `[[routes]]`: what each serves from which upstream, and the tables of a route: its
//! middleware, `upstream_resume`, `cache`, `signed_links`, `download_limits` and `rate_limit`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ::config::Value;

use super::cache;
use super::chains;
use super::check::{Ctx, DAY, MS, Problem, complete, did_you_mean, push, read, secs, wrong};
use super::raw::{
    Raw, RawDownloadLimits, RawRateLimit, RawResume, RawRoute, RawSignedLinks, Tables,
};
use super::source::Path;
use crate::links::{LinkKeys, SignedLinks};
use crate::routes::{self, MiddlewareSpec, RateLimit, RouteConfig, UpstreamResume};
use crate::s3::credentials::S3ClientKeys;
use crate::state::{Count, DownloadLimits};

const ROUTE_EXAMPLE: &str = "[[routes]] with path_prefix = \"/files/\" and upstream = \"origin\"";
/// The slowest rate worth shaping to, and the fastest worth naming (bytes per second).
const RATES: std::ops::RangeInclusive<u64> = 1024..=(1 << 40);

/// What a route's defaults depend on outside it.
pub(super) struct RouteContext<'a> {
    /// The upstreams' names; `None` when `[upstreams]` itself is broken.
    pub(super) declared: Option<&'a BTreeSet<String>>,
    /// The upstreams that are local folders.
    pub(super) folders: BTreeSet<String>,
    /// Whether there is a `[cache]`.
    pub(super) cache: bool,
}

/// Checks `[[routes]]`, the upstream each names against `around.declared` (every upstream name
/// written, including ones with errors of their own, which are reported already).
pub(super) fn check_all(
    v: &mut Ctx<'_>,
    raw: Option<&Tables<RawRoute>>,
    around: &RouteContext<'_>,
) -> Option<Vec<RouteConfig>> {
    let at = Path::default().key("routes");
    let Some(raw) = raw else {
        let problem = "no routes are defined, so every request would be answered 404";
        return v.fail(&at, problem, format!("add {ROUTE_EXAMPLE}"));
    };
    let fix = format!("write each route as {ROUTE_EXAMPLE}");
    let items = v.shaped(&at, raw, "an array of tables", &fix)?;
    if items.is_empty() {
        let problem = "is empty, so every request would be answered 404";
        return v.fail(&at, problem, format!("add {ROUTE_EXAMPLE}"));
    }
    let (mut routes, mut claimed) = (Some(Vec::with_capacity(items.len())), BTreeMap::new());
    for (index, raw) in items.iter().enumerate() {
        routes = push(routes, check_one(v, &at.index(index), raw, around, &mut claimed));
    }
    routes
}

/// The route first to match a host (`None`: any) and a prefix without its trailing '/'.
type Claimed = BTreeMap<(Option<String>, String), Path>;

fn check_one(
    v: &mut Ctx<'_>,
    at: &Path,
    raw: &Raw<RawRoute>,
    around: &RouteContext<'_>,
    claimed: &mut Claimed,
) -> Option<RouteConfig> {
    let r = v.table(at, raw, ROUTE_EXAMPLE)?;
    let (key, declared) = (|key: &str| at.key(key), around.declared);
    let no_upstream = match declared.and_then(|d| Some((d.iter().next()?, d))) {
        Some((name, all)) => format!("add upstream = \"{name}\" (defined: {})", list(all)),
        None => "define an upstream in [upstreams.NAME] and name it here".to_owned(),
    };
    let named = |name: &str| upstream(name, declared);
    read! { v, at, r;
        path_prefix: parsed("\"/files/\"", routes::path_prefix)
            .need(v, &key("path_prefix"), "add path_prefix = \"/files/\"");
        host: parsed("\"dl.example.com\"", routes::host).opt();
        upstream: parsed("\"origin\"", named).need(v, &key("upstream"), no_upstream);
        strip_prefix: boolean().or(false);
    }
    let middleware = middleware(v, at, r.middleware.as_ref());
    let example = "\"/etc/rangeway/s3-clients\"";
    read! { v, at, r; s3_client_keys_file: parsed(example, S3ClientKeys::read_file).opt(); }
    let s3_presigned_grace = match (&r.s3_presigned_grace, &s3_client_keys_file) {
        (Some(_), Some(None)) => v.fail(
            &key("s3_presigned_grace"),
            "has no effect without s3_client_keys_file",
            "add s3_client_keys_file, or remove this key",
        ),
        (value, _) => {
            let range = Duration::ZERO..=secs(30 * DAY);
            v.duration(&key("s3_presigned_grace"), value, range).or(secs(DAY))
        }
    };
    // On unless a route turns it off: a body its origin breaks off is otherwise a broken
    // download, as through any other proxy.
    let example = "[routes.upstream_resume] with attempts = 5";
    read! { v, at, r;
        upstream_resume: switch(true, example, resume);
        s3_response_overrides: boolean().or(false);
        signed_links: nested(signed_links).opt();
        download_limits: nested(download_limits).opt();
        rate_limit: nested(rate_limit).opt();
        methods: strings("a string", "[\"POST\", \"PUT\"]", routes::passed_method).or(Vec::new());
    }
    let methods = methods.map(routes::answered_methods);
    let cache = match (&r.cache, around.cache) {
        (Some(_), false) => v.fail(
            &key("cache"),
            "there is no [cache] for the route to use",
            "add [cache] with dir = \"/var/cache/rangeway\", or remove this key",
        ),
        // Without the key, a route uses the cache unless its upstream is a local folder (which a
        // cache would only copy).
        (value, _) => {
            let folder = upstream.as_ref().is_some_and(|name| around.folders.contains(name));
            let example = "[routes.cache] with revalidate = \"each-download\"";
            v.switch(&key("cache"), value, around.cache && !folder, example, cache::route)
        }
    };
    // Claimed even while the route's other keys are wrong, so that overlaps are found anyway.
    if let Some((host, prefix)) = host.clone().zip(path_prefix.as_ref()) {
        v.check(&key("path_prefix"), claim(claimed, at, host, prefix))?;
    }
    complete! { RouteConfig {
        host, path_prefix, upstream, strip_prefix, middleware, s3_presigned_grace, upstream_resume,
        s3_client_keys: s3_client_keys_file, s3_response_overrides, cache, signed_links,
        download_limits, rate_limit, methods,
    } }
}

/// The requests of `host` and `prefix`, for the route at `at` unless a route before it has them.
fn claim(
    claimed: &mut Claimed,
    at: &Path,
    host: Option<String>,
    prefix: &str,
) -> Result<(), Problem> {
    let key = (host.clone(), prefix.trim_end_matches('/').to_owned());
    let Some(first) = claimed.get(&key) else {
        claimed.insert(key, at.clone());
        return Ok(());
    };
    let host = host.map_or("any host".to_owned(), |h| format!("host {h}"));
    wrong(
        format!(
            "{prefix:?} on {host} overlaps {first} (prefixes that differ only by a trailing '/' \
             match the same requests)"
        ),
        "remove one of the two routes, or give them different prefixes or hosts",
    )
}

fn list(names: &BTreeSet<String>) -> String {
    names.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

/// The upstream a route names, when it is declared (or the declared names are unknown).
fn upstream(name: &str, declared: Option<&BTreeSet<String>>) -> Result<String, Problem> {
    let Some(declared) = declared.filter(|d| !d.contains(name)) else { return Ok(name.to_owned()) };
    let fix = if declared.is_empty() {
        format!("define [upstreams.{name}] with url = \"http://...\" or dir = \"...\"")
    } else {
        let define = format!("define [upstreams.{name}], or use one of: {}", list(declared));
        did_you_mean(name, declared.iter().map(String::as_str), define)
    };
    wrong(format!("no upstream named {name:?}"), fix)
}

fn resume(v: &mut Ctx<'_>, at: &Path, r: &RawResume) -> Option<UpstreamResume> {
    let d = UpstreamResume::default();
    read! { v, at, r;
        attempts: integer(1..=100, "5").or(d.attempts);
        deadline: duration(MS..=secs(3600)).or(d.deadline);
        backoff: duration(Duration::ZERO..=secs(5)).or(d.backoff);
    }
    complete! { UpstreamResume { attempts, deadline, backoff } }
}

/// The route's stages, and what each accepts checked here, with everything else, so that
/// `rangeway check` reports a bad option beside, say, an unknown upstream.
fn middleware(
    v: &mut Ctx<'_>,
    route: &Path,
    raw: Option<&Tables<BTreeMap<String, Value>>>,
) -> Option<Vec<MiddlewareSpec>> {
    let Some(raw) = raw else { return Some(Vec::new()) };
    let at = &route.key("middleware");
    let fix = "write middleware = [] for none, or one [[routes.middleware]] table per stage";
    let items = v.shaped(at, raw, "an array of tables", fix)?;
    let stages = v.stages;
    let known: Vec<&str> = stages.kinds().collect();
    let kind = |kind: &str| {
        if known.contains(&kind) {
            return Ok(kind.to_owned());
        }
        let fix = did_you_mean(kind, known.iter().copied(), kind_fix(&known, "use"));
        wrong(format!("unknown middleware kind {kind:?}"), fix)
    };
    let mut specs = Some(Vec::with_capacity(items.len()));
    for (index, raw) in items.iter().enumerate() {
        let at = at.index(index);
        let entry = v.table(&at, raw, "[[routes.middleware]] with kind = \"checksum\"");
        let spec = entry.and_then(|entry| {
            // Everything but `kind` is the stage's to parse; there are no unknown keys here.
            let options = entry.iter().filter(|(key, _)| *key != "kind");
            let options = options.map(|(key, value)| (key.clone(), v.option(&at.key(key), value)));
            let options = options.collect();
            let kind = v.parsed(&at.key("kind"), entry.get("kind"), "\"checksum\"", kind);
            let kind = kind.need(v, &at.key("kind"), kind_fix(&known, "set kind to"))?;
            Some(MiddlewareSpec { kind, options, path: at.to_string() })
        });
        specs = push(specs, spec);
    }
    if let Some(specs) = &specs {
        chains::check(v, route, specs);
    }
    specs
}

/// `lead` followed by the kinds there are (the registry lists each once, in order), or, when none
/// are, how to do without.
pub(super) fn kind_fix(known_kinds: &[&str], lead: &str) -> String {
    if known_kinds.is_empty() {
        return "no middleware kinds are built in yet: remove this entry (middleware = [])"
            .to_owned();
    }
    format!("{lead} one of: {}", known_kinds.join(", "))
}

fn signed_links(v: &mut Ctx<'_>, at: &Path, raw: &Raw<RawSignedLinks>) -> Option<SignedLinks> {
    let example = "\"/etc/rangeway/link-keys\"";
    let r = v.table(at, raw, &format!("[routes.signed_links] with keys_file = {example}"))?;
    let fix = format!("add keys_file = {example} (lines of `KEY_ID SECRET`)");
    read! { v, at, r;
        keys_file: parsed(example, LinkKeys::read_file).need(v, &at.key("keys_file"), fix);
        grace: duration(Duration::ZERO..=secs(30 * DAY)).or(secs(DAY));
    }
    complete! { SignedLinks { keys: keys_file, grace } }
}

fn download_limits(
    v: &mut Ctx<'_>,
    at: &Path,
    raw: &Raw<RawDownloadLimits>,
) -> Option<DownloadLimits> {
    let r = v.table(at, raw, "[routes.download_limits] with per_client = 10")?;
    let counts = [("download", Count::Download), ("request", Count::Request)];
    let fix = "use \"download\" (each download once, however many pieces) or \"request\"";
    let (example, what) = ("\"download\"", "what a limit counts");
    read! { v, at, r;
        per_client: integer(1..=1_000_000, "10").opt();
        per_route: integer(1..=1_000_000, "10").opt();
        count: choice(example, &counts, what, fix).or(Count::Download);
    }
    let limits = complete! { DownloadLimits { per_client, per_route, count } }?;
    if limits.per_client.is_none() && limits.per_route.is_none() {
        let fix = "add per_client = 10 or per_route = 1000, or remove the table";
        return v.fail(at, "sets no limit", fix);
    }
    Some(limits)
}

fn rate_limit(v: &mut Ctx<'_>, at: &Path, raw: &Raw<RawRateLimit>) -> Option<RateLimit> {
    let r = v.table(at, raw, "[routes.rate_limit] with rate = \"2MiB\" (bytes per second)")?;
    let per_second = "\"2MiB\" (per second)";
    read! { v, at, r;
        rate: size(RATES, per_second).opt();
        per_client: size(RATES, per_second).opt();
        per_route: size(RATES, per_second).opt();
        after: size(0..=(1 << 50), "\"4MiB\"").or(0);
        origin_header: parsed("\"X-Accel-Limit-Rate\"", RateLimit::origin_header).opt();
    }
    let limit = complete! { RateLimit { rate, after, per_client, per_route, origin_header } }?;
    let rates = [limit.rate, limit.per_client, limit.per_route];
    if rates.iter().all(Option::is_none) && limit.origin_header.is_none() {
        return v.fail(
            at,
            "sets no rate",
            "add rate = \"2MiB\" (per response, per second), per_client or per_route, or remove the table",
        );
    }
    Some(limit)
}
