//! Each route's middleware entries built into a [`Chain`] by the stage registry: the last step of
//! validation, so a bad option or an impossible order is reported with the other problems,
//! before anything listens.

use ::config::{Value, ValueKind};
use rangeway_middleware::chain::{
    Chain, ConfigError as StageConfigError, OptionValue, StageOptions, StageRegistry,
};

use super::{Config, ConfigError, ConfigErrors, MiddlewareSpec};

impl Config {
    /// The chain of every route, in route order, built by `registry`.
    ///
    /// # Errors
    /// Every bad option of every stage, and every order of stages that cannot work, at once.
    pub fn build_chains(&self, registry: &StageRegistry) -> Result<Vec<Chain>, ConfigErrors> {
        let mut chains = Vec::with_capacity(self.routes.len());
        let mut errors = Vec::new();
        for (index, route) in self.routes.iter().enumerate() {
            let options: Vec<StageOptions> =
                route.middleware.iter().map(|spec| stage_options(spec, &mut errors)).collect();
            let stages = route.middleware.iter().zip(&options).map(|(s, o)| (s.kind.as_str(), o));
            match registry.build_chain(stages) {
                Ok(chain) => chains.push(chain),
                Err(found) => errors.extend(found.into_iter().map(|error| match error {
                    StageConfigError::Option { index: stage, error } => split_fix(
                        format!("routes[{index}].middleware[{stage}].{}", error.key()),
                        error.message(),
                    ),
                    other => ConfigError::new(
                        format!("routes[{index}].middleware"),
                        other.to_string(),
                        "reorder the stages: checksums before encryption, encryption last",
                    ),
                })),
            }
        }
        if errors.is_empty() { Ok(chains) } else { Err(ConfigErrors::new(errors)) }
    }
}

/// A stage's message is `problem — fix` when it has a fix.
fn split_fix(path: String, message: &str) -> ConfigError {
    match message.split_once(" — ") {
        Some((problem, fix)) => ConfigError::new(path, problem, fix),
        None => ConfigError::new(path, message, "see the stage's options in the README"),
    }
}

fn stage_options(spec: &MiddlewareSpec, errors: &mut Vec<ConfigError>) -> StageOptions {
    let mut options = StageOptions::new();
    for (key, value) in &spec.options {
        match option_value(value) {
            Some(value) => {
                options.insert(key.clone(), value);
            }
            None => errors.push(ConfigError::new(
                format!("{}.{key}", spec.path),
                "is a table, which no stage option takes",
                "write a string, number, boolean or list",
            )),
        }
    }
    options
}

fn option_value(value: &Value) -> Option<OptionValue> {
    Some(match &value.kind {
        ValueKind::Boolean(b) => OptionValue::Bool(*b),
        ValueKind::I64(i) => OptionValue::Int(*i),
        ValueKind::U64(u) => OptionValue::Int(i64::try_from(*u).unwrap_or(i64::MAX)),
        ValueKind::I128(i) => OptionValue::Int(i64::try_from(*i).unwrap_or(i64::MAX)),
        ValueKind::U128(u) => OptionValue::Int(i64::try_from(*u).unwrap_or(i64::MAX)),
        ValueKind::Float(f) => OptionValue::Float(*f),
        ValueKind::String(s) => OptionValue::Str(s.clone()),
        ValueKind::Array(items) => {
            OptionValue::List(items.iter().map(option_value).collect::<Option<_>>()?)
        }
        ValueKind::Nil | ValueKind::Table(_) => return None,
    })
}
