//! `[upstreams.NAME]` with `bucket = …`: an S3-compatible object store, whose requests rangeway
//! signs itself (AWS Signature V4).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::keyfile::KeyFile;
use super::read::{Ctx, Field, Read, read_text};
use super::secret::{self, Secret, SecretKey};
use super::upstream::HttpUpstream;

const DEFAULT_REGION: &str = "us-east-1";
/// An S3-compatible origin.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Upstream {
    /// The service endpoint (`url`), without a path.
    pub endpoint: HttpUpstream,
    /// `bucket`: 3 to 63 of `a-z 0-9 . -`, beginning and ending with a letter or digit (S3's
    /// naming rules; `_` and capitals too for path-style addressing, as older buckets and
    /// S3-compatible stores allow them).
    pub bucket: String,
    /// `region`, the signing region. Default `us-east-1`.
    pub region: String,
    pub addressing: Addressing,
    /// `key_prefix`: the folder of the bucket the routes serve, as segments (`"builds/2026"` →
    /// `["builds", "2026"]`); empty for the whole bucket.
    pub key_prefix: Vec<String>,
    /// `None` for `anonymous = true`: requests go unsigned (public buckets).
    pub credentials: Option<S3Credentials>,
}

/// Where the bucket goes in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressing {
    /// `https://endpoint/bucket/key`: the default, and what S3-compatible stores expect.
    Path,
    /// `https://bucket.endpoint/key`: AWS's own default.
    VirtualHost,
}

/// An access key, read once at load time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct S3Credentials {
    /// The key id is no secret in AWS's terms, but it names an account: it is kept out of logs
    /// all the same.
    pub access_key_id: Secret,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
    /// Where the key came from, for logs: `environment variables RANGEWAY_S3_KEY_ID/…`,
    /// `/root/.aws/credentials [default]`.
    pub source: String,
}

/// The keys S3 clients must sign with on a route (`s3_client_keys_file`): access key id → secret.
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

/// Ids only: the ids name clients, the secrets are secret.
impl std::fmt::Debug for S3ClientKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3ClientKeys").field("keys", &self.keys.len()).finish()
    }
}

/// Reads `s3_client_keys_file`: one `ACCESS_KEY_ID SECRET` pair per line.
pub(super) fn read_client_keys(ctx: &mut Ctx<'_>, field: Field) -> Read<S3ClientKeys> {
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
    let keys = super::keyfile::read(ctx, field, &kind)?;
    Ok(S3ClientKeys { keys: keys.into_iter().collect() })
}

/// The keys of an S3 upstream, taken out of its table before they are read.
pub(super) struct S3Fields {
    pub(super) bucket: Option<Field>,
    pub(super) region: Option<Field>,
    pub(super) addressing: Option<Field>,
    pub(super) key_prefix: Option<Field>,
    pub(super) access_key_env: Option<Field>,
    pub(super) secret_key_env: Option<Field>,
    pub(super) session_token_env: Option<Field>,
    pub(super) credentials_file: Option<Field>,
    pub(super) profile: Option<Field>,
    pub(super) anonymous: Option<Field>,
}

impl S3Fields {
    pub(super) fn take(table: &mut super::read::Table) -> Self {
        Self {
            bucket: table.take("bucket"),
            region: table.take("region"),
            addressing: table.take("addressing"),
            key_prefix: table.take("key_prefix"),
            access_key_env: table.take("access_key_env"),
            secret_key_env: table.take("secret_key_env"),
            session_token_env: table.take("session_token_env"),
            credentials_file: table.take("credentials_file"),
            profile: table.take("profile"),
            anonymous: table.take("anonymous"),
        }
    }

    /// Reports every S3 key of an upstream that is not one (no `bucket`).
    pub(super) fn refuse(self, ctx: &mut Ctx<'_>) {
        // Taken apart field by field, so that a key added to the struct cannot be left out here.
        let Self {
            bucket: _,
            region,
            addressing,
            key_prefix,
            access_key_env,
            secret_key_env,
            session_token_env,
            credentials_file,
            profile,
            anonymous,
        } = self;
        for field in [
            region,
            addressing,
            key_prefix,
            access_key_env,
            secret_key_env,
            session_token_env,
            credentials_file,
            profile,
            anonymous,
        ]
        .into_iter()
        .flatten()
        {
            ctx.report(
                &field.path,
                field.origin(),
                format!("{} applies to S3 upstreams only", field.key),
                "add bucket = \"NAME\" (with url = the S3 endpoint) to make this an S3 upstream, \
                 or remove it",
            );
        }
    }
}

