//! Origins rangeway runs itself. Today: `dir`, a local folder served over HTTP (and, for the
//! pipeline's tests, served in memory).

pub mod dir;

#[cfg(test)]
pub(crate) mod memory;
