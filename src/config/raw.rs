//! What the sources say, deserialised into raw structs before anything is checked: every key of
//! every table, each value kept as written ([`Value`]) for the validation pass to check, so that
//! deserialising never stops at a bad value and one pass can report them all.

use std::collections::BTreeMap;

use ::config::{Value, ValueKind};
use serde::de::{Deserialize, DeserializeOwned, Deserializer};

/// A table (or list) read as `T`, or the value written where it was expected; the keys of a table
/// that `T` has no field for are kept apart, to be reported as unknown.
pub(super) struct Raw<T> {
    pub(super) read: Result<T, Value>,
    pub(super) unknown: Vec<String>,
}

/// The keys of a raw struct, in order; `None` for lists and maps, which take any.
pub(super) trait Keys {
    const KEYS: Option<&'static [&'static str]> = None;
}

impl<T> Keys for Vec<T> {}
impl<V> Keys for BTreeMap<String, V> {}

impl<T: Default> Default for Raw<T> {
    fn default() -> Self {
        Self { read: Ok(T::default()), unknown: Vec::new() }
    }
}

impl<T: DeserializeOwned + Keys> From<Value> for Raw<T> {
    fn from(value: Value) -> Self {
        let unknown = match (&value.kind, T::KEYS) {
            (ValueKind::Table(table), Some(keys)) => {
                let mut unknown: Vec<String> =
                    table.keys().filter(|key| !keys.contains(&key.as_str())).cloned().collect();
                unknown.sort();
                unknown
            }
            // A struct would also take an array, its fields in order.
            (_, Some(_)) => return Self { read: Err(value), unknown: Vec::new() },
            _ => Vec::new(),
        };
        Self { read: T::deserialize(value.clone()).map_err(|_| value), unknown }
    }
}

impl<'de, T: DeserializeOwned + Keys> Deserialize<'de> for Raw<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Self::from)
    }
}

/// Structs of values as written: the leaf keys, then the keys of tables and lists.
macro_rules! tables {
    ($($name:ident { $($leaf:ident),* $(; $($key:ident: $ty:ty),*)? })*) => {$(
        #[derive(Default, serde::Deserialize)]
        #[serde(default)]
        pub(super) struct $name {
            $(pub(super) $leaf: Option<Value>,)*
            $($(pub(super) $key: $ty,)*)?
        }
        impl Keys for $name {
            const KEYS: Option<&'static [&'static str]> =
                Some(&[$(stringify!($leaf),)* $($(stringify!($key),)*)?]);
        }
    )*};
}

pub(super) type Tables<T> = Raw<Vec<Raw<T>>>;

tables! {
    RawConfig {; server: Raw<RawServer>, state: Raw<RawState>, cache: Option<Raw<RawCache>>,
        tls: Option<Raw<RawTls>>, traces: Option<Raw<RawTraces>>, log: Raw<RawLog>,
        upstreams: Option<Raw<BTreeMap<String, Raw<RawUpstream>>>>, routes: Option<Tables<RawRoute>> }
    RawServer { listen, admin_listen, admin_token_env, threads, grace_period, max_ranges,
        client_header_timeout, client_write_timeout, max_connections_per_client, max_header_bytes,
        max_header_fields, client_keepalive_timeout, max_connections, client_notsent_lowat,
        upgrade_socket, proxy_protocol, trusted_proxies, admin_hosts, client_body_timeout,
        max_request_body }
    RawState { backend, redis_url, ttl, key_prefix, id_key_env, id_key_file, max_memory,
        client_share, snapshot_file }
    RawCache { dir, max_size, slice_size, max_entries }
    RawTls { listen, h2, h3; certificates: Option<Tables<RawCertificate>> }
    RawH3 { alt_svc_port, max_streams, max_connections_per_client, idle_timeout, early_data,
        retry_above_handshakes }
    RawCertificate { cert_file, key_file, ocsp_file, default }
    RawTraces { endpoint, sampling, service_name; resource: Option<Raw<BTreeMap<String, Value>>> }
    RawLog { format }
    RawUpstream { url, urls, dir, ca_file, insecure_skip_verify, sni, host_header, bucket, region,
        addressing, key_prefix, access_key_env, secret_key_env, session_token_env,
        credentials_file, profile, anonymous, connect_timeout, read_timeout, write_timeout,
        idle_timeout; health_check: Option<Raw<RawHealthCheck>> }
    RawHealthCheck { path, interval, timeout }
    RawRoute { path_prefix, host, upstream, strip_prefix, s3_client_keys_file, s3_presigned_grace,
        upstream_resume, s3_response_overrides, cache, methods;
        middleware: Option<Tables<BTreeMap<String, Value>>>,
        signed_links: Option<Raw<RawSignedLinks>>, download_limits: Option<Raw<RawDownloadLimits>>,
        rate_limit: Option<Raw<RawRateLimit>> }
    RawResume { attempts, deadline, backoff }
    RawRouteCache { revalidate, authorized }
    RawSignedLinks { keys_file, grace }
    RawDownloadLimits { per_client, per_route, count }
    RawRateLimit { rate, per_client, per_route, after, origin_header }
}
