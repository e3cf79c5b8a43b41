//! `[server]`: listeners, the admin token, threads, shutdown.

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use super::host::Host;
use super::read::{Ctx, Field, Read, Table};
use super::secret::{self, Secret, SecretKey};
use super::tree::{Kind, Node};
use crate::ip_net::IpNet;

const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 8080));
const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 9090));
const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
const MAX_GRACE_PERIOD: Duration = Duration::from_secs(3600);
const DEFAULT_MAX_RANGES: usize = 16;
const DEFAULT_UPGRADE_SOCKET: &str = "/tmp/rangeway-upgrade.sock";
const MAX_RANGES_LIMIT: usize = 1000;
/// Measured on cache hits (see docs/benchmarks.md, "The unsent bound"): a socket that queues no
/// more than this unsent pushes its bytes out in the call that writes them, instead of leaving
/// the transmit work to the ACKs; eight times what Cloudflare's edge sets, so that a fast long
/// path stays full.
const DEFAULT_NOTSENT_LOWAT: u32 = 128 * 1024;
/// Below this a socket would wake its writer for every few segments.
const MIN_NOTSENT_LOWAT: u64 = 16 * 1024;
/// A bound that only catches a typo: beyond it a socket's queue is the send buffer's anyway.
const MAX_NOTSENT_LOWAT: u64 = 1 << 30;
/// Far above any machine this runs on; only there to catch a typo such as `threads = 80000`.
const MAX_THREADS: usize = 1024;
/// Descriptors kept aside from the clients' share: listeners, the store's connections, logs, the
/// cache's files being read.
const RESERVED_DESCRIPTORS: u64 = 256;
/// What one client connection may hold at once: its socket, an origin connection, a splice's pipe
/// (two).
const DESCRIPTORS_PER_CONNECTION: u64 = 4;
/// The default when the descriptor limit is unlimited or unknown, and the most that may be set.
const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

/// `[server]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The public listener. Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// The admin listener (health, metrics, API); never the same socket as `listen`.
    /// Default `127.0.0.1:9090`.
    pub admin_listen: SocketAddr,
    /// The bearer token the admin API requires, when `admin_token_env` is set.
    pub admin_token: Option<AdminToken>,
    /// Worker threads of the proxy. Default: the number of CPUs available to the process.
    pub threads: NonZeroUsize,
    /// How long in-flight requests may drain after SIGTERM. Default 30s, at most 1h.
    pub grace_period: Duration,
    /// Most ranges served for one request, 1..=1000. Default 16.
    pub max_ranges: usize,
    /// What one client may cost.
    pub client_limits: ClientLimits,
    /// `upgrade_socket`: where a process started with `--upgrade` receives the listening sockets
    /// of this one when it gets SIGQUIT. Default `/tmp/rangeway-upgrade.sock`; instances on one
    /// machine each need their own.
    pub upgrade_socket: PathBuf,
    /// `proxy_protocol`: every connection on the public listeners begins with a PROXY protocol
    /// header (v2, or v1), whose source address is the client's. Default false.
    pub proxy_protocol: bool,
    /// `trusted_proxies`: peers whose `X-Forwarded-For` is believed. Default none.
    pub trusted_proxies: Vec<IpNet>,
    /// `admin_hosts`: names, besides `localhost` and the admin listener's own address, that the
    /// admin listener answers in `Host` (lower case, without port). Default none.
    pub admin_hosts: Vec<String>,
}

