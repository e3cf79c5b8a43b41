//! Host names and IP literals as they appear in URLs, `host_header`, `sni` and route `host`.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A validated host: a DNS name (lower case) or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Host {
    Name(String),
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

impl Host {
    /// Parses a host as written in a URL authority: `example.com`, `10.0.0.1`, `[::1]`.
    ///
    /// Names may contain `_`, which DNS proper forbids but container and service-discovery names
    /// (`minio_1`) use, and which resolvers accept. The error never repeats the text: it is
    /// sometimes cut out of a URL that holds a password.
    pub(super) fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("the host is empty".to_owned());
        }
        if let Some(inner) = text.strip_prefix('[') {
            let Some(inner) = inner.strip_suffix(']') else {
                return Err("an IPv6 host has an unclosed '['".to_owned());
            };
            return inner
                .parse::<Ipv6Addr>()
                .map(Self::V6)
                .map_err(|_| "the host in brackets is not an IPv6 address".to_owned());
        }
        if text.contains(':') {
            return Err("an IPv6 host must be written in brackets, e.g. [::1]".to_owned());
        }
        if text.len() > 253 {
            return Err("the host name is longer than 253 characters".to_owned());
        }
        let labels: Vec<&str> = text.split('.').collect();
        // A name whose last label is numeric can only be an IPv4 address (no top-level domain
        // is numeric); "10.0.0.256" must not pass as a name.
        if labels.last().is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit())) {
            return text
                .parse::<Ipv4Addr>()
                .map(Self::V4)
                .map_err(|_| "the host looks like an IPv4 address but is not one".to_owned());
        }
        for label in &labels {
            if label.is_empty() {
                return Err("the host name has an empty label (a leading, trailing or double dot)"
                    .to_owned());
            }
            if label.len() > 63 {
                return Err("a label of the host name is longer than 63 characters".to_owned());
            }
            if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                return Err(
                    "the host name may contain only letters, digits, '-', '_' and dots".to_owned()
                );
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err("a label of the host name starts or ends with '-'".to_owned());
            }
        }
        Ok(Self::Name(text.to_ascii_lowercase()))
    }

    pub(super) fn is_name(&self) -> bool {
        matches!(self, Self::Name(_))
    }

    /// The host without brackets, as a resolver or socket address wants it.
    pub(super) fn bare(&self) -> String {
        match self {
            Self::Name(name) => name.clone(),
            Self::V4(ip) => ip.to_string(),
            Self::V6(ip) => ip.to_string(),
        }
    }
}

/// As written in a URL or a Host header: IPv6 in brackets.
impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::V4(ip) => write!(f, "{ip}"),
            Self::V6(ip) => write!(f, "[{ip}]"),
        }
    }
}

/// Splits `host[:port]` (host possibly a bracketed IPv6 literal). The port is `None` when absent;
/// a present port must be 1..=65535.
pub(super) fn split_host_port(authority: &str) -> Result<(Host, Option<u16>), String> {
    let (host, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(end) => {
                let (host, rest) = authority.split_at(end + 1);
                match rest.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None if rest.is_empty() => (host, None),
                    None => return Err("unexpected text after the IPv6 address".to_owned()),
                }
            }
            None => return Err("an IPv6 host has an unclosed '['".to_owned()),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let host = Host::parse(host)?;
    let port = port.map(parse_port).transpose()?;
    Ok((host, port))
}

fn parse_port(text: &str) -> Result<u16, String> {
    if text.is_empty() {
        return Err("the port after ':' is empty".to_owned());
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the port is not a number".to_owned());
    }
    match text.parse::<u16>() {
        Ok(0) => Err("port 0 cannot be connected to".to_owned()),
        Ok(port) => Ok(port),
        Err(_) => {
            Err(format!("port {} is out of range (1 to 65535)", text.trim_start_matches('0')))
        }
    }
}
