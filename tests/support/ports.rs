//! Free ports and waiting for servers to listen.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// For servers that take their port from a config file or command line (nginx, redis-server).
/// Another process can take the port between this call and the server's bind; callers that can
/// see a failed bind should retry with a new port. Servers that run in-process bind port 0
/// instead and read the port back, which has no such race.
pub(crate) fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct free ports: all are held at once while they are chosen, so two calls in a row
/// cannot hand out the same port twice.
pub(crate) fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"));
    listeners.map(|l| l.local_addr().expect("local address of a bound listener").port())
}

/// Waits until something accepts TCP connections on `addr`.
///
/// Returns the last connection error when `timeout` passes first.
pub(crate) fn wait_for_port(addr: SocketAddr, timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let err = match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("nothing accepted connections on {addr} within {timeout:?}: {err}"),
            ));
        }
        thread::sleep(Duration::from_millis(20));
    }
}
