//! The HTTP/3 load client of benches/h3.sh: `--connections` QUIC connections downloading `--path`
//! one request at a time each, until `--requests` have been made in all; prints one line for the
//! script, `H3 requests=N bytes=B seconds=S p99_ms=P failed=F`. With `--sha256`, one download, and
//! its SHA-256 (the bench checks each server's bytes before it times anything). With `--loss`,
//! through a relay of the tests' (tests/support/lossy_relay.rs) that drops that share of the
//! datagrams each way and reorders some: loopback has no qdisc here to lose packets with.
//!
//! h2load speaks no HTTP/3 as Debian builds it, nor does curl: this is the client of that part of
//! the benches. One thread (the bench pins it to a core), all connections on one UDP socket.

#[path = "../../tests/support/lossy_relay.rs"]
#[allow(dead_code, unreachable_pub)]
mod lossy_relay;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Buf;
use clap::Parser;
use sha2::Digest;

#[derive(Parser)]
struct Args {
    /// Where the server (or the relay in front of it) listens.
    #[arg(long)]
    connect: SocketAddr,
    /// The name the certificate is checked against, and the request's authority.
    #[arg(long, default_value = "localhost")]
    server_name: String,
    /// The CA (or the self-signed certificate) to trust.
    #[arg(long)]
    ca: PathBuf,
    #[arg(long)]
    path: String,
    #[arg(long, default_value_t = 1)]
    connections: usize,
    #[arg(long, default_value_t = 1)]
    requests: usize,
    /// One download; print its SHA-256.
    #[arg(long)]
    sha256: bool,
    /// Through a relay that drops this share of the datagrams each way.
    #[arg(long)]
    loss: Option<f64>,
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Failure> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<(), Failure> {
    let relay = args.loss.map(|loss| lossy_relay::LossyRelay::start(args.connect, loss, loss));
    let server = relay.as_ref().map_or(args.connect, |relay| relay.addr);
    let endpoint = client(&args.ca)?;
    let uri: http::Uri =
        format!("https://{}:{}{}", args.server_name, args.connect.port(), args.path).parse()?;
    if args.sha256 {
        let connection = endpoint.connect(server, &args.server_name)?.await?;
        let mut digest = sha2::Sha256::new();
        download(connection, &uri, |chunk| digest.update(chunk)).await?;
        println!("{}", hex(&digest.finalize()));
        return Ok(());
    }
    let (next, bytes, failed) = (AtomicUsize::new(0), AtomicU64::new(0), AtomicUsize::new(0));
    let shared = Arc::new((next, bytes, failed));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.connections {
        let connecting = endpoint.connect(server, &args.server_name)?;
        let (shared, uri, requests) = (Arc::clone(&shared), uri.clone(), args.requests);
        tasks.spawn(async move {
            let mut took = Vec::new();
            let Ok(connection) = connecting.await else {
                shared.2.fetch_add(1, Ordering::Relaxed);
                return took;
            };
            let Ok((mut driver, mut sender)) =
                h3::client::new(h3_quinn::Connection::new(connection)).await
            else {
                shared.2.fetch_add(1, Ordering::Relaxed);
                return took;
            };
            let drive = tokio::spawn(async move {
                std::future::poll_fn(|cx| driver.poll_close(cx)).await;
            });
            while shared.0.fetch_add(1, Ordering::Relaxed) < requests {
                let asked = Instant::now();
                let mut got = 0u64;
                match get(&mut sender, &uri, |chunk| got += chunk.len() as u64).await {
                    Ok(()) => took.push(asked.elapsed()),
                    Err(_) => {
                        shared.2.fetch_add(1, Ordering::Relaxed);
                    }
                }
                shared.1.fetch_add(got, Ordering::Relaxed);
            }
            drop(sender);
            drive.abort();
            took
        });
    }
    let mut took = Vec::new();
    while let Some(done) = tasks.join_next().await {
        took.extend(done?);
    }
    let seconds = started.elapsed().as_secs_f64();
    took.sort();
    let p99 = took.get(took.len().saturating_mul(99) / 100).copied().unwrap_or_default();
    let (_, bytes, failed) = &*shared;
    println!(
        "H3 requests={} bytes={} seconds={seconds:.3} p99_ms={:.0} failed={}",
        took.len(),
        bytes.load(Ordering::Relaxed),
        p99.as_secs_f64() * 1000.0,
        failed.load(Ordering::Relaxed)
    );
    endpoint.close(0u32.into(), b"done");
    Ok(())
}

/// One download on a connection of its own, each body chunk given to `take`.
async fn download(
    connection: quinn::Connection,
    uri: &http::Uri,
    take: impl FnMut(&[u8]),
) -> Result<(), Failure> {
    let (mut driver, mut sender) = h3::client::new(h3_quinn::Connection::new(connection)).await?;
    let drive = tokio::spawn(async move {
        std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    let got = get(&mut sender, uri, take).await;
    drive.abort();
    got
}

/// A GET of `uri`, each body chunk given to `take`; an error unless it is answered 200.
async fn get(
    sender: &mut h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>,
    uri: &http::Uri,
    mut take: impl FnMut(&[u8]),
) -> Result<(), Failure> {
    let request = http::Request::get(uri.clone()).body(())?;
    let mut stream = sender.send_request(request).await?;
    stream.finish().await?;
    let response = stream.recv_response().await?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("answered {}", response.status()).into());
    }
    while let Some(mut chunk) = stream.recv_data().await? {
        while chunk.has_remaining() {
            let part = chunk.chunk();
            take(part);
            let len = part.len();
            chunk.advance(len);
        }
    }
    Ok(())
}

/// A QUIC client endpoint trusting `ca`, offering h3, with windows wide enough that flow control
/// does not bound a download on loopback (as h2load's are for HTTP/2).
fn client(ca: &std::path::Path) -> Result<quinn::Endpoint, Failure> {
    let pem = std::fs::read(ca)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .stream_receive_window(quinn::VarInt::from_u32(16 << 20))
        .receive_window(quinn::VarInt::from_u32(64 << 20))
        .max_idle_timeout(Some(quinn::IdleTimeout::try_from(Duration::from_secs(60))?));
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    let mut endpoint = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
