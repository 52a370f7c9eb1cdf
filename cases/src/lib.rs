//! The numbered cases of SPEC §6, one file each, and the context they run in.
//!
//! Adding a case: copy `l00_template.rs` to `lNN_<what>.rs`, give it its id, title,
//! claim and checks, and add its module name as one line to [`register_cases!`] below.
//! Then `./run.sh --accept LNN` writes its snapshot `evidence/snapshots/LNN.snap` for
//! review; commit both.

pub mod framework;
pub mod queries;
pub mod redact;
pub mod runner;

mod canary;
mod l00_template;

pub use framework::{Case, Check, Ctx, Env, Line, Racer, Schedule, seeded_rng};
pub use rand_chacha::ChaCha8Rng;
pub use runner::{CaseReport, run_case};

/// Declares each case module and lists it in [`all`], in the order given.
macro_rules! register_cases {
    ($($module:ident),* $(,)?) => {
        $(mod $module;)*

        /// Every registered case, in id order: what a full `./run.sh` runs.
        pub fn all() -> Vec<Case> {
            vec![$($module::case()),*]
        }
    };
}

// One line per case, in id order.
register_cases! {
    l01_normal_path,
    l03_real_concurrency,
    l11_reconciliation,
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
