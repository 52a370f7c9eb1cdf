//! The S-family negative controls can fail: with the guard in the naive slot (the store's
//! upsert for S8, the checked schema for S9, B committing before A begins for S6's forced
//! control), each control's `negative control exposes` check must report FAIL. Run as
//! registered, every check must pass. SQLite files only: no PostgreSQL is started.

use std::sync::Arc;

use case_kit::{Ctx, Env, Resource};
use cases_inventory::s06_many_writers::{self, ControlSchedule};
use cases_inventory::s08_insert_or_replace::{self, Registration};
use cases_inventory::s09_integer_affinity;
use cases_inventory::{self as inventory, ITEM, START_UNITS};
use inventory_store::Schema;

/// Seed of this test's environment (the controls use no random input).
const SEED: u64 = 14;

async fn env() -> Arc<Env> {
    Env::for_tests(SEED, &[&inventory::family()])
        .await
        .expect("an environment without PostgreSQL")
}

/// A context for `case_id` on a file of its own, `<name>.db` in the environment's folder.
fn fresh_ctx(env: &Arc<Env>, case_id: &str, name: &str) -> Ctx {
    std::fs::create_dir_all(env.files_dir()).expect("files folder");
    let path = env.files_dir().join(format!("{name}.db"));
    Ctx::new(env.clone(), "S", case_id, Resource::SqliteFile(path))
}

/// Whether the one `negative control exposes: …` check passed; panics if it is absent.
fn exposes_passed(ctx: &Ctx) -> bool {
    ctx.exposed(None)
        .unwrap_or_else(|| panic!("no negative-control check in:\n{}", ctx.transcript()))
}

fn all_passed(ctx: &Ctx) -> bool {
    ctx.failed_checks().is_empty()
}

#[tokio::test]
async fn s8_with_the_store_upsert_exposes_nothing() {
    let env = env().await;
    let mut ctx = fresh_ctx(&env, "S8", "s8-guard");
    s08_insert_or_replace::run_with(&mut ctx, Registration::StoreUpsert)
        .await
        .unwrap();
    eprint!("{}", ctx.transcript());
    assert!(!exposes_passed(&ctx), "{}", ctx.transcript());

    let mut ctx = fresh_ctx(&env, "S8", "s8-naive");
    s08_insert_or_replace::run_with(&mut ctx, Registration::InsertOrReplace)
        .await
        .unwrap();
    assert!(all_passed(&ctx), "{}", ctx.transcript());
}

#[tokio::test]
async fn s9_with_the_typeof_check_exposes_nothing() {
    let env = env().await;
    let mut ctx = fresh_ctx(&env, "S9", "s9-guard");
    s09_integer_affinity::run_with(&mut ctx, Schema::Checked)
        .await
        .unwrap();
    eprint!("{}", ctx.transcript());
    assert!(!exposes_passed(&ctx), "{}", ctx.transcript());

    let mut ctx = fresh_ctx(&env, "S9", "s9-naive");
    s09_integer_affinity::run_with(&mut ctx, Schema::WithoutTypeCheck)
        .await
        .unwrap();
    assert!(all_passed(&ctx), "{}", ctx.transcript());
}

#[tokio::test]
async fn s6_control_without_the_interleaving_exposes_nothing() {
    let env = env().await;
    for (schedule, name) in [
        (ControlSchedule::BCommitsFirst, "s6-serial"),
        (ControlSchedule::BCommitsBetweenReadAndWrite, "s6-forced"),
    ] {
        let mut ctx = fresh_ctx(&env, "S6", name);
        let path = ctx.sqlite_path();
        drop(inventory::open_with_item(&path, ITEM, START_UNITS).unwrap());
        s06_many_writers::forced_control(&mut ctx, &path, schedule).unwrap();
        eprint!("{schedule:?}:\n{}", ctx.transcript());
        match schedule {
            ControlSchedule::BCommitsFirst => assert!(!exposes_passed(&ctx)),
            ControlSchedule::BCommitsBetweenReadAndWrite => assert!(all_passed(&ctx)),
        }
    }
}
