//! The PROXY protocol header a load balancer writes before a connection's own bytes (HAProxy's
//! `send-proxy-v2`, AWS NLB's proxy protocol v2), which says whose connection it relays.
//!
//! Sans-I/O: [`parse`] is handed the bytes read so far and says whether they hold a complete
//! header, how many bytes at least it needs otherwise, or why they are not one. It never asks for
//! a byte past the header's end, so that whoever reads the connection can read exactly what it
//! asks for and leave the rest (a TLS handshake, an HTTP request) unread.
//!
//! Version 2 (binary) and version 1 (text) are both read: v1 costs a few lines and some older
//! balancers send nothing else. What a header carries beyond the source address — the
//! destination, the type-length-value extensions (TLS details, AWS's VPC endpoint id) — is
//! skipped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Every v2 header begins with these 12 bytes, which no HTTP request or TLS handshake does.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The signature, the version and command, the family and the length of what follows.
const V2_FIXED: usize = 16;
const V1_PREFIX: &[u8] = b"PROXY ";
/// The shortest v1 header, `PROXY UNKNOWN\r\n`, and the longest the specification allows.
const V1_MIN: usize = 15;
const V1_MAX: usize = 107;

/// What the bytes read so far hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole header yet: read until there are `at_least` bytes in all, then parse again.
    Incomplete { at_least: usize },
    /// A header of `len` bytes. `source` is the client it speaks for; `None` when it speaks for
    /// nobody else (the LOCAL command, a balancer's own health check; an unknown or Unix
    /// family): the connection's peer is then the client.
    Header { len: usize, source: Option<SocketAddr> },
}

/// Why the bytes are not a PROXY protocol header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyHeaderError {
    #[error("the connection does not begin with a PROXY protocol header")]
    Missing,
    #[error("PROXY protocol version {0} (only 1 and 2 exist)")]
    Version(u8),
    #[error("PROXY protocol v2 command {0} (only LOCAL, 0, and PROXY, 1, exist)")]
    Command(u8),
    #[error("PROXY protocol v2 address family {0} (only 0 to 3 exist)")]
    Family(u8),
    #[error(
        "PROXY protocol v2 header of {len} bytes after the fixed part, too short for its addresses ({needs})"
    )]
    Short { len: usize, needs: usize },
    #[error("PROXY protocol v1 header longer than 107 bytes")]
    V1TooLong,
    #[error("malformed PROXY protocol v1 header: {0}")]
    V1(&'static str),
}

/// Reads a PROXY protocol header (v2 or v1) at the start of `bytes`. Never panics, whatever the
/// bytes; bytes after the header are not looked at.
pub fn parse(bytes: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    if bytes.is_empty() {
        // Either version: as much as the shorter header has at least.
        return Ok(Parsed::Incomplete { at_least: V1_MIN });
    }
    let starts = |prefix: &[u8]| {
        let common = bytes.len().min(prefix.len());
        bytes[..common] == prefix[..common]
    };
    if starts(&V2_SIGNATURE) {
        if bytes.len() < V2_FIXED {
            return Ok(Parsed::Incomplete { at_least: V2_FIXED });
        }
        return parse_v2(bytes);
    }
    if starts(V1_PREFIX) {
        if bytes.len() < V1_MIN {
            return Ok(Parsed::Incomplete { at_least: V1_MIN });
        }
        return parse_v1(bytes);
    }
    Err(ProxyHeaderError::Missing)
}

fn parse_v2(bytes: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    let (version, command) = (bytes[12] >> 4, bytes[12] & 0x0f);
    if version != 2 {
        return Err(ProxyHeaderError::Version(version));
    }
    if command > 1 {
        return Err(ProxyHeaderError::Command(command));
    }
    let family = bytes[13] >> 4;
    let len = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    let needs = match family {
        // UNSPEC and AF_UNIX: no address rangeway can use, whatever the length.
        0 | 3 => 0,
        // Source and destination addresses, then their ports.
        1 => 12,
        2 => 36,
        other => return Err(ProxyHeaderError::Family(other)),
    };
    if len < needs {
        return Err(ProxyHeaderError::Short { len, needs });
    }
    let total = V2_FIXED + len;
    if bytes.len() < total {
        return Ok(Parsed::Incomplete { at_least: total });
    }
    let body = &bytes[V2_FIXED..total];
    let port = |at: usize| u16::from_be_bytes([body[at], body[at + 1]]);
    let source = match (command, family) {
        (1, 1) => {
            let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
            Some(SocketAddr::new(IpAddr::V4(ip), port(8)))
        }
        (1, 2) => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&body[..16]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port(32)))
        }
        _ => None,
    };
    Ok(Parsed::Header { len: total, source })
}

