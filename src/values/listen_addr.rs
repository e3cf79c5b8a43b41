//! Addresses to listen on: an IP literal and a port. Host names are refused, because which
//! address a name resolves to at boot is not something a listener should leave to chance.

use std::net::{IpAddr, SocketAddr};

use super::{Problem, wrong};

/// Parses `text`; `example` is shown in the fix when it is no socket address at all.
pub(crate) fn parse(text: &str, example: &str) -> Result<SocketAddr, Problem> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let ip_and_port = text.rsplit_once(':').filter(|(ip, port)| {
        ip.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok()
            && !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
    });
    if let Some((_, port)) = ip_and_port {
        wrong(
            format!("port {port} is out of range"),
            "use a port from 0 to 65535 (0 picks a free one)",
        )
    } else if text.parse::<IpAddr>().is_ok() {
        wrong(
            format!("{text:?} has no port"),
            format!("add a port, e.g. \"{text}:8080\" (IPv6: \"[{text}]:8080\")"),
        )
    } else {
        wrong(
            format!("{text:?} is not a socket address"),
            format!(
                "write an IP address and a port, e.g. \"{example}\" or \"[::1]:8080\"; host names are not resolved"
            ),
        )
    }
}

/// Two listeners collide on the same non-zero port when their addresses are equal or either is a
/// wildcard, which also covers the other. Port 0 ("any free port", as tests use) never collides.
pub(crate) fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse(" [::1]:8080 ", "x").map_err(|e| e.0),
            Ok(SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], 8080)))
        );
        let problem = |text| parse(text, "127.0.0.1:8080").expect_err(text).0;
        assert_eq!(problem("127.0.0.1:65536"), "port 65536 is out of range");
        assert_eq!(problem("10.0.0.1"), "\"10.0.0.1\" has no port");
        assert_eq!(problem("localhost:80"), "\"localhost:80\" is not a socket address");
    }
}
