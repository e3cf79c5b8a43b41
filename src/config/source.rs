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

    /// The key a fix writes: `trusted_proxies` for `server.trusted_proxies[3]`.
    pub(super) fn last_key(&self) -> &str {
        self.0
            .iter()
            .rev()
            .find_map(|s| if let Seg::Key(k) = s { Some(k.as_str()) } else { None })
            .unwrap_or("")
    }

    /// How the table at this path is written in TOML: `[server]`, `[[routes.middleware]]`.
    pub(super) fn header(&self) -> String {
        let keys: Vec<&str> = self
            .0
            .iter()
            .filter_map(|s| if let Seg::Key(k) = s { Some(k.as_str()) } else { None })
            .collect();
        match self.0.last() {
            None => "the top level".to_owned(),
            Some(Seg::Index(_)) => format!("[[{}]]", keys.join(".")),
            Some(Seg::Key(_)) => format!("[{self}]"),
        }
    }

    /// Whether the `config` crate's path syntax can write it (as it displays: no quoted key).
    fn is_expression(&self) -> bool {
        self.0.iter().all(|s| matches!(s, Seg::Index(_)) || matches!(s, Seg::Key(k) if bare(k)))
    }
}

/// Keys that are not bare TOML keys are quoted, so that paths stay unambiguous.
impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Seg::Index(index) => write!(f, "[{index}]")?,
                Seg::Key(key) => {
                    let dot = if i > 0 { "." } else { "" };
                    if bare(key) { write!(f, "{dot}{key}")? } else { write!(f, "{dot}{key:?}")? }
                }
            }
        }
        Ok(())
    }
}

