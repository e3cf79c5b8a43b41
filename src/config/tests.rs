//! Loader tests: bad configs with the exact errors they must produce, good configs with the typed
//! values they must produce, environment overrides, the shipped config files, and secrecy.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rangeway_middleware::ByteRange;
use rangeway_middleware::chain::{
    Stage, StageContext, StageError, StageFactory, StageOptions, StagePlan, StageRegistry,
    StageState,
};

use super::source::Env;
use super::*;
use crate::admission::ClientLimits;
use crate::fingerprint::IdKeySource;
use crate::logging::LogFormat;
use crate::routes::upstream::{Addressing, HttpUpstream, S3Upstream};
use crate::routes::{Revalidate, RouteCache, UpstreamResume};
use crate::state::{Count, RedisTarget, StateBackend};
use crate::values::secret::Secret;

impl Env {
    fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let vars = pairs.into_iter().map(|(k, v)| (k.to_owned(), std::ffi::OsString::from(v)));
        Self { vars: vars.collect() }
    }
}

/// The stages the tests load configs with: the built-in ones.
fn kinds() -> StageRegistry {
    StageRegistry::new()
}

/// The built-in kinds, each accepting any options (a checksum stage in fact, under the kind's
/// name): for configs whose stages need what a test process cannot give them, a key in its
/// environment, where the test is about the loader's own reading. What the real stages check is
/// tested with them (here and in `tests/cli.rs`, which runs `rangeway check` with a key).
fn kinds_only() -> StageRegistry {
    let mut registry = StageRegistry::empty();
    for kind in StageRegistry::new().kinds() {
        let name: &'static str = Box::leak(kind.to_owned().into_boxed_str());
        registry
            .register(kind, move |_: &StageOptions| {
                Ok(std::sync::Arc::new(AnyOptions(name)) as std::sync::Arc<_>)
            })
            .expect("a built-in kind");
    }
    registry
}

/// A stage that passes its input on, under any kind's name.
#[derive(Debug)]
struct AnyOptions(&'static str);

impl StageFactory for AnyOptions {
    fn kind(&self) -> &str {
        self.0
    }
    fn identity(&self) -> &str {
        self.0
    }
    fn plan(
        &self,
        output: ByteRange,
        _: u64,
        _: &StageContext<'_>,
    ) -> Result<StagePlan, StageError> {
        Ok(StagePlan { input: output, skip: 0 })
    }
    fn output_len(&self, input_len: u64, _: &StageContext<'_>) -> Option<u64> {
        Some(input_len)
    }
    fn observes_only(&self) -> bool {
        true
    }
    fn start(
        &self,
        _: u64,
        _: Option<&StageState>,
        _: &StageContext<'_>,
    ) -> Result<Box<dyn Stage>, StageError> {
        Err(StageError::Other("a loader test's stage is not run".into()))
    }
}

const UPSTREAMS: &str = r#"
[upstreams.origin]
url = "http://127.0.0.1:9000"

[upstreams.local]
dir = "./data"
"#;

const ROUTE: &str = r#"
[[routes]]
path_prefix = "/files/"
upstream = "origin"
"#;

/// The example config of the design rangeway started from, verbatim: configs written from it
/// keep loading.
const DESIGN_EXAMPLE: &str = r#"
[server]
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:9090"      # /healthz, /metrics, /v1/downloads/{id}, /v1/objects?path=
# admin_token_env = "RANGEWAY_ADMIN_TOKEN"   # bearer token for the admin API when set

[state]
backend = "memory"                   # embedded default | "redis"
redis_url = "redis://127.0.0.1:6379/0"   # for "redis"; a cluster takes a list of nodes
ttl = "24h"

[upstreams.origin]
url = "http://127.0.0.1:9000"        # http(s)://host:port[/base]; https verified (ca_file = ... for a private CA)

[upstreams.local]
dir = "./data"                       # a local folder served as an origin (the embedded default uses this)

[[routes]]
path_prefix = "/files/"
upstream = "origin"
strip_prefix = true                  # /files/a.bin -> upstream /a.bin
middleware = []                      # passthrough: zero-copy

[[routes]]
path_prefix = "/secure/"
upstream = "origin"
strip_prefix = true
  [[routes.middleware]]
  kind = "checksum"                  # digests of the bytes at this point of the chain
  algorithms = ["sha256", "crc32"]
  [[routes.middleware]]
  kind = "gzip"
  level = 6
  block_size = 1048576
  [[routes.middleware]]
  kind = "aes128gcm"
  key_env = "RANGEWAY_KEY"           # or key_file; base64url key material; never logged
  record_size = 65553                 # 64 KiB of data per record
"#;

fn load_with(text: &str, env: &Env, kinds: &StageRegistry) -> Result<Config, ConfigErrors> {
    Config::from_sources(text, "test.toml", env, kinds)
}

/// `[state]`'s key for download ids, as a config with Redis needs one; [`load_ok`] sets the
/// variable.
const ID_KEY: &str = "id_key_env = \"RANGEWAY_ID_KEY\"\n";
const ID_KEY_VALUE: &str = "a-test-key-of-more-than-32-characters";

#[track_caller]
fn load_ok(text: &str) -> Config {
    let env = Env::from_pairs([("RANGEWAY_ID_KEY", ID_KEY_VALUE)]);
    load_with(text, &env, &kinds()).unwrap_or_else(|e| panic!("rejected:\n{e}"))
}

#[track_caller]
fn load_err(text: &str, env: &Env, kinds: &StageRegistry) -> ConfigErrors {
    match load_with(text, env, kinds) {
        Ok(config) => panic!("accepted: {config:#?}"),
        Err(errors) => errors,
    }
}

/// Asserts that loading yields exactly the expected errors: one per `(path, fragment)`, with that
/// path and the fragment somewhere in its `path: problem — fix` line. Exactness catches cascades
/// (one mistake reported several times) as well as misses.
#[track_caller]
fn expect_errors_with(text: &str, env: &Env, kinds: &StageRegistry, expected: &[(&str, &str)]) {
    let errors = load_err(text, env, kinds);
    for &(path, fragment) in expected {
        assert!(
            errors.errors().iter().any(|e| e.path == path && e.to_string().contains(fragment)),
            "no error at {path} containing {fragment:?} in:\n{errors}"
        );
    }
    assert_eq!(errors.errors().len(), expected.len(), "unexpected errors in:\n{errors}");
}

#[track_caller]
fn expect_errors(text: &str, expected: &[(&str, &str)]) {
    expect_errors_with(text, &Env::default(), &kinds(), expected);
}

/// A file or folder under the temp dir, removed on drop.
struct Temp(PathBuf);

impl Temp {
    fn path(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(std::env::temp_dir().join(format!("rangeway-config-{}-{n}-{tag}", std::process::id())))
    }

    fn file(tag: &str, contents: &[u8]) -> Self {
        let temp = Self::path(tag);
        std::fs::write(&temp.0, contents).expect("write temp file");
        temp
    }

    fn dir(tag: &str) -> Self {
        let temp = Self::path(tag);
        std::fs::create_dir(&temp.0).expect("create temp dir");
        temp
    }

    fn toml(&self) -> String {
        // A TOML basic string: escape what the temp dir might contain.
        format!("{:?}", self.0.display().to_string())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        // Best effort: a leftover file in the temp dir harms nothing.
        let _ = std::fs::remove_file(&self.0).or_else(|_| std::fs::remove_dir(&self.0));
    }
}

const PEM: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("test address")
}

