//! `[upstreams.NAME]`: HTTP(S) origins, their replicas, local folders and S3-compatible stores.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ::config::Value;

use super::check::{Ctx, DAY, Got, MS, complete, folder, push, read, secs};
use super::raw::{Raw, RawHealthCheck, RawUpstream};
use super::source::{Path, bare};
use crate::routes::upstream::{
    Addressing, HealthCheck, HttpUpstream, S3Upstream, UpstreamConfig, UpstreamKind, UpstreamTls,
};
use crate::s3::credentials::{self, S3Credentials};
use crate::s3::names;
use crate::values::http_url::{HttpUrl, URL_EXAMPLE};
use crate::values::secret::SecretVar;

/// Reports each key of `r` named that is written: `{key} {problem}`, with `fix`.
macro_rules! refuse {
    ($v:ident, $at:ident, $r:ident: $($key:ident),+; $problem:expr, $fix:expr) => {
        for (key, value) in [$((stringify!($key), &$r.$key)),+] {
            if value.is_some() {
                $v.report(&$at.key(key), format!("{key} {}", $problem), $fix);
            }
        }
    };
}

/// Reads `[upstreams]`. Also returns every name declared, valid or not, so that a route naming an
/// upstream whose settings are wrong is not reported a second time as naming a missing one; `None`
/// when `upstreams` is not even a table, so names cannot be checked at all.
pub(super) fn check_all(
    v: &mut Ctx<'_>,
    raw: Option<&Raw<BTreeMap<String, Raw<RawUpstream>>>>,
) -> (Option<BTreeMap<String, UpstreamConfig>>, Option<BTreeSet<String>>) {
    let at = Path::default().key("upstreams");
    let Some(raw) = raw else { return (Some(BTreeMap::new()), Some(BTreeSet::new())) };
    let example = format!("[upstreams.origin] with url = {URL_EXAMPLE}");
    let Some(entries) = v.table(&at, raw, &example) else { return (None, None) };
    let mut upstreams = Some(BTreeMap::new());
    let mut lowercase_names: BTreeMap<String, &str> = BTreeMap::new();
    for (name, raw) in entries {
        let at = at.key(name);
        let name_ok = if !bare(name) {
            v.fail(
                &at,
                format!("{name:?} is not a valid upstream name"),
                "use letters, digits, '_' and '-' only, e.g. [upstreams.origin]",
            )
        } else if let Some(other) = lowercase_names.insert(name.to_ascii_lowercase(), name) {
            // Environment overrides are matched ignoring case, so two names differing only in case
            // could not be told apart there.
            v.fail(
                &at,
                format!("differs from upstreams.{other} only in case"),
                "rename one of them: environment overrides cannot tell them apart",
            )
        } else {
            Some(())
        };
        let upstream = name_ok.and(check_one(v, &at, name, raw));
        upstreams = push(upstreams, upstream.map(|upstream| (name.clone(), upstream)));
    }
    (upstreams, Some(entries.keys().cloned().collect()))
}

fn check_one(
    v: &mut Ctx<'_>,
    at: &Path,
    name: &str,
    raw: &Raw<RawUpstream>,
) -> Option<UpstreamConfig> {
    let r = v.table(at, raw, &format!("[upstreams.{name}] with url = {URL_EXAMPLE}"))?;
    read! { v, at, r;
        connect_timeout: duration(MS..=secs(300)).or(secs(5));
        read_timeout: duration(MS..=secs(DAY)).or(secs(60));
        write_timeout: duration(MS..=secs(DAY)).or(secs(60));
        idle_timeout: duration(MS..=secs(DAY)).or(secs(60));
    }
    if r.bucket.is_none() {
        // Checked first, so that a stray S3 key is reported however the rest reads.
        let fix = "add bucket = \"NAME\" (with url = the S3 endpoint) to make this an S3 upstream, \
                   or remove it";
        refuse!(v, at, r: region, addressing, key_prefix, access_key_env, secret_key_env,
            session_token_env, credentials_file, profile, anonymous;
            "applies to S3 upstreams only", fix);
    }
    read! { v, at, r; health_check: nested(health_check).opt(); }
    let kind = kind(v, at, r);
    let (kind, health_check) = (kind?, health_check?);
    if let (UpstreamKind::Dir { .. }, Some(_)) = (&kind, &health_check) {
        return v.fail(
            &at.key("health_check"),
            "a dir upstream is a local folder, with nothing to check",
            "remove health_check",
        );
    }
    let (name, kind, health_check) = (Some(name.to_owned()), Some(kind), Some(health_check));
    complete! { UpstreamConfig {
        name, kind, connect_timeout, read_timeout, write_timeout, idle_timeout, health_check,
    } }
}

