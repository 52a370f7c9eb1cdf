//! The numbered cases of SPEC §6, one file each, and the context they run in.
//!
//! Adding a case: write `lNN_<name>.rs` beside the others (copy a short one such as
//! `l01_normal_path.rs`), then add one line to [`all`].

pub mod framework;
pub mod naive;
pub mod queries;
pub mod runner;
pub mod service;
pub mod worker;

mod l01_normal_path;
mod l02_rejected_key_stays_rejected;
mod l03_real_concurrency;
mod l07_response_lost_after_commit;
mod l08_same_key_same_moment;
mod l09_killed_before_commit;
mod l10_database_crash;
mod l11_reconciliation;
// The negative controls are public so that a test can run them under a plan where the
// race cannot happen (`run_with(ctx, naive::RacePlan::serial(32))`) and see them fail.
pub mod l04_lost_update;
pub mod l05_overdraft;
pub mod l06_check_last_line;

pub use framework::{AbortOnDrop, Case, Check, Ctx, Env, Line, Racer, Schedule};
pub use runner::{CaseReport, run_case};

/// Every registered case, in id order. One line per case.
pub fn all() -> Vec<Case> {
    vec![
        l01_normal_path::case(),
        l02_rejected_key_stays_rejected::case(),
        l03_real_concurrency::case(),
        l04_lost_update::case(),
        l05_overdraft::case(),
        l06_check_last_line::case(),
        l07_response_lost_after_commit::case(),
        l08_same_key_same_moment::case(),
        l09_killed_before_commit::case(),
        l10_database_crash::case(),
        l11_reconciliation::case(),
    ]
}
