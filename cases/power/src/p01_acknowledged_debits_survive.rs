//! P1 — a power cut under load, `fsync=on`: every acknowledged debit is on the disk.
//! Claim: 32 clients debit through `ledger-svc` on a cluster whose data directory is on
//! a disk that forgets what was never synced (`synchronous_commit=on`, `fsync=on`); once
//! 96 debits were answered 201, a session of the case holds acct-0001's row (`FOR
//! UPDATE`, never committed), and the power is cut (SIGKILL of the service and of every
//! postgres process, unsynced data dropped) once debits are seen waiting on that row
//! (`pg_stat_activity`, `wait_event_type = 'Lock'`) and the disk is seen holding
//! unsynced bytes (relation extensions and evicted pages are fsynced only at a
//! checkpoint, which never comes). Both are checked in the cut's own figures: debits
//! left unanswered ≥ 1, bytes dropped ≥ 1. After crash recovery every acknowledged
//! debit is present, none twice; each debit left without an answer resolves exactly once
//! on a same-key retry; the ledger reconciles clean and `bt_index_check` (amcheck)
//! finds nothing in any B-tree index.
//! Fails if: no debit was in flight or no byte unsynced at the cut (the claim would
//! test nothing), an acknowledged debit is lost, a key has two transactions, a retry
//! does not end with exactly one, recovery fails, reconciliation or amcheck finds
//! something.
//!
//! ```text
//! clients ×32   POST /accounts/acct-…/debits  (201 counted; 96 seen → hold)
//! hold          SELECT … FOR UPDATE on acct-0001; debits seen waiting; unsynced seen
//! cut           SIGKILL ledger-svc, postmaster and backends; drop unsynced; restart
//! checks        acknowledged present; unknown retried once; reconcile; amcheck
//! ```
//!
//! Rust, not a file: after the cut every unknown debit is retried with its key through a
//! new service and each one's end is checked one by one against what its client saw, and
//! the cut figures go to the run record; the cluster verbs (P2–P4) run the load and the
//! cut, but no verb retries a load's unknown keys yet.

use futures_util::FutureExt;

use case_kit::Case;

use crate::durability;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P1",
        "power cut under load with fsync=on: every acknowledged debit survives",
        |ctx| durability::run(ctx).boxed(),
    )
    .not_clean()
    // Alone: a cluster on a single-threaded FUSE daemon and 32 clients are slow enough
    // without another case's load beside them.
    .schedule(case_kit::Schedule::Exclusive)
}
