//! The P-family negative controls can fail: run where their fault cannot happen —
//! P2 with `fsync=on`, P3 without the tear, P6 with `synchronous=FULL`, P7 with
//! `synchronous=EXTRA` — each
//! control's `negative control exposes` check must report FAIL. Root only (a FUSE
//! mount); as another user each test says why it did not run.

use std::sync::Arc;

use case_kit::{Ctx, Env, Resource};
use cases_power::{
    p02_fsync_off, p03_torn_page_detected, p06_sqlite_wal_normal, p07_sqlite_journal_sync_off,
};

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 30;

async fn ctx(case_id: &str) -> Option<(Arc<Env>, Ctx)> {
    if let Some(reason) = launch::power::unavailable() {
        eprintln!("not run: {reason}");
        return None;
    }
    let env = Env::for_tests(SEED, &[&cases_power::family()])
        .await
        .expect("an environment without a shared PostgreSQL");
    let ctx = Ctx::new(env.clone(), "P", case_id, Resource::None);
    Some((env, ctx))
}

fn exposed(ctx: &Ctx) -> bool {
    ctx.exposed(None)
        .unwrap_or_else(|| panic!("no negative-control check in:\n{}", ctx.transcript()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2_with_fsync_on_exposes_nothing() {
    let Some((_env, mut ctx)) = ctx("P2").await else {
        return;
    };
    p02_fsync_off::run_with(&mut ctx, "on").await.unwrap();
    eprint!("{}", ctx.transcript());
    assert!(!exposed(&ctx), "{}", ctx.transcript());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p3_without_the_tear_detects_nothing() {
    // The same forced unsynced page write and cut, but the write is dropped whole: the
    // disk keeps the old page, recovery replays the update onto it, nothing to detect.
    let Some((_env, mut ctx)) = ctx("P3").await else {
        return;
    };
    p03_torn_page_detected::run_with(&mut ctx, false)
        .await
        .unwrap();
    eprint!("{}", ctx.transcript());
    assert!(!exposed(&ctx), "{}", ctx.transcript());
    assert!(ctx.failed_checks().len() == 1, "{}", ctx.transcript());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p6_with_synchronous_full_exposes_nothing() {
    let Some((_env, mut ctx)) = ctx("P6").await else {
        return;
    };
    p06_sqlite_wal_normal::run_with(&mut ctx, "full")
        .await
        .unwrap();
    eprint!("{}", ctx.transcript());
    assert!(!exposed(&ctx), "{}", ctx.transcript());
    assert!(ctx.failed_checks().len() == 1, "{}", ctx.transcript());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p7_with_synchronous_extra_exposes_nothing() {
    // EXTRA, not FULL: in DELETE mode a commit is the journal's unlink, and only EXTRA
    // syncs the directory after it (SQLite docs, "PRAGMA synchronous"); with FULL this
    // disk loses the last acknowledged change (LIMITS.md, the power-cut table).
    let Some((_env, mut ctx)) = ctx("P7").await else {
        return;
    };
    p07_sqlite_journal_sync_off::run_with(&mut ctx, "extra")
        .await
        .unwrap();
    eprint!("{}", ctx.transcript());
    assert!(!exposed(&ctx), "{}", ctx.transcript());
}