/// Reads an S3 upstream: `endpoint` is its `url`, already read; `path` is `upstreams.NAME`.
pub(super) fn read(
    ctx: &mut Ctx<'_>,
    path: &str,
    endpoint: Read<HttpUpstream>,
    url: Option<&Field>,
    fields: S3Fields,
    host_header: Option<Field>,
) -> Read<S3Upstream> {
    let S3Fields {
        bucket,
        region,
        addressing,
        key_prefix,
        access_key_env,
        secret_key_env,
        session_token_env,
        credentials_file,
        profile,
        anonymous,
    } = fields;
    if let Some(field) = host_header {
        ctx.report(
            &field.path,
            field.origin(),
            "host_header does not apply to S3 upstreams",
            "remove it: rangeway sets Host from the url, the bucket and addressing (and signs it)",
        );
    }
    let addressing = addressing.map_or(Ok(Addressing::Path), |f| read_addressing(ctx, f));
    let bucket = match bucket {
        Some(field) => read_bucket(ctx, field, addressing.as_ref().ok().copied()),
        None => Err(ctx.report_at(path, "has no bucket", "add bucket = \"NAME\"")),
    };
    let region = region.map_or(Ok(DEFAULT_REGION.to_owned()), |f| read_region(ctx, f));
    let key_prefix = key_prefix.map_or(Ok(Vec::new()), |f| read_key_prefix(ctx, f));
    let anonymous = anonymous.map_or(Ok(false), |f| f.boolean(ctx));
    let credentials = match anonymous {
        Ok(true) => {
            for field in
                [access_key_env, secret_key_env, session_token_env, credentials_file, profile]
                    .into_iter()
                    .flatten()
            {
                ctx.report(
                    &field.path,
                    field.origin(),
                    format!("{} cannot be combined with anonymous = true", field.key),
                    "remove it, or anonymous = true to sign requests with it",
                );
            }
            Ok(None)
        }
        Ok(false) => read_credentials(
            ctx,
            path,
            [access_key_env, secret_key_env, session_token_env],
            credentials_file,
            profile,
        )
        .map(Some),
        Err(reported) => Err(reported),
    };
    let endpoint = endpoint?;
    if !endpoint.base_path.is_empty()
        && let Some(url) = url
    {
        return Err(ctx.report(
            &url.path,
            url.origin(),
            "an S3 endpoint url has no path",
            "write the endpoint alone (\"https://s3.example.com\"), the bucket in bucket = and \
             a folder of it in key_prefix =",
        ));
    }
    let addressing = addressing?;
    if addressing == Addressing::VirtualHost && !endpoint_is_name(&endpoint) {
        let field = url.map_or(path.to_owned(), |u| u.path.clone());
        return Err(ctx.report_at(
            &field,
            "virtual-host addressing needs a DNS name in the url, not an IP address",
            "use addressing = \"path\", or the endpoint's DNS name",
        ));
    }
    Ok(S3Upstream {
        endpoint,
        bucket: bucket?,
        region: region?,
        addressing,
        key_prefix: key_prefix?,
        credentials: credentials?,
    })
}

fn endpoint_is_name(endpoint: &HttpUpstream) -> bool {
    endpoint.host.parse::<std::net::IpAddr>().is_err()
}

fn read_addressing(ctx: &mut Ctx<'_>, field: Field) -> Read<Addressing> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    match field.string(ctx, "\"path\"")?.as_str() {
        "path" => Ok(Addressing::Path),
        "virtual-host" => Ok(Addressing::VirtualHost),
        other => Err(ctx.report(
            &path,
            &origin,
            format!("{other:?} is not an addressing style"),
            "use \"path\" (https://endpoint/bucket/key) or \"virtual-host\" \
             (https://bucket.endpoint/key)",
        )),
    }
}

fn read_bucket(ctx: &mut Ctx<'_>, field: Field, addressing: Option<Addressing>) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let bucket = field.string(ctx, "\"releases\"")?;
    let dns_safe = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-';
    let path_safe = |b: u8| dns_safe(b) || b.is_ascii_uppercase() || b == b'_';
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    let allowed: &dyn Fn(u8) -> bool =
        if addressing == Some(Addressing::VirtualHost) { &dns_safe } else { &path_safe };
    let valid = (3..=63).contains(&bucket.len())
        && bucket.bytes().all(allowed)
        && edge_ok(bucket.as_bytes().first())
        && edge_ok(bucket.as_bytes().last())
        && !bucket.contains("..");
    if valid {
        return Ok(bucket);
    }
    let rule = if addressing == Some(Addressing::VirtualHost) {
        "3 to 63 lower-case letters, digits, '.' and '-', beginning and ending with a letter or \
         digit (it becomes part of a host name)"
    } else {
        "3 to 63 letters, digits, '.', '-' and '_', beginning and ending with a letter or digit"
    };
    Err(ctx.report(
        &path,
        &origin,
        format!("{bucket:?} is not a valid bucket name"),
        format!("write the bucket's name: {rule}"),
    ))
}