/// What the upstream is: its `urls` (replicas of one origin), its `url` (with `bucket`, an S3
/// store) or its `dir`. A `url` is read as a list of one.
fn kind(v: &mut Ctx<'_>, at: &Path, r: &RawUpstream) -> Option<UpstreamKind> {
    let (key, s3) = (|key: &str| at.key(key), r.bucket.is_some());
    let example = "[\"http://10.0.0.1:9000\", \"http://10.0.0.2:9000\"]";
    let urls = match (&r.urls, &r.url, &r.dir) {
        (Some(urls), None, None) => {
            if s3 {
                let fix = "use url = the S3 endpoint";
                v.report(&key("urls"), "an S3 upstream has one endpoint", fix);
            }
            v.strings(&key("urls"), urls, "a url string", example, HttpUrl::parse)
        }
        (None, Some(url), None) => {
            v.parsed(&key("url"), url, URL_EXAMPLE, HttpUrl::parse).then(|url| Some(vec![url]))
        }
        (None, None, Some(dir)) => return dir_kind(v, at, r, dir),
        (Some(_), _, _) => {
            let fix = "keep urls (every replica) and remove url";
            return v.fail(&key("urls"), "urls cannot be combined with url or dir", fix);
        }
        (None, Some(_), Some(_)) => {
            let fix = "keep one: url for an HTTP(S) origin, dir for a local folder";
            return v.fail(at, "has both url and dir", fix);
        }
        (None, None, None) => return v.fail(
            at,
            "has neither url nor dir",
            format!(
                "add url = {URL_EXAMPLE} for an HTTP(S) origin, or dir = \"./data\" for a local folder"
            ),
        ),
    };
    // Until the urls are good, which are https is unknown, and so whether the TLS keys apply:
    // they are checked once the urls are fixed.
    let tls = match &urls {
        Got::Good(urls) => tls_keys(v, at, r, urls.iter().any(|url| url.tls)),
        _ => Some(UpstreamTls::default()),
    };
    if s3 && r.urls.is_none() {
        let url = urls.ok().and_then(|mut urls| urls.pop());
        let endpoint = url.zip(tls).map(|(url, tls)| HttpUpstream::new(url, &tls, None));
        return s3_upstream(v, at, r, endpoint).map(UpstreamKind::S3);
    }
    let header = "\"origin.example.com\"";
    read! { v, at, r; host_header: parsed(header, HttpUpstream::host_header).opt(); }
    let mut urls = urls.or(Vec::new())?;
    if urls.is_empty() {
        let fix = format!("write urls = {example}");
        return v.fail(&key("urls"), "expected a non-empty list of urls", fix);
    }
    if urls.windows(2).any(|pair| pair[0].base_path != pair[1].base_path) {
        return v.fail(
            &key("urls"),
            "the urls have different paths",
            "give every replica the same path (or none): a route's paths are written under it",
        );
    }
    let (tls, host_header) = (tls?, host_header?);
    let http = |url| HttpUpstream::new(url, &tls, host_header.clone());
    match r.urls {
        Some(_) => Some(UpstreamKind::Replicas(urls.into_iter().map(http).collect())),
        None => urls.pop().map(http).map(UpstreamKind::Http),
    }
}

