//! The points ledger's verbs, declared once: what its case files may call, with their
//! arguments and one line each of what they do and print. Family L composes all its
//! sets ([`LEDGER`], [`SERVICE`], [`PROCESSES`]); family R uses the transfer verbs
//! ([`DEBIT`], [`GRANT`], [`RECONCILE`]) on its pair. The operations themselves are in
//! `spec_calls.rs` and the modules it names; `docs/specs.md`'s verb reference is made
//! from these tables (`cargo test -p harness --test verbs`).

use case_kit::spec::verbs::{self, ANY, Arg, Kind, Verb, Verbs, may, needs};
use launch::service::FAULT_INJECTION;

const WORD: Kind = Kind::Word;
const INT: Kind = Kind::Integer;
const CLIENT: &str = "client `spec`";
/// Whether the `service` verb starts the service with bearer tokens, whatever the run
/// says (`launch::service::run_auth`).
const AUTH: Arg = may(
    "auth",
    Kind::OneOf(&["on", "off"]),
    "as `./run.sh --auth` says",
);

/// A transfer's arguments: the account, the amount in points, the idempotency key and
/// the caller.
const TRANSFER: &[Arg] = &[
    needs("account", WORD),
    needs("amount", INT),
    needs("key", WORD),
    may("client", WORD, CLIENT),
];

/// `debit`: the ledger's transfer out of an account.
pub const DEBIT: Verb = Verb {
    name: "debit",
    args: TRANSFER,
    doc: "the ledger's debit on the session's connection (R: on its node), in the case's transfer mode: `outcome=OK balance=20`, `outcome=INSUFFICIENT balance=10`, and whether it replayed an earlier answer (`replayed=true`)",
};

/// `grant`: the ledger's transfer into an account.
pub const GRANT: Verb = Verb {
    name: "grant",
    args: TRANSFER,
    doc: "the ledger's grant, printed as `debit` is",
};

/// `reconcile`: the ledger's reconciliation.
pub const RECONCILE: Verb = verbs::reconcile(
    "the ledger's reconciliation of the session's database, its summary (`balance_mismatches=0 … global_sum=0`)",
);

/// The ledger's own operations: transfers, reconciliations, repair, the naive designs.
pub const LEDGER: Verbs = Verbs {
    title: "the points ledger (`systems/points-ledger`)",
    verbs: &[
        DEBIT,
        GRANT,
        RECONCILE,
        Verb {
            name: "reconcile-orders",
            args: &[needs(ANY, WORD)],
            doc: "the business system's orders (`ORDER=ACCOUNT:AMOUNT`) against the ledger (`points_ledger::reconcile_orders`): `findings=1: order ord-2102 has 2 debits (app-a/k-2102, app-a/k-2103)` (L21)",
        },
        Verb {
            name: "naive-debit",
            args: &[
                needs("account", WORD),
                needs("amount", INT),
                needs("key", WORD),
                needs("client", WORD),
                needs("write", Kind::OneOf(&["absolute", "relative"])),
            ],
            doc: "the naive debit the controls refute (`points_ledger::naive::debit`): `outcome=OK read=100`, `outcome=REFUSED`, `outcome=CHECK_VIOLATION` (23514); in a `race call:` every racer meets the others at the race's barrier between its read and its write, so the race is forced",
        },
        Verb {
            name: "naive-reconcile",
            args: &[],
            doc: "the reconciliation's checks as separate READ COMMITTED statements, once: `clean=true balance_mismatches=0 …`",
        },
    ],
};

/// A write load beside the reconciliation (L20).
pub const LOAD: Verbs = Verbs {
    title: "a write load beside the reconciliation",
    verbs: &[
        Verb {
            name: "reconcile-rounds",
            args: &[
                needs("rounds", INT),
                needs("forced", WORD),
                needs("amount", INT),
                needs("writes", Kind::OneOf(&["forced", "none"])),
                may("warm-up", INT, "no load transfers awaited first"),
            ],
            doc: "beside `load-writer` racers: N rounds of the snapshot reconciliation and N of the separate statements, a debit of `amount` from `forced` committed after each round's first read; each round a row of `reconcile_round`; prints each phase's totals (L20)",
        },
        Verb {
            name: "load-writer",
            args: &[
                needs("account", WORD),
                needs("amount", INT),
                needs("key", WORD),
            ],
            doc: "as a racer: grants and debits `amount` on its account (client `load`, keys `g-KEY-k`, `d-KEY-k`) until the rounds end: `outcome=OK`, or `outcome=FAILED failed=N`",
        },
    ],
};

