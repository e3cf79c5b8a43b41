//! `[upstreams.NAME]`: HTTP(S) origins and local folders.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use super::host::{Host, split_host_port};
use super::read::{Ctx, Field, Read, Table, key_path, read_small_file};
use super::s3::{self, S3Fields, S3Upstream};
use super::tree::{Kind, Node};

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(60);
const MIN_TIMEOUT: Duration = Duration::from_millis(1);
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_IO_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// CA bundles are a few hundred KiB; the cap only stops a mistyped path to a huge file from being
/// read whole.
const MAX_CA_FILE_LEN: u64 = 16 << 20;
const URL_EXAMPLE: &str = "\"http://127.0.0.1:9000\"";

/// One `[upstreams.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamConfig {
    /// The NAME, as routes refer to it: `[A-Za-z0-9_-]+`.
    pub name: String,
    pub kind: UpstreamKind,
    /// Default 5s. The timeouts apply to `dir` upstreams too: the proxy reaches their origin
    /// service over a local socket.
    pub connect_timeout: Duration,
    /// Default 60s.
    pub read_timeout: Duration,
    /// Default 60s.
    pub write_timeout: Duration,
    /// How long a pooled keep-alive connection may stay idle. Default 60s.
    pub idle_timeout: Duration,
    /// `[upstreams.NAME.health_check]`: probe every replica in the background.
    pub health_check: Option<HealthCheck>,
}

/// Active health checks of an upstream's replicas: a `GET` of `path` every `interval`; a replica
/// that does not answer 2xx within `timeout` gets no requests until it does again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthCheck {
    /// Starts with `/`. Default `/`.
    pub path: String,
    /// Default 5s.
    pub interval: Duration,
    /// Default 2s.
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamKind {
    /// An origin reached over HTTP or HTTPS (`url = ...`).
    Http(HttpUpstream),
    /// A local folder served as an origin (`dir = ...`). It need not exist yet: the server
    /// creates it. A relative path is relative to the working directory of the process.
    Dir { path: PathBuf },
    /// An S3-compatible store (`url = ...` with `bucket = ...`), whose requests rangeway signs.
    S3(S3Upstream),
    /// Replicas of one origin holding the same objects (`urls = [...]`): requests go round the
    /// healthy ones, and a body one of them breaks off may be continued from another.
    Replicas(Vec<HttpUpstream>),
}

/// An HTTP(S) origin, from `url = "http(s)://host[:port][/base]"`.
///
/// `ca_file`, `insecure_skip_verify` and `sni` are only ever set when `tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpUpstream {
    /// `https://`.
    pub tls: bool,
    /// A DNS name (lower case) or an IP address; IPv6 without brackets.
    pub host: String,
    /// The url's port, else 80 (http) or 443 (https).
    pub port: u16,
    /// Prefix of every upstream path: empty, or `/`-led without a trailing `/` (`/bucket`).
    pub base_path: String,
    /// A PEM bundle to verify the origin against instead of the system roots; checked at load
    /// time to be a readable file holding a certificate.
    pub ca_file: Option<PathBuf>,
    /// Verification off, whatever `ca_file` says (so a test can switch it off in one line): the
    /// proxy must log this loudly.
    pub insecure_skip_verify: bool,
    /// The TLS server name: `sni` if set, else the url's host when that is a DNS name. `None` for
    /// an IP address without `sni` (SNI cannot carry IP literals, RFC 6066; the certificate is
    /// then checked against the IP).
    pub sni: Option<String>,
    /// The Host header sent upstream: `host_header` if set, else the url's authority as written
    /// (`host[:port]`, IPv6 in brackets). Valid header text.
    pub host_header: String,
}

