//! A case's checks and notes, and the evidence of one run against one target, in the
//! shape of any harness run's record: `transcript.txt` ending in the SUMMARY line,
//! `<id>.txt` per case, `results.json` and `environment.json` (read by
//! `evidence_pages::run` for `index.html`), and `junit.xml` (one suite per case, one
//! test case per check).

use std::path::Path;

use case_kit::{Check, Line};
use serde_json::{Value, json};

/// What one case did.
#[derive(Debug, Clone)]
pub struct CaseOutcome {
    /// `C1` …
    pub id: &'static str,
    /// Title.
    pub title: &'static str,
    /// What the case proves.
    pub claim: &'static str,
    /// What makes it fail.
    pub fails: &'static str,
    /// Why it did not run (the target was not given what it needs).
    pub not_run: Option<String>,
    /// Notes and checks in order.
    pub lines: Vec<Line>,
    /// Wall time, milliseconds.
    pub duration_ms: u128,
}

impl CaseOutcome {
    /// An empty outcome for a case.
    pub fn new(
        id: &'static str,
        title: &'static str,
        claim: &'static str,
        fails: &'static str,
    ) -> CaseOutcome {
        CaseOutcome {
            id,
            title,
            claim,
            fails,
            not_run: None,
            lines: Vec::new(),
            duration_ms: 0,
        }
    }

    /// Adds a note.
    pub fn note(&mut self, text: impl Into<String>) {
        self.lines.push(Line::Note { text: text.into() });
    }

    /// Adds a check comparing `expected` with `actual` (passes when equal).
    pub fn equal(&mut self, name: &str, expected: impl ToString, actual: impl ToString) -> bool {
        let (expected, actual) = (expected.to_string(), actual.to_string());
        let passed = expected == actual;
        self.lines.push(Line::Check(Check {
            name: name.to_owned(),
            passed,
            expected: Some(expected),
            actual: Some(actual),
            compared: Default::default(),
        }));
        passed
    }

    /// Adds a check that passed or failed, with what was seen.
    pub fn check(&mut self, name: &str, passed: bool, seen: impl Into<String>) -> bool {
        self.lines.push(Line::Check(Check {
            name: name.to_owned(),
            passed,
            expected: None,
            actual: Some(seen.into()),
            compared: Default::default(),
        }));
        passed
    }

    /// Checks that passed.
    pub fn passed(&self) -> usize {
        self.checks().filter(|c| c.passed).count()
    }

    /// Checks that failed.
    pub fn failed(&self) -> usize {
        self.checks().filter(|c| !c.passed).count()
    }

    fn checks(&self) -> impl Iterator<Item = &Check> {
        self.lines.iter().filter_map(|line| match line {
            Line::Check(check) => Some(check),
            Line::Note { .. } => None,
        })
    }

    /// `CASE C1 :: title` and its lines (or `not run: reason`).
    pub fn transcript(&self) -> String {
        let mut text = format!("CASE {} :: {}\n", self.id, self.title);
        if let Some(reason) = &self.not_run {
            text.push_str(&format!("  not run: {reason}\n"));
        }
        for line in &self.lines {
            text.push_str(&line.render());
            text.push('\n');
        }
        text
    }
}

/// The evidence of one run against one target, written to `dir`.
pub struct RunRecord<'a> {
    /// The target's label and URL.
    pub target: &'a crate::target::TargetSpec,
    /// The cases, in order.
    pub cases: &'a [CaseOutcome],
    /// The seed of C8's workload.
    pub seed: u64,
    /// Wall time of the run, milliseconds.
    pub wall_ms: u128,
    /// The command line.
    pub command: Vec<String>,
}

