//! A stage's configuration options as plain values, and a reader that validates them while
//! collecting every problem, so that a bad configuration is reported whole rather than one key at a
//! time.
//!
//! Deliberately serde-free: the proxy's config loader converts its TOML values into
//! [`OptionValue`]s, and stages (built-in or a library user's) never depend on its format.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One option value, as a config file states it.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    List(Vec<OptionValue>),
}

impl OptionValue {
    /// The value's type, as error messages name it.
    fn kind(&self) -> &'static str {
        match self {
            OptionValue::Str(_) => "a string",
            OptionValue::Int(_) => "an integer",
            OptionValue::Float(_) => "a float",
            OptionValue::Bool(_) => "a boolean",
            OptionValue::List(_) => "a list",
        }
    }
}

impl From<&str> for OptionValue {
    fn from(value: &str) -> Self {
        OptionValue::Str(value.to_owned())
    }
}

impl From<String> for OptionValue {
    fn from(value: String) -> Self {
        OptionValue::Str(value)
    }
}

impl From<i64> for OptionValue {
    fn from(value: i64) -> Self {
        OptionValue::Int(value)
    }
}

impl From<f64> for OptionValue {
    fn from(value: f64) -> Self {
        OptionValue::Float(value)
    }
}

impl From<bool> for OptionValue {
    fn from(value: bool) -> Self {
        OptionValue::Bool(value)
    }
}

impl<T: Into<OptionValue>> From<Vec<T>> for OptionValue {
    fn from(values: Vec<T>) -> Self {
        OptionValue::List(values.into_iter().map(Into::into).collect())
    }
}

/// The options of one stage: every key of its config table but `kind`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StageOptions {
    values: BTreeMap<String, OptionValue>,
}

impl StageOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// These options with `key` set to `value`.
    pub fn with(mut self, key: impl Into<String>, value: impl Into<OptionValue>) -> Self {
        self.insert(key, value);
        self
    }

    /// Sets `key`, returning the value it had.
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<OptionValue>,
    ) -> Option<OptionValue> {
        self.values.insert(key.into(), value.into())
    }

    pub fn get(&self, key: &str) -> Option<&OptionValue> {
        self.values.get(key)
    }

    /// Every option, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &OptionValue)> {
        self.values.iter().map(|(key, value)| (key.as_str(), value))
    }

    /// A reader to validate these options with.
    pub fn reader(&self) -> OptionReader<'_> {
        OptionReader { options: self, known: BTreeSet::new(), errors: Vec::new() }
    }
}

impl<K: Into<String>, V: Into<OptionValue>> FromIterator<(K, V)> for StageOptions {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self { values: iter.into_iter().map(|(key, value)| (key.into(), value.into())).collect() }
    }
}

/// A bad option: its key (with an index for a list item, e.g. `algorithms[1]`) and what is wrong,
/// with the fix where there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct OptionError {
    key: String,
    message: String,
}

impl OptionError {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self { key: key.into(), message: message.into() }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Reads typed options, recording every problem rather than stopping at the first.
///
/// Each getter returns `None` both when the key is absent and when its value is unusable (then an
/// error is recorded), so a builder takes its default and goes on to check the other keys;
/// [`finish`](Self::finish) then reports everything at once, including keys no getter asked for.
#[derive(Debug)]
pub struct OptionReader<'a> {
    options: &'a StageOptions,
    known: BTreeSet<String>,
    errors: Vec<OptionError>,
}

impl<'a> OptionReader<'a> {
    /// Records a problem of the builder's own with `key`.
    pub fn error(&mut self, key: impl Into<String>, message: impl fmt::Display) {
        self.errors.push(OptionError::new(key, message.to_string()));
    }

