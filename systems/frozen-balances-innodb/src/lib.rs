//! Frozen balances for exchange orders (SPEC §8) on InnoDB, the engine the seed's design
//! was written for, through MariaDB's protocol with `mysql_async`: the same contract as
//! the PostgreSQL system (`frozen_balances`): [`place`], [`fill`], [`cancel`],
//! [`deposit`], [`reconcile`], with the same hook points, requests, results, amount
//! arithmetic, settlement and payload fingerprints, which this crate takes from
//! `frozen_balances` instead of copying them: what every event decides whatever the
//! engine (`frozen_balances::decisions`: each request's checks, rows and changes, each
//! result, the check of a locked row, the replay of a stored record) is written there
//! once. What differs is the engine's part, its statements:
//!
//! - [`schema`]: the four tables in InnoDB, ids compared byte for byte (`utf8mb4_bin`).
//! - [`events`](mod@events): each event is one REPEATABLE READ transaction (InnoDB's
//!   default, stated explicitly) that first registers its business id with a plain
//!   `INSERT`. A duplicate key (error 1062) rolls the transaction back and reads the
//!   committed operation **in a new transaction**: under REPEATABLE READ a read inside
//!   the failed transaction would use its first snapshot and could find nothing. A
//!   deadlock (error 1213, the whole transaction rolled back by InnoDB) is retried with
//!   the same business id at most [`MAX_DEADLOCK_ATTEMPTS`] times and counted in a
//!   [`Tally`].
//! - [`conn`]: connections with `CLIENT_FOUND_ROWS`, so the product's "exactly one row"
//!   checks count matched rows as PostgreSQL does, not changed rows.
//! - [`reconcile`](mod@reconcile): the per-asset checks in one consistent snapshot
//!   (`START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY`): plain reads, no locks,
//!   so no gap locks on the rows events insert meanwhile.
//! - [`naive`]: the designs the family's negative controls run.
//!
//! Amounts are integer minor units (`i64`; `BIGINT` in the database).

pub mod conn;
pub mod error;
pub mod events;
pub mod naive;
pub mod query;
pub mod reconcile;
pub mod schema;

pub use error::InnoError;
pub use events::{MAX_DEADLOCK_ATTEMPTS, Tally, cancel, deposit, fill, place};
pub use reconcile::reconcile;
