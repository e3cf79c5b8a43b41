//! Prometheus metrics, registered once and shared by the proxy and the admin listener.

use std::time::Duration;

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use crate::state::StateStore;

/// Every metric rangeway exports. Names are part of the operator contract (dashboards, alerts).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    transports: IntCounterVec,
    response_bytes: IntCounterVec,
    spliced_bytes: IntCounterVec,
    upstream_errors: IntCounterVec,
    upstream_ignored_range: IntCounterVec,
    resumes_refused: IntCounterVec,
    resumes_unvouched: IntCounterVec,
    links_refused: IntCounterVec,
    resumed_past_expiry: IntCounterVec,
    s3_clients_refused: IntCounterVec,
    downloads_limited: IntCounterVec,
    shaped_bytes: IntCounterVec,
    shaped_seconds: prometheus::CounterVec,
    origin_digest_mismatches: IntCounterVec,
    middleware_errors: IntCounterVec,
    upstream_resumes: IntCounterVec,
    connections_refused: IntCounterVec,
    duration: HistogramVec,
    active: IntGauge,
    client_connections: IntGauge,
    cache: CacheMetrics,
    quic: QuicMetrics,
}

/// `rangeway_quic_*`: the HTTP/3 listeners' QUIC connections (`crate::h3`).
#[derive(Debug, Clone)]
struct QuicMetrics {
    connections: IntGauge,
    handshakes: IntCounterVec,
    migrated: IntCounter,
}

impl QuicMetrics {
    fn new(registry: &Registry) -> Self {
        let connections = IntGauge::new(
            "rangeway_quic_connections",
            "QUIC connections open on the HTTP/3 listeners, handshakes included (a drain waits for them to close).",
        )
        .expect("valid metric");
        let handshakes = IntCounterVec::new(
            Opts::new(
                "rangeway_quic_handshakes_total",
                "QUIC connection attempts, by outcome: accepted (the handshake completed), failed (it did not, or timed out), retried (the client was asked to prove its address first: many handshakes in flight, or its address at its limit), refused_per_client (more open from one address than max_connections_per_client), refused_draining (the server is shutting down).",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let migrated = IntCounter::new(
            "rangeway_quic_migrated_total",
            "QUIC connections that ended on another client address or port than their handshake's (a NAT rebinding, a client that changed networks): each kept its downloads going.",
        )
        .expect("valid metric");
        registry.register(Box::new(connections.clone())).expect("metric names are unique");
        // Every outcome exported from the start, so a board's query has a series before the
        // first attempt.
        for outcome in QuicHandshake::ALL {
            handshakes.with_label_values(&[outcome.label()]);
        }
        registry.register(Box::new(handshakes.clone())).expect("metric names are unique");
        registry.register(Box::new(migrated.clone())).expect("metric names are unique");
        Self { connections, handshakes, migrated }
    }
}

/// How a QUIC connection attempt ended: the `outcome` of `rangeway_quic_handshakes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuicHandshake {
    /// The handshake completed.
    Accepted,
    /// It did not, or timed out.
    Failed,
    /// The client was asked to prove its address first.
    Retried,
    /// More connections open from its address than `max_connections_per_client`.
    RefusedPerClient,
    /// The server is shutting down.
    RefusedDraining,
}

impl QuicHandshake {
    const ALL: [Self; 5] = [
        Self::Accepted,
        Self::Failed,
        Self::Retried,
        Self::RefusedPerClient,
        Self::RefusedDraining,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Failed => "failed",
            Self::Retried => "retried",
            Self::RefusedPerClient => "refused_per_client",
            Self::RefusedDraining => "refused_draining",
        }
    }
}

/// `rangeway_cache_*`: the slice cache.
#[derive(Debug, Clone)]
struct CacheMetrics {
    requests: IntCounterVec,
    origin_bytes: IntCounterVec,
    served_bytes: IntCounterVec,
    fill_failures: IntCounterVec,
    evictions: IntCounter,
    corrupt: IntCounter,
    write_errors: IntCounter,
    disk_bytes: IntGauge,
    entries: IntGauge,
    enabled: IntGauge,
}

