//! The validation pass over the raw structs: typed values out of raw ones, each problem reported
//! with its key path and its fix, and the pass going on past it, so that it finds every mistake.
//! A check that reports a problem returns `None` ([`Got::Bad`]).

use std::borrow::Cow;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use ::config::{Value, ValueKind};
use rangeway_middleware::chain::StageRegistry;
use serde::de::DeserializeOwned;

use super::errors::ConfigError;
use super::raw::{Keys, Raw};
use super::source::{Env, Origins, Path, toml_value};
use crate::values::secret::{Secret, SecretVar};
use crate::values::units::{self, UnitError};
pub(super) use crate::values::{Problem, wrong};

/// `Some(T { .. })` when every field, an `Option` in scope or given after a colon, is `Some`: a
/// struct is never built of a value that was reported.
macro_rules! complete {
    ($ty:ident { $($field:ident $(: $value:expr)?),* $(,)? }) => {
        Some($ty { $($field: complete!(@ $field $(, $value)?)?),* })
    };
    (@ $field:ident) => { $field };
    (@ $field:ident, $value:expr) => { $value };
}
pub(super) use complete;

/// Reads keys of the raw table `$r` at `$at`, each bound to its own name: the [`Ctx`] reader
/// named, given the key's path and value and then the arguments (bounds, example), and what
/// follows (`.or(default)`, `.opt()`). One line a key: its bounds and default in one table.
macro_rules! read {
    ($v:ident, $at:expr, $r:ident; $($key:ident: $reader:ident($($arg:expr),*)
        $(.$then:ident($($then_arg:expr),*))*;)*) => {
        $(let $key = $v.$reader(&$at.key(stringify!($key)), &$r.$key, $($arg),*)
            $(.$then($($then_arg),*))*;)*
    };
}
pub(super) use read;

/// A value of a raw table: `None` when the key is not written.
pub(super) type Field<'v> = Option<&'v Value>;

pub(super) const fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

pub(super) const MS: Duration = Duration::from_millis(1);
pub(super) const DAY: u64 = 24 * 3600;

/// State of one validation pass.
pub(super) struct Ctx<'a> {
    pub(super) errors: Vec<ConfigError>,
    pub(super) env: &'a Env,
    pub(super) origins: &'a Origins<'a>,
    /// The middleware kinds there are, and what each accepts.
    pub(super) stages: &'a StageRegistry,
    /// How the file is named in the origins of middleware options.
    pub(super) file: &'a str,
}

/// A value checked: not written, written wrong (and reported), or good.
#[must_use]
pub(super) enum Got<T> {
    Absent,
    Bad,
    Good(T),
}

impl<T> Got<T> {
    /// The value, or `default` when it was not written; `None` when it was reported.
    pub(super) fn or(self, default: T) -> Option<T> {
        self.opt().map(|value| value.unwrap_or(default))
    }

    /// The value, when it was written and good.
    pub(super) fn ok(self) -> Option<T> {
        self.opt().flatten()
    }

    /// `Some(None)` when the value was not written.
    pub(super) fn opt(self) -> Option<Option<T>> {
        match self {
            Self::Absent => Some(None),
            Self::Bad => None,
            Self::Good(value) => Some(Some(value)),
        }
    }

    /// The value; "is missing" reported at `at`, with `fix`, when it was not written.
    pub(super) fn need(self, v: &mut Ctx<'_>, at: &Path, fix: impl Into<String>) -> Option<T> {
        match self {
            Self::Absent => v.fail(at, "is missing", fix),
            got => got.ok(),
        }
    }

    /// A further check of a good value, which reports its problem and returns `None`.
    pub(super) fn then<U>(self, f: impl FnOnce(T) -> Option<U>) -> Got<U> {
        match self {
            Self::Absent => Got::Absent,
            Self::Bad => Got::Bad,
            Self::Good(value) => f(value).map_or(Got::Bad, Got::Good),
        }
    }
}

