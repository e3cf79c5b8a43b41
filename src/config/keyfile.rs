//! Files of `ID SECRET` lines (`s3_client_keys_file`, `[routes.signed_links] keys_file`): blank
//! lines and `#` comments skipped; problems name the line, never its text (it holds a secret).

use super::read::{Ctx, Field, Read, read_text};
use super::secret::Secret;

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

/// The file's pairs in file order: at least one, each id once.
pub(super) fn read(ctx: &mut Ctx<'_>, field: Field, kind: &KeyFile) -> Read<Vec<(String, Secret)>> {
    let (path, origin) = (field.path.clone(), field.origin().clone());
    let file = field.string(ctx, kind.example)?;
    let text = match read_text(&file) {
        Ok(text) => text,
        Err(problem) => return Err(ctx.report(&path, &origin, problem, kind.unreadable_fix)),
    };
    let mut pairs: Vec<(String, Secret)> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
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
            let problem = format!("line {} of {file:?} {problem}", number + 1);
            return Err(ctx.report(&path, &origin, problem, kind.fix));
        }
    }
    if pairs.is_empty() {
        return Err(ctx.report(&path, &origin, format!("{file:?} holds no keys"), kind.fix));
    }
    Ok(pairs)
}
