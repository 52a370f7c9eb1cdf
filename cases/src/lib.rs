//! The numbered cases of SPEC §6, one file each, and the context they run in.
//!
//! Adding a case: copy `l00_template.rs` to `lNN_<what>.rs`, give it its id, title,
//! claim and checks, and add its module name as one line to [`register_cases!`] below.
//! Then `./run.sh --accept LNN` writes its snapshot `evidence/snapshots/LNN.snap` for
//! review; commit both.

pub mod framework;
pub mod naive;
pub mod queries;
pub mod redact;
pub mod runner;
pub mod service;
pub mod worker;

mod canary;
mod l00_template;

pub use framework::{AbortOnDrop, Case, Check, Ctx, Env, Line, Racer, Schedule, seeded_rng};
pub use rand_chacha::ChaCha8Rng;
pub use runner::{CaseReport, run_case};

/// Declares each case module and lists it in [`all`], in the order given.
macro_rules! register_cases {
    ($($visibility:vis $module:ident),* $(,)?) => {
        $($visibility mod $module;)*

        /// Every registered case, in id order: what a full `./run.sh` runs.
        pub fn all() -> Vec<Case> {
            vec![$($module::case()),*]
        }
    };
}

// One line per case, in id order. The negative controls are public so that a test can
// run them under a plan where the race cannot happen
// (`run_with(ctx, naive::RacePlan::serial(32))`) and see them fail.
register_cases! {
    l01_normal_path,
    l02_rejected_key_stays_rejected,
    l03_real_concurrency,
    pub l04_lost_update,
    pub l05_overdraft,
    pub l06_check_last_line,
    l07_response_lost_after_commit,
    l08_same_key_same_moment,
    l09_killed_before_commit,
    l10_database_crash,
    l11_reconciliation,
    l12_striped_redemption,
}

/// Cases that are compiled and tested but not part of the default run: the template to
/// copy (`L0`) and the canary (`CANARY`), which must fail. `./run.sh L0` or
/// `./run.sh CANARY` runs one by name; neither has a snapshot.
pub fn extras() -> Vec<Case> {
    vec![l00_template::case(), canary::case()]
}

/// The id of the canary case, which checks something false on purpose and must FAIL;
/// if it ever passes, the runner is not reporting failures.
pub const CANARY_ID: &str = "CANARY";

/// The check the canary fails on purpose.
pub const CANARY_CHECK: &str = canary::DELIBERATELY_FALSE;
