//! Assembling and running the pingora server from a validated config.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::{
    RunArgs, Server, ShutdownSignal, ShutdownSignalWatch, UnixShutdownSignalWatch,
};
use pingora_core::services::background::{GenBackgroundService, background_service};
use pingora_core::services::listening::Service;
use rangeway_middleware::chain::{Chain, StageRegistry};
use rangeway_middleware::rfc9110::RangeLimits;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::admin::Admin;
use crate::admission::{Admission, ConnectionPlaces};
use crate::cache::SliceCache;
use crate::config::Config;
use crate::fingerprint::{FingerprintKey, IdKeySource};
use crate::h3::H3Service;
use crate::origin::dir::{self, DirOrigin};
use crate::proxy::{Proxy, ProxyApp};
use crate::routes::health::HealthChecks;
use crate::routes::upstream::{
    HttpUpstream, ReplicaSpec, Timeouts, TlsSettings, Upstream, UpstreamError, UpstreamKind,
};
use crate::routes::{Route, RouteSwitch, RouteTable};
use crate::state::{self, SnapshotFile, StateConfig, StateStore, StoreError};
use crate::telemetry::live::LiveResponses;
use crate::telemetry::metrics::Metrics;
use crate::tls::{Certificates, SniResolver, TlsConfig};
use crate::traces::Traces;
use pingora_core::listeners::tls::Acceptor;
use pingora_rustls::{ResolvesServerCert, ServerConfig};

/// Why rangeway could not start. Config problems are caught earlier by `Config::load`; these are
/// the ones only the machine can tell (files, sockets).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("upstreams.{name}: {source}")]
    Upstream { name: String, source: UpstreamError },
    #[error("upstreams.{name}.dir: cannot prepare {path}: {source}")]
    Folder { name: String, path: std::path::PathBuf, source: std::io::Error },
    #[error("state: {0}")]
    Store(#[from] StoreError),
    #[error("cannot start the state store's runtime: {0}")]
    StoreRuntime(std::io::Error),
    #[error("cannot start the server thread: {0}")]
    Thread(std::io::Error),
    /// Middleware the registry cannot build (`rangeway check` reports these first).
    #[error("{0}")]
    Middleware(crate::config::ConfigErrors),
    #[error("routes[{index}].path_prefix: {source}")]
    Route { index: usize, source: crate::request_path::PathError },
    #[error("cannot make a key for download ids: {0}")]
    IdKey(getrandom::Error),
    #[error("{0}")]
    Snapshot(#[from] state::SnapshotError),
    #[error("nothing listens on {0}: the server stopped or could not bind it")]
    NotListening(SocketAddr),
    #[error(
        "{key}: cannot listen on {addr}: {source} — stop what listens there, or choose another address"
    )]
    Listen { key: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("tls: {0}")]
    Tls(String),
}

/// What a started server listens on.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// Paths of sample objects written into empty `dir` folders, for the start-up banner.
    pub samples: Vec<String>,
}

/// Keeps the state store's connections alive. pingora gives every service a runtime of its own,
/// while a Redis connection is driven by a task on the runtime that opened it: the store gets a
/// runtime of its own, which lives as long as the server.
#[derive(Debug)]
pub struct StoreRuntime(tokio::runtime::Runtime);

/// A server built from config, not yet running.
pub struct Built {
    pub server: Server,
    pub endpoints: Endpoints,
    pub store: StoreRuntime,
    pub metrics: Arc<Metrics>,
    /// The route table in force, which a reload replaces.
    pub routes: Arc<RouteSwitch>,
    /// The `dir` upstreams served, by name: their services cannot change while running.
    pub dirs: BTreeMap<String, DirService>,
    /// What the TLS listeners present, which a reload replaces.
    pub certificates: Option<Arc<SniResolver>>,
    /// Where the embedded store is kept when the process stops.
    pub snapshot: Option<Arc<SnapshotFile>>,
}

