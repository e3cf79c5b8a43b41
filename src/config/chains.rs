//! Each route's middleware built into a [`Chain`] by the stage registry: the last step of
//! validation, so that a bad option or an impossible order is reported with the other problems.

use rangeway_middleware::chain::{Chain, ConfigError as StageConfigError, StageRegistry};

use super::check::Ctx;
use super::source::Path;
use crate::routes::MiddlewareSpec;

pub(super) fn check(v: &mut Ctx<'_>, route: &Path, specs: &[MiddlewareSpec]) {
    for (at, problem, fix) in chain(v.stages, route, specs).err().unwrap_or_default() {
        v.report(&at, problem, fix);
    }
}

/// The chain `registry` builds of the route's middleware, or every problem with it: where, what,
/// and the fix.
pub(super) fn chain(
    registry: &StageRegistry,
    route: &Path,
    specs: &[MiddlewareSpec],
) -> Result<Chain, Vec<(Path, String, String)>> {
    let at = route.key("middleware");
    let (mut problems, mut options) = (Vec::new(), Vec::with_capacity(specs.len()));
    for (index, spec) in specs.iter().enumerate() {
        let (stage, tables) = spec.stage_options();
        for key in tables {
            let problem = "is a table, which no stage option takes".to_owned();
            let fix = "write a string, number, boolean or list".to_owned();
            problems.push((at.index(index).key(key), problem, fix));
        }
        options.push(stage);
    }
    let stages = specs.iter().zip(&options).map(|(spec, options)| (spec.kind.as_str(), options));
    let found = match registry.build_chain(stages) {
        Ok(chain) if problems.is_empty() => return Ok(chain),
        Ok(_) => Vec::new(),
        Err(found) => found,
    };
    problems.extend(found.into_iter().map(|error| match error {
        // A stage's message is `problem — fix` when it has a fix.
        StageConfigError::Option { index, error } => {
            let message = error.message();
            let (problem, fix) = message
                .split_once(" — ")
                .unwrap_or((message, "see the stage's options in the README"));
            (option_path(&at.index(index), error.key()), problem.to_owned(), fix.to_owned())
        }
        other => (
            at.clone(),
            other.to_string(),
            "reorder the stages: checksums before encryption, encryption last".to_owned(),
        ),
    }));
    Err(problems)
}

/// The path of a stage's option: a stage names an item of a list option `name[index]`.
fn option_path(stage: &Path, key: &str) -> Path {
    let item = key.strip_suffix(']').and_then(|key| key.split_once('['));
    match item.and_then(|(name, index)| Some((name, index.parse().ok()?))) {
        Some((name, index)) => stage.key(name).index(index),
        None => stage.key(key),
    }
}