/// Bounds on what one client connection may cost, whatever it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientLimits {
    /// `client_header_timeout`: the whole request header must arrive within this time of its
    /// first byte, or the connection is closed (slowloris). Default 10s.
    pub header_timeout: Duration,
    /// `client_write_timeout`: a client that takes none of the response for this long is cut,
    /// rather than holding its buffers and upstream connection indefinitely. Default 60s.
    pub write_timeout: Duration,
    /// `max_connections_per_client`: open connections from one address; more are answered 503
    /// and closed. Default 1024; 0 for no limit.
    pub max_connections_per_client: usize,
    /// `max_header_bytes`: the request line and header fields together. Default 32 KiB; more is
    /// answered 431.
    pub max_header_bytes: usize,
    /// `max_header_fields`: header fields in a request. Default 100; more is answered 431.
    pub max_header_fields: usize,
    /// `client_notsent_lowat`: the most response bytes the kernel queues unsent on a client's
    /// socket (`TCP_NOTSENT_LOWAT`). Default 128 KiB; 0 leaves the system's setting
    /// (`net.ipv4.tcp_notsent_lowat`, unbounded unless set).
    pub notsent_lowat: u32,
    /// `client_keepalive_timeout`: how long a connection may wait for its next request (HTTP/1)
    /// or have no stream open (HTTP/2) before it is closed. Default 60s.
    pub keepalive_timeout: Duration,
    /// `max_connections`: open client connections, all clients together; past it the longest
    /// idle one is closed to make room, or, with none idle, the new one. Default: a quarter of
    /// the descriptors the process may open, after [`RESERVED_DESCRIPTORS`] (see
    /// [`default_max_connections`]).
    pub max_connections: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(60),
            max_connections_per_client: 1024,
            max_header_bytes: 32 * 1024,
            max_header_fields: 100,
            notsent_lowat: DEFAULT_NOTSENT_LOWAT,
            keepalive_timeout: Duration::from_secs(60),
            max_connections: default_max_connections(descriptor_limit()),
        }
    }
}

/// The descriptors the process may open (`RLIMIT_NOFILE`): its hard limit, which `serve` raises
/// the soft one to (`server::raise_descriptor_limit`); `None` when unlimited.
pub(crate) fn descriptor_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum
}

/// `max_connections` when it is not set: each connection may hold
/// [`DESCRIPTORS_PER_CONNECTION`], after [`RESERVED_DESCRIPTORS`] kept aside.
fn default_max_connections(descriptors: Option<u64>) -> usize {
    descriptors.map_or(MAX_CONNECTIONS_LIMIT, |limit| {
        let share = limit.saturating_sub(RESERVED_DESCRIPTORS) / DESCRIPTORS_PER_CONNECTION;
        usize::try_from(share).unwrap_or(MAX_CONNECTIONS_LIMIT).clamp(1, MAX_CONNECTIONS_LIMIT)
    })
}

/// The admin API's bearer token, read at load time from the variable named by `admin_token_env`.
///
/// It is never printed: `Debug` redacts it and there is no `Display`. Compare presented credentials
/// with [`AdminToken::verify`], which does not leak through timing where the first byte differs.
#[derive(Clone)]
pub struct AdminToken {
    env_var: String,
    token: Secret,
}

impl AdminToken {
    /// The environment variable the token was read from (a name, safe to log).
    pub fn env_var(&self) -> &str {
        &self.env_var
    }

    /// Whether `presented` is the token. Every byte is compared whatever the mismatches, so the
    /// time taken reveals the token's length at most, never its content.
    pub fn verify(&self, presented: &[u8]) -> bool {
        let expected = self.token.expose().as_bytes();
        if presented.len() != expected.len() {
            return false;
        }
        expected.iter().zip(presented).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminToken")
            .field("env_var", &self.env_var)
            .field("token", &"<redacted>")
            .finish()
    }
}

