//! rangeway: a reverse proxy on pingora that makes every download resumable at any byte.
//!
//! The binary (`src/main.rs`) is a thin CLI over this library; integration tests start the same
//! server in-process through [`server::Running`].

pub mod admin;
pub mod admission;
pub(crate) mod cache;
pub(crate) mod client_address;
pub(crate) mod client_socket;
pub(crate) mod client_writes;
pub mod config;
pub mod fingerprint;
pub mod h3;
pub(crate) mod h3_transport;
pub mod ip_net;
pub mod links;
pub mod logging;
pub mod origin;
pub mod proxy;
pub mod proxy_protocol;
pub mod range;
pub(crate) mod representation;
pub mod request_path;
pub mod routes;
pub mod s3;
pub mod server;
pub mod state;
pub mod telemetry;
pub mod tls;
pub mod traces;
pub(crate) mod unless;
pub mod values;
