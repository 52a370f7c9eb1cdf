//! Family R's verbs on a primary and its standby, declared once: the ledger's
//! transfers and reconciliation ([`cases_ledger::verbs::DEBIT`], `GRANT`, `RECONCILE`)
//! on the session's node, the pair's own steps, and the failover faults of the shared
//! vocabulary (`spec_engine.rs` runs them).

use case_kit::spec::verbs::{self, Kind, Verb, Verbs, needs};
use cases_ledger::verbs::{DEBIT, GRANT, RECONCILE};

/// The ledger on the pair.
pub const PAIR: Verbs = Verbs {
    title: "the ledger on a primary and its standby (`cases/topology/src/pair.rs`)",
    verbs: &[
        Verb {
            name: "on",
            args: &[needs("node", Kind::OneOf(&["primary", "standby"]))],
            doc: "moves the session to that node: `on standby`",
        },
        GRANT,
        DEBIT,
        RECONCILE,
        Verb {
            name: "wait-replayed",
            args: &[],
            doc: "waits until the standby has replayed up to the primary's flush position (`pg_current_wal_flush_lsn()` against `pg_last_wal_replay_lsn()`; a hang bound only): `replayed up to the primary's flush position`",
        },
        Verb {
            name: "pause-replay",
            args: &[],
            doc: "`pg_wal_replay_pause()` on the standby: `pause requested`",
        },
        Verb {
            name: "wait-paused",
            args: &[],
            doc: "waits until `pg_get_wal_replay_pause_state()` reads `paused`, so after a write on the primary the standby's read is stale for certain: `replay paused`",
        },
        Verb {
            name: "naive-place",
            args: &[needs("account", Kind::Word), needs("amount", Kind::Integer)],
            doc: "the naive placement: the balance read on the standby decides, then an unconditional `UPDATE` on the primary: `read=100 placed=true`",
        },
        Verb {
            name: "received-all",
            args: &[],
            doc: "whether the standby's `pg_last_wal_receive_lsn()` reached the primary's flush position: `received_all=false`",
        },
    ],
};

/// The failover faults of the shared vocabulary.
pub const FAULTS: Verbs = Verbs {
    title: verbs::FAULTS,
    verbs: &[
        verbs::STOP_RECEIVER,
        verbs::KILL_NODE,
        verbs::START_NODE,
        verbs::PROMOTE,
    ],
};

/// Every set family R's files compose.
pub const ALL: [&Verbs; 2] = [&PAIR, &FAULTS];
