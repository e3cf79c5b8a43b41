//! IPv4 and IPv6 networks in CIDR notation (`10.0.0.0/8`, `fd00::/8`; a bare address is one
//! host): `server.trusted_proxies`, and the client prefix a signed link is bound to.

use std::fmt;
use std::net::IpAddr;

/// A network: an address with its host bits clear, and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    network: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Parses `10.0.0.0/8`, `::1/128` or a bare address. Host bits set past the prefix
    /// (`10.0.0.1/8`) are refused: in a configuration such an entry usually means another prefix
    /// was meant.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr =
            address.parse().map_err(|_| format!("{address:?} is not an IP address"))?;
        let width = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| format!("/{prefix} is not a prefix length from 0 to {width}"))?,
        };
        let net = Self { network: masked(address, prefix), prefix };
        if net.network != address {
            return Err(format!(
                "{address} has bits set past its /{prefix} (the network is {})",
                net.network
            ));
        }
        Ok(net)
    }

    /// The network `text` names, host bits set past the prefix dropped (`192.0.2.7/24` is
    /// `192.0.2.0/24`), as a signed link's prefix is read; `None` when it is no address.
    pub fn covering(text: &str) -> Option<Self> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, prefix),
            None => return Self::parse(text).ok(),
        };
        let address = address.parse::<IpAddr>().ok()?;
        Self::parse(&format!("{}/{prefix}", masked(address, prefix.parse().ok()?))).ok()
    }

    /// Whether `ip` is in this network. An IPv4 address and its IPv4-mapped IPv6 form
    /// (`::ffff:10.0.0.1`, as a dual-stack socket reports IPv4 peers) are one address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.network, ip) {
            (IpAddr::V4(_), IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => return false,
            },
            (IpAddr::V6(_), IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
            _ => ip,
        };
        masked(ip, self.prefix) == self.network
    }
}

/// `ip` with the bits past `prefix` cleared.
fn masked(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0);
            IpAddr::V4((v4.to_bits() & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix.min(128))).unwrap_or(0);
            IpAddr::V6((v6.to_bits() & mask).into())
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn networks_contain_their_addresses_in_either_form() {
        let net = |text: &str| IpNet::parse(text).unwrap();
        assert!(net("10.0.0.0/8").contains(ip("10.200.3.4")));
        assert!(!net("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(net("10.0.0.0/8").contains(ip("::ffff:10.1.1.1")));
        assert!(!net("10.0.0.0/8").contains(ip("::10.1.1.1")), "IPv4-compatible is not mapped");
        assert!(net("::ffff:0:0/96").contains(ip("192.0.2.1")));
        assert!(net("0.0.0.0/0").contains(ip("203.0.113.1")));
        assert!(net("::/0").contains(ip("2001:db8::1")));
        assert!(
            net("fd00::/8").contains(ip("fdab::1")) && !net("fd00::/8").contains(ip("fe80::1"))
        );
        assert_eq!(net("192.0.2.7").to_string(), "192.0.2.7/32");
    }

    #[test]
    fn covering_drops_host_bits_where_parse_refuses_them() {
        assert!(IpNet::parse("192.0.2.7/24").is_err());
        assert_eq!(IpNet::covering("192.0.2.7/24"), IpNet::parse("192.0.2.0/24").ok());
        assert_eq!(IpNet::covering("2001:db8::1/32"), IpNet::parse("2001:db8::/32").ok());
        for bad in ["192.0.2.0/33", "nonsense", "192.0.2.0/", "/8"] {
            assert_eq!(IpNet::covering(bad), None, "{bad}");
        }
    }
}
