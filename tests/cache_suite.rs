//! The HTTP Working Group's caching tests (npm `http-cache-tests`, the suite behind
//! cache-tests.fyi) through rangeway with its cache on, run by scripts/cache-tests.sh with the
//! suite's own origin server and runner: every required test listed in
//! tests/cache_suite/passing.txt still passes. docs/cache-tests.md explains the counting.

mod support;

use std::collections::BTreeSet;
use std::process::Command;

use support::tmp::TempDir;

const PASSING: &str = include_str!("cache_suite/passing.txt");

#[test]
fn the_required_tests_passed_before_still_pass() {
    let dir = TempDir::new("cache-suite");
    let passed_file = dir.join("passed.txt");
    let run = Command::new("bash")
        .arg("scripts/cache-tests.sh")
        .env("CACHE", "on")
        .env("RANGEWAY_BIN", env!("CARGO_BIN_EXE_rangeway"))
        .env("RESULTS", dir.join("cache-on.json"))
        .env("PASSED", &passed_file)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run scripts/cache-tests.sh");
    assert!(
        run.status.success(),
        "scripts/cache-tests.sh failed ({}):\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let passed = std::fs::read_to_string(&passed_file).expect("the list of passed tests");
    let passed: BTreeSet<&str> = passed.lines().collect();
    let listed: BTreeSet<&str> =
        PASSING.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let lost: Vec<_> = listed.difference(&passed).collect();
    let gained: Vec<_> = passed.difference(&listed).collect();
    if !gained.is_empty() {
        eprintln!("newly passed (add them to tests/cache_suite/passing.txt): {gained:?}");
    }
    assert!(
        lost.is_empty(),
        "{} required tests of the suite no longer pass: {lost:?} ({} pass now; \
         `CACHE_TESTS_ID=<id> scripts/cache-tests.sh` shows one test's requests and responses)",
        lost.len(),
        passed.len()
    );
}