/// The ledger's repair and its registry in another database (L16, L22).
pub const REPAIR: Verbs = Verbs {
    title: "the ledger's repair and a registry in another database",
    verbs: &[
        Verb {
            name: "repair",
            args: &[
                may("client", WORD, CLIENT),
                may(
                    "while-frozen",
                    WORD,
                    "no debit attempted while the accounts are frozen",
                ),
            ],
            doc: "the ledger's repair (`points_ledger::repair`); once it has frozen the accounts its findings name, attempts the debits `KEY:ACCOUNT:AMOUNT,…` on a connection of its own; prints the repair log, `frozen=…`, each attempt and `after: clean=true unfrozen=true` (L16)",
        },
        Verb {
            name: "split-databases",
            args: &[needs("grant", WORD), needs("amount", INT)],
            doc: "makes `<case database>_split` (the ledger) and `<case database>_keys` (the registry), grants `amount` to each account of `grant=A,B`: `ledger=split registry=keys granted=2`",
        },
        Verb {
            name: "split-worker",
            args: &[
                needs("account", WORD),
                needs("amount", INT),
                needs("key", WORD),
                needs("commit-first", Kind::OneOf(&["key", "debit"])),
                may("client", WORD, CLIENT),
                may(
                    "stop",
                    Kind::OneOf(&["between-commits"]),
                    "it runs to its end: `exit=0 outcome=OK …`",
                ),
            ],
            doc: "the debit in a crash-worker on the split databases, `commit-first`'s transaction first; a second line says what another connection then sees (`key=OK ledger_balance=100 debits=0`)",
        },
    ],
};

/// The ledger's HTTP service and the proxies in front of it.
pub const SERVICE: Verbs = Verbs {
    title: "the ledger's HTTP service (`ledger-svc`)",
    verbs: &[
        Verb {
            name: "service",
            args: &[
                may("clients", WORD, "no client tokens but the default"),
                FAULT_INJECTION,
                may("args", WORD, "no further flags (`--flag,value`)"),
                AUTH,
                may("pool", INT, "a pool of 16"),
            ],
            doc: "starts `ledger-svc` on the case's database in the case's transfer mode: `ready` once `/readyz` answers; used by later steps of any session, killed when the case ends if no step stopped it",
        },
        Verb {
            name: "post-debit",
            args: &[
                needs("account", WORD),
                needs("amount", INT),
                needs("key", WORD),
                needs("client", WORD),
                may("give-up-when-held", WORD, "the client waits for the answer"),
                may("order", WORD, "no redemption order id"),
                may("token", WORD, "the client's own bearer token"),
                may("show", Kind::OneOf(&["txn"]), "no transaction named"),
            ],
            doc: "`POST /accounts/ID/debits`: `status=409 type=urn:ledger:problem:insufficient outcome=INSUFFICIENT balance=0 replayed=false`; with `give-up-when-held=POINT` a lost response, given up the moment the service holds it at POINT (`gave up: holding=1 fired=1`)",
        },
        Verb {
            name: "post-grant",
            args: &[
                needs("account", WORD),
                needs("amount", INT),
                needs("key", WORD),
                may("client", WORD, "client `ops`"),
            ],
            doc: "the admin listener's grant, printed as `post-debit` is",
        },
        verbs::ARM_FAULT,
        Verb {
            name: "release-fault",
            args: &[
                needs("point", WORD),
                may("when-waiting", INT, "released at once"),
            ],
            doc: "releases what is held at POINT: `released=N`; with `when-waiting=N` first waits until N backends of the service wait for a lock at one moment (`waiting=15 released=1`)",
        },
        Verb {
            name: "stop-service",
            args: &[],
            doc: "SIGTERM, then `exit=0` (the graceful, bounded shutdown)",
        },
        Verb {
            name: "kill-service",
            args: &[],
            doc: "SIGKILL: `signal=9`",
        },
    ],
};

/// The retrying proxies in front of the service and the keyless endpoint (L17).
pub const PROXIES: Verbs = Verbs {
    title: "proxies in front of the service (`launch::proxy`)",
    verbs: &[
        Verb {
            name: "proxy",
            args: &[
                needs("to", Kind::OneOf(&["service", "keyless"])),
                may("upstream-retries", INT, "1"),
            ],
            doc: "starts a retrying proxy (and, for `keyless`, the keyless endpoint): `proxy to service: upstream_retries=1`",
        },
        Verb {
            name: "keyless-drop",
            args: &[may("count", INT, "1")],
            doc: "the keyless endpoint's next N debits commit, then their connection closes without an answer: `drop next 1`",
        },
        Verb {
            name: "cut-answers",
            args: &[
                needs("to", Kind::OneOf(&["service", "keyless"])),
                may("count", INT, "1"),
            ],
            doc: "that proxy withholds its next N complete answers: `cut next 1`",
        },
        Verb {
            name: "proxy-debit",
            args: &[
                needs("to", Kind::OneOf(&["service", "keyless"])),
                needs("account", WORD),
                needs("amount", INT),
                needs("client", WORD),
                may("key", WORD, "no `Idempotency-Key`"),
                may("retry", Kind::OneOf(&["on-no-answer"]), "sent once"),
            ],
            doc: "`POST /accounts/ID/debits` through that proxy: `status=201 outcome=OK balance=70 replayed=true proxy_retries=1`, or `no answer: connection closed`",
        },
    ],
};