fn bare(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A snapshot of the process environment (or a stand-in for tests): overrides are read from it, and
/// the `*_env` keys are looked up in it, so both see the same environment.
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
    /// secret's name, so they are left out.
    pub(super) fn process() -> Self {
        let vars = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v)));
        Self { vars: vars.collect() }
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
        let mut found = None;
        let mut node: Option<&DeValue<'_>> = None;
        for segment in &at.0 {
            let next = match (segment, node) {
                (Seg::Key(key), None) => {
                    self.file.get_ref().get_key_value(key.as_str()).map(|(k, v)| (k.span(), v))
                }
                (Seg::Key(key), Some(DeValue::Table(table))) => {
                    table.get_key_value(key.as_str()).map(|(k, v)| (k.span(), v))
                }
                (Seg::Index(index), Some(DeValue::Array(items))) => {
                    items.get(*index).map(|item| (item.span(), item))
                }
                _ => None,
            };
            let Some((span, value)) = next else { break };
            found = Some(span.start);
            node = Some(value.get_ref());
        }
        Some(line_column(self.text, found?))
    }
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
        let set = value.to_str().ok_or_else(|| {
            (
                "the value is not valid UTF-8".to_owned(),
                "set it to UTF-8 text, or unset it".to_owned(),
            )
        });
        let key =
            set.and_then(|_| resolve(file.get_ref(), &var[ENV_PREFIX.len()..])).and_then(|key| {
                // Two spellings of one key, or a key inside another's value, would race.
                let clash = overrides
                    .iter()
                    .find(|(k, ..)| k.0.starts_with(&key.0) || key.0.starts_with(&k.0));
                match clash {
                    None => Ok(key),
                    Some((other, first, _)) if *other == key => Err((
                        format!("sets the same key as {first} (names are not case-sensitive)"),
                        "unset one of them".to_owned(),
                    )),
                    Some((other, first, _)) => Err((
                        format!("overlaps {other}, which {first} sets"),
                        "unset one of them".to_owned(),
                    )),
                }
            });
        match (key, value.to_str()) {
            (Ok(key), Some(value)) => overrides.push((key, var.clone(), value)),
            (Err((problem, fix)), _) => errors.push(ConfigError::new(var.as_str(), problem, fix)),
            (Ok(_), None) => {}
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
fn resolve(root: &DeTable<'_>, name: &str) -> Result<Path, (String, String)> {
    let segments: Vec<String> = name.split("__").map(str::to_ascii_lowercase).collect();
    if segments.len() > MAX_OVERRIDE_DEPTH {
        return Err((
            format!("the name has more than {MAX_OVERRIDE_DEPTH} key segments"),
            "name an existing key, e.g. RANGEWAY__SERVER__LISTEN".to_owned(),
        ));
    }
    if segments.iter().any(String::is_empty) {
        return Err((
            "the name has an empty key segment".to_owned(),
            "write RANGEWAY__SECTION__KEY, e.g. RANGEWAY__SERVER__LISTEN, with exactly two \
             underscores between segments"
                .to_owned(),
        ));
    }
    let mut path = Path::default();
    // `None` below a key the file does not have: everything under it is new.
    let mut node = Some(Node::Table(root));
    for segment in &segments {
        node = match node {
            None => {
                path = path.key(segment);
                None
            }
            Some(Node::Table(table)) => {
                let mut same = table.keys().filter(|k| k.get_ref().eq_ignore_ascii_case(segment));
                let key = match (table.get(segment.as_str()), same.next(), same.next()) {
                    (None, Some(a), Some(b)) => {
                        return Err((
                            format!(
                                "{segment:?} matches both {:?} and {:?}, which differ only in case",
                                a.get_ref(),
                                b.get_ref()
                            ),
                            "rename one of them in the file, so that their names differ in more \
                             than case"
                                .to_owned(),
                        ));
                    }
                    (None, Some(only), None) => only.get_ref().to_string(),
                    _ => segment.clone(),
                };
                path = path.key(&key);
                table.get(key.as_str()).map(|value| Node::of(value.get_ref()))
            }
            Some(Node::Array(items)) => {
                let index = segment.parse::<usize>().ok().filter(|&i| i < items.len());
                let Some(index) = index else {
                    return Err((
                        format!(
                            "{path} has {} element(s), so {segment:?} does not name one",
                            items.len()
                        ),
                        format!(
                            "use an index from 0 to {}; elements can only be added in the file",
                            items.len().saturating_sub(1)
                        ),
                    ));
                };
                path = path.index(index);
                Some(Node::of(items[index].get_ref()))
            }
            Some(Node::Leaf(type_name)) => {
                return Err((
                    format!("{path} is {type_name}, not a table"),
                    format!("override {path} itself, or change it into a table in the file"),
                ));
            }
        };
    }
    if !path.is_expression() {
        return Err((
            "names a key that cannot be overridden".to_owned(),
            "set it in the file".to_owned(),
        ));
    }
    Ok(path)
}

/// A value of the file, as far as resolving a name needs.
enum Node<'t> {
    Table(&'t DeTable<'t>),
    Array(&'t [Spanned<DeValue<'t>>]),
    Leaf(&'static str),
}

impl<'t> Node<'t> {
    fn of(value: &'t DeValue<'t>) -> Self {
        match value {
            DeValue::Table(table) => Self::Table(table),
            DeValue::Array(items) => Self::Array(items),
            DeValue::String(_) => Self::Leaf("a string"),
            DeValue::Integer(_) => Self::Leaf("an integer"),
            DeValue::Float(_) => Self::Leaf("a float"),
            DeValue::Boolean(_) => Self::Leaf("a boolean"),
            DeValue::Datetime(_) => Self::Leaf("a date-time"),
        }
    }
}

/// A syntax error: one error naming the file, line and column. Only the parser's message is kept,
/// not the source line its report quotes, which may hold a password.
fn syntax_error(text: &str, error: &toml::de::Error, name: &str) -> ConfigError {
    let fix = "fix the TOML syntax there (https://toml.io)";
    let message: Vec<&str> = error.message().lines().filter(|l| !l.trim().is_empty()).collect();
    let problem = format!("invalid TOML: {}", message.join("; "));
    match error.span() {
        Some(span) => {
            let (line, column) = line_column(text, span.start);
            ConfigError::new(format!("{name}:{line}:{column}"), problem, fix)
        }
        None => ConfigError::new(name, problem, fix),
    }
}

/// `text` read as a TOML value (`9`, `true`, `["a"]`, `"9"`), as the file would read it; `None`
/// when it is not one.
pub(super) fn toml_value(text: &str) -> Option<Value> {
    File::from_str(&format!("v = {text}"), FileFormat::Toml).collect().ok()?.remove("v")
}
