//! Typed reads out of the untyped tree, each reporting its own problem and carrying on, so that one
//! pass finds every mistake.
//!
//! Every read returns `Result<T, Reported>`. [`Reported`] can only be made by recording an error,
//! so an `Err` always has its explanation in [`Ctx::errors`], and a section whose fields all read
//! `Ok` is complete: a config cannot be half-built.

use rangeway_middleware::chain::StageRegistry;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::time::Duration;

use super::ConfigError;
use super::tree::{Env, Kind, Node, Origin};
use super::units;

/// Proof that an error was recorded for a value that could not be read.
#[derive(Debug)]
pub(super) struct Reported(());

pub(super) type Read<T> = Result<T, Reported>;

/// State of one validation pass.
pub(super) struct Ctx<'a> {
    errors: Vec<ConfigError>,
    pub(super) env: &'a Env,
    /// The middleware kinds there are, and what each accepts.
    pub(super) stages: &'a StageRegistry,
    /// The registry's kinds, for messages.
    pub(super) known_kinds: Vec<&'a str>,
    /// How the config file is named in the `config::Value` origins handed on to the middleware
    /// registry.
    pub(super) file: &'a str,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(env: &'a Env, stages: &'a StageRegistry, file: &'a str) -> Self {
        Self { errors: Vec::new(), env, stages, known_kinds: stages.kinds().collect(), file }
    }

    /// Records a problem with the value at `path`. When the value came from the environment, the
    /// problem names the variable, since that is what the user has to change.
    pub(super) fn report(
        &mut self,
        path: &str,
        origin: &Origin,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Reported {
        let mut problem = problem.into();
        if let Origin::Env(var) = origin {
            problem.push_str(&format!(" (set by {var})"));
        }
        self.errors.push(ConfigError::new(path, problem, fix));
        Reported(())
    }

    /// Records a problem that is not about one value (a missing section, a clash between two).
    pub(super) fn report_at(
        &mut self,
        path: &str,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Reported {
        self.report(path, &Origin::File, problem, fix)
    }

    pub(super) fn push(&mut self, error: ConfigError) {
        self.errors.push(error);
    }

    pub(super) fn into_errors(self) -> Vec<ConfigError> {
        self.errors
    }
}

/// A credentials or key file is a few lines; the cap only stops a mistyped path to a huge file.
const MAX_TEXT_FILE_LEN: u64 = 1 << 20;

/// A credentials or key file: small (at most 1 MiB), regular, UTF-8.
pub(super) fn read_text(file: &str) -> Result<String, String> {
    let bytes = read_small_file(file, MAX_TEXT_FILE_LEN)?;
    String::from_utf8(bytes).map_err(|_| format!("{file:?} is not UTF-8 text"))
}

/// The contents of a small file a config value names (a CA bundle, a credentials file), or what
/// is wrong with it. Only regular files: a FIFO without a writer would block the load forever,
/// and a device such as `/dev/zero` has no end. Read through `take`, as a file may grow.
pub(super) fn read_small_file(file: &str, max_len: u64) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    match std::fs::metadata(file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("{file:?} does not exist"));
        }
        Err(e) => return Err(format!("{file:?} cannot be inspected: {e}")),
        Ok(meta) if !meta.is_file() => return Err(format!("{file:?} is not a regular file")),
        Ok(_) => {}
    }
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(max_len + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{file:?} cannot be read: {e}"))?;
    if bytes.len() as u64 > max_len {
        return Err(format!("{file:?} is larger than {} KiB", max_len / 1024));
    }
    Ok(bytes)
}

/// `parent.key`, quoting `key` when it is not a bare TOML key, so paths stay unambiguous.
pub(super) fn key_path(parent: &str, key: &str) -> String {
    let bare =
        !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let key = if bare { key.to_owned() } else { format!("{key:?}") };
    if parent.is_empty() { key } else { format!("{parent}.{key}") }
}

/// A table being read: fields are taken out one by one, and whatever is left at the end is an
/// unknown key. The keys asked for double as the list of valid keys, so there is no second list to
/// keep in sync.
pub(super) struct Table {
    path: String,
    /// How the table is written in TOML, for fixes: `[server]`, `[[routes]]`.
    header: String,
    entries: BTreeMap<String, Node>,
    asked: Vec<&'static str>,
}

impl Table {
    /// Reads `node` as a table; `example` is the fix shown when it is something else.
    pub(super) fn new(
        ctx: &mut Ctx<'_>,
        path: &str,
        header: impl Into<String>,
        node: Node,
        example: &str,
    ) -> Read<Self> {
        match node.kind {
            Kind::Table(entries) => Ok(Self {
                path: path.to_owned(),
                header: header.into(),
                entries,
                asked: Vec::new(),
            }),
            _ => Err(ctx.report(
                path,
                &node.origin,
                format!("expected a table, found {}", node.type_name()),
                format!("write it as a table, e.g. {example}"),
            )),
        }
    }

