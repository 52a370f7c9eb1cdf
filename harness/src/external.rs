//! `--database-url`: a run on an existing PostgreSQL server instead of a scratch
//! cluster. The server is checked first (version, durability), every database the run
//! makes carries the run's unique prefix (`case_kit::server::unique_prefix`), and those
//! databases are dropped at the end, also when the run fails or is interrupted (SIGINT,
//! SIGTERM, SIGHUP). Cases that crash or restart the server
//! (`case_kit::Case::restarts_server`) are not run; they are listed, with the reason,
//! before the SUMMARY line.
//!
//! Durability policy: the server is refused when `fsync` is not `on`, `full_page_writes`
//! is not `on`, or `synchronous_commit` is `off` (`local`, `remote_write`, `remote_apply`
//! and `on` all flush the commit record locally before the commit returns; PostgreSQL
//! docs §19.5.1 "Settings" and §30.4 "Asynchronous Commit"). `--allow-weak-durability`
//! runs anyway and says so in the output and in `environment.json`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use case_kit::server::{ExternalFacts, ExternalServer, PREFIX_STEM, unique_prefix};
use case_kit::{Case, Family};
use serde::Serialize;

/// Longest wait for the databases to be dropped after a signal, milliseconds.
pub const SIGNAL_CLEANUP_MS: u64 = 120_000;

/// The server of the current run, for the cleanup after a signal or an error.
static ACTIVE: Mutex<Option<Arc<ExternalServer>>> = Mutex::new(None);

/// What `environment.json` says about an existing server (under `postgres.external`).
#[derive(Debug, Clone, Serialize)]
pub struct ExternalRecord {
    /// The URL, its password replaced by `***`.
    pub url: String,
    /// The prefix of every database the run made.
    pub database_prefix: String,
    /// `passed`, or `overridden (--allow-weak-durability): <settings>`.
    pub durability_check: String,
    /// The databases dropped at the end (all the run made).
    pub dropped_databases: Vec<String>,
}

/// One case not run on the existing server, in `environment.json` (`not_run`).
#[derive(Debug, Clone, Serialize)]
pub struct NotRun {
    /// The case id.
    pub id: String,
    /// Why: the reason the case gives in `Case::restarts_server`.
    pub reason: String,
}

/// An existing server checked and ready for a run.
pub struct Opened {
    /// The server, with the run's prefix.
    pub server: Arc<ExternalServer>,
    /// What was read from it.
    pub facts: ExternalFacts,
    /// The record for `environment.json` (dropped databases filled in at the end).
    pub record: ExternalRecord,
}

/// The durability settings that are off on a server with `facts`, as `name=value`.
pub fn weak_settings(facts: &ExternalFacts) -> Vec<String> {
    let mut weak = Vec::new();
    if facts.fsync != "on" {
        weak.push(format!("fsync={}", facts.fsync));
    }
    if facts.full_page_writes != "on" {
        weak.push(format!("full_page_writes={}", facts.full_page_writes));
    }
    if facts.synchronous_commit == "off" {
        weak.push(format!("synchronous_commit={}", facts.synchronous_commit));
    }
    weak
}

/// Connects to `url`, reads its version and durability settings, and refuses it when a
/// durability setting is off (unless `allow_weak`) or its major is not one of the
/// supported ones (unless `any_version`). Prints what it found, and any databases of an
/// earlier run (prefix `lh_`) it sees, without touching them.
///
/// Errors: the URL does not parse, the server cannot be reached, or it is refused.
pub async fn open(url: &str, allow_weak: bool, any_version: bool) -> anyhow::Result<Opened> {
    let server = Arc::new(ExternalServer::new(url, unique_prefix())?);
    let facts = server.facts().await?;
    println!(
        "postgres {} at {} (existing server; fsync={} synchronous_commit={} full_page_writes={})",
        facts.server_version,
        server.shown_url(),
        facts.fsync,
        facts.synchronous_commit,
        facts.full_page_writes
    );
    let supported = scratch_pg::versions::PINNED
        .iter()
        .any(|release| release.major == facts.major);
    if !supported && !any_version {
        anyhow::bail!(
            "the server runs PostgreSQL {} ({}); the cases are checked on {} (pass --any-version to try it anyway)",
            facts.major,
            facts.server_version,
            scratch_pg::versions::supported_list()
        );
    }
    let weak = weak_settings(&facts);
    let durability_check = if weak.is_empty() {
        "passed".to_string()
    } else if allow_weak {
        println!(
            "durability check OVERRIDDEN (--allow-weak-durability): {}; a commit this server acknowledges may not survive its crash, so the results say nothing about crash safety on it",
            weak.join(" ")
        );
        format!("overridden (--allow-weak-durability): {}", weak.join(" "))
    } else {
        anyhow::bail!(
            "refusing the server: durability is off ({}); the harness proves state survives crashes, which such a server does not promise. Pass --allow-weak-durability to run anyway",
            weak.join(" ")
        );
    };
    let earlier = ExternalServer::new(url, PREFIX_STEM.to_string())?
        .databases()
        .await?;
    if !earlier.is_empty() {
        println!(
            "note: {} database(s) named {PREFIX_STEM}… exist on the server (another run, or one killed with SIGKILL); left alone: {}",
            earlier.len(),
            earlier.join(" ")
        );
    }
    println!(
        "databases of this run: {}… (dropped at the end)",
        server.prefix()
    );
    *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = Some(server.clone());
    let record = ExternalRecord {
        url: server.shown_url(),
        database_prefix: server.prefix().to_string(),
        durability_check,
        dropped_databases: Vec::new(),
    };
    Ok(Opened {
        server,
        facts,
        record,
    })
}

