//! HTTP/3 to clients: QUIC on UDP beside each TLS listener (`[tls] h3`), its requests answered
//! by the same pipeline as HTTP/1 and HTTP/2 (`Proxy::answer_h3`, through a `ClientSession` of
//! HTTP/3's own).
//!
//! pingora has no HTTP/3, so this listener is a service of rangeway's own beside pingora's: a
//! quinn endpoint per `[tls] listen` address, its handshakes made with the TLS listeners' rustls
//! and their very certificate resolver (one SIGHUP reload serves both), h3 over each connection,
//! and a task per request stream. What a client may cost is bounded before the pipeline sees a
//! request: QUIC's amplification limit (quinn sends at most three times what an unvalidated
//! address sent), a Retry that makes a client prove its address once many handshakes are in
//! flight or its address has all its connections (a flood of Initials from spoofed addresses
//! then costs a stateless answer each), connections per address, streams per connection, an idle
//! timeout, and 0-RTT off unless configured (and then for GET and HEAD only).
//!
//! A connection keeps its client when the client's address changes (a NAT rebinding, a phone
//! changing networks): quinn validates the new path (RFC 9000 §9) and the download goes on; the
//! handshake's address stays the client's identity for ids, limits and the access line.
//!
//! On SIGTERM new connections are refused, each connection is told GOAWAY (RFC 9114 §5.2), its
//! requests finish, and it closes once the client has acknowledged every response on it: the
//! drain (`crate::server`) waits for the connections as for the responses, since their last
//! bytes go out from this process. h3 runs over quinn through `crate::h3_transport`, which gives
//! each request its stream's `stopped()` for that and for a client that stops reading, and lets
//! its body's chunks reach quinn uncopied.
//!
//! A graceful `--upgrade` shares each UDP port between the two processes: new connections reach
//! the new one at once, while the old one finishes its own ([`steering`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use prometheus::IntGauge;
use quinn::crypto::rustls::QuicServerConfig;
use quinn::{Endpoint, EndpointConfig, IdleTimeout, Incoming, TransportConfig, VarInt};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::admission::{ClientLimits, ConnectionPlace, ConnectionPlaces};
use crate::h3_transport::{LastAccepted, Transport};
use crate::proxy::{H3Client, Proxy};
use crate::telemetry::metrics::{Metrics, QuicHandshake};
use crate::tls::{H3Config, SniResolver, TlsConfig};
pub(crate) use steering::Marker;

mod steering;

/// Unidirectional streams a client may open: HTTP/3's control stream and QPACK's two, and room
/// for the reserved (grease) ones clients send.
const UNI_STREAMS: u32 = 16;

/// Bytes a connection keeps sent but not yet acknowledged, its downloads together: enough for a
/// fast path's round trip, bounded so that many slow clients cannot hold much each.
const SEND_WINDOW: u64 = 8 << 20;

/// Connection attempts quinn holds before the listener has looked at them, and their first
/// packets' bytes: bounds on what a flood of Initials can make it keep.
const MAX_INCOMING: usize = 4096;
const INCOMING_BUFFER: u64 = 64 << 10;
const INCOMING_BUFFER_TOTAL: u64 = 16 << 20;

/// Kernel buffers of each UDP socket: a download's packets leave in bursts (GSO), and its
/// client's acknowledgements arrive in bursts.
const SOCKET_BUFFER: usize = 4 << 20;

/// `Alt-Svc` for the answers of the TLS listeners, when HTTP/3 is on: its port, for a day.
pub(crate) fn alt_svc(tls: &TlsConfig) -> Option<http::HeaderValue> {
    let h3 = tls.h3.as_ref()?;
    let port = h3.alt_svc_port.or_else(|| tls.listen.first().map(SocketAddr::port))?;
    http::HeaderValue::from_str(&format!("h3=\":{port}\"; ma=86400")).ok()
}

