//! Family P: power cuts. Each case mounts its own disk that forgets what was never
//! synced (`forgetful-fs`, a FUSE pass-through holding unsynced writes in memory) in its
//! folder, runs its system on it (a PostgreSQL cluster, an SQLite file, a MariaDB), cuts the power
//! (SIGKILL of every process of the system, the unsynced data dropped) and checks what
//! recovery kept. Each fault is paired: a configuration that must keep every
//! acknowledged change (P1, P4, P5, P8, P9, P12, P13, P15) and a negative control that
//! must lose or damage something (P2, P3, P6, P7, P10, P11, P14, P16). P1–P12 cut under
//! the `drop` model (P9–P12 on InnoDB); P13–P18 ([`models`]) run a seeded set of cuts
//! under `reorder` (P13–P16) and `garble` (P17, P18) with strict names
//! (docs/power-cut.md, "Models").
//!
//! Mounting needs root and `/dev/fuse`: elsewhere the family is listed as not run, with
//! the reason (`launch::power::unavailable`).
//!
//! P2–P7 are case files, `cases/power/specs/pNN_<what>.spec`, each on the engine its
//! `system:` names: P5–P7 on an inventory file on the case's own disk
//! ([`spec_engine`]: the worker's acknowledged changes, the `power-cut` call, then rows,
//! counts and the integrity check as expectations), P2–P4 on a PostgreSQL cluster of
//! the case's own on it ([`spec_cluster`]: the cluster started with its settings, the
//! write-back, then P3 and P4's update, page eviction and torn cut, or P2's ledger, its
//! debit load through `ledger-svc` and the cut under it, on P1's code in [`ledger`]),
//! P9–P12 on a MariaDB of the case's own on it ([`spec_mariadb`]: the frozen balances'
//! placements in flight at the cut, a kill against a cut, and a page torn at the cut with
//! the syncs [`lost_syncs`] made never reach the disk); `docs/specs.md`, "A power cut as
//! one file". P9–P12 also need MariaDB's binaries, P11 and P12 `strace`
//! ([`spec_mariadb::unavailable`], [`spec_mariadb::unavailable_with_strace`]).
//!
//! Adding a case: a power cut is one file beside P2, P3 or P5 (found at start-up, no
//! registration, no rebuild); one that needs what no verb does is Rust: copy P1, give
//! it its id, add its module to `register_cases!` below. Either way a row in
//! docs/cases.md, then `./run.sh --accept PN`.

use case_kit::{Engine, Family};

pub mod durability;
pub mod ledger;
pub mod lost_syncs;
pub mod models;
pub mod spec_cluster;
mod spec_disk;
pub mod spec_engine;
mod spec_ledger;
pub mod spec_mariadb;
pub mod verbs;

// One line per case, in id order (the negative controls P2, P3, P6 and P7 are files;
// P14 and P16 are public for their control tests).
case_kit::register_cases! {
    p01_acknowledged_debits_survive,
    p08_withdrawal_broadcast_then_cut,
    p13_postgres_reorder_strict,
    pub p14_postgres_fsync_off_reorder,
    p15_sqlite_wal_full_reorder_strict,
    pub p16_sqlite_sync_off_reorder,
    p17_sqlite_wal_full_garble,
    p18_postgres_garble,
}

/// The family: P1–P18, each cut on a mount of its own.
pub fn family() -> Family {
    let on_mariadb = spec_mariadb::case_ids();
    Family {
        prefix: "P",
        title: "power cuts on a disk that forgets what was never synced (forgetful-fs)",
        engine: Engine::None,
        cases: all_cases()
            .into_iter()
            .map(|case| match on_mariadb.get(&case.id) {
                Some(true) => case.requires(spec_mariadb::unavailable_with_strace),
                Some(false) => case.requires(spec_mariadb::unavailable),
                None => case.requires(launch::power::unavailable),
            })
            .collect(),
        extras: Vec::new(),
        verbs: verbs::ALL.to_vec(),
    }
}

/// The Rust cases and the case files, in id order (P2–P7 and P9–P12 are files).
fn all_cases() -> Vec<case_kit::Case> {
    case_kit::in_id_order(cases().into_iter().chain(spec_engine::cases()).collect())
}

/// A session of a case whose disk is its own (the cluster's and MariaDB's engines):
/// `session` made on the case's `disk`; `permutation` is the opening's for a step's
/// session (only the first may run: the disk is the case's), `None` for the
/// expectations' last one.
///
/// Errors: a second permutation; no disk (the case has no work folder, or its
/// expectations already took it).
pub(crate) fn session_on_disk<'a, D: Send + Sync + 'static>(
    disk: Option<std::sync::Arc<D>>,
    permutation: Option<usize>,
    session: fn(std::sync::Arc<D>) -> Box<dyn case_kit::spec::EngineSession>,
) -> case_kit::spec::SessionFuture<'a> {
    use futures_util::FutureExt;
    async move {
        if let Some(permutation) = permutation {
            anyhow::ensure!(
                permutation == 1,
                "one permutation only: the disk is the case's"
            );
        }
        let disk = disk.ok_or_else(|| match permutation {
            Some(_) => anyhow::anyhow!("the case has no work folder"),
            None => anyhow::anyhow!("the case's disk is gone"),
        })?;
        Ok(session(disk))
    }
    .boxed()
}