fn http(config: &Config, name: &str) -> HttpUpstream {
    match &config.upstreams[name].kind {
        UpstreamKind::Http(http) => http.clone(),
        other => panic!("{name} is {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Good configs

#[test]
fn design_example_parses_to_typed_values() {
    let env = Env::from_pairs([("RANGEWAY_ID_KEY", ID_KEY_VALUE)]);
    let config = load_with(DESIGN_EXAMPLE, &env, &kinds_only()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.server.listen, addr("127.0.0.1:8080"));
    assert_eq!(config.server.admin_listen, addr("127.0.0.1:9090"));
    assert!(config.server.admin_token.is_none());
    assert_eq!(config.server.grace_period, Duration::from_secs(30));
    assert_eq!(config.server.max_ranges, 16);
    // An explicit backend wins over a redis_url that is present.
    assert_eq!(config.state.backend, StateBackend::Memory);
    assert_eq!(config.state.ttl, Duration::from_secs(86_400));
    assert_eq!(config.state.key_prefix, "rangeway:");
    assert_eq!(config.state.max_memory, 256 << 20);
    assert_eq!(config.state.max_client_memory, (256 << 20) / 100);

    let with_default_timeouts = |name: &str, kind| UpstreamConfig {
        name: name.to_owned(),
        kind,
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(60),
        write_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        health_check: None,
    };
    let expected = BTreeMap::from([
        (
            "origin".to_owned(),
            with_default_timeouts(
                "origin",
                UpstreamKind::Http(HttpUpstream {
                    tls: false,
                    host: "127.0.0.1".into(),
                    port: 9000,
                    base_path: String::new(),
                    ca_file: None,
                    insecure_skip_verify: false,
                    sni: None,
                    host_header: "127.0.0.1:9000".into(),
                }),
            ),
        ),
        (
            "local".to_owned(),
            with_default_timeouts("local", UpstreamKind::Dir { path: "./data".into() }),
        ),
    ]);
    assert_eq!(config.upstreams, expected);

    assert_eq!(config.routes.len(), 2);
    let files = &config.routes[0];
    assert_eq!(
        (files.host.as_deref(), files.path_prefix.as_str(), files.upstream.as_str()),
        (None, "/files/", "origin")
    );
    assert!(files.strip_prefix);
    assert!(files.middleware.is_empty());

    let secure = &config.routes[1];
    let kinds: Vec<&str> = secure.middleware.iter().map(|m| m.kind.as_str()).collect();
    assert_eq!(kinds, ["checksum", "gzip", "aes128gcm"]);
    let paths: Vec<&str> = secure.middleware.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(
        paths,
        ["routes[1].middleware[0]", "routes[1].middleware[1]", "routes[1].middleware[2]"]
    );
    let gzip = &secure.middleware[1].options;
    assert_eq!(gzip.keys().collect::<Vec<_>>(), ["block_size", "level"]);
    assert_eq!(gzip["level"].clone().into_int().ok(), Some(6));
    assert_eq!(gzip["block_size"].clone().into_int().ok(), Some(1_048_576));
    assert_eq!(gzip["level"].origin(), Some("test.toml"));
    let checksum = &secure.middleware[0].options;
    let algorithms: Vec<String> = checksum["algorithms"]
        .clone()
        .into_array()
        .expect("array")
        .into_iter()
        .map(|v| v.into_string().expect("string"))
        .collect();
    assert_eq!(algorithms, ["sha256", "crc32"]);
    let aes = &secure.middleware[2].options;
    assert_eq!(aes["key_env"].clone().into_string().ok().as_deref(), Some("RANGEWAY_KEY"));
    assert!(!aes.contains_key("kind"));
}

#[test]
fn dir_only_config_gets_the_defaults() {
    let config = load_ok(
        r#"
        [upstreams.local]
        dir = "./data"

        [[routes]]
        path_prefix = "/"
        upstream = "local"
        "#,
    );
    assert_eq!(config.server.listen, addr("127.0.0.1:8080"));
    assert_eq!(config.server.admin_listen, addr("127.0.0.1:9090"));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(config.server.threads.get(), cpus);
    assert_eq!(config.server.grace_period, Duration::from_secs(30));
    assert_eq!(config.server.max_ranges, 16);
    assert_eq!(config.state.backend, StateBackend::Memory);
    assert_eq!(config.state.ttl, Duration::from_secs(24 * 3600));
    assert_eq!(config.state.key_prefix, "rangeway:");
    assert_eq!(config.upstreams.len(), 1);
    let route = &config.routes[0];
    assert_eq!(route.path_prefix, "/");
    assert!(!route.strip_prefix);
    assert!(route.middleware.is_empty());
    assert!(route.host.is_none());
}

#[test]
fn every_field_set() {
    let ca = Temp::file("ca.pem", PEM);
    let id_key = Temp::file("id_key", b"0123456789abcdef0123456789abcdef\n");
    let text = format!(
        r#"
        [server]
        listen = "[::]:8443"
        admin_listen = "127.0.0.1:9443"
        threads = 3
        grace_period = "1m30s"
        max_ranges = 1000

        [state]
        backend = "redis"
        redis_url = "rediss://:pw@Redis.internal:6380/2?protocol=resp3"
        ttl = "7d"
        key_prefix = "rw:{{prod}}:"
        id_key_file = {id_key}

        [upstreams.s3]
        url = "https://S3.example.com:8443/bucket/"
        ca_file = {ca}
        sni = "Other.Example.com"
        host_header = "bucket.s3.example.com"
        connect_timeout = "2s"
        read_timeout = "5m"
        write_timeout = "10s"
        idle_timeout = "90s"

        [upstreams.ip]
        url = "https://10.0.0.7"
        insecure_skip_verify = true

        [[routes]]
        host = "DL.Example.com"
        path_prefix = "/files"
        upstream = "s3"
        strip_prefix = true

        [[routes]]
        host = "[::1]"
        path_prefix = "/files/"
        upstream = "ip"
        "#,
        ca = ca.toml(),
        id_key = id_key.toml(),
    );
    let config = load_ok(&text);
    let server = &config.server;
    assert_eq!(server.listen, addr("[::]:8443"));
    assert_eq!(server.threads.get(), 3);
    assert_eq!(server.grace_period, Duration::from_secs(90));
    assert_eq!(server.max_ranges, 1000);

    let StateBackend::Redis(RedisTarget::Single(redis)) = &config.state.backend else {
        panic!("{:?}", config.state.backend);
    };
    assert_eq!(redis.as_str(), "rediss://:pw@Redis.internal:6380/2?protocol=resp3");
    assert!(redis.tls());
    assert_eq!(redis.db(), 2);
    assert_eq!(redis.to_string(), "rediss://***@redis.internal:6380/2");
    assert_eq!(config.state.ttl, Duration::from_secs(7 * 86_400));
    assert_eq!(config.state.key_prefix, "rw:{prod}:");
    // The key without its newline; never shown.
    let IdKeySource::Configured(key) = &config.state.id_key else {
        panic!("{:?}", config.state.id_key);
    };
    assert_eq!(key.expose(), "0123456789abcdef0123456789abcdef");
    assert!(!format!("{config:?}").contains("0123456789abcdef"));

    assert_eq!(
        config.upstreams["s3"],
        UpstreamConfig {
            name: "s3".into(),
            kind: UpstreamKind::Http(HttpUpstream {
                tls: true,
                host: "s3.example.com".into(),
                port: 8443,
                base_path: "/bucket".into(),
                ca_file: Some(ca.0.clone()),
                insecure_skip_verify: false,
                sni: Some("other.example.com".into()),
                host_header: "bucket.s3.example.com".into(),
            }),
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(300),
            write_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            health_check: None,
        }
    );
    assert_eq!(
        http(&config, "ip"),
        HttpUpstream {
            tls: true,
            host: "10.0.0.7".into(),
            port: 443,
            base_path: String::new(),
            ca_file: None,
            insecure_skip_verify: true,
            sni: None,
            host_header: "10.0.0.7".into(),
        }
    );

    assert_eq!(config.routes[0].host.as_deref(), Some("dl.example.com"));
    assert_eq!(config.routes[1].host.as_deref(), Some("[::1]"));
}

#[test]
fn https_defaults_to_system_roots_and_the_host_as_sni() {
    let config =
        load_ok(&format!("[upstreams.origin]\nurl = \"https://origin.example.com\"\n{ROUTE}"));
    assert_eq!(
        http(&config, "origin"),
        HttpUpstream {
            tls: true,
            host: "origin.example.com".into(),
            port: 443,
            base_path: String::new(),
            ca_file: None,
            insecure_skip_verify: false,
            sni: Some("origin.example.com".into()),
            host_header: "origin.example.com".into(),
        }
    );
}

#[test]
fn insecure_skip_verify_is_kept_next_to_a_ca_file() {
    let ca = Temp::file("ca.pem", PEM);
    let config = load_ok(&format!(
        "[upstreams.origin]\nurl = \"https://localhost:8443\"\nca_file = {}\n\
         insecure_skip_verify = true\n{ROUTE}",
        ca.toml()
    ));
    let origin = http(&config, "origin");
    assert!(origin.insecure_skip_verify);
    assert_eq!(origin.ca_file.as_deref(), Some(ca.0.as_path()));
    assert_eq!(origin.sni.as_deref(), Some("localhost"));
}

#[test]
fn dir_upstreams_take_timeouts() {
    let config = load_ok(&format!(
        "[upstreams.origin]\ndir = \"./data\"\nconnect_timeout = \"250ms\"\nidle_timeout = \"1h\"\n{ROUTE}"
    ));
    let origin = &config.upstreams["origin"];
    assert_eq!(origin.kind, UpstreamKind::Dir { path: "./data".into() });
    assert_eq!(origin.connect_timeout, Duration::from_millis(250));
    assert_eq!(origin.read_timeout, Duration::from_secs(60));
    assert_eq!(origin.idle_timeout, Duration::from_secs(3600));
}

#[test]
fn redis_topologies() {
    let backend = |url: &str| {
        load_ok(&format!("[state]\n{ID_KEY}redis_url = {url}\n{UPSTREAMS}{ROUTE}")).state.backend
    };
    // Without `backend`, a redis_url means Redis.
    let StateBackend::Redis(RedisTarget::Single(one)) = backend("\"redis://127.0.0.1\"") else {
        panic!("not a single node");
    };
    assert_eq!(one.to_string(), "redis://127.0.0.1:6379/0");
    let StateBackend::Redis(RedisTarget::Cluster(seed)) = backend("\"redis+cluster://a:7000\"")
    else {
        panic!("not a cluster");
    };
    assert_eq!(seed.len(), 1);
    assert_eq!(seed[0].as_str(), "redis://a:7000");
    let StateBackend::Redis(RedisTarget::Cluster(nodes)) =
        backend("[\"rediss://a:7000\", \"rediss://b:7001/0\"]")
    else {
        panic!("not a cluster");
    };
    let shown: Vec<String> = nodes.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["rediss://a:7000/0", "rediss://b:7001/0"]);
}

#[test]
fn routes_may_share_a_prefix_on_different_hosts() {
    let config = load_ok(&format!(
        r#"{UPSTREAMS}
        [[routes]]
        path_prefix = "/files/"
        upstream = "origin"
        [[routes]]
        host = "a.example.com"
        path_prefix = "/files"
        upstream = "local"
        [[routes]]
        path_prefix = "/files/more/"
        upstream = "local"
        "#
    ));
    assert_eq!(config.routes.len(), 3);
}

#[test]
fn port_zero_listeners_may_coincide() {
    let config = load_ok(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{UPSTREAMS}{ROUTE}"
    ));
    assert_eq!(config.server.listen, config.server.admin_listen);
}

#[test]
fn admin_token_is_read_from_the_named_variable() {
    let env = Env::from_pairs([("RANGEWAY_ADMIN_TOKEN", "0123abcd-token")]);
    let text = format!("[server]\nadmin_token_env = \"RANGEWAY_ADMIN_TOKEN\"\n{UPSTREAMS}{ROUTE}");
    let config = load_with(&text, &env, &kinds()).unwrap_or_else(|e| panic!("{e}"));
    let token = config.server.admin_token.as_ref().expect("token");
    assert_eq!(token.env_var(), "RANGEWAY_ADMIN_TOKEN");
    assert!(token.verify(b"0123abcd-token"));
    assert!(!token.verify(b"0123abcd-tokeN"));
    assert!(!token.verify(b"0123abcd-toke") && !token.verify(b""), "shorter, or nothing");
    assert!(!format!("{config:?}").contains("0123abcd-token"));
}

// ---------------------------------------------------------------------------------------------
// Bad configs

#[test]
fn five_mistakes_yield_five_errors() {
    expect_errors(
        r#"
        [server]
        listen = "localhost:8080"
        grace_period = 30
        treads = 4

        [upstreams.origin]
        url = "http://127.0.0.1:9000"
        dir = "./data"

        [[routes]]
        path_prefix = "/files/"
        upstream = "orign"
        "#,
        &[
            ("server.listen", "\"localhost:8080\" is not a socket address"),
            ("server.grace_period", "write \"30s\""),
            ("server.treads", "unknown key `treads` — did you mean `threads`?"),
            ("upstreams.origin", "has both url and dir"),
            ("routes[0].upstream", "no upstream named \"orign\""),
        ],
    );
}

#[test]
fn bad_server_values() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("listn = \"127.0.0.1:1\"", &[("server.listn", "did you mean `listen`?")]),
        (
            "listen = 8080",
            &[(
                "server.listen",
                "expected a string, found an integer — write listen = \"127.0.0.1:8080\"",
            )],
        ),
        ("listen = \"127.0.0.1\"", &[("server.listen", "add a port, e.g. \"127.0.0.1:8080\"")]),
        ("listen = \"localhost:80\"", &[("server.listen", "host names are not resolved")]),
        (
            "listen = \"127.0.0.1:99999\"",
            &[("server.listen", "port 99999 is out of range — use a port from 0 to 65535")],
        ),
        ("listen = \"[::1]:65536\"", &[("server.listen", "port 65536 is out of range")]),
        (
            "admin_listen = \"127.0.0.1:8080\"",
            &[("server.admin_listen", "127.0.0.1:8080 overlaps server.listen (127.0.0.1:8080)")],
        ),
        (
            "listen = \"0.0.0.0:9090\"",
            &[("server.admin_listen", "overlaps server.listen (0.0.0.0:9090)")],
        ),
        ("threads = 0", &[("server.threads", "0 is out of range — use a number from 1 to 1024")]),
        ("threads = \"4\"", &[("server.threads", "expected an integer, found a string")]),
        ("threads = 4.0", &[("server.threads", "expected an integer, found a float")]),
        (
            "max_ranges = 1001",
            &[("server.max_ranges", "1001 is out of range — use a number from 1 to 1000")],
        ),
        ("max_ranges = 0", &[("server.max_ranges", "0 is out of range")]),
        (
            "grace_period = 30",
            &[("server.grace_period", "30 is a bare number, without a unit — write \"30s\"")],
        ),
        ("grace_period = \"30\"", &[("server.grace_period", "write \"30s\"")]),
        ("grace_period = 1.5", &[("server.grace_period", "write \"1.5s\"")]),
        (
            "grace_period = \"2h\"",
            &[("server.grace_period", "2h is out of range — use from \"0s\" to \"1h\"")],
        ),
        ("grace_period = \"soon\"", &[("server.grace_period", "\"soon\" is not a duration")]),
        (
            "grace_period = true",
            &[("server.grace_period", "expected a duration string, found a boolean")],
        ),
        ("admin_token_env = 5", &[("server.admin_token_env", "expected a string")]),
    ];
    for &(server, expected) in cases {
        expect_errors(&format!("[server]\n{server}\n{UPSTREAMS}{ROUTE}"), expected);
    }
}

#[test]
fn bad_top_level() {
    expect_errors(
        &format!("[servers]\nlisten = \"127.0.0.1:1\"\n{UPSTREAMS}{ROUTE}"),
        &[("servers", "unknown key `servers` — did you mean `server`?")],
    );
    expect_errors(
        &format!("verbose = true\n{UPSTREAMS}{ROUTE}"),
        &[(
            "verbose",
            "remove it; the top level takes: server, state, cache, tls, traces, log, upstreams, routes",
        )],
    );
    expect_errors(
        &format!("server = \"x\"\n{UPSTREAMS}{ROUTE}"),
        &[("server", "expected a table, found a string")],
    );
}

#[test]
fn state_memory_and_client_share() {
    let config = load_with(
        &format!("[state]\nmax_memory = \"64MiB\"\nclient_share = 0.25\n{UPSTREAMS}{ROUTE}"),
        &Env::default(),
        &kinds_only(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.state.max_memory, 64 << 20);
    assert_eq!(config.state.max_client_memory, 16 << 20);
    assert_eq!(config.state.snapshot_file, None);
    let config = load_with(
        &format!("[state]\nsnapshot_file = \"/var/lib/rangeway/sessions\"\n{UPSTREAMS}{ROUTE}"),
        &Env::default(),
        &kinds_only(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let expected = std::path::Path::new("/var/lib/rangeway/sessions");
    assert_eq!(config.state.snapshot_file.as_deref(), Some(expected));
}

#[test]
fn bad_state_values() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("backend = \"redis\"", &[("state.redis_url", "is required when backend = \"redis\"")]),
        (
            "backend = \"mongo\"",
            &[("state.backend", "unknown backend \"mongo\" — use \"memory\" or \"redis\"")],
        ),
        ("backend = \"memroy\"", &[("state.backend", "did you mean \"memory\"?")]),
        ("ttl = \"0s\"", &[("state.ttl", "0s is out of range — use from \"1s\" to \"365d\"")]),
        ("ttl = 86400", &[("state.ttl", "write \"86400s\"")]),
        ("max_memory = \"512KiB\"", &[("state.max_memory", "use from 1048576 to")]),
        ("max_memory = \"lots\"", &[("state.max_memory", "")]),
        ("client_share = 0", &[("state.client_share", "is 0: no client could keep")]),
        ("client_share = 1.5", &[("state.client_share", "is not a share from 0 to 1")]),
        ("key_prefix = \"a b\"", &[("state.key_prefix", "is not a usable key prefix")]),
        (
            "redis_url = \"http://127.0.0.1\"",
            &[("state.redis_url", "the scheme http:// is not supported")],
        ),
        ("redis_url = \"127.0.0.1:6379\"", &[("state.redis_url", "is not a URL")]),
        ("redis_url = \"redis://h:99999\"", &[("state.redis_url", "port 99999 is out of range")]),
        ("redis_url = \"redis://h/x\"", &[("state.redis_url", "must be a database number")]),
        ("redis_url = \"redis://\"", &[("state.redis_url", "the host is empty")]),
        ("redis_url = []", &[("state.redis_url", "the list of cluster nodes is empty")]),
        (
            "redis_url = 5",
            &[("state.redis_url", "expected a URL string or a list of them, found an integer")],
        ),
        (
            "redis_url = [\"redis://a\", 5]",
            &[("state.redis_url[1]", "expected a URL string, found an integer")],
        ),
        (
            "redis_url = [\"redis://a/1\"]",
            &[("state.redis_url[0]", "Redis Cluster has database 0 only")],
        ),
        (
            "redis_url = \"redis+cluster://a/2\"",
            &[("state.redis_url", "names database 2, but Redis Cluster has database 0 only")],
        ),
        (
            "redis_url = [\"redis://a\", \"redis://b/x\", \"ftp://c\"]",
            &[
                ("state.redis_url[1]", "must be a database number"),
                ("state.redis_url[2]", "the scheme is not supported"),
            ],
        ),
        (
            "redis_url = [\"redis://a\", \"rediss://b\"]",
            &[("state.redis_url", "mixes redis:// and rediss://")],
        ),
        ("redis_ur = \"redis://a\"", &[("state.redis_ur", "did you mean `redis_url`?")]),
        ("snapshot_file = \"\"", &[("state.snapshot_file", "does not name a file")]),
        ("snapshot_file = \"/var/lib/\"", &[("state.snapshot_file", "does not name a file")]),
        (
            "redis_url = \"redis://a\"\nid_key_env = \"K\"\nsnapshot_file = \"/s\"",
            &[
                ("state.id_key_env", "environment variable K is not set"),
                ("state.snapshot_file", "is for the memory store"),
            ],
        ),
    ];
    for &(state, expected) in cases {
        expect_errors(&format!("[state]\n{state}\n{UPSTREAMS}{ROUTE}"), expected);
    }
}

#[test]
fn download_id_keys() {
    let short = Temp::file("short-key", b"tooshort\n");
    let spaced = Temp::file("spaced-key", b"0123456789abcdef 0123456789abcdef\n");
    let good = Temp::file("good-key", b"0123456789abcdef0123456789abcdef");
    let redis = "redis_url = \"redis://a\"";
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (redis.to_owned(), vec![("state.id_key_env", "is required with backend = \"redis\"")]),
        (
            format!("{redis}\nid_key_env = \"RANGEWAY_UNSET_KEY\""),
            vec![("state.id_key_env", "RANGEWAY_UNSET_KEY is not set")],
        ),
        (
            "id_key_file = \"/nonexistent/rangeway-key\"".to_owned(),
            vec![("state.id_key_file", "does not exist")],
        ),
        (
            format!("id_key_file = {}", short.toml()),
            vec![("state.id_key_file", "does not hold a key of 32 or more printable characters")],
        ),
        (
            format!("id_key_file = {}", spaced.toml()),
            vec![("state.id_key_file", "does not hold a key")],
        ),
        (
            format!("id_key_file = {}\nid_key_env = \"RANGEWAY_ID_KEY\"", good.toml()),
            vec![("state.id_key_file", "keep one of id_key_env and id_key_file")],
        ),
    ];
    let env = Env::from_pairs([("RANGEWAY_ID_KEY", ID_KEY_VALUE), ("SHORT_KEY", "tooshort")]);
    for (state, expected) in &cases {
        expect_errors_with(
            &format!("[state]\n{state}\n{UPSTREAMS}{ROUTE}"),
            &env,
            &kinds(),
            expected,
        );
    }
    expect_errors_with(
        &format!("[state]\nid_key_env = \"SHORT_KEY\"\n{UPSTREAMS}{ROUTE}"),
        &env,
        &kinds(),
        &[("state.id_key_env", "shorter than 32 characters")],
    );
    // With the memory store, no key is needed: one is made for the process.
    assert_eq!(load_ok(&format!("{UPSTREAMS}{ROUTE}")).state.id_key, IdKeySource::Generated);
    let shown = format!("{:?}", load_ok(&format!("[state]\n{ID_KEY}{UPSTREAMS}{ROUTE}")));
    assert!(!shown.contains(ID_KEY_VALUE), "{shown}");
}

