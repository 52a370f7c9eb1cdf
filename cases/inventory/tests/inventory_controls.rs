//! The S-family negative controls can fail. S8 and S9 are case files
//! (`cases/inventory/specs/`): each runs here as committed, where every check passes,
//! and with the guard in the naive slot (S8: the store's upsert, `change`, instead of
//! `replace-change`; S9: the checked schema instead of the one without the `typeof`
//! CHECK), where its `negative control exposes` check must report FAIL. S6 is Rust: with B
//! committing before A begins its forced control must report FAIL. Every case file loads
//! with the family's operations. SQLite files only: no PostgreSQL is started.

use std::path::Path;
use std::sync::Arc;

use case_kit::spec::{self, Spec};
use case_kit::{CaseReport, Ctx, Env, Resource};
use cases_inventory::s06_many_writers::{self, ControlSchedule};
use cases_inventory::spec_engine::{self, SPEC_DIR, SqliteEngine};
use cases_inventory::{self as inventory, ITEM, START_UNITS};

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

/// The case file `name`, its text changed by `edit` (as committed when `edit` is
/// `None`), parsed.
fn spec_file(name: &str, edit: Option<(&str, &str)>) -> Spec {
    let text = std::fs::read_to_string(Path::new(SPEC_DIR).join(name)).expect("the file");
    let text = match edit {
        Some((from, to)) => {
            assert!(text.contains(from), "{name} has no {from:?}");
            text.replace(from, to)
        }
        None => text,
    };
    spec::parse(&text).expect("parses")
}

/// Runs `spec` as case `id` in a fresh environment; returns the report.
async fn run(id: &str, name: &str, spec: Spec) -> CaseReport {
    let env = env().await;
    let shown = format!("cases/inventory/specs/{name}");
    let case = spec::engine_case(id.into(), shown, Arc::new(spec), Arc::new(SqliteEngine));
    let report = case_kit::run_case(env, &inventory::family(), &case).await;
    eprint!("{}", report.transcript());
    report
}

/// The report's failed checks, snapshot comparison aside (the test runs no snapshot).
fn failed(report: &CaseReport) -> Vec<String> {
    report
        .transcript()
        .lines()
        .filter(|line| line.trim_start().starts_with("FAIL"))
        .map(String::from)
        .collect()
}

async fn control_can_fail(id: &str, name: &str, guard: (&str, &str)) {
    let report = run(id, name, spec_file(name, None)).await;
    assert!(failed(&report).is_empty(), "{}", report.transcript());
    let report = run(id, name, spec_file(name, Some(guard))).await;
    let failed = failed(&report);
    assert!(
        failed.len() == 1 && failed[0].contains("negative control exposes"),
        "with the guard in the naive slot only the exposes check fails:\n{}",
        report.transcript()
    );
}

#[tokio::test]
async fn s8_with_the_store_upsert_exposes_nothing() {
    let name = "s08_insert_or_replace.spec";
    control_can_fail(
        "S8",
        name,
        (
            "call naive_reused: replace-change",
            "call naive_reused: change",
        ),
    )
    .await;
}

#[tokio::test]
async fn s9_with_the_typeof_check_exposes_nothing() {
    let name = "s09_integer_affinity.spec";
    control_can_fail(
        "S9",
        name,
        ("open schema=without-type-check", "open schema=checked"),
    )
    .await;
}

#[test]
fn every_s_case_file_loads_with_the_familys_operations() {
    let cases = spec_engine::cases();
    assert!(cases.len() >= 9, "{} case files", cases.len());
    for case in &cases {
        assert_ne!(
            case.title, "spec file that cannot be run",
            "{} does not load",
            case.id
        );
        assert!(
            !case.id.contains('-'),
            "{}: files are named sNN_<what>.spec",
            case.id
        );
    }
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
            ControlSchedule::BCommitsBetweenReadAndWrite => {
                assert!(ctx.failed_checks().is_empty())
            }
        }
    }
}
