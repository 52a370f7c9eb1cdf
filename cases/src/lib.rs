//! The numbered cases of SPEC §6, one file each, and the context they run in.
//!
//! Adding a case: write `lNN_<name>.rs` beside the others (copy a short one such as
//! `l01_normal_path.rs`), then add one line to [`all`].

pub mod framework;
pub mod queries;
pub mod runner;
pub mod service;

mod l01_normal_path;
mod l02_rejected_key_stays_rejected;
mod l03_real_concurrency;
mod l07_response_lost_after_commit;
mod l08_same_key_same_moment;
mod l11_reconciliation;

pub use framework::{Case, Check, Ctx, Env, Line, Racer, Schedule};
pub use runner::{CaseReport, run_case};

/// Every registered case, in id order. One line per case.
pub fn all() -> Vec<Case> {
    vec![
        l01_normal_path::case(),
        l02_rejected_key_stays_rejected::case(),
        l03_real_concurrency::case(),
        l07_response_lost_after_commit::case(),
        l08_same_key_same_moment::case(),
        l11_reconciliation::case(),
    ]
}