/// Builds the pingora server: a `dir` origin per `dir` upstream, the proxy, the admin listener.
///
/// With `upgrade`, the listening sockets are taken over from a running rangeway through
/// `server.upgrade_socket` (which blocks until that process is sent SIGQUIT).
pub fn build(
    config: &Config,
    registry: &StageRegistry,
    upgrade: bool,
) -> Result<Built, StartError> {
    let chains = config.build_chains(registry).map_err(StartError::Middleware)?;
    raise_descriptor_limit();
    if !upgrade {
        can_listen(config)?;
    }
    let store_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("rangeway-store")
        .enable_all()
        .build()
        .map_err(StartError::StoreRuntime)?;
    let (store, snapshot) = open_store(&config.state, &store_runtime, upgrade)?;
    let range_limits = RangeLimits::with_max_ranges(config.server.max_ranges);
    let metrics = Arc::new(Metrics::new());
    metrics.watch_store(Arc::clone(&store));

    let grace = config.server.grace_period.as_secs();
    let conf = ServerConf {
        threads: config.server.threads.get(),
        grace_period_seconds: Some(grace),
        graceful_shutdown_timeout_seconds: Some(grace.max(1)),
        upgrade_sock: config.server.upgrade_socket.to_string_lossy().into_owned(),
        ..ServerConf::default()
    };
    let options = Opt { upgrade, ..Opt::default() };
    let mut server = Server::new_with_opt_and_conf(Some(options), conf);
    server.bootstrap();

    // A `dir` upstream is a service of the server, with its socket: made once, at start.
    let mut dirs = BTreeMap::new();
    let mut sample_names = Vec::new();
    for (name, upstream) in &config.upstreams {
        let UpstreamKind::Dir { path } = &upstream.kind else {
            continue;
        };
        let sample = dir::prepare_folder(path).map_err(|source| StartError::Folder {
            name: name.clone(),
            path: path.clone(),
            source,
        })?;
        if sample.is_some() {
            sample_names.push(name.clone());
        }
        let origin = dir_origin(name, path, range_limits)?;
        let dir_service = DirService::new(name, path);
        let mut service = Service::new(format!("dir origin {name}"), origin);
        service.add_uds(&dir_service.socket.to_string_lossy(), None);
        service.threads = Some(1);
        server.add_service(service);
        dirs.insert(name.clone(), dir_service);
    }
    let Assembled { proxy, routes, live, cache } =
        assemble_proxy(config, chains, &dirs, &store, &metrics)?;
    let proxy = proxy.with_alt_svc(config.tls.as_ref().and_then(crate::h3::alt_svc));
    // The HTTP/3 listener's: the same tables and counts as pingora's listeners' (see `Proxy`).
    let h3_proxy = config.tls.as_ref().and_then(|tls| tls.h3).map(|_| proxy.clone());
    let samples = config
        .routes
        .iter()
        // The sample sits at the folder's root: reachable under the prefix when it is stripped.
        .filter(|route| route.strip_prefix && sample_names.contains(&route.upstream))
        .map(|route| format!("{}/{}", route.path_prefix.trim_end_matches('/'), dir::SAMPLE_NAME))
        .collect();

    let routes_in_force = Arc::clone(&routes);
    server.add_service(background_service("health checks", HealthChecks::new(Arc::clone(&routes))));
    // HTTP/1's idle wait is timed by the admission's wrapper; HTTP/2's, with no stream open, by
    // pingora's accept loop (which then drops the connection).
    let mut server_options = pingora_core::apps::HttpServerOptions::default();
    server_options.h2_idle_timeout = Some(config.server.client_limits.keepalive_timeout);
    let proxy = ProxyApp::new(proxy, h2_options(), server_options);
    let admission = Admission::new(proxy, config.server.client_limits, Arc::clone(&metrics))
        .with_proxy_protocol(config.server.proxy_protocol);
    // The TLS listeners: plain TCP to pingora, the handshake made by the admission (within the
    // client limits), the same proxy behind. A service of their own, so with worker threads of
    // their own.
    let certificates = match &config.tls {
        Some(tls) => {
            let resolver = Arc::new(SniResolver::new(certificates(tls)?));
            let acceptor = Acceptor::from_server_config(tls_server_config(tls, &resolver));
            let mut tls_service =
                Service::new("rangeway tls".to_owned(), admission.with_tls(acceptor));
            for addr in &tls.listen {
                tls_service.add_tcp(&addr.to_string());
            }
            server.add_service(tls_service);
            if let (Some(h3), Some(h3_proxy)) = (tls.h3, h3_proxy) {
                let places = admission.places();
                let service =
                    h3_service(config, tls, &h3, (&resolver, places), h3_proxy, &metrics, upgrade)?;
                server.add_service(service);
            }
            for warning in tls.warnings(std::time::SystemTime::now()) {
                warn!("{warning}");
            }
            Some(resolver)
        }
        None => None,
    };
    let mut proxy_service = Service::new("rangeway proxy".to_owned(), admission);
    proxy_service.add_tcp(&config.server.listen.to_string());
    server.add_service(proxy_service);

    let admin_app = Admin::new(
        Arc::clone(&metrics),
        config.server.listen,
        store,
        routes,
        config.server.admin_token.clone(),
        live,
    )
    .with_cache(cache)
    .with_hosts(config.server.admin_listen, config.server.admin_hosts.clone());
    let mut admin = Service::new("admin".to_owned(), admin_app);
    admin.add_tcp(&config.server.admin_listen.to_string());
    admin.threads = Some(1);
    server.add_service(admin);

    let endpoints =
        Endpoints { proxy: config.server.listen, admin: config.server.admin_listen, samples };
    Ok(Built {
        server,
        endpoints,
        store: StoreRuntime(store_runtime),
        metrics,
        routes: routes_in_force,
        dirs,
        certificates,
        snapshot,
    })
}

