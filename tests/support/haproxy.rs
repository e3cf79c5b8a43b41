//! A real HAProxy in front of rangeway, in TCP mode, writing a PROXY protocol v2 header on each
//! connection it relays (`send-proxy-v2`), as a balancer in front of a fleet does.

use std::fs::File;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::ports::{free_port, wait_for_port};
use super::tmp::TempDir;

/// A running HAProxy, killed (and waited for) on drop.
#[derive(Debug)]
pub(crate) struct Haproxy {
    child: Child,
    addr: SocketAddr,
    // Holds the config and HAProxy's output; removed after `drop` killed it.
    dir: TempDir,
}

/// Tries with fresh ports when another process took the chosen one before HAProxy bound it.
const BIND_ATTEMPTS: usize = 5;

impl Haproxy {
    /// HAProxy listening on 127.0.0.1, relaying every connection to `backend` behind a PROXY v2
    /// header that names the connection's client.
    pub(crate) fn send_proxy_v2_to(backend: SocketAddr) -> Haproxy {
        for _ in 0..BIND_ATTEMPTS {
            let dir = TempDir::new("haproxy");
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let config = dir.join("haproxy.cfg");
            let text = format!(
                "global\n    maxconn 100\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    \
                 timeout client 30s\n    timeout server 30s\n\nfrontend downloads\n    bind {addr}\n    \
                 default_backend rangeway\n\nbackend rangeway\n    server rangeway {backend} send-proxy-v2\n"
            );
            std::fs::write(&config, text).expect("write haproxy.cfg");
            let output = File::create(dir.join("output.log")).expect("create HAProxy's log");
            let child = Command::new("haproxy")
                // In the foreground; -db keeps it there, writing its messages to stderr.
                .arg("-db")
                .arg("-f")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(output.try_clone().expect("clone the log's handle"))
                .stderr(output)
                .spawn()
                .expect("spawn haproxy (scripts/deps.sh --test installs it)");
            let mut haproxy = Haproxy { child, addr, dir };
            if wait_for_port(addr, Duration::from_secs(10)).is_ok() {
                return haproxy;
            }
            let _ = haproxy.child.kill();
            let _ = haproxy.child.wait();
            let log = std::fs::read_to_string(haproxy.dir.join("output.log")).unwrap_or_default();
            if !log.contains("cannot bind") {
                panic!("HAProxy did not start:\n{log}");
            }
        }
        panic!("HAProxy found no free port in {BIND_ATTEMPTS} attempts");
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
