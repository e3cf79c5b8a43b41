//! Host names and IP literals as they appear in URLs, `host_header`, `sni` and route `host`:
//! shared by the config's upstream and route checks and the Redis URL.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A validated host: a DNS name (lower case) or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
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
    pub fn parse(text: &str) -> Result<Self, String> {
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

    pub fn is_name(&self) -> bool {
        matches!(self, Self::Name(_))
    }

    /// The host without brackets, as a resolver or socket address wants it.
    pub fn bare(&self) -> String {
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
pub fn split_host_port(authority: &str) -> Result<(Host, Option<u16>), String> {
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

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn hosts() {
        assert_eq!(Host::parse("Example.COM"), Ok(Host::Name("example.com".into())));
        assert_eq!(Host::parse("minio_1"), Ok(Host::Name("minio_1".into())));
        assert_eq!(Host::parse("10.0.0.1"), Ok(Host::V4(Ipv4Addr::new(10, 0, 0, 1))));
        assert_eq!(Host::parse("[::1]"), Ok(Host::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(Host::parse("[::1]").map(|h| h.to_string()), Ok("[::1]".into()));
        assert_eq!(Host::parse("[::1]").map(|h| h.bare()), Ok("::1".into()));
        for bad in [
            "",
            "10.0.0.256",
            "a..b",
            ".a",
            "a.",
            "-a",
            "a-",
            "a b",
            "a/b",
            "::1",
            "[::1",
            "[x]",
            "é.com",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Host::parse(&"a".repeat(64)).is_err());
        assert!(Host::parse(&["a"; 128].join(".")).is_err());
    }

    #[test]
    fn host_ports() {
        assert_eq!(split_host_port("h:9000"), Ok((Host::Name("h".into()), Some(9000))));
        assert_eq!(split_host_port("h"), Ok((Host::Name("h".into()), None)));
        assert_eq!(split_host_port("[::1]:443"), Ok((Host::V6(Ipv6Addr::LOCALHOST), Some(443))));
        assert_eq!(split_host_port("[::1]"), Ok((Host::V6(Ipv6Addr::LOCALHOST), None)));
        for (bad, want) in [
            ("h:", "empty"),
            ("h:x", "not a number"),
            ("h:0", "port 0"),
            ("h:65536", "port 65536 is out of range"),
            ("h:99999999999999999999", "out of range"),
            ("[::1]x", "unexpected text"),
            ("[::1", "unclosed"),
            (":80", "host is empty"),
        ] {
            let err = split_host_port(bad).expect_err(bad);
            assert!(err.contains(want), "{bad:?}: {err}");
        }
    }
}
