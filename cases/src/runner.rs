//! Running one case: its own database cloned from the template, a timeout, and a report
//! in which a case error, panic or timeout is a failed check. Shared by the harness
//! binary and the tests, so both run cases the same way.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use scratch_pg::{Cluster, ClusterOptions};
use serde::Serialize;

use crate::framework::{Case, Check, Ctx, Env, Line, Schedule};

/// Longest a case may run before it is failed (override: `LEDGER_CASE_TIMEOUT_MS`).
pub const CASE_TIMEOUT_MS: u64 = 120_000;
/// The template database every case database is cloned from.
pub const TEMPLATE_DATABASE: &str = "ledger_template";

/// One case's result.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// Case id, e.g. `L3`.
    pub id: String,
    /// Case title.
    pub title: String,
    /// When it ran relative to the others.
    pub schedule: Schedule,
    /// The case's own database.
    pub database: String,
    /// Checks that held.
    pub passed: usize,
    /// Checks that failed (a case error, panic or timeout counts as one).
    pub failed: usize,
    /// Wall time of the case in milliseconds.
    pub duration_ms: u128,
    /// Transcript lines (notes and checks).
    pub lines: Vec<Line>,
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

impl Env {
    /// Wraps a running cluster: creates the template database (schema and seeded accounts,
    /// then `IS_TEMPLATE true ALLOW_CONNECTIONS false` so no session lingers in it).
    ///
    /// Errors: SQL errors while creating the template.
    pub async fn prepare(cluster: Cluster, seed: u64) -> anyhow::Result<Env> {
        cluster.create_database(TEMPLATE_DATABASE, None).await?;
        {
            let client = cluster.connect(TEMPLATE_DATABASE).await?;
            ledger_svc::schema::install(&client).await?;
            ledger_svc::schema::seed(&client).await?;
        }
        let admin = cluster.connect("postgres").await?;
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {TEMPLATE_DATABASE} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
            ))
            .await?;
        Ok(Env {
            cluster: Arc::new(Mutex::new(cluster)),
            template: TEMPLATE_DATABASE.into(),
            clean_databases: Mutex::new(Vec::new()),
            seed,
            logs_dir: None,
        })
    }

    /// For tests: a fresh cluster with default options (PG 16, fetched if needed) and a
    /// prepared template. Blocks ~1 s while the cluster starts.
    ///
    /// Errors: the cluster did not start, or the template could not be made.
    pub async fn for_tests(seed: u64) -> anyhow::Result<Arc<Env>> {
        let cluster =
            tokio::task::spawn_blocking(|| Cluster::start(ClusterOptions::default())).await??;
        Ok(Arc::new(Env::prepare(cluster, seed).await?))
    }
}

fn case_timeout() -> Duration {
    let ms = std::env::var("LEDGER_CASE_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASE_TIMEOUT_MS);
    Duration::from_millis(ms)
}

fn failure(name: impl Into<String>, seen: String) -> Line {
    Line::Check(Check {
        name: name.into(),
        passed: false,
        expected: None,
        actual: Some(seen),
    })
}

/// Runs one case in its own database (`case_<id>`, dropped and cloned afresh from the
/// template). A case error, panic or timeout is recorded as a failed check, so it always
/// shows in the transcript and the SUMMARY. A case marked `clean` that completed is
/// registered for reconciliation by L11.
pub async fn run_case(env: Arc<Env>, case: Case) -> CaseReport {
    let started = Instant::now();
    let database = Env::database_for(case.id);
    let mut lines = Vec::new();
    let created = async {
        let admin = env.connect("postgres").await?;
        // Two statements: DROP/CREATE DATABASE cannot run inside a transaction block,
        // which a multi-statement batch would be.
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
            ))
            .await?;
        admin
            .batch_execute(&format!(
                "CREATE DATABASE \"{database}\" TEMPLATE {}",
                env.template
            ))
            .await?;
        anyhow::Ok(())
    }
    .await;
    match created {
        Err(error) => lines.push(failure(
            "case database cloned from the template",
            format!("{error:#}"),
        )),
        Ok(()) => {
            let mut ctx = Ctx::new(env.clone(), case.id, database.clone());
            let timeout = case_timeout();
            let outcome = tokio::time::timeout(
                timeout,
                AssertUnwindSafe((case.run)(&mut ctx)).catch_unwind(),
            )
            .await;
            lines = ctx.take_lines();
            let completed = match outcome {
                Ok(Ok(Ok(()))) => true,
                Ok(Ok(Err(error))) => {
                    lines.push(failure(
                        "case ran to completion",
                        format!("error: {error:#}"),
                    ));
                    false
                }
                Ok(Err(panic)) => {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    lines.push(failure(
                        "case ran to completion",
                        format!("panic: {message}"),
                    ));
                    false
                }
                Err(_) => {
                    lines.push(failure(
                        "case ran to completion",
                        format!("timed out after {} ms", timeout.as_millis()),
                    ));
                    false
                }
            };
            if completed && case.clean {
                env.clean_databases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(database.clone());
            }
        }
    }
    let passed = lines
        .iter()
        .filter(|l| matches!(l, Line::Check(c) if c.passed))
        .count();
    let failed = lines
        .iter()
        .filter(|l| matches!(l, Line::Check(c) if !c.passed))
        .count();
    CaseReport {
        id: case.id.to_string(),
        title: case.title.to_string(),
        schedule: case.schedule,
        database,
        passed,
        failed,
        duration_ms: started.elapsed().as_millis(),
        lines,
    }
}
