//! Family R's verbs on a primary and its standby, declared once: the ledger's
//! transfers and reconciliation ([`cases_ledger::verbs::DEBIT`], `GRANT`, `RECONCILE`)
//! on the session's node, the pair's own steps, the services and groups of debits on
//! the pair ([`GROUPS`], `spec_groups.rs`), and the failover faults of the shared
//! vocabulary (`spec_engine.rs` runs them).

use case_kit::spec::verbs::{self, Kind, Verb, Verbs, may, needs};
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
        Verb {
            name: "new-pair",
            args: &[needs(
                "replication",
                Kind::OneOf(&["synchronous", "asynchronous"]),
            )],
            doc: "the case's pair (and its services, groups and book) ended and a new one started, the ledger installed, the session on its primary: `synchronous standby streaming`; a case's pair starts asynchronous",
        },
    ],
};

const WORD: Kind = Kind::Word;
const BOUND: &str = "60000, a hang bound only";

/// `ledger-svc`s on the pair and groups of 8 debits through them (R2).
pub const GROUPS: Verbs = Verbs {
    title: "the ledger's services on the pair, groups of debits (`cases/topology/src/spec_groups.rs`)",
    verbs: &[
        Verb {
            name: "grant-group",
            args: &[needs("amount", Kind::Integer)],
            doc: "grants each account of a group (`acct-0001` … `acct-0008`) `amount` on the session's node, client `ops`, keys `g-r2-1` … `g-r2-8`: `granted=8`",
        },
        Verb {
            name: "pair-service",
            args: &[
                needs("name", WORD),
                may("mode", Kind::OneOf(&["batch"]), "the case's transfer mode"),
                may("request-ms", Kind::Integer, BOUND),
                may("statement-ms", Kind::Integer, BOUND),
                may("lock-ms", Kind::Integer, BOUND),
                may(
                    "planted",
                    Kind::OneOf(&["trust-cancelled-commit"]),
                    "the service as built",
                ),
            ],
            doc: "starts `ledger-svc` named `name` on the pair's multi-host URL (`target_session_attrs=read-write`) with a pool of 8, fault injection, the group's accounts on 8 redemption stripes and those bounds (`--request-timeout-ms` …): `ready request=4000ms statement=1000ms lock=60000ms`; `arm-fault` arms the service started last",
        },
        Verb {
            name: "send-group",
            args: &[needs("group", WORD), needs("service", WORD)],
            doc: "8 debits of 1 point (keys `k-r2-GROUP-0` … `-7`, client `app-r2`, one per account) sent through the service at once, and left in flight (batch mode: held in the queue until all 8 are seen queued, then one batch): `sent=8`",
        },
        Verb {
            name: "syncrep-waits",
            args: &[needs("group", WORD)],
            doc: "waits until the group's COMMITs are seen waiting for the standby (`pg_stat_activity.wait_event = 'SyncRep'` on the primary; batch mode: the one session of its batch), a hang bound only: `waiting_debits=8`",
        },
        Verb {
            name: "answers",
            args: &[needs("group", WORD)],
            doc: "waits for the group's answers and counts them, each 201 entered in the clients' book: `503 UNKNOWN=8`, `201 OK=8`, `transport=8` (no answer)",
        },
        Verb {
            name: "committed",
            args: &[needs("group", WORD)],
            doc: "how many of the group have a transaction on the primary, looked at until all do (a cancelled wait commits a moment after its warning; a hang bound only): `committed=8`",
        },
        Verb {
            name: "wait-held",
            args: &[needs("group", WORD), needs("point", WORD)],
            doc: "waits until the whole group is committed on the primary and its service holds all 8 at hook point `point`: `committed=8 held=8`",
        },
        Verb {
            name: "sigkill-service",
            args: &[needs("service", WORD)],
            doc: "SIGKILL to that service now (the requests it holds die unanswered): `signal=9 sent`",
        },
        Verb {
            name: "retry",
            args: &[needs("service", WORD), needs("groups", WORD)],
            doc: "each debit of the groups (`a,b,…`) retried under its key through the service until answered 201, each 201 entered in the clients' book: `201 OK=40`, `201 OK replayed=8`",
        },
        Verb {
            name: "book",
            args: &[],
            doc: "the clients' book as the table `client_book (idem_key, txn_id)` on the session's node, a row per transaction id a 201 named for a key: `acknowledged=56` (keys)",
        },
        verbs::ARM_FAULT,
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
pub const ALL: [&Verbs; 3] = [&PAIR, &GROUPS, &FAULTS];
