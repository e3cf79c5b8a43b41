//! Assembling and running the pingora server from a validated config.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use async_trait::async_trait;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{
    RunArgs, Server, ShutdownSignal, ShutdownSignalWatch, UnixShutdownSignalWatch,
};
use pingora_core::services::listening::Service;
use rangeway_middleware::chain::StageRegistry;
use rangeway_middleware::rfc9110::RangeLimits;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::admin::Admin;
use crate::admin::live::LiveResponses;
use crate::admin::metrics::Metrics;
use crate::config::{Config, UpstreamKind};
use crate::origin::dir::{self, DirOrigin};
use crate::proxy::Rangeway;
use crate::proxy::routing::{Route, RouteTable};
use crate::proxy::upstream::{Timeouts, TlsSettings, Upstream, UpstreamError};
use crate::state::{self, StoreError};

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
    Route { index: usize, source: crate::proxy::path::PathError },
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

/// Builds the pingora server: a `dir` origin per `dir` upstream, the proxy, the admin listener.
pub fn build(
    config: &Config,
    registry: &StageRegistry,
) -> Result<(Server, Endpoints, StoreRuntime, Arc<Metrics>), StartError> {
    let chains = config.build_chains(registry).map_err(StartError::Middleware)?;
    let store_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("rangeway-store")
        .enable_all()
        .build()
        .map_err(StartError::StoreRuntime)?;
    let store = store_runtime.block_on(state::connect(&config.state))?;
    let range_limits = RangeLimits::with_max_ranges(config.server.max_ranges);
    let metrics = Arc::new(Metrics::new());
    metrics.watch_store(Arc::clone(&store));

    let grace = config.server.grace_period.as_secs();
    let conf = ServerConf {
        threads: config.server.threads.get(),
        grace_period_seconds: Some(grace),
        graceful_shutdown_timeout_seconds: Some(grace.max(1)),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let mut upstreams = std::collections::BTreeMap::new();
    let mut sample_names = Vec::new();
    for (name, upstream) in &config.upstreams {
        let timeouts = Timeouts {
            connect: upstream.connect_timeout,
            read: upstream.read_timeout,
            write: upstream.write_timeout,
            idle: upstream.idle_timeout,
        };
        let built = match &upstream.kind {
            UpstreamKind::Dir { path } => {
                let sample = dir::prepare_folder(path).map_err(|source| StartError::Folder {
                    name: name.clone(),
                    path: path.clone(),
                    source,
                })?;
                if sample.is_some() {
                    sample_names.push(name.clone());
                }
                let origin = DirOrigin::new(path, range_limits).map_err(|source| {
                    StartError::Folder { name: name.clone(), path: path.clone(), source }
                })?;
                let socket = dir::socket_path(name);
                let mut service = Service::new(format!("dir origin {name}"), origin);
                service.add_uds(&socket.to_string_lossy(), None);
                service.threads = Some(1);
                server.add_service(service);
                Upstream::unix(name, socket, timeouts)
            }
            UpstreamKind::Http(http) => {
                let tls = http.tls.then(|| TlsSettings {
                    sni: http.sni.clone(),
                    ca_file: http.ca_file.clone(),
                    insecure_skip_verify: http.insecure_skip_verify,
                });
                let built = Upstream::http(
                    name,
                    &http.host,
                    http.port,
                    tls,
                    http.host_header.clone(),
                    &http.base_path,
                    timeouts,
                )
                .map_err(|source| StartError::Upstream { name: name.clone(), source })?;
                if built.skips_verification() {
                    warn!(upstream = %name, "TLS CERTIFICATE VERIFICATION IS OFF for this upstream (insecure_skip_verify = true): anyone on the path can impersonate it");
                }
                built
            }
        };
        upstreams.insert(name.clone(), Arc::new(built));
    }

    let mut routes = Vec::with_capacity(config.routes.len());
    let mut samples = Vec::new();
    for (index, (route, chain)) in config.routes.iter().zip(chains).enumerate() {
        let Some(upstream) = upstreams.get(&route.upstream) else {
            continue; // Config::load has refused unknown upstream names.
        };
        // The sample sits at the folder's root: reachable under the prefix when it is stripped.
        if route.strip_prefix && sample_names.contains(&route.upstream) {
            samples.push(format!(
                "{}/{}",
                route.path_prefix.trim_end_matches('/'),
                dir::SAMPLE_NAME
            ));
        }
        let built = Route::new(
            route.host.clone(),
            &route.path_prefix,
            route.strip_prefix,
            Arc::clone(upstream),
            chain,
        )
        .map_err(|source| StartError::Route { index, source })?;
        if !built.chain.stages().is_empty() {
            metrics.middleware_route(&built.name);
        }
        routes.push(built);
    }

    let routes = Arc::new(RouteTable::new(routes));
    let live = Arc::new(LiveResponses::new());
    let proxy = Rangeway::new(
        Arc::clone(&routes),
        range_limits,
        Arc::clone(&metrics),
        Arc::clone(&store),
        Arc::clone(&live),
    );
    let mut proxy_service =
        pingora_proxy::http_proxy_service_with_name(&server.configuration, proxy, "rangeway proxy");
    proxy_service.add_tcp(&config.server.listen.to_string());
    server.add_service(proxy_service);

    let admin_app = Admin::new(
        Arc::clone(&metrics),
        config.server.listen,
        store,
        routes,
        config.server.admin_token.clone(),
        live,
    );
    let mut admin = Service::new("admin".to_owned(), admin_app);
    admin.add_tcp(&config.server.admin_listen.to_string());
    admin.threads = Some(1);
    server.add_service(admin);

    let endpoints =
        Endpoints { proxy: config.server.listen, admin: config.server.admin_listen, samples };
    Ok((server, endpoints, StoreRuntime(store_runtime), metrics))
}

/// Runs until SIGTERM (graceful: new connections are refused, and the process ends when the
/// responses in flight have, at most `grace_period` later), SIGINT (fast) or SIGQUIT (hand the
/// listening sockets to a new process).
pub fn run(config: &Config, registry: &StageRegistry) -> Result<(), StartError> {
    let (server, endpoints, _store, metrics) = build(config, registry)?;
    announce(&endpoints);
    let watch = DrainOnTerminate { metrics, grace: config.server.grace_period };
    server.run(RunArgs { shutdown_signal: Box::new(watch) });
    Ok(())
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
    grace: std::time::Duration,
}

#[async_trait]
impl ShutdownSignalWatch for DrainOnTerminate {
    async fn recv(&self) -> ShutdownSignal {
        let signal = UnixShutdownSignalWatch.recv().await;
        if matches!(signal, ShutdownSignal::GracefulTerminate) {
            watch_drain(Arc::clone(&self.metrics), self.grace);
        }
        signal
    }
}

/// Ends the process when the drain is over; see [`DrainOnTerminate`].
fn watch_drain(metrics: Arc<Metrics>, grace: std::time::Duration) {
    use tokio::signal::unix::{SignalKind, signal};
    use tokio::time::{Duration, sleep};
    let watcher = move || {
        // pingora's own runtime is no longer driven once the signal is handed over.
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        runtime.block_on(async move {
            let (Ok(mut interrupt), Ok(mut terminate)) =
                (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
            else {
                return;
            };
            info!(in_flight = metrics.in_flight(), ?grace, "draining: new connections are refused");
            // Idle twice in a row, so that a request read just as the listeners closed counts.
            let drained = async {
                let mut idle_before = false;
                loop {
                    sleep(Duration::from_millis(50)).await;
                    let idle = metrics.in_flight() == 0;
                    if idle && idle_before {
                        return;
                    }
                    idle_before = idle;
                }
            };
            tokio::select! {
                () = drained => info!("drained: no response in flight"),
                _ = interrupt.recv() => info!("SIGINT during the drain: stopping now"),
                _ = terminate.recv() => info!("a second SIGTERM during the drain: stopping now"),
                // pingora's grace period ends about now: its shutdown takes over.
                () = sleep(grace) => return,
            }
            std::process::exit(0);
        });
    };
    if let Err(e) = std::thread::Builder::new().name("rangeway-drain".into()).spawn(watcher) {
        warn!(error = %e, "cannot watch the drain; the grace period runs out in full");
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
}

impl Running {
    /// Starts the server and waits until the proxy and admin listeners accept connections.
    pub fn start(config: &Config, registry: &StageRegistry) -> Result<Self, StartError> {
        let (server, endpoints, store, _) = build(config, registry)?;
        let (stop, stopped) = oneshot::channel();
        let watch = FastShutdownOn(Mutex::new(Some(stopped)));
        let thread = std::thread::Builder::new()
            .name("rangeway-server".into())
            .spawn(move || server.run(RunArgs { shutdown_signal: Box::new(watch) }))
            .map_err(StartError::Thread)?;
        for addr in [endpoints.proxy, endpoints.admin] {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::net::TcpStream::connect(addr).is_err()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        Ok(Self { endpoints, stop: Some(stop), thread: Some(thread), store: Some(store) })
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
