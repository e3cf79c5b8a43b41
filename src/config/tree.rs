//! The sources, merged into one untyped tree: the TOML file read through the `config` crate, then
//! the `RANGEWAY__SECTION__KEY` environment overrides laid on top.
//!
//! The tree is walked by hand afterwards (see `read.rs`) instead of deserialised with serde,
//! because serde stops at the first error and we report all of them. Each node remembers whether
//! it came from the environment, so that env values (always strings) can be parsed like file
//! values and errors can name the variable to change.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;

use ::config::{FileFormat, Source as _, ValueKind};

use super::ConfigError;

/// Prefix of the override variables; `__` separates the key segments after it.
pub(super) const ENV_PREFIX: &str = "RANGEWAY";
const ENV_SEPARATOR: &str = "__";
const MAX_OVERRIDE_DEPTH: usize = 16;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Origin {
    File,
    /// The environment variable that set it, spelled in upper case (the `config` crate lowercases
    /// names, so the original case is gone; upper case is how such variables are written).
    Env(String),
}

#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) kind: Kind,
    pub(super) origin: Origin,
}

#[derive(Debug, Clone)]
pub(super) enum Kind {
    Bool(bool),
    /// Wide enough for every integer kind `config` has but `u128`, which TOML cannot produce.
    Int(i128),
    Float(f64),
    Str(String),
    Array(Vec<Node>),
    Table(BTreeMap<String, Node>),
    /// `config`'s placeholder for a missing value; TOML has no null, so only a bug upstream makes
    /// one.
    Nil,
}

impl Node {
    fn table(entries: BTreeMap<String, Node>, origin: Origin) -> Self {
        Self { kind: Kind::Table(entries), origin }
    }

    fn from_value(value: ::config::Value, origin: &Origin) -> Self {
        let kind = match value.kind {
            ValueKind::Nil => Kind::Nil,
            ValueKind::Boolean(b) => Kind::Bool(b),
            ValueKind::I64(i) => Kind::Int(i.into()),
            ValueKind::U64(u) => Kind::Int(u.into()),
            ValueKind::I128(i) => Kind::Int(i),
            // Saturating is safe: every integer field has a range far below either bound, so the
            // value is reported as out of range rather than silently wrapped.
            ValueKind::U128(u) => Kind::Int(i128::try_from(u).unwrap_or(i128::MAX)),
            ValueKind::Float(f) => Kind::Float(f),
            ValueKind::String(s) => Kind::Str(s),
            ValueKind::Array(items) => {
                Kind::Array(items.into_iter().map(|v| Self::from_value(v, origin)).collect())
            }
            ValueKind::Table(map) => Kind::Table(
                map.into_iter().map(|(k, v)| (k, Self::from_value(v, origin))).collect(),
            ),
        };
        Self { kind, origin: origin.clone() }
    }

    /// Back to a `config::Value`, for the middleware options that the stage registry parses later.
    /// `file` names the config file, so the stages' own errors can say where a value came from.
    pub(super) fn to_value(&self, file: &str) -> ::config::Value {
        let origin = match &self.origin {
            Origin::File => file.to_owned(),
            Origin::Env(var) => format!("environment variable {var}"),
        };
        // A variable's text is read as the file's value would be: `9` a number, `true` a
        // boolean, `["a"]` a list, `"9"` a string; text that is not a TOML value (`sha256`) is
        // the string it says.
        if let (Kind::Str(text), Origin::Env(var)) = (&self.kind, &self.origin)
            && let Ok(Node { kind: Kind::Table(mut parsed), .. }) =
                parse_toml(&format!("v = {text}"), var)
            && let Some(value) = parsed.remove("v")
        {
            return value.from(&self.origin).value_kind(file, origin);
        }
        self.value_kind(file, origin)
    }

    /// This node and every node in it, as set by `origin`.
    fn from(self, origin: &Origin) -> Node {
        let kind = match self.kind {
            Kind::Array(items) => Kind::Array(items.into_iter().map(|n| n.from(origin)).collect()),
            Kind::Table(map) => {
                Kind::Table(map.into_iter().map(|(k, n)| (k, n.from(origin))).collect())
            }
            kind => kind,
        };
        Node { kind, origin: origin.clone() }
    }

    fn value_kind(&self, file: &str, origin: String) -> ::config::Value {
        let kind = match &self.kind {
            Kind::Nil => ValueKind::Nil,
            Kind::Bool(b) => ValueKind::Boolean(*b),
            Kind::Int(i) => i64::try_from(*i).map_or(ValueKind::I128(*i), ValueKind::I64),
            Kind::Float(f) => ValueKind::Float(*f),
            Kind::Str(s) => ValueKind::String(s.clone()),
            Kind::Array(items) => {
                ValueKind::Array(items.iter().map(|n| n.to_value(file)).collect())
            }
            Kind::Table(map) => {
                ValueKind::Table(map.iter().map(|(k, n)| (k.clone(), n.to_value(file))).collect())
            }
        };
        ::config::Value::new(Some(&origin), kind)
    }

