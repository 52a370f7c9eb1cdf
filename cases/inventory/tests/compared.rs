//! A `rows:` check records what it compared for the run record: S1 (a case file on an
//! SQLite file, no PostgreSQL) runs as committed, where its `rows:` check's expected and
//! actual rows are both written and equal, and with one expected row changed
//! (`units=120` → `units=121`), where the check FAILs and the record shows both sides:
//! the rows the file expected and the rows the store returned. The check serialises as
//! `results.json` writes it (`case_kit::Check`, the harness's `checks` of a case).

use std::path::Path;
use std::sync::Arc;

use case_kit::spec;
use case_kit::{CaseReport, Env};
use cases_inventory as inventory;
use cases_inventory::spec_engine::{SPEC_DIR, SqliteEngine};

/// Seed of this test's environment (S1 draws no random input).
const SEED: u64 = 54;

const FILE: &str = "s01_three_kinds_of_input.spec";

/// S1, its text changed by `edit` (as committed when `None`), run in a fresh
/// environment.
async fn run(edit: Option<(&str, &str)>) -> CaseReport {
    let env = Env::for_tests(SEED, &[&inventory::family()])
        .await
        .expect("an environment without PostgreSQL");
    let spec = spec::load_edited(Path::new(SPEC_DIR), FILE, edit.as_slice()).expect("S1");
    let shown = format!("cases/inventory/specs/{FILE}");
    let case = spec::spec_case("S1".into(), shown, Arc::new(spec), Arc::new(SqliteEngine));
    let report = case_kit::run_case(env, &inventory::family(), &case).await;
    eprint!("{}", report.transcript());
    report
}

/// The record of S1's check `rows of SELECT units …`, as `results.json` holds it.
fn units_check(report: &CaseReport) -> serde_json::Value {
    let check = report
        .checks()
        .find(|c| c.name.starts_with("rows of SELECT units FROM stock"))
        .expect("S1's rows: check on the units");
    serde_json::to_value(check).unwrap()
}

#[tokio::test]
async fn a_rows_check_records_its_expected_and_actual_rows() {
    let record = units_check(&run(None).await);
    assert_eq!(record["passed"], true, "{record}");
    assert_eq!(record["expected_rows"], serde_json::json!(["units=120"]));
    assert_eq!(record["actual_rows"], serde_json::json!(["units=120"]));

    let record = units_check(&run(Some(("= units=120", "= units=121"))).await);
    assert_eq!(
        record["passed"], false,
        "the changed expectation fails: {record}"
    );
    assert_eq!(record["expected_rows"], serde_json::json!(["units=121"]));
    assert_eq!(record["actual_rows"], serde_json::json!(["units=120"]));
}