/// The proxy and what it shares with the server's other services.
struct Assembled {
    proxy: Proxy,
    /// The route table in force, which the health checks and the admin listener read and a
    /// reload replaces.
    routes: Arc<RouteSwitch>,
    live: Arc<LiveResponses>,
    cache: Option<Arc<SliceCache>>,
}

/// The proxy `config` describes: its routes, with their middleware (`chains`) and their `dir`
/// upstreams reached through `dirs`; the download ids' key; the slice cache; over `store`.
fn assemble_proxy(
    config: &Config,
    chains: Vec<Chain>,
    dirs: &BTreeMap<String, DirService>,
    store: &Arc<dyn StateStore>,
    metrics: &Arc<Metrics>,
) -> Result<Assembled, StartError> {
    let table = build_routes(config, chains, dirs, metrics)?;
    let routes = Arc::new(RouteSwitch::new(table));
    let live = Arc::new(LiveResponses::new());
    let id_key = match (&config.state.id_key, &config.state.snapshot_file) {
        (IdKeySource::Configured(key), _) => FingerprintKey::new(key.expose().as_bytes()),
        // The ids the records are kept under must name the same downloads after a restart.
        (IdKeySource::Generated, Some(file)) => FingerprintKey::new(&SnapshotFile::id_key(file)?),
        (IdKeySource::Generated, None) => FingerprintKey::generate().map_err(StartError::IdKey)?,
    };
    let cache =
        config.cache.as_ref().and_then(|cache| SliceCache::open(cache, metrics)).map(Arc::new);
    let proxy = Proxy::new(
        Arc::clone(&routes),
        RangeLimits::with_max_ranges(config.server.max_ranges),
        Arc::clone(metrics),
        Arc::clone(store),
        Arc::clone(&live),
        config.server.client_limits,
        id_key,
    )
    .with_cache(cache.clone())
    .with_traces(config.traces.as_ref().map(|traces| Traces::new(traces.sampling)))
    .with_trusted_proxies(config.server.trusted_proxies.clone());
    Ok(Assembled { proxy, routes, live, cache })
}

/// The proxy `config` describes, as [`build`] makes it, with the embedded store and its `dir`
/// upstreams served in memory rather than on sockets (the pipeline's tests); and those origins.
#[cfg(test)]
pub(crate) fn in_memory(
    config: &Config,
    registry: &StageRegistry,
) -> Result<(Proxy, Arc<crate::origin::memory::MemoryOrigins>), StartError> {
    let chains = config.build_chains(registry).map_err(StartError::Middleware)?;
    let range_limits = RangeLimits::with_max_ranges(config.server.max_ranges);
    let (mut origins, mut dirs) = (crate::origin::memory::MemoryOrigins::new(), BTreeMap::new());
    for (name, upstream) in &config.upstreams {
        if let UpstreamKind::Dir { path } = &upstream.kind {
            let service = DirService::new(name, path);
            origins.serve(service.socket.clone(), dir_origin(name, path, range_limits)?);
            dirs.insert(name.clone(), service);
        }
    }
    let origins = Arc::new(origins);
    let store: Arc<dyn StateStore> = Arc::new(state::memory_store(&config.state));
    let metrics = Arc::new(Metrics::new());
    let Assembled { proxy, .. } = assemble_proxy(config, chains, &dirs, &store, &metrics)?;
    let client = crate::routes::origin_client::OriginClient::in_memory(Arc::clone(&origins));
    Ok((proxy.with_origin_client(client), origins))
}

/// The origin that serves `name`'s folder at `path`.
fn dir_origin(name: &str, path: &Path, range_limits: RangeLimits) -> Result<DirOrigin, StartError> {
    DirOrigin::new(path, range_limits).map_err(|source| StartError::Folder {
        name: name.to_owned(),
        path: path.to_owned(),
        source,
    })
}

/// A store, and the file it is kept in across restarts if it is.
type OpenedStore = (Arc<dyn StateStore>, Option<Arc<SnapshotFile>>);

/// The store `state` describes, and the file the embedded store is kept in, if any.
fn open_store(
    state: &StateConfig,
    runtime: &tokio::runtime::Runtime,
    upgrade: bool,
) -> Result<OpenedStore, StartError> {
    Ok(match &state.snapshot_file {
        Some(file) => {
            let memory = Arc::new(state::memory_store(state));
            let snapshot = SnapshotFile::open(Arc::clone(&memory), file, upgrade)?;
            (memory, Some(snapshot))
        }
        None => (runtime.block_on(state::connect(state))?, None),
    })
}