/// Reads `[upstreams]`. Also returns every name declared, valid or not, so that a route naming an
/// upstream whose settings are wrong is not reported a second time as naming a missing one; `None`
/// when `upstreams` is not even a table, so names cannot be checked at all.
pub(super) fn read_all(
    ctx: &mut Ctx<'_>,
    node: Option<Node>,
) -> (Read<BTreeMap<String, UpstreamConfig>>, Option<BTreeSet<String>>) {
    let Some(node) = node else {
        return (Ok(BTreeMap::new()), Some(BTreeSet::new()));
    };
    let mut table = match Table::new(
        ctx,
        "upstreams",
        "[upstreams]",
        node,
        "[upstreams.origin] with url = \"http://127.0.0.1:9000\"",
    ) {
        Ok(table) => table,
        Err(reported) => return (Err(reported), None),
    };
    let entries = table.drain();
    table.finish(ctx);
    let declared: BTreeSet<String> = entries.keys().cloned().collect();
    let mut upstreams = Ok(BTreeMap::new());
    let mut lowercase_names: BTreeMap<String, String> = BTreeMap::new();
    for (name, node) in entries {
        let path = key_path("upstreams", &name);
        let name_ok = check_name(ctx, &path, &name, &node, &mut lowercase_names);
        let upstream = read_one(ctx, &path, &name, node);
        match (&mut upstreams, name_ok, upstream) {
            (Ok(map), Ok(()), Ok(upstream)) => {
                map.insert(name, upstream);
            }
            (_, Err(reported), _) | (_, _, Err(reported)) => upstreams = Err(reported),
            (Err(_), Ok(()), Ok(_)) => {}
        }
    }
    (upstreams, Some(declared))
}

fn check_name(
    ctx: &mut Ctx<'_>,
    path: &str,
    name: &str,
    node: &Node,
    lowercase_names: &mut BTreeMap<String, String>,
) -> Read<()> {
    let valid = !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(ctx.report(
            path,
            &node.origin,
            format!("{name:?} is not a valid upstream name"),
            "use letters, digits, '_' and '-' only, e.g. [upstreams.origin]",
        ));
    }
    // Environment overrides are matched ignoring case (the `config` crate lowercases them), so two
    // names differing only in case could not be told apart there.
    if let Some(other) = lowercase_names.insert(name.to_ascii_lowercase(), name.to_owned()) {
        return Err(ctx.report(
            path,
            &node.origin,
            format!("differs from upstreams.{other} only in case"),
            "rename one of them: environment overrides cannot tell them apart",
        ));
    }
    Ok(())
}

fn read_one(ctx: &mut Ctx<'_>, path: &str, name: &str, node: Node) -> Read<UpstreamConfig> {
    let header = format!("[upstreams.{name}]");
    let mut table =
        Table::new(ctx, path, header.clone(), node, &format!("{header} with url = {URL_EXAMPLE}"))?;
    let url = table.take("url");
    let urls = table.take("urls");
    let dir = table.take("dir");
    let health_check = table.take("health_check");
    let ca_file = table.take("ca_file");
    let insecure_skip_verify = table.take("insecure_skip_verify");
    let sni = table.take("sni");
    let host_header = table.take("host_header");
    let s3_fields = S3Fields::take(&mut table);
    let mut timeout = |key, default, max, bounds: &str| {
        table.take(key).map_or(Ok(default), |f| f.duration(ctx, MIN_TIMEOUT..=max, bounds))
    };
    let connect_timeout = timeout(
        "connect_timeout",
        DEFAULT_CONNECT_TIMEOUT,
        MAX_CONNECT_TIMEOUT,
        "from \"1ms\" to \"5m\"",
    );
    let io_bounds = "from \"1ms\" to \"24h\"";
    let read_timeout = timeout("read_timeout", DEFAULT_IO_TIMEOUT, MAX_IO_TIMEOUT, io_bounds);
    let write_timeout = timeout("write_timeout", DEFAULT_IO_TIMEOUT, MAX_IO_TIMEOUT, io_bounds);
    let idle_timeout = timeout("idle_timeout", DEFAULT_IO_TIMEOUT, MAX_IO_TIMEOUT, io_bounds);
    table.finish(ctx);

    let s3_fields = if s3_fields.bucket.is_some() {
        Some(s3_fields)
    } else {
        // Checked first, so that a stray S3 key is reported however the rest reads.
        s3_fields.refuse(ctx);
        None
    };
    let health_check = health_check.map(|f| read_health_check(ctx, f)).transpose();
    let kind = match (urls, url, dir, s3_fields) {
        (Some(urls), None, None, s3) => {
            if s3.is_some() {
                ctx.report(
                    &urls.path,
                    urls.origin(),
                    "an S3 upstream has one endpoint",
                    "use url = the S3 endpoint",
                );
            }
            read_replicas(ctx, urls, [ca_file, insecure_skip_verify, sni], host_header)
                .map(UpstreamKind::Replicas)
        }
        (Some(urls), _, _, _) => Err(ctx.report(
            &urls.path,
            urls.origin(),
            "urls cannot be combined with url or dir",
            "keep urls (every replica) and remove url",
        )),
        (None, Some(url), None, Some(s3_fields)) => {
            let endpoint = read_http(ctx, &url, [ca_file, insecure_skip_verify, sni]);
            s3::read(ctx, path, endpoint, Some(&url), s3_fields, host_header).map(UpstreamKind::S3)
        }
        (None, Some(url), None, None) => {
            let http = read_http(ctx, &url, [ca_file, insecure_skip_verify, sni]);
            let host_header = host_header.map(|f| read_host_header(ctx, f)).transpose();
            http.and_then(|mut http| {
                if let Some(host_header) = host_header? {
                    http.host_header = host_header;
                }
                Ok(UpstreamKind::Http(http))
            })
        }
        (None, None, Some(_), Some(_)) => Err(ctx.report_at(
            path,
            "has bucket but dir instead of url",
            "an S3 upstream needs url = the S3 endpoint; remove bucket to serve a local folder",
        )),
        (None, None, Some(dir), None) => {
            let http_only = [ca_file, insecure_skip_verify, sni, host_header];
            for field in http_only.into_iter().flatten() {
                ctx.report(
                    &field.path,
                    field.origin(),
                    format!("{} applies to url upstreams only, not to dir", field.key),
                    "remove it: a dir upstream reads local files",
                );
            }
            read_dir(ctx, dir)
        }
        (None, Some(_), Some(dir), _) => Err(ctx.report(
            path,
            dir.origin(),
            "has both url and dir",
            "keep one: url for an HTTP(S) origin, dir for a local folder",
        )),
        (None, None, None, _) => Err(ctx.report_at(
            path,
            "has neither url nor dir",
            format!(
                "add url = {URL_EXAMPLE} for an HTTP(S) origin, or dir = \"./data\" for a local \
                 folder"
            ),
        )),
    };
    let kind = kind?;
    let health_check = health_check?;
    if let (UpstreamKind::Dir { .. }, Some(_)) = (&kind, &health_check) {
        return Err(ctx.report_at(
            &key_path(path, "health_check"),
            "a dir upstream is a local folder, with nothing to check",
            "remove health_check",
        ));
    }
    Ok(UpstreamConfig {
        name: name.to_owned(),
        kind,
        connect_timeout: connect_timeout?,
        read_timeout: read_timeout?,
        write_timeout: write_timeout?,
        idle_timeout: idle_timeout?,
        health_check,
    })
}