pub(super) fn read(ctx: &mut Ctx<'_>, node: Option<Node>) -> Read<ServerConfig> {
    let mut table = match node {
        Some(node) => Table::new(
            ctx,
            "server",
            "[server]",
            node,
            "[server] with listen = \"127.0.0.1:8080\"",
        )?,
        None => Table::empty("server", "[server]"),
    };
    let listen =
        table.take("listen").map_or(Ok(DEFAULT_LISTEN), |f| f.socket_addr(ctx, "127.0.0.1:8080"));
    let admin_listen = table
        .take("admin_listen")
        .map_or(Ok(DEFAULT_ADMIN_LISTEN), |f| f.socket_addr(ctx, "127.0.0.1:9090"));
    let admin_token =
        table.take("admin_token_env").map_or(Ok(None), |f| admin_token(ctx, f).map(Some));
    let threads = match table.take("threads") {
        // The range starts at 1, so the fallback is never taken.
        Some(f) => f
            .integer(ctx, 1..=MAX_THREADS, "4")
            .map(|n| NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)),
        // available_parallelism fails only where the OS cannot say; one thread still works.
        None => Ok(std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)),
    };
    let grace_period = table.take("grace_period").map_or(Ok(DEFAULT_GRACE_PERIOD), |f| {
        f.duration(ctx, Duration::ZERO..=MAX_GRACE_PERIOD, "from \"0s\" to \"1h\"")
    });
    let max_ranges = table
        .take("max_ranges")
        .map_or(Ok(DEFAULT_MAX_RANGES), |f| f.integer(ctx, 1..=MAX_RANGES_LIMIT, "16"));
    let client_limits = read_client_limits(ctx, &mut table);
    let upgrade_socket =
        table.take("upgrade_socket").map_or(Ok(PathBuf::from(DEFAULT_UPGRADE_SOCKET)), |f| {
            let (path, origin) = (f.path.clone(), f.origin().clone());
            let text = f.string(ctx, "\"/run/rangeway/upgrade.sock\"")?;
            // A Unix socket path holds at most 107 bytes (sun_path).
            if text.is_empty() || text.len() > 107 || text.contains('\0') {
                return Err(ctx.report(
                &path,
                &origin,
                "is not a usable Unix socket path (1 to 107 bytes)",
                "use a short absolute path, e.g. upgrade_socket = \"/run/rangeway/upgrade.sock\"",
            ));
            }
            Ok(PathBuf::from(text))
        });
    let proxy_protocol = table.take("proxy_protocol").map_or(Ok(false), |f| f.boolean(ctx));
    let trusted_proxies =
        table.take("trusted_proxies").map_or(Ok(Vec::new()), |f| read_trusted_proxies(ctx, f));
    let admin_hosts =
        table.take("admin_hosts").map_or(Ok(Vec::new()), |f| read_admin_hosts(ctx, f));
    table.finish(ctx);

    let (listen, admin_listen) = (listen?, admin_listen?);
    if sockets_collide(listen, admin_listen) {
        return Err(ctx.report_at(
            "server.admin_listen",
            format!("{admin_listen} overlaps server.listen ({listen})"),
            format!(
                "give admin_listen another port, e.g. \"{}\": the admin API must never be \
                 reachable on the public listener",
                SocketAddr::new(admin_listen.ip(), if listen.port() == 9090 { 9091 } else { 9090 })
            ),
        ));
    }
    Ok(ServerConfig {
        listen,
        admin_listen,
        admin_token: admin_token?,
        threads: threads?,
        grace_period: grace_period?,
        max_ranges: max_ranges?,
        client_limits: client_limits?,
        upgrade_socket: upgrade_socket?,
        proxy_protocol: proxy_protocol?,
        trusted_proxies: trusted_proxies?,
        admin_hosts: admin_hosts?,
    })
}

/// The strings of an array field, each with its key path, or reported on its own when it is not
/// one; `example` is the field's value as a whole.
fn string_items(
    ctx: &mut Ctx<'_>,
    field: Field,
    example: &str,
) -> Read<Vec<(String, Read<String>)>> {
    let Field { path, key, node } = field;
    let items = match node.kind {
        Kind::Array(items) => items,
        _ => {
            return Err(ctx.report(
                &path,
                &node.origin,
                format!("expected an array of strings, found {}", node.type_name()),
                format!("write {key} = {example}"),
            ));
        }
    };
    let items = items.into_iter().enumerate().map(|(index, item)| {
        let item_path = format!("{path}[{index}]");
        let text = match item.kind {
            Kind::Str(text) => Ok(text),
            _ => Err(ctx.report(
                &item_path,
                &item.origin,
                format!("expected a string, found {}", item.type_name()),
                format!("write {key} = {example}"),
            )),
        };
        (item_path, text)
    });
    Ok(items.collect())
}