/// Drops the run's databases and prints how many. Returns their names.
///
/// Errors: connection or SQL failures (the server stays registered for [`cleanup`]).
pub async fn finish(server: &ExternalServer) -> anyhow::Result<Vec<String>> {
    let dropped = server.drop_databases().await?;
    println!(
        "existing server: dropped the run's {} database(s) ({}…); none left",
        dropped.len(),
        server.prefix()
    );
    Ok(dropped)
}

/// Drops whatever databases of the current run remain (after an error, or on a
/// signal), within [`SIGNAL_CLEANUP_MS`]. A no-op without an external run.
pub async fn cleanup() {
    let server = ACTIVE.lock().unwrap_or_else(|p| p.into_inner()).take();
    let Some(server) = server else {
        return;
    };
    match tokio::time::timeout(
        Duration::from_millis(SIGNAL_CLEANUP_MS),
        server.drop_databases(),
    )
    .await
    {
        Ok(Ok(dropped)) if dropped.is_empty() => {}
        Ok(Ok(dropped)) => eprintln!(
            "harness: dropped {} database(s) of this run on the existing server ({}…)",
            dropped.len(),
            server.prefix()
        ),
        Ok(Err(error)) => eprintln!(
            "harness: could not drop the databases {}… on the existing server: {error:#}",
            server.prefix()
        ),
        Err(_) => eprintln!(
            "harness: dropping the databases {}… took over {SIGNAL_CLEANUP_MS} ms; some may remain",
            server.prefix()
        ),
    }
}

/// The cases of `chosen` that crash or restart the server, with their reasons.
pub fn not_run(chosen: &[(&Family, &Case)]) -> Vec<NotRun> {
    chosen
        .iter()
        .filter_map(|(_, case)| {
            case.restarts_server.as_ref().map(|reason| NotRun {
                id: case.id.clone(),
                reason: reason.clone(),
            })
        })
        .collect()
}

/// The cases set aside because this machine lacks what they need, with the reason.
pub fn unavailable(set_aside: &[(&Family, &Case, String)]) -> Vec<NotRun> {
    set_aside
        .iter()
        .map(|(_, case, reason)| NotRun {
            id: case.id.clone(),
            reason: reason.clone(),
        })
        .collect()
}

/// The block printed before the SUMMARY line for cases this machine cannot run (`not run
/// here (N cases: this machine lacks what they need)`), one line each with the reason.
/// Empty when there are none.
pub fn unavailable_block(not_run: &[NotRun]) -> String {
    if not_run.is_empty() {
        return String::new();
    }
    let mut text = format!(
        "not run here ({} case{}: this machine lacks what they need):\n",
        not_run.len(),
        if not_run.len() == 1 { "" } else { "s" }
    );
    for case in not_run {
        text.push_str(&format!("  {:<7} {}\n", case.id, case.reason));
    }
    text
}

/// The block printed before the SUMMARY line: each case not run and why. Empty when all
/// ran.
pub fn not_run_block(not_run: &[NotRun]) -> String {
    if not_run.is_empty() {
        return String::new();
    }
    let mut text = format!(
        "not run on an existing server ({} case{}: each crashes or restarts the server):\n",
        not_run.len(),
        if not_run.len() == 1 { "" } else { "s" }
    );
    for case in not_run {
        text.push_str(&format!("  {:<7} {}\n", case.id, case.reason));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(fsync: &str, commit: &str, pages: &str) -> ExternalFacts {
        ExternalFacts {
            version: String::new(),
            server_version: "16.4".into(),
            major: 16,
            fsync: fsync.into(),
            synchronous_commit: commit.into(),
            full_page_writes: pages.into(),
        }
    }

    #[test]
    fn weak_durability_is_named_setting_by_setting() {
        assert!(weak_settings(&facts("on", "on", "on")).is_empty());
        assert!(weak_settings(&facts("on", "local", "on")).is_empty());
        assert!(weak_settings(&facts("on", "remote_write", "on")).is_empty());
        assert_eq!(
            weak_settings(&facts("off", "off", "off")),
            [
                "fsync=off",
                "full_page_writes=off",
                "synchronous_commit=off"
            ]
        );
    }

    #[test]
    fn the_not_run_block_names_each_case_and_its_reason() {
        let family = Family {
            prefix: "X",
            title: "x",
            engine: case_kit::Engine::None,
            cases: vec![],
            extras: vec![],
            verbs: Vec::new(),
        };
        let quiet = Case::new("X1", "stays up", |_| Box::pin(async { Ok(()) }));
        let loud =
            Case::new("X2", "crashes", |_| Box::pin(async { Ok(()) })).restarts_server("it does");
        let skipped = not_run(&[(&family, &quiet), (&family, &loud)]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(
            not_run_block(&skipped),
            "not run on an existing server (1 case: each crashes or restarts the server):\n  X2      it does\n"
        );
        assert_eq!(not_run_block(&[]), "");
    }
}
