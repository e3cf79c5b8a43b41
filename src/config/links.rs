//! `[routes.signed_links]`: the keys a route's links are signed with, and how long a download
//! begun before its link expired may still resume.

use std::time::Duration;

use super::keyfile::{self, KeyFile};
use super::read::{Ctx, Field, Read, Table};
use crate::links::LinkKeys;

const EXAMPLE: &str = "[routes.signed_links] with keys_file = \"/etc/rangeway/link-keys\"";
/// Shorter than this, a link key could be guessed.
const MIN_KEY_LEN: usize = 32;

/// A route that serves only signed links (`crate::links`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SignedLinks {
    /// By id; the file's last line signs new links.
    pub keys: LinkKeys,
    /// How long after its link expired a download begun before may still resume. Default 24h.
    pub grace: Duration,
}

pub(super) fn read(ctx: &mut Ctx<'_>, field: Field) -> Read<SignedLinks> {
    let header = format!("[{}]", field.path);
    let mut table = Table::new(ctx, &field.path, header, field.node, EXAMPLE)?;
    let keys = match table.take("keys_file") {
        Some(field) => read_keys(ctx, field),
        None => Err(ctx.report_at(
            &format!("{}.keys_file", field.path),
            "is missing",
            "add keys_file = \"/etc/rangeway/link-keys\" (lines of `KEY_ID SECRET`)",
        )),
    };
    let grace = table.take("grace").map_or(Ok(Duration::from_secs(24 * 3600)), |f| {
        f.duration(
            ctx,
            Duration::ZERO..=Duration::from_secs(30 * 24 * 3600),
            "from \"0s\" to \"30d\"",
        )
    });
    table.finish(ctx);
    Ok(SignedLinks { keys: keys?, grace: grace? })
}

/// `KEY_ID SECRET` lines, the newest last.
fn read_keys(ctx: &mut Ctx<'_>, field: Field) -> Read<LinkKeys> {
    let kind = KeyFile {
        example: "\"/etc/rangeway/link-keys\"",
        pair: "a `KEY_ID SECRET`",
        fix: "write one `KEY_ID SECRET` pair per line, the newest last (e.g. \
              `echo \"$(date +%Y-%m) $(openssl rand -hex 32)\" >> FILE`)",
        unreadable_fix: "point keys_file at a readable file of link keys",
        check: |id, secret| {
            if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
                Some("has a key id of other than letters, digits, '-', '_' and '.'".to_owned())
            } else if secret.len() < MIN_KEY_LEN || !secret.bytes().all(|b| b.is_ascii_graphic()) {
                Some(format!("has a secret of fewer than {MIN_KEY_LEN} printable characters"))
            } else {
                None
            }
        },
    };
    let keys = keyfile::read(ctx, field, &kind)?;
    let keys = keys.iter().map(|(id, secret)| (id.clone(), secret.expose()));
    Ok(LinkKeys::new(keys).unwrap_or_else(|| unreachable!("a key file holds a key")))
}