#[test]
fn bad_upstreams() {
    let not_a_dir = Temp::file("plain-file", b"x");
    let not_pem = Temp::file("not.pem", b"-----BEGIN PRIVATE KEY-----\n");
    let a_dir = Temp::dir("ca-dir");
    let pem = Temp::file("ca.pem", PEM);
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (
            "url = \"ftp://h\"".into(),
            vec![("upstreams.origin.url", "the scheme ftp:// is not supported")],
        ),
        (
            "url = \"127.0.0.1:9000\"".into(),
            vec![("upstreams.origin.url", "add the scheme: \"http://127.0.0.1:9000\"")],
        ),
        (
            "url = \"http://h:70000\"".into(),
            vec![("upstreams.origin.url", "port 70000 is out of range")],
        ),
        ("url = \"http://h/b?x=1\"".into(), vec![("upstreams.origin.url", "has a ?query")]),
        ("url = \"http://h/b#f\"".into(), vec![("upstreams.origin.url", "has a #fragment")]),
        ("url = \"http://h..x\"".into(), vec![("upstreams.origin.url", "empty label")]),
        (
            "url = 9000".into(),
            vec![("upstreams.origin.url", "expected a string, found an integer")],
        ),
        (
            "url = \"http://h\"\ndir = \"./data\"".into(),
            vec![("upstreams.origin", "has both url and dir")],
        ),
        ("connect_timeout = \"1s\"".into(), vec![("upstreams.origin", "has neither url nor dir")]),
        (
            "urll = \"http://h\"".into(),
            vec![
                ("upstreams.origin", "has neither url nor dir"),
                ("upstreams.origin.urll", "did you mean `url`?"),
            ],
        ),
        (
            format!("dir = {}", not_a_dir.toml()),
            vec![("upstreams.origin.dir", "exists but is not a directory")],
        ),
        ("dir = \"\"".into(), vec![("upstreams.origin.dir", "is not a usable path")]),
        (
            format!(
                "url = \"http://h\"\nca_file = {}\ninsecure_skip_verify = false\nsni = \"h\"",
                pem.toml()
            ),
            vec![
                (
                    "upstreams.origin.ca_file",
                    "ca_file applies to https:// urls only — remove it, or use an https:// url",
                ),
                ("upstreams.origin.insecure_skip_verify", "https:// urls only"),
                ("upstreams.origin.sni", "https:// urls only"),
            ],
        ),
        (
            "url = \"https://h\"\nca_file = \"/nonexistent/rangeway/ca.pem\"".into(),
            vec![("upstreams.origin.ca_file", "does not exist")],
        ),
        (
            format!("url = \"https://h\"\nca_file = {}", not_pem.toml()),
            vec![("upstreams.origin.ca_file", "holds no PEM certificate")],
        ),
        (
            format!("url = \"https://h\"\nca_file = {}", a_dir.toml()),
            vec![("upstreams.origin.ca_file", "is not a regular file")],
        ),
        (
            "url = \"https://h\"\ninsecure_skip_verify = \"yes\"".into(),
            vec![("upstreams.origin.insecure_skip_verify", "expected a boolean")],
        ),
        (
            "url = \"https://h\"\nsni = \"10.0.0.1\"".into(),
            vec![("upstreams.origin.sni", "is an IP address")],
        ),
        (
            "url = \"https://h\"\nsni = \"a b\"".into(),
            vec![("upstreams.origin.sni", "is not a DNS name")],
        ),
        (
            "url = \"http://h\"\nhost_header = \"a b\"".into(),
            vec![("upstreams.origin.host_header", "is not a host[:port]")],
        ),
        (
            "url = \"http://h\"\nhost_header = \"user@h\"".into(),
            vec![("upstreams.origin.host_header", "is not a host[:port]")],
        ),
        (
            "url = \"ftp://h\"\nhost_header = \"a b\"\nread_timeout = 5".into(),
            vec![
                ("upstreams.origin.url", "ftp://"),
                ("upstreams.origin.host_header", "is not a host[:port]"),
                ("upstreams.origin.read_timeout", "write \"5s\""),
            ],
        ),
        (
            "url = \"http://h\"\nread_timeout = \"0s\"".into(),
            vec![("upstreams.origin.read_timeout", "out of range — use from \"1ms\" to \"24h\"")],
        ),
        (
            "url = \"http://h\"\nconnect_timeout = \"10m\"".into(),
            vec![("upstreams.origin.connect_timeout", "use from \"1ms\" to \"5m\"")],
        ),
        (
            "url = \"http://h\"\nidle_timeout = 60".into(),
            vec![("upstreams.origin.idle_timeout", "write \"60s\"")],
        ),
        (
            "dir = \"./data\"\nsni = \"h\"\nhost_header = \"h\"\nread_timeout = \"0s\"".into(),
            vec![
                ("upstreams.origin.sni", "applies to url upstreams only"),
                ("upstreams.origin.host_header", "applies to url upstreams only"),
                ("upstreams.origin.read_timeout", "out of range"),
            ],
        ),
    ];
    for (upstream, expected) in &cases {
        expect_errors(&format!("[upstreams.origin]\n{upstream}\n{ROUTE}"), expected);
    }
}

#[test]
fn bad_upstream_names() {
    expect_errors(
        &format!("[upstreams.\"bad name\"]\ndir = \"./data\"\n{UPSTREAMS}{ROUTE}"),
        &[("upstreams.\"bad name\"", "\"bad name\" is not a valid upstream name")],
    );
    expect_errors(
        &format!("[upstreams.Origin]\ndir = \"./data\"\n{UPSTREAMS}{ROUTE}"),
        &[("upstreams.origin", "differs from upstreams.Origin only in case")],
    );
    expect_errors(
        &format!("upstreams = 1\n{ROUTE}"),
        &[("upstreams", "expected a table, found an integer")],
    );
}

#[test]
fn bad_routes() {
    let route = |body: &str| format!("{UPSTREAMS}\n[[routes]]\n{body}\n");
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (
            route("path_prefix = \"/f/\"\nupstream = \"orign\""),
            vec![(
                "routes[0].upstream",
                "routes[0].upstream (line 10, column 1): no upstream named \"orign\" — did you mean \"origin\"? Otherwise define [upstreams.orign], or use one of: local, origin",
            )],
        ),
        (
            route("path_prefix = \"/f/\"\nupstream = \"zzz\""),
            vec![(
                "routes[0].upstream",
                "no upstream named \"zzz\" — define [upstreams.zzz], or use one of: local, origin",
            )],
        ),
        (
            "[[routes]]\npath_prefix = \"/f/\"\nupstream = \"x\"".into(),
            vec![("routes[0].upstream", "define [upstreams.x] with url = ")],
        ),
        (route("upstream = \"origin\""), vec![("routes[0].path_prefix", "is missing")]),
        (
            route("path_prefix = \"/f/\""),
            vec![(
                "routes[0].upstream",
                "is missing — add upstream = \"local\" (defined: local, origin)",
            )],
        ),
        (
            route("path_prefix = \"files/\"\nupstream = \"origin\""),
            vec![("routes[0].path_prefix", "does not start with '/'")],
        ),
        (
            route("path_prefix = \"/a/../b/\"\nupstream = \"origin\""),
            vec![("routes[0].path_prefix", "contains '..'")],
        ),
        (
            route("path_prefix = \"/a//b/\"\nupstream = \"origin\""),
            vec![("routes[0].path_prefix", "contains '//'")],
        ),
        (
            route("path_prefix = \"/a%20b/\"\nupstream = \"origin\""),
            vec![("routes[0].path_prefix", "contains '%'")],
        ),
        (
            route("path_prefix = '/a\\b/'\nupstream = \"origin\""),
            vec![("routes[0].path_prefix", "contains '\\'")],
        ),
        (
            route("path_prefix = \"/a\\u0000b/\"\nupstream = \"origin\""),
            vec![("routes[0].path_prefix", "contains a NUL character")],
        ),
        (
            route("path_prefix = \"/a/./b\"\nupstream = \"origin\""),
            vec![("routes[0].path_prefix", "has a '.' segment")],
        ),
        (
            route("path_prefix = \"/a b\"\nupstream = \"origin\""),
            vec![("routes[0].path_prefix", "contains whitespace")],
        ),
        (
            route("path_prefix = \"/f/\"\nupstream = \"origin\"\nhost = \"dl.example.com:443\""),
            vec![("routes[0].host", "has a port — write host = \"dl.example.com\"")],
        ),
        (
            route("path_prefix = \"/f/\"\nupstream = \"origin\"\nhost = \"*.example.com\""),
            vec![("routes[0].host", "is not a host")],
        ),
        (
            route("path_prefix = \"/f/\"\nupstream = \"origin\"\nstrip_prefix = \"yes\""),
            vec![("routes[0].strip_prefix", "expected a boolean, found a string")],
        ),
        (
            route("path_prefix = \"/f/\"\nupstream = \"origin\"\nupstrem = \"x\""),
            vec![("routes[0].upstrem", "did you mean `upstream`?")],
        ),
        (
            route("path_prefix = \"/f/\"\nupstream = \"origin\"\nmiddleware = \"gzip\""),
            vec![("routes[0].middleware", "expected an array of tables, found a string")],
        ),
        (
            route("path_prefix = \"/f/\"\nupstream = \"origin\"\nmiddleware = [\"gzip\"]"),
            vec![("routes[0].middleware[0]", "expected a table, found a string")],
        ),
        (
            route("path_prefix = \"/f/\"\nupstream = \"origin\"\n[[routes.middleware]]\nlevel = 6"),
            vec![(
                "routes[0].middleware[0].kind",
                "is missing — set kind to one of: aes128gcm, checksum, gzip",
            )],
        ),
        (
            route(
                "path_prefix = \"/f/\"\nupstream = \"origin\"\n[[routes.middleware]]\nkind = \"checksum\"\n[[routes.middleware]]\nkind = \"gzp\"",
            ),
            vec![(
                "routes[0].middleware[1].kind",
                "unknown middleware kind \"gzp\" — did you mean \"gzip\"? Otherwise use one of: aes128gcm, checksum, gzip",
            )],
        ),
        (
            route(
                "path_prefix = \"/f/\"\nupstream = \"origin\"\n[[routes.middleware]]\nkind = \"brotli\"",
            ),
            vec![(
                "routes[0].middleware[0].kind",
                "unknown middleware kind \"brotli\" — use one of: aes128gcm, checksum, gzip",
            )],
        ),
        (
            format!(
                "{UPSTREAMS}\n[[routes]]\npath_prefix = \"/files/\"\nupstream = \"origin\"\n[[routes]]\npath_prefix = \"/files\"\nupstream = \"local\""
            ),
            vec![("routes[1].path_prefix", "\"/files\" on any host overlaps routes[0]")],
        ),
        (
            format!(
                "{UPSTREAMS}\n[[routes]]\nhost = \"A.com\"\npath_prefix = \"/\"\nupstream = \"origin\"\n[[routes]]\nhost = \"a.com\"\npath_prefix = \"/\"\nupstream = \"local\""
            ),
            vec![("routes[1].path_prefix", "\"/\" on host a.com overlaps routes[0]")],
        ),
        (
            format!(
                "{UPSTREAMS}\n[[routes]]\npath_prefix = \"/files/\"\nupstream = \"origin\"\n\
                 [[routes]]\npath_prefix = \"/files\"\nupstream = \"nope\"\nmiddleware = 1"
            ),
            vec![
                ("routes[1].path_prefix", "overlaps routes[0]"),
                ("routes[1].upstream", "no upstream named \"nope\""),
                ("routes[1].middleware", "expected an array of tables"),
            ],
        ),
        (UPSTREAMS.into(), vec![("routes", "no routes are defined")]),
        (format!("routes = []\n{UPSTREAMS}"), vec![("routes", "is empty")]),
        (
            format!("{UPSTREAMS}\n[routes]\npath_prefix = \"/\""),
            vec![("routes", "expected an array of tables, found a table")],
        ),
    ];
    for (text, expected) in &cases {
        expect_errors(text, expected);
    }
}

