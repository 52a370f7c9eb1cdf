//! The inventory store's verbs, declared once: what family S's files may call on the
//! case's SQLite file (`spec_engine.rs` runs them). Family P uses [`ADD_ITEM`] and
//! [`RECONCILE`] on its forgetful disk. `docs/specs.md`'s verb reference is made from
//! these tables.

use case_kit::spec::verbs::{self, Kind, Verb, Verbs, many, may, needs};

const WORD: Kind = Kind::Word;
const INT: Kind = Kind::Integer;

/// `reconcile`: the store's reconciliation of the file.
pub const RECONCILE: Verb = verbs::reconcile(
    "the store's reconciliation of the file: `findings=0`, or `findings=1 item=2 stored=45 recomputed=40 (…)`",
);

/// `add-item`: an item and its opening figure, through the store.
pub const ADD_ITEM: Verb = Verb {
    name: "add-item",
    args: &[needs("item", INT), needs("units", INT)],
    doc: "the item and its opening figure through the store, one transaction: `units=100`",
};

/// The inventory's operations on the case's file.
pub const INVENTORY: Verbs = Verbs {
    title: "the inventory store (`systems/inventory-store`)",
    verbs: &[
        Verb {
            name: "open",
            args: &[
                may("file", WORD, "the case's own file"),
                may(
                    "schema",
                    Kind::OneOf(&["checked", "without-type-check"]),
                    "the checked schema for a new file",
                ),
            ],
            doc: "switches the session to `<case>-NAME.db` and opens it (`Store::open`: WAL, `synchronous=FULL`, the busy timeout): `opened file=NAME schema=checked`",
        },
        ADD_ITEM,
        Verb {
            name: "change",
            args: &[
                needs("event", WORD),
                needs("item", INT),
                needs("delta", INT),
                may(
                    "policy",
                    Kind::OneOf(&["recorded"]),
                    "refusals are not recorded",
                ),
            ],
            doc: "the store's answer: `applied`, `replayed`, `mismatch: recorded item=1 delta=20`, `insufficient: units=120`, `check-violation`, …; `policy=recorded`: the ledger's L2 rule (S4)",
        },
        Verb {
            name: "change-json",
            args: &[needs("json", WORD)],
            doc: "the same through the JSON entry point (no spaces in an argument: a blank id is `\"\\u0020\"`)",
        },
        Verb {
            name: "replace-change",
            args: &[
                needs("event", WORD),
                needs("item", INT),
                needs("delta", INT),
            ],
            doc: "the naive `INSERT OR REPLACE` registration (S8)",
        },
        Verb {
            name: "in-transaction",
            args: &[],
            doc: "`in_transaction=yes` or `no`",
        },
        Verb {
            name: "close",
            args: &[],
            doc: "`closed`; the session's next step opens the file again",
        },
        Verb {
            name: "worker",
            args: &[
                many("change", WORD),
                may(
                    "stop",
                    WORD,
                    "it runs to its end: `answers: replayed … exit=0`",
                ),
            ],
            doc: "a crash-worker in SQLite mode applying each `change=EVENT:ITEM:DELTA` to the session's file; with `stop=POINT` returned once paused there (`paused at before-commit`); killed and reaped when the session ends",
        },
        Verb {
            name: "writers",
            args: &[
                needs("processes", INT),
                needs("connections", INT),
                needs("prefix", WORD),
                needs("item", INT),
                needs("delta", INT),
            ],
            doc: "S6's race: that many crash-worker processes, each with its connections open, released together by a start file: `ready=4 applied=14 insufficient=18 other=0 distinct_event_ids=32 exits=0,0,0,0 …`",
        },
        Verb {
            name: "count-busy-handler",
            args: &[],
            doc: "replaces the session's busy timeout by a handler that counts its calls and never waits",
        },
        Verb {
            name: "busy-handler-calls",
            args: &[],
            doc: "`busy_handler_calls=0`: S6's \"refused at once\" as an event",
        },
        RECONCILE,
    ],
};

/// The faults of the shared vocabulary family S's files use.
pub const FAULTS: Verbs = Verbs {
    title: verbs::FAULTS,
    verbs: &[verbs::KILL_WORKER],
};

/// Every set family S composes.
pub const ALL: [&Verbs; 2] = [&INVENTORY, &FAULTS];
