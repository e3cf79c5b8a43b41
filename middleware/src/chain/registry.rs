//! Stage kinds by name: the built-in ones, and any a library user adds before the server starts.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::{BuildError, Chain, OptionError, StageFactory, StageOptions};

/// Builds a stage factory from a route's options for its kind, reporting every bad option.
pub type StageBuilder =
    dyn Fn(&StageOptions) -> Result<Arc<dyn StageFactory>, Vec<OptionError>> + Send + Sync;

/// Why a kind cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    #[error("middleware kind {0:?} is already registered")]
    Duplicate(String),
    #[error(
        "middleware kind {0:?} is not a valid name: use 1 to 64 lowercase letters, digits, '-' \
         or '_', starting with a letter"
    )]
    InvalidKind(String),
}

/// A problem with a route's middleware list, with its place in the list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A bad option (or kind) of the stage at `index`.
    #[error("middleware[{index}].{error}")]
    Option { index: usize, error: OptionError },
    /// Stages that each build but do not work together.
    #[error(transparent)]
    Chain(#[from] BuildError),
}

/// The stage kinds a route's `middleware` list can name.
pub struct StageRegistry {
    builders: BTreeMap<String, Box<StageBuilder>>,
}

impl fmt::Debug for StageRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StageRegistry").field("kinds", &self.builders.keys()).finish()
    }
}

impl Default for StageRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl StageRegistry {
    /// A registry of the built-in kinds: `aes128gcm`, `checksum` and `gzip`.
    pub fn new() -> Self {
        let mut registry = Self::empty();
        registry.builders.insert(
            crate::aes128gcm::KIND.to_owned(),
            Box::new(|options: &StageOptions| {
                crate::aes128gcm::Aes128GcmFactory::from_options(options)
                    .map(|factory| Arc::new(factory) as Arc<dyn StageFactory>)
            }),
        );
        registry.builders.insert(
            crate::checksum::KIND.to_owned(),
            Box::new(|options: &StageOptions| {
                crate::checksum::ChecksumFactory::from_options(options)
                    .map(|factory| Arc::new(factory) as Arc<dyn StageFactory>)
            }),
        );
        registry.builders.insert(
            crate::gzip::KIND.to_owned(),
            Box::new(|options: &StageOptions| {
                crate::gzip::GzipFactory::from_options(options)
                    .map(|factory| Arc::new(factory) as Arc<dyn StageFactory>)
            }),
        );
        registry
    }

    /// A registry of no kinds.
    pub fn empty() -> Self {
        Self { builders: BTreeMap::new() }
    }

    /// Adds a kind, built from a route's options by `builder`.
    pub fn register<F>(&mut self, kind: &str, builder: F) -> Result<(), RegistryError>
    where
        F: Fn(&StageOptions) -> Result<Arc<dyn StageFactory>, Vec<OptionError>>
            + Send
            + Sync
            + 'static,
    {
        let valid = kind.len() <= 64
            && kind.starts_with(|c: char| c.is_ascii_lowercase())
            && kind
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_".contains(&b));
        if !valid {
            return Err(RegistryError::InvalidKind(kind.to_owned()));
        }
        if self.builders.contains_key(kind) {
            return Err(RegistryError::Duplicate(kind.to_owned()));
        }
        self.builders.insert(kind.to_owned(), Box::new(builder));
        Ok(())
    }

    /// The registered kinds, in name order.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.builders.keys().map(String::as_str)
    }

    /// Builds one stage. An unknown kind is reported as a bad `kind` option.
    pub fn build(
        &self,
        kind: &str,
        options: &StageOptions,
    ) -> Result<Arc<dyn StageFactory>, Vec<OptionError>> {
        match self.builders.get(kind) {
            // Error messages name a stage by its own kind(); one that disagrees with the name
            // it was registered under would be reported under a name no config holds.
            Some(builder) => builder(options).and_then(|factory| {
                if factory.kind() == kind {
                    Ok(factory)
                } else {
                    Err(vec![OptionError::new(
                        "kind",
                        format!(
                            "kind {kind:?} builds a stage that calls itself {:?} — register it \
                             under the name its kind() returns",
                            factory.kind()
                        ),
                    )])
                }
            }),
            None => {
                let known: Vec<String> = self.kinds().map(|kind| format!("{kind:?}")).collect();
                let fix = if known.is_empty() {
                    "no kinds are registered".to_owned()
                } else {
                    format!("use {}", known.join(", "))
                };
                Err(vec![OptionError::new("kind", format!("unknown kind {kind:?} — {fix}"))])
            }
        }
    }

    /// Builds a route's chain from its `middleware` list of `(kind, options)`, reporting every
    /// bad kind and option of every stage at once, each under `middleware[i]`.
    pub fn build_chain<'a, I>(&self, stages: I) -> Result<Chain, Vec<ConfigError>>
    where
        I: IntoIterator<Item = (&'a str, &'a StageOptions)>,
    {
        let mut factories = Vec::new();
        let mut errors = Vec::new();
        for (index, (kind, options)) in stages.into_iter().enumerate() {
            match self.build(kind, options) {
                Ok(factory) => factories.push(factory),
                Err(bad) => {
                    errors.extend(bad.into_iter().map(|error| ConfigError::Option { index, error }))
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Chain::new(factories).map_err(|error| vec![error.into()])
    }
}
