//! Secrets read at load time (tokens, keys): held so that they cannot be printed by mistake.

use std::ffi::OsString;
use std::fmt;

use zeroize::Zeroizing;

use super::small_file::read_text;
use super::{Problem, wrong};

/// A secret value: `Debug` redacts it, there is no `Display`, and its memory is zeroed on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub(crate) fn new(value: String) -> Self {
        Self(Zeroizing::new(value))
    }

    /// The value, for the one place that uses it (a signature, a comparison).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Printable ASCII without spaces: what tokens and keys are, and what a header can carry.
pub(crate) fn printable(value: &str) -> bool {
    value.bytes().all(|b| b.is_ascii_graphic())
}

/// How a secret held in an environment variable, which a `*_env` key names, is read and
/// explained.
pub(crate) struct SecretVar<'s> {
    /// The key as it would be written, e.g. `admin_token_env = "RANGEWAY_ADMIN_TOKEN"`.
    pub(crate) example: &'s str,
    /// What the variable holds: "the token".
    pub(crate) holds: &'s str,
    /// Where a value can come from, shown in the fix: " (e.g. from `openssl rand -hex 32`)".
    pub(crate) source_hint: &'s str,
    /// The way out that does without the variable: "or remove admin_token_env to …".
    pub(crate) otherwise: &'s str,
}

impl SecretVar<'_> {
    /// The secret in the variable `name`, whose value is `value`. It must be printable ASCII
    /// without spaces — what tokens and keys are, and what a header can carry — so a trailing
    /// newline from a secrets file is caught here rather than failing every request.
    ///
    /// The value is never echoed: a user who pasted the secret itself into the key must not see
    /// it in logs.
    pub(crate) fn read(&self, name: &str, value: Option<&OsString>) -> Result<Secret, Problem> {
        let holds = self.holds;
        if name.bytes().next().is_none_or(|b| b.is_ascii_digit())
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return wrong(
                format!(
                    "is not an environment variable name (it must hold the variable's name, not {holds})"
                ),
                format!(
                    "put {holds} in an environment variable and name it here, e.g. {}",
                    self.example
                ),
            );
        }
        // Naming the variable helps, but only when the name looks like one: a secret made only of
        // letters, digits and '_' would pass the check above, and is far less likely to be in
        // SCREAMING_CASE.
        let screaming =
            name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        let var = match screaming {
            true => format!("environment variable {name}"),
            false => "the environment variable it names".to_owned(),
        };
        let problem = match value.map(|value| value.to_str()) {
            None => format!("{var} is not set"),
            Some(None) => format!("{var} is not UTF-8"),
            Some(Some("")) => format!("{var} is empty"),
            Some(Some(value)) if printable(value) => return Ok(Secret::new(value.to_owned())),
            Some(Some(_)) => {
                return wrong(
                    format!("{var} holds spaces, control characters or non-ASCII text"),
                    "set it to printable ASCII without spaces or newlines (e.g. hex or base64url)",
                );
            }
        };
        let exported = if screaming { name } else { "it" };
        let (hint, otherwise) = (self.source_hint, self.otherwise);
        wrong(
            problem,
            format!("export {exported} with {holds}{hint} before starting rangeway, {otherwise}"),
        )
    }
}

/// How a file of `ID SECRET` lines (S3 client keys, link keys) is read and explained.
pub(crate) struct KeyFile {
    /// What a line holds, with its article: "a `KEY_ID SECRET`".
    pub(crate) pair: &'static str,
    /// The fix for a bad line or an empty file.
    pub(crate) fix: &'static str,
    /// The fix for a file that cannot be read.
    pub(crate) unreadable_fix: &'static str,
    /// What is wrong with a pair beyond its shape, if anything.
    pub(crate) check: fn(&str, &str) -> Option<String>,
}

impl KeyFile {
    /// The pairs of `file` in file order, blank lines and `#` comments skipped: at least one,
    /// each id once. Problems name the line, never its text (it holds a secret).
    pub(crate) fn read(&self, file: &str) -> Result<Vec<(String, Secret)>, Problem> {
        let text = read_text(file).or_else(|problem| wrong(problem, self.unreadable_fix))?;
        let mut pairs: Vec<(String, Secret)> = Vec::new();
        let lines = text.lines().enumerate();
        for (number, line) in
            lines.filter(|(_, l)| !l.trim().is_empty() && !l.trim().starts_with('#'))
        {
            let mut words = line.split_whitespace();
            let problem = match (words.next(), words.next(), words.next()) {
                (Some(id), Some(secret), None) => (self.check)(id, secret).or_else(|| {
                    if pairs.iter().any(|(known, _)| known == id) {
                        return Some("repeats a key id".to_owned());
                    }
                    pairs.push((id.to_owned(), Secret::new(secret.to_owned())));
                    None
                }),
                _ => Some(format!("is not {} pair", self.pair)),
            };
            if let Some(problem) = problem {
                return wrong(format!("line {} of {file:?} {problem}", number + 1), self.fix);
            }
        }
        if pairs.is_empty() {
            wrong(format!("{file:?} holds no keys"), self.fix)
        } else {
            Ok(pairs)
        }
    }
}

/// The admin API's bearer token. Never printed: `Debug` redacts it and there is no `Display`.
#[derive(Clone, Debug)]
pub struct AdminToken {
    env_var: String,
    token: Secret,
}

impl AdminToken {
    pub(crate) fn new(env_var: String, token: Secret) -> Self {
        Self { env_var, token }
    }

    /// The environment variable the token was read from (a name, safe to log).
    pub fn env_var(&self) -> &str {
        &self.env_var
    }

    /// Whether `presented` is the token. Every byte is compared whatever the mismatches, so the
    /// time taken reveals the token's length at most, never its content.
    pub fn verify(&self, presented: &[u8]) -> bool {
        let expected = self.token.expose().as_bytes();
        presented.len() == expected.len()
            && expected.iter().zip(presented).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }
}