impl CacheMetrics {
    fn new(registry: &Registry) -> Self {
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let vec = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(vec.clone())).expect("metric names are unique");
            vec
        };
        let counter = |name: &str, help: &str| {
            let counter = IntCounter::new(name, help).expect("valid metric");
            registry.register(Box::new(counter.clone())).expect("metric names are unique");
            counter
        };
        let gauge = |name: &str, help: &str| {
            let gauge = IntGauge::new(name, help).expect("valid metric");
            registry.register(Box::new(gauge.clone())).expect("metric names are unique");
            gauge
        };
        Self {
            requests: counter_vec(
                "rangeway_cache_requests_total",
                "Requests on routes with the cache, by what it did: hit (every byte was there), miss (this request started fetching some), coalesced (it waited on fetches of others), revalidated (the stored version was validated first), bypass_request, bypass_uncacheable, bypass_origin (asked of the origin as without a cache), off (the cache folder cannot be written).",
                &["route", "outcome"],
            ),
            origin_bytes: counter_vec(
                "rangeway_cache_origin_bytes_total",
                "Bytes fetched from origins into the cache, by route.",
                &["route"],
            ),
            served_bytes: counter_vec(
                "rangeway_cache_served_bytes_total",
                "Bytes of origins' objects answered from the cache (as the upstream's answer, before a route's stages), by route.",
                &["route"],
            ),
            fill_failures: counter_vec(
                "rangeway_cache_fill_failures_total",
                "Runs of slices the cache could not fetch (the origin failed or changed, or the disk did): their waiting answers were cut.",
                &["route"],
            ),
            evictions: counter(
                "rangeway_cache_evictions_total",
                "Slices, and versions with their metadata, evicted least recently used first to keep the cache under max_size and max_entries.",
            ),
            corrupt: counter(
                "rangeway_cache_corrupt_slices_total",
                "Slices whose bytes did not match their CRC when read: deleted and fetched again.",
            ),
            write_errors: counter(
                "rangeway_cache_write_errors_total",
                "Writes to the cache folder that failed (a full or read-only disk): those slices came from the origin.",
            ),
            disk_bytes: gauge(
                "rangeway_cache_disk_bytes",
                "Bytes the cache takes on disk, as du counts them: its slices, their metadata files and its folders, in whole blocks.",
            ),
            entries: gauge(
                "rangeway_cache_entries",
                "Files and folders the cache keeps (bounded by max_entries).",
            ),
            enabled: gauge(
                "rangeway_cache_enabled",
                "1 when the slice cache is open, 0 when there is none or its folder could not be opened.",
            ),
        }
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("rangeway_requests_total", "Requests answered, by route and status code."),
            &["route", "status"],
        )
        .expect("valid metric");
        let transports = IntCounterVec::new(
            Opts::new(
                "rangeway_transport_total",
                "Requests answered, by route and the way their answer took: pingora (rangeway's own answer, before a way was chosen), relay (rangeway's upstream client, the body in chunks), splice (the relay, the body spliced socket to socket), sendfile (the slice cache's files sent to the socket), pass_through (a method other than GET and HEAD, its body streamed to the origin).",
            ),
            &["route", "transport"],
        )
        .expect("valid metric");
        let response_bytes = IntCounterVec::new(
            Opts::new(
                "rangeway_response_body_bytes_total",
                "Body bytes sent to clients, by route.",
            ),
            &["route"],
        )
        .expect("valid metric");
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "rangeway_upstream_errors_total",
                "Upstream failures, by route and kind (connect, tls, timeout, io, protocol, bad_range_answer).",
            ),
            &["route", "kind"],
        )
        .expect("valid metric");
        let upstream_ignored_range = IntCounterVec::new(
            Opts::new(
                "rangeway_upstream_ignored_range_total",
                "Ranged requests the upstream answered with the whole object, cut by rangeway.",
            ),
            &["route"],
        )
        .expect("valid metric");
        let resumes_refused = IntCounterVec::new(
            Opts::new(
                "rangeway_resumes_refused_total",
                "Bare resumes refused (412) because the client may hold another version than the one the origin has, or any of several.",
            ),
            &["route"],
        )
        .expect("valid metric");
        let resumes_unvouched = IntCounterVec::new(
            Opts::new(
                "rangeway_resumes_unvouched_total",
                "Bare resumes not served as asked because the state store may have lost their download's session, by answer: whole (200) or refused (412, for clients that append a 200's tail).",
            ),
            &["route", "answer"],
        )
        .expect("valid metric");
        let links_refused = IntCounterVec::new(
            Opts::new(
                "rangeway_links_refused_total",
                "Requests refused on routes that need signed links, by reason: missing, malformed, unknown_key, bad_signature, other_client (403), expired (410: a new download, or a resume past the grace period).",
            ),
            &["route", "reason"],
        )
        .expect("valid metric");
        let resumed_past_expiry = IntCounterVec::new(
            Opts::new(
                "rangeway_resumed_past_expiry_total",
                "Resumes served, within the route's grace, of a download begun before what authorized it expired, by what that was: link (a signed link), presigned (a presigned S3 URL).",
            ),
            &["route", "by"],
        )
        .expect("valid metric");
        let s3_clients_refused = IntCounterVec::new(
            Opts::new(
                "rangeway_s3_clients_refused_total",
                "Requests refused (403) on routes with s3_client_keys_file, by reason: unsigned, malformed, unknown_key, skewed, mismatch, expired (a presigned URL past its expiry, and not a resume within the grace).",
            ),
            &["route", "reason"],
        )
        .expect("valid metric");
        let downloads_limited = IntCounterVec::new(
            Opts::new(
                "rangeway_downloads_limited_total",
                "Downloads refused (429) before the origin was asked, by the limit they would have broken: per_client, per_route ([routes.download_limits]).",
            ),
            &["route", "limit"],
        )
        .expect("valid metric");
        let shaped_bytes = IntCounterVec::new(
            Opts::new(
                "rangeway_shaped_bytes_total",
                "Body bytes sent paced by a route's rate limit (after the fast start).",
            ),
            &["route"],
        )
        .expect("valid metric");
        let shaped_seconds = prometheus::CounterVec::new(
            Opts::new(
                "rangeway_shaped_seconds_total",
                "Time responses waited for their turn under a route's rate limits.",
            ),
            &["route"],
        )
        .expect("valid metric");
        let origin_digest_mismatches = IntCounterVec::new(
            Opts::new(
                "rangeway_origin_digest_mismatches_total",
                "Whole bodies that did not match the digest their origin published; the client connection was cut.",
            ),
            &["route"],
        )
        .expect("valid metric");
        let spliced_bytes = IntCounterVec::new(
            Opts::new(
                "rangeway_spliced_bytes_total",
                "Response body bytes moved from the origin's socket to the client's by splice(2), never entering rangeway's memory (part of rangeway_response_body_bytes_total).",
            ),
            &["route"],
        )
        .expect("valid metric");
        let middleware_errors = IntCounterVec::new(
            Opts::new(
                "rangeway_middleware_errors_total",
                "Responses cut because a stage of the route's middleware failed (a regenerated block that does not match its index, say).",
            ),
            &["route"],
        )
        .expect("valid metric");
        let upstream_resumes = IntCounterVec::new(
            Opts::new(
                "rangeway_upstream_resumes_total",
                "Responses whose origin failed mid-body, by outcome: resumed (the client saw nothing), changed (the object changed: cut), failed (no continuation within the route's attempts and deadline: cut), unresumable (no strong validator or length: cut).",
            ),
            &["route", "outcome"],
        )
        .expect("valid metric");
        let connections_refused = IntCounterVec::new(
            Opts::new(
                "rangeway_client_connections_refused_total",
                "Client connections ended by a limit, by reason: per_client_limit (more open from one address than max_connections_per_client), header_timeout (a request header, a PROXY protocol header or a TLS handshake slower than client_header_timeout), tls_handshake (a TLS handshake that failed: a version, cipher or certificate the client would not take, or not TLS at all), proxy_protocol (no valid PROXY protocol header where proxy_protocol requires one), keepalive_timeout (idle longer than client_keepalive_timeout), max_connections_idle (an idle connection closed to make room for a new one past max_connections), max_connections (a new connection refused: max_connections open, none idle).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "rangeway_request_duration_seconds",
                "Time from request to the end of the response, by route.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0,
            ]),
            &["route"],
        )
        .expect("valid metric");
        let active = IntGauge::new("rangeway_active_downloads", "Responses in flight.")
            .expect("valid metric");
        let client_connections = IntGauge::new(
            "rangeway_client_connections",
            "Client connections open, every listener's together (what max_connections bounds).",
        )
        .expect("valid metric");
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(transports.clone()),
            Box::new(response_bytes.clone()),
            Box::new(spliced_bytes.clone()),
            Box::new(upstream_errors.clone()),
            Box::new(upstream_ignored_range.clone()),
            Box::new(resumes_refused.clone()),
            Box::new(resumes_unvouched.clone()),
            Box::new(links_refused.clone()),
            Box::new(resumed_past_expiry.clone()),
            Box::new(s3_clients_refused.clone()),
            Box::new(downloads_limited.clone()),
            Box::new(shaped_bytes.clone()),
            Box::new(shaped_seconds.clone()),
            Box::new(origin_digest_mismatches.clone()),
            Box::new(middleware_errors.clone()),
            Box::new(upstream_resumes.clone()),
            Box::new(connections_refused.clone()),
            Box::new(duration.clone()),
            Box::new(active.clone()),
            Box::new(client_connections.clone()),
        ] {
            registry.register(collector).expect("metric names are unique");
        }
        // process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total...: what an
        // operator watches for leaks, from /proc.
        if let Err(e) =
            registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
        {
            tracing::warn!(error = %e, "cannot export process metrics");
        }
        let cache = CacheMetrics::new(&registry);
        let quic = QuicMetrics::new(&registry);
        Self {
            registry,
            cache,
            quic,
            requests,
            transports,
            response_bytes,
            spliced_bytes,
            upstream_errors,
            upstream_ignored_range,
            resumes_refused,
            resumes_unvouched,
            links_refused,
            resumed_past_expiry,
            s3_clients_refused,
            downloads_limited,
            shaped_bytes,
            shaped_seconds,
            origin_digest_mismatches,
            middleware_errors,
            upstream_resumes,
            connections_refused,
            duration,
            active,
            client_connections,
        }
    }

    /// A request answered: its status, the body bytes sent, how long it took, and the way the
    /// answer took (see `proxy::transport`).
    pub fn request(
        &self,
        route: &str,
        status: u16,
        bytes: u64,
        elapsed: Duration,
        transport: &str,
    ) {
        // The code's text from `http`'s table, not formatted (0: no answer was written).
        let code = http::StatusCode::from_u16(status);
        let status = code.as_ref().map_or("0", http::StatusCode::as_str);
        self.requests.with_label_values(&[route, status]).inc();
        self.transports.with_label_values(&[route, transport]).inc();
        self.response_bytes.with_label_values(&[route]).inc_by(bytes);
        self.duration.with_label_values(&[route]).observe(elapsed.as_secs_f64());
    }

    /// Body bytes of a response that went out by splice(2).
    pub fn spliced(&self, route: &str, bytes: u64) {
        self.spliced_bytes.with_label_values(&[route]).inc_by(bytes);
    }

    pub fn upstream_error(&self, route: &str, kind: &str) {
        self.upstream_errors.with_label_values(&[route, kind]).inc();
    }

    pub fn upstream_ignored_range(&self, route: &str) {
        self.upstream_ignored_range.with_label_values(&[route]).inc();
    }

    pub fn resume_refused(&self, route: &str) {
        self.resumes_refused.with_label_values(&[route]).inc();
    }

    /// A bare resume not served as asked: the store may have lost its session.
    pub fn resume_unvouched(&self, route: &str, answer: Unvouched) {
        self.resumes_unvouched.with_label_values(&[route, answer.label()]).inc();
    }

    /// A request a signed-link route refused, by `reason` (`LinkError::reason`, or `expired`).
    pub fn link_refused(&self, route: &str, reason: &str) {
        self.links_refused.with_label_values(&[route, reason]).inc();
    }

    /// A resume let through an expired authorization (`by`: `link` or `presigned`).
    pub fn resumed_past_expiry(&self, route: &str, by: &str) {
        self.resumed_past_expiry.with_label_values(&[route, by]).inc();
    }

    pub fn s3_client_refused(&self, route: &str, reason: &str) {
        self.s3_clients_refused.with_label_values(&[route, reason]).inc();
    }

    /// What a paced response cost: `bytes` shaped, `waited` for turns.
    pub fn shaped(&self, route: &str, bytes: u64, waited: std::time::Duration) {
        self.shaped_bytes.with_label_values(&[route]).inc_by(bytes);
        self.shaped_seconds.with_label_values(&[route]).inc_by(waited.as_secs_f64());
    }

    pub fn download_limited(&self, route: &str, limit: &str) {
        self.downloads_limited.with_label_values(&[route, limit]).inc();
    }

    pub fn origin_digest_mismatch(&self, route: &str) {
        self.origin_digest_mismatches.with_label_values(&[route]).inc();
    }

    /// Exports the middleware error count of a route with middleware from the start, at 0, so that
    /// an alert on its increase sees the first error.
    pub fn middleware_route(&self, route: &str) {
        let _ = self.middleware_errors.with_label_values(&[route]);
    }

    /// Exports the counts of resumes the store could not vouch for from the start, at 0: they are
    /// rare, and an alert on their increase must see the first.
    pub fn resume_route(&self, route: &str) {
        for answer in Unvouched::ALL {
            let _ = self.resumes_unvouched.with_label_values(&[route, answer.label()]);
        }
    }

    pub fn middleware_error(&self, route: &str) {
        self.middleware_errors.with_label_values(&[route]).inc();
    }

    /// Counts a response in flight until the returned guard is dropped.
    /// Responses in flight (each counts until its logging phase is over).
    /// A response whose origin failed mid-body: `outcome` is `resumed`, `changed`, `failed` or
    /// `unresumable`.
    pub fn upstream_resume(&self, route: &str, outcome: &str) {
        self.upstream_resumes.with_label_values(&[route, outcome]).inc();
    }

    /// A client connection ended by a limit: `per_client_limit`, `header_timeout`,
    /// `tls_handshake`, `keepalive_timeout`, `max_connections_idle` or `max_connections`.
    pub fn connection_refused(&self, reason: &str) {
        self.connections_refused.with_label_values(&[reason]).inc();
    }

    /// What the cache did for a request (`cache::Outcome`).
    pub fn cache_request(&self, route: &str, outcome: &str) {
        self.cache.requests.with_label_values(&[route, outcome]).inc();
    }

    pub fn cache_origin_bytes(&self, route: &str, bytes: u64) {
        self.cache.origin_bytes.with_label_values(&[route]).inc_by(bytes);
    }

    pub fn cache_served(&self, route: &str, bytes: u64) {
        self.cache.served_bytes.with_label_values(&[route]).inc_by(bytes);
    }

    /// Exports a cached route's fill failures from the start, at 0, so that an alert on their
    /// increase sees the first.
    pub fn cache_route(&self, route: &str) {
        let _ = self.cache.fill_failures.with_label_values(&[route]);
    }

    pub fn cache_fill_failed(&self, route: &str) {
        self.cache.fill_failures.with_label_values(&[route]).inc();
    }

    pub fn cache_evicted(&self, evicted: u64) {
        self.cache.evictions.inc_by(evicted);
    }

    pub fn cache_corrupt(&self) {
        self.cache.corrupt.inc();
    }

    pub fn cache_write_error(&self) {
        self.cache.write_errors.inc();
    }

    pub fn cache_disk(&self, bytes: u64, entries: u64) {
        self.cache.disk_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.cache.entries.set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    /// The cache is open (`true`) or configured and off.
    pub fn cache_enabled(&self, on: bool) {
        self.cache.enabled.set(i64::from(on));
    }

    /// The gauge of open client connections, which the admission keeps.
    pub(crate) fn client_connections(&self) -> IntGauge {
        self.client_connections.clone()
    }

    pub fn in_flight(&self) -> i64 {
        self.active.get()
    }

    /// The gauge of open QUIC connections, which the HTTP/3 listeners keep.
    pub(crate) fn quic_connections(&self) -> IntGauge {
        self.quic.connections.clone()
    }

    /// QUIC connections open now: a drain ends only once they have closed, as their last bytes
    /// go out from this process's buffers (a TCP socket's kernel sends them after it ends).
    pub fn quic_open(&self) -> i64 {
        self.quic.connections.get()
    }

    /// A QUIC connection ended on another path than its handshake's.
    pub(crate) fn quic_migrated(&self) {
        self.quic.migrated.inc();
    }

    /// A QUIC connection attempt ended as `outcome` says (see `rangeway_quic_handshakes_total`).
    pub(crate) fn quic_handshake(&self, outcome: QuicHandshake) {
        self.quic.handshakes.with_label_values(&[outcome.label()]).inc();
    }

    pub fn active_download(&self) -> ActiveDownload {
        self.active.inc();
        ActiveDownload(self.active.clone())
    }

    /// Exports the health of the state store (read from it at every scrape).
    pub fn watch_store(&self, store: Arc<dyn StateStore>) {
        if let Err(e) = self.registry.register(Box::new(StoreCollector::new(store))) {
            tracing::error!(error = %e, "cannot register the state store metrics");
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * 1024);
        // Encoding into a Vec cannot fail on I/O; a failure would be a bug in a collector.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Decrements the in-flight gauge when the request's context is dropped, however it ends.
#[derive(Debug)]
pub struct ActiveDownload(IntGauge);

impl Drop for ActiveDownload {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How a bare resume whose session the store may have lost is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unvouched {
    /// The whole object (200).
    Whole,
    /// Refused (412), for clients that append a 200's tail.
    Refused,
}

impl Unvouched {
    const ALL: [Self; 2] = [Self::Whole, Self::Refused];

    fn label(self) -> &'static str {
        match self {
            Self::Whole => "whole",
            Self::Refused => "refused",
        }
    }
}

/// `rangeway_store_*`: the store keeps its own counters (it is shared by every request); this
/// reads them when Prometheus scrapes.
struct StoreCollector {
    store: Arc<dyn StateStore>,
    descs: Vec<Desc>,
}

impl StoreCollector {
    fn new(store: Arc<dyn StateStore>) -> Self {
        let descs =
            Self::metrics(&store).iter().flat_map(|m| m.desc().into_iter().cloned()).collect();
        Self { store, descs }
    }

    fn metrics(store: &Arc<dyn StateStore>) -> [Box<dyn Collector>; 5] {
        let health = store.health();
        let gauge = IntGauge::new(
            "rangeway_store_up",
            "1 when the state store answered its last operation.",
        )
        .expect("valid metric");
        gauge.set(i64::from(health.is_up()));
        let counter = |name: &str, help: &str, value: u64| {
            let counter = IntCounter::new(name, help).expect("valid metric");
            counter.inc_by(value);
            counter
        };
        let failed = counter(
            "rangeway_store_errors_total",
            "State store operations that failed (timeouts, outages, errors).",
            health.errors_total(),
        );
        let unreadable_values = counter(
            "rangeway_store_unreadable_total",
            "Stored values that could not be read and were taken as absent.",
            health.unreadable_total(),
        );
        let losses = store.losses();
        let evictions = counter(
            "rangeway_store_evictions_total",
            "Records evicted to keep the embedded store within [state] max_memory, or a client within its client_share (embedded store and Redis).",
            losses.evictions_total(),
        );
        let lost = IntCounterVec::new(
            Opts::new(
                "rangeway_store_losses_total",
                "Times the state store may have lost sessions it cannot name, by kind: flushed, restarted, evicted (by Redis), failed (a write), reported (by another instance).",
            ),
            &["kind"],
        )
        .expect("valid metric");
        for (loss, count) in losses.untraced_totals() {
            lost.with_label_values(&[loss.name()]).inc_by(count);
        }
        [
            Box::new(gauge),
            Box::new(failed),
            Box::new(unreadable_values),
            Box::new(evictions),
            Box::new(lost),
        ]
    }
}

impl Collector for StoreCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        Self::metrics(&self.store).iter().flat_map(|m| m.collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_route_and_status_code() {
        let metrics = Metrics::new();
        metrics.request("files", 206, 10, Duration::from_millis(3), "relay");
        metrics.request("files", 206, 10, Duration::from_millis(3), "splice");
        // No answer written (the client went away first).
        metrics.request("files", 0, 0, Duration::from_millis(1), "relay");
        let text = String::from_utf8(metrics.render()).unwrap();
        assert!(
            text.contains("rangeway_requests_total{route=\"files\",status=\"206\"} 2"),
            "{text}"
        );
        assert!(text.contains("rangeway_requests_total{route=\"files\",status=\"0\"} 1"), "{text}");
    }
}
