//! S3-compatible origins: the requests rangeway signs for them, and the answers they give.

pub mod credentials;
pub mod error;
pub mod names;
pub mod sign;
pub mod verify;
