//! Values that the config names and the runtime uses: parsed and checked here once, so that the
//! config loader only names them (`config/` parses files; these are shared by everything that
//! handles a host, a size, a secret or a Redis URL).

pub mod host;
pub mod http_url;
pub(crate) mod listen_addr;
pub mod redis_url;
pub mod secret;
pub(crate) mod small_file;
pub mod units;

/// What is wrong with a value, and the fix: the shape of every config problem.
pub(crate) type Problem = (String, String);

/// `Err` of a problem and its fix.
pub(crate) fn wrong<T>(problem: impl Into<String>, fix: impl Into<String>) -> Result<T, Problem> {
    Err((problem.into(), fix.into()))
}
