//! `[server]`: listeners, the admin token, threads, shutdown, and what one client may cost.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use super::check::{Ctx, MS, Problem, complete, read, secs, wrong};
use super::raw::{Raw, RawServer};
use super::source::Path;
use crate::admin;
use crate::admission::{self, ClientLimits, MAX_CONNECTIONS_LIMIT};
use crate::client_address;
use crate::ip_net::IpNet;
use crate::values::listen_addr;
use crate::values::secret::{AdminToken, SecretVar};

#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Never the same socket as `listen`.
    pub admin_listen: SocketAddr,
    pub admin_token: Option<AdminToken>,
    pub threads: NonZeroUsize,
    pub grace_period: Duration,
    pub max_ranges: usize,
    pub client_limits: ClientLimits,
    pub upgrade_socket: PathBuf,
    pub proxy_protocol: bool,
    pub trusted_proxies: Vec<IpNet>,
    /// Lower case, without port.
    pub admin_hosts: Vec<String>,
}

pub(super) fn check(v: &mut Ctx<'_>, at: &Path, raw: &Raw<RawServer>) -> Option<ServerConfig> {
    let r = v.table(at, raw, "[server] with listen = \"127.0.0.1:8080\"")?;
    let localhost = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let addr = |example| move |text: &str| listen_addr::parse(text, example);
    read! { v, at, r;
        listen: parsed("\"127.0.0.1:8080\"", addr("127.0.0.1:8080")).or(localhost(8080));
        admin_listen: parsed("\"127.0.0.1:9090\"", addr("127.0.0.1:9090")).or(localhost(9090));
    }
    let admin_token = v.nested(&at.key("admin_token_env"), &r.admin_token_env, |v, at, value| {
        let secret = SecretVar {
            example: "admin_token_env = \"RANGEWAY_ADMIN_TOKEN\"",
            holds: "the token",
            source_hint: " (e.g. from `openssl rand -hex 32`)",
            otherwise: "or remove admin_token_env to leave the admin API open on admin_listen",
        };
        let (env_var, token) = v.secret(at, value, &secret)?;
        Some(AdminToken::new(env_var, token))
    });
    let admin_token = admin_token.opt();
    // The bound on threads only catches a typo such as `threads = 80000`; available_parallelism
    // fails only where the OS cannot say, and one thread still works.
    let cpus = std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN);
    let socket = ("\"/run/rangeway/upgrade.sock\"", PathBuf::from("/tmp/rangeway-upgrade.sock"));
    let (proxies, hosts) = ("[\"10.0.0.0/8\", \"fd00::/8\"]", "[\"rangeway-1.internal\"]");
    read! { v, at, r;
        threads: integer(1..=1024, "4").opt();
        grace_period: duration(Duration::ZERO..=secs(3600)).or(secs(30));
        max_ranges: integer(1..=1000, "16").or(16);
    }
    let client_limits = client_limits(v, at, r);
    read! { v, at, r;
        upgrade_socket: parsed(socket.0, upgrade_socket).or(socket.1);
        proxy_protocol: boolean().or(false);
        trusted_proxies: strings("a string", proxies, client_address::trusted_proxy).or(Vec::new());
        admin_hosts: strings("a string", hosts, admin::host_entry).or(Vec::new());
    }
    let threads = threads.map(|n| n.and_then(NonZeroUsize::new).unwrap_or(cpus));
    let (listen, admin_listen) = (listen?, admin_listen?);
    if listen_addr::collide(listen, admin_listen) {
        let other =
            SocketAddr::new(admin_listen.ip(), if listen.port() == 9090 { 9091 } else { 9090 });
        return v.fail(
            &at.key("admin_listen"),
            format!("{admin_listen} overlaps server.listen ({listen})"),
            format!(
                "give admin_listen another port, e.g. \"{other}\": the admin API must never be \
                 reachable on the public listener"
            ),
        );
    }
    complete! { ServerConfig {
        listen: Some(listen), admin_listen: Some(admin_listen), admin_token, threads, grace_period,
        max_ranges, client_limits, upgrade_socket, proxy_protocol, trusted_proxies, admin_hosts,
    } }
}

/// A Unix socket path holds at most 107 bytes (sun_path).
fn upgrade_socket(text: &str) -> Result<PathBuf, Problem> {
    if text.is_empty() || text.len() > 107 || text.contains('\0') {
        let fix = "use a short absolute path, e.g. upgrade_socket = \"/run/rangeway/upgrade.sock\"";
        return wrong("is not a usable Unix socket path (1 to 107 bytes)", fix);
    }
    Ok(PathBuf::from(text))
}

fn client_limits(v: &mut Ctx<'_>, at: &Path, r: &RawServer) -> Option<ClientLimits> {
    let d = ClientLimits::default();
    let timeouts = MS..=secs(3600);
    // pingora itself reads at most 1 MiB of header and 256 fields: the limits stay within them.
    // The upper bound of client_notsent_lowat only catches a typo: beyond it a socket's queue is
    // the send buffer's anyway.
    read! { v, at, r;
        client_header_timeout: duration(timeouts.clone()).or(d.header_timeout);
        client_body_timeout: duration(timeouts.clone()).or(d.body_timeout);
        client_write_timeout: duration(timeouts.clone()).or(d.write_timeout);
        client_keepalive_timeout: duration(timeouts).or(d.keepalive_timeout);
        max_connections_per_client: integer(0..=1_000_000, "1024").or(d.max_connections_per_client);
        max_header_bytes: size(1024..=1_048_575, "\"32KiB\"").or(d.max_header_bytes as u64);
        max_header_fields: integer(1..=256, "100").or(d.max_header_fields);
        max_connections: integer(1..=MAX_CONNECTIONS_LIMIT, "10000").then(|max| fits(v, at, max));
        client_notsent_lowat: size(0..=1 << 30, "\"128KiB\"").then(|size| lowat(v, at, size));
        max_request_body: size(0..=1 << 50, "\"64MiB\"").or(d.max_request_body);
    }
    complete! { ClientLimits {
        header_timeout: client_header_timeout,
        write_timeout: client_write_timeout,
        keepalive_timeout: client_keepalive_timeout,
        max_connections_per_client,
        max_header_bytes: max_header_bytes.map(|n| n as usize),
        max_header_fields,
        notsent_lowat: client_notsent_lowat.or(d.notsent_lowat),
        max_connections: max_connections.or(d.max_connections),
        max_request_body,
        body_timeout: client_body_timeout,
    } }
}

fn fits(v: &mut Ctx<'_>, at: &Path, max: usize) -> Option<usize> {
    v.check(&at.key("max_connections"), admission::fitting_connections(max))
}

fn lowat(v: &mut Ctx<'_>, at: &Path, size: u64) -> Option<u32> {
    v.check(&at.key("client_notsent_lowat"), admission::notsent_lowat(size))
}
