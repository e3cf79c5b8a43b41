//! The sources, layered by the `config` crate: the TOML file, then each `RANGEWAY__…` environment
//! variable as an override of the key its name resolves to in the file. What is kept of them,
//! [`Origins`], tells a problem which variable set a value or where in the file it is.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;

use ::config::{File, FileFormat, Source as _, Value};
use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::errors::ConfigError;
use crate::values::{Problem, wrong};

/// What every override variable's name starts with (in any case); `__` separates its segments.
const ENV_PREFIX: &str = "RANGEWAY__";
/// No key is more than a few levels deep: a longer name is a mistake.
const MAX_OVERRIDE_DEPTH: usize = 16;

/// A key path, as problems name it: `routes[1].middleware[0].kind`, `upstreams."a.b"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Path(Vec<Seg>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

impl Path {
    pub(super) fn key(&self, key: &str) -> Self {
        Self([self.0.as_slice(), &[Seg::Key(key.to_owned())]].concat())
    }

    pub(super) fn index(&self, index: usize) -> Self {
        Self([self.0.as_slice(), &[Seg::Index(index)]].concat())
    }

    fn keys(&self) -> impl DoubleEndedIterator<Item = &str> {
        self.0.iter().filter_map(|s| if let Seg::Key(k) = s { Some(k.as_str()) } else { None })
    }

    /// The key a fix writes: `trusted_proxies` for `server.trusted_proxies[3]`.
    pub(super) fn last_key(&self) -> &str {
        self.keys().next_back().unwrap_or("")
    }

    /// How the table at this path is written in TOML: `[server]`, `[[routes.middleware]]`.
    pub(super) fn header(&self) -> String {
        match self.0.last() {
            None => "the top level".to_owned(),
            Some(Seg::Index(_)) => format!("[[{}]]", self.keys().collect::<Vec<_>>().join(".")),
            Some(Seg::Key(_)) => format!("[{self}]"),
        }
    }
}

/// Keys that are not bare TOML keys are quoted, so that paths stay unambiguous.
impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            let dot = if i > 0 { "." } else { "" };
            match segment {
                Seg::Index(index) => write!(f, "[{index}]")?,
                Seg::Key(key) if bare(key) => write!(f, "{dot}{key}")?,
                Seg::Key(key) => write!(f, "{dot}{key:?}")?,
            }
        }
        Ok(())
    }
}

/// A bare TOML key, as upstream names are too.
pub(super) fn bare(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A snapshot of the process environment (or a stand-in for tests): overrides are read from it, and
/// the `*_env` keys are looked up in it, so both see the same environment.
#[derive(Clone, Default)]
pub(super) struct Env {
    pub(super) vars: BTreeMap<String, OsString>,
}

/// Names only: values may be secrets.
impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.vars.keys()).finish()
    }
}

impl Env {
    /// The process environment. Variables whose names are not Unicode cannot be overrides or a
    /// secret's name, so they are left out.
    pub(super) fn process() -> Self {
        let vars = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v)));
        Self { vars: vars.collect() }
    }

    /// The same environment without its overrides: for configs given as a string, which take none.
    pub(super) fn without_overrides(mut self) -> Self {
        self.vars.retain(|name, _| !is_override(name));
        self
    }
}

fn is_override(name: &str) -> bool {
    name.get(..ENV_PREFIX.len()).is_some_and(|p| p.eq_ignore_ascii_case(ENV_PREFIX))
}

/// Where the values of a loaded configuration came from.
pub(super) struct Origins<'a> {
    text: &'a str,
    file: Spanned<DeTable<'a>>,
    /// The key each override variable set, and the variable.
    overrides: Vec<(Path, String)>,
}

