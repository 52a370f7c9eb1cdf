//! The cases of ledger-harness, one family per system under test, one file per case.
//!
//! A family lives in its own folder with a `mod.rs` that registers its cases in one line
//! each (`case_kit::register_cases!`) and says what each case works on (its
//! `case_kit::Engine`). Adding a case is one new file and one registration line; adding
//! a family is one folder and one line in [`families`].

pub mod frozen;
pub mod inventory;
pub mod ledger;

use case_kit::Family;

/// Every family, in the order a full run lists them.
pub fn families() -> Vec<Family> {
    vec![ledger::family(), frozen::family(), inventory::family()]
}

/// The id of the canary case, which checks something false on purpose and must FAIL;
/// if it ever passes, the runner is not reporting failures.
pub const CANARY_ID: &str = ledger::canary::CANARY_ID;

/// The check the canary fails on purpose.
pub const CANARY_CHECK: &str = ledger::canary::DELIBERATELY_FALSE;
