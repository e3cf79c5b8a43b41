//! Sans-I/O building blocks for rangeway's body path.
//!
//! Nothing here does I/O or knows about pingora, tokio or the state store: every type is a pure
//! function of its inputs, so it can be unit-tested, fuzzed and benchmarked alone.

mod range;
pub mod rfc9110;
mod window;

pub use range::ByteRange;
pub use window::Window;