impl Origins<'_> {
    /// The variable that set the value at `at`, or a table or list it is in.
    pub(super) fn var(&self, at: &Path) -> Option<&str> {
        let set = self.overrides.iter().filter(|(key, _)| at.0.starts_with(&key.0));
        set.max_by_key(|(key, _)| key.0.len()).map(|(_, var)| var.as_str())
    }

    /// Line and column of the key (or element) at `at` in the file; of the table it belongs in,
    /// when the file has no such key.
    pub(super) fn position(&self, at: &Path) -> Option<(usize, usize)> {
        let (mut found, mut node): (_, Option<&DeValue<'_>>) = (None, None);
        for segment in &at.0 {
            let next = match (segment, node) {
                (Seg::Key(key), None) => key_at(self.file.get_ref(), key),
                (Seg::Key(key), Some(DeValue::Table(table))) => key_at(table, key),
                (Seg::Index(index), Some(DeValue::Array(items))) => {
                    items.get(*index).map(|item| (item.span().start, item))
                }
                _ => None,
            };
            let Some((start, value)) = next else { break };
            (found, node) = (Some(start), Some(value.get_ref()));
        }
        Some(line_column(self.text, found?))
    }
}

fn key_at<'t>(table: &'t DeTable<'t>, key: &str) -> Option<(usize, &'t Spanned<DeValue<'t>>)> {
    table.get_key_value(key).map(|(key, value)| (key.span().start, value))
}

/// Line and column, from 1, of the byte at `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (before.matches('\n').count() + 1, before[line_start..].chars().count() + 1)
}

/// Reads `text` (the file `name`) with the overrides of `env` laid on top as `T`, which must take
/// any value. Returns what the overrides that cannot apply did wrong beside it.
///
/// # Errors
/// One error naming the file when it is not TOML.
pub(super) fn load<'a, T: DeserializeOwned>(
    text: &'a str,
    name: &str,
    env: &Env,
) -> Result<(T, Origins<'a>, Vec<ConfigError>), ConfigError> {
    let file = DeTable::parse(text).map_err(|e| syntax_error(text, &e, name))?;
    let mut errors = Vec::new();
    let mut overrides: Vec<(Path, String, &str)> = Vec::new();
    for (var, value) in env.vars.iter().filter(|(name, _)| is_override(name)) {
        let key = match value.to_str() {
            Some(value) => resolve(file.get_ref(), &var[ENV_PREFIX.len()..]).map(|k| (k, value)),
            None => wrong("the value is not valid UTF-8", "set it to UTF-8 text, or unset it"),
        };
        // Two spellings of one key, or a key inside another's value, would race.
        let key = key.and_then(|(key, value)| {
            let clash =
                overrides.iter().find(|(k, ..)| k.0.starts_with(&key.0) || key.0.starts_with(&k.0));
            match clash {
                None => Ok((key, value)),
                Some((other, first, _)) if *other == key => wrong(
                    format!("sets the same key as {first} (names are not case-sensitive)"),
                    "unset one of them",
                ),
                Some((other, first, _)) => {
                    wrong(format!("overlaps {other}, which {first} sets"), "unset one of them")
                }
            }
        });
        match key {
            Ok((key, value)) => overrides.push((key, var.clone(), value)),
            Err((problem, fix)) => errors.push(ConfigError::new(var.as_str(), problem, fix)),
        }
    }
    // Neither fails on a file that parsed, with the keys `resolve` writes, into raw types that
    // take any value.
    let fail = |_| ConfigError::new(name, "cannot be read", "check that it is a rangeway config");
    let mut builder =
        ::config::Config::builder().add_source(File::from_str(text, FileFormat::Toml));
    for (key, _, value) in &overrides {
        builder = builder.set_override(key.to_string(), *value).map_err(fail)?;
    }
    let raw = builder.build().and_then(::config::Config::try_deserialize).map_err(fail)?;
    let overrides = overrides.into_iter().map(|(key, var, _)| (key, var)).collect();
    Ok((raw, Origins { text, file, overrides }, errors))
}

