//! Family P's verbs, declared once: on an inventory file on a forgetful disk, the
//! store's [`cases_inventory::verbs::ADD_ITEM`] and
//! [`cases_inventory::verbs::RECONCILE`] and a worker that writes through the mount
//! (`spec_engine.rs` runs them); on a PostgreSQL cluster of the case's own on such a
//! disk, its start, the write-back and a page's eviction (`spec_cluster.rs`), the
//! ledger on it, a debit load, what its clients saw and amcheck (`spec_ledger.rs`),
//! [`cases_ledger::verbs::RECONCILE`]; and
//! `power-cut` from the shared fault vocabulary, on either.

use case_kit::spec::verbs::{self, Arg, Kind, Verb, Verbs, may, needs};
use cases_inventory::verbs::{ADD_ITEM, RECONCILE};
use cases_ledger::verbs::RECONCILE as LEDGER_RECONCILE;

/// The store on the forgetful disk.
pub const STORE_ON_DISK: Verbs = Verbs {
    title: "the inventory store on a forgetful disk (`forgetful-fs`)",
    verbs: &[
        ADD_ITEM,
        Verb {
            name: "worker",
            args: &[
                needs("changes", Kind::Integer),
                needs("event", Kind::Word),
                needs("item", Kind::Integer),
                needs("delta", Kind::Integer),
                may(
                    "journal-mode",
                    Kind::OneOf(&["wal", "delete", "truncate", "persist"]),
                    "`wal`, the store's",
                ),
                may(
                    "synchronous",
                    Kind::OneOf(&["off", "normal", "full", "extra"]),
                    "`full`, the store's",
                ),
            ],
            doc: "mounts the disk; a crash-worker in SQLite mode applies the N changes (`event` with `{i}`) through the mount, then holds its connection open (no close, so no checkpoint): `acknowledged=10 journal_mode=wal synchronous=normal holding=yes`",
        },
        RECONCILE,
    ],
};

/// A PostgreSQL cluster of the case's own on the forgetful disk.
pub const CLUSTER_ON_DISK: Verbs = Verbs {
    title: "a PostgreSQL cluster on a forgetful disk (`launch::power`)",
    verbs: &[
        Verb {
            name: "cluster",
            args: &[
                needs("database", Kind::Word),
                may("checksums", Kind::OneOf(&["yes", "no"]), "`no`"),
                SET,
            ],
            doc: "mounts the case's disk, initdb (`--data-checksums` with `checksums=yes`) and starts a cluster of the run's version with its data directory on it (`set=NAME:VALUE` after the durable defaults, so `set=fsync:off` wins), then creates the database the session and the expectations use: `cluster on the forgetful disk: initdb --data-checksums; full_page_writes=off …; database torn`",
        },
        Verb {
            name: "write-back",
            args: &[],
            doc: "writes every unsynced write back to the disk (the kernel's periodic write-back, `sync(1)`), so a cut drops only what follows: `written back: the disk holds every write so far`",
        },
        Verb {
            name: "evict",
            args: &[needs("table", Kind::Word), needs("through", Kind::Word)],
            doc: "reads table `through` by an index scan of its key `id` (no ring buffer: each heap page takes a shared buffer from the clock sweep) until no shared buffer holds a dirty page of `table` and the disk holds its file written and unsynced (at most 5 passes), then says what the disk holds of it: `last_unsynced_write=0+8192 unsynced_bytes=8192 dirty_buffers=0 passes_n=1`",
        },
        Verb {
            name: "install-ledger",
            args: &[],
            doc: "the points ledger's schema and seeds in the cluster's database, each test account granted 1 000 000 points (P1's install): `ledger installed: 10 test accounts granted 1000000 points each`",
        },
        Verb {
            name: "debit-load",
            args: &[
                needs("clients", Kind::Integer),
                needs("until-acknowledged", Kind::Integer),
            ],
            doc: "`ledger-svc` on the cluster's database, then N clients debiting 1 point each through it (keys `p-c<client>-<n>`); returns once N debits were answered 201, the clients still debiting until `power-cut` kills the service and stops them (P1's load): `ledger-svc on the cluster; 32 clients debit through it; 96 debits answered 201 seen …`",
        },
        Verb {
            name: "record-outcomes",
            args: &[],
            doc: "after the cut of a load, every key its clients sent and what they saw (`acknowledged`, `unknown`, `refused`) into a new table `client_outcome (key, outcome)` of the recovered database, for the file's SQL, and into `<case>-client-outcomes.log`: `client_outcome: rows_n=[n] …`",
        },
        Verb {
            name: "amcheck",
            args: &[],
            doc: "`bt_index_check` on every B-tree index of the database, catalogs included (P1's): `bt_index_check: indexes_n=[n] failures=0`, then each failure",
        },
        LEDGER_RECONCILE,
    ],
};

/// `set=NAME:VALUE`, repeated: a server setting of the cluster.
const SET: Arg = Arg {
    name: "set",
    kind: Kind::Word,
    absent: Some(
        "the durable defaults (`fsync=on`, `synchronous_commit=on`, `full_page_writes=on`)",
    ),
    repeats: true,
};