    pub(super) fn empty(path: &str, header: impl Into<String>) -> Self {
        Self {
            path: path.to_owned(),
            header: header.into(),
            entries: BTreeMap::new(),
            asked: Vec::new(),
        }
    }

    /// Takes the field `key` out, if present.
    pub(super) fn take(&mut self, key: &'static str) -> Option<Field> {
        self.asked.push(key);
        let node = self.entries.remove(key)?;
        Some(Field { path: key_path(&self.path, key), key, node })
    }

    /// Takes every remaining entry: for tables whose keys are names (`[upstreams]`) or free-form
    /// options (middleware).
    pub(super) fn drain(&mut self) -> BTreeMap<String, Node> {
        std::mem::take(&mut self.entries)
    }

    /// Reports every key that no one asked for, with the nearest valid key when one is close.
    pub(super) fn finish(self, ctx: &mut Ctx<'_>) {
        for (key, node) in self.entries {
            let path = key_path(&self.path, &key);
            let fix = match suggest(&key, self.asked.iter().copied()) {
                Some(near) => format!("did you mean `{near}`?"),
                None => format!("remove it; {} takes: {}", self.header, self.asked.join(", ")),
            };
            ctx.report(&path, &node.origin, format!("unknown key `{key}`"), fix);
        }
    }
}

/// One present field.
pub(super) struct Field {
    pub(super) path: String,
    pub(super) key: &'static str,
    pub(super) node: Node,
}

impl Field {
    pub(super) fn origin(&self) -> &Origin {
        &self.node.origin
    }

    fn wrong_type(&self, ctx: &mut Ctx<'_>, expected: &str, example: &str) -> Reported {
        ctx.report(
            &self.path,
            &self.node.origin,
            format!("expected {expected}, found {}", self.node.type_name()),
            format!("write {} = {example}", self.key),
        )
    }

    /// A string; `example` (TOML syntax, quotes included) is shown when it is something else.
    pub(super) fn string(self, ctx: &mut Ctx<'_>, example: &str) -> Read<String> {
        match self.node.kind {
            Kind::Str(s) => Ok(s),
            _ => Err(self.wrong_type(ctx, "a string", example)),
        }
    }

    /// [`Field::string`] without giving the field up, for a value read by more than one reader.
    pub(super) fn text(&self, ctx: &mut Ctx<'_>, example: &str) -> Read<String> {
        match &self.node.kind {
            Kind::Str(s) => Ok(s.clone()),
            _ => Err(self.wrong_type(ctx, "a string", example)),
        }
    }