#[test]
fn a_route_to_a_broken_upstream_is_not_reported_twice() {
    expect_errors(
        &format!("[upstreams.origin]\nurl = \"ftp://h\"\n{ROUTE}"),
        &[("upstreams.origin.url", "scheme ftp://")],
    );
}

#[test]
fn middleware_kinds_with_an_empty_registry() {
    expect_errors_with(
        &format!("{UPSTREAMS}{ROUTE}[[routes.middleware]]\nkind = \"gzip\"\n"),
        &Env::default(),
        &StageRegistry::empty(),
        &[(
            "routes[0].middleware[0].kind",
            "unknown middleware kind \"gzip\" — no middleware kinds are built in yet: remove this \
             entry (middleware = [])",
        )],
    );
    let config = load_with(
        &format!("{UPSTREAMS}{ROUTE}middleware = []\n"),
        &Env::default(),
        &StageRegistry::empty(),
    );
    assert!(config.is_ok());
}

#[test]
fn admin_token_env_problems_never_show_a_token() {
    let text = |name: &str| format!("[server]\nadmin_token_env = \"{name}\"\n{UPSTREAMS}{ROUTE}");
    let env = Env::from_pairs([
        ("EMPTY_TOKEN", ""),
        ("SPACED_TOKEN", "s3cret-with-newline\n"),
        ("lower_token", "s3cret-lower"),
    ]);
    let cases: &[(&str, &str)] = &[
        (
            "RANGEWAY_UNSET_TOKEN",
            "environment variable RANGEWAY_UNSET_TOKEN is not set — export RANGEWAY_UNSET_TOKEN",
        ),
        ("EMPTY_TOKEN", "environment variable EMPTY_TOKEN is empty"),
        ("SPACED_TOKEN", "holds spaces, control characters or non-ASCII text"),
        ("s3cret-pasted-token", "is not an environment variable name"),
        ("s3cretPastedToken", "the environment variable it names is not set"),
    ];
    for &(name, fragment) in cases {
        let errors = load_err(&text(name), &env, &kinds());
        let shown = errors.to_string();
        assert_eq!(errors.errors().len(), 1, "{shown}");
        assert_eq!(errors.errors()[0].path, "server.admin_token_env");
        assert!(shown.contains(fragment), "{name}: {shown}");
        assert!(!shown.contains("s3cret"), "{name}: {shown}");
    }
    let config =
        load_with(&text("lower_token"), &env, &kinds()).expect("lower-case names are valid");
    assert!(config.server.admin_token.is_some_and(|t| t.verify(b"s3cret-lower")));
}

#[test]
fn redis_passwords_never_appear() {
    const SECRET: &str = "hunter2pass";
    let bad_urls = [
        format!("\"redis://:{SECRET}@h:6379/abc\""),
        format!("\"redis://user:{SECRET}@h:99999\""),
        format!("\"http://user:{SECRET}@h\""),
        format!("\"{SECRET}\""),
        format!("\"redis://{SECRET}@\""),
        format!("\"redis://:{SECRET}@[::1\""),
        format!("[\"redis://:{SECRET}@a/3\", \"redis://:{SECRET}@b/x\"]"),
        format!("[\"redis://:{SECRET}@a\", \"rediss://:{SECRET}@b\"]"),
        format!("\"h{SECRET}://x\""),
        format!("\"{SECRET}://x\""),
    ];
    for url in &bad_urls {
        for backend in ["", "backend = \"redis\"", "backend = \"memory\""] {
            let errors = load_err(
                &format!("[state]\n{backend}\nredis_url = {url}\n{UPSTREAMS}{ROUTE}"),
                &Env::default(),
                &kinds(),
            );
            let shown = format!("{errors}\n{errors:?}");
            assert!(!shown.contains(SECRET), "{url}: {shown}");
        }
    }
    // Nor when the same URLs come from the environment.
    for url in &bad_urls {
        let value = url.trim_matches('"').to_owned();
        let env = Env::from_pairs([("RANGEWAY__STATE__REDIS_URL", value.as_str())]);
        let errors = load_err(&format!("{UPSTREAMS}{ROUTE}"), &env, &kinds());
        let shown = format!("{errors}\n{errors:?}");
        assert!(!shown.contains(SECRET), "{url}: {shown}");
    }
    // Nor in a TOML syntax error on that line.
    let errors = load_err(
        &format!("[state]\nredis_url = \"redis://:{SECRET}@h\n{UPSTREAMS}{ROUTE}"),
        &Env::default(),
        &kinds(),
    );
    assert!(!errors.to_string().contains(SECRET), "{errors}");
    // Nor in a loaded config's Debug output, while the client still gets the full URL.
    let config = load_ok(&format!(
        "[state]\n{ID_KEY}redis_url = [\"redis://:{SECRET}@a:7000\", \"redis://u:{SECRET}@b:7001\"]\n{UPSTREAMS}{ROUTE}"
    ));
    assert!(!format!("{config:?}").contains(SECRET));
    let StateBackend::Redis(RedisTarget::Cluster(nodes)) = &config.state.backend else {
        panic!("not a cluster");
    };
    assert_eq!(nodes[0].as_str(), format!("redis://:{SECRET}@a:7000"));
    assert_eq!(nodes[1].to_string(), "redis://***@b:7001/0");
}

// ---------------------------------------------------------------------------------------------
// Environment overrides

#[test]
fn env_overrides_win_over_the_file() {
    let env = Env::from_pairs([
        ("RANGEWAY__SERVER__LISTEN", "127.0.0.1:9999"),
        ("RANGEWAY__SERVER__THREADS", "4"),
        ("RANGEWAY__SERVER__GRACE_PERIOD", "5s"),
        ("RANGEWAY__UPSTREAMS__ORIGIN__URL", "https://minio:9443/b"),
        ("RANGEWAY__UPSTREAMS__ORIGIN__INSECURE_SKIP_VERIFY", "true"),
        ("RANGEWAY__UPSTREAMS__EXTRA__DIR", "./extra"),
        ("RANGEWAY__ROUTES__0__UPSTREAM", "extra"),
        ("RANGEWAY__ROUTES__0__STRIP_PREFIX", "false"),
        ("RANGEWAY__STATE__REDIS_URL", "[\"redis://a:7000\", \"redis://b:7001\"]"),
        ("RANGEWAY__STATE__ID_KEY_ENV", "RANGEWAY_ID_KEY"),
        ("RANGEWAY_ID_KEY", ID_KEY_VALUE),
        // Not overrides: one underscore, or another prefix.
        ("RANGEWAY_ADMIN_TOKEN", "x"),
        ("RANGEWAYX__SERVER__LISTEN", "nonsense"),
    ]);
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:8080\"\nthreads = 2\n{UPSTREAMS}{ROUTE}strip_prefix = true\n"
    );
    let config = load_with(&text, &env, &kinds()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.server.listen, addr("127.0.0.1:9999"));
    assert_eq!(config.server.threads.get(), 4);
    assert_eq!(config.server.grace_period, Duration::from_secs(5));
    let origin = http(&config, "origin");
    assert_eq!(
        (origin.host.as_str(), origin.port, origin.base_path.as_str()),
        ("minio", 9443, "/b")
    );
    assert!(origin.tls && origin.insecure_skip_verify);
    assert!(
        matches!(&config.upstreams["extra"].kind, UpstreamKind::Dir { path } if path == Path::new("./extra"))
    );
    assert_eq!(config.routes[0].upstream, "extra");
    assert!(!config.routes[0].strip_prefix);
    let StateBackend::Redis(RedisTarget::Cluster(nodes)) = &config.state.backend else {
        panic!("{:?}", config.state.backend);
    };
    assert_eq!(nodes.len(), 2);
}

#[test]
fn env_overrides_match_names_ignoring_case() {
    let env = Env::from_pairs([("RANGEWAY__UPSTREAMS__S3EAST__URL", "http://10.0.0.9:9000")]);
    let text = "[upstreams.S3East]\nurl = \"http://127.0.0.1:9000\"\n[[routes]]\npath_prefix = \"/\"\nupstream = \"S3East\"\n";
    let config = load_with(text, &env, &kinds()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.upstreams.len(), 1);
    assert_eq!(http(&config, "S3East").host, "10.0.0.9");
}

#[test]
fn env_values_reach_middleware_options_with_their_origin() {
    let env = Env::from_pairs([("RANGEWAY__ROUTES__0__MIDDLEWARE__0__LEVEL", "9")]);
    let text = format!("{UPSTREAMS}{ROUTE}[[routes.middleware]]\nkind = \"gzip\"\nlevel = 6\n");
    let config = load_with(&text, &env, &kinds()).unwrap_or_else(|e| panic!("{e}"));
    let level = &config.routes[0].middleware[0].options["level"];
    assert_eq!(level.clone().into_int().ok(), Some(9));
    assert_eq!(
        level.origin(),
        Some("environment variable RANGEWAY__ROUTES__0__MIDDLEWARE__0__LEVEL")
    );
}

#[test]
fn bad_env_overrides_name_the_variable() {
    let file = format!("{UPSTREAMS}{ROUTE}");
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "RANGEWAY__SERVER__THREADS",
            "four",
            "server.threads",
            "expected an integer (set by RANGEWAY__SERVER__THREADS)",
        ),
        (
            "RANGEWAY__SERVER__THREADS",
            "0",
            "server.threads",
            "0 is out of range (set by RANGEWAY__SERVER__THREADS)",
        ),
        (
            "RANGEWAY__SERVER__GRACE_PERIOD",
            "30",
            "server.grace_period",
            "(set by RANGEWAY__SERVER__GRACE_PERIOD) — write \"30s\"",
        ),
        (
            "RANGEWAY__SERVER__LISTEN",
            "nowhere",
            "server.listen",
            "\"nowhere\" is not a socket address (set by RANGEWAY__SERVER__LISTEN)",
        ),
        (
            "RANGEWAY__SERVER__LISTN",
            "127.0.0.1:1",
            "server.listn",
            "unknown key `listn` (set by RANGEWAY__SERVER__LISTN) — did you mean `listen`?",
        ),
        (
            "RANGEWAY__ROUTES__0__STRIP_PREFIX",
            "yes",
            "routes[0].strip_prefix",
            "expected true or false",
        ),
        (
            "RANGEWAY__ROUTES__5__UPSTREAM",
            "x",
            "RANGEWAY__ROUTES__5__UPSTREAM",
            "routes has 1 element(s), so \"5\" does not name one",
        ),
        (
            "RANGEWAY__ROUTES__X__UPSTREAM",
            "x",
            "RANGEWAY__ROUTES__X__UPSTREAM",
            "does not name one",
        ),
        ("RANGEWAY__SERVER____LISTEN", "x", "RANGEWAY__SERVER____LISTEN", "empty key segment"),
        ("RANGEWAY__", "x", "RANGEWAY__", "empty key segment"),
        (
            "RANGEWAY__UPSTREAMS__ORIGIN__URL__X",
            "x",
            "RANGEWAY__UPSTREAMS__ORIGIN__URL__X",
            "upstreams.origin.url is a string, not a table",
        ),
        (
            "RANGEWAY__STATE__REDIS_URL",
            "[\"redis://a\",",
            "state.redis_url",
            "not a TOML array of strings",
        ),
        (
            "RANGEWAY__ROUTES",
            "x",
            "routes",
            "expected an array of tables, found a string (set by RANGEWAY__ROUTES)",
        ),
    ];
    let deep = format!("RANGEWAY{}", "__A".repeat(10_000));
    let cases =
        [cases, &[(deep.as_str(), "x", deep.as_str(), "more than 16 key segments")]].concat();
    for &(var, value, path, fragment) in &cases {
        expect_errors_with(&file, &Env::from_pairs([(var, value)]), &kinds(), &[(path, fragment)]);
    }
}

#[test]
fn env_overrides_set_twice_or_ambiguously_are_refused() {
    expect_errors_with(
        &format!("{UPSTREAMS}{ROUTE}"),
        &Env::from_pairs([
            ("RANGEWAY__SERVER__LISTEN", "127.0.0.1:1"),
            ("rangeway__server__listen", "127.0.0.1:2"),
        ]),
        &kinds(),
        &[("rangeway__server__listen", "sets the same key as RANGEWAY__SERVER__LISTEN")],
    );
    // Two file names equal but for case: refused in the file already, and the override cannot
    // choose between them.
    expect_errors_with(
        &format!(
            "[upstreams.Aa]\ndir = \"./a\"\n[upstreams.AA]\ndir = \"./b\"\n{UPSTREAMS}{ROUTE}"
        ),
        &Env::from_pairs([("RANGEWAY__UPSTREAMS__AA__DIR", "./c")]),
        &kinds(),
        &[
            ("RANGEWAY__UPSTREAMS__AA__DIR", "matches both \"AA\" and \"Aa\""),
            ("upstreams.Aa", "differs from upstreams.AA only in case"),
        ],
    );
}

