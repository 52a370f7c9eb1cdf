//! The case families a run of the harness draws from, one crate each under `cases/`
//! (SPEC §6). Adding a family is one crate and one line in [`families`]; the binary
//! (`src/main.rs`) and the tests read the list from here.

use case_kit::Family;

/// Every family, in the order a full run lists them: L (the points ledger), F (frozen
/// balances), S (the SQLite inventory), I (frozen balances on InnoDB, a scratch MariaDB).
pub fn families() -> Vec<Family> {
    vec![
        cases_ledger::family(),
        cases_frozen::family(),
        cases_inventory::family(),
        cases_innodb::family(),
    ]
}

/// The id of the canary case, which checks something false on purpose and must FAIL;
/// if it ever passes, the runner is not reporting failures.
pub const CANARY_ID: &str = cases_ledger::canary::CANARY_ID;

/// The check the canary fails on purpose.
pub const CANARY_CHECK: &str = cases_ledger::canary::DELIBERATELY_FALSE;