/// Saves the embedded store, if it is kept: the process is about to end.
fn save_snapshot(snapshot: Option<&SnapshotFile>) {
    if let Some(Err(e)) = snapshot.map(SnapshotFile::save) {
        warn!(error = %e, "the embedded store's records are lost with this process");
    }
}

/// Raises the soft limit on open descriptors to the hard one. The soft limit is often 1024, kept
/// low for programs that use select(2), which rangeway does not; `max_connections` is sized from
/// the hard limit.
fn raise_descriptor_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return;
    }
    let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
    if let Err(e) = setrlimit(Resource::Nofile, raised) {
        warn!(error = %e, soft = ?limit.current, hard = ?limit.maximum, "cannot raise the descriptor limit (RLIMIT_NOFILE) to its hard limit: max_connections may be more than can be open");
    }
}

/// The certificates `tls` names, loaded again (a reload's, or the start's after the check).
fn certificates(tls: &TlsConfig) -> Result<Certificates, StartError> {
    let loaded = tls
        .certificates
        .iter()
        .map(|certificate| crate::tls::load(&certificate.files))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StartError::Tls(e.to_string()))?;
    Certificates::new(&loaded, tls.default)
        .ok_or_else(|| StartError::Tls("no certificate to serve".to_owned()))
}

/// The HTTP/3 listeners beside the TLS ones, on their addresses (UDP), presenting the
/// certificates `resolver` picks. Their sockets are bound now: for an `upgrade`, beside the
/// running process's, which finishes its connections meanwhile (`h3::steering`); if it does
/// not share them, once it has drained (`h3::bind_when_free`).
fn h3_service(
    config: &Config,
    tls: &TlsConfig,
    h3: &crate::tls::H3Config,
    (resolver, places): (&Arc<SniResolver>, ConnectionPlaces),
    proxy: Proxy,
    metrics: &Arc<Metrics>,
    upgrade: bool,
) -> Result<GenBackgroundService<H3Service>, StartError> {
    let server_config = crate::h3::server_config(h3, resolver).map_err(StartError::Tls)?;
    let key = "tls.listen (UDP, for tls.h3)";
    let marker = crate::h3::Marker::random();
    let mut sockets = Vec::with_capacity(tls.listen.len());
    for &addr in &tls.listen {
        let socket = match upgrade {
            true => crate::h3::bind_beside(addr, marker)
                .inspect_err(|e| info!(%addr, error = %e, "HTTP/3 cannot share the UDP port with the process it upgrades"))
                .ok(),
            false => Some(
                crate::h3::bind(addr, marker)
                    .map_err(|source| StartError::Listen { key, addr, source })?,
            ),
        };
        sockets.push((addr, socket));
    }
    let limits = (config.server.client_limits, places);
    let sockets = (sockets, marker);
    let listener = H3Service::new(sockets, server_config, *h3, proxy, limits, Arc::clone(metrics));
    let mut service = background_service("rangeway http/3", listener);
    service.threads = Some(config.server.threads.get());
    Ok(service)
}

/// What the TLS listeners accept: TLS 1.2 and 1.3 with rustls's cipher suites (AES-GCM and
/// ChaCha20-Poly1305, ECDHE only), the certificate `resolver` picks, ALPN `h2` (when on) then
/// `http/1.1`.
fn tls_server_config(tls: &TlsConfig, resolver: &Arc<SniResolver>) -> Arc<ServerConfig> {
    pingora_rustls::install_default_crypto_provider();
    let versions = [&pingora_rustls::version::TLS12, &pingora_rustls::version::TLS13];
    let mut config = ServerConfig::builder_with_protocol_versions(&versions)
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(resolver) as Arc<dyn ResolvesServerCert>);
    config.alpn_protocols = match tls.h2 {
        true => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        false => vec![b"http/1.1".to_vec()],
    };
    Arc::new(config)
}

/// HTTP/2 with clients: pingora's bounded defaults (100 streams a connection, 64 KiB of
/// header list), plus bounds on what resets cost (rapid reset, CVE-2023-44487: streams a client
/// opens and resets at once each cost a little, and too many pending end the connection) and on
/// each stream's send buffer (a download's stream holds up to 1 MiB the client has not taken).
fn h2_options() -> pingora_core::protocols::http::v2::server::H2Options {
    let mut options = pingora_core::protocols::http::v2::server::default_h2_options();
    options
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(Some(256))
        .max_send_buffer_size(1 << 20);
    options
}

/// A `dir` upstream's folder, and the socket of the service that serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirService {
    folder: PathBuf,
    socket: PathBuf,
}

impl DirService {
    /// The service of upstream `name`'s `folder`, on a socket of its own.
    fn new(name: &str, folder: &Path) -> Self {
        Self { folder: folder.to_owned(), socket: dir::socket_path(name) }
    }
}