/// Every item read, or the proof that at least one was reported.
fn all_read<T>(items: impl IntoIterator<Item = Read<T>>) -> Read<Vec<T>> {
    let mut all = Ok(Vec::new());
    for item in items {
        match (&mut all, item) {
            (Ok(list), Ok(item)) => list.push(item),
            (_, Err(reported)) => all = Err(reported),
            (Err(_), Ok(_)) => {}
        }
    }
    all
}

fn read_trusted_proxies(ctx: &mut Ctx<'_>, field: Field) -> Read<Vec<IpNet>> {
    let origin = field.origin().clone();
    let items = string_items(ctx, field, "[\"10.0.0.0/8\", \"fd00::/8\"]")?;
    let nets: Vec<Read<IpNet>> = items
        .into_iter()
        .map(|(path, text)| {
            let text = text?;
            IpNet::parse(text.trim()).map_err(|problem| {
                ctx.report(
                    &path,
                    &origin,
                    format!("{text:?} is not a network: {problem}"),
                    "write an address or a network in CIDR notation, e.g. \"10.0.0.0/8\", \
                     \"192.0.2.7\" or \"fd00::/8\" (host names are not resolved)",
                )
            })
        })
        .collect();
    all_read(nets)
}

fn read_admin_hosts(ctx: &mut Ctx<'_>, field: Field) -> Read<Vec<String>> {
    let origin = field.origin().clone();
    let items = string_items(ctx, field, "[\"rangeway-1.internal\"]")?;
    let hosts: Vec<Read<String>> = items
        .into_iter()
        .map(|(path, text)| {
            let text = text?;
            let with_port = text.rsplit_once(':').filter(|(host, port)| {
                !host.is_empty()
                    && !host.contains(':')
                    && !port.is_empty()
                    && port.bytes().all(|b| b.is_ascii_digit())
            });
            if let Some((host, _)) = with_port {
                return Err(ctx.report(
                    &path,
                    &origin,
                    format!("{text:?} has a port"),
                    format!("write {host:?}: names are matched without their port"),
                ));
            }
            // As a Host field writes it: IPv6 in brackets.
            Host::parse(&text.to_ascii_lowercase()).map(|host| host.to_string()).map_err(
                |problem| {
                    ctx.report(
                        &path,
                        &origin,
                        format!("{text:?}: {problem}"),
                        "write a host name as clients put it in Host, without port, e.g. \
                         \"rangeway-1.internal\"",
                    )
                },
            )
        })
        .collect();
    all_read(hosts)
}

