//! Secrets the config names but never holds: read at load time from the environment variable a
//! `*_env` key names, from key files (`ID SECRET` lines) or from an AWS credentials file, and
//! never printed.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path as FilePath;

use ::config::Value;
use zeroize::Zeroizing;

use super::check::{Ctx, Problem, read_text, wrong};
use super::source::Path;

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

/// An access key, read once at load time. The key id is no secret in AWS's terms, but it names
/// an account: it is kept out of logs all the same.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Credentials {
    pub access_key_id: Secret,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
    /// Where the key came from, for logs: `environment variables RANGEWAY_S3_KEY_ID/…`,
    /// `/root/.aws/credentials [default]`.
    pub source: String,
}

/// The keys S3 clients must sign with on a route (`s3_client_keys_file`): access key id → secret.
/// `Debug` shows how many there are only.
#[derive(Clone, PartialEq, Eq)]
pub struct S3ClientKeys {
    keys: BTreeMap<String, Secret>,
}

impl S3ClientKeys {
    /// The keys `(access key id, secret)`, for tests.
    #[cfg(test)]
    pub(crate) fn of(pairs: &[(&str, &str)]) -> Self {
        let keys =
            pairs.iter().map(|(id, secret)| ((*id).to_owned(), Secret::new((*secret).to_owned())));
        Self { keys: keys.collect() }
    }

    /// The secret of `access_key_id`, if the route admits it.
    pub fn secret(&self, access_key_id: &str) -> Option<&Secret> {
        self.keys.get(access_key_id)
    }
}

impl fmt::Debug for S3ClientKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3ClientKeys").field("keys", &self.keys.len()).finish()
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
    Some(S3ClientKeys { keys: keys.into_iter().collect() })
}

pub(super) fn printable(value: &str) -> bool {
    value.bytes().all(|b| b.is_ascii_graphic())
}

/// The AWS SDKs' own sources, in their order: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`
/// (`AWS_SESSION_TOKEN`), then the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
/// `~/.aws/credentials`) at `profile`, else `AWS_PROFILE`, else `default`.
pub(super) fn standard_credentials(
    v: &Ctx<'_>,
    profile: Option<String>,
) -> Result<S3Credentials, Problem> {
    let var = |name: &str| {
        v.env.get(name).and_then(|v| v.to_str()).filter(|v| !v.is_empty()).map(str::to_owned)
    };
    if let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        if !printable(&id) || !printable(&secret) {
            return wrong(
                "AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY holds spaces or control characters",
                "set them to the key without spaces or newlines",
            );
        }
        return Ok(S3Credentials {
            access_key_id: Secret::new(id),
            secret_access_key: Secret::new(secret),
            session_token: var("AWS_SESSION_TOKEN").map(Secret::new),
            source: "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY".to_owned(),
        });
    }
    let file = match (var("AWS_SHARED_CREDENTIALS_FILE"), var("HOME")) {
        (Some(file), _) => Some(std::path::PathBuf::from(file)),
        (None, Some(home)) => Some(std::path::PathBuf::from(home).join(".aws/credentials")),
        (None, None) => None,
    };
    match file.filter(|file| file.exists()) {
        Some(file) => {
            let profile = profile.or_else(|| var("AWS_PROFILE"));
            read_credentials_file(&file, profile.as_deref().unwrap_or("default"))
        }
        None => wrong(
            "has no credentials",
            "give the upstream credentials: access_key_env and secret_key_env naming the \
             variables that hold them, credentials_file, the AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY variables, or anonymous = true for a public bucket",
        ),
    }
}

/// Reads `[profile]` of an AWS shared credentials file (INI: `key = value`, `#`/`;` comments).
/// Problems name the file, the profile and the key, never a value.
pub(super) fn read_credentials_file(
    file: &FilePath,
    profile: &str,
) -> Result<S3Credentials, Problem> {
    let shown = file.display();
    let fix = "point credentials_file at a readable AWS credentials file";
    let text = read_text(&file.to_string_lossy()).or_else(|problem| wrong(problem, fix))?;
    let (mut in_profile, mut found_profile) = (false, false);
    let mut values: BTreeMap<&str, String> = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
    {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = name.trim() == profile;
            found_profile |= in_profile;
        } else if let Some((key, value)) = line.split_once('=').filter(|_| in_profile) {
            match value.trim() {
                "" => values.remove(key.trim()),
                value => values.insert(key.trim(), value.to_owned()),
            };
        }
    }
    if !found_profile {
        let fix = "add the profile to the file, or name an existing one with profile = \"…\"";
        return wrong(format!("{shown} has no profile [{profile}]"), fix);
    }
    let mut take = |key: &str| {
        let missing = || {
            (format!("{shown} [{profile}] has no {key}"), format!("add {key} = … to [{profile}]"))
        };
        values.remove(key).ok_or_else(missing)
    };
    let (id, secret) = (take("aws_access_key_id")?, take("aws_secret_access_key")?);
    if !printable(&id) || !printable(&secret) {
        return wrong(
            format!("{shown} [{profile}] has a key with spaces or control characters"),
            "write the key id and secret without spaces or quotes",
        );
    }
    Ok(S3Credentials {
        access_key_id: Secret::new(id),
        secret_access_key: Secret::new(secret),
        session_token: take("aws_session_token").ok().map(Secret::new),
        source: format!("{shown} [{profile}]"),
    })
}
