//! The keys S3 requests are signed with and checked against: an upstream's credentials, from the
//! sources the AWS SDKs read in their order, and the keys S3 clients of a route sign with.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::values::secret::{KeyFile, Secret, printable};
use crate::values::small_file::read_text;
use crate::values::{Problem, wrong};

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
    pub(crate) fn new(keys: impl IntoIterator<Item = (String, Secret)>) -> Self {
        Self { keys: keys.into_iter().collect() }
    }

    /// The keys of an `s3_client_keys_file`: one `ACCESS_KEY_ID SECRET` pair per line.
    pub(crate) fn read_file(file: &str) -> Result<Self, Problem> {
        let kind = KeyFile {
            pair: "an `ACCESS_KEY_ID SECRET`",
            fix: "write one `ACCESS_KEY_ID SECRET` pair per line (generate them, e.g. with \
                  `openssl rand -hex 10` and `openssl rand -base64 30`)",
            unreadable_fix: "point s3_client_keys_file at a readable file of client keys",
            check: |id, secret| {
                (!printable(id) || !printable(secret))
                    .then(|| "is not an `ACCESS_KEY_ID SECRET` pair".to_owned())
            },
        };
        kind.read(file).map(Self::new)
    }

    /// The keys `(access key id, secret)`, for tests.
    #[cfg(test)]
    pub(crate) fn of(pairs: &[(&str, &str)]) -> Self {
        Self::new(
            pairs.iter().map(|(id, secret)| ((*id).to_owned(), Secret::new((*secret).to_owned()))),
        )
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

/// The AWS SDKs' own sources, in their order: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`
/// (`AWS_SESSION_TOKEN`), then the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
/// `~/.aws/credentials`) at `profile`, else `AWS_PROFILE`, else `default`. `env` looks a variable
/// up, so that the config's snapshot of the environment is the one read.
pub(crate) fn standard_credentials(
    env: impl Fn(&str) -> Option<String>,
    profile: Option<String>,
) -> Result<S3Credentials, Problem> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
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
        (Some(file), _) => Some(PathBuf::from(file)),
        (None, Some(home)) => Some(PathBuf::from(home).join(".aws/credentials")),
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
pub(crate) fn read_credentials_file(file: &Path, profile: &str) -> Result<S3Credentials, Problem> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_files() {
        let dir = std::env::temp_dir().join(format!("rangeway-creds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("credentials");
        std::fs::write(
            &file,
            "# comment\n[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = \
             sekrit/default\n\n[ci]\naws_access_key_id=AKIDCI\naws_secret_access_key=sekrit-ci\n\
             aws_session_token = tok\n[half]\naws_access_key_id = AKIDHALF\n",
        )
        .expect("write");
        let creds = read_credentials_file(&file, "default").expect("default");
        assert_eq!(creds.access_key_id.expose(), "AKIDDEFAULT");
        assert_eq!(creds.secret_access_key.expose(), "sekrit/default");
        assert!(creds.session_token.is_none());
        let creds = read_credentials_file(&file, "ci").expect("ci");
        assert_eq!(creds.secret_access_key.expose(), "sekrit-ci");
        assert_eq!(creds.session_token.as_ref().map(Secret::expose), Some("tok"));
        assert!(!format!("{creds:?}").contains("sekrit"));

        let (problem, _) = read_credentials_file(&file, "nope").expect_err("no profile");
        assert!(problem.contains("has no profile [nope]"), "{problem}");
        let (problem, _) = read_credentials_file(&file, "half").expect_err("half");
        assert!(problem.contains("has no aws_secret_access_key"), "{problem}");
        assert!(!problem.contains("AKIDHALF"));
        let (problem, _) =
            read_credentials_file(&dir.join("missing"), "default").expect_err("missing");
        assert!(problem.contains("does not exist"), "{problem}");
        // A device or a FIFO would never end, or never begin: refused before it is opened.
        let (problem, _) =
            read_credentials_file(Path::new("/dev/zero"), "default").expect_err("a device");
        assert!(problem.contains("is not a regular file"), "{problem}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