/// A UDP socket for QUIC on `addr`, bound now (so that a taken port is an error at start, and
/// packets wait in the kernel until the listener runs), its packets steered by `marker`.
pub(crate) fn bind(addr: SocketAddr, marker: Marker) -> io::Result<UdpSocket> {
    // Shared only with a process this one hands over to: bound alone first, so that another
    // process on the port is found, not joined.
    drop(socket(addr, false)?);
    let socket = socket(addr, true)?;
    // Alone on the port, nothing needs steering yet: a kernel that refuses the program (a
    // sandbox's) costs only the sharing at an upgrade, which a process that can steer still has.
    if let Err(e) = marker.steer(&socket) {
        warn!(%addr, error = %e, "HTTP/3: QUIC packets cannot be steered between processes on this port");
    }
    Ok(socket)
}

/// A UDP socket for QUIC on `addr`, which the process this one upgrades holds too (see
/// [`steering`]): an error when that process did not share it.
pub(crate) fn bind_beside(addr: SocketAddr, marker: Marker) -> io::Result<UdpSocket> {
    let socket = socket(addr, true)?;
    marker.steer(&socket)?;
    Ok(socket)
}

fn socket(addr: SocketAddr, shared: bool) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // The kernel may cap them lower (net.core.[rw]mem_max): what it gives is what there is.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    socket.set_nonblocking(true)?;
    socket.set_reuse_port(shared)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// The TLS side of QUIC: TLS 1.3 only (QUIC's), ALPN `h3`, the certificates `resolver` picks,
/// early data only when configured.
pub(crate) fn server_config(
    h3: &H3Config,
    resolver: &Arc<SniResolver>,
) -> Result<quinn::ServerConfig, String> {
    pingora_rustls::install_default_crypto_provider();
    let mut crypto = rustls::ServerConfig::builder_with_protocol_versions(&[
        &rustls::version::TLS13,
    ])
    .with_no_client_auth()
    .with_cert_resolver(Arc::clone(resolver) as Arc<dyn rustls::server::ResolvesServerCert>);
    crypto.alpn_protocols = vec![b"h3".to_vec()];
    // QUIC allows no other sizes (RFC 9001 §4.6.1).
    crypto.max_early_data_size = if h3.early_data { u32::MAX } else { 0 };
    let crypto = QuicServerConfig::try_from(crypto).map_err(|e| e.to_string())?;
    let mut transport = TransportConfig::default();
    let idle = IdleTimeout::try_from(h3.idle_timeout).map_err(|e| e.to_string())?;
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(h3.max_streams))
        .max_concurrent_uni_streams(VarInt::from_u32(UNI_STREAMS))
        .max_idle_timeout(Some(idle))
        .send_window(SEND_WINDOW);
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config
        .transport_config(Arc::new(transport))
        .migration(true)
        .max_incoming(MAX_INCOMING)
        .incoming_buffer_size(INCOMING_BUFFER)
        .incoming_buffer_size_total(INCOMING_BUFFER_TOTAL);
    Ok(config)
}

/// The HTTP/3 listeners: a background service of pingora's server, on a runtime of its own.
pub(crate) struct H3Service {
    /// Each listener's address, and its socket when it was bound at start (not when taken over
    /// from a running rangeway with `--upgrade`, which holds it until it has drained).
    sockets: Mutex<Vec<(SocketAddr, Option<UdpSocket>)>>,
    /// What this process's connection IDs begin with, and its sockets steer by.
    marker: Marker,
    server_config: quinn::ServerConfig,
    listener: Arc<Listener>,
}

/// What every connection of the listeners shares.
struct Listener {
    proxy: Arc<Proxy>,
    metrics: Arc<Metrics>,
    limits: ClientLimits,
    config: H3Config,
    places: Places,
    /// `max_connections`, which QUIC connections share with the TCP listeners'.
    everyone: ConnectionPlaces,
    handshakes: Arc<AtomicUsize>,
}

