//! Who the client of a request is, the one answer every user of the client's address takes:
//! download limits, the derived download id, signed links' client binding, rate shares, the
//! access line and traces.
//!
//! The connection's peer is the starting point. Behind a balancer that sends the PROXY protocol
//! (`[server] proxy_protocol`), `admission/` has already made the peer the address its header
//! names. A peer in `[server] trusted_proxies` is a proxy whose `X-Forwarded-For` is believed:
//! the list is walked from its right end — the hop nearest rangeway — past every trusted
//! address, and the first one not trusted is the client. Only the right end can be believed:
//! each proxy appends the address it was connected from, so everything left of the first
//! untrusted hop was written by someone rangeway does not trust.

use std::net::IpAddr;

use http::HeaderMap;

use crate::ip_net::IpNet;
use crate::values::{Problem, wrong};

/// A `trusted_proxies` entry: an address or a network, never a name, as [`client`] compares
/// peers and forwarded hops with it by address.
pub(crate) fn trusted_proxy(text: &str) -> Result<IpNet, Problem> {
    IpNet::parse(text.trim()).or_else(|problem| {
        wrong(
            format!("{text:?} is not a network: {problem}"),
            "write an address or a network in CIDR notation, e.g. \"10.0.0.0/8\", \"192.0.2.7\" \
             or \"fd00::/8\" (host names are not resolved)",
        )
    })
}

/// A request's client as rangeway believes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Client {
    pub(crate) ip: IpAddr,
    /// The trusted proxy whose `X-Forwarded-For` named the client; `None` when the client is the
    /// connection's peer.
    pub(crate) forwarded_by: Option<IpAddr>,
}

/// The client of a request from `peer` with `headers`.
pub(crate) fn client(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> Client {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    let direct = Client { ip: peer, forwarded_by: None };
    if trusted.is_empty() || !is_trusted(peer) {
        return direct;
    }
    let mut nearest = None;
    // Several fields are one list, in order (RFC 9110 §5.3).
    for field in headers.get_all("x-forwarded-for").iter().rev() {
        let Ok(list) = field.to_str() else { break };
        for hop in list.rsplit(',').map(str::trim).filter(|hop| !hop.is_empty()) {
            // An entry that is no address ends the walk: nothing left of it can be placed.
            let Some(ip) = hop_address(hop) else {
                return nearest.map_or(direct, |ip| Client { ip, forwarded_by: Some(peer) });
            };
            if !is_trusted(ip) {
                return Client { ip, forwarded_by: Some(peer) };
            }
            nearest = Some(ip);
        }
    }
    // Every hop trusted: the furthest one is the nearest thing to a client there is.
    nearest.map_or(direct, |ip| Client { ip, forwarded_by: Some(peer) })
}

/// An `X-Forwarded-For` entry's address: bare (`192.0.2.7`, `2001:db8::7`), or with a port as
/// some proxies write it (`192.0.2.7:4711`, `[2001:db8::7]:4711`).
fn hop_address(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<std::net::SocketAddr>().map(|addr| addr.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn headers(fields: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for field in fields {
            headers.append("x-forwarded-for", field.parse().unwrap());
        }
        headers
    }

    fn trusted(nets: &[&str]) -> Vec<IpNet> {
        nets.iter().map(|net| IpNet::parse(net).unwrap()).collect()
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        let nets = trusted(&["10.0.0.0/8", "127.0.0.1"]);
        let peer = ip("127.0.0.1");
        let by_peer = |client: &str| Client { ip: ip(client), forwarded_by: Some(peer) };
        for (fields, want) in [
            (&["203.0.113.5"][..], by_peer("203.0.113.5")),
            // A client that writes its own header is not believed past the first untrusted hop.
            (&["6.6.6.6, 203.0.113.5, 10.1.2.3"], by_peer("203.0.113.5")),
            (&["6.6.6.6", "203.0.113.5, 10.1.2.3", "10.9.9.9"], by_peer("203.0.113.5")),
            (&["2001:db8::5, 10.0.0.7"], by_peer("2001:db8::5")),
            (&["[2001:db8::5]:4711", "203.0.113.5:80"], by_peer("203.0.113.5")),
            // All trusted: the furthest hop.
            (&["10.0.0.1, 10.0.0.2"], by_peer("10.0.0.1")),
            // Garbage ends the walk at the nearest hop read before it.
            (&["203.0.113.5, unknown, 10.0.0.2"], by_peer("10.0.0.2")),
            (&["unknown"], Client { ip: peer, forwarded_by: None }),
            (&[], Client { ip: peer, forwarded_by: None }),
        ] {
            assert_eq!(client(peer, &headers(fields), &nets), want, "{fields:?}");
        }
    }

    #[test]
    fn an_untrusted_peer_or_no_trust_ignores_the_header() {
        let forged = headers(&["198.51.100.1"]);
        let direct = |peer: &str| Client { ip: ip(peer), forwarded_by: None };
        assert_eq!(client(ip("127.0.0.2"), &forged, &trusted(&["127.0.0.1"])), direct("127.0.0.2"));
        assert_eq!(client(ip("127.0.0.1"), &forged, &[]), direct("127.0.0.1"));
        // A dual-stack socket's IPv4-mapped peer is the IPv4 address it maps.
        let mapped = ip("::ffff:127.0.0.1");
        let believed = client(mapped, &forged, &trusted(&["127.0.0.1"]));
        assert_eq!(believed, Client { ip: ip("198.51.100.1"), forwarded_by: Some(mapped) });
    }
}
