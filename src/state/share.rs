//! Each client's share of the store: no one client address pushes out the others' records.

use std::net::IpAddr;

/// A client as its share is counted: an IPv4 address, or an IPv6 address's /64 (one subscriber's
/// allocation, which a client can change addresses within at will).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(super) struct ClientGroup(u128);

impl ClientGroup {
    /// The group of a delivery's client (its address as text); none for a client without one.
    pub(super) fn of(client: &str) -> Option<Self> {
        match client.parse::<IpAddr>().ok()? {
            IpAddr::V4(v4) => Some(Self(u128::from(v4.to_bits()))),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Some(Self(u128::from(v4.to_bits()))),
                None => Some(Self(v6.to_bits() & !u128::from(u64::MAX))),
            },
        }
    }

    /// The group as text, for a store key (hashed there).
    pub(super) fn key(self) -> String {
        format!("{:032x}", self.0)
    }
}

/// What a download's records take in Redis (its session, its object's record, its index
/// entries): the unit the memory a client may hold there is counted in.
pub(super) const REDIS_RECORD_BYTES: u64 = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_groups_are_addresses_and_ipv6_prefixes() {
        let group = |text: &str| ClientGroup::of(text);
        assert_eq!(group("2001:db8::1"), group("2001:db8::ffff:1"));
        assert_ne!(group("2001:db8::1"), group("2001:db8:0:1::1"));
        assert_ne!(group("192.0.2.1"), group("192.0.2.2"));
        assert_eq!(group("::ffff:192.0.2.1"), group("192.0.2.1"));
        assert_eq!(group("-"), None);
    }
}