fn parse_v1(bytes: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    let window = &bytes[..bytes.len().min(V1_MAX)];
    let Some(lf) = window.iter().position(|&b| b == b'\n') else {
        if bytes.len() >= V1_MAX {
            return Err(ProxyHeaderError::V1TooLong);
        }
        // Read a byte at a time: the header's end is not known before its line feed.
        return Ok(Parsed::Incomplete { at_least: bytes.len() + 1 });
    };
    let line = window[..lf].strip_suffix(b"\r").ok_or(ProxyHeaderError::V1("no CR before LF"))?;
    let line = std::str::from_utf8(line).map_err(|_| ProxyHeaderError::V1("not ASCII"))?;
    let mut fields = line.split(' ').skip(1);
    let family = fields.next().ok_or(ProxyHeaderError::V1("no protocol"))?;
    let source = match family {
        // The balancer's own connection, or one it could not describe.
        "UNKNOWN" => None,
        "TCP4" | "TCP6" => {
            let mut next = |what| fields.next().ok_or(ProxyHeaderError::V1(what));
            let (source, destination) = (next("no source")?, next("no destination")?);
            let (source_port, destination_port) =
                (next("no source port")?, next("no destination port")?);
            if fields.next().is_some() {
                return Err(ProxyHeaderError::V1("more than six fields"));
            }
            let ip = |text: &str| {
                let ip = text.parse::<IpAddr>().map_err(|_| ProxyHeaderError::V1("bad address"))?;
                match (family, ip) {
                    ("TCP4", IpAddr::V4(_)) | ("TCP6", IpAddr::V6(_)) => Ok(ip),
                    _ => Err(ProxyHeaderError::V1("address of the other family")),
                }
            };
            let port = |text: &str| match text.as_bytes() {
                // Decimal, without a leading zero.
                [b'1'..=b'9', ..] => {
                    text.parse::<u16>().map_err(|_| ProxyHeaderError::V1("bad port"))
                }
                _ => Err(ProxyHeaderError::V1("bad port")),
            };
            ip(destination)?;
            port(destination_port)?;
            Some(SocketAddr::new(ip(source)?, port(source_port)?))
        }
        _ => return Err(ProxyHeaderError::V1("protocol is not TCP4, TCP6 or UNKNOWN")),
    };
    Ok(Parsed::Header { len: lf + 1, source })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A v2 header as a balancer writes it: `command` (0 LOCAL, 1 PROXY), `family_transport`,
    /// the address block, then `tlvs`.
    fn v2(command: u8, family_transport: u8, addresses: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut header = V2_SIGNATURE.to_vec();
        header.push(0x20 | command);
        header.push(family_transport);
        let len = u16::try_from(addresses.len() + tlvs.len()).unwrap();
        header.extend_from_slice(&len.to_be_bytes());
        header.extend_from_slice(addresses);
        header.extend_from_slice(tlvs);
        header
    }

    fn v4_block() -> Vec<u8> {
        // 203.0.113.9:51234 to 10.0.0.2:8080.
        let mut block = vec![203, 0, 113, 9, 10, 0, 0, 2];
        block.extend_from_slice(&51234u16.to_be_bytes());
        block.extend_from_slice(&8080u16.to_be_bytes());
        block
    }

    /// Every prefix of a header is incomplete, asking for no byte past the header's end, and
    /// reading as asked arrives at the header.
    fn assert_read_as_asked(header: &[u8], want: Parsed) {
        let mut have = 0;
        let mut steps = 0;
        loop {
            match parse(&header[..have]).unwrap() {
                Parsed::Incomplete { at_least } => {
                    assert!(at_least > have && at_least <= header.len(), "{at_least} at {have}");
                    have = at_least;
                }
                parsed => {
                    assert_eq!(parsed, want);
                    break;
                }
            }
            steps += 1;
            assert!(steps <= V1_MAX, "no progress");
        }
        for cut in 0..header.len() {
            assert!(matches!(parse(&header[..cut]), Ok(Parsed::Incomplete { .. })), "cut {cut}");
        }
    }

    #[test]
    fn v2_ipv4_gives_the_source_and_skips_the_tlvs() {
        // An AWS-style TLV (type 0xEA, VPC endpoint id) after the addresses.
        let tlv = [0xEA, 0x00, 0x04, b'v', b'p', b'c', b'e'];
        let mut bytes = v2(1, 0x11, &v4_block(), &tlv);
        let len = bytes.len();
        let want = Parsed::Header { len, source: Some("203.0.113.9:51234".parse().unwrap()) };
        assert_read_as_asked(&bytes, want);
        // What follows the header is the connection's own and is not read.
        bytes.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(parse(&bytes).unwrap(), want);
    }

    #[test]
    fn v2_ipv6_gives_the_source() {
        let source: Ipv6Addr = "2001:db8::7".parse().unwrap();
        let destination: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let mut block = source.octets().to_vec();
        block.extend_from_slice(&destination.octets());
        block.extend_from_slice(&443u16.to_be_bytes());
        block.extend_from_slice(&8443u16.to_be_bytes());
        let bytes = v2(1, 0x21, &block, &[]);
        let want = Parsed::Header { len: 52, source: Some("[2001:db8::7]:443".parse().unwrap()) };
        assert_read_as_asked(&bytes, want);
    }

    #[test]
    fn v2_local_and_unspec_speak_for_no_one_else() {
        // A balancer's health check: LOCAL, with or without an address block.
        assert_eq!(
            parse(&v2(0, 0x00, &[], &[])).unwrap(),
            Parsed::Header { len: 16, source: None }
        );
        let local_with_block = v2(0, 0x11, &v4_block(), &[]);
        assert_eq!(parse(&local_with_block).unwrap(), Parsed::Header { len: 28, source: None });
        // PROXY over a family rangeway has no use for (AF_UNIX's 216 bytes).
        let unix = v2(1, 0x31, &[0; 216], &[]);
        assert_eq!(parse(&unix).unwrap(), Parsed::Header { len: 232, source: None });
    }

    #[test]
    fn v2_truncated_or_wrong_is_refused_or_waited_for() {
        let whole = v2(1, 0x11, &v4_block(), &[]);
        assert_eq!(parse(&whole[..20]).unwrap(), Parsed::Incomplete { at_least: 28 });
        // A length too short for the family's addresses.
        let mut short = whole.clone();
        short[15] = 8;
        assert_eq!(parse(&short), Err(ProxyHeaderError::Short { len: 8, needs: 12 }));
        let mut version = whole.clone();
        version[12] = 0x31;
        assert_eq!(parse(&version), Err(ProxyHeaderError::Version(3)));
        let mut command = whole.clone();
        command[12] = 0x22;
        assert_eq!(parse(&command), Err(ProxyHeaderError::Command(2)));
        let mut family = whole;
        family[13] = 0x41;
        assert_eq!(parse(&family), Err(ProxyHeaderError::Family(4)));
    }

    #[test]
    fn a_bad_signature_is_refused_at_its_first_wrong_byte() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(ProxyHeaderError::Missing));
        // A TLS ClientHello.
        assert_eq!(parse(&[0x16, 0x03, 0x01]), Err(ProxyHeaderError::Missing));
        assert_eq!(parse(b"\r\n\r\n\0\r\nQUIX"), Err(ProxyHeaderError::Missing));
        assert_eq!(parse(b"PROXX"), Err(ProxyHeaderError::Missing));
        assert_eq!(parse(b"").unwrap(), Parsed::Incomplete { at_least: V1_MIN });
        assert_eq!(parse(b"\r\n").unwrap(), Parsed::Incomplete { at_least: V2_FIXED });
    }

    #[test]
    fn v1_tcp4_tcp6_and_unknown() {
        let tcp4 = b"PROXY TCP4 198.51.100.22 10.0.0.2 35646 80\r\n";
        let want = Parsed::Header {
            len: tcp4.len(),
            source: Some("198.51.100.22:35646".parse().unwrap()),
        };
        assert_read_as_asked(tcp4, want);
        let tcp6 = b"PROXY TCP6 2001:db8::9 2001:db8::1 4000 443\r\nGET";
        let want = Parsed::Header {
            len: tcp6.len() - 3,
            source: Some("[2001:db8::9]:4000".parse().unwrap()),
        };
        assert_eq!(parse(tcp6).unwrap(), want);
        let unknown = b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n";
        assert_eq!(parse(unknown).unwrap(), Parsed::Header { len: unknown.len(), source: None });
    }

    #[test]
    fn v1_malformed_is_refused() {
        for (bad, why) in [
            (&b"PROXY TCP4 198.51.100.22 10.0.0.2 35646\r\n"[..], "no destination port"),
            (b"PROXY TCP4 2001:db8::9 10.0.0.2 35646 80\r\n", "address of the other family"),
            (b"PROXY TCP4 198.51.100.22 10.0.0.2 035646 80\r\n", "bad port"),
            (b"PROXY TCP4 198.51.100.22 10.0.0.2 70000 80\r\n", "bad port"),
            (
                b"PROXY UDP4 198.51.100.22 10.0.0.2 1 80\r\n",
                "protocol is not TCP4, TCP6 or UNKNOWN",
            ),
            (b"PROXY TCP4 198.51.100.22 10.0.0.2 1 80\n", "no CR before LF"),
            (b"PROXY TCP4 198.51.100.22 10.0.0.2 1 80 9\r\n", "more than six fields"),
        ] {
            assert_eq!(
                parse(bad),
                Err(ProxyHeaderError::V1(why)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let endless = [b"PROXY TCP4 ".as_slice(), &[b'1'; 200]].concat();
        assert_eq!(parse(&endless), Err(ProxyHeaderError::V1TooLong));
    }

    /// Bytes that begin like a header more often than chance would: a signature, then anything.
    fn header_like() -> impl Strategy<Value = Vec<u8>> {
        let start = prop_oneof![
            Just(V2_SIGNATURE.to_vec()),
            Just(b"PROXY ".to_vec()),
            Just(b"PROXY TCP4 ".to_vec()),
            Just(Vec::new()),
        ];
        (start, proptest::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(start, rest)| [start, rest].concat())
    }

    proptest! {
        /// What `admission/` relies on, on any bytes: no panic; a header lies within the bytes
        /// and parses the same alone; read exactly as asked from the first byte, the bytes give
        /// the same answer, never asking past a header's end (a refusal may come only once the
        /// first bytes asked for are in). (`fuzz/fuzz_targets/proxy_header.rs`
        /// checks the same under libFuzzer.)
        #[test]
        fn reading_as_asked_agrees_with_reading_it_all(bytes in header_like()) {
            let whole = parse(&bytes);
            if let Ok(Parsed::Header { len, .. }) = whole {
                prop_assert!(len <= bytes.len());
                prop_assert_eq!(parse(&bytes[..len]), whole.clone());
            }
            let mut have = 0;
            loop {
                match parse(&bytes[..have]) {
                    Ok(Parsed::Incomplete { at_least }) if at_least <= bytes.len() => {
                        prop_assert!(at_least > have);
                        have = at_least;
                    }
                    Ok(Parsed::Incomplete { .. }) => {
                        // A header within the bytes would have been reached without asking past it.
                        let header = matches!(whole, Ok(Parsed::Header { .. }));
                        prop_assert!(!header, "asked past the header: {:?}", whole);
                        break;
                    }
                    read_as_asked => {
                        prop_assert_eq!(read_as_asked, whole.clone());
                        break;
                    }
                }
            }
        }
    }
}
