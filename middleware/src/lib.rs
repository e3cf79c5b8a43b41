//! Sans-I/O building blocks for rangeway's body path.
//!
//! Nothing here knows about pingora, tokio or the state store, and nothing on the body path does
//! I/O: every type is a pure function of its inputs, so it can be unit-tested, fuzzed and
//! benchmarked alone. The one exception, off the body path, is the `aes128gcm` stage's builder
//! reading its key once, at configuration time.
//!
//! - [`aes128gcm`]: the `aes128gcm` stage (RFC 8188 encryption, resumable at any byte), its key
//!   files and a streaming decryptor.
//! - [`chain`]: a route's middleware as one streaming transform with one range algebra, and the
//!   registry of stage kinds.
//! - [`checksum`]: the `checksum` stage, resumable SHA-256 and combinable CRC32, `Repr-Digest`.
//! - [`gzip`]: the `gzip` stage, one gzip member made of independently compressed blocks, so that
//!   any range of it can be regenerated.
//! - [`rfc9110`]: ranges, conditional requests and entity tags.
//! - [`rfc9111`]: what a shared cache may store, for how long, and what a request asks of it.

pub mod aes128gcm;
pub mod chain;
pub mod checksum;
pub mod gzip;
mod range;
pub mod rfc9110;
pub mod rfc9111;
mod window;

pub use range::ByteRange;
pub use window::Window;
