//! Progress of long commands (the benchmark; the matrix and exploration runs can use the
//! same), on standard error so that standard output stays the record.
//!
//! - On a terminal (stderr is a TTY and `CI` is not `true`): an `indicatif` bar with the
//!   steps done, elapsed time, an estimate of what is left, and the current step's name.
//! - Otherwise (a pipe, a log file, `CI=true`): quiet and line-oriented — one line
//!   `<label>: <done>/<total> <message> (elapsed …)` when a step starts, at most every
//!   [`STATUS_LINE_INTERVAL_MS`], plus the last step; never a carriage return or an
//!   escape sequence.
//!
//! Lines meant for the record go through [`Progress::println`], which prints them to
//! stdout above the bar (or plainly, without one).

use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Off a terminal, the shortest time between two status lines, milliseconds (the first
/// and the last step are always shown).
pub const STATUS_LINE_INTERVAL_MS: u64 = 30_000;

/// How often the terminal bar redraws on its own (elapsed time, spinner), milliseconds.
pub const BAR_TICK_MS: u64 = 250;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// An `indicatif` bar on stderr.
    Bar,
    /// Occasional plain lines on stderr.
    Lines,
}

impl Style {
    /// [`Style::Bar`] when stderr is a terminal and `CI` is not `true`, else
    /// [`Style::Lines`].
    pub fn detect() -> Style {
        if std::io::stderr().is_terminal() && !crate::snapshot::is_ci() {
            Style::Bar
        } else {
            Style::Lines
        }
    }
}

/// The progress of `total` steps.
pub struct Progress {
    label: String,
    total: u64,
    started: Instant,
    bar: Option<ProgressBar>,
    lines: Mutex<LineState>,
}

struct LineState {
    done: u64,
    last_line: Option<Instant>,
}

impl Progress {
    /// Progress of `total` steps named `label` (e.g. `bench`), shown as [`Style::detect`]
    /// says.
    pub fn new(label: &str, total: u64) -> Progress {
        Progress::with_style(label, total, Style::detect())
    }

    /// As [`Progress::new`], with the style given.
    pub fn with_style(label: &str, total: u64, style: Style) -> Progress {
        let bar = (style == Style::Bar).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} {elapsed} (about {eta} left) {msg}",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(label.to_string());
            bar.enable_steady_tick(Duration::from_millis(BAR_TICK_MS));
            bar
        });
        Progress {
            label: label.to_string(),
            total,
            started: Instant::now(),
            bar,
            lines: Mutex::new(LineState {
                done: 0,
                last_line: None,
            }),
        }
    }

    /// A step named `message` starts (e.g. `raw @ 8 clients`).
    pub fn start_step(&self, message: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(message.to_string()),
            None => {
                let mut state = self.lines.lock().unwrap_or_else(|p| p.into_inner());
                let due = state.last_line.is_none_or(|at| {
                    at.elapsed() >= Duration::from_millis(STATUS_LINE_INTERVAL_MS)
                }) || state.done + 1 == self.total;
                if due {
                    eprintln!(
                        "{}: {}/{} {message} (elapsed {} s)",
                        self.label,
                        state.done,
                        self.total,
                        self.started.elapsed().as_secs()
                    );
                    state.last_line = Some(Instant::now());
                }
            }
        }
    }

    /// A step has finished.
    pub fn finish_step(&self) {
        match &self.bar {
            Some(bar) => bar.inc(1),
            None => {
                self.lines.lock().unwrap_or_else(|p| p.into_inner()).done += 1;
            }
        }
    }

    /// Prints `line` to stdout (above the bar when there is one).
    pub fn println(&self, line: &str) {
        match &self.bar {
            // indicatif's println writes to the bar's target (stderr); stdout must stay
            // the record, so the bar is hidden while the line goes to stdout.
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }

    /// Removes the bar (nothing to do without one).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_style_counts_steps_without_a_bar() {
        let progress = Progress::with_style("test", 2, Style::Lines);
        assert!(progress.bar.is_none());
        progress.start_step("one");
        progress.finish_step();
        progress.start_step("two");
        progress.finish_step();
        assert_eq!(progress.lines.lock().unwrap().done, 2);
        progress.println("a record line");
    }

    #[test]
    fn bar_style_counts_steps() {
        let progress = Progress::with_style("test", 3, Style::Bar);
        progress.start_step("one");
        progress.finish_step();
        assert_eq!(progress.bar.as_ref().unwrap().position(), 1);
    }
}
