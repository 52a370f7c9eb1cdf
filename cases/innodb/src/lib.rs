//! Family I: the frozen balances of SPEC §8 on InnoDB, the engine the seed's design was
//! written for (`frozen-balances-innodb` on a scratch MariaDB 10.11). The F claims that
//! carry over, run on this engine, and InnoDB's own: the read of the committed operation
//! inside the failed REPEATABLE READ transaction, deadlocks among inserters of one key,
//! affected rows, and the gap locks a locking reconciliation read would take.
//!
//! The family's engine is [`case_kit::Engine::None`]: its cases bring their own system.
//! The harness starts one scratch MariaDB for the run when a selected case is an I case
//! and hands it to [`server::install`]; each case gets its own database on it
//! ([`fixtures::Db::open`]). Where MariaDB cannot be had (no cached binaries and no root
//! to fetch them), the harness lists the family as not run with the reason.
//!
//! Every case but I4 is a case file in `cases/innodb/specs/` (`iNN_<what>.spec` is the
//! case `INN`), run by the spec runner on the run's MariaDB as its engine
//! ([`spec_engine`]), which holds an event at a hook point, sees the others in `LOCK
//! WAIT` (`<waiting ...>`) and kills `mariadbd`. I4 stays in Rust: each of its sixteen
//! placements meets a number of deadlocks that varies from run to run, which a file's
//! transcript would print.
//!
//! Adding a case: a file `cases/innodb/specs/iNN_<what>.spec` (found at start-up, no
//! registration, no rebuild; `docs/specs.md`, "The frozen events on InnoDB as calls"),
//! or, for a case that needs code, a file `iNN_<what>.rs` with `pub fn case() -> Case`
//! and one line in `register_cases!` below; then a row in `docs/cases.md` and
//! `./run.sh --accept INN`.

use case_kit::{Engine, Family};

pub mod fixtures;
pub mod server;
pub mod spec_engine;
pub mod verbs;

// One line per case, in id order.
case_kit::register_cases! {
    pub i04_sixteen_inserters_deadlock,
}

/// The family's id prefix.
pub const PREFIX: &str = "I";

/// The family.
pub fn family() -> Family {
    Family {
        prefix: PREFIX,
        title: "frozen balances on InnoDB, a scratch MariaDB (SPEC §8)",
        engine: Engine::None,
        cases: all_cases(),
        extras: Vec::new(),
        verbs: verbs::ALL.to_vec(),
    }
}

/// The hand-written cases and the case files of `specs/` ([`spec_engine`]), in id order.
fn all_cases() -> Vec<case_kit::Case> {
    case_kit::in_id_order(cases().into_iter().chain(spec_engine::cases()).collect())
}
