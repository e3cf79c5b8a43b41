//! Each route's middleware entries built into a [`Chain`] by the stage registry: the last step of
//! validation, so a bad option or an impossible order is reported with the other problems,
//! before anything listens.

use ::config::{Value, ValueKind};
use rangeway_middleware::chain::{
    Chain, ConfigError as StageConfigError, OptionValue, StageOptions, StageRegistry,
};

use super::read::Ctx;
use super::{Config, ConfigError, ConfigErrors, MiddlewareSpec};

impl Config {
    /// The chain of every route, in route order, built by `registry`.
    ///
    /// # Errors
    /// Every bad option of every stage, and every order of stages that cannot work, at once
    /// (which a config loaded with the same registry has none of).
    pub fn build_chains(&self, registry: &StageRegistry) -> Result<Vec<Chain>, ConfigErrors> {
        let mut chains = Vec::with_capacity(self.routes.len());
        let mut errors = Vec::new();
        for (index, route) in self.routes.iter().enumerate() {
            match chain(registry, &format!("routes[{index}]"), &route.middleware) {
                Ok(chain) => chains.push(chain),
                Err(found) => errors.extend(found),
            }
        }
        if errors.is_empty() { Ok(chains) } else { Err(ConfigErrors::new(errors)) }
    }
}

/// Reports what is wrong with the middleware of the route at `route` (`routes[i]`).
pub(super) fn check(ctx: &mut Ctx<'_>, route: &str, specs: &[MiddlewareSpec]) {
    if let Err(errors) = chain(ctx.stages, route, specs) {
        for error in errors {
            ctx.push(error);
        }
    }
}

/// The chain `registry` builds from a route's middleware, or every problem with it.
fn chain(
    registry: &StageRegistry,
    route: &str,
    specs: &[MiddlewareSpec],
) -> Result<Chain, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let options: Vec<StageOptions> = specs.iter().map(|s| stage_options(s, &mut errors)).collect();
    let stages = specs.iter().zip(&options).map(|(spec, options)| (spec.kind.as_str(), options));
    match registry.build_chain(stages) {
        Ok(chain) if errors.is_empty() => return Ok(chain),
        Ok(_) => {}
        Err(found) => errors.extend(found.into_iter().map(|error| match error {
            StageConfigError::Option { index: stage, error } => {
                split_fix(format!("{route}.middleware[{stage}].{}", error.key()), error.message())
            }
            other => ConfigError::new(
                format!("{route}.middleware"),
                other.to_string(),
                "reorder the stages: checksums before encryption, encryption last",
            ),
        })),
    }
    Err(errors)
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