    pub(super) fn boolean(self, ctx: &mut Ctx<'_>) -> Read<bool> {
        match (&self.node.kind, &self.node.origin) {
            (Kind::Bool(b), _) => Ok(*b),
            // Environment values are strings; read them as TOML would read the bare word.
            (Kind::Str(s), Origin::Env(_)) => match s.trim() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(ctx.report(
                    &self.path,
                    &self.node.origin,
                    "expected true or false",
                    "set it to true or false",
                )),
            },
            _ => Err(self.wrong_type(ctx, "a boolean", "true (or false), without quotes")),
        }
    }

    /// An integer within `range`, as the type the config stores it in.
    pub(super) fn integer<T>(
        self,
        ctx: &mut Ctx<'_>,
        range: RangeInclusive<T>,
        example: &str,
    ) -> Read<T>
    where
        T: TryFrom<i128> + PartialOrd + fmt::Display,
    {
        let value = match (&self.node.kind, &self.node.origin) {
            (Kind::Int(i), _) => *i,
            (Kind::Str(s), Origin::Env(_)) => match s.trim().parse::<i128>() {
                Ok(i) => i,
                Err(_) => {
                    return Err(ctx.report(
                        &self.path,
                        &self.node.origin,
                        "expected an integer",
                        format!("set it to a whole number, e.g. {example}"),
                    ));
                }
            },
            _ => return Err(self.wrong_type(ctx, "an integer", example)),
        };
        match T::try_from(value) {
            Ok(v) if range.contains(&v) => Ok(v),
            _ => Err(ctx.report(
                &self.path,
                &self.node.origin,
                format!("{value} is out of range"),
                format!("use a number from {} to {}", range.start(), range.end()),
            )),
        }
    }

    /// A share from 0 to 1 (`0.01`; an integer 0 or 1 too).
    pub(super) fn ratio(self, ctx: &mut Ctx<'_>, example: &str) -> Read<f64> {
        let value = match (&self.node.kind, &self.node.origin) {
            (Kind::Float(f), _) => Some(*f),
            (Kind::Int(i), _) => Some(*i as f64),
            (Kind::Str(s), Origin::Env(_)) => s.trim().parse::<f64>().ok(),
            _ => return Err(self.wrong_type(ctx, "a number from 0 to 1", example)),
        };
        match value {
            Some(v) if (0.0..=1.0).contains(&v) => Ok(v),
            _ => Err(ctx.report(
                &self.path,
                &self.node.origin,
                "is not a share from 0 to 1",
                format!("write {} = {example} (1 %), from 0 (none) to 1 (all)", self.key),
            )),
        }
    }

    /// A duration written with a unit (`"30s"`), within `range`; `bounds` says the range in words.
    pub(super) fn duration(
        self,
        ctx: &mut Ctx<'_>,
        range: RangeInclusive<Duration>,
        bounds: &str,
    ) -> Read<Duration> {
        let parsed = match &self.node.kind {
            Kind::Str(s) => units::parse_duration(s),
            Kind::Int(i) => Err(units::bare_number(&i.to_string())),
            Kind::Float(f) => Err(units::bare_number(&f.to_string())),
            _ => return Err(self.wrong_type(ctx, "a duration string", "\"30s\"")),
        };
        match parsed {
            Ok(d) if range.contains(&d) => Ok(d),
            Ok(d) => Err(ctx.report(
                &self.path,
                &self.node.origin,
                format!("{} is out of range", humantime::format_duration(d)),
                format!("use {bounds}"),
            )),
            Err(e) => Err(ctx.report(&self.path, &self.node.origin, e.problem, e.fix)),
        }
    }

    /// A size in bytes within `range`: a whole number, or a string with a unit (`"32KiB"`,
    /// `"10GiB"`; see [`units::parse_size`]).
    pub(super) fn size(
        self,
        ctx: &mut Ctx<'_>,
        range: RangeInclusive<u64>,
        example: &str,
    ) -> Read<u64> {
        let parsed = match &self.node.kind {
            Kind::Int(i) => u64::try_from(*i).map_err(|_| {
                units::UnitError::new(format!("{i} is not a size"), "use a whole number of bytes")
            }),
            Kind::Str(s) => units::parse_size(s),
            _ => return Err(self.wrong_type(ctx, "a size", example)),
        };
        match parsed {
            Ok(size) if range.contains(&size) => Ok(size),
            Ok(size) => Err(ctx.report(
                &self.path,
                &self.node.origin,
                format!("{size} is out of range"),
                format!("use from {} to {} bytes", range.start(), range.end()),
            )),
            Err(e) => Err(ctx.report(&self.path, &self.node.origin, e.problem, e.fix)),
        }
    }

    /// A socket address to listen on: an IP literal and a port. Host names are refused, because
    /// which address a name resolves to at boot is not something a listener should leave to chance.
    pub(super) fn socket_addr(self, ctx: &mut Ctx<'_>, example: &str) -> Read<SocketAddr> {
        let origin = self.node.origin.clone();
        let path = self.path.clone();
        let text = self.string(ctx, &format!("\"{example}\""))?;
        let text = text.trim();
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(addr);
        }
        let ip_and_port = text.rsplit_once(':').filter(|(ip, port)| {
            ip.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok()
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
        });
        let (problem, fix) = if let Some((_, port)) = ip_and_port {
            (
                format!("port {port} is out of range"),
                "use a port from 0 to 65535 (0 picks a free one)".to_owned(),
            )
        } else if text.parse::<IpAddr>().is_ok() {
            (
                format!("{text:?} has no port"),
                format!("add a port, e.g. \"{text}:8080\" (IPv6: \"[{text}]:8080\")"),
            )
        } else {
            (
                format!("{text:?} is not a socket address"),
                format!(
                    "write an IP address and a port, e.g. \"{example}\" or \"[::1]:8080\"; host \
                     names are not resolved"
                ),
            )
        };
        Err(ctx.report(&path, &origin, problem, fix))
    }
}

/// The candidate closest to `word` by edit distance, if close enough to be a plausible typo.
pub(super) fn suggest<'c>(
    word: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> Option<&'c str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (edit_distance(&word.to_lowercase(), &c.to_lowercase()), c))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars, in O(len(b)) memory.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == cb { diagonal } else { 1 + diagonal.min(above).min(row[j]) };
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("listen", "listen"), 0);
        assert_eq!(edit_distance("listn", "listen"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", ""), 3);
    }

    #[test]
    fn suggestions() {
        let keys = ["listen", "admin_listen", "threads"];
        assert_eq!(suggest("listn", keys), Some("listen"));
        assert_eq!(suggest("Listen", keys), Some("listen"));
        assert_eq!(suggest("admin-listen", keys), Some("admin_listen"));
        assert_eq!(suggest("thread", keys), Some("threads"));
        assert_eq!(suggest("x", keys), None);
        assert_eq!(suggest("backend", keys), None);
    }

    #[test]
    fn key_paths() {
        assert_eq!(key_path("", "server"), "server");
        assert_eq!(key_path("upstreams", "my-origin"), "upstreams.my-origin");
        assert_eq!(key_path("upstreams", "a.b"), "upstreams.\"a.b\"");
        assert_eq!(key_path("upstreams", ""), "upstreams.\"\"");
    }
}