fn read_health_check(ctx: &mut Ctx<'_>, field: Field) -> Read<HealthCheck> {
    let header = format!("[{}]", field.path);
    let mut table = Table::new(
        ctx,
        &field.path.clone(),
        header,
        field.node,
        "[upstreams.NAME.health_check] with path = \"/healthz\"",
    )?;
    let path = table.take("path").map_or(Ok("/".to_owned()), |f| {
        let (at, origin) = (f.path.clone(), f.origin().clone());
        let path = f.string(ctx, "\"/healthz\"")?;
        let valid =
            path.starts_with('/') && path.bytes().all(|b| b.is_ascii_graphic() && b != b'#');
        if valid {
            Ok(path)
        } else {
            Err(ctx.report(
                &at,
                &origin,
                format!("{path:?} is not a request path"),
                "write a path starting with '/', e.g. path = \"/healthz\"",
            ))
        }
    });
    let bounds = "from \"10ms\" to \"1h\"";
    let range = Duration::from_millis(10)..=Duration::from_secs(3600);
    let interval = table
        .take("interval")
        .map_or(Ok(Duration::from_secs(5)), |f| f.duration(ctx, range.clone(), bounds));
    let timeout = table
        .take("timeout")
        .map_or(Ok(Duration::from_secs(2)), |f| f.duration(ctx, range, bounds));
    table.finish(ctx);
    Ok(HealthCheck { path: path?, interval: interval?, timeout: timeout? })
}

