//! A UDP relay that loses and reorders datagrams, for QUIC over a bad path on loopback (where no
//! qdisc can drop packets here): tests/h3.rs downloads through it, and the HTTP/3 load client of
//! the benches (benches/load/h3_load.rs, which includes this file) measures through it. Only std:
//! it builds in both.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A UDP relay between one client and `server` that drops `loss` of the datagrams each way and
/// holds back others to send them after the next (reordering); stopped when dropped.
pub(crate) struct LossyRelay {
    pub(crate) addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl LossyRelay {
    pub(crate) fn start(server: SocketAddr, loss: f64, reorder: f64) -> Self {
        let front = UdpSocket::bind("127.0.0.1:0").expect("bind the relay");
        let back = UdpSocket::bind("127.0.0.1:0").expect("bind the relay's back");
        back.connect(server).expect("connect the relay to the server");
        let addr = front.local_addr().expect("the relay's address");
        let stop = Arc::new(AtomicBool::new(false));
        let client = Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
        let mut threads = Vec::new();
        for (direction, seed) in [(true, 11), (false, 12)] {
            let (front, back) =
                (front.try_clone().expect("clone"), back.try_clone().expect("clone"));
            let (stop, client) = (Arc::clone(&stop), Arc::clone(&client));
            threads.push(std::thread::spawn(move || {
                let from = if direction { &front } else { &back };
                from.set_read_timeout(Some(Duration::from_millis(5))).expect("a timeout");
                let mut random = Xorshift(seed);
                let mut held: Option<Vec<u8>> = None;
                let mut buffer = vec![0; 65_536];
                let send = |datagram: &[u8]| {
                    let _ = if direction {
                        back.send(datagram)
                    } else {
                        match *client.lock().expect("the client's address") {
                            Some(to) => front.send_to(datagram, to),
                            None => Ok(0),
                        }
                    };
                };
                while !stop.load(Ordering::Relaxed) {
                    let len = match from.recv_from(&mut buffer) {
                        Ok((len, source)) => {
                            if direction {
                                *client.lock().expect("the client's address") = Some(source);
                            }
                            len
                        }
                        Err(_) => {
                            // Quiet: what was held back goes now.
                            if let Some(datagram) = held.take() {
                                send(&datagram);
                            }
                            continue;
                        }
                    };
                    if random.chance(loss) {
                        continue;
                    }
                    if held.is_none() && random.chance(reorder) {
                        held = Some(buffer[..len].to_vec());
                        continue;
                    }
                    send(&buffer[..len]);
                    if let Some(datagram) = held.take() {
                        send(&datagram);
                    }
                }
            }));
        }
        LossyRelay { addr, stop, threads }
    }
}

impl Drop for LossyRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// xorshift64: the relay's choices, the same on every run.
struct Xorshift(u64);

impl Xorshift {
    fn chance(&mut self, p: f64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}
