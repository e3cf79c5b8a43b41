//! Secrets read at load time (tokens, keys): held so that they cannot be printed by mistake.

use std::fmt;

use zeroize::Zeroizing;

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
