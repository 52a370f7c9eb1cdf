//! The P-family negative controls can fail: run where their fault cannot happen —
//! P2's file with `fsync=on`, P3's without the tear, P6's with `synchronous=full`, P7's
//! with `synchronous=extra`, P10's with `innodb_flush_log_at_trx_commit=1`, P11's
//! without the tear — each control's `negative control exposes` check must report
//! FAIL. The files run as committed first, where every check passes. Root only
//! (a FUSE mount); as another user each test says why it did not run.

use std::sync::Arc;

use case_kit::CaseReport;
use case_kit::Env;
use case_kit::spec::{self, Spec};
use cases_power::spec_cluster::PowerPgEngine;
use cases_power::spec_engine::{PowerSqliteEngine, SPEC_DIR};
use cases_power::spec_mariadb::PowerMariaEngine;

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2_with_fsync_on_exposes_nothing() {
    // P1's setting: the acknowledged debits' WAL is synced at each commit, none is lost.
    let name = "p02_fsync_off.spec";
    file_control_can_fail("P2", name, ("set=fsync:off", "set=fsync:on")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p3_without_the_tear_detects_nothing() {
    // The same forced unsynced page write and cut, but the write is dropped whole: the
    // disk keeps the old page, recovery replays the update onto it, nothing to detect.
    let name = "p03_torn_page_detected.spec";
    file_control_can_fail("P3", name, ("power-cut tear=acct", "power-cut")).await;
}

/// The case file `name`, its text changed by `edit` (as committed when `None`), parsed.
fn spec_file(name: &str, edit: Option<(&str, &str)>) -> Spec {
    spec::load_edited(std::path::Path::new(SPEC_DIR), name, edit.as_slice()).expect("the file")
}

/// Runs `spec` as case `id` in a fresh environment; returns the report's failed checks.
async fn failed_checks(id: &str, name: &str, spec: Spec) -> Vec<String> {
    let env = Env::for_tests(SEED, &[&cases_power::family()])
        .await
        .expect("an environment without a shared PostgreSQL");
    let shown = format!("cases/power/specs/{name}");
    let engine: Arc<dyn spec::SpecEngine> = match spec.system.as_str() {
        cases_power::spec_cluster::SYSTEM => Arc::new(PowerPgEngine::default()),
        cases_power::spec_mariadb::SYSTEM => Arc::new(PowerMariaEngine::default()),
        _ => Arc::new(PowerSqliteEngine::default()),
    };
    let case = spec::spec_case(id.into(), shown, Arc::new(spec), engine);
    let report: CaseReport = case_kit::run_case(env, &cases_power::family(), &case).await;
    eprint!("{}", report.transcript());
    let transcript = report.transcript();
    let failed = transcript.lines();
    let failed = failed.filter(|line| line.trim_start().starts_with("FAIL"));
    failed.map(String::from).collect()
}

/// The file passes as committed; with `guard` (the fault made impossible) its
/// `exposes:` fails, and nothing else does.
async fn file_control_can_fail(id: &str, name: &str, guard: (&str, &str)) {
    if let Some(reason) = launch::power::unavailable() {
        eprintln!("not run: {reason}");
        return;
    }
    let failed = failed_checks(id, name, spec_file(name, None)).await;
    assert!(
        failed.is_empty(),
        "as committed every check passes: {failed:?}"
    );
    let failed = failed_checks(id, name, spec_file(name, Some(guard))).await;
    assert!(
        failed.len() == 1 && failed[0].contains("negative control exposes"),
        "with the fault made impossible only the exposes check fails: {failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p6_with_synchronous_full_exposes_nothing() {
    let name = "p06_sqlite_wal_normal.spec";
    file_control_can_fail("P6", name, ("synchronous=normal", "synchronous=full")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p7_with_synchronous_extra_exposes_nothing() {
    // EXTRA, not FULL: in DELETE mode a commit is the journal's unlink, and only EXTRA
    // syncs the directory after it (SQLite docs, "PRAGMA synchronous"); with FULL this
    // disk loses the last acknowledged change (LIMITS.md, the power-cut table).
    let name = "p07_sqlite_journal_sync_off.spec";
    file_control_can_fail("P7", name, ("synchronous=off", "synchronous=extra")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p10_with_commits_synced_exposes_nothing() {
    // P9's setting: every commit's redo is synced before its answer, the cut drops none.
    let name = "p10_innodb_commit_2_loses.spec";
    let guard = (
        "set=innodb_flush_log_at_trx_commit:2",
        "set=innodb_flush_log_at_trx_commit:1",
    );
    if let Some(reason) = cases_power::spec_mariadb::unavailable() {
        eprintln!("not run: {reason}");
        return;
    }
    file_control_can_fail("P10", name, guard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p11_without_the_tear_detects_nothing() {
    // The same page write left unsynced and the same cut, but the write is dropped
    // whole: the disk keeps the old page, redo applies the update to it, the server
    // starts.
    let name = "p11_innodb_torn_page_detected.spec";
    if let Some(reason) = cases_power::spec_mariadb::unavailable_with_strace() {
        eprintln!("not run: {reason}");
        return;
    }
    file_control_can_fail("P11", name, ("power-cut tear=acct", "power-cut")).await;
}

#[test]
fn every_power_file_loads_with_the_familys_operations() {
    for case in cases_power::spec_engine::cases() {
        assert!(
            case.title != "spec file that cannot be run",
            "{} does not load",
            case.id
        );
    }
}
