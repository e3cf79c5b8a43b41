//! Which process a QUIC packet goes to while a graceful `--upgrade` runs two on one UDP port:
//! new connections to the new process, every packet of a connection to the process that has it.
//!
//! Both processes bind the port with `SO_REUSEPORT`, which makes their sockets one group, and
//! the newest attaches a classic BPF program to the group that picks the socket of each
//! datagram (`SO_ATTACH_REUSEPORT_CBPF`). Each process puts a marker of its own, four random
//! bytes, at the front of every connection ID it issues ([`MarkedCids`]); the program reads the
//! destination connection ID of a packet and sends it to the newest socket (index 1 of the
//! group: it joined last) when it carries the newest process's marker or starts a connection
//! (an Initial or 0-RTT packet, whose ID the client chose), and to the one before it (index 0)
//! otherwise. Alone on the port, index 1 does not exist and the kernel picks the only socket.
//!
//! A packet sent to the wrong process is lost, not fatal: the process that does not know its
//! connection answers with a stateless reset its client ignores (each process's reset key is
//! its own). That happens only for the moment between the new process's bind and its program's
//! attach, and to handshakes of the old process still in flight when the new one binds.
//!
//! The marker tells an observer which process issued a connection ID, as a load balancer's
//! routable connection IDs do (QUIC-LB), and nothing of which connection: its other eight bytes
//! are random.

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use quinn::{ConnectionId, ConnectionIdGenerator};

/// The bytes of a connection ID this process issues: its marker, then random bytes.
const CID_LEN: usize = 12;
const MARKER_LEN: usize = 4;

/// Where a packet's destination connection ID begins: after the first byte of a short header;
/// after the first byte, the version and the ID's length of a long one (RFC 9000 §17.2).
const SHORT_DCID_AT: u32 = 1;
const LONG_DCID_AT: u32 = 6;

/// This process's marker, random at start: four bytes, so that two processes sharing a port
/// have the same one once in 2³² upgrades.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Marker([u8; MARKER_LEN]);

impl Marker {
    pub(crate) fn random() -> Self {
        let mut marker = [0; MARKER_LEN];
        if getrandom::fill(&mut marker).is_err() {
            // Still another process's than the one before it, which had another id.
            marker = std::process::id().to_be_bytes();
        }
        Self(marker)
    }

    /// What a process's endpoint makes its connection IDs with.
    pub(crate) fn cid_generator(self) -> impl Fn() -> Box<dyn ConnectionIdGenerator> + Send + Sync {
        move || Box::new(MarkedCids { marker: self, made: 0 })
    }

    /// Attaches to `socket`'s group the program that steers packets by this marker (see the
    /// module's documentation).
    #[allow(unsafe_code)]
    pub(crate) fn steer(self, socket: &UdpSocket) -> io::Result<()> {
        let program = self.program();
        let fprog =
            libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr().cast_mut() };
        // SAFETY: `fprog` points at `program`, alive for the call, which the kernel copies.
        let set = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_REUSEPORT_CBPF,
                std::ptr::from_ref(&fprog).cast(),
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        match set {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// The steering program: its result is the index of the socket in the group.
    fn program(self) -> [libc::sock_filter; 10] {
        use libc::{
            BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET,
            BPF_W,
        };
        const NEWEST: u32 = 1;
        const BEFORE: u32 = 0;
        let marker = u32::from_be_bytes(self.0);
        let op =
            |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
        [
            // 0: the first byte; a long header (its high bit) goes to 4.
            op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 0),
            op(BPF_JMP | BPF_JSET | BPF_K, 2, 0, 0x80),
            // 2: a short header: its connection ID's marker.
            op(BPF_LD | BPF_W | BPF_ABS, 0, 0, SHORT_DCID_AT),
            op(BPF_JMP | BPF_JEQ | BPF_K, 4, 5, marker),
            // 4: a long header's type: a Handshake's ID is the server's; an Initial's or a
            // 0-RTT's the client's, a new connection's.
            op(BPF_ALU | BPF_AND | BPF_K, 0, 0, 0x30),
            op(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, 0x20),
            op(BPF_LD | BPF_W | BPF_ABS, 0, 0, LONG_DCID_AT),
            op(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, marker),
            // 8, 9.
            op(BPF_RET | BPF_K, 0, 0, NEWEST),
            op(BPF_RET | BPF_K, 0, 0, BEFORE),
        ]
    }
}

/// Connection IDs of [`CID_LEN`] bytes: the marker, then random bytes.
struct MarkedCids {
    marker: Marker,
    /// How many were made: mixed into the random bytes, so that the IDs stay unique should the
    /// system's randomness fail (quinn draws again on a clash, forever).
    made: u64,
}

impl ConnectionIdGenerator for MarkedCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut random = [0; CID_LEN - MARKER_LEN];
        let _ = getrandom::fill(&mut random);
        self.made = self.made.wrapping_add(1);
        let mixed = u64::from_be_bytes(random) ^ self.made;
        let mut cid = [0; CID_LEN];
        cid[..MARKER_LEN].copy_from_slice(&self.marker.0);
        cid[MARKER_LEN..].copy_from_slice(&mixed.to_be_bytes());
        ConnectionId::new(&cid)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}