impl H3Service {
    pub(crate) fn new(
        (sockets, marker): (Vec<(SocketAddr, Option<UdpSocket>)>, Marker),
        server_config: quinn::ServerConfig,
        config: H3Config,
        proxy: Proxy,
        (limits, everyone): (ClientLimits, ConnectionPlaces),
        metrics: Arc<Metrics>,
    ) -> Self {
        let places = Places::new(metrics.quic_connections());
        let proxy = Arc::new(proxy);
        let handshakes = Arc::new(AtomicUsize::new(0));
        let listener = Listener { proxy, metrics, limits, config, places, everyone, handshakes };
        let sockets = Mutex::new(sockets);
        Self { sockets, marker, server_config, listener: Arc::new(listener) }
    }
}

#[async_trait]
impl BackgroundService for H3Service {
    async fn start(&self, shutdown: ShutdownWatch) {
        let sockets =
            std::mem::take(&mut *self.sockets.lock().unwrap_or_else(PoisonError::into_inner));
        let mut listeners = JoinSet::new();
        for (addr, socket) in sockets {
            let (config, listener) = (self.server_config.clone(), Arc::clone(&self.listener));
            let (shutdown, marker) = (shutdown.clone(), self.marker);
            listeners.spawn(async move {
                let socket = match socket {
                    Some(socket) => socket,
                    None => bind_when_free(addr, marker).await,
                };
                let runtime = Arc::new(quinn::TokioRuntime);
                let mut endpoint = EndpointConfig::default();
                endpoint.cid_generator(marker.cid_generator());
                match Endpoint::new(endpoint, Some(config), socket, runtime) {
                    Ok(endpoint) => {
                        info!(%addr, "HTTP/3 listening (UDP)");
                        listener.accept(endpoint, shutdown).await;
                    }
                    Err(e) => warn!(%addr, error = %e, "HTTP/3 cannot listen on this address"),
                }
            });
        }
        while listeners.join_next().await.is_some() {}
    }
}

