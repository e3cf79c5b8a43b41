//! What the user sees on stderr: a progress bar redrawn in place on a terminal, a plain line
//! every few seconds otherwise, nothing but errors with `--quiet`.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

/// How often a line is printed when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Quiet,
    Lines,
    Terminal,
}

pub(crate) struct Progress {
    mode: Mode,
    verbose: bool,
    /// The rate, smoothed: bytes a second.
    rate: f64,
    last: Option<(Instant, u64)>,
    printed: Option<Instant>,
    /// Whether a bar is on the terminal's last line (a message first ends it).
    drawn: bool,
}

impl Progress {
    pub(crate) fn new(quiet: bool, verbose: bool) -> Self {
        let mode = if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            Mode::Terminal
        } else {
            Mode::Lines
        };
        Self { mode, verbose, rate: 0.0, last: None, printed: None, drawn: false }
    }

    /// A message for the user (not shown with `--quiet`).
    pub(crate) fn say(&mut self, message: &str) {
        if self.mode != Mode::Quiet {
            self.end_bar();
            eprintln!("rangeway get: {message}");
        }
    }

    /// `got` of `total` bytes; `per_connection` for `-v`.
    pub(crate) fn update(&mut self, got: u64, total: Option<u64>, per_connection: &[u64]) {
        let now = Instant::now();
        if let Some((then, before)) = self.last {
            let seconds = now.duration_since(then).as_secs_f64();
            if seconds >= 0.2 {
                let instant = got.saturating_sub(before) as f64 / seconds;
                self.rate =
                    if self.rate == 0.0 { instant } else { 0.7 * self.rate + 0.3 * instant };
                self.last = Some((now, got));
            }
        } else {
            self.last = Some((now, got));
        }
        let line = self.line(got, total, per_connection);
        match self.mode {
            Mode::Quiet => {}
            Mode::Terminal => {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{line}");
                let _ = err.flush();
                self.drawn = true;
            }
            Mode::Lines => {
                if self.printed.is_none_or(|at| now.duration_since(at) >= LINE_EVERY) {
                    eprintln!("rangeway get: {line}");
                    self.printed = Some(now);
                }
            }
        }
    }

    fn line(&self, got: u64, total: Option<u64>, per_connection: &[u64]) -> String {
        // No rate until two updates have measured one.
        let rate = if self.rate > 0.0 {
            format!(", {}/s", bytes(self.rate as u64))
        } else {
            String::new()
        };
        let mut line = match total.filter(|&t| t > 0) {
            Some(total) => {
                let left = total.saturating_sub(got);
                let eta = if self.rate > 0.0 {
                    format!(", {} left", duration(left as f64 / self.rate))
                } else {
                    String::new()
                };
                format!("{} of {} ({}%){rate}{eta}", bytes(got), bytes(total), got * 100 / total)
            }
            None => format!("{}{rate}", bytes(got)),
        };
        if self.verbose && per_connection.len() > 1 {
            let each: Vec<String> = per_connection.iter().map(|&b| bytes(b)).collect();
            line += &format!(" [{}]", each.join(" "));
        }
        line
    }

    /// The download is over: the bar's line is ended.
    pub(crate) fn end_bar(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

/// `512 B`, `1.5 KiB`, `20.0 MiB`, `1.00 GiB`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `42 s`, `3 min 5 s`, `2 h 10 min`.
fn duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_as_people_write_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(1 << 30), "1.0 GiB");
        assert_eq!(duration(42.4), "42 s");
        assert_eq!(duration(185.0), "3 min 5 s");
        assert_eq!(duration(7800.0), "2 h 10 min");
    }

    #[test]
    fn the_line_says_how_much_of_how_much_and_each_connection_with_verbose() {
        let mut progress = Progress::new(true, true);
        progress.rate = 2.0 * 1024.0 * 1024.0;
        let line = progress.line(1 << 20, Some(4 << 20), &[1 << 19, 1 << 19]);
        assert_eq!(line, "1.0 MiB of 4.0 MiB (25%), 2.0 MiB/s, 2 s left [512.0 KiB 512.0 KiB]");
    }
}
