//! Human units for sizes and durations, so that `64KiB` and `30s` mean the same in every key (and
//! in `rangeway sign --expires-in`).

use std::ops::RangeInclusive;
use std::time::Duration;

/// Why a size or duration was rejected, split like a [`ConfigError`](crate::config::ConfigError)
/// so that a caller knowing the key's path can report it in the same shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem} — {fix}")]
#[non_exhaustive]
pub struct UnitError {
    /// What is wrong with the text.
    pub problem: String,
    /// What to write instead.
    pub fix: String,
}

impl UnitError {
    pub(crate) fn new(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { problem: problem.into(), fix: fix.into() }
    }
}

const SIZE_UNITS_HELP: &str = "write a whole number of bytes with an optional unit: B; KiB, MiB, \
                               GiB, TiB (powers of 1024); KB, MB, GB, TB (powers of 1000); k, m, \
                               g, t (powers of 1024), e.g. \"64KiB\" or \"1 MiB\"";

/// Parses a byte size: `1048576`, `64KiB`, `1 MiB`, `1MB`, `512k`.
///
/// Units are case-insensitive. `KiB`..`TiB` are powers of 1024 and `KB`..`TB` powers of 1000 (as
/// their names say); the bare letters `k`, `m`, `g`, `t` are powers of 1024, as in nginx and the
/// JVM, because that is what people who write them mean. Only whole numbers: `1.5MiB` is refused
/// rather than rounded, so a size is never silently different from what was written.
///
/// # Errors
/// When the text is empty, has no leading number, has a fraction or an unknown unit, or the size
/// does not fit in a `u64`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(UnitError::new("the size is empty", SIZE_UNITS_HELP));
    }
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(UnitError::new(
            format!("{text:?} does not start with a number"),
            SIZE_UNITS_HELP,
        ));
    }
    let unit = unit.trim_start();
    if unit.starts_with('.') {
        return Err(UnitError::new(
            format!("{text:?} is not a whole number"),
            "use a smaller unit instead of a fraction, e.g. \"1536KiB\" rather than \"1.5MiB\"",
        ));
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(UnitError::new(format!("unknown size unit {unit:?}"), SIZE_UNITS_HELP));
        }
    };
    let too_large =
        || UnitError::new(format!("{text:?} does not fit in 64 bits"), "write a smaller size");
    // `digits` holds only ASCII digits, so the one way this parse fails is overflow.
    let number: u64 = digits.parse().map_err(|_| too_large())?;
    number.checked_mul(multiplier).ok_or_else(too_large)
}

/// Parses a duration in humantime's syntax: `30s`, `500ms`, `24h`, `1h30m`, `1h 30m`.
///
/// A bare number is refused, `0` included: `grace_period = "30"` could mean seconds or
/// milliseconds, and a config file should not make the reader guess.
///
/// # Errors
/// When the text is empty, a bare number, or not humantime syntax.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(UnitError::new(
            "the duration is empty",
            "write a number with a unit, e.g. \"30s\", \"500ms\" or \"1h30m\"",
        ));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bare_number(text));
    }
    humantime::parse_duration(text).map_err(|e| {
        UnitError::new(
            format!("{text:?} is not a duration ({e})"),
            "write a number with a unit, e.g. \"30s\", \"500ms\" or \"1h30m\"",
        )
    })
}

/// `d`, when within `range`; else the bounds as they are written.
pub(crate) fn duration_within(
    d: Duration,
    range: &RangeInclusive<Duration>,
) -> Result<Duration, UnitError> {
    if range.contains(&d) {
        return Ok(d);
    }
    Err(UnitError::new(
        format!("{} is out of range", humantime::format_duration(d)),
        format!("use from {:?} to {:?}", written(*range.start()), written(*range.end())),
    ))
}

