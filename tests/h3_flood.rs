//! A flood of QUIC connection attempts that never finish (`[tls] h3`): tens of thousands of real
//! Initial packets, made by quinn's client core and sent from many loopback sources that never
//! answer, against rangeway as a process of its own, whose resident memory, `/metrics` and
//! service to a real client (aioquic, `tests/h3_client.py`) are watched meanwhile and after.
//!
//! A binary of its own: the flood takes both cores for seconds, and the tests of tests/h3.rs,
//! some of which time what they watch, would otherwise run beside it.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::clients::{sha256_file, sha256_hex};
use support::data::test_bytes;
use support::h3::{aioquic_get, quic_client_config};
use support::ports::free_port;
use support::proxy::{Instance, ProxyProcess, usage};
use support::tls::TestPki;
use support::tmp::TempDir;

/// rangeway as a process with HTTP/3 on `port` (its `localhost` certificate from `pki`), one
/// route to the folder `files`, and `server_keys` in `[server]`.
fn h3_proxy(pki: &TestPki, port: u16, files: &Path, server_keys: &str) -> ProxyProcess {
    let tls = pki.localhost();
    let body = format!(
        "[tls]\nlisten = \"127.0.0.1:{port}\"\nh3 = true\n[[tls.certificates]]\n\
         cert_file = \"{}\"\nkey_file = \"{}\"\n\n[upstreams.origin]\ndir = \"{}\"\n\n\
         [[routes]]\npath_prefix = \"/\"\nupstream = \"origin\"\n",
        tls.cert.display(),
        tls.key.display(),
        files.display()
    );
    ProxyProcess::start_with(&body, server_keys, &[])
}

/// Connection attempts for a flood: real Initial packets to `server`, each from a fresh quinn
/// client connection (a connection id of its own, a ClientHello encrypted with the keys derived
/// from it), as a client that then falls silent sends them.
fn initials(pki: &TestPki, server: SocketAddr, count: usize) -> Vec<Vec<u8>> {
    let config = quic_client_config(pki);
    let mut endpoint = None;
    (0..count)
        .map(|n| {
            // A fresh client endpoint every thousand: each keeps a record of what it opened.
            if n % 1000 == 0 {
                let endpoint_config = Arc::new(quinn_proto::EndpointConfig::default());
                endpoint = Some(quinn_proto::Endpoint::new(endpoint_config, None, false, None));
            }
            let endpoint = endpoint.as_mut().expect("an endpoint");
            let now = Instant::now();
            let (_, mut connection) =
                endpoint.connect(now, config.clone(), server, "localhost").expect("an attempt");
            let mut initial = Vec::new();
            let sent = connection.poll_transmit(now, 1, &mut initial).expect("its Initial");
            initial.truncate(sent.size);
            assert!(initial.len() >= 1200, "an Initial is padded: {} bytes", initial.len());
            initial
        })
        .collect()
}

/// How much more resident memory a flood of connection attempts may cost rangeway than it had
/// before (KiB). What bounds it: quinn holds at most 4096 attempts the listener has not looked
/// at yet, their datagrams within 16 MiB in all (MAX_INCOMING, INCOMING_BUFFER_TOTAL in
/// src/h3/mod.rs), and a flood faster than the listener keeps that queue full; past
/// `retry_above_handshakes` (64) handshakes in flight, an attempt costs one stateless Retry and
/// nothing kept. Measured in debug builds on the 2-core machine: 6 to 12 MiB more at the peak
/// with those bounds; 140 MiB more with Retry off (`retry_above_handshakes` past the flood),
/// when 3,700 attempts got a handshake each (a quinn connection, its TLS state and its first
/// flight: about 38 KiB each). 64 MiB lies between the two with room on either side: to pass
/// it, rangeway would have to keep something for every attempt it meets (13 KiB each of at
/// least 5,000), or hold some 1,700 handshakes where it allows 64.
const FLOOD_MEMORY_KIB: u64 = 64 * 1024;

/// The flood: this many distinct attempts, sent over and over as fast as the test can (a Retry
/// forgets its attempt, so the next copy is a new attempt to rangeway), until rangeway has sent
/// `FLOOD_MET` Retries, or `FLOOD_ROUNDS` times over. Most copies are lost: what the listener
/// cannot take up yet is dropped by quinn (past its 4096 waiting) or by the kernel (the socket's
/// buffer full), as in any flood. (A debug build on 2 cores meets 1,000 to 4,000 a second.)
const FLOOD_ATTEMPTS: usize = 20_000;
const FLOOD_MET: u64 = 5_000;
const FLOOD_ROUNDS: usize = 100;

