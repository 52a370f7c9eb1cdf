//! Family R: the points ledger as it is deployed — a pooler in front, a standby behind,
//! a failover (SPEC §5). Each case starts its own primary and standby (scratch clusters
//! of the run's PostgreSQL version, in the run's folder; [`pair`]), so a kill -9 or a
//! promotion touches no other case.
//!
//! R2, R3 and R4 are case files, `cases/topology/specs/r0N_<what>.spec`, run on a pair
//! of their own ([`spec_engine`]: sessions on either node, the standby's replay and WAL
//! receiver, kills, a restart and a promotion as calls; a synchronous pair, services
//! and groups of debits through them as calls too, [`spec_groups`]).
//!
//! Adding a case: a file `cases/topology/specs/rNN_<what>.spec` when its story is
//! sessions on the two nodes and the replay calls (no registration, no rebuild);
//! otherwise a file `rNN_<what>.rs` with its id, title, claim and checks and one line in
//! `register_cases!` below. Either way its row in `docs/cases.md`.

use case_kit::{Engine, Family, PgTemplate};
use futures_util::FutureExt;

pub mod debit_groups;
pub mod managed;
pub mod pair;
pub mod pooled;
pub mod pooled_batch;
pub mod pooled_spot;
pub mod pooled_syncrep;
pub mod spec_engine;
pub mod spec_groups;
pub mod syncrep;
pub mod verbs;
pub mod wal;

case_kit::register_cases! {
    pub r1_through_pooler,
    pub r5_old_primary_returns,
    pub r6_patroni_kill_leader,
    pub r7_patroni_standby_stops,
    pub r8_patroni_switchover,
    pub r9_patroni_paused_leader,
    pub r10_patroni_rewind,
    pub r11_patroni_async_lag,
}

/// The family. Its engine is PostgreSQL so that a run boots the scratch cluster whose
/// binaries (the run's major version, `--pg`) the cases' own nodes use; the cases' own
/// databases on it stay empty.
pub fn family() -> Family {
    Family {
        prefix: "R",
        title: "the points ledger behind a pooler, with a standby and a failover (SPEC §5)",
        engine: Engine::Postgres(PgTemplate {
            template: "topology_template",
            install: |_client| async { Ok(()) }.boxed(),
        }),
        cases: all_cases(),
        extras: Vec::new(),
        verbs: verbs::ALL.to_vec(),
    }
}

/// The Rust cases and the case files, in id order (R2, R3 and R4 are files).
fn all_cases() -> Vec<case_kit::Case> {
    case_kit::in_id_order(cases().into_iter().chain(spec_engine::cases()).collect())
}
