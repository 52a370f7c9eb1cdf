//! Running one case: its own database (cloned from its family's template) or file, a
//! share of the connection budget, a timeout, and a report in which a case error, panic
//! or timeout is a failed check. Shared by the harness binary and the tests, so both
//! run cases the same way.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::case::{Case, Family};
use crate::ctx::Ctx;
use crate::env::Env;
use crate::report::{CaseReport, Check, Line};
use crate::resource::{Resource, fresh_resource};

/// Longest a case may run before it is failed (override: `LEDGER_CASE_TIMEOUT_MS`).
pub const CASE_TIMEOUT_MS: u64 = 120_000;

fn case_timeout() -> Duration {
    let ms = std::env::var("LEDGER_CASE_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASE_TIMEOUT_MS);
    Duration::from_millis(ms)
}

/// Runs the body of `case` on `resource` within the case timeout: its transcript lines and
/// run-record details, with a failed check `case ran to completion` for an error, panic
/// or timeout. A clean case that completed registers its resource for its family's
/// reconciliation.
async fn run_body(
    env: &Arc<Env>,
    family: &Family,
    case: &Case,
    resource: &Resource,
) -> (Vec<Line>, BTreeMap<String, serde_json::Value>) {
    let mut ctx = Ctx::new(
        env.clone(),
        family.prefix,
        case.id.clone(),
        resource.clone(),
    );
    ctx.set_may_restart_server(case.restarts_server.is_some());
    ctx.pin(&case.pinned);
    for (name, shown) in ctx.choices().shown() {
        ctx.record(name, shown.into());
    }
    let timeout = case_timeout();
    let outcome = tokio::time::timeout(
        timeout,
        AssertUnwindSafe((case.body)(&mut ctx)).catch_unwind(),
    )
    .await;
    let (mut lines, details) = ctx.take();
    let failure = match outcome {
        Ok(Ok(Ok(()))) => None,
        Ok(Ok(Err(error))) => Some(format!("error: {error:#}")),
        Ok(Err(panic)) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Some(format!("panic: {message}"))
        }
        Err(_) => Some(format!("timed out after {} ms", timeout.as_millis())),
    };
    match failure {
        Some(seen) => lines.push(Line::Check(Check::failure("case ran to completion", seen))),
        None if case.clean && *resource != Resource::None => {
            env.register_clean(family.prefix, resource.name());
        }
        None => {}
    }
    (lines, details)
}

/// Runs `case` of `family` on its own resource. In PostgreSQL families it first takes
/// its declared connections from the run's budget (waiting while concurrent cases hold
/// too many). A case error, panic or timeout is recorded as a failed check, so it
/// always shows in the transcript and the SUMMARY. A clean case that completed is
/// registered for its family's reconciliation.
pub async fn run_case(env: Arc<Env>, family: &Family, case: &Case) -> CaseReport {
    let started = Instant::now();
    let _permits = if family.engine.needs_postgres() && env.connection_budget() > 0 {
        let wanted = case.connections.clamp(1, env.connection_budget());
        env.connection_permits()
            .acquire_many_owned(wanted)
            .await
            .ok()
    } else {
        None
    };
    let mut lines = Vec::new();
    let mut details = Default::default();
    let database = env.database_name(&case.id);
    let made = fresh_resource(&env, family.prefix, &family.engine, &case.id, &database).await;
    let resource = match made {
        Err(error) => {
            lines.push(Line::Check(Check::failure(
                "case resource made afresh (database cloned from the template, or file removed)",
                format!("{error:#}"),
            )));
            Resource::None
        }
        Ok(resource) => {
            (lines, details) = run_body(&env, family, case, &resource).await;
            resource
        }
    };
    let mut report = CaseReport {
        id: case.id.clone(),
        title: case.title.clone(),
        family: family.prefix.to_string(),
        schedule: case.schedule,
        resource: match &resource {
            Resource::SqliteFile(path) => path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
            other => other.name(),
        },
        passed: 0,
        failed: 0,
        duration_ms: 0,
        lines: Vec::new(),
        details,
    };
    for line in lines {
        report.push(line);
    }
    report.duration_ms = started.elapsed().as_millis();
    report
}
