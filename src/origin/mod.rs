//! Origins rangeway runs itself. Today: `dir`, a local folder served over HTTP.

pub mod dir;