impl Ctx<'_> {
    /// Records a problem with the value at `at`: naming the variable that set it, since that is
    /// what the user has to change, or else where it is in the file.
    pub(super) fn report(&mut self, at: &Path, problem: impl Into<String>, fix: impl Into<String>) {
        let mut error = ConfigError::new(at.to_string(), problem, fix);
        match self.origins.var(at) {
            Some(var) => error.problem.push_str(&format!(" (set by {var})")),
            None => error.position = self.origins.position(at),
        }
        self.errors.push(error);
    }

    /// [`Ctx::report`], for a check that cannot go on.
    pub(super) fn fail<T>(
        &mut self,
        at: &Path,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Option<T> {
        self.report(at, problem, fix);
        None
    }

    fn bad<T>(&mut self, at: &Path, problem: impl Into<String>, fix: impl Into<String>) -> Got<T> {
        self.report(at, problem, fix);
        Got::Bad
    }

    /// The value of `checked`, or its problem reported.
    pub(super) fn check<T>(&mut self, at: &Path, checked: Result<T, Problem>) -> Option<T> {
        checked.map_err(|(problem, fix)| self.report(at, problem, fix)).ok()
    }

    pub(super) fn set_by_env(&self, at: &Path) -> bool {
        self.origins.var(at).is_some()
    }

    /// `value`, read as the file would read it when a variable set it as text (`9` a number,
    /// `["a"]` a list, `sha256` the string it says).
    pub(super) fn scalar<'v>(&self, at: &Path, value: &'v Value) -> Cow<'v, Value> {
        match &value.kind {
            ValueKind::String(text) if self.set_by_env(at) => {
                toml_value(text).map_or(Cow::Borrowed(value), Cow::Owned)
            }
            _ => Cow::Borrowed(value),
        }
    }

    /// `value` as the middleware registry gets it, read as [`Ctx::scalar`] does, its origin
    /// naming the file or the variable.
    pub(super) fn option(&self, at: &Path, value: &Value) -> Value {
        let origin = self.origins.var(at).map(|var| format!("environment variable {var}"));
        with_origin(self.scalar(at, value).into_owned(), origin.as_deref().unwrap_or(self.file))
    }

    /// What `raw` read, or "expected `what`" reported with `fix`. The keys it does not know are
    /// reported, with the nearest known one when one is close.
    pub(super) fn shaped<'r, T: Keys>(
        &mut self,
        at: &Path,
        raw: &'r Raw<T>,
        what: &str,
        fix: &str,
    ) -> Option<&'r T> {
        let read = match &raw.read {
            Ok(read) => read,
            Err(value) => {
                return self.fail(at, format!("expected {what}, found {}", type_name(value)), fix);
            }
        };
        let known = T::KEYS.unwrap_or_default();
        for key in &raw.unknown {
            let fix = match suggest(key, known.iter().copied()) {
                Some(near) => format!("did you mean `{near}`?"),
                None => format!("remove it; {} takes: {}", at.header(), known.join(", ")),
            };
            self.report(&at.key(key), format!("unknown key `{key}`"), fix);
        }
        Some(read)
    }

    /// [`Ctx::shaped`] for a table; `example` is how to write it.
    pub(super) fn table<'r, T: Keys>(
        &mut self,
        at: &Path,
        raw: &'r Raw<T>,
        example: &str,
    ) -> Option<&'r T> {
        self.shaped(at, raw, "a table", &format!("write it as a table, e.g. {example}"))
    }

    fn wrong_type<T>(&mut self, at: &Path, value: &Value, expected: &str, example: &str) -> Got<T> {
        let problem = format!("expected {expected}, found {}", type_name(value));
        self.bad(at, problem, format!("write {} = {example}", at.last_key()))
    }

    /// What `check` makes of the table (or value) at `at`, when it is written.
    pub(super) fn nested<R, T>(
        &mut self,
        at: &Path,
        raw: &Option<R>,
        check: impl FnOnce(&mut Self, &Path, &R) -> Option<T>,
    ) -> Got<T> {
        let Some(raw) = raw else { return Got::Absent };
        check(self, at, raw).map_or(Got::Bad, Got::Good)
    }

    /// A key that is `true` (`T`'s defaults), `false` (off) or a table for `table` to check; `on`
    /// when it is not written. From a variable, the bare word.
    pub(super) fn switch<T: Default, R: DeserializeOwned + Keys>(
        &mut self,
        at: &Path,
        value: &Option<Value>,
        on: bool,
        example: &str,
        table: impl FnOnce(&mut Self, &Path, &R) -> Option<T>,
    ) -> Option<Option<T>> {
        let Some(value) = value else { return Some(on.then(T::default)) };
        if matches!(value.kind, ValueKind::Boolean(_)) || self.set_by_env(at) {
            return self.boolean(at, value).ok().map(|on| on.then(T::default));
        }
        let raw = Raw::<R>::from(value.clone());
        let read = self.table(at, &raw, example)?;
        table(self, at, read).map(Some)
    }

    /// A string; `example` (TOML syntax, quotes included) is shown when it is something else.
    pub(super) fn string<'v>(
        &mut self,
        at: &Path,
        value: impl Into<Field<'v>>,
        example: &str,
    ) -> Got<String> {
        match value.into() {
            None => Got::Absent,
            Some(Value { kind: ValueKind::String(text), .. }) => Got::Good(text.clone()),
            Some(value) => self.wrong_type(at, value, "a string", example),
        }
    }

    pub(super) fn parsed<'v, T>(
        &mut self,
        at: &Path,
        value: impl Into<Field<'v>>,
        example: &str,
        parse: impl FnOnce(&str) -> Result<T, Problem>,
    ) -> Got<T> {
        self.string(at, value, example).then(|text| self.check(at, parse(&text)))
    }

    /// `true` or `false`; from a variable, the bare word.
    pub(super) fn boolean<'v>(&mut self, at: &Path, value: impl Into<Field<'v>>) -> Got<bool> {
        let Some(value) = value.into() else { return Got::Absent };
        match &value.kind {
            ValueKind::Boolean(on) => Got::Good(*on),
            ValueKind::String(text) if self.set_by_env(at) => match text.trim() {
                "true" => Got::Good(true),
                "false" => Got::Good(false),
                _ => self.bad(at, "expected true or false", "set it to true or false"),
            },
            _ => self.wrong_type(at, value, "a boolean", "true (or false), without quotes"),
        }
    }

    /// An integer within `range`, as the type the config stores it in.
    pub(super) fn integer<'v, T>(
        &mut self,
        at: &Path,
        value: impl Into<Field<'v>>,
        range: RangeInclusive<T>,
        example: &str,
    ) -> Got<T>
    where
        T: TryFrom<i64> + PartialOrd + Display,
    {
        let Some(value) = value.into() else { return Got::Absent };
        let number = match &value.kind {
            ValueKind::I64(number) => *number,
            ValueKind::String(text) if self.set_by_env(at) => match text.trim().parse() {
                Ok(number) => number,
                Err(_) => {
                    let fix = format!("set it to a whole number, e.g. {example}");
                    return self.bad(at, "expected an integer", fix);
                }
            },
            _ => return self.wrong_type(at, value, "an integer", example),
        };
        match T::try_from(number) {
            Ok(n) if range.contains(&n) => Got::Good(n),
            _ => self.bad(
                at,
                format!("{number} is out of range"),
                format!("use a number from {} to {}", range.start(), range.end()),
            ),
        }
    }

    /// A share from 0 to 1 (`0.01`; an integer 0 or 1 too).
    pub(super) fn ratio<'v>(&mut self, at: &Path, value: impl Into<Field<'v>>) -> Got<f64> {
        let Some(value) = value.into() else { return Got::Absent };
        let number = match &value.kind {
            ValueKind::Float(number) => *number,
            ValueKind::I64(number) => *number as f64,
            ValueKind::String(text) if self.set_by_env(at) => {
                text.trim().parse().unwrap_or(f64::NAN)
            }
            _ => return self.wrong_type(at, value, "a number from 0 to 1", "0.01"),
        };
        if (0.0..=1.0).contains(&number) {
            return Got::Good(number);
        }
        let fix = format!("write {} = 0.01 (1 %), from 0 (none) to 1 (all)", at.last_key());
        self.bad(at, "is not a share from 0 to 1", fix)
    }

    /// A duration written with a unit (`"30s"`), within `range`.
    pub(super) fn duration<'v>(
        &mut self,
        at: &Path,
        value: impl Into<Field<'v>>,
        range: RangeInclusive<Duration>,
    ) -> Got<Duration> {
        let Some(value) = value.into() else { return Got::Absent };
        let parsed = match &value.kind {
            ValueKind::String(text) => units::parse_duration(text),
            ValueKind::I64(_) | ValueKind::Float(_) => Err(units::bare_number(&value.to_string())),
            _ => return self.wrong_type(at, value, "a duration string", "\"30s\""),
        };
        match parsed.and_then(|d| units::duration_within(d, &range)) {
            Ok(d) => Got::Good(d),
            Err(e) => self.bad(at, e.problem, e.fix),
        }
    }

    /// A size in bytes within `range`: a whole number, or a string with a unit (`"32KiB"`).
    pub(super) fn size<'v>(
        &mut self,
        at: &Path,
        value: impl Into<Field<'v>>,
        range: RangeInclusive<u64>,
        example: &str,
    ) -> Got<u64> {
        let Some(value) = value.into() else { return Got::Absent };
        let parsed = match &value.kind {
            ValueKind::I64(n) => u64::try_from(*n).map_err(|_| {
                UnitError::new(format!("{n} is not a size"), "use a whole number of bytes")
            }),
            ValueKind::String(text) => units::parse_size(text),
            _ => return self.wrong_type(at, value, "a size", example),
        };
        match parsed.and_then(|size| units::size_within(size, &range)) {
            Ok(size) => Got::Good(size),
            Err(e) => self.bad(at, e.problem, e.fix),
        }
    }

    /// One of `choices` by its name; any other is "not `what`", with `fix`.
    pub(super) fn choice<'v, T: Copy>(
        &mut self,
        at: &Path,
        value: impl Into<Field<'v>>,
        example: &str,
        choices: &[(&str, T)],
        what: &str,
        fix: &str,
    ) -> Got<T> {
        self.parsed(at, value, example, |name| {
            let known = choices.iter().find(|(known, _)| *known == name);
            let refused = || (format!("{name:?} is not {what}"), fix.to_owned());
            known.map(|&(_, choice)| choice).ok_or_else(refused)
        })
    }

    /// Each item of a list of strings, made a `T` by `parse`; every bad item is reported at its
    /// own path. `item` says what one is (`"a string"`), `example` the key's value as a whole.
    pub(super) fn strings<'v, T>(
        &mut self,
        at: &Path,
        value: impl Into<Field<'v>>,
        item: &str,
        example: &str,
        mut parse: impl FnMut(&str) -> Result<T, Problem>,
    ) -> Got<Vec<T>> {
        let Some(value) = value.into() else { return Got::Absent };
        let ValueKind::Array(items) = &value.kind else {
            let expected = format!("an array of {}s", item.trim_start_matches("a "));
            return self.wrong_type(at, value, &expected, example);
        };
        let mut all = Some(Vec::new());
        for (index, value) in items.iter().enumerate() {
            let at = at.index(index);
            let read = match &value.kind {
                ValueKind::String(text) => self.check(&at, parse(text)),
                _ => self.wrong_type::<T>(&at, value, item, example).ok(),
            };
            all = push(all, read);
        }
        all.map_or(Got::Bad, Got::Good)
    }

    /// The environment variable named by `value` (a `*_env` key), and the secret it holds.
    pub(super) fn secret(
        &mut self,
        at: &Path,
        value: &Value,
        key: &SecretVar<'_>,
    ) -> Option<(String, Secret)> {
        let example = key.example.split_once(" = ").map_or(key.example, |(_, value)| value);
        let name = self.string(at, value, example).ok()?;
        let secret = self.check(at, key.read(&name, self.env.vars.get(&name)))?;
        Some((name, secret))
    }
}

