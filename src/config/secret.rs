//! Secrets the config names but never holds: read at load time from the environment variable a
//! `*_env` key names, and never printed.

use ::config::Value;

use super::check::Ctx;
use super::source::Path;
use crate::values::secret::{Secret, printable};

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

/// Reads the environment variable named by the value at `at`: its name and value. The value must
/// be printable ASCII without spaces — what tokens and keys are, and what a header can carry — so
/// a trailing newline from a secrets file is caught here rather than failing every request.
///
/// The value is never echoed: a user who pasted the secret itself into the key must not see it in
/// logs.
pub(super) fn read_env(
    v: &mut Ctx<'_>,
    at: &Path,
    value: &Value,
    key: &SecretKey<'_>,
) -> Option<(String, Secret)> {
    let quoted_example = key.example.split_once(" = ").map_or(key.example, |(_, value)| value);
    let name = v.string(at, value, quoted_example).ok()?;
    let holds = key.holds;
    if name.bytes().next().is_none_or(|b| b.is_ascii_digit())
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return v.fail(
            at,
            format!("is not an environment variable name (it must hold the variable's name, not {holds})"),
            format!("put {holds} in an environment variable and name it here, e.g. {}", key.example),
        );
    }
    // Naming the variable helps, but only when the name looks like one: a secret made only of
    // letters, digits and '_' would pass the check above, and is far less likely to be in
    // SCREAMING_CASE.
    let screaming = name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    let var = match screaming {
        true => format!("environment variable {name}"),
        false => "the environment variable it names".to_owned(),
    };
    let problem = match v.env.get(&name).map(|value| value.to_str()) {
        None => format!("{var} is not set"),
        Some(None) => format!("{var} is not UTF-8"),
        Some(Some("")) => format!("{var} is empty"),
        Some(Some(value)) if printable(value) => {
            return Some((name, Secret::new(value.to_owned())));
        }
        Some(Some(_)) => {
            return v.fail(
                at,
                format!("{var} holds spaces, control characters or non-ASCII text"),
                "set it to printable ASCII without spaces or newlines (e.g. hex or base64url)",
            );
        }
    };
    let exported = if screaming { name.as_str() } else { "it" };
    let (hint, otherwise) = (key.source_hint, key.otherwise);
    v.fail(
        at,
        problem,
        format!("export {exported} with {holds}{hint} before starting rangeway, {otherwise}"),
    )
}