/// `urls = [...]`: replicas of one origin. Their paths must agree (a route's paths are written
/// under it), the TLS keys apply to the https ones, and `host_header` to all.
fn read_replicas(
    ctx: &mut Ctx<'_>,
    urls: Field,
    [ca_file, insecure, sni]: [Option<Field>; 3],
    host_header: Option<Field>,
) -> Read<Vec<HttpUpstream>> {
    let example = "urls = [\"http://10.0.0.1:9000\", \"http://10.0.0.2:9000\"]";
    let items = match urls.node.kind {
        Kind::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(ctx.report(
                &urls.path,
                &urls.node.origin,
                "expected a non-empty list of urls",
                format!("write {example}"),
            ));
        }
    };
    let mut parsed = Vec::with_capacity(items.len());
    let mut failed = None;
    for (index, item) in items.into_iter().enumerate() {
        let at = format!("{}[{index}]", urls.path);
        let text = match item.kind {
            Kind::Str(text) => text,
            _ => {
                failed = Some(ctx.report(&at, &item.origin, "expected a url string", example));
                continue;
            }
        };
        match parse_http_url(&text) {
            Ok(url) => parsed.push(url),
            Err((problem, fix)) => failed = Some(ctx.report(&at, &item.origin, problem, fix)),
        }
    }
    let explicit_sni = sni.is_some();
    let first_https = parsed.iter().find(|u| u.tls).map(|u| u.host.clone());
    let tls = read_tls_keys(ctx, first_https.as_ref(), [ca_file, insecure, sni]);
    let host_header = host_header.map(|f| read_host_header(ctx, f)).transpose();
    if let Some(reported) = failed {
        return Err(reported);
    }
    if parsed.windows(2).any(|pair| pair[0].base_path != pair[1].base_path) {
        return Err(ctx.report(
            &urls.path,
            &urls.node.origin,
            "the urls have different paths",
            "give every replica the same path (or none): a route's paths are written under it",
        ));
    }
    let (tls, host_header) = (tls?, host_header?);
    Ok(parsed
        .into_iter()
        .map(|url| HttpUpstream {
            tls: url.tls,
            sni: match (url.tls, explicit_sni) {
                (false, _) => None,
                (true, true) => tls.sni.clone(),
                (true, false) => url.host.is_name().then(|| url.host.bare()),
            },
            ca_file: tls.ca_file.clone().filter(|_| url.tls),
            insecure_skip_verify: tls.insecure_skip_verify && url.tls,
            host: url.host.bare(),
            port: url.port,
            base_path: url.base_path,
            host_header: host_header.clone().unwrap_or(url.authority),
        })
        .collect())
}

fn read_http(ctx: &mut Ctx<'_>, url: &Field, tls_fields: [Option<Field>; 3]) -> Read<HttpUpstream> {
    let (url_path, url_origin) = (url.path.clone(), url.origin().clone());
    let parsed = url.text(ctx, URL_EXAMPLE).and_then(|text| {
        parse_http_url(&text)
            .map_err(|(problem, fix)| ctx.report(&url_path, &url_origin, problem, fix))
    });
    let tls = match &parsed {
        Ok(url) => read_tls_keys(ctx, url.tls.then_some(&url.host), tls_fields),
        // The scheme is unknown, so whether these apply is too; they are checked once the url
        // is fixed.
        Err(_) => Ok(Tls::default()),
    };
    let parsed = parsed?;
    let tls = tls?;
    Ok(HttpUpstream {
        tls: parsed.tls,
        host: parsed.host.bare(),
        port: parsed.port,
        base_path: parsed.base_path,
        ca_file: tls.ca_file,
        insecure_skip_verify: tls.insecure_skip_verify,
        sni: tls.sni,
        host_header: parsed.authority,
    })
}

/// The TLS settings of an https upstream; all unset for http.
#[derive(Default)]
struct Tls {
    ca_file: Option<PathBuf>,
    insecure_skip_verify: bool,
    sni: Option<String>,
}

/// The TLS keys of an upstream whose (first) https url has `host`; with no https url at all,
/// each key present is a mistake.
fn read_tls_keys(
    ctx: &mut Ctx<'_>,
    https_host: Option<&Host>,
    fields: [Option<Field>; 3],
) -> Read<Tls> {
    if let Some(host) = https_host {
        return read_tls(ctx, host, fields);
    }
    for field in fields.into_iter().flatten() {
        ctx.report(
            &field.path,
            field.origin(),
            format!("{} applies to https:// urls only", field.key),
            "remove it, or use an https:// url",
        );
    }
    Ok(Tls::default())
}

fn read_tls(
    ctx: &mut Ctx<'_>,
    host: &Host,
    [ca_file, insecure, sni]: [Option<Field>; 3],
) -> Read<Tls> {
    let ca_file = ca_file.map(|f| read_ca_file(ctx, f)).transpose();
    let insecure_skip_verify = insecure.map_or(Ok(false), |f| f.boolean(ctx));
    let sni = match sni {
        Some(field) => read_sni(ctx, field).map(Some),
        None => Ok(host.is_name().then(|| host.bare())),
    };
    Ok(Tls { ca_file: ca_file?, insecure_skip_verify: insecure_skip_verify?, sni: sni? })
}