/// Sets its flag when dropped: when the code that holds it is done, or has panicked.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Tens of thousands of real Initial packets from 128 sources that never answer: rangeway's
/// memory stays within [`FLOOD_MEMORY_KIB`] of what it was, the flood is met by Retries with at
/// most `retry_above_handshakes` handshakes in flight, and a client gets its download whole.
#[test]
fn a_flood_of_initials_that_never_finish_costs_bounded_memory_and_clients_still_download() {
    const LEN: usize = 4 << 20;
    let pki = TestPki::new();
    let work = TempDir::new("h3-flood");
    let object = test_bytes(LEN, 62);
    let files = work.join("files");
    std::fs::create_dir_all(&files).expect("make the folder");
    std::fs::write(files.join("big.bin"), &object).expect("write the object");
    let port = free_port();
    // Handshakes that never finish are dropped after 10 s (client_header_timeout).
    let proxy = h3_proxy(&pki, port, &files, "client_header_timeout = \"10s\"");
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let download = |name: &str| {
        let out = work.join(name);
        let request = serde_json::json!({ "path": "/big.bin", "out": out });
        assert_eq!(aioquic_get(&pki, server, &request), 200, "{name}");
        assert_eq!(sha256_file(&out), sha256_hex(&object), "{name}: byte for byte");
    };
    let handshakes = |outcome: &str| proxy.metric("rangeway_quic_handshakes_total", outcome);
    let open = || proxy.metric("rangeway_quic_connections", "");
    // A download first, so that what serving one costs is in the memory measured before.
    download("before");
    let (rss_before, _, _) = usage(proxy.pid());
    let initials = initials(&pki, server, FLOOD_ATTEMPTS);
    // From 127.0.0.2 to 127.0.0.9, 16 ports each: attempts from many clients, none answering.
    let sockets: Vec<UdpSocket> = (2..=9u8)
        .flat_map(|last| {
            (0..16).map(move |_| {
                UdpSocket::bind(SocketAddr::from(([127, 0, 0, last], 0))).expect("a flood socket")
            })
        })
        .collect();
    let flood_over = AtomicBool::new(false);
    let ((sent, lasted), (rss_flood, open_flood), took) = std::thread::scope(|scope| {
        let flood = scope.spawn(|| {
            let _over = Done(&flood_over);
            let (mut sent, started) = (0, Instant::now());
            for _ in 0..FLOOD_ROUNDS {
                for (n, initial) in initials.iter().enumerate() {
                    // Lost when the listener's socket is full: part of any flood.
                    let _ = sockets[n % sockets.len()].send_to(initial, server);
                }
                sent += initials.len();
                if handshakes("retried") >= FLOOD_MET {
                    break;
                }
            }
            (sent, started.elapsed())
        });
        // The most resident memory and connections open seen while the flood lasts.
        let sampler = scope.spawn(|| {
            let (mut rss, mut connections) = (0, 0);
            while !flood_over.load(Ordering::Relaxed) {
                rss = rss.max(usage(proxy.pid()).0);
                connections = connections.max(open());
                std::thread::sleep(Duration::from_millis(100));
            }
            (rss, connections)
        });
        // A client starts its download while the flood is met (and gets it once its packets
        // get through: a flood this fast on the same 2 cores loses most of them).
        support::wait::until("the flood met", Duration::from_secs(30), || {
            (handshakes("retried") > 0).then_some(())
        });
        let started = Instant::now();
        download("during");
        let took = started.elapsed();
        (flood.join().expect("the flood"), sampler.join().expect("the sampler"), took)
    });
    // And right after it.
    download("after");
    // Every attempt that got a handshake is dropped at its timeout, its place given back.
    support::wait::until("every connection closed", Duration::from_secs(30), || {
        (open() == 0).then_some(())
    });
    let (rss_after, peak, _) = usage(proxy.pid());
    let outcomes: Vec<(&str, u64)> = ["accepted", "failed", "retried", "refused_per_client"]
        .into_iter()
        .map(|outcome| (outcome, handshakes(outcome)))
        .collect();
    eprintln!(
        "flood: {sent} Initials sent in {lasted:?}; {outcomes:?}; at most {open_flood} \
         connections open; RSS {rss_before} KiB before, {rss_flood} during, {rss_after} after, \
         peak {peak}; the download meanwhile took {took:?}"
    );
    assert!(
        peak.saturating_sub(rss_before) < FLOOD_MEMORY_KIB,
        "memory grew from {rss_before} KiB to a peak of {peak} KiB ({rss_after} after)"
    );
    // The flood was met: thousands of attempts sent a Retry, which none of them answered; the
    // first 64 got a handshake each, which failed at its timeout (and more of them, 64 at a
    // time, if the flood outlasted it).
    assert!(handshakes("retried") >= FLOOD_MET, "{outcomes:?} for {sent} Initials sent");
    assert!(handshakes("failed") >= 64, "{outcomes:?}");
    // Only the three downloads' handshakes completed.
    assert_eq!(handshakes("accepted"), 3, "{outcomes:?}");
    // At most `retry_above_handshakes` (64) handshakes of the flood at once, beside the
    // downloads' connections: every attempt past them was sent a Retry.
    assert!(open_flood <= 64 + 2, "{open_flood} connections open during the flood");
}