    pub fn str(&mut self, key: &str) -> Option<&'a str> {
        match self.value(key)? {
            OptionValue::Str(value) => Some(value),
            other => self.mismatch(key, "a string", other),
        }
    }

    pub fn bool(&mut self, key: &str) -> Option<bool> {
        match self.value(key)? {
            OptionValue::Bool(value) => Some(*value),
            other => self.mismatch(key, "a boolean", other),
        }
    }

    pub fn int(&mut self, key: &str) -> Option<i64> {
        match self.value(key)? {
            OptionValue::Int(value) => Some(*value),
            other => self.mismatch(key, "an integer", other),
        }
    }

    /// A non-negative integer, e.g. a size in bytes.
    pub fn u64(&mut self, key: &str) -> Option<u64> {
        match self.value(key)? {
            &OptionValue::Int(value) => match u64::try_from(value) {
                Ok(value) => Some(value),
                Err(_) => {
                    self.error(key, format_args!("expected a non-negative integer, found {value}"));
                    None
                }
            },
            other => self.mismatch(key, "a non-negative integer", other),
        }
    }

    /// A finite number; an integer is taken as one (TOML writes `1`, not only `1.0`).
    pub fn float(&mut self, key: &str) -> Option<f64> {
        let value = match self.value(key)? {
            &OptionValue::Float(value) => value,
            // Exact for every integer a config would hold; rounding beyond 2^53 is acceptable.
            &OptionValue::Int(value) => value as f64,
            other => return self.mismatch(key, "a number", other),
        };
        if value.is_finite() {
            Some(value)
        } else {
            self.error(key, format_args!("expected a finite number, found {value}"));
            None
        }
    }

    /// A list of strings; a bad item is reported under its index, e.g. `algorithms[1]`.
    pub fn str_list(&mut self, key: &str) -> Option<Vec<&'a str>> {
        let items = match self.value(key)? {
            OptionValue::List(items) => items,
            other => return self.mismatch(key, "a list of strings", other),
        };
        let mut strings = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            match item {
                OptionValue::Str(value) => strings.push(value.as_str()),
                other => self.error(
                    format!("{key}[{index}]"),
                    format_args!("expected a string, found {}", other.kind()),
                ),
            }
        }
        // Any bad item makes the list unusable: a default would hide that an item was dropped.
        (strings.len() == items.len()).then_some(strings)
    }

    /// Ends reading: every problem recorded, plus one for each key no getter asked for.
    pub fn finish(mut self) -> Result<(), Vec<OptionError>> {
        let known = if self.known.is_empty() {
            "this kind takes no options".to_owned()
        } else {
            let names: Vec<String> = self.known.iter().map(|key| format!("`{key}`")).collect();
            format!("known keys: {}", names.join(", "))
        };
        for (key, _) in self.options.iter() {
            if !self.known.contains(key) {
                self.errors.push(OptionError::new(key, format!("unknown key `{key}` — {known}")));
            }
        }
        if self.errors.is_empty() { Ok(()) } else { Err(self.errors) }
    }

    fn value(&mut self, key: &str) -> Option<&'a OptionValue> {
        self.known.insert(key.to_owned());
        self.options.get(key)
    }

    fn mismatch<T>(&mut self, key: &str, wanted: &str, found: &OptionValue) -> Option<T> {
        self.error(key, format_args!("expected {wanted}, found {}", found.kind()));
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getters_read_their_types() {
        let options = StageOptions::new()
            .with("name", "x")
            .with("on", true)
            .with("level", 6)
            .with("ratio", 0.5)
            .with("whole", 2)
            .with("list", vec!["a", "b"]);
        let mut reader = options.reader();
        assert_eq!(reader.str("name"), Some("x"));
        assert_eq!(reader.bool("on"), Some(true));
        assert_eq!(reader.int("level"), Some(6));
        assert_eq!(reader.u64("level"), Some(6));
        assert_eq!(reader.float("ratio"), Some(0.5));
        assert_eq!(reader.float("whole"), Some(2.0));
        assert_eq!(reader.str_list("list"), Some(vec!["a", "b"]));
        assert_eq!(reader.str("absent"), None);
        assert_eq!(reader.finish(), Ok(()));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let options: StageOptions = [
            ("name", OptionValue::Int(1)),
            ("size", OptionValue::Int(-1)),
            ("ratio", OptionValue::Float(f64::NAN)),
            ("list", OptionValue::from(vec![OptionValue::from("a"), OptionValue::Bool(true)])),
            ("typo", OptionValue::Bool(false)),
        ]
        .into_iter()
        .collect();
        let mut reader = options.reader();
        assert_eq!(reader.str("name"), None);
        assert_eq!(reader.u64("size"), None);
        assert_eq!(reader.float("ratio"), None);
        assert_eq!(reader.str_list("list"), None);
        let errors: Vec<String> =
            reader.finish().unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "name: expected a string, found an integer",
                "size: expected a non-negative integer, found -1",
                "ratio: expected a finite number, found NaN",
                "list[1]: expected a string, found a boolean",
                "typo: unknown key `typo` — known keys: `list`, `name`, `ratio`, `size`",
            ]
        );
    }

    #[test]
    fn a_kind_without_options_says_so() {
        let options = StageOptions::new().with("level", 1);
        let errors = options.reader().finish().unwrap_err();
        assert_eq!(errors[0].key(), "level");
        assert_eq!(errors[0].message(), "unknown key `level` — this kind takes no options");
    }
}