/// A `dir` upstream, unless it has `bucket`.
fn dir_kind(v: &mut Ctx<'_>, at: &Path, r: &RawUpstream, dir: &Value) -> Option<UpstreamKind> {
    if r.bucket.is_some() {
        return v.fail(
            at,
            "has bucket but dir instead of url",
            "an S3 upstream needs url = the S3 endpoint; remove bucket to serve a local folder",
        );
    }
    let fix = "remove it: a dir upstream reads local files";
    refuse!(v, at, r: ca_file, insecure_skip_verify, sni, host_header;
        "applies to url upstreams only, not to dir", fix);
    let fix = "point dir at a folder, or at a path where one can be created";
    let path = v.parsed(&at.key("dir"), dir, "\"./data\"", |dir| folder(dir, fix, true)).ok();
    path.map(|path| UpstreamKind::Dir { path })
}

fn health_check(v: &mut Ctx<'_>, at: &Path, raw: &Raw<RawHealthCheck>) -> Option<HealthCheck> {
    let r = v.table(at, raw, "[upstreams.NAME.health_check] with path = \"/healthz\"")?;
    let range = Duration::from_millis(10)..=secs(3600);
    read! { v, at, r;
        path: parsed("\"/healthz\"", HealthCheck::path).or("/".to_owned());
        interval: duration(range.clone()).or(secs(5));
        timeout: duration(range).or(secs(2));
    }
    complete! { HealthCheck { path, interval, timeout } }
}

/// The TLS keys of an upstream; without an https url, each key present is a mistake.
fn tls_keys(v: &mut Ctx<'_>, at: &Path, r: &RawUpstream, https: bool) -> Option<UpstreamTls> {
    if !https {
        let fix = "remove it, or use an https:// url";
        refuse!(v, at, r: ca_file, insecure_skip_verify, sni; "applies to https:// urls only", fix);
        return Some(UpstreamTls::default());
    }
    read! { v, at, r;
        ca_file: parsed("\"/etc/rangeway/ca.pem\"", HttpUpstream::ca_file).opt();
        insecure_skip_verify: boolean().or(false);
        sni: parsed("\"origin.example.com\"", HttpUpstream::sni).opt();
    }
    complete! { UpstreamTls { ca_file, insecure_skip_verify, sni } }
}

/// An S3 upstream: `endpoint` is its `url`, already checked.
fn s3_upstream(
    v: &mut Ctx<'_>,
    at: &Path,
    r: &RawUpstream,
    endpoint: Option<HttpUpstream>,
) -> Option<S3Upstream> {
    let key = |key: &str| at.key(key);
    let fix =
        "remove it: rangeway sets Host from the url, the bucket and addressing (and signs it)";
    refuse!(v, at, r: host_header; "does not apply to S3 upstreams", fix);
    let styles = [("path", Addressing::Path), ("virtual-host", Addressing::VirtualHost)];
    let fix = "use \"path\" (https://endpoint/bucket/key) or \"virtual-host\" \
               (https://bucket.endpoint/key)";
    let what = "an addressing style";
    read! { v, at, r; addressing: choice("\"path\"", &styles, what, fix).or(Addressing::Path); }
    let virtual_host = addressing == Some(Addressing::VirtualHost);
    let bucket = |name: &str| names::bucket(name, virtual_host);
    read! { v, at, r; bucket: parsed("\"releases\"", bucket).ok(); }
    read! { v, at, r;
        region: parsed("\"us-east-1\"", names::region).or("us-east-1".to_owned());
        key_prefix: parsed("\"builds/2026\"", names::key_prefix).or(Vec::new());
    }
    let credentials = match v.boolean(&key("anonymous"), &r.anonymous).or(false) {
        Some(true) => {
            let fix = "remove it, or anonymous = true to sign requests with it";
            refuse!(v, at, r: access_key_env, secret_key_env, session_token_env, credentials_file,
                profile; "cannot be combined with anonymous = true", fix);
            Some(None)
        }
        Some(false) => credentials(v, at, r).map(Some),
        None => None,
    };
    let endpoint = endpoint?;
    if !endpoint.base_path.is_empty() {
        return v.fail(
            &key("url"),
            "an S3 endpoint url has no path",
            "write the endpoint alone (\"https://s3.example.com\"), the bucket in bucket = and a folder \
             of it in key_prefix =",
        );
    }
    if virtual_host && endpoint.host.parse::<std::net::IpAddr>().is_ok() {
        return v.fail(
            &key("url"),
            "virtual-host addressing needs a DNS name in the url, not an IP address",
            "use addressing = \"path\", or the endpoint's DNS name",
        );
    }
    let endpoint = Some(endpoint);
    complete! { S3Upstream { endpoint, bucket, region, addressing, key_prefix, credentials } }
}