/// The faults of the shared vocabulary family P's files use.
pub const FAULTS: Verbs = Verbs {
    title: verbs::FAULTS,
    verbs: &[verbs::POWER_CUT],
};

/// A MariaDB of the case's own on the forgetful disk (`spec_mariadb.rs`), beside the
/// frozen balances' events ([`cases_frozen::verbs::EVENTS`]).
pub const MARIADB_ON_DISK: Verbs = Verbs {
    title: "a MariaDB (InnoDB) on a forgetful disk (`spec_mariadb.rs`)",
    verbs: &[
        Verb {
            name: "server",
            args: &[needs("database", Kind::Word), MARIADB_SET],
            doc: "mounts the case's disk, `mariadb-install-db` and `mariadbd` with the data directory and redo log on it (`innodb_flush_method=fsync`, then each `set=NAME:VALUE`), the frozen balances' tables in the database the sessions and the expectations use, and what the server runs with: `mariadb on the forgetful disk: innodb_flush_method=fsync innodb_flush_log_at_trx_commit=1 innodb_doublewrite=1; database placed`",
        },
        Verb {
            name: "write-back",
            args: &[],
            doc: "writes every unsynced write back to the disk (the kernel's periodic write-back, `sync(1)`), so a cut drops only what follows: `written back: the disk holds every write so far`",
        },
        Verb {
            name: "placements",
            args: &[
                needs("count", Kind::Integer),
                needs("account", Kind::Word),
                needs("side", Kind::OneOf(&["BUY", "SELL"])),
                needs("qty", Kind::Word),
                needs("price", Kind::Word),
                needs("key", Kind::Word),
                may("market", Kind::Word, "`BTC-USDT`"),
                may(
                    "hold",
                    Kind::Word,
                    "none: every placement runs to its answer",
                ),
            ],
            doc: "N placements at once, each on a connection of its own (`{i}` in `key=` is its index): `acknowledged=20 refused=0`; with `hold=POINT` the first to reach the hook point is held there inside its transaction and the others wait for its row lock, seen in `INNODB_TRX`; the call returns with all N in flight, until the cut: `in_flight=4 held_at=balances-updated lock_waits=3`",
        },
        Verb {
            name: "kill-server",
            args: &[],
            doc: "SIGKILL of `mariadbd` alone (the disk keeps what was written), a start with InnoDB's crash recovery: `killed signal=9; recovery ok`",
        },
        Verb {
            name: "flush-pages",
            args: &[may(
                "table",
                Kind::Word,
                "none: the wait ends with no dirty page and an empty history list",
            )],
            doc: "InnoDB writes every dirty page (`innodb_max_dirty_pages_pct=0`, then back to its default) until `Innodb_buffer_pool_pages_dirty` is 0 and, with `table=T`, the disk holds T's file written and unsynced (`dirty_pages=0 last_unsynced_write=49152+16384 unsynced_bytes=16384 lost_syncs_n=[n]`), or without it purge has emptied the history list, so nothing is left to change a page later (`dirty_pages=0 history_len=0`)",
        },
        Verb {
            name: "lose-syncs",
            args: &[needs("table", Kind::Word)],
            doc: "strace attached to every thread of `mariadbd` makes each `fsync` and `fdatasync` of T's file and of the redo log succeed without being made, from now to the cut (`cases/power/src/lost_syncs.rs`): the state of a power cut during T's next page write; a `power-cut tear=T` then tears that write (`recovery=ok torn_bytes=512 doublewrite_restored=acct:3`, or `recovery=failed torn_bytes=512 corrupted_page=acct:3`)",
        },
    ],
};

/// `set=NAME:VALUE`, repeated: a server option of the case's MariaDB.
const MARIADB_SET: Arg = Arg {
    name: "set",
    kind: Kind::Word,
    absent: Some(
        "the durable defaults (`innodb_flush_method=fsync`, `innodb_flush_log_at_trx_commit=1`, `innodb_doublewrite=ON`)",
    ),
    repeats: true,
};

/// Every set family P composes.
pub const ALL: [&Verbs; 5] = [
    &STORE_ON_DISK,
    &CLUSTER_ON_DISK,
    &MARIADB_ON_DISK,
    &cases_frozen::verbs::EVENTS,
    &FAULTS,
];

/// The sets of the SQLite engine (`spec_engine.rs`).
pub const SQLITE: [&Verbs; 2] = [&STORE_ON_DISK, &FAULTS];

/// The sets of the cluster engine (`spec_cluster.rs`).
pub const CLUSTER: [&Verbs; 2] = [&CLUSTER_ON_DISK, &FAULTS];

/// The sets of the MariaDB engine (`spec_mariadb.rs`).
pub const MARIADB: [&Verbs; 3] = [&MARIADB_ON_DISK, &cases_frozen::verbs::EVENTS, &FAULTS];
