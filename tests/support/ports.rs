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

/// `N` distinct free ports, none handed out before in this test binary: a port released by one
/// call is free again for the kernel to give the next, and a test that asks twice (a TLS port,
/// then its config's own listeners) got the same port twice once.
pub(crate) fn free_ports<const N: usize>() -> [u16; N] {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // All held at once while they are chosen, so that they differ from each other too, and so
    // do the ones passed over (held, the kernel cannot offer them again meanwhile).
    let (mut held, mut passed_over) = (Vec::new(), Vec::new());
    while held.len() < N {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address of a bound listener").port();
        if given.contains(&port) {
            passed_over.push(listener);
        } else {
            given.push(port);
            held.push((listener, port));
        }
    }
    std::array::from_fn(|i| held[i].1)
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
