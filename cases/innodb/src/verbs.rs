//! Family I's verbs: the frozen balances' events, declared once for both engines
//! ([`cases_frozen::verbs::EVENTS`], with I's `fail=`, `hold=` and its `release`, and
//! `place`'s `show=reported`), and what only the InnoDB engine offers ([`INNODB`]): its
//! connections, the server's SIGKILL, its lock waits and the naive registration. The
//! operations are in [`super::spec_engine`]; `docs/specs.md`'s verb reference is made
//! from these tables (`cargo test -p harness --test verbs`).

use case_kit::spec::verbs::{Kind, Verb, Verbs, may, needs};
use cases_frozen::verbs::EVENTS;

/// What the InnoDB engine (the run's scratch MariaDB) offers beside the events.
pub const INNODB: Verbs = Verbs {
    title: "the frozen balances on InnoDB (`cases/innodb/src/spec_engine.rs`)",
    verbs: &[
        Verb {
            name: "connect",
            args: &[needs("client", Kind::OneOf(&["product", "default"]))],
            doc: "the session's connection replaced by one with the product's options (`CLIENT_FOUND_ROWS`) or the client's defaults: `connected client=default` (I11; after `kill-server`, I8)",
        },
        Verb {
            name: "kill-server",
            args: &[],
            doc: "SIGKILL to `mariadbd`, then a new process on the same data and port (InnoDB's crash recovery): `killed signal=9 restarted=another-process`; every open connection dies, so the file needs `schedule: exclusive` (I8)",
        },
        Verb {
            name: "lock-waits",
            args: &[],
            doc: "`lock_waits=N`: the sessions of the case's database in `LOCK WAIT` now (I5)",
        },
        Verb {
            name: "naive-register",
            args: &[
                needs("account", Kind::Word),
                needs("asset", Kind::OneOf(&["USDT", "BTC", "ETH"])),
                needs("key", Kind::Word),
                may("tenant", Kind::Word, "the default tenant (`default`)"),
            ],
            doc: "the naive registration that reads the balance first, inserts, then reads the operation inside the failed transaction: `inside_read=NotFound`, `inside_read=Found:OK` or `inside_read=Registered` (I10's control)",
        },
    ],
};

/// Every set family I composes, in the order the reference lists them.
pub const ALL: [&Verbs; 2] = [&EVENTS, &INNODB];
