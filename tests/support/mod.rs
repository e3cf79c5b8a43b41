//! Support code for rangeway's integration tests: real servers (nginx, an in-process origin that
//! misbehaves on purpose), a test PKI, a raw HTTP/1.1 client, and real download clients.
//!
//! Everything here binds 127.0.0.1 on ports chosen at run time and cleans up on drop. The
//! external programs it runs are installed by scripts/deps.sh; a missing one is a failure, not a
//! skipped test.

// Each file in tests/ compiles this module into its own test binary and uses only part of it;
// without this, every binary would warn about the parts it does not use.
#![allow(dead_code)]

pub(crate) mod clients;
pub(crate) mod data;
pub(crate) mod h3;
pub(crate) mod haproxy;
pub(crate) mod http;
pub(crate) mod lossy_relay;
pub(crate) mod multipart;
pub(crate) mod nginx;
pub(crate) mod origin;
pub(crate) mod ports;
pub(crate) mod proxy;
pub(crate) mod redis;
pub(crate) mod s3;
pub(crate) mod tls;
pub(crate) mod tmp;
pub(crate) mod wait;