fn read_ca_file(ctx: &mut Ctx<'_>, field: Field) -> Read<PathBuf> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let file = field.string(ctx, "\"/etc/rangeway/ca.pem\"")?;
    let fix = "point ca_file at a readable PEM file of CA certificates";
    let problem = match read_small_file(&file, MAX_CA_FILE_LEN) {
        Err(problem) => problem,
        Ok(pem) if !contains(&pem, b"-----BEGIN CERTIFICATE-----") => {
            format!("{file:?} holds no PEM certificate (no -----BEGIN CERTIFICATE----- line)")
        }
        Ok(_) => return Ok(PathBuf::from(file)),
    };
    Err(ctx.report(&path, &origin, problem, fix))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn read_sni(ctx: &mut Ctx<'_>, field: Field) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let text = field.string(ctx, "\"origin.example.com\"")?;
    match Host::parse(&text) {
        Ok(Host::Name(name)) => Ok(name),
        Ok(_) => Err(ctx.report(
            &path,
            &origin,
            format!("{text:?} is an IP address, which SNI cannot carry (RFC 6066)"),
            "use a DNS name, or remove sni to send none",
        )),
        Err(e) => Err(ctx.report(
            &path,
            &origin,
            format!("{text:?} is not a DNS name: {e}"),
            "write a DNS name, e.g. sni = \"origin.example.com\"",
        )),
    }
}

fn read_host_header(ctx: &mut Ctx<'_>, field: Field) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let text = field.string(ctx, "\"origin.example.com\"")?;
    match split_host_port(&text) {
        // A validated host and port are header-safe ASCII.
        Ok(_) => Ok(text),
        Err(e) => Err(ctx.report(
            &path,
            &origin,
            format!("{text:?} is not a host[:port]: {e}"),
            "write a host with an optional port, e.g. host_header = \"files.example.com\"",
        )),
    }
}

fn read_dir(ctx: &mut Ctx<'_>, field: Field) -> Read<UpstreamKind> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let dir = field.string(ctx, "\"./data\"")?;
    let fix = "point dir at a folder, or at a path where one can be created";
    if dir.is_empty() || dir.contains('\0') {
        return Err(ctx.report(&path, &origin, "is not a usable path", fix));
    }
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => Ok(UpstreamKind::Dir { path: dir.into() }),
        Ok(_) => {
            Err(ctx.report(&path, &origin, format!("{dir:?} exists but is not a directory"), fix))
        }
        // A missing folder is fine: the server creates it on start.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(UpstreamKind::Dir { path: dir.into() })
        }
        Err(e) => Err(ctx.report(&path, &origin, format!("{dir:?} cannot be inspected: {e}"), fix)),
    }
}

struct HttpUrl {
    tls: bool,
    host: Host,
    port: u16,
    /// `host[:port]` as written (host lower-cased, IPv6 in brackets), the default Host header.
    authority: String,
    base_path: String,
}

/// Parses `http(s)://host[:port][/base]`. Credentials, query and fragment are refused: the first
/// would be sent nowhere (and logged), the others cannot be prefixed to request paths.
///
/// The url is not repeated in messages, as it might carry credentials.
fn parse_http_url(text: &str) -> Result<HttpUrl, (String, String)> {
    let text = text.trim();
    let example = format!("write it as http(s)://HOST[:PORT][/BASE], e.g. {URL_EXAMPLE}");
    let Some((scheme, rest)) = text.split_once("://") else {
        let fix = if !text.contains('@')
            && Host::parse(text.split(['/', ':']).next().unwrap_or("")).is_ok()
        {
            format!("add the scheme: \"http://{text}\"")
        } else {
            example
        };
        return Err(("is not a URL (no scheme://)".to_owned(), fix));
    };
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "http" => false,
        "https" => true,
        s if s.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) => {
            return Err((
                format!("the scheme {s}:// is not supported"),
                "use http:// or https://; for a local folder use dir = \"...\" instead of url"
                    .to_owned(),
            ));
        }
        _ => return Err(("the scheme is not supported".to_owned(), example)),
    };
    let (rest, fragment) = rest.split_at(rest.find('#').unwrap_or(rest.len()));
    if !fragment.is_empty() {
        return Err((
            "has a #fragment, which is never sent to a server".to_owned(),
            "remove it".to_owned(),
        ));
    }
    let (rest, query) = rest.split_at(rest.find('?').unwrap_or(rest.len()));
    if !query.is_empty() {
        return Err((
            "has a ?query, which cannot be combined with request paths".to_owned(),
            "remove it; for credentials or signing use the upstream's own settings".to_owned(),
        ));
    }
    let (authority, base) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.contains('@') {
        return Err((
            "holds credentials (user:password@)".to_owned(),
            "remove them from the url; credentials in urls end up in logs".to_owned(),
        ));
    }
    let (host, port) = split_host_port(authority).map_err(|e| (e, example.clone()))?;
    let authority = match port {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    };
    let base_path = check_base_path(base).map_err(|e| (e, example))?;
    Ok(HttpUrl {
        tls,
        port: port.unwrap_or(if tls { 443 } else { 80 }),
        host,
        authority,
        base_path,
    })
}

