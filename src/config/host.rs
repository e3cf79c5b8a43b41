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
        if let Some(inner) = text.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or("an IPv6 host has an unclosed '['")?;
            let not_v6 = "the host in brackets is not an IPv6 address";
            return inner.parse().map(Self::V6).or(Err(not_v6.to_owned()));
        }
        let labels: Vec<&str> = text.split('.').collect();
        let problem = if text.is_empty() {
            "the host is empty"
        } else if text.contains(':') {
            "an IPv6 host must be written in brackets, e.g. [::1]"
        } else if text.len() > 253 {
            "the host name is longer than 253 characters"
        // A name whose last label is numeric can only be an IPv4 address (no top-level domain
        // is numeric); "10.0.0.256" must not pass as a name.
        } else if labels
            .last()
            .is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))
        {
            let not_v4 = "the host looks like an IPv4 address but is not one";
            return text.parse().map(Self::V4).or(Err(not_v4.to_owned()));
        } else if let Some(problem) = labels.iter().find_map(|label| match label {
            _ if label.is_empty() => {
                Some("the host name has an empty label (a leading, trailing or double dot)")
            }
            _ if label.len() > 63 => Some("a label of the host name is longer than 63 characters"),
            _ if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') => {
                Some("the host name may contain only letters, digits, '-', '_' and dots")
            }
            _ if label.starts_with('-') || label.ends_with('-') => {
                Some("a label of the host name starts or ends with '-'")
            }
            _ => None,
        }) {
            problem
        } else {
            return Ok(Self::Name(text.to_ascii_lowercase()));
        };
        Err(problem.to_owned())
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
            Self::V6(ip) => write!(f, "[{ip}]"),
            host => f.write_str(&host.bare()),
        }
    }
}

/// Splits `host[:port]` (host possibly a bracketed IPv6 literal). The port is `None` when absent;
/// a present port must be 1..=65535.
pub(super) fn split_host_port(authority: &str) -> Result<(Host, Option<u16>), String> {
    let (host, port) = match authority.find(']').filter(|_| authority.starts_with('[')) {
        Some(end) => match authority.split_at(end + 1) {
            (host, "") => (host, None),
            (host, rest) => (
                host,
                Some(rest.strip_prefix(':').ok_or("unexpected text after the IPv6 address")?),
            ),
        },
        None if authority.starts_with('[') => return Err("an IPv6 host has an unclosed '['".into()),
        None => {
            authority.rsplit_once(':').map_or((authority, None), |(host, port)| (host, Some(port)))
        }
    };
    let host = Host::parse(host)?;
    let port = match port {
        None => None,
        Some("") => return Err("the port after ':' is empty".to_owned()),
        Some(text) if !text.bytes().all(|b| b.is_ascii_digit()) => {
            return Err("the port is not a number".to_owned());
        }
        Some(text) => match text.parse::<u16>() {
            Ok(0) => return Err("port 0 cannot be connected to".to_owned()),
            Ok(port) => Some(port),
            Err(_) => {
                let digits = text.trim_start_matches('0');
                return Err(format!("port {digits} is out of range (1 to 65535)"));
            }
        },
    };
    Ok((host, port))
}
