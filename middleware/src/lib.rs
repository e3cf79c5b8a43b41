//! Sans-I/O building blocks for rangeway's body path.
//!
//! Nothing here does I/O or knows about pingora, tokio or the state store: every type is a pure
//! function of its inputs, so it can be unit-tested, fuzzed and benchmarked alone.
//!
//! - [`chain`]: a route's middleware as one streaming transform with one range algebra, and the
//!   registry of stage kinds.
//! - [`checksum`]: the `checksum` stage, resumable SHA-256 and combinable CRC32, `Repr-Digest`.
//! - [`gzip`]: the `gzip` stage, one gzip member made of independently compressed blocks, so that
//!   any range of it can be regenerated.
//! - [`rfc9110`]: ranges, conditional requests and entity tags.

pub mod chain;
pub mod checksum;
pub mod gzip;
mod range;
pub mod rfc9110;
mod window;

pub use range::ByteRange;
pub use window::Window;