impl RunRecord<'_> {
    /// `SUMMARY passed=N failed=M` (checks; a case not run counts in neither).
    pub fn summary(&self) -> String {
        let passed: usize = self.cases.iter().map(CaseOutcome::passed).sum();
        let failed: usize = self.cases.iter().map(CaseOutcome::failed).sum();
        format!("SUMMARY passed={passed} failed={failed}")
    }

    /// The whole transcript: the target, each case, the cases not run, the SUMMARY line.
    pub fn transcript(&self) -> String {
        let mut text = format!("target: {} at {}\n", self.target.label, self.target.url);
        for case in self.cases {
            text.push_str(&case.transcript());
        }
        text.push_str(&self.summary());
        text.push('\n');
        text
    }

    /// Writes the record's files and `index.html` into `dir` (created).
    ///
    /// Errors: a file cannot be written; the page cannot be rendered.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("transcript.txt"), self.transcript())?;
        for case in self.cases {
            std::fs::write(dir.join(format!("{}.txt", case.id)), case.transcript())?;
        }
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(&self.results())?,
        )?;
        std::fs::write(
            dir.join("environment.json"),
            serde_json::to_string_pretty(&self.environment())?,
        )?;
        std::fs::write(dir.join("junit.xml"), self.junit()?)?;
        let page = evidence_pages::run::render(dir, &Default::default())?;
        evidence_pages::write(&dir.join("index.html"), &page)?;
        Ok(())
    }

    fn results(&self) -> Value {
        let failed: usize = self.cases.iter().map(CaseOutcome::failed).sum();
        let cases: Vec<Value> = self.cases.iter().map(|case| self.case_json(case)).collect();
        json!({
            "status": if failed == 0 { "pass" } else { "fail" },
            "passed": self.cases.iter().map(CaseOutcome::passed).sum::<usize>(),
            "failed": failed,
            "wall_ms": self.wall_ms,
            "seed": self.seed,
            "target": {"label": self.target.label, "url": self.target.url},
            "cases": cases,
        })
    }

    fn case_json(&self, case: &CaseOutcome) -> Value {
        let checks: Vec<&Check> = case.checks().collect();
        let notes: Vec<String> = case
            .lines
            .iter()
            .filter_map(|l| match l {
                Line::Note { text } => Some(text.clone()),
                Line::Check(_) => None,
            })
            .collect();
        json!({
            "id": case.id,
            "title": case.title,
            "family": format!("C against {}", self.target.label),
            "status": match (&case.not_run, case.failed()) {
                (Some(_), _) => "not run",
                (None, 0) => "pass",
                _ => "fail",
            },
            "passed": case.passed(),
            "failed": case.failed(),
            "duration_ms": case.duration_ms,
            "checks": checks,
            "notes": notes,
            "details": {"claim": case.claim, "fails": case.fails, "not_run": case.not_run},
        })
    }

    fn environment(&self) -> Value {
        let not_run: Vec<Value> = self
            .cases
            .iter()
            .filter_map(|c| {
                c.not_run
                    .as_ref()
                    .map(|reason| json!({"id": c.id, "reason": reason}))
            })
            .collect();
        json!({
            "started_at": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            "command": self.command,
            "replay": format!("./run.sh conformance --target-url {} --seed {}", self.target.url, self.seed),
            "seed": self.seed,
            "target": {
                "label": self.target.label,
                "url": self.target.url,
                "admin_url": self.target.admin_url,
                "start_command": self.target.start_command,
                "kill_command": self.target.kill_command,
                "setup_command": self.target.setup_command,
            },
            "families": ["C"],
            "not_run": not_run,
        })
    }

    fn junit(&self) -> anyhow::Result<String> {
        use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
        let mut report = Report::new(format!("conformance {}", self.target.label));
        for case in self.cases {
            let mut suite = TestSuite::new(format!("{} {}", case.id, case.title));
            if let Some(reason) = &case.not_run {
                let mut status = TestCaseStatus::skipped();
                status.set_message(reason.clone());
                suite.add_test_case(TestCase::new("not run", status));
            }
            for check in case.checks() {
                let status = if check.passed {
                    TestCaseStatus::success()
                } else {
                    let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    status.set_message(Line::Check(check.clone()).render().trim().to_owned());
                    status
                };
                suite.add_test_case(TestCase::new(check.name.clone(), status));
            }
            report.add_test_suite(suite);
        }
        Ok(report.to_string()?)
    }
}