/// The upstreams and routes of `config`, with their middleware (`chains`, one per route).
/// `dir` upstreams are reached over the socket of the service [`build`] made for them (`dirs`).
fn build_routes(
    config: &Config,
    chains: Vec<Chain>,
    dirs: &BTreeMap<String, DirService>,
    metrics: &Metrics,
) -> Result<RouteTable, StartError> {
    let mut upstreams = BTreeMap::new();
    for (name, upstream) in &config.upstreams {
        let timeouts = Timeouts {
            connect: upstream.connect_timeout,
            read: upstream.read_timeout,
            write: upstream.write_timeout,
            idle: upstream.idle_timeout,
        };
        let failed = |source| StartError::Upstream { name: name.clone(), source };
        let built = match &upstream.kind {
            UpstreamKind::Dir { .. } => match dirs.get(name) {
                Some(service) => Upstream::unix(name, service.socket.clone(), timeouts),
                // The caller has checked that every dir upstream has its service.
                None => continue,
            },
            UpstreamKind::Http(http) => {
                let spec = replica_spec(http);
                Upstream::replicas(name, vec![spec], &http.base_path, timeouts).map_err(failed)?
            }
            UpstreamKind::Replicas(replicas) => {
                let base_path = replicas.first().map_or("", |r| r.base_path.as_str());
                let specs = replicas.iter().map(replica_spec).collect();
                Upstream::replicas(name, specs, base_path, timeouts).map_err(failed)?
            }
            UpstreamKind::S3(s3) => {
                match &s3.credentials {
                    Some(credentials) => {
                        info!(upstream = %name, bucket = %s3.bucket, credentials = %credentials.source, "S3 upstream: requests are signed")
                    }
                    None => {
                        info!(upstream = %name, bucket = %s3.bucket, "S3 upstream: anonymous, requests go unsigned")
                    }
                }
                Upstream::s3(name, s3, timeouts).map_err(failed)?
            }
        };
        if built.skips_verification() {
            warn!(upstream = %name, "TLS CERTIFICATE VERIFICATION IS OFF for this upstream (insecure_skip_verify = true): anyone on the path can impersonate it");
        }
        let built = built.with_health_check(upstream.health_check.clone());
        upstreams.insert(name.clone(), Arc::new(built));
    }
    let mut routes = Vec::with_capacity(config.routes.len());
    for (index, (route, chain)) in config.routes.iter().zip(chains).enumerate() {
        let Some(upstream) = upstreams.get(&route.upstream) else {
            continue; // Config::load has refused unknown upstream names.
        };
        let mut built = Route::new(
            route.host.clone(),
            &route.path_prefix,
            route.strip_prefix,
            Arc::clone(upstream),
            chain,
        )
        .map_err(|source| StartError::Route { index, source })?;
        built.s3_client_keys = route.s3_client_keys.clone();
        built.s3_presigned_grace = route.s3_presigned_grace;
        built.upstream_resume = route.upstream_resume;
        built.s3_response_overrides = route.s3_response_overrides;
        built.cache = route.cache;
        built.signed_links = route.signed_links.clone();
        built.download_limits = route.download_limits;
        built.rate_limit = route.rate_limit.clone();
        built.methods = route.methods.clone();
        if built.cache.is_some() {
            metrics.cache_route(&built.name);
        }
        if !built.chain.stages().is_empty() {
            metrics.middleware_route(&built.name);
        }
        metrics.resume_route(&built.name);
        routes.push(built);
    }
    Ok(RouteTable::new(routes))
}

fn replica_spec(http: &HttpUpstream) -> ReplicaSpec {
    ReplicaSpec {
        host: http.host.clone(),
        port: http.port,
        tls: http.tls.then(|| TlsSettings {
            sni: http.sni.clone(),
            ca_file: http.ca_file.clone(),
            insecure_skip_verify: http.insecure_skip_verify,
        }),
        host_header: http.host_header.clone(),
    }
}

/// Whether the listeners' addresses can be bound. pingora binds them only once the server runs,
/// and a taken address is then retried for a while and ends the proxy's thread with the process
/// still up (answering /healthz): so it is tried here first, and a taken or foreign address is an
/// error at start. (Taken over with `--upgrade`, they are the running process's.)
fn can_listen(config: &Config) -> Result<(), StartError> {
    let tls = config.tls.iter().flat_map(|tls| tls.listen.iter().map(|addr| ("tls.listen", *addr)));
    for (key, addr) in [
        ("server.listen", config.server.listen),
        ("server.admin_listen", config.server.admin_listen),
    ]
    .into_iter()
    .chain(tls)
    {
        std::net::TcpListener::bind(addr).map_err(|source| StartError::Listen {
            key,
            addr,
            source,
        })?;
    }
    Ok(())
}