fn read_region(ctx: &mut Ctx<'_>, field: Field) -> Read<String> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let region = field.string(ctx, "\"us-east-1\"")?;
    let valid = !region.is_empty()
        && region.len() <= 64
        && region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid {
        return Ok(region);
    }
    Err(ctx.report(
        &path,
        &origin,
        format!("{region:?} is not a region name"),
        "write the region the bucket is in, e.g. region = \"eu-west-1\" (most S3-compatible \
         stores accept \"us-east-1\")",
    ))
}

/// A folder of the bucket: segments without `.`/`..`, empty parts or control characters, so
/// that no key can be written above it.
fn read_key_prefix(ctx: &mut Ctx<'_>, field: Field) -> Read<Vec<String>> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let prefix = field.string(ctx, "\"builds/2026\"")?;
    let segments: Vec<String> =
        prefix.trim_matches('/').split('/').filter(|s| !s.is_empty()).map(str::to_owned).collect();
    let problem = if prefix.trim_matches('/').contains("//") {
        Some("has an empty segment (//)")
    } else if segments.iter().any(|s| s == "." || s == "..") {
        Some("has a '.' or '..' segment")
    } else if prefix.chars().any(|c| c.is_control() || c == '\\') {
        Some("has a control character or a backslash")
    } else {
        None
    };
    match problem {
        None => Ok(segments),
        Some(problem) => Err(ctx.report(
            &path,
            &origin,
            problem,
            "write the folder's key prefix as plain segments, e.g. key_prefix = \"builds/2026\"",
        )),
    }
}

/// Credentials, by the first source configured: `access_key_env`/`secret_key_env`, then
/// `credentials_file`, then the standard AWS environment variables, then the standard shared
/// credentials file.
fn read_credentials(
    ctx: &mut Ctx<'_>,
    path: &str,
    [access_key_env, secret_key_env, session_token_env]: [Option<Field>; 3],
    credentials_file: Option<Field>,
    profile: Option<Field>,
) -> Read<S3Credentials> {
    const OTHERWISE: &str = "or use credentials_file, or anonymous = true for a public bucket";
    match (access_key_env, secret_key_env) {
        (Some(access), Some(secret)) => {
            if let Some(field) = credentials_file {
                ctx.report(
                    &field.path,
                    field.origin(),
                    "credentials_file cannot be combined with access_key_env/secret_key_env",
                    "keep one source of credentials",
                );
            }
            if let Some(field) = &profile {
                ctx.report(
                    &field.path,
                    field.origin(),
                    "profile names a section of a credentials file, and these credentials come \
                     from environment variables",
                    "remove profile, or use credentials_file instead of access_key_env/\
                     secret_key_env",
                );
            }
            let access = secret::read_env(
                ctx,
                access,
                &SecretKey {
                    example: "access_key_env = \"RANGEWAY_S3_ACCESS_KEY_ID\"",
                    holds: "the access key id",
                    source_hint: "",
                    otherwise: OTHERWISE,
                },
            );
            let secret = secret::read_env(
                ctx,
                secret,
                &SecretKey {
                    example: "secret_key_env = \"RANGEWAY_S3_SECRET_ACCESS_KEY\"",
                    holds: "the secret access key",
                    source_hint: "",
                    otherwise: OTHERWISE,
                },
            );
            let token = session_token_env
                .map(|field| {
                    secret::read_env(
                        ctx,
                        field,
                        &SecretKey {
                            example: "session_token_env = \"RANGEWAY_S3_SESSION_TOKEN\"",
                            holds: "the session token",
                            source_hint: "",
                            otherwise: "or remove session_token_env for a long-term key",
                        },
                    )
                })
                .transpose();
            let (access_var, access_key_id) = access?;
            let (secret_var, secret_access_key) = secret?;
            Ok(S3Credentials {
                access_key_id,
                secret_access_key,
                session_token: token?.map(|(_, token)| token),
                source: format!("environment variables {access_var}/{secret_var}"),
            })
        }
        (Some(one), None) | (None, Some(one)) => Err(ctx.report(
            &one.path,
            one.origin(),
            "access_key_env and secret_key_env go together",
            "set both, naming the variables that hold the key id and the secret",
        )),
        (None, None) => {
            if let Some(field) = session_token_env {
                ctx.report(
                    &field.path,
                    field.origin(),
                    "session_token_env needs access_key_env and secret_key_env",
                    "set them too, or remove it",
                );
            }
            match credentials_file {
                Some(field) => {
                    let (file_path, origin) = (field.path.clone(), field.origin().clone());
                    let file = field.string(ctx, "\"/etc/rangeway/aws-credentials\"")?;
                    let profile = read_profile(ctx, profile)?.unwrap_or_else(|| "default".into());
                    read_credentials_file(&PathBuf::from(file), &profile)
                        .map_err(|(problem, fix)| ctx.report(&file_path, &origin, problem, fix))
                }
                None => {
                    let profile = read_profile(ctx, profile)?;
                    standard_credentials(ctx, profile)
                }
                .map_err(|(problem, fix)| ctx.report_at(path, problem, fix)),
            }
        }
    }
}

