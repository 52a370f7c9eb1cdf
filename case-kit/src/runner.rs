//! Running one case: its own database (cloned from its family's template) or file, a
//! share of the connection budget, a timeout, and a report in which a case error, panic
//! or timeout is a failed check. Shared by the harness binary and the tests, so both
//! run cases the same way.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::case::{Case, Engine, Family};
use crate::ctx::{Ctx, Resource};
use crate::env::Env;
use crate::report::{CaseReport, Check, Line};

/// Longest a case may run before it is failed (override: `LEDGER_CASE_TIMEOUT_MS`).
pub const CASE_TIMEOUT_MS: u64 = 120_000;

fn case_timeout() -> Duration {
    let ms = std::env::var("LEDGER_CASE_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASE_TIMEOUT_MS);
    Duration::from_millis(ms)
}

/// Makes the case's resource afresh: its database dropped and cloned from the family's
/// template, or its SQLite file (and WAL and shared-memory files) removed.
async fn fresh_resource(env: &Env, family: &Family, case: &Case) -> anyhow::Result<Resource> {
    match family.engine {
        Engine::None => Ok(Resource::None),
        Engine::SqliteFile => {
            std::fs::create_dir_all(env.files_dir())?;
            let path = env.files_dir().join(format!("{}.db", case.id));
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let mut file = path.clone().into_os_string();
                file.push(suffix);
                match std::fs::remove_file(&file) {
                    Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                        return Err(error.into());
                    }
                    _ => {}
                }
            }
            Ok(Resource::SqliteFile(path))
        }
        Engine::Postgres(_) => {
            let template = env.template_of(family.prefix).ok_or_else(|| {
                anyhow::anyhow!("family {} has no template in this run", family.prefix)
            })?;
            let database = env.database_name(&case.id);
            clone_database(env, template, &database).await?;
            Ok(Resource::Database(database))
        }
    }
}

/// Drops `database` (ending its connections) and clones it from `template`.
pub(crate) async fn clone_database(
    env: &Env,
    template: &str,
    database: &str,
) -> anyhow::Result<()> {
    let admin = env.connect(env.admin_database()).await?;
    // Two statements: DROP/CREATE DATABASE cannot run inside a transaction block, which a
    // multi-statement batch would be.
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
        ))
        .await?;
    admin
        .batch_execute(&format!(
            "CREATE DATABASE \"{database}\" TEMPLATE \"{template}\""
        ))
        .await?;
    Ok(())
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
    let resource = match fresh_resource(&env, family, case).await {
        Err(error) => {
            lines.push(Line::Check(Check::failure(
                "case resource made afresh (database cloned from the template, or file removed)",
                format!("{error:#}"),
            )));
            Resource::None
        }
        Ok(resource) => {
            let mut ctx = Ctx::new(
                env.clone(),
                family.prefix,
                case.id.clone(),
                resource.clone(),
            );
            ctx.set_may_restart_server(case.restarts_server.is_some());
            if case.statements_only {
                ctx.pin_statements();
            }
            ctx.record("transfer_mode", ctx.transfer_mode().as_str().into());
            let timeout = case_timeout();
            let outcome = tokio::time::timeout(
                timeout,
                AssertUnwindSafe((case.body)(&mut ctx)).catch_unwind(),
            )
            .await;
            (lines, details) = ctx.take();
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
                Some(seen) => {
                    lines.push(Line::Check(Check::failure("case ran to completion", seen)))
                }
                None if case.clean && resource != Resource::None => {
                    env.register_clean(family.prefix, resource.name());
                }
                None => {}
            }
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