/// Runs until SIGTERM (graceful: new connections are refused, and the process ends when the
/// responses in flight have, at most `grace_period` later), SIGINT (fast) or SIGQUIT (hand the
/// listening sockets to a new process).
///
/// SIGHUP reloads the config from `source` (the embedded default when `None`): see [`Reloader`].
pub fn run(
    config: &Config,
    registry: StageRegistry,
    source: Option<PathBuf>,
    upgrade: bool,
) -> Result<(), StartError> {
    let built = build(config, &registry, upgrade)?;
    announce(&built.endpoints);
    let reloader = Reloader {
        source,
        registry,
        running: config.clone(),
        dirs: built.dirs,
        routes: built.routes,
        metrics: Arc::clone(&built.metrics),
        certificates: built.certificates,
    };
    reloader.watch_hangups();
    let watch = DrainOnTerminate {
        metrics: built.metrics,
        grace: config.server.grace_period,
        snapshot: built.snapshot.clone(),
    };
    let _store = built.store;
    built.server.run(RunArgs { shutdown_signal: Box::new(watch) });
    save_snapshot(built.snapshot.as_deref());
    Ok(())
}

/// Reloads the config on SIGHUP, validating it first: the routes, their upstreams and their
/// middleware are replaced whole, at once, and requests in flight finish on what they began
/// with. A config with errors changes nothing (the errors are logged, each with its fix). What is
/// read only at start — listeners, threads, the state store, the admin token, client limits,
/// `dir` upstreams (each is a service of its own) — is kept; a change to it is logged as needing
/// a restart.
struct Reloader {
    source: Option<PathBuf>,
    registry: StageRegistry,
    running: Config,
    dirs: BTreeMap<String, DirService>,
    routes: Arc<RouteSwitch>,
    metrics: Arc<Metrics>,
    certificates: Option<Arc<SniResolver>>,
}

impl Reloader {
    fn watch_hangups(mut self) {
        use tokio::signal::unix::{SignalKind, signal};
        // The handler is in place before this returns, so a SIGHUP right after start reloads
        // rather than ending the process (SIGHUP's default).
        let watching = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(
            |runtime| {
                let hangups = {
                    let _entered = runtime.enter();
                    signal(SignalKind::hangup())?
                };
                Ok((runtime, hangups))
            },
        );
        let (runtime, mut hangups) = match watching {
            Ok(watching) => watching,
            Err(e) => {
                warn!(error = %e, "cannot watch for SIGHUP: reloading the config needs a restart");
                return;
            }
        };
        let watcher = move || {
            runtime.block_on(async move {
                while hangups.recv().await.is_some() {
                    self.reload();
                }
            });
        };
        if let Err(e) = std::thread::Builder::new().name("rangeway-reload".into()).spawn(watcher) {
            warn!(error = %e, "cannot watch for SIGHUP: reloading the config needs a restart");
        }
    }

    fn reload(&mut self) {
        let source = self
            .source
            .as_deref()
            .map_or("the embedded default".into(), |p| p.display().to_string());
        let loaded = match &self.source {
            Some(path) => Config::load(path, &self.registry),
            None => Config::load_default(&self.registry),
        };
        let checked = loaded.and_then(|config| {
            let chains = config.build_chains(&self.registry)?;
            Ok((config, chains))
        });
        let (config, chains) = match checked {
            Ok(checked) => checked,
            Err(errors) => {
                warn!(config = %source, "SIGHUP: the config has errors, the running one stays:\n{errors}");
                return;
            }
        };
        let folders: BTreeMap<&String, &PathBuf> = config
            .upstreams
            .iter()
            .filter_map(|(name, u)| match &u.kind {
                UpstreamKind::Dir { path } => Some((name, path)),
                _ => None,
            })
            .collect();
        let served: BTreeMap<&String, &PathBuf> =
            self.dirs.iter().map(|(name, service)| (name, &service.folder)).collect();
        if folders != served {
            warn!(config = %source, "SIGHUP: the dir upstreams changed (added, removed or moved), which needs a restart; the running config stays");
            return;
        }
        let table = match build_routes(&config, chains, &self.dirs, &self.metrics) {
            Ok(table) => table,
            Err(e) => {
                warn!(config = %source, error = %e, "SIGHUP: the config cannot be put in force, the running one stays");
                return;
            }
        };
        let count = config.routes.len();
        self.routes.replace(table);
        // The certificates, read again whether or not their paths changed (a renewal rewrites
        // the files): new handshakes present them, connections made keep theirs.
        if let (Some(resolver), Some(tls)) = (&self.certificates, &config.tls) {
            match certificates(tls) {
                Ok(loaded) => {
                    resolver.replace(loaded);
                    let names = tls.certificates.iter().flat_map(|c| &c.names);
                    let names = names.map(String::as_str).collect::<Vec<_>>().join(", ");
                    info!(config = %source, names, "SIGHUP: new TLS handshakes get the certificates read now");
                    for warning in tls.warnings(std::time::SystemTime::now()) {
                        warn!("{warning}");
                    }
                }
                Err(e) => {
                    warn!(config = %source, error = %e, "SIGHUP: the certificates cannot be loaded; the running ones stay")
                }
            }
        }
        for part in restart_only_changes(&self.running, &config) {
            warn!(config = %source, "SIGHUP: {part} changed, which takes effect at the next restart");
        }
        info!(config = %source, routes = count, upstreams = config.upstreams.len(), "SIGHUP: reloaded; new requests take the new routes");
        self.running = config;
    }
}

