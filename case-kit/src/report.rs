//! Checks, transcript lines and a case's report (SPEC §7's transcript format).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::schedule::Schedule;

/// One check's result, as written to the transcript and the result file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked, e.g. `successes = floor(100/7)`.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// Expected value, when the check compares values.
    pub expected: Option<String>,
    /// Actual value, when the check compares values.
    pub actual: Option<String>,
    /// What the check compared, for the run record (`results.json`) and its page only:
    /// the transcript line ([`Line::render`]) never prints it, so snapshots do not
    /// depend on it.
    #[serde(flatten)]
    pub compared: Compared,
}

/// What a check compared beyond its `expected`/`actual` (each part written to
/// `results.json` only when present): a `rows:` check's expected and actual rows, and
/// a `check:` query's compared values (`available=5095100000`, the value of each side
/// of each comparison of its first column, read by a second query after the check).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Compared {
    /// The rows the check expected, each as the runner prints it (`rows=15`,
    /// `(0 rows)` for none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_rows: Option<Vec<String>>,
    /// The rows the query returned, printed the same way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual_rows: Option<Vec<String>>,
    /// Each compared expression with its value, `expression=value`, in the order the
    /// query names them (empty when the check compares no values it can name).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl Check {
    /// A failed check that compares nothing, with what was seen.
    pub fn failure(name: impl Into<String>, seen: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            passed: false,
            expected: None,
            actual: Some(seen.into()),
            compared: Compared::default(),
        }
    }
}

/// A transcript line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Line {
    /// `  note <text>`: a figure worth seeing, not a verdict.
    Note {
        /// The text.
        text: String,
    },
    /// `  ok   …` or `  FAIL …`.
    Check(Check),
}

impl Line {
    /// The line as printed, without a trailing newline.
    pub fn render(&self) -> String {
        match self {
            Line::Note { text } => format!("  note {text}"),
            Line::Check(check) => {
                let verdict = if check.passed { "ok  " } else { "FAIL" };
                match (&check.expected, &check.actual) {
                    (Some(expected), Some(actual)) => {
                        format!(
                            "  {verdict} {} (expected={expected}, actual={actual})",
                            check.name
                        )
                    }
                    (None, Some(actual)) => format!("  {verdict} {} ({actual})", check.name),
                    _ => format!("  {verdict} {}", check.name),
                }
            }
        }
    }
}

/// One case's result.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// Case id, e.g. `L3`.
    pub id: String,
    /// Case title.
    pub title: String,
    /// Prefix of the case's family, e.g. `L`.
    pub family: String,
    /// When it ran relative to the others.
    pub schedule: Schedule,
    /// What the case worked on: its database (`case_l3`), its SQLite file's name, or
    /// `none`.
    pub resource: String,
    /// Checks that held.
    pub passed: usize,
    /// Checks that failed (a case error, panic or timeout counts as one).
    pub failed: usize,
    /// Wall time of the case in milliseconds.
    pub duration_ms: u128,
    /// Transcript lines (notes and checks).
    pub lines: Vec<Line>,
    /// Facts for the run record (`results.json`) that are not part of the transcript,
    /// e.g. the list of databases a reconciliation covered ([`crate::Ctx::record`]).
    pub details: BTreeMap<String, serde_json::Value>,
}

impl CaseReport {
    /// The checks, in transcript order.
    pub fn checks(&self) -> impl Iterator<Item = &Check> {
        self.lines.iter().filter_map(|line| match line {
            Line::Check(check) => Some(check),
            Line::Note { .. } => None,
        })
    }

    /// Appends a line (the harness adds its snapshot check this way) and keeps
    /// `passed`/`failed` in step with the lines.
    pub fn push(&mut self, line: Line) {
        if let Line::Check(check) = &line {
            if check.passed {
                self.passed += 1;
            } else {
                self.failed += 1;
            }
        }
        self.lines.push(line);
    }

    /// The case's transcript: `CASE <id> :: <title>` and its lines, newline-terminated.
    pub fn transcript(&self) -> String {
        let mut text = format!("CASE {} :: {}\n", self.id, self.title);
        for line in &self.lines {
            text.push_str(&line.render());
            text.push('\n');
        }
        text
    }
}