/// A folder, or a path where one can be created (the server creates it on start); with
/// `inspect`, one whose metadata cannot be read is refused too.
pub(super) fn folder(dir: &str, fix: &str, inspect: bool) -> Result<PathBuf, Problem> {
    match std::fs::metadata(dir) {
        _ if dir.is_empty() || dir.contains('\0') => wrong("is not a usable path", fix),
        Ok(meta) if !meta.is_dir() => wrong(format!("{dir:?} exists but is not a directory"), fix),
        Err(e) if inspect && e.kind() != std::io::ErrorKind::NotFound => {
            wrong(format!("{dir:?} cannot be inspected: {e}"), fix)
        }
        _ => Ok(dir.into()),
    }
}

/// `all` and `item`, while every item so far was good.
pub(super) fn push<T, C: Extend<T>>(all: Option<C>, item: Option<T>) -> Option<C> {
    let (mut all, item) = (all?, item?);
    all.extend([item]);
    Some(all)
}

/// "a string", "an integer", ... for type errors. Never the value itself: it may be a secret.
pub(super) fn type_name(value: &Value) -> &'static str {
    match value.kind {
        ValueKind::Nil => "nothing",
        ValueKind::Boolean(_) => "a boolean",
        ValueKind::I64(_) | ValueKind::I128(_) | ValueKind::U64(_) | ValueKind::U128(_) => {
            "an integer"
        }
        ValueKind::Float(_) => "a float",
        ValueKind::String(_) => "a string",
        ValueKind::Array(_) => "an array",
        ValueKind::Table(_) => "a table",
    }
}

/// `value` and every value in it, as set by `origin`.
fn with_origin(value: Value, origin: &str) -> Value {
    let kind = match value.kind {
        ValueKind::Array(items) => {
            ValueKind::Array(items.into_iter().map(|v| with_origin(v, origin)).collect())
        }
        ValueKind::Table(map) => {
            ValueKind::Table(map.into_iter().map(|(k, v)| (k, with_origin(v, origin))).collect())
        }
        kind => kind,
    };
    Value::new(Some(&origin.to_owned()), kind)
}

/// `fix`, after the one of `known` nearest `name` when that is close enough to be a typo.
pub(super) fn did_you_mean<'c>(
    name: &str,
    known: impl IntoIterator<Item = &'c str>,
    fix: String,
) -> String {
    match suggest(name, known) {
        Some(near) => format!("did you mean \"{near}\"? Otherwise {fix}"),
        None => fix,
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
        .map(|c| (strsim::levenshtein(&word.to_lowercase(), &c.to_lowercase()), c))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}
