//! Redis URLs: checked when the config is loaded, shown without credentials wherever they are
//! logged, and given whole only to the Redis client.

use std::fmt;

use super::host::{Host, split_host_port};
use super::{Problem, wrong};

/// A validated Redis URL. [`RedisUrl::as_str`] is the URL for the client, credentials included,
/// with the scheme `redis://` or `rediss://`; `Display` and `Debug` show it without credentials,
/// query or fragment, so it can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    url: String,
    tls: bool,
    host: Host,
    port: u16,
    db: u32,
    has_credentials: bool,
}

impl RedisUrl {
    /// The full URL for the Redis client. Contains the password, if any: never log it.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// Whether the connection uses TLS (`rediss://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The database number (0 when the URL names none).
    pub fn db(&self) -> u32 {
        self.db
    }

    /// A cluster has database 0 only; a URL naming another would be silently wrong.
    pub(crate) fn cluster_node(self) -> Result<Self, Problem> {
        if self.db == 0 {
            return Ok(self);
        }
        wrong(
            format!("names database {}, but Redis Cluster has database 0 only", self.db),
            "remove the database number from the URL, or end it with /0",
        )
    }

    /// Parses one Redis URL: `redis://[[user]:password@]host[:port][/db][?query][#fragment]`,
    /// the scheme being `redis`, `rediss` or `redis+cluster`. Query and fragment are the client's
    /// business (`?protocol=resp3`, `#insecure`) and are passed through. Returns whether the
    /// scheme asks for a cluster. No problem repeats the URL: it may hold a password.
    pub(crate) fn parse(text: &str) -> Result<(Self, bool), Problem> {
        let example =
            "write it as redis://[:PASSWORD@]HOST[:PORT][/DB], e.g. \"redis://127.0.0.1:6379/0\"";
        let Some((scheme, rest)) = text.trim().split_once("://") else {
            return wrong("is not a URL (no scheme://)", example);
        };
        let (tls, cluster) = match scheme.to_ascii_lowercase().as_str() {
            "redis" => (false, false),
            "rediss" => (true, false),
            "redis+cluster" => (false, true),
            "rediss+cluster" => {
                return wrong(
                    "the scheme rediss+cluster:// is not supported",
                    "for a TLS cluster, list the nodes: redis_url = [\"rediss://HOST1:6379\", \
                 \"rediss://HOST2:6379\"]",
                );
            }
            // Only well-known schemes are repeated: an unknown "scheme" may be part of a secret
            // pasted in the wrong place.
            s @ ("http" | "https" | "tcp" | "unix" | "redis+unix" | "valkey" | "valkeys") => {
                let fix = "use redis://, rediss:// (TLS) or redis+cluster://";
                return wrong(format!("the scheme {s}:// is not supported"), fix);
            }
            _ => {
                let problem =
                    "the scheme is not supported; use redis://, rediss:// or redis+cluster://";
                return wrong(problem, example);
            }
        };
        let (authority, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
        let (has_credentials, host_port) = match authority.rsplit_once('@') {
            Some((_, host_port)) => (true, host_port),
            None => (false, authority),
        };
        let (host, port) = split_host_port(host_port).or_else(|e| wrong(e, example))?;
        let path = &tail[..tail.find(['?', '#']).unwrap_or(tail.len())];
        let db = match path.strip_prefix('/') {
            None | Some("") => 0,
            Some(digits) if digits.bytes().all(|b| b.is_ascii_digit()) => match digits.parse() {
                Ok(db) => db,
                Err(_) => return wrong("the database number is too large", example),
            },
            Some(_) => return wrong("the path must be a database number, e.g. /0", example),
        };
        let scheme = if tls { "rediss" } else { "redis" };
        let url = format!("{scheme}://{rest}");
        Ok((Self { url, tls, host, port: port.unwrap_or(6379), db, has_credentials }, cluster))
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let credentials = if self.has_credentials { "***@" } else { "" };
        write!(f, "{scheme}://{credentials}{}:{}/{}", self.host, self.port, self.db)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}