fn read_profile(ctx: &mut Ctx<'_>, profile: Option<Field>) -> Read<Option<String>> {
    profile.map(|field| field.string(ctx, "\"default\"")).transpose()
}

/// The AWS SDKs' own sources, in their order: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`
/// (`AWS_SESSION_TOKEN`), then the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
/// `~/.aws/credentials`) at `profile`, else `AWS_PROFILE`, else `default`.
fn standard_credentials(
    ctx: &Ctx<'_>,
    profile: Option<String>,
) -> Result<S3Credentials, (String, String)> {
    let var = |name: &str| {
        ctx.env.get(name).and_then(|v| v.to_str()).filter(|v| !v.is_empty()).map(str::to_owned)
    };
    const FIX: &str = "give the upstream credentials: access_key_env and secret_key_env naming \
                       the variables that hold them, credentials_file, the AWS_ACCESS_KEY_ID and \
                       AWS_SECRET_ACCESS_KEY variables, or anonymous = true for a public bucket";
    if let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        if !printable(&id) || !printable(&secret) {
            return Err((
                "AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY holds spaces or control characters"
                    .to_owned(),
                "set them to the key without spaces or newlines".to_owned(),
            ));
        }
        return Ok(S3Credentials {
            access_key_id: Secret::new(id),
            secret_access_key: Secret::new(secret),
            session_token: var("AWS_SESSION_TOKEN").map(Secret::new),
            source: "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY".to_owned(),
        });
    }
    let file = match (var("AWS_SHARED_CREDENTIALS_FILE"), var("HOME")) {
        (Some(file), _) => PathBuf::from(file),
        (None, Some(home)) => PathBuf::from(home).join(".aws/credentials"),
        (None, None) => return Err(("has no credentials".to_owned(), FIX.to_owned())),
    };
    if !file.exists() {
        return Err(("has no credentials".to_owned(), FIX.to_owned()));
    }
    let profile = profile.or_else(|| var("AWS_PROFILE")).unwrap_or_else(|| "default".into());
    read_credentials_file(&file, &profile)
}

fn printable(value: &str) -> bool {
    value.bytes().all(|b| b.is_ascii_graphic())
}

/// Reads `[profile]` of an AWS shared credentials file (INI: `key = value`, `#`/`;` comments).
/// Problems name the file, the profile and the key, never a value.
fn read_credentials_file(
    file: &std::path::Path,
    profile: &str,
) -> Result<S3Credentials, (String, String)> {
    let shown = file.display();
    let fix = "point credentials_file at a readable AWS credentials file";
    let text = read_text(&file.to_string_lossy()).map_err(|problem| (problem, fix.to_owned()))?;
    let mut in_profile = false;
    let mut found_profile = false;
    let (mut id, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = name.trim() == profile;
            found_profile |= in_profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let value = value.trim().to_owned();
        match key.trim() {
            "aws_access_key_id" => id = Some(value),
            "aws_secret_access_key" => secret = Some(value),
            "aws_session_token" => token = Some(value),
            _ => {}
        }
    }
    if !found_profile {
        return Err((
            format!("{shown} has no profile [{profile}]"),
            "add the profile to the file, or name an existing one with profile = \"…\"".to_owned(),
        ));
    }
    let missing = |key: &str| {
        (format!("{shown} [{profile}] has no {key}"), format!("add {key} = … to [{profile}]"))
    };
    let id = id.filter(|v| !v.is_empty()).ok_or_else(|| missing("aws_access_key_id"))?;
    let secret =
        secret.filter(|v| !v.is_empty()).ok_or_else(|| missing("aws_secret_access_key"))?;
    if !printable(&id) || !printable(&secret) {
        return Err((
            format!("{shown} [{profile}] has a key with spaces or control characters"),
            "write the key id and secret without spaces or quotes".to_owned(),
        ));
    }
    Ok(S3Credentials {
        access_key_id: Secret::new(id),
        secret_access_key: Secret::new(secret),
        session_token: token.filter(|t| !t.is_empty()).map(Secret::new),
        source: format!("{shown} [{profile}]"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
