//! Secrets the config names but never holds: read at load time from the environment variable a
//! `*_env` key names or from key files (`ID SECRET` lines), and never printed.

use ::config::Value;

use super::check::{Ctx, wrong};
use super::source::Path;
use crate::s3::credentials::S3ClientKeys;
use crate::values::secret::{Secret, printable};
use crate::values::small_file::read_text;

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

/// How one kind of key file is read and explained.
pub(super) struct KeyFile {
    /// The file key's example value, e.g. `"/etc/rangeway/link-keys"`.
    pub(super) example: &'static str,
    /// What a line holds, with its article: "a `KEY_ID SECRET`".
    pub(super) pair: &'static str,
    /// The fix for a bad line or an empty file.
    pub(super) fix: &'static str,
    /// The fix for a file that cannot be read.
    pub(super) unreadable_fix: &'static str,
    /// What is wrong with a pair beyond its shape, if anything.
    pub(super) check: fn(&str, &str) -> Option<String>,
}

/// A file of `ID SECRET` lines (`s3_client_keys_file`, `[routes.signed_links] keys_file`): blank
/// lines and `#` comments skipped. Its pairs in file order: at least one, each id once. Problems
/// name the line, never its text (it holds a secret).
pub(super) fn read_key_file(
    v: &mut Ctx<'_>,
    at: &Path,
    value: &Value,
    kind: &KeyFile,
) -> Option<Vec<(String, Secret)>> {
    let file = v.string(at, value, kind.example).ok()?;
    let pairs = read_text(&file).or_else(|problem| wrong(problem, kind.unreadable_fix));
    let pairs = pairs.and_then(|text| {
        let mut pairs: Vec<(String, Secret)> = Vec::new();
        let lines = text.lines().enumerate();
        for (number, line) in
            lines.filter(|(_, l)| !l.trim().is_empty() && !l.trim().starts_with('#'))
        {
            let mut words = line.split_whitespace();
            let problem = match (words.next(), words.next(), words.next()) {
                (Some(id), Some(secret), None) => (kind.check)(id, secret).or_else(|| {
                    if pairs.iter().any(|(known, _)| known == id) {
                        return Some("repeats a key id".to_owned());
                    }
                    pairs.push((id.to_owned(), Secret::new(secret.to_owned())));
                    None
                }),
                _ => Some(format!("is not {} pair", kind.pair)),
            };
            if let Some(problem) = problem {
                return wrong(format!("line {} of {file:?} {problem}", number + 1), kind.fix);
            }
        }
        if pairs.is_empty() {
            wrong(format!("{file:?} holds no keys"), kind.fix)
        } else {
            Ok(pairs)
        }
    });
    v.check(at, pairs)
}

/// `s3_client_keys_file`: one `ACCESS_KEY_ID SECRET` pair per line.
pub(super) fn read_client_keys(v: &mut Ctx<'_>, at: &Path, value: &Value) -> Option<S3ClientKeys> {
    let kind = KeyFile {
        example: "\"/etc/rangeway/s3-clients\"",
        pair: "an `ACCESS_KEY_ID SECRET`",
        fix: "write one `ACCESS_KEY_ID SECRET` pair per line (generate them, e.g. with \
              `openssl rand -hex 10` and `openssl rand -base64 30`)",
        unreadable_fix: "point s3_client_keys_file at a readable file of client keys",
        check: |id, secret| {
            (!printable(id) || !printable(secret))
                .then(|| "is not an `ACCESS_KEY_ID SECRET` pair".to_owned())
        },
    };
    let keys = read_key_file(v, at, value, &kind)?;
    Some(S3ClientKeys::new(keys))
}
