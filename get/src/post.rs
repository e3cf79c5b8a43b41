//! Requests with a body, for the parts of rangeway that send to HTTP servers rather than download
//! from them (the OTLP trace exporter): the connections `get` makes — TLS trusting the system's
//! roots, proxies from the usual environment variables, a timeout on every step — one exchange
//! per call.

use std::io;
use std::time::Duration;

use crate::connect::{Connector, Proxies};
use crate::http1::Request;
use crate::url::Target;

/// The most of an answer's body kept: what a collector says back is a status, not data.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Sends requests with a body.
pub struct Poster {
    connector: Connector,
}

impl std::fmt::Debug for Poster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poster").finish_non_exhaustive()
    }
}

/// An answer: its status and the start of its body.
#[derive(Debug)]
pub struct Posted {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Poster {
    /// `timeout` bounds connecting and every read and write.
    ///
    /// # Errors
    /// A proxy variable that is not a URL, or no TLS configuration.
    pub fn new(timeout: Duration) -> Result<Self, String> {
        let proxies = Proxies::from_env(|name| std::env::var(name).ok())?;
        Ok(Self { connector: Connector::new(None, proxies, timeout)? })
    }

    /// Sends `body` to `url` with `method` and `headers`, and reads the answer.
    ///
    /// # Errors
    /// `url` is not an http(s) URL, or the exchange failed.
    pub fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> io::Result<Posted> {
        let target = Target::parse(url).map_err(io::Error::other)?;
        let mut connection = self.connector.connect(&target)?;
        let head = connection.send(&Request { method, target: &target, headers, body })?;
        let mut answer = Vec::new();
        let mut buf = [0; 8192];
        loop {
            let n = connection.read_body(&mut buf)?;
            if n == 0 {
                break;
            }
            let room = MAX_ANSWER_BYTES.saturating_sub(answer.len());
            answer.extend_from_slice(&buf[..n.min(room)]);
        }
        Ok(Posted { status: head.status, body: answer })
    }
}