/// A socket on `addr` once it can be bound, for a rangeway started with `--upgrade` that could
/// not share the port with the one it replaces (a rangeway from before [`steering`], or a
/// kernel without it): only once that one has drained its QUIC connections, whose packets
/// reaching this process would end them. Until then HTTP/3 clients go to TCP.
async fn bind_when_free(addr: SocketAddr, marker: Marker) -> UdpSocket {
    let mut told = false;
    loop {
        match bind(addr, marker) {
            Ok(socket) => return socket,
            Err(e) if !told => {
                info!(%addr, error = %e, "HTTP/3 waits for the UDP port (the process before this one still drains it)");
                told = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How a connection attempt is met.
enum Admit {
    Accept,
    Retry,
    Refuse(QuicHandshake),
}

impl Listener {
    /// Accepts connections on `endpoint`, each served by a task of its own, until the server
    /// stops; after a graceful signal, refuses new ones.
    async fn accept(self: Arc<Self>, endpoint: Endpoint, mut shutdown: ShutdownWatch) {
        let mut draining = *shutdown.borrow();
        loop {
            let incoming = tokio::select! {
                incoming = endpoint.accept() => match incoming {
                    Some(incoming) => incoming,
                    None => return,
                },
                _ = shutdown.changed(), if !draining => {
                    draining = true;
                    continue;
                }
            };
            let ip = incoming.remote_address().ip().to_canonical();
            let admit = match draining {
                true => Admit::Refuse(QuicHandshake::RefusedDraining),
                false => self.admit(&incoming, ip),
            };
            match admit {
                Admit::Retry => {
                    self.metrics.quic_handshake(QuicHandshake::Retried);
                    if let Err(e) = incoming.retry() {
                        e.into_incoming().refuse();
                    }
                }
                Admit::Refuse(why) => {
                    self.metrics.quic_handshake(why);
                    incoming.refuse();
                }
                Admit::Accept => {
                    let Some(place) = self.place(ip) else {
                        // Counted by the admission, as its listeners' refusals are.
                        incoming.refuse();
                        continue;
                    };
                    // In flight from now, not from when its task first runs: the attempts of a
                    // burst are admitted one after another before any of their tasks has run,
                    // and each must count those admitted before it (`retry_above_handshakes`).
                    let handshake = Handshake::start(&self.handshakes);
                    let listener = Arc::clone(&self);
                    let admitted = (place, handshake);
                    tokio::spawn(listener.connection(incoming, admitted, shutdown.clone()));
                }
            }
        }
    }

    /// Whether a connection attempt from `ip` is accepted, asked to prove its address first
    /// (many handshakes in flight, or the address has all its connections: a spoofed source
    /// cannot answer a Retry), or refused.
    fn admit(&self, incoming: &Incoming, ip: IpAddr) -> Admit {
        let busy =
            self.handshakes.load(Ordering::Relaxed) >= self.config.retry_above_handshakes as usize;
        let full = self.places.open(ip) >= self.config.max_connections_per_client;
        let unproven = !incoming.remote_address_validated() && incoming.may_retry();
        match (unproven, busy || full) {
            (true, true) => Admit::Retry,
            _ if full => Admit::Refuse(QuicHandshake::RefusedPerClient),
            _ => Admit::Accept,
        }
    }

    /// One connection, from its handshake to its close: its request streams each answered by a
    /// task of their own. It holds its place from its admission, and counts among the
    /// handshakes in flight until its handshake ends.
    async fn connection(
        self: Arc<Self>,
        incoming: Incoming,
        (_place, handshake): (Place, Handshake),
        shutdown: ShutdownWatch,
    ) {
        // The address of the handshake, which stays the client's whatever path the connection
        // migrates to.
        let peer = incoming.remote_address();
        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
        // Within client_header_timeout, as a TLS handshake over TCP: a client that starts one
        // and stalls holds its place no longer than a slow request header would.
        let connected = match incoming.accept() {
            Ok(connecting) => {
                tokio::time::timeout(self.limits.header_timeout, self.handshake(connecting)).await
            }
            Err(e) => Ok(Err(e)),
        };
        drop(handshake);
        let (connection, confirmed) = match connected {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => {
                self.metrics.quic_handshake(QuicHandshake::Failed);
                debug!(%peer, error = %e, "QUIC handshake failed");
                return;
            }
            Err(_) => {
                self.metrics.quic_handshake(QuicHandshake::Failed);
                debug!(%peer, "QUIC handshake took longer than client_header_timeout");
                return;
            }
        };
        self.metrics.quic_handshake(QuicHandshake::Accepted);
        let last_accepted = LastAccepted::default();
        let h3 = h3::server::builder()
            .max_field_section_size(self.limits.max_header_bytes as u64)
            .build(Transport::new(connection.clone(), last_accepted.clone()))
            .await;
        let mut h3: h3::server::Connection<Transport, Bytes> = match h3 {
            Ok(h3) => h3,
            Err(e) => {
                debug!(%peer, error = %e, "HTTP/3 did not start on a QUIC connection");
                return;
            }
        };
        let client = H3Client { peer, connection: connection.clone(), early: false };
        self.requests(&mut h3, &client, (&confirmed, &last_accepted), shutdown).await;
        // Every response acknowledged (or its client gone): dropping h3 closes the connection.
        let last = connection.remote_address();
        if SocketAddr::new(last.ip().to_canonical(), last.port()) != peer {
            self.metrics.quic_migrated();
        }
    }

    /// The handshake: the connection, and whether it is confirmed (`false` while 0-RTT requests
    /// may still arrive; a task sets it once the handshake completes).
    async fn handshake(
        &self,
        connecting: quinn::Connecting,
    ) -> Result<(quinn::Connection, Arc<AtomicBool>), quinn::ConnectionError> {
        if self.config.early_data {
            match connecting.into_0rtt() {
                Ok((connection, accepted)) => {
                    let confirmed = Arc::new(AtomicBool::new(false));
                    let done = Arc::clone(&confirmed);
                    tokio::spawn(async move {
                        accepted.await;
                        done.store(true, Ordering::Release);
                    });
                    return Ok((connection, confirmed));
                }
                Err(connecting) => {
                    return connecting.await.map(|c| (c, Arc::new(AtomicBool::new(true))));
                }
            }
        }
        connecting.await.map(|c| (c, Arc::new(AtomicBool::new(true))))
    }

    /// Takes the connection's requests until it ends, or until the server drains and its
    /// requests have been answered.
    async fn requests(
        &self,
        h3: &mut h3::server::Connection<Transport, Bytes>,
        client: &H3Client,
        (confirmed, last_accepted): (&AtomicBool, &LastAccepted),
        mut shutdown: ShutdownWatch,
    ) {
        let mut tasks = JoinSet::new();
        let mut draining = *shutdown.borrow();
        if draining {
            let _ = h3.shutdown(0).await;
        }
        loop {
            tokio::select! {
                accepted = h3.accept() => match accepted {
                    Ok(Some(resolver)) => {
                        let mut client = client.clone();
                        client.early = !confirmed.load(Ordering::Acquire);
                        // The stream h3 has just accepted is this request's.
                        let handle = last_accepted.take();
                        let (proxy, timeout) = (Arc::clone(&self.proxy), self.limits.header_timeout);
                        tasks.spawn(async move {
                            match tokio::time::timeout(timeout, resolver.resolve_request()).await {
                                Ok(Ok((request, stream))) => {
                                    let acknowledged =
                                        proxy.answer_h3(request, stream, &client, handle).await;
                                    // The task ends once the client has it all (or is gone),
                                    // so that a drained connection closes with nothing unsent.
                                    if let Some(acknowledged) = acknowledged {
                                        acknowledged.await;
                                    }
                                }
                                Ok(Err(e)) => debug!(peer = %client.peer, error = %e, "an HTTP/3 request could not be read"),
                                Err(_) => debug!(peer = %client.peer, "an HTTP/3 request header took longer than client_header_timeout"),
                            }
                        });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        debug!(peer = %client.peer, error = %e, "HTTP/3 connection ended");
                        break;
                    }
                },
                _ = shutdown.changed(), if !draining => {
                    draining = true;
                    // GOAWAY: the requests already begun are answered, no new one is taken.
                    let _ = h3.shutdown(0).await;
                    if tasks.is_empty() {
                        break;
                    }
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {
                    if draining && tasks.is_empty() {
                        break;
                    }
                }
            }
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// A handshake in flight, counted while it lasts.
struct Handshake(Arc<AtomicUsize>);

impl Handshake {
    fn start(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(count))
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The QUIC connections open, by address and in all.
struct Places {
    by_address: Mutex<HashMap<IpAddr, u32>>,
    open: IntGauge,
}

impl Places {
    fn new(open: IntGauge) -> Self {
        Self { by_address: Mutex::new(HashMap::new()), open }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, u32>> {
        self.by_address.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open(&self, ip: IpAddr) -> u32 {
        self.lock().get(&ip).copied().unwrap_or(0)
    }

    fn release(&self, ip: IpAddr) {
        let mut by_address = self.lock();
        if let std::collections::hash_map::Entry::Occupied(mut open) = by_address.entry(ip) {
            *open.get_mut() -= 1;
            if *open.get() == 0 {
                open.remove();
            }
        }
        self.open.dec();
    }
}

/// A connection's place among the listener's [`Places`] and among `max_connections`, given up
/// when dropped.
struct Place {
    listener: Arc<Listener>,
    ip: IpAddr,
    _everyone: ConnectionPlace,
}

impl Listener {
    /// A place for a connection from `ip`; `None` when `max_connections` are open, none idle.
    fn place(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        let everyone = self.everyone.take()?;
        *self.places.lock().entry(ip).or_insert(0) += 1;
        self.places.open.inc();
        Some(Place { listener: Arc::clone(self), ip, _everyone: everyone })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.listener.places.release(self.ip);
    }
}