/// The ledger's crash-worker: a debit in a child process, paused at a hook point.
pub const PROCESSES: Verbs = Verbs {
    title: "the ledger's crash-worker (`crash-worker`)",
    verbs: &[Verb {
        name: "worker",
        args: &[
            needs("account", WORD),
            needs("amount", INT),
            needs("key", WORD),
            needs("stop", WORD),
            may("client", WORD, CLIENT),
        ],
        doc: "a crash-worker child running that debit up to hook point `stop` (`before-commit`, …), returned once paused there (`paused at before-commit`); its backend counts with the spec's sessions",
    }],
};

/// `run=`: the racers together (the race) or one after another (the controls' test).
const RUN: Arg = may(
    "run",
    Kind::OneOf(&["together", "one-by-one"]),
    "together: each racer on a connection of its own, released by one barrier",
);

/// Locking designs raced inside one step (L13, L14; `spec_locking.rs`).
pub const LOCKING: Verbs = Verbs {
    title: "locking designs raced inside one step",
    verbs: &[
        Verb {
            name: "debit-race",
            args: &[
                needs("racers", INT),
                needs(
                    "strategy",
                    Kind::OneOf(&[
                        "conditional-update",
                        "for-update",
                        "serializable-retry",
                        "repeatable-read",
                    ]),
                ),
                needs("account", WORD),
                needs("amount", INT),
                needs("key", WORD),
                may("client", WORD, CLIENT),
                RUN,
            ],
            doc: "N debits (keys `KEY-NN`) by one design, the snapshot designs' first SELECT before the barrier, `serializable-retry` retrying 40001 (at most 32 attempts): `ok=14 insufficient=18 serialization_failures=0 other_errors=0`, for `serializable-retry` also `retried=true retries=N` (L13)",
        },
        Verb {
            name: "transfers",
            args: &[
                needs("racers", INT),
                needs("count", INT),
                needs("between", WORD),
                needs("max-amount", INT),
                needs("key", WORD),
                may("client", WORD, CLIENT),
            ],
            doc: "`count` transfers through `transfer_between` (sorted lock order) spread over the racers, even ones A→B and odd ones B→A of `between=A,B`, `1 + i % max-amount` points, keys `KEY-NNN`: `transfers=200 ok=200 deadlocks=0 errors=0` (L14)",
        },
        Verb {
            name: "request-order-transfers",
            args: &[
                needs("pairs", WORD),
                needs("amount", INT),
                needs("key", WORD),
                needs("retry", Kind::OneOf(&["on-deadlock", "no"])),
                may("client", WORD, CLIENT),
                RUN,
            ],
            doc: "A→B and B→A for each of `pairs=A:B,…` (keys `KEY-0`, `KEY-1`, …) locking `from` then `to`, each racer holding its first row lock at the barrier: one 40P01 per pair; `retry=on-deadlock` retries the victim under its key once the refused row is free (at most 3 attempts): `transfers=8 ok=4 deadlocks=4 retried=0 most_attempts=1 other_errors=0` (L14)",
        },
    ],
};

/// `crash-server`: the run's scratch cluster crashed and recovered in a step (L15).
pub const CRASH_SERVER: Verb = Verb {
    name: "crash-server",
    args: &[],
    doc: "immediate stop and start of the run's scratch cluster (no checkpoint: WAL recovery), in a step; the session gets a new connection; needs `restart immediate:` in the file: `immediate stop and start: old_connection=closed restarted=true` (L15)",
};

/// The faults of the shared vocabulary the ledger's files use, and its own crash.
pub const FAULTS: Verbs = Verbs {
    title: verbs::FAULTS,
    verbs: &[verbs::KILL_WORKER, CRASH_SERVER],
};

/// Every set family L composes, in the order the reference lists them.
pub const ALL: [&Verbs; 8] = [
    &LEDGER, &LOAD, &REPAIR, &LOCKING, &SERVICE, &PROXIES, &PROCESSES, &FAULTS,
];
