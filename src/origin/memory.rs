//! `dir` origins served in memory, for the pipeline's tests: a connection to a `dir` upstream's
//! socket address is one end of a `tokio::io::duplex` pipe, whose other end the upstream's
//! [`DirOrigin`] serves as pingora's listener would serve the socket. No socket is opened, and
//! the requests are counted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pingora_core::apps::HttpServerApp;
use pingora_core::protocols::Stream;
use pingora_core::protocols::http::ServerSession;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_error::{Error, ErrorType, Result};
use tokio::sync::watch;

use super::dir::DirOrigin;

/// What a pipe holds in each direction before a write waits: one body chunk of a `dir` origin.
const PIPE_BYTES: usize = 64 * 1024;

/// The origins, by the socket address each stands for.
#[derive(Debug)]
pub(crate) struct MemoryOrigins {
    origins: BTreeMap<PathBuf, Arc<DirOrigin>>,
    requests: AtomicUsize,
    /// What the origins watch for a shutdown: never said, and open as long as they are.
    shutdown: watch::Sender<bool>,
}

impl MemoryOrigins {
    pub(crate) fn new() -> Self {
        Self {
            origins: BTreeMap::new(),
            requests: AtomicUsize::new(0),
            shutdown: watch::Sender::new(false),
        }
    }

    /// Serves `origin` to connections to the Unix socket `socket` (which is never bound).
    pub(crate) fn serve(&mut self, socket: PathBuf, origin: DirOrigin) {
        self.origins.insert(socket, Arc::new(origin));
    }

    /// The requests the origins were sent: one a connection, as the origin client keeps no pool
    /// of connections in memory.
    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::Relaxed)
    }

    /// A connection to the origin at `address`, served by a task of its own.
    pub(crate) fn dial(&self, address: &SocketAddr) -> Result<Stream> {
        let socket = address.as_unix().and_then(|unix| unix.as_pathname());
        let Some(origin) = socket.and_then(|socket| self.origins.get(socket)) else {
            return Error::e_explain(ErrorType::ConnectRefused, "no origin in memory there");
        };
        let (client, server) = tokio::io::duplex(PIPE_BYTES);
        self.requests.fetch_add(1, Ordering::Relaxed);
        let (origin, shutdown) = (Arc::clone(origin), self.shutdown.subscribe());
        tokio::spawn(async move {
            let session = ServerSession::new_http1(Box::new(server));
            // Its connection is not kept: the client's end goes when its exchange does.
            let _ = origin.process_new_http(session, &shutdown).await;
        });
        Ok(Box::new(client))
    }
}
