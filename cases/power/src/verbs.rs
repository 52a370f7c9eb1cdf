//! Family P's verbs on an inventory file on a forgetful disk, declared once: the
//! store's [`cases_inventory::verbs::ADD_ITEM`] and
//! [`cases_inventory::verbs::RECONCILE`], a worker that writes through the mount, and
//! `power-cut` from the shared fault vocabulary (`spec_engine.rs` runs them).

use case_kit::spec::verbs::{self, Kind, Verb, Verbs, may, needs};
use cases_inventory::verbs::{ADD_ITEM, RECONCILE};

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

/// The faults of the shared vocabulary family P's files use.
pub const FAULTS: Verbs = Verbs {
    title: verbs::FAULTS,
    verbs: &[verbs::POWER_CUT],
};

/// Every set family P composes.
pub const ALL: [&Verbs; 2] = [&STORE_ON_DISK, &FAULTS];
