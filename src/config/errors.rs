//! What a rejected configuration reports: every problem at once, each with where it is and what
//! to do.

use std::fmt;

/// One problem in the configuration.
///
/// Displayed as `path: problem — fix`, with the line and column after the path when the value is
/// in the file, e.g. `routes[1].upstream (line 12, column 12): no upstream named "zzz" — define
/// [upstreams.zzz], or use one of: local`. No field ever holds a secret: values of secret-bearing
/// keys (Redis URLs, the admin token) are never echoed, only described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}{}: {problem} — {fix}", position.map_or(String::new(), |(l, c)| format!(" (line {l}, column {c})")))]
#[non_exhaustive]
pub struct ConfigError {
    /// Where: a key path such as `server.listen`, `upstreams.origin.url` or
    /// `routes[0].middleware[1].kind`; an environment variable; or the file (`FILE:LINE:COLUMN`
    /// for a syntax error).
    pub path: String,
    /// What is wrong, in words a user can act on.
    pub problem: String,
    /// What to write instead.
    pub fix: String,
    /// `(line, column)`, from 1, of the value in the file (of the table a missing key belongs in);
    /// `None` when it came from the environment or is not about one place of the file.
    pub position: Option<(usize, usize)>,
}

impl ConfigError {
    pub(super) fn new(
        path: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self { path: path.into(), problem: problem.into(), fix: fix.into(), position: None }
    }
}

/// Every problem found in a configuration, in a stable order (sections, then keys as they sort).
///
/// Never empty: a load that found nothing wrong returns the configuration instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    /// Wraps the problems found. Callers pass at least one: an empty error would claim a failure
    /// without saying what failed.
    pub(super) fn new(errors: Vec<ConfigError>) -> Self {
        Self(errors)
    }

    pub(super) fn one(error: ConfigError) -> Self {
        Self(vec![error])
    }

    /// The problems, in report order.
    pub fn errors(&self) -> &[ConfigError] {
        &self.0
    }

    /// How many problems were found (at least one).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: kept so that `len` has its usual companion (clippy `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// One problem per line, so that `rangeway check` output can be read (and grepped) line by line.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