/// `size`, when within `range` (bytes).
pub(crate) fn size_within(size: u64, range: &RangeInclusive<u64>) -> Result<u64, UnitError> {
    if range.contains(&size) {
        return Ok(size);
    }
    let fix = format!("use from {} to {} bytes", range.start(), range.end());
    Err(UnitError::new(format!("{size} is out of range"), fix))
}

/// `d` as a bound is written in messages: `"0s"`, `"1ms"`, `"5m"`, `"24h"`, `"30d"`.
fn written(d: Duration) -> String {
    let (ms, s) = (d.as_millis(), d.as_secs());
    match s {
        _ if ms % 1000 != 0 => format!("{ms}ms"),
        _ if s > 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        _ if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        _ if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

/// The error for a number written without a unit; also used for TOML integers in duration fields.
pub(crate) fn bare_number(number: &str) -> UnitError {
    UnitError::new(
        format!("{number} is a bare number, without a unit"),
        format!(
            "write \"{number}s\" (or another unit: \"{number}ms\", \"{number}m\", \"{number}h\")"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn sizes() {
        let good: &[(&str, u64)] = &[
            ("0", 0),
            ("1048576", 1_048_576),
            ("64KiB", 65_536),
            ("64kib", 65_536),
            ("1 MiB", 1_048_576),
            ("1MB", 1_000_000),
            ("1mb", 1_000_000),
            ("512k", 524_288),
            ("512K", 524_288),
            ("2m", 2_097_152),
            ("1g", 1 << 30),
            ("1GiB", 1 << 30),
            ("1GB", 1_000_000_000),
            ("1TiB", 1 << 40),
            ("3TB", 3_000_000_000_000),
            ("100B", 100),
            ("  7 kB  ", 7_000),
            ("16777215TiB", 16_777_215 << 40),
            ("18446744073709551615", u64::MAX),
        ];
        for &(text, want) in good {
            assert_eq!(parse_size(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn bad_sizes() {
        let bad: &[(&str, &str)] = &[
            ("", "empty"),
            ("   ", "empty"),
            ("MiB", "does not start with a number"),
            ("-1", "does not start with a number"),
            ("1.5MiB", "not a whole number"),
            ("1 parsec", "unknown size unit \"parsec\""),
            ("1 KiBB", "unknown size unit"),
            ("1 Ki B", "unknown size unit"),
            ("16777216TiB1", "unknown size unit"),
            ("16777216TiB", "does not fit in 64 bits"),
            ("18446744073709551616", "does not fit in 64 bits"),
            ("99999999999999999999999999999", "does not fit in 64 bits"),
        ];
        for &(text, want) in bad {
            let err = parse_size(text).expect_err(text);
            assert!(err.problem.contains(want), "{text:?}: {err}");
            assert!(!err.fix.is_empty());
        }
    }

    #[test]
    fn durations() {
        let good: &[(&str, Duration)] = &[
            ("30s", Duration::from_secs(30)),
            ("500ms", Duration::from_millis(500)),
            ("24h", Duration::from_secs(86_400)),
            ("1h30m", Duration::from_secs(5_400)),
            ("1h 30m", Duration::from_secs(5_400)),
            ("0s", Duration::ZERO),
            (" 2min ", Duration::from_secs(120)),
            ("1d", Duration::from_secs(86_400)),
        ];
        for &(text, want) in good {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
    }

    #[test]
    fn bad_durations() {
        let bad: &[(&str, &str, &str)] = &[
            ("30", "bare number", "write \"30s\""),
            ("0", "bare number", "write \"0s\""),
            ("", "empty", "\"30s\""),
            ("30 parsecs", "not a duration", "\"1h30m\""),
            ("-1s", "not a duration", "\"30s\""),
            ("s", "not a duration", "\"30s\""),
            ("99999999999999999999999h", "not a duration", "\"30s\""),
        ];
        for &(text, problem, fix) in bad {
            let err = parse_duration(text).expect_err(text);
            assert!(err.problem.contains(problem), "{text:?}: {err}");
            assert!(err.fix.contains(fix), "{text:?}: {err}");
        }
    }
}
