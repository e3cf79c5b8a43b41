//! What a rejected configuration reports: every problem at once, each with where it is and what
//! to do.

/// One problem, displayed as `path (line L, column C): problem — fix`. No field ever holds a
/// secret: values of secret-bearing keys are never echoed, only described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}{}: {problem} — {fix}", position.map_or(String::new(), |(l, c)| format!(" (line {l}, column {c})")))]
#[non_exhaustive]
pub struct ConfigError {
    /// A key path (`routes[0].middleware[1].kind`), an environment variable, or the file
    /// (`FILE:LINE:COLUMN` for a syntax error).
    pub path: String,
    pub problem: String,
    pub fix: String,
    /// `(line, column)`, from 1, of the value in the file (of the table a missing key belongs in);
    /// `None` when a variable set it or it is not about one place of the file.
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

/// Every problem found, in report order; never empty, since a load that found nothing wrong
/// returns the configuration instead. One per line, so that `rangeway check` output can be read
/// (and grepped) line by line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub(super) Vec<ConfigError>);

impl ConfigErrors {
    pub fn errors(&self) -> &[ConfigError] {
        &self.0
    }
}