/// The settings of `new` that differ from `running` and are read only at start.
fn restart_only_changes(running: &Config, new: &Config) -> Vec<&'static str> {
    let (a, b) = (&running.server, &new.server);
    let token =
        |s: &crate::config::ServerConfig| s.admin_token.as_ref().map(|t| t.env_var().to_owned());
    [
        ("server.listen", a.listen != b.listen),
        ("server.admin_listen", a.admin_listen != b.admin_listen),
        ("server.threads", a.threads != b.threads),
        ("server.grace_period", a.grace_period != b.grace_period),
        ("server.max_ranges", a.max_ranges != b.max_ranges),
        ("server.admin_token_env", token(a) != token(b)),
        ("server.upgrade_socket", a.upgrade_socket != b.upgrade_socket),
        ("server.proxy_protocol", a.proxy_protocol != b.proxy_protocol),
        ("server.trusted_proxies", a.trusted_proxies != b.trusted_proxies),
        ("server.admin_hosts", a.admin_hosts != b.admin_hosts),
        ("the client limits of [server]", a.client_limits != b.client_limits),
        ("[state]", running.state != new.state),
        ("[cache]", running.cache != new.cache),
        ("[traces]", running.traces != new.traces),
        ("[log]", running.log != new.log),
        (
            "tls.listen, tls.h2 or tls.h3",
            running.tls.as_ref().map(|t| (&t.listen, t.h2, t.h3))
                != new.tls.as_ref().map(|t| (&t.listen, t.h2, t.h3)),
        ),
    ]
    .into_iter()
    .filter_map(|(part, changed)| changed.then_some(part))
    .collect()
}

/// pingora's Unix signals, with a drain that ends with the last response.
///
/// On SIGTERM pingora closes the listeners, then sleeps out the whole grace period before it
/// stops, even with nothing in flight, and a SIGINT meanwhile does not cut that short. A watcher
/// of rangeway's own ends the process as soon as no response is in flight (a response counts
/// until its logging phase, which records it, is over), or at a SIGINT or second SIGTERM; else
/// pingora's grace period runs out as before.
struct DrainOnTerminate {
    metrics: Arc<Metrics>,
    grace: Duration,
    snapshot: Option<Arc<SnapshotFile>>,
}

#[async_trait]
impl ShutdownSignalWatch for DrainOnTerminate {
    async fn recv(&self) -> ShutdownSignal {
        let signal = UnixShutdownSignalWatch.recv().await;
        match signal {
            ShutdownSignal::GracefulTerminate => {
                Drain::new(self, Duration::ZERO).watch();
            }
            // pingora hands the sockets over, then keeps accepting beside the new process for
            // its close timeout (5 s) before it stops: the drain begins after that.
            ShutdownSignal::GracefulUpgrade => {
                Drain::new(self, UPGRADE_CLOSE_TIMEOUT).watch();
            }
            _ => {}
        }
        signal
    }
}

/// How long pingora keeps accepting after it handed its sockets to a new process.
const UPGRADE_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The drain after a graceful signal; see [`DrainOnTerminate`].
struct Drain {
    metrics: Arc<Metrics>,
    grace: Duration,
    /// When the drain begins, from now.
    after: Duration,
    snapshot: Option<Arc<SnapshotFile>>,
}

impl Drain {
    fn new(signalled: &DrainOnTerminate, after: Duration) -> Self {
        Self {
            metrics: Arc::clone(&signalled.metrics),
            grace: signalled.grace,
            after,
            snapshot: signalled.snapshot.clone(),
        }
    }