    /// "a string", "an integer", ... for type errors. Never the value itself: it may be a secret.
    pub(super) fn type_name(&self) -> &'static str {
        match self.kind {
            Kind::Bool(_) => "a boolean",
            Kind::Int(_) => "an integer",
            Kind::Float(_) => "a float",
            Kind::Str(_) => "a string",
            Kind::Array(_) => "an array",
            Kind::Table(_) => "a table",
            Kind::Nil => "nothing",
        }
    }
}

/// Parses the TOML text of the file named `name` into the root table.
///
/// A syntax error is one error naming the file with line and column. The parser's message normally
/// quotes the offending source line; that line is dropped, because it may hold a password.
pub(super) fn parse_toml(text: &str, name: &str) -> Result<Node, ConfigError> {
    let map = ::config::File::from_str(text, FileFormat::Toml)
        .collect()
        .map_err(|e| syntax_error(&e, name))?;
    let entries = map.into_iter().map(|(k, v)| (k, Node::from_value(v, &Origin::File))).collect();
    Ok(Node::table(entries, Origin::File))
}

fn syntax_error(error: &::config::ConfigError, name: &str) -> ConfigError {
    let fix = "fix the TOML syntax there (https://toml.io)";
    let ::config::ConfigError::FileParse { cause, .. } = error else {
        return ConfigError::new(name, "is not valid TOML", fix);
    };
    let report = cause.to_string();
    // toml's report: "TOML parse error at line L, column C", a gutter with the quoted line and a
    // caret line (all containing '|'), then the message. Keep the position and the message only.
    let mut lines = report.lines();
    let position = lines
        .next()
        .and_then(|l| l.strip_prefix("TOML parse error at line "))
        .and_then(|rest| rest.split_once(", column "))
        .and_then(|(line, column)| Some((line.parse::<u64>().ok()?, column.parse::<u64>().ok()?)));
    let message: Vec<&str> = lines.filter(|l| !l.contains('|') && !l.trim().is_empty()).collect();
    match position {
        Some((line, column)) if !message.is_empty() => ConfigError::new(
            format!("{name}:{line}:{column}"),
            format!("invalid TOML: {}", message.join("; ")),
            fix,
        ),
        // An unrecognised report layout could contain the quoted source line: say less rather
        // than risk echoing a secret.
        _ => ConfigError::new(name, "is not valid TOML", fix),
    }
}

/// A snapshot of the process environment (or a stand-in for tests): overrides are read from it, and
/// `admin_token_env` is looked up in it, so both see the same environment.
#[derive(Clone, Default)]
pub(super) struct Env {
    vars: BTreeMap<String, OsString>,
}

/// Names only: values may be secrets.
impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.vars.keys()).finish()
    }
}

impl Env {
    /// The process environment. Variables whose names are not Unicode cannot be overrides or a
    /// token's name, so they are left out.
    pub(super) fn process() -> Self {
        Self {
            vars: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v)))
                .collect(),
        }
    }

    #[cfg(test)]
    pub(super) fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self { vars: pairs.into_iter().map(|(k, v)| (k.to_owned(), OsString::from(v))).collect() }
    }

    /// The same environment without its overrides: for configs given as a string, which take none.
    pub(super) fn without_overrides(mut self) -> Self {
        self.vars.retain(|name, _| !is_override(name));
        self
    }

    pub(super) fn get(&self, name: &str) -> Option<&OsString> {
        self.vars.get(name)
    }

    /// Lays the `RANGEWAY__…` overrides onto `root`, reporting the ones that cannot apply.
    pub(super) fn apply_overrides(&self, root: &mut Node, errors: &mut Vec<ConfigError>) {
        // Key (as `config` derives it) -> (variable, value), so overrides apply in key order and
        // errors name the variable as the user spelled it.
        let mut overrides: BTreeMap<String, (&str, String)> = BTreeMap::new();
        for (var, value) in self.vars.iter().filter(|(name, _)| is_override(name)) {
            let Some(value) = value.to_str() else {
                errors.push(ConfigError::new(
                    var.as_str(),
                    "the value is not valid UTF-8",
                    "set it to UTF-8 text, or unset it",
                ));
                continue;
            };
            let Some(key) = override_key(var, value) else {
                errors.push(ConfigError::new(
                    var.as_str(),
                    "cannot be read as an override",
                    "name it RANGEWAY__SECTION__KEY, e.g. RANGEWAY__SERVER__LISTEN",
                ));
                continue;
            };
            // `config` lowercases names, so two spellings of one key would silently race.
            if let Some((first, _)) = overrides.get(&key) {
                errors.push(ConfigError::new(
                    var.as_str(),
                    format!("sets the same key as {first} (names are not case-sensitive)"),
                    "unset one of them",
                ));
                continue;
            }
            overrides.insert(key, (var, value.to_owned()));
        }
        for (key, (var, value)) in overrides {
            let node = Node { kind: Kind::Str(value), origin: Origin::Env(var.to_owned()) };
            if let Err(e) = overlay(root, &key, node) {
                errors.push(ConfigError::new(var, e.problem, e.fix));
            }
        }
    }
}