/// The url's path, used as a prefix of every upstream request path. It must be in normal form, or
/// the proxy's path normalisation could be undone by it: no `.`/`..` or empty segments, only valid
/// percent-escapes, no characters that need escaping.
fn check_base_path(base: &str) -> Result<String, String> {
    let trimmed = base.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    for segment in trimmed.split('/').skip(1) {
        match segment {
            "" => return Err("the path has an empty segment (//)".to_owned()),
            "." | ".." => return Err("the path has a '.' or '..' segment".to_owned()),
            _ => {}
        }
    }
    let bytes = trimmed.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let allowed = b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@%".contains(&b);
        if !allowed {
            return Err("the path has a character that must be percent-encoded".to_owned());
        }
        if b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return Err("the path has a '%' that is not followed by two hex digits".to_owned());
        }
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls() {
        let url = parse_http_url("http://127.0.0.1:9000").map_err(|e| e.0).expect("valid");
        assert!(!url.tls);
        assert_eq!(
            (url.host.bare(), url.port, url.authority.as_str(), url.base_path.as_str()),
            ("127.0.0.1".into(), 9000, "127.0.0.1:9000", "")
        );

        let url = parse_http_url("HTTPS://S3.Example.com/bucket/").map_err(|e| e.0).expect("valid");
        assert!(url.tls);
        assert_eq!(
            (url.host.bare(), url.port, url.authority.as_str(), url.base_path.as_str()),
            ("s3.example.com".into(), 443, "s3.example.com", "/bucket")
        );

        let url = parse_http_url("http://[::1]:8000/a%20b/c").map_err(|e| e.0).expect("valid");
        assert_eq!(
            (url.host.bare(), url.port, url.authority.as_str(), url.base_path.as_str()),
            ("::1".into(), 8000, "[::1]:8000", "/a%20b/c")
        );

        let bad: &[(&str, &str)] = &[
            ("127.0.0.1:9000", "no scheme"),
            ("ftp://h", "scheme ftp:// is not supported"),
            ("s3://bucket", "scheme s3:// is not supported"),
            ("http://", "host is empty"),
            ("http://:80", "host is empty"),
            ("http://h:0", "port 0"),
            ("http://h:65536", "out of range"),
            ("http://h:x", "not a number"),
            ("http://h/a?x=1", "?query"),
            ("http://h/a#top", "#fragment"),
            ("http://u:p@h", "credentials"),
            ("http://h//a", "empty segment"),
            ("http://h/a/../b", "'..'"),
            ("http://h/a/./b", "'.'"),
            ("http://h/a%zz", "two hex digits"),
            ("http://h/a%2", "two hex digits"),
            ("http://h/a b", "percent-encoded"),
            ("http://h/a\\b", "percent-encoded"),
            ("http://h_.x-/", "starts or ends with '-'"),
        ];
        for &(text, want) in bad {
            let Err((problem, fix)) = parse_http_url(text) else {
                panic!("{text:?} parsed");
            };
            assert!(problem.contains(want), "{text:?}: {problem}");
            assert!(!fix.is_empty());
        }
        let Err((_, fix)) = parse_http_url("127.0.0.1:9000") else {
            panic!("parsed without scheme");
        };
        assert_eq!(fix, "add the scheme: \"http://127.0.0.1:9000\"");
    }

    #[test]
    fn url_errors_never_repeat_credentials() {
        for text in ["http://user:hunter2@h", "hunter2@h:1", "xx://hunter2@h", "ht tp://hunter2@h"]
        {
            let Err((problem, fix)) = parse_http_url(text) else {
                panic!("{text:?} parsed");
            };
            assert!(!problem.contains("hunter2") && !fix.contains("hunter2"), "{text:?}");
        }
    }
}