#[test]
fn string_configs_take_no_overrides() {
    // `from_toml_str` reads the process environment only for `admin_token_env`; it must not
    // apply overrides even if the process has some.
    let config = Config::from_toml_str(&format!("{UPSTREAMS}{ROUTE}"), &kinds())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.server.listen, addr("127.0.0.1:8080"));
    let env = Env::from_pairs([("RANGEWAY__SERVER__LISTEN", "127.0.0.1:1"), ("TOKEN", "t")]);
    let stripped = env.without_overrides();
    assert!(!stripped.vars.contains_key("RANGEWAY__SERVER__LISTEN"));
    assert!(stripped.vars.contains_key("TOKEN"));
}

// ---------------------------------------------------------------------------------------------
// Files

fn shipped(relative: &str) -> PathBuf {
    // Relative to this source file, so the test finds the repository's config/ from any crate
    // that includes this module.
    Path::new(file!())
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|root| root.join("config").join(relative))
        .expect("source file path has three ancestors")
}

#[test]
fn shipped_configs_load() {
    let default = Config::from_toml_str(DEFAULT_TOML, &StageRegistry::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(default.server.listen, addr("127.0.0.1:8080"));
    assert_eq!(default.server.admin_listen, addr("127.0.0.1:9090"));
    assert_eq!(default.state.backend, StateBackend::Memory);
    assert!(
        matches!(&default.upstreams["local"].kind, UpstreamKind::Dir { path } if path == Path::new("./data"))
    );
    assert_eq!(default.routes.len(), 1);
    assert_eq!(default.routes[0].path_prefix, "/files/");
    assert_eq!(default.routes[0].upstream, "local");
    assert!(default.routes[0].strip_prefix);
    assert!(default.routes[0].middleware.is_empty());

    let from_file = Config::load(&shipped("default.toml"), &StageRegistry::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(from_file.routes, default.routes);

    let cdn_text = std::fs::read_to_string(shipped("examples/cdn.toml")).expect("cdn.toml");
    let cdn = load_with(
        &cdn_text,
        &Env::from_pairs([("RANGEWAY_ID_KEY", ID_KEY_VALUE)]),
        &StageRegistry::empty(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(cdn.state.backend, StateBackend::Redis(RedisTarget::Single(_))));
    assert_eq!(cdn.routes[0].host.as_deref(), Some("dl.example.com"));

    let s3_text = std::fs::read_to_string(shipped("examples/s3.toml")).expect("s3.toml");
    let keys = Env::from_pairs([
        ("RANGEWAY_S3_ACCESS_KEY_ID", "AKIDEXAMPLE"),
        ("RANGEWAY_S3_SECRET_ACCESS_KEY", "example/secret"),
    ]);
    let s3 = load_with(&s3_text, &keys, &StageRegistry::empty()).unwrap_or_else(|e| panic!("{e}"));
    let UpstreamKind::S3(store) = &s3.upstreams["s3"].kind else {
        panic!("not an S3 upstream: {:?}", s3.upstreams["s3"]);
    };
    assert!(store.endpoint.tls);
    assert_eq!((store.bucket.as_str(), store.region.as_str()), ("my-bucket", "eu-central-1"));
    assert_eq!(store.addressing, Addressing::VirtualHost);
    // Without its keys the example is refused, naming the variables.
    let errors = load_err(&s3_text, &Env::default(), &StageRegistry::empty());
    assert_eq!(errors.errors().len(), 2, "{errors}");
    assert!(errors.to_string().contains("RANGEWAY_S3_SECRET_ACCESS_KEY is not set"), "{errors}");

    let secure = Config::load(&shipped("examples/secure.toml"), &kinds_only())
        .unwrap_or_else(|e| panic!("{e}"));
    let kinds: Vec<&str> = secure.routes[2].middleware.iter().map(|m| m.kind.as_str()).collect();
    assert_eq!(kinds, ["checksum", "gzip", "aes128gcm"]);
    // Without the stages registered, the secure example is refused entry by entry.
    let errors = Config::load(&shipped("examples/secure.toml"), &StageRegistry::empty())
        .expect_err("no kinds");
    assert_eq!(errors.errors().len(), 4, "{errors}");
}

#[test]
fn unreadable_files_are_one_error_naming_the_file() {
    let missing = Temp::path("missing.toml");
    let errors = Config::load(&missing.0, &kinds()).expect_err("missing");
    assert_eq!(errors.errors().len(), 1);
    assert_eq!(errors.errors()[0].path, missing.0.display().to_string());
    assert!(errors.to_string().contains("the config file does not exist"), "{errors}");

    let dir = Temp::dir("config-dir");
    let errors = Config::load(&dir.0, &kinds()).expect_err("a directory");
    assert!(errors.to_string().contains("is a directory"), "{errors}");

    let binary = Temp::file("binary.toml", b"listen = \"\xff\"");
    let errors = Config::load(&binary.0, &kinds()).expect_err("not UTF-8");
    assert!(
        errors.to_string().contains("is not UTF-8 text (invalid byte at offset 10)"),
        "{errors}"
    );
}

#[test]
fn syntax_errors_name_file_line_and_column() {
    let file = Temp::file("syntax.toml", b"[server]\nlisten = \"127.0.0.1:8080\"\nthreads = = 4\n");
    let errors = Config::load(&file.0, &kinds()).expect_err("syntax");
    assert_eq!(errors.errors().len(), 1, "{errors}");
    let error = &errors.errors()[0];
    assert_eq!(error.path, format!("{}:3:11", file.0.display()));
    assert!(error.problem.starts_with("invalid TOML: "), "{error}");
    assert!(!error.problem.contains('|'), "{error}");

    let errors = load_err("[server]\n[server]\n", &Env::default(), &kinds());
    assert!(errors.errors()[0].path.starts_with("test.toml:2:"), "{errors}");
}

#[test]
fn errors_display_one_per_line() {
    let errors = load_err("[server]\nlisten = 1\nadmin_listen = 2\n", &Env::default(), &kinds());
    let shown = errors.to_string();
    assert_eq!(shown.lines().count(), errors.errors().len());
    assert_eq!(errors.errors().len(), 3, "{shown}");
    assert_eq!(
        shown.lines().last(),
        Some(
            "routes: no routes are defined, so every request would be answered 404 — add \
             [[routes]] with path_prefix = \"/files/\" and upstream = \"origin\""
        )
    );
    let paths: Vec<&str> = errors.errors().iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["server.listen", "server.admin_listen", "routes"]);
}

#[test]
fn errors_in_the_file_name_their_line_and_column() {
    let text = "[server]\nlisten = \"nowhere\"\ntreads = 4\n\n[upstreams.origin]\n\
                url = \"http://127.0.0.1:9000\"\n\n[[routes]]\npath_prefix = \"/files/\"\n\
                upstream = \"orign\"\n\n[[routes]]\n  upstream = \"origin\"\n  \
                middleware = [{ kind = \"gzip\", level = 42 }]\n";
    let errors = load_err(text, &Env::default(), &kinds());
    let at: Vec<(&str, Option<(usize, usize)>)> =
        errors.errors().iter().map(|e| (e.path.as_str(), e.position)).collect();
    assert_eq!(
        at,
        [
            ("server.treads", Some((3, 1))),
            ("server.listen", Some((2, 1))),
            ("routes[0].upstream", Some((10, 1))),
            // A key that is missing: the table it belongs in.
            ("routes[1].path_prefix", Some((12, 1))),
            // A stage's own option, in an inline table.
            ("routes[1].middleware[0].level", Some((14, 34))),
        ],
        "{errors}"
    );
    let shown = errors.to_string();
    assert!(shown.contains("\nserver.listen (line 2, column 1): \"nowhere\" is not"), "{shown}");
    // A value set by a variable names the variable instead, however the file reads.
    let env = Env::from_pairs([("RANGEWAY__SERVER__LISTEN", "elsewhere")]);
    let errors = load_err(text, &env, &kinds());
    let listen = &errors.errors()[1];
    assert_eq!((listen.path.as_str(), listen.position), ("server.listen", None));
    assert!(listen.to_string().contains("(set by RANGEWAY__SERVER__LISTEN) — write"), "{listen}");
    // Not about one place of the file: no position.
    let errors = load_err("[server]\nthreads = 2\n", &Env::default(), &kinds());
    assert_eq!((errors.errors()[0].path.as_str(), errors.errors()[0].position), ("routes", None));
}

#[test]
fn every_value_of_the_wrong_type_is_reported_at_once() {
    let text = format!(
        "[server]\nlisten = 8080\nthreads = \"four\"\ngrace_period = true\nproxy_protocol = 1\n\
         trusted_proxies = \"10.0.0.0/8\"\n[state]\nttl = [1]\nmax_memory = 1.5\n\
         client_share = \"half\"\n[cache]\ndir = 7\n{UPSTREAMS}\n[[routes]]\npath_prefix = 1\n\
         upstream = \"origin\"\nstrip_prefix = \"yes\"\nupstream_resume = {{ attempts = \"5\" }}\n"
    );
    expect_errors(
        &text,
        &[
            ("server.listen", "expected a string, found an integer"),
            ("server.threads", "expected an integer, found a string"),
            ("server.grace_period", "expected a duration string, found a boolean"),
            ("server.proxy_protocol", "expected a boolean, found an integer"),
            ("server.trusted_proxies", "expected an array of strings, found a string"),
            ("state.ttl", "expected a duration string, found an array"),
            ("state.max_memory", "expected a size, found a float"),
            ("state.client_share", "expected a number from 0 to 1, found a string"),
            ("cache.dir", "expected a string, found an integer"),
            ("routes[0].path_prefix", "expected a string, found an integer"),
            ("routes[0].strip_prefix", "expected a boolean, found a string"),
            ("routes[0].upstream_resume.attempts", "expected an integer, found a string"),
        ],
    );
}

#[test]
fn env_overrides_inside_each_other_are_refused() {
    expect_errors_with(
        &format!("{UPSTREAMS}{ROUTE}"),
        &Env::from_pairs([
            ("RANGEWAY__ROUTES__0__UPSTREAM_RESUME", "false"),
            ("RANGEWAY__ROUTES__0__UPSTREAM_RESUME__ATTEMPTS", "3"),
        ]),
        &kinds(),
        &[(
            "RANGEWAY__ROUTES__0__UPSTREAM_RESUME__ATTEMPTS",
            "overlaps routes[0].upstream_resume, which RANGEWAY__ROUTES__0__UPSTREAM_RESUME sets",
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// S3 upstreams

const S3_ROUTE: &str = "\n[[routes]]\npath_prefix = \"/s3/\"\nupstream = \"store\"\n";

fn s3_env() -> Env {
    Env::from_pairs([("AK", "AKIDEXAMPLE"), ("SK", "example/secret+key"), ("TOK", "token")])
}

fn s3_upstream(config: &Config) -> &S3Upstream {
    match &config.upstreams["store"].kind {
        UpstreamKind::S3(s3) => s3,
        other => panic!("not S3: {other:?}"),
    }
}

#[test]
fn s3_upstreams_parse_to_typed_values() {
    let text = format!(
        "[upstreams.store]\nurl = \"http://127.0.0.1:9400\"\nbucket = \"Old_Bucket\"\n\
         key_prefix = \"/builds/2026/\"\naccess_key_env = \"AK\"\nsecret_key_env = \"SK\"\n\
         session_token_env = \"TOK\"\n{S3_ROUTE}"
    );
    let config = load_with(&text, &s3_env(), &kinds()).unwrap_or_else(|e| panic!("{e}"));
    let s3 = s3_upstream(&config);
    assert_eq!(s3.bucket, "Old_Bucket");
    assert_eq!(s3.region, "us-east-1");
    assert_eq!(s3.addressing, Addressing::Path);
    assert_eq!(s3.key_prefix, ["builds", "2026"]);
    let credentials = s3.credentials.as_ref().expect("credentials");
    assert_eq!(credentials.access_key_id.expose(), "AKIDEXAMPLE");
    assert_eq!(credentials.secret_access_key.expose(), "example/secret+key");
    assert_eq!(credentials.session_token.as_ref().map(Secret::expose), Some("token"));
    assert_eq!(credentials.source, "environment variables AK/SK");
    let shown = format!("{config:?}");
    assert!(!shown.contains("AKIDEXAMPLE") && !shown.contains("secret+key"), "{shown}");

    // The AWS variables when nothing else is configured; anonymous needs none.
    let text = format!(
        "[upstreams.store]\nurl = \"https://s3.example.com\"\nbucket = \"b-1\"\n\
         addressing = \"virtual-host\"\nregion = \"eu-west-1\"\n{S3_ROUTE}"
    );
    let aws = Env::from_pairs([("AWS_ACCESS_KEY_ID", "AKIDAWS"), ("AWS_SECRET_ACCESS_KEY", "s")]);
    let config = load_with(&text, &aws, &kinds()).unwrap_or_else(|e| panic!("{e}"));
    let s3 = s3_upstream(&config);
    assert_eq!(s3.addressing, Addressing::VirtualHost);
    assert_eq!(s3.credentials.as_ref().map(|c| c.access_key_id.expose()), Some("AKIDAWS"));
    let text = format!(
        "[upstreams.store]\nurl = \"http://127.0.0.1:1\"\nbucket = \"pub\"\nanonymous = true\n\
         {S3_ROUTE}"
    );
    assert!(s3_upstream(&load_ok(&text)).credentials.is_none());
}

#[test]
fn bad_s3_upstreams() {
    let url = "url = \"http://127.0.0.1:9400\"\n";
    let keys = "access_key_env = \"AK\"\nsecret_key_env = \"SK\"\n";
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (
            format!("{url}bucket = \"a\"\n{keys}"),
            vec![("upstreams.store.bucket", "\"a\" is not a valid bucket name")],
        ),
        (
            format!(
                "url = \"https://s3.example.com\"\nbucket = \"Up_per\"\naddressing = \"virtual-host\"\n{keys}"
            ),
            vec![("upstreams.store.bucket", "it becomes part of a host name")],
        ),
        (
            format!("{url}bucket = \"b12\"\naddressing = \"virtual-host\"\n{keys}"),
            vec![("upstreams.store.url", "needs a DNS name")],
        ),
        (
            format!("{url}bucket = \"b12\"\naddressing = \"dns\"\n{keys}"),
            vec![("upstreams.store.addressing", "\"dns\" is not an addressing style")],
        ),
        (
            format!("{url}bucket = \"b12\"\nkey_prefix = \"a/../b\"\n{keys}"),
            vec![("upstreams.store.key_prefix", "'..'")],
        ),
        (
            format!("{url}bucket = \"b12\"\nregion = \"EU West\"\n{keys}"),
            vec![("upstreams.store.region", "is not a region name")],
        ),
        (
            format!("url = \"http://127.0.0.1:9400/b12\"\nbucket = \"b12\"\n{keys}"),
            vec![("upstreams.store.url", "an S3 endpoint url has no path")],
        ),
        (
            format!("{url}bucket = \"b12\"\nhost_header = \"x\"\n{keys}"),
            vec![("upstreams.store.host_header", "does not apply to S3 upstreams")],
        ),
        (
            format!("{url}bucket = \"b12\"\naccess_key_env = \"AK\"\n"),
            vec![("upstreams.store.access_key_env", "go together")],
        ),
        (
            format!("{url}bucket = \"b12\"\naccess_key_env = \"AK\"\nsecret_key_env = \"NOPE\"\n"),
            vec![("upstreams.store.secret_key_env", "environment variable NOPE is not set")],
        ),
        (
            format!("{url}bucket = \"b12\"\nanonymous = true\n{keys}"),
            vec![
                ("upstreams.store.access_key_env", "cannot be combined with anonymous"),
                ("upstreams.store.secret_key_env", "cannot be combined with anonymous"),
            ],
        ),
        (
            format!("{url}bucket = \"b12\"\nanonymous = true\nprofile = \"x\"\n"),
            vec![("upstreams.store.profile", "cannot be combined with anonymous")],
        ),
        (
            format!("{url}bucket = \"b12\"\nprofile = \"x\"\n{keys}"),
            vec![("upstreams.store.profile", "remove profile")],
        ),
        (format!("{url}bucket = \"b12\"\n"), vec![("upstreams.store", "has no credentials")]),
        (
            format!("{url}region = \"us-east-1\"\nprofile = \"x\"\n"),
            vec![
                ("upstreams.store.region", "applies to S3 upstreams only"),
                ("upstreams.store.profile", "applies to S3 upstreams only"),
            ],
        ),
        (
            "dir = \"./data\"\nbucket = \"b12\"\n".to_owned(),
            vec![("upstreams.store", "has bucket but dir instead of url")],
        ),
        (
            format!("{url}bucket = \"b12\"\ncredentials_file = \"/nonexistent/creds\"\n"),
            vec![("upstreams.store.credentials_file", "\"/nonexistent/creds\" does not exist")],
        ),
    ];
    let env =
        Env::from_pairs([("AK", "AKIDEXAMPLE"), ("SK", "the-secret"), ("HOME", "/nonexistent")]);
    for (upstream, expected) in cases {
        let text = format!("[upstreams.store]\n{upstream}{S3_ROUTE}");
        expect_errors_with(&text, &env, &kinds(), &expected);
        let shown = load_err(&text, &env, &kinds()).to_string();
        assert!(!shown.contains("AKIDEXAMPLE") && !shown.contains("the-secret"), "{shown}");
    }
}

#[test]
fn s3_client_keys_files() {
    let good = Temp::file("clients", b"# keys\nAKIDONE secret/one\n\nAKIDTWO two\n");
    let text = format!("{UPSTREAMS}{ROUTE}s3_client_keys_file = {}\n", good.toml());
    let config = load_ok(&text);
    let keys = config.routes[0].s3_client_keys.as_ref().expect("keys");
    assert_eq!(keys.secret("AKIDONE").map(Secret::expose), Some("secret/one"));
    assert!(keys.secret("AKIDTHREE").is_none());
    assert!(!format!("{config:?}").contains("secret/one"));

    let cases: [(&[u8], &str); 4] = [
        (b"AKIDONE\n", "line 1 of"),
        (b"AKIDONE s1\nAKIDONE s2-hidden\n", "line 2 of"),
        (b"# nothing\n", "holds no keys"),
        (b"AKIDONE a b-hidden\n", "is not an `ACCESS_KEY_ID SECRET` pair"),
    ];
    for (contents, fragment) in cases {
        let file = Temp::file("clients-bad", contents);
        let text = format!("{UPSTREAMS}{ROUTE}s3_client_keys_file = {}\n", file.toml());
        expect_errors(&text, &[("routes[0].s3_client_keys_file", fragment)]);
        assert!(!load_err(&text, &Env::default(), &kinds()).to_string().contains("hidden"));
    }
    let missing = Temp::path("clients-missing");
    let text = format!("{UPSTREAMS}{ROUTE}s3_client_keys_file = {}\n", missing.toml());
    expect_errors(&text, &[("routes[0].s3_client_keys_file", "does not exist")]);
    let text = format!("{UPSTREAMS}{ROUTE}s3_client_keys_file = \"/dev/zero\"\n");
    expect_errors(&text, &[("routes[0].s3_client_keys_file", "is not a regular file")]);
}

#[test]
fn upstream_resume_settings() {
    let with = |value: &str| format!("{UPSTREAMS}{ROUTE}upstream_resume = {value}\n");
    let config = load_ok(&with("true"));
    assert_eq!(config.routes[0].upstream_resume, Some(UpstreamResume::default()));
    let config = load_ok(&with("{ attempts = 9, deadline = \"2m\", backoff = \"0s\" }"));
    let resume = config.routes[0].upstream_resume.expect("set");
    assert_eq!(
        (resume.attempts, resume.deadline, resume.backoff),
        (9, Duration::from_secs(120), Duration::ZERO)
    );
    // On by default.
    assert_eq!(
        load_ok(&format!("{UPSTREAMS}{ROUTE}")).routes[0].upstream_resume,
        Some(UpstreamResume::default())
    );
    assert_eq!(load_ok(&with("false")).routes[0].upstream_resume, None);
    // From the environment too, as the bare word.
    let env = |value: &str| Env::from_pairs([("RANGEWAY__ROUTES__0__UPSTREAM_RESUME", value)]);
    let off = load_with(&format!("{UPSTREAMS}{ROUTE}"), &env("false"), &kinds()).expect("loads");
    assert_eq!(off.routes[0].upstream_resume, None);
    let on = load_with(&with("false"), &env("true"), &kinds()).expect("loads");
    assert_eq!(on.routes[0].upstream_resume, Some(UpstreamResume::default()));
    expect_errors_with(
        &format!("{UPSTREAMS}{ROUTE}"),
        &env("no"),
        &kinds(),
        &[("routes[0].upstream_resume", "expected true or false")],
    );
    let cases: [(&str, &[(&str, &str)]); 5] = [
        ("{ attempts = 0 }", &[("routes[0].upstream_resume.attempts", "0 is out of range")]),
        ("{ deadline = \"2h\" }", &[("routes[0].upstream_resume.deadline", "out of range")]),
        ("{ backoff = 1 }", &[("routes[0].upstream_resume.backoff", "bare number")]),
        ("{ attempt = 3 }", &[("routes[0].upstream_resume.attempt", "did you mean `attempts`?")]),
        ("\"yes\"", &[("routes[0].upstream_resume", "expected a table")]),
    ];
    for (value, expected) in cases {
        expect_errors(&with(value), expected);
    }
}

#[test]
fn client_limits() {
    let config = load_ok(&format!("{UPSTREAMS}{ROUTE}"));
    assert_eq!(config.server.client_limits, ClientLimits::default());
    let text = format!(
        "[server]\nclient_header_timeout = \"2s\"\nclient_write_timeout = \"5m\"\n\
         max_connections_per_client = 0\nmax_header_bytes = 8192\nmax_header_fields = 50\n\
         {UPSTREAMS}{ROUTE}"
    );
    let limits = load_ok(&text).server.client_limits;
    assert_eq!(
        (limits.header_timeout, limits.write_timeout, limits.max_connections_per_client),
        (Duration::from_secs(2), Duration::from_secs(300), 0)
    );
    assert_eq!((limits.max_header_bytes, limits.max_header_fields), (8192, 50));
    let idle = format!(
        "[server]\nclient_keepalive_timeout = \"2s\"\nmax_connections = 100\n{UPSTREAMS}{ROUTE}"
    );
    let limits = load_ok(&idle).server.client_limits;
    assert_eq!((limits.keepalive_timeout, limits.max_connections), (Duration::from_secs(2), 100));
    assert_eq!(ClientLimits::default().keepalive_timeout, Duration::from_secs(60));
    // More connections than descriptors could never be open: refused, with the limit named.
    if let Some(descriptors) = crate::admission::descriptor_limit().filter(|&d| d < 1_000_000) {
        expect_errors(
            &format!("[server]\nmax_connections = {}\n{UPSTREAMS}{ROUTE}", descriptors + 1),
            &[("server.max_connections", "RLIMIT_NOFILE")],
        );
    }
    let sized = format!("[server]\nmax_header_bytes = \"16KiB\"\n{UPSTREAMS}{ROUTE}");
    assert_eq!(load_ok(&sized).server.client_limits.max_header_bytes, 16 * 1024);
    for (value, lowat) in [("\"1MiB\"", 1 << 20), ("0", 0), ("16384", 16 * 1024)] {
        let text = format!("[server]\nclient_notsent_lowat = {value}\n{UPSTREAMS}{ROUTE}");
        assert_eq!(load_ok(&text).server.client_limits.notsent_lowat, lowat, "{value}");
    }
    expect_errors(
        &format!("[server]\nmax_header_bytes = \"2MiB\"\n{UPSTREAMS}{ROUTE}"),
        &[("server.max_header_bytes", "2097152 is out of range")],
    );
    expect_errors(
        &format!("[server]\nmax_header_bytes = \"16 parsecs\"\n{UPSTREAMS}{ROUTE}"),
        &[("server.max_header_bytes", "unknown size unit")],
    );
    let cases: [(&str, &[(&str, &str)]); 9] = [
        ("client_header_timeout = \"0s\"", &[("server.client_header_timeout", "out of range")]),
        (
            "client_keepalive_timeout = \"2h\"",
            &[("server.client_keepalive_timeout", "out of range")],
        ),
        ("max_connections = 0", &[("server.max_connections", "0 is out of range")]),
        ("max_connections = \"many\"", &[("server.max_connections", "expected an integer")]),
        (
            "client_notsent_lowat = \"4KiB\"",
            &[("server.client_notsent_lowat", "every few segments")],
        ),
        ("client_notsent_lowat = \"2GiB\"", &[("server.client_notsent_lowat", "out of range")]),
        ("max_header_bytes = 100", &[("server.max_header_bytes", "100 is out of range")]),
        ("max_header_fields = 300", &[("server.max_header_fields", "300 is out of range")]),
        (
            "max_connections_per_client = -1",
            &[("server.max_connections_per_client", "out of range")],
        ),
    ];
    for (server, expected) in cases {
        expect_errors(&format!("[server]\n{server}\n{UPSTREAMS}{ROUTE}"), expected);
    }
}

#[test]
fn upgrade_socket() {
    let config = load_ok(&format!("{UPSTREAMS}{ROUTE}"));
    assert_eq!(config.server.upgrade_socket, Path::new("/tmp/rangeway-upgrade.sock"));
    let text = format!("[server]\nupgrade_socket = \"/run/rw/up.sock\"\n{UPSTREAMS}{ROUTE}");
    assert_eq!(load_ok(&text).server.upgrade_socket, Path::new("/run/rw/up.sock"));
    let long = format!("/{}", "a".repeat(120));
    for bad in ["", long.as_str()] {
        expect_errors(
            &format!("[server]\nupgrade_socket = \"{bad}\"\n{UPSTREAMS}{ROUTE}"),
            &[("server.upgrade_socket", "is not a usable Unix socket path")],
        );
    }
}

#[test]
fn replicas_and_health_checks() {
    let text = "[upstreams.pool]\nurls = [\"http://10.0.0.1:9000/b\", \"https://cdn.example.com/b\"]\n\
                [upstreams.pool.health_check]\npath = \"/healthz\"\ninterval = \"2s\"\n\n\
                [[routes]]\npath_prefix = \"/\"\nupstream = \"pool\"\n";
    let config = load_ok(text);
    let pool = &config.upstreams["pool"];
    let UpstreamKind::Replicas(replicas) = &pool.kind else { panic!("{pool:?}") };
    assert_eq!(replicas.len(), 2);
    assert_eq!((replicas[0].tls, replicas[0].sni.as_deref()), (false, None));
    assert_eq!((replicas[1].tls, replicas[1].sni.as_deref()), (true, Some("cdn.example.com")));
    assert_eq!(replicas[1].host_header, "cdn.example.com");
    assert!(replicas.iter().all(|r| r.base_path == "/b"));
    let check = pool.health_check.as_ref().expect("a health check");
    assert_eq!(
        (check.path.as_str(), check.interval, check.timeout),
        ("/healthz", Duration::from_secs(2), Duration::from_secs(2))
    );

    let route = "\n[[routes]]\npath_prefix = \"/\"\nupstream = \"pool\"\n";
    let cases: [(&str, &[(&str, &str)]); 6] = [
        ("urls = []", &[("upstreams.pool.urls", "non-empty list")]),
        ("urls = [\"http://a/x\", \"http://b/y\"]", &[("upstreams.pool.urls", "different paths")]),
        ("urls = [\"http://a\", 5]", &[("upstreams.pool.urls[1]", "expected a url string")]),
        ("urls = [\"ftp://a\"]", &[("upstreams.pool.urls[0]", "ftp:// is not supported")]),
        (
            "url = \"http://a\"\nurls = [\"http://b\"]",
            &[("upstreams.pool.urls", "cannot be combined")],
        ),
        (
            "dir = \"./data\"\nhealth_check = { path = \"/\" }",
            &[("upstreams.pool.health_check", "nothing to check")],
        ),
    ];
    for (upstream, expected) in cases {
        expect_errors(&format!("[upstreams.pool]\n{upstream}\n{route}"), expected);
    }
    expect_errors(
        &format!(
            "[upstreams.pool]\nurl = \"http://a\"\nhealth_check = {{ path = \"health\" }}\n{route}"
        ),
        &[("upstreams.pool.health_check.path", "is not a request path")],
    );
}

#[test]
fn files_that_never_end_or_never_begin_are_refused_unread() {
    // A FIFO without a writer blocks whoever opens it; /dev/zero never ends.
    let fifo = Temp::path("ca.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo.0).status().expect("run mkfifo");
    assert!(made.success());
    for ca in [fifo.toml(), "\"/dev/zero\"".to_owned()] {
        let text =
            format!("[upstreams.origin]\nurl = \"https://h.example\"\nca_file = {ca}\n{ROUTE}");
        expect_errors(&text, &[("upstreams.origin.ca_file", "is not a regular file")]);
    }
}

#[test]
fn cache_section_and_routes() {
    let dir = Temp::dir("cache-dir");
    let cache = format!("[cache]\ndir = {}\n", dir.toml());
    // Without [cache], no route uses one.
    let none = load_ok(&format!("{UPSTREAMS}{ROUTE}"));
    assert_eq!((none.cache, none.routes[0].cache), (None, None));
    // With it: the defaults, and every route on unless its upstream is a local folder.
    let text = format!(
        "{cache}{UPSTREAMS}{ROUTE}\n[[routes]]\npath_prefix = \"/local/\"\nupstream = \"local\"\n"
    );
    let config = load_ok(&text);
    let section = config.cache.as_ref().expect("a cache");
    assert_eq!((section.max_size, section.slice_size), (10 << 30, 4 << 20));
    // One entry for each 64 KiB of max_size.
    assert_eq!(section.max_entries, 163_840);
    assert_eq!(config.routes[0].cache, Some(RouteCache::default()));
    assert_eq!(config.routes[1].cache, None, "a local folder is not cached by default");
    // Sizes with units; a route's table; off by a route, and from the environment.
    let text = format!(
        "{cache}max_size = \"64MiB\"\nslice_size = \"1MiB\"\n{UPSTREAMS}{ROUTE}\
         cache = {{ revalidate = \"each-download\", authorized = true }}\n"
    );
    let config = load_ok(&text);
    assert_eq!(
        config.cache.as_ref().map(|c| (c.max_size, c.slice_size, c.max_entries)),
        Some((64 << 20, 1 << 20, 1024))
    );
    // max_entries said, and from the environment.
    let text = format!("{cache}max_size = \"16MiB\"\nmax_entries = 100000\n{UPSTREAMS}{ROUTE}");
    assert_eq!(load_ok(&text).cache.map(|c| c.max_entries), Some(100_000));
    let env = Env::from_pairs([("RANGEWAY__CACHE__MAX_ENTRIES", "5000")]);
    let set_by_env =
        load_with(&format!("{cache}{UPSTREAMS}{ROUTE}"), &env, &kinds()).expect("loads");
    assert_eq!(set_by_env.cache.map(|c| c.max_entries), Some(5000));
    let route = config.routes[0].cache.expect("on");
    assert_eq!((route.revalidate, route.authorized), (Revalidate::EachDownload, true));
    assert_eq!(load_ok(&format!("{cache}{UPSTREAMS}{ROUTE}cache = false\n")).routes[0].cache, None);
    let env = Env::from_pairs([("RANGEWAY__ROUTES__0__CACHE", "false")]);
    let off = load_with(&format!("{cache}{UPSTREAMS}{ROUTE}"), &env, &kinds()).expect("loads");
    assert_eq!(off.routes[0].cache, None);

    let file = Temp::file("cache-file", b"x");
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        ("[cache]\n".to_owned(), vec![("cache.dir", "is missing")]),
        (format!("[cache]\ndir = {}\n", file.toml()), vec![("cache.dir", "is not a directory")]),
        (format!("{cache}slice_size = \"16MiB\"\n"), vec![("cache.slice_size", "out of range")]),
        (format!("{cache}slice_size = \"1.5MiB\"\n"), vec![("cache.slice_size", "not a whole")]),
        (
            format!("{cache}max_size = \"16MiB\"\nslice_size = \"8MiB\"\n"),
            vec![("cache.max_size", "fewer than four slices")],
        ),
        (format!("{cache}size = 1\n"), vec![("cache.size", "unknown key")]),
        (format!("{cache}max_entries = 10\n"), vec![("cache.max_entries", "out of range")]),
        (
            format!("{cache}max_entries = \"lots\"\n"),
            vec![("cache.max_entries", "expected an integer")],
        ),
        // Every problem at once.
        (
            format!("{cache}max_entries = -1\nslice_size = \"16MiB\"\n"),
            vec![("cache.max_entries", "out of range"), ("cache.slice_size", "out of range")],
        ),
    ];
    for (section, expected) in cases {
        expect_errors(&format!("{section}{UPSTREAMS}{ROUTE}"), &expected);
    }
    expect_errors(
        &format!("{UPSTREAMS}{ROUTE}cache = true\n"),
        &[("routes[0].cache", "there is no [cache]")],
    );
    expect_errors(
        &format!("{cache}{UPSTREAMS}{ROUTE}cache = {{ revalidate = \"never\" }}\n"),
        &[("routes[0].cache.revalidate", "is not a revalidation policy")],
    );
}

#[test]
fn traces_and_log_sections() {
    let none = load_ok(&format!("{UPSTREAMS}{ROUTE}"));
    assert_eq!((none.traces, none.log.format), (None, LogFormat::Text));
    let text = format!(
        "[traces]\nendpoint = \"http://127.0.0.1:4318/v1/traces\"\n\n[log]\nformat = \"json\"\n{UPSTREAMS}{ROUTE}"
    );
    let config = load_ok(&text);
    let traces = config.traces.as_ref().expect("traces");
    assert_eq!((traces.sampling, traces.service_name.as_str()), (1.0, "rangeway"));
    assert_eq!(config.log.format, LogFormat::Json);
    let text = format!(
        "[traces]\nendpoint = \"https://otel.example/v1/traces\"\nsampling = 0.01\n\
         service_name = \"edge\"\nresource = {{ \"deployment.environment\" = \"prod\" }}\n{UPSTREAMS}{ROUTE}"
    );
    let traces = load_ok(&text).traces.expect("traces");
    assert_eq!((traces.sampling, traces.service_name.as_str()), (0.01, "edge"));
    assert_eq!(traces.resource.get("deployment.environment").map(String::as_str), Some("prod"));
    let env =
        Env::from_pairs([("RANGEWAY_ID_KEY", ID_KEY_VALUE), ("RANGEWAY__TRACES__SAMPLING", "0.5")]);
    let overridden = load_with(
        &format!("[traces]\nendpoint = \"http://c:4318/v1/traces\"\n{UPSTREAMS}{ROUTE}"),
        &env,
        &kinds(),
    )
    .expect("loads");
    assert_eq!(overridden.traces.map(|t| t.sampling), Some(0.5));

    // Every bad value at once, each named with its fix.
    expect_errors(
        &format!(
            "[traces]\nendpoint = \"otel:4318\"\nsampling = 2\nservice_name = \" \"\n\
             resource = {{ a = 1 }}\n\n[log]\nformat = \"yaml\"\n{UPSTREAMS}{ROUTE}"
        ),
        &[
            ("traces.endpoint", "is not an http:// or https:// URL"),
            ("traces.sampling", "is not a share from 0 to 1"),
            ("traces.service_name", "is empty"),
            ("traces.resource.a", "expected a string"),
            ("log.format", "is not a log format"),
        ],
    );
    expect_errors(
        &format!("[traces]\nsampling = 0.1\n{UPSTREAMS}{ROUTE}"),
        &[("traces.endpoint", "is missing")],
    );
    let leaked = load_err(
        &format!(
            "[traces]\nendpoint = \"http://user:hunter2@c:4318/v1/traces\"\n{UPSTREAMS}{ROUTE}"
        ),
        &Env::from_pairs([("RANGEWAY_ID_KEY", ID_KEY_VALUE)]),
        &kinds(),
    );
    assert!(leaked.to_string().contains("holds credentials"), "{leaked}");
    assert!(!leaked.to_string().contains("hunter2"), "a secret in an error: {leaked}");
}

#[test]
fn tls_section_errors() {
    let absent = Temp::path("absent.pem");
    let certificate = |extra: &str| {
        format!("[[tls.certificates]]\ncert_file = {0}\nkey_file = {0}\n{extra}", absent.toml())
    };
    let unreadable = "No such file or directory";
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (
            "[tls]\n".to_owned(),
            vec![("tls.listen", "is missing"), ("tls.certificates", "is missing")],
        ),
        (
            format!("[tls]\nlisten = []\n{}", certificate("")),
            vec![("tls.listen", "is empty"), ("tls.certificates[0]", unreadable)],
        ),
        (
            // server.listen's default, and one address twice.
            format!(
                "[tls]\nlisten = [\"127.0.0.1:8080\", \"0.0.0.0:8443\", \"0.0.0.0:8443\"]\n{}",
                certificate("")
            ),
            vec![
                ("tls.listen[0]", "is server.listen already"),
                ("tls.listen[2]", "is listed twice"),
                ("tls.certificates[0]", unreadable),
            ],
        ),
        (
            format!("[tls]\nlisten = \"127.0.0.1:9090\"\nh2 = \"yes\"\n{}", certificate("")),
            vec![
                ("tls.listen", "is server.admin_listen already"),
                ("tls.h2", "expected a boolean"),
                ("tls.certificates[0]", unreadable),
            ],
        ),
        (
            "[tls]\nlisten = \"0.0.0.0:8443\"\ncertificates = []\n".to_owned(),
            vec![("tls.certificates", "expected a non-empty list")],
        ),
        (
            format!("[tls]\nlisten = \"0.0.0.0:8443\"\nh3 = \"yes\"\n{}", certificate("")),
            vec![("tls.h3", "expected a table"), ("tls.certificates[0]", unreadable)],
        ),
        (
            format!(
                "[tls]\nlisten = \"0.0.0.0:8443\"\n{}[tls.h3]\nmax_streams = 0\n\
                 idle_timeout = \"10ms\"\nalt_svc_port = 70000\nearly_data = 1\n\
                 max_connections_per_client = 0\nretry_above = 5\n",
                certificate("")
            ),
            vec![
                ("tls.h3.retry_above", "unknown key"),
                ("tls.h3.alt_svc_port", "out of range"),
                ("tls.h3.max_streams", "out of range"),
                ("tls.h3.max_connections_per_client", "out of range"),
                ("tls.h3.idle_timeout", "out of range"),
                ("tls.h3.early_data", "expected a boolean"),
                ("tls.certificates[0]", unreadable),
            ],
        ),
        (
            "[tls]\nlisten = \"0.0.0.0:8443\"\n[[tls.certificates]]\nocsp = 1\n".to_owned(),
            vec![
                ("tls.certificates[0].ocsp", "unknown key"),
                ("tls.certificates[0].cert_file", "is missing"),
                ("tls.certificates[0].key_file", "is missing"),
            ],
        ),
    ];
    for (section, expected) in cases {
        expect_errors(&format!("{section}{UPSTREAMS}{ROUTE}"), &expected);
    }
}

#[test]
fn signed_links_of_a_route() {
    let keys = Temp::file("link-keys", b"# rotated monthly\n2026-11 0123456789abcdef0123456789abcdef\n2026-12 fedcba9876543210fedcba9876543210\n");
    let section = |body: &str| format!("{UPSTREAMS}{ROUTE}[routes.signed_links]\n{body}");
    let config = load_ok(&section(&format!("keys_file = {}\ngrace = \"2h\"\n", keys.toml())));
    let signed = config.routes[0].signed_links.as_ref().expect("signed links");
    assert_eq!((signed.keys.newest(), signed.grace), ("2026-12", Duration::from_secs(7200)));
    let default = load_ok(&section(&format!("keys_file = {}\n", keys.toml())));
    assert_eq!(
        default.routes[0].signed_links.as_ref().map(|s| s.grace),
        Some(Duration::from_secs(86_400))
    );

    let short = Temp::file("short-keys", b"k1 too-short\n");
    let twice = Temp::file(
        "twice-keys",
        b"k1 0123456789abcdef0123456789abcdef\nk1 0123456789abcdef0123456789abcdeX\n",
    );
    let badid = Temp::file("badid-keys", b"k/1 0123456789abcdef0123456789abcdef\n");
    let empty = Temp::file("empty-keys", b"# nothing yet\n");
    let path = "routes[0].signed_links.keys_file";
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (section(""), vec![(path, "is missing")]),
        (section(&format!("keys_file = {}\n", short.toml())), vec![(path, "line 1")]),
        (section(&format!("keys_file = {}\n", twice.toml())), vec![(path, "repeats a key id")]),
        (section(&format!("keys_file = {}\n", badid.toml())), vec![(path, "key id of other than")]),
        (section(&format!("keys_file = {}\n", empty.toml())), vec![(path, "holds no keys")]),
        (
            section(&format!("keys_file = {}\ngrace = \"90d\"\nttl = 1\n", keys.toml())),
            vec![
                ("routes[0].signed_links.grace", "out of range"),
                ("routes[0].signed_links.ttl", "unknown key"),
            ],
        ),
    ];
    for (text, expected) in cases {
        expect_errors(&text, &expected);
    }
    // A secret is never repeated in an error.
    let errors =
        load_err(&section(&format!("keys_file = {}\n", short.toml())), &Env::default(), &kinds());
    assert!(!errors.to_string().contains("too-short"), "{errors}");
}

#[test]
fn download_limits_of_a_route() {
    let section = |body: &str| format!("{UPSTREAMS}{ROUTE}[routes.download_limits]\n{body}");
    let config = load_ok(&section("per_client = 10\nper_route = 1000\n"));
    let limits = config.routes[0].download_limits.expect("limits");
    assert_eq!(
        (limits.per_client, limits.per_route, limits.count),
        (Some(10), Some(1000), Count::Download)
    );
    let each = load_ok(&section("per_route = 5\ncount = \"request\"\n"));
    assert_eq!(
        each.routes[0].download_limits.map(|l| (l.per_client, l.count)),
        Some((None, Count::Request))
    );
    assert_eq!(load_ok(&format!("{UPSTREAMS}{ROUTE}")).routes[0].download_limits, None);
    let path = "routes[0].download_limits";
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (section(""), vec![(path, "sets no limit")]),
        (
            section("per_client = 0\n"),
            vec![("routes[0].download_limits.per_client", "out of range")],
        ),
        (
            section("per_route = 1\ncount = \"connection\"\nper_ip = 1\n"),
            vec![
                ("routes[0].download_limits.count", "is not what a limit counts"),
                ("routes[0].download_limits.per_ip", "unknown key"),
            ],
        ),
    ];
    for (text, expected) in cases {
        expect_errors(&text, &expected);
    }
}

#[test]
fn presigned_grace() {
    let keys = Temp::file("clients-grace", b"AKIDONE secret/one\n");
    let route = format!("{UPSTREAMS}{ROUTE}s3_client_keys_file = {}\n", keys.toml());
    assert_eq!(load_ok(&route).routes[0].s3_presigned_grace, Duration::from_secs(86_400));
    let config = load_ok(&format!("{route}s3_presigned_grace = \"2h\"\n"));
    assert_eq!(config.routes[0].s3_presigned_grace, Duration::from_secs(7200));
    expect_errors(
        &format!("{UPSTREAMS}{ROUTE}s3_presigned_grace = \"2h\"\n"),
        &[("routes[0].s3_presigned_grace", "has no effect without s3_client_keys_file")],
    );
    expect_errors(
        &format!("{route}s3_presigned_grace = \"31d\"\n"),
        &[("routes[0].s3_presigned_grace", "out of range")],
    );
}

#[test]
fn rate_limits_of_a_route() {
    let section = |body: &str| format!("{UPSTREAMS}{ROUTE}[routes.rate_limit]\n{body}");
    let config = load_ok(&section(
        "rate = \"2MiB\"\nafter = \"4MiB\"\nper_client = 10485760\nper_route = \"100MiB\"\norigin_header = \"X-Accel-Limit-Rate\"\n",
    ));
    let limit = config.routes[0].rate_limit.as_ref().expect("a rate limit");
    assert_eq!(
        (limit.rate, limit.after, limit.per_client, limit.per_route),
        (Some(2 << 20), 4 << 20, Some(10 << 20), Some(100 << 20))
    );
    assert_eq!(
        limit.origin_header.as_ref().map(http::HeaderName::as_str),
        Some("x-accel-limit-rate")
    );
    assert_eq!(load_ok(&format!("{UPSTREAMS}{ROUTE}")).routes[0].rate_limit, None);
    let path = "routes[0].rate_limit";
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (section("after = \"1MiB\"\n"), vec![(path, "sets no rate")]),
        (section("rate = \"100\"\n"), vec![("routes[0].rate_limit.rate", "out of range")]),
        (
            section("rate = \"1MiB\"\norigin_header = \"bad header\"\nburst = 1\n"),
            vec![
                ("routes[0].rate_limit.origin_header", "is not a header name"),
                ("routes[0].rate_limit.burst", "unknown key"),
            ],
        ),
    ];
    for (text, expected) in cases {
        expect_errors(&text, &expected);
    }
}

#[test]
fn balancer_keys() {
    let server = load_ok(&format!("{UPSTREAMS}{ROUTE}")).server;
    assert!(!server.proxy_protocol);
    assert!(server.trusted_proxies.is_empty() && server.admin_hosts.is_empty());
    let text = format!(
        "[server]\nproxy_protocol = true\n\
         trusted_proxies = [\"10.0.0.0/8\", \"192.0.2.7\", \"fd00::/8\", \"::1\"]\n\
         admin_hosts = [\"Rangeway-1.Internal\", \"10.0.0.5\", \"[fd00::5]\"]\n{UPSTREAMS}{ROUTE}"
    );
    let server = load_ok(&text).server;
    assert!(server.proxy_protocol);
    let nets: Vec<String> = server.trusted_proxies.iter().map(ToString::to_string).collect();
    assert_eq!(nets, ["10.0.0.0/8", "192.0.2.7/32", "fd00::/8", "::1/128"]);
    let ip = |text: &str| text.parse::<std::net::IpAddr>().expect("test address");
    let [private, one, ula, _] = server.trusted_proxies[..] else { panic!("four networks") };
    assert!(private.contains(ip("10.200.3.4")) && !private.contains(ip("11.0.0.1")));
    assert!(private.contains(ip("::ffff:10.1.1.1")), "IPv4-mapped peers are IPv4");
    assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
    assert!(
        ula.contains(ip("fdab::1"))
            && !ula.contains(ip("fe80::1"))
            && !ula.contains(ip("10.0.0.1"))
    );
    assert_eq!(server.admin_hosts, ["rangeway-1.internal", "10.0.0.5", "[fd00::5]"]);
    let every_entry = "[server]\nproxy_protocol = \"yes\"\n\
         trusted_proxies = [\"10.0.0.0/33\", \"10.0.0.1/8\", \"lb.internal\", 7, \"::/0\"]\n\
         admin_hosts = [\"metrics.internal:9090\", \"a..b\"]\n";
    expect_errors(
        &format!("{every_entry}{UPSTREAMS}{ROUTE}"),
        &[
            ("server.proxy_protocol", "expected a boolean"),
            ("server.trusted_proxies[0]", "/33 is not a prefix length from 0 to 32"),
            ("server.trusted_proxies[1]", "bits set past its /8 (the network is 10.0.0.0)"),
            ("server.trusted_proxies[2]", "\"lb.internal\" is not an IP address"),
            ("server.trusted_proxies[3]", "expected a string, found an integer"),
            ("server.admin_hosts[0]", "write \"metrics.internal\": names are matched without"),
            ("server.admin_hosts[1]", "empty label"),
        ],
    );
    expect_errors(
        &format!("[server]\ntrusted_proxies = \"10.0.0.0/8\"\n{UPSTREAMS}{ROUTE}"),
        &[("server.trusted_proxies", "write trusted_proxies = [\"10.0.0.0/8\", \"fd00::/8\"]")],
    );
}

// ---------------------------------------------------------------------------------------------
// The loader's parts

mod listeners {
    use std::net::SocketAddr;

    use crate::admission::default_max_connections;
    use crate::values::listen_addr::collide as sockets_collide;

    #[test]
    fn collisions() {
        let addr = |s: &str| s.parse::<SocketAddr>().expect("test address");
        assert!(sockets_collide(addr("127.0.0.1:80"), addr("127.0.0.1:80")));
        assert!(sockets_collide(addr("0.0.0.0:80"), addr("127.0.0.1:80")));
        assert!(sockets_collide(addr("[::1]:80"), addr("[::]:80")));
        assert!(!sockets_collide(addr("127.0.0.1:80"), addr("127.0.0.1:81")));
        assert!(!sockets_collide(addr("127.0.0.1:80"), addr("127.0.0.2:80")));
        assert!(!sockets_collide(addr("127.0.0.1:0"), addr("127.0.0.1:0")));
    }

    #[test]
    fn the_default_connection_cap_leaves_room_for_origins_and_files() {
        assert_eq!(default_max_connections(Some(65_536)), 13_056);
        assert_eq!(default_max_connections(Some(1024)), 153);
        assert_eq!(default_max_connections(Some(10)), 1, "never none");
        assert_eq!(default_max_connections(None), 1_000_000);
    }
}

mod suggestions {
    use super::super::check::suggest;
    use super::super::route::kind_fix;
    use super::super::source::Path;

    #[test]
    fn suggestions() {
        let keys = ["listen", "admin_listen", "threads"];
        assert_eq!(suggest("listn", keys), Some("listen"));
        assert_eq!(suggest("Listen", keys), Some("listen"));
        assert_eq!(suggest("admin-listen", keys), Some("admin_listen"));
        assert_eq!(suggest("thread", keys), Some("threads"));
        assert_eq!(suggest("x", keys), None);
        assert_eq!(suggest("backend", keys), None);
    }

    #[test]
    fn key_paths() {
        let upstreams = Path::default().key("upstreams");
        assert_eq!(Path::default().key("server").to_string(), "server");
        assert_eq!(upstreams.key("my-origin").to_string(), "upstreams.my-origin");
        assert_eq!(upstreams.key("a.b").to_string(), "upstreams.\"a.b\"");
        assert_eq!(upstreams.key("").to_string(), "upstreams.\"\"");
        let stage = Path::default().key("routes").index(1).key("middleware").index(0);
        assert_eq!(stage.key("level").to_string(), "routes[1].middleware[0].level");
        assert_eq!(
            (stage.header(), stage.key("kind").last_key()),
            ("[[routes.middleware]]".to_owned(), "kind")
        );
    }

    #[test]
    fn kind_fixes() {
        assert_eq!(
            kind_fix(&[], "use"),
            "no middleware kinds are built in yet: remove this entry (middleware = [])"
        );
        assert_eq!(kind_fix(&["checksum", "gzip"], "use"), "use one of: checksum, gzip");
    }
}

#[test]
fn methods_of_a_route() {
    use http::Method;
    let route = |methods: &str| format!("{UPSTREAMS}{ROUTE}methods = {methods}\n");
    // GET and HEAD always, first; what the key adds after them, once each.
    assert_eq!(
        load_ok(&format!("{UPSTREAMS}{ROUTE}")).routes[0].methods,
        [Method::GET, Method::HEAD]
    );
    let config = load_ok(&route("[\"POST\", \"PUT\", \"GET\", \"M-SEARCH\", \"POST\"]"));
    let search = Method::from_bytes(b"M-SEARCH").expect("a method");
    assert_eq!(
        config.routes[0].methods,
        [Method::GET, Method::HEAD, Method::POST, Method::PUT, search]
    );
    let at = |index: usize| format!("routes[0].methods[{index}]");
    let cases: Vec<(String, Vec<(String, &str)>)> = vec![
        (route("[\"CONNECT\"]"), vec![(at(0), "does not tunnel")]),
        (route("[\"POST\", \"trace\"]"), vec![(at(1), "TRACE is never passed through")]),
        (route("[\"post\"]"), vec![(at(0), "methods are case-sensitive")]),
        (route("[\"PO ST\", \"\"]"), vec![(at(0), "is not a method"), (at(1), "is not a method")]),
        (route("[1]"), vec![(at(0), "expected a string")]),
        (route("\"POST\""), vec![("routes[0].methods".to_owned(), "expected an array")]),
    ];
    for (text, expected) in cases {
        let expected: Vec<(&str, &str)> = expected.iter().map(|(k, p)| (k.as_str(), *p)).collect();
        expect_errors(&text, &expected);
    }
}

#[test]
fn request_body_limits() {
    let limits = load_ok(&format!("{UPSTREAMS}{ROUTE}")).server.client_limits;
    assert_eq!((limits.max_request_body, limits.body_timeout), (64 << 20, Duration::from_secs(60)));
    let text = format!(
        "[server]\nmax_request_body = \"1GiB\"\nclient_body_timeout = \"5s\"\n{UPSTREAMS}{ROUTE}"
    );
    let limits = load_ok(&text).server.client_limits;
    assert_eq!((limits.max_request_body, limits.body_timeout), (1 << 30, Duration::from_secs(5)));
    expect_errors(
        &format!(
            "[server]\nmax_request_body = \"lots\"\nclient_body_timeout = \"0s\"\n{UPSTREAMS}{ROUTE}"
        ),
        &[
            ("server.max_request_body", "does not start with a number"),
            ("server.client_body_timeout", "out of range"),
        ],
    );
}