/// The dotted key the `config` crate makes of one override variable:
/// `RANGEWAY__UPSTREAMS__ORIGIN__URL` -> `upstreams.origin.url` (prefix dropped, lower-cased,
/// `__` -> `.`). One variable at a time, to know which variable each key came from. We split
/// the key ourselves rather than let `config` merge it, to match names case-insensitively and
/// to address array elements (see `overlay`).
fn override_key(var: &str, value: &str) -> Option<String> {
    let single = std::collections::HashMap::from([(var.to_owned(), value.to_owned())]);
    ::config::Environment::with_prefix(ENV_PREFIX)
        .separator(ENV_SEPARATOR)
        .source(Some(single))
        .collect()
        .ok()?
        .into_keys()
        .next()
}

fn is_override(name: &str) -> bool {
    let prefix_len = ENV_PREFIX.len() + ENV_SEPARATOR.len();
    name.get(..prefix_len)
        .is_some_and(|p| p.eq_ignore_ascii_case(&format!("{ENV_PREFIX}{ENV_SEPARATOR}")))
}

struct OverlayError {
    problem: String,
    fix: String,
}

/// Sets `key` (dotted, lower case) in `root` to `value`.
///
/// Differences from the `config` crate's own merge, on purpose:
/// - a segment matches an existing key case-insensitively when there is no exact match, so that
///   `RANGEWAY__UPSTREAMS__S3EAST__URL` reaches `[upstreams.S3East]` instead of creating a second,
///   lower-case upstream next to it;
/// - a numeric segment indexes an existing array (`RANGEWAY__ROUTES__0__UPSTREAM`), and may not
///   grow it, because a half-defined array element is never what was meant;
/// - setting a key below a value that is not a table is an error, not a silent replacement.
fn overlay(root: &mut Node, key: &str, value: Node) -> Result<(), OverlayError> {
    let segments: Vec<&str> = key.split('.').collect();
    // No key is more than a few levels deep; the cap keeps a runaway name from building a tree
    // deep enough to overflow the stack of the recursive walks over it.
    if segments.len() > MAX_OVERRIDE_DEPTH {
        return Err(OverlayError {
            problem: format!("the name has more than {MAX_OVERRIDE_DEPTH} key segments"),
            fix: "name an existing key, e.g. RANGEWAY__SERVER__LISTEN".to_owned(),
        });
    }
    if segments.iter().any(|s| s.is_empty()) {
        return Err(OverlayError {
            problem: "the name has an empty key segment".to_owned(),
            fix: "write RANGEWAY__SECTION__KEY, e.g. RANGEWAY__SERVER__LISTEN, with exactly two \
                  underscores between segments"
                .to_owned(),
        });
    }
    let mut node = root;
    let mut path = String::new();
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let origin = value.origin.clone();
        let type_name = node.type_name();
        let slot: &mut Node = match &mut node.kind {
            Kind::Table(entries) => {
                let name = resolve_key(entries, segment)?;
                path = super::read::key_path(&path, &name);
                entries.entry(name).or_insert_with(|| Node::table(BTreeMap::new(), origin))
            }
            Kind::Array(items) => {
                let len = items.len();
                let index = segment.parse::<usize>().ok().filter(|&i| i < len);
                let Some(index) = index else {
                    return Err(OverlayError {
                        problem: format!(
                            "{path} has {len} element(s), so {segment:?} does not name one"
                        ),
                        fix: format!(
                            "use an index from 0 to {}; elements can only be added in the file",
                            len.saturating_sub(1)
                        ),
                    });
                };
                path = format!("{path}[{index}]");
                &mut items[index]
            }
            _ => {
                return Err(OverlayError {
                    problem: format!("{path} is {type_name}, not a table"),
                    fix: format!("override {path} itself, or change it into a table in the file"),
                });
            }
        };
        if last {
            *slot = value;
            return Ok(());
        }
        node = slot;
    }
    Ok(())
}

/// The existing key `segment` refers to: itself, or the one key equal to it ignoring case.
fn resolve_key(entries: &BTreeMap<String, Node>, segment: &str) -> Result<String, OverlayError> {
    if entries.contains_key(segment) {
        return Ok(segment.to_owned());
    }
    let mut matches = entries.keys().filter(|k| k.eq_ignore_ascii_case(segment));
    match (matches.next(), matches.next()) {
        (Some(only), None) => Ok(only.clone()),
        (Some(a), Some(b)) => Err(OverlayError {
            problem: format!("{segment:?} matches both {a:?} and {b:?}, which differ only in case"),
            fix: "rename one of them in the file, so that their names differ in more than case"
                .to_owned(),
        }),
        _ => Ok(segment.to_owned()),
    }
}