fn read_client_limits(ctx: &mut Ctx<'_>, table: &mut Table) -> Read<ClientLimits> {
    let defaults = ClientLimits::default();
    let timeout = |field: Option<Field>, ctx: &mut Ctx<'_>, default| {
        field.map_or(Ok(default), |f| {
            f.duration(
                ctx,
                Duration::from_millis(1)..=Duration::from_secs(3600),
                "from \"1ms\" to \"1h\"",
            )
        })
    };
    let header_timeout = timeout(table.take("client_header_timeout"), ctx, defaults.header_timeout);
    let write_timeout = timeout(table.take("client_write_timeout"), ctx, defaults.write_timeout);
    let max_connections_per_client = table
        .take("max_connections_per_client")
        .map_or(Ok(defaults.max_connections_per_client), |f| f.integer(ctx, 0..=1_000_000, "1024"));
    // pingora itself reads at most 1 MiB of header and 256 fields: the limits stay within them.
    let max_header_bytes =
        table.take("max_header_bytes").map_or(Ok(defaults.max_header_bytes), |f| {
            f.size(ctx, 1024..=1_048_575, "\"32KiB\"").map(|size| size as usize)
        });
    let max_header_fields = table
        .take("max_header_fields")
        .map_or(Ok(defaults.max_header_fields), |f| f.integer(ctx, 1..=256, "100"));
    let keepalive_timeout =
        timeout(table.take("client_keepalive_timeout"), ctx, defaults.keepalive_timeout);
    let max_connections = table.take("max_connections").map_or(Ok(defaults.max_connections), |f| {
        let (path, origin) = (f.path.clone(), f.origin().clone());
        let max = f.integer(ctx, 1..=MAX_CONNECTIONS_LIMIT, "10000")?;
        match descriptor_limit() {
            Some(descriptors) if max as u64 > descriptors => Err(ctx.report(
                &path,
                &origin,
                format!(
                    "{max} connections cannot be open at once: the process may open \
                         {descriptors} descriptors (RLIMIT_NOFILE), and each connection needs one"
                ),
                format!(
                    "use at most {descriptors}, or leave it unset ({}: room for an origin \
                         connection and a pipe each), or raise the limit (LimitNOFILE= in the \
                         systemd unit, ulimit -n)",
                    default_max_connections(Some(descriptors))
                ),
            )),
            _ => Ok(max),
        }
    });
    let notsent_lowat = table.take("client_notsent_lowat").map_or(
        Ok(defaults.notsent_lowat),
        |f| {
            let (path, origin) = (f.path.clone(), f.origin().clone());
            match f.size(ctx, 0..=MAX_NOTSENT_LOWAT, "\"128KiB\"")? {
                // Checked against both bounds above, so the conversion holds.
                size @ (0 | MIN_NOTSENT_LOWAT..) => Ok(u32::try_from(size).unwrap_or(u32::MAX)),
                size => Err(ctx.report(
                    &path,
                    &origin,
                    format!("{size} bytes would wake the writer for every few segments"),
                    "use at least \"16KiB\" (the default is \"128KiB\"), or 0 for the system's setting",
                )),
            }
        },
    );
    Ok(ClientLimits {
        header_timeout: header_timeout?,
        write_timeout: write_timeout?,
        max_connections_per_client: max_connections_per_client?,
        max_header_bytes: max_header_bytes?,
        max_header_fields: max_header_fields?,
        notsent_lowat: notsent_lowat?,
        keepalive_timeout: keepalive_timeout?,
        max_connections: max_connections?,
    })
}

/// Two listeners collide on the same non-zero port when their addresses are equal or either is a
/// wildcard (`0.0.0.0`, `::`), which also covers the other. Port 0 is "any free port" (tests use
/// it for both), so it never collides.
fn sockets_collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

fn admin_token(ctx: &mut Ctx<'_>, field: Field) -> Read<AdminToken> {
    let key = SecretKey {
        example: "admin_token_env = \"RANGEWAY_ADMIN_TOKEN\"",
        holds: "the token",
        source_hint: " (e.g. from `openssl rand -hex 32`)",
        otherwise: "or remove admin_token_env to leave the admin API open on admin_listen",
    };
    let (env_var, token) = secret::read_env(ctx, field, &key)?;
    Ok(AdminToken { env_var, token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collisions() {
        let addr = |s: &str| s.parse::<SocketAddr>().expect("test address");
        assert!(sockets_collide(addr("127.0.0.1:80"), addr("127.0.0.1:80")));
        assert!(sockets_collide(addr("0.0.0.0:80"), addr("127.0.0.1:80")));
        assert!(sockets_collide(addr("[::1]:80"), addr("[::]:80")));
        assert!(!sockets_collide(addr("127.0.0.1:80"), addr("127.0.0.1:81")));
        assert!(!sockets_collide(addr("127.0.0.1:80"), addr("127.0.0.2:80")));
        assert!(!sockets_collide(addr("127.0.0.1:0"), addr("127.0.0.1:0")));
    }

    #[test]
    fn the_default_connection_cap_leaves_room_for_origins_and_files() {
        assert_eq!(default_max_connections(Some(65_536)), 16_320);
        assert_eq!(default_max_connections(Some(1024)), 192);
        assert_eq!(default_max_connections(Some(10)), 1, "never none");
        assert_eq!(default_max_connections(None), MAX_CONNECTIONS_LIMIT);
    }

    #[test]
    fn token_verification() {
        let token = AdminToken { env_var: "T".into(), token: Secret::new("s3cret".into()) };
        assert!(token.verify(b"s3cret"));
        assert!(!token.verify(b"s3creT"));
        assert!(!token.verify(b"s3cre"));
        assert!(!token.verify(b""));
        assert!(!format!("{token:?}").contains("s3cret"));
    }
}
