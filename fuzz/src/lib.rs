//! What the config targets check of a load, shared so that the raw-text target and the grammar
//! target hold the loader to the same promises.

use config::{Value, ValueKind};
use rangeway::config::{Config, ConfigErrors};
use rangeway::routes::RouteConfig;
use rangeway_middleware::chain::{Chain, StageRegistry};

/// Loads `text` as `rangeway check` does (the config, then every route's chain) and asserts what
/// the loader promises: no panic; a refusal names at least one problem, each with a place, a
/// problem and a fix, and a second load refuses it with the same problems in the same order; an
/// accepted text loads again to the same configuration, whose chains build twice alike.
///
/// # Errors
/// The problems, when the text is refused.
pub fn check_config_text(text: &str) -> Result<Config, ConfigErrors> {
    let registry = StageRegistry::new();
    let first = Config::from_toml_str(text, &registry);
    let second = Config::from_toml_str(text, &registry);
    let errors = match (first, second) {
        (Ok(first), Ok(second)) => {
            assert_same_config(&first, &second);
            match (first.build_chains(&registry), second.build_chains(&registry)) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.len(), first.routes.len(), "one chain per route");
                    let identities = |chains: &[Chain]| -> Vec<String> {
                        chains.iter().map(|chain| chain.identity().to_owned()).collect()
                    };
                    assert_eq!(identities(&a), identities(&b), "chains built twice differ");
                    return Ok(first);
                }
                (a, b) => panic!(
                    "a config loaded with the registry failed to build its chains: {:?} {:?}",
                    a.err(),
                    b.err()
                ),
            }
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "a second load reports other problems");
            a
        }
        (a, b) => panic!("the same text loaded once {:?} and once {:?}", a.is_ok(), b.is_ok()),
    };
    assert!(!errors.errors().is_empty(), "a refusal without a problem");
    for error in errors.errors() {
        assert!(!error.path.is_empty(), "no place: {error:?}");
        assert!(!error.problem.is_empty(), "no problem: {error:?}");
        assert!(!error.fix.is_empty(), "no fix: {error:?}");
    }
    Err(errors)
}

/// `Config` has no `PartialEq` (its sections hold secrets and `Duration`s compared by `Debug`
/// here), and middleware options are `config::Value`s, whose tables are hash maps (their `Debug`
/// order differs between two loads) and whose floats may be NaN (never equal to itself).
fn assert_same_config(a: &Config, b: &Config) {
    assert_eq!(format!("{:?}", a.server), format!("{:?}", b.server));
    assert_eq!(format!("{:?}", a.state), format!("{:?}", b.state));
    assert_eq!(a.upstreams, b.upstreams);
    assert_eq!(a.routes.len(), b.routes.len());
    for (a, b) in a.routes.iter().zip(&b.routes) {
        assert_eq!(canonical_route(a), canonical_route(b));
    }
}

fn canonical_route(route: &RouteConfig) -> String {
    let mut out = format!(
        "{:?} {:?} {:?} {}",
        route.host, route.path_prefix, route.upstream, route.strip_prefix
    );
    for spec in &route.middleware {
        out.push_str(&format!(" [{} at {}", spec.kind, spec.path));
        for (key, value) in &spec.options {
            out.push_str(&format!(" {key:?}={}", canonical_value(value)));
        }
        out.push(']');
    }
    out
}

fn canonical_value(value: &Value) -> String {
    let kind = match &value.kind {
        ValueKind::Float(f) => format!("f{:x}", f.to_bits()),
        ValueKind::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical_value).collect();
            format!("[{}]", items.join(","))
        }
        ValueKind::Table(map) => {
            let mut entries: Vec<String> =
                map.iter().map(|(k, v)| format!("{k:?}={}", canonical_value(v))).collect();
            entries.sort_unstable();
            format!("{{{}}}", entries.join(","))
        }
        other => format!("{other:?}"),
    };
    format!("{kind}@{:?}", value.origin())
}
