//! HTTP/3 to clients: QUIC on UDP beside each TLS listener (`[tls] h3`), its requests answered
//! by the same pipeline as HTTP/1 and HTTP/2.

use std::time::Duration;

/// `[tls] h3`: HTTP/3's listeners and what a client may cost on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct H3Config {
    /// The port `Alt-Svc` names, where a balancer maps another to the listeners' (`None`: the
    /// first listener's).
    pub alt_svc_port: Option<u16>,
    /// Request streams a connection may have open at once.
    pub max_streams: u32,
    /// QUIC connections one address may have open (handshakes included).
    pub max_connections_per_client: u32,
    /// A connection with no packet for this long is closed.
    pub idle_timeout: Duration,
    /// Whether 0-RTT data is taken (then GET and HEAD only are answered before the handshake
    /// completes).
    pub early_data: bool,
    /// Past this many handshakes in flight, a new client proves its address first (Retry).
    pub retry_above_handshakes: u32,
}

impl Default for H3Config {
    fn default() -> Self {
        Self {
            alt_svc_port: None,
            max_streams: 100,
            max_connections_per_client: 64,
            idle_timeout: Duration::from_secs(30),
            early_data: false,
            retry_above_handshakes: 64,
        }
    }
}