    /// Ends the process, its embedded store saved, when the drain is over.
    fn watch(self) {
        use tokio::signal::unix::{SignalKind, signal};
        use tokio::time::sleep;
        let Self { metrics, grace, after, snapshot } = self;
        let watcher = move || {
            // pingora's own runtime is no longer driven once the signal is handed over.
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build()
            else {
                return;
            };
            runtime.block_on(async move {
                let (Ok(mut interrupt), Ok(mut terminate)) =
                    (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
                else {
                    return;
                };
                sleep(after).await;
                info!(in_flight = metrics.in_flight(), quic = metrics.quic_open(), ?grace, "draining: new connections are refused");
                // Idle twice in a row, so that a request read just as the listeners closed counts.
                // QUIC connections are waited for too: their last bytes leave from this process.
                let drained = async {
                    let mut idle_before = false;
                    loop {
                        sleep(Duration::from_millis(50)).await;
                        let idle = metrics.in_flight() == 0 && metrics.quic_open() == 0;
                        if idle && idle_before {
                            return;
                        }
                        idle_before = idle;
                    }
                };
                tokio::select! {
                    () = drained => info!("drained: no response in flight, no QUIC connection open"),
                    _ = interrupt.recv() => info!("SIGINT during the drain: stopping now"),
                    _ = terminate.recv() => info!("a second SIGTERM during the drain: stopping now"),
                    // pingora's grace period ends about now: its shutdown takes over.
                    () = sleep(grace) => return,
                }
                save_snapshot(snapshot.as_deref());
                // Spans still batched go out before the process ends (exit skips destructors).
                crate::traces::flush();
                std::process::exit(0);
            });
        };
        if let Err(e) = std::thread::Builder::new().name("rangeway-drain".into()).spawn(watcher) {
            warn!(error = %e, "cannot watch the drain; the grace period runs out in full");
        }
    }
}

fn announce(endpoints: &Endpoints) {
    info!(proxy = %endpoints.proxy, admin = %endpoints.admin, "rangeway is listening");
    println!(
        "rangeway: proxy on http://{}  admin on http://{} (/healthz /readyz /metrics /ui)",
        endpoints.proxy, endpoints.admin
    );
    for path in &endpoints.samples {
        println!(
            "try a resumable download: curl -C - -o sample.bin http://{}{path}",
            endpoints.proxy
        );
    }
}

/// A server running on a thread of its own, stopped when dropped: for tests and embedding.
#[derive(Debug)]
pub struct Running {
    pub endpoints: Endpoints,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    store: Option<StoreRuntime>,
    snapshot: Option<Arc<SnapshotFile>>,
}

impl Running {
    /// Starts the server and waits until the proxy and admin listeners accept connections.
    pub fn start(config: &Config, registry: &StageRegistry) -> Result<Self, StartError> {
        let Built { server, endpoints, store, snapshot, .. } = build(config, registry, false)?;
        let (stop, stopped) = oneshot::channel();
        let watch = FastShutdownOn(Mutex::new(Some(stopped)));
        let thread = std::thread::Builder::new()
            .name("rangeway-server".into())
            .spawn(move || server.run(RunArgs { shutdown_signal: Box::new(watch) }))
            .map_err(StartError::Thread)?;
        let running = Self {
            endpoints,
            stop: Some(stop),
            thread: Some(thread),
            store: Some(store),
            snapshot,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for addr in [running.endpoints.proxy, running.endpoints.admin] {
            loop {
                let timeout = std::time::Duration::from_millis(200);
                if std::net::TcpStream::connect_timeout(&addr, timeout).is_ok() {
                    break;
                }
                // A server that stopped, or never listens: an error (dropping `running` stops
                // what is left of it), never a handle to nothing.
                let stopped = running.thread.as_ref().is_none_or(JoinHandle::is_finished);
                if stopped || std::time::Instant::now() >= deadline {
                    return Err(StartError::NotListening(addr));
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        Ok(running)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        save_snapshot(self.snapshot.as_deref());
        // Dropping a runtime blocks on its tasks' shutdown; don't do that on a runtime thread.
        if let Some(StoreRuntime(runtime)) = self.store.take() {
            runtime.shutdown_background();
        }
    }
}

/// Shuts the server down at once (no grace period) when the sender fires or is dropped.
struct FastShutdownOn(Mutex<Option<oneshot::Receiver<()>>>);

#[async_trait]
impl ShutdownSignalWatch for FastShutdownOn {
    async fn recv(&self) -> ShutdownSignal {
        let receiver = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(receiver) = receiver {
            let _ = receiver.await;
        }
        ShutdownSignal::FastShutdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_names_what_only_a_restart_changes() {
        let kinds = StageRegistry::new();
        let text = "[upstreams.o]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\npath_prefix = \"/\"\nupstream = \"o\"\n";
        let running = Config::from_toml_str(text, &kinds).expect("valid");
        let same = Config::from_toml_str(&text.replace("/\"", "/x/\""), &kinds).expect("valid");
        assert!(restart_only_changes(&running, &same).is_empty(), "routes reload");
        let moved = Config::from_toml_str(
            &format!("[server]\nlisten = \"127.0.0.1:1\"\nmax_header_fields = 9\n[state]\nttl = \"1h\"\n{text}"),
            &kinds,
        )
        .expect("valid");
        assert_eq!(
            restart_only_changes(&running, &moved),
            ["server.listen", "the client limits of [server]", "[state]"]
        );
    }
}
