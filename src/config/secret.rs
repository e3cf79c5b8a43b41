//! Secrets the config names by environment variable (`*_env` keys): read at load time, never
//! printed.

use std::fmt;

use zeroize::Zeroizing;

use super::read::{Ctx, Field, Read};

/// A secret value: `Debug` redacts it, there is no `Display`, and its memory is zeroed on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub(super) fn new(value: String) -> Self {
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

/// How to explain a `*_env` key's problems.
pub(super) struct SecretKey<'s> {
    /// The key as it would be written, e.g. `admin_token_env = "RANGEWAY_ADMIN_TOKEN"`.
    pub(super) example: &'s str,
    /// What the variable holds: "the token".
    pub(super) holds: &'s str,
    /// Where a value can come from, shown in the fix: " (e.g. from `openssl rand -hex 32`)".
    pub(super) source_hint: &'s str,
    /// The way out that does without the variable: "or remove admin_token_env to …".
    pub(super) otherwise: &'s str,
}

/// Reads the environment variable named by `field`: its name and value. The value must be
/// printable ASCII without spaces — what tokens and keys are, and what a header can carry — so a
/// trailing newline from a secrets file is caught here rather than failing every request.
///
/// The value is never echoed: a user who pasted the secret itself into the key must not see it in
/// logs.
pub(super) fn read_env(
    ctx: &mut Ctx<'_>,
    field: Field,
    key: &SecretKey<'_>,
) -> Read<(String, Secret)> {
    let path = field.path.clone();
    let origin = field.origin().clone();
    let quoted_example = key.example.split_once(" = ").map_or(key.example, |(_, value)| value);
    let name = field.string(ctx, quoted_example)?;
    let is_var_name = name.bytes().next().is_some_and(|b| !b.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !is_var_name {
        return Err(ctx.report(
            &path,
            &origin,
            format!(
                "is not an environment variable name (it must hold the variable's name, not {})",
                key.holds
            ),
            format!(
                "put {} in an environment variable and name it here, e.g. {}",
                key.holds, key.example
            ),
        ));
    }
    // Naming the variable helps, but only when the name looks like one: a secret made only of
    // letters, digits and '_' would pass the check above, and is far less likely to be in
    // SCREAMING_CASE.
    let screaming = name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    let var = if screaming {
        format!("environment variable {name}")
    } else {
        "the environment variable it names".to_owned()
    };
    let export = format!(
        "export {} with {}{} before starting rangeway, {}",
        if screaming { name.as_str() } else { "it" },
        key.holds,
        key.source_hint,
        key.otherwise
    );
    let Some(value) = ctx.env.get(&name) else {
        return Err(ctx.report(&path, &origin, format!("{var} is not set"), export));
    };
    let Some(value) = value.to_str() else {
        return Err(ctx.report(&path, &origin, format!("{var} is not UTF-8"), export));
    };
    if value.is_empty() {
        return Err(ctx.report(&path, &origin, format!("{var} is empty"), export));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ctx.report(
            &path,
            &origin,
            format!("{var} holds spaces, control characters or non-ASCII text"),
            "set it to printable ASCII without spaces or newlines (e.g. hex or base64url)",
        ));
    }
    let secret = Secret::new(value.to_owned());
    Ok((name, secret))
}