/// Credentials, by the first source configured: `access_key_env`/`secret_key_env`, then
/// `credentials_file`, then the standard AWS environment variables, then the standard shared
/// credentials file.
fn credentials(v: &mut Ctx<'_>, at: &Path, r: &RawUpstream) -> Option<S3Credentials> {
    let key = |key: &str| at.key(key);
    let (access, secret) = match (&r.access_key_env, &r.secret_key_env) {
        (Some(access), Some(secret)) => (access, secret),
        (Some(_), None) | (None, Some(_)) => {
            let one = if r.access_key_env.is_some() { "access_key_env" } else { "secret_key_env" };
            return v.fail(
                &key(one),
                "access_key_env and secret_key_env go together",
                "set both, naming the variables that hold the key id and the secret",
            );
        }
        (None, None) => {
            refuse!(v, at, r: session_token_env; "needs access_key_env and secret_key_env",
                "set them too, or remove it");
            let profile = v.string(&key("profile"), &r.profile, "\"default\"").opt()?;
            let Some(file) = &r.credentials_file else {
                let env = |name: &str| v.env.vars.get(name)?.to_str().map(str::to_owned);
                return v.check(at, credentials::standard_credentials(env, profile));
            };
            let example = "\"/etc/rangeway/aws-credentials\"";
            let profile = profile.as_deref().unwrap_or("default");
            let read = |file: &str| {
                credentials::read_credentials_file(std::path::Path::new(file), profile)
            };
            return v.parsed(&key("credentials_file"), file, example, read).ok();
        }
    };
    let problem = "cannot be combined with access_key_env/secret_key_env";
    refuse!(v, at, r: credentials_file; problem, "keep one source of credentials");
    let problem = "names a section of a credentials file, and these credentials come from \
                   environment variables";
    let fix = "remove profile, or use credentials_file instead of access_key_env/secret_key_env";
    refuse!(v, at, r: profile; problem, fix);
    let mut read = |name: &str, value, var: &str, holds, otherwise| {
        let example = format!("{name} = \"RANGEWAY_S3_{var}\"");
        let key = SecretVar { example: &example, holds, source_hint: "", otherwise };
        v.secret(&at.key(name), value, &key)
    };
    const OTHERWISE: &str = "or use credentials_file, or anonymous = true for a public bucket";
    let access = read("access_key_env", access, "ACCESS_KEY_ID", "the access key id", OTHERWISE);
    let secret =
        read("secret_key_env", secret, "SECRET_ACCESS_KEY", "the secret access key", OTHERWISE);
    let otherwise = "or remove session_token_env for a long-term key";
    let token = r.session_token_env.as_ref().map_or(Some(None), |value| {
        read("session_token_env", value, "SESSION_TOKEN", "the session token", otherwise).map(Some)
    });
    let ((access_var, access_key_id), (secret_var, secret_access_key)) = (access?, secret?);
    Some(S3Credentials {
        access_key_id,
        secret_access_key,
        session_token: token?.map(|(_, token)| token),
        source: format!("environment variables {access_var}/{secret_var}"),
    })
}