/// The key the segments of an override's name (after the prefix) name: a segment matches an
/// existing key ignoring case (the `config` crate's own environment source lowercases names, so
/// `S3EAST` could not reach `[upstreams.S3East]`), and a number addresses an existing element of
/// an array (there, it would make a table key "0"); a key the file does not have is created.
fn resolve(root: &DeTable<'_>, name: &str) -> Result<Path, Problem> {
    let segments: Vec<String> = name.split("__").map(str::to_ascii_lowercase).collect();
    if segments.len() > MAX_OVERRIDE_DEPTH {
        let problem = format!("the name has more than {MAX_OVERRIDE_DEPTH} key segments");
        return wrong(problem, "name an existing key, e.g. RANGEWAY__SERVER__LISTEN");
    } else if segments.iter().any(String::is_empty) {
        return wrong(
            "the name has an empty key segment",
            "write RANGEWAY__SECTION__KEY, e.g. RANGEWAY__SERVER__LISTEN, with exactly two \
             underscores between segments",
        );
    }
    let mut path = Path::default();
    // `None` below a key the file does not have: everything under it is new.
    let mut node = Some(DeValue::Table(root.clone()));
    for segment in &segments {
        node = match &node {
            None => {
                path = path.key(segment);
                None
            }
            Some(DeValue::Table(table)) => {
                let mut same = table.keys().filter(|k| k.get_ref().eq_ignore_ascii_case(segment));
                let key = match (table.get(segment.as_str()), same.next(), same.next()) {
                    (None, Some(a), Some(b)) => {
                        let (a, b) = (a.get_ref(), b.get_ref());
                        return wrong(
                            format!(
                                "{segment:?} matches both {a:?} and {b:?}, which differ only in case"
                            ),
                            "rename one of them in the file, so that their names differ in more than case",
                        );
                    }
                    (None, Some(only), None) => only.get_ref().to_string(),
                    _ => segment.clone(),
                };
                path = path.key(&key);
                table.get(key.as_str()).map(|value| value.get_ref().clone())
            }
            Some(DeValue::Array(items)) => {
                let Some(index) = segment.parse::<usize>().ok().filter(|&i| i < items.len()) else {
                    let n = items.len();
                    return wrong(
                        format!("{path} has {n} element(s), so {segment:?} does not name one"),
                        format!(
                            "use an index from 0 to {}; elements can only be added in the file",
                            n.saturating_sub(1)
                        ),
                    );
                };
                path = path.index(index);
                Some(items[index].get_ref().clone())
            }
            Some(leaf) => {
                return wrong(
                    format!("{path} is {}, not a table", type_name(leaf)),
                    format!("override {path} itself, or change it into a table in the file"),
                );
            }
        };
    }
    // The `config` crate's path syntax, as it displays, has no quoted keys.
    if path.keys().any(|key| !bare(key)) {
        return wrong("names a key that cannot be overridden", "set it in the file");
    }
    Ok(path)
}

fn type_name(value: &DeValue<'_>) -> &'static str {
    match value {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date-time",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// A syntax error: one error naming the file, line and column. Only the parser's message is kept,
/// not the source line its report quotes, which may hold a password.
fn syntax_error(text: &str, error: &toml::de::Error, name: &str) -> ConfigError {
    let message: Vec<&str> = error.message().lines().filter(|l| !l.trim().is_empty()).collect();
    let at = match error.span() {
        Some(span) => {
            let (line, column) = line_column(text, span.start);
            format!("{name}:{line}:{column}")
        }
        None => name.to_owned(),
    };
    let fix = "fix the TOML syntax there (https://toml.io)";
    ConfigError::new(at, format!("invalid TOML: {}", message.join("; ")), fix)
}

/// `text` read as a TOML value (`9`, `true`, `["a"]`, `"9"`), as the file would read it; `None`
/// when it is not one.
pub(super) fn toml_value(text: &str) -> Option<Value> {
    File::from_str(&format!("v = {text}"), FileFormat::Toml).collect().ok()?.remove("v")
}
