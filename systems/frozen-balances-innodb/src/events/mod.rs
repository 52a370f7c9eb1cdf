//! The four business events on InnoDB: [`place`], [`fill`], [`cancel`], [`deposit`].
//!
//! Each attempt is one REPEATABLE READ transaction (set explicitly; InnoDB's default)
//! whose first statement registers the business id with a plain `INSERT` into
//! `balance_operation`. A concurrent attempt with the same id waits on the unique index
//! until the first ends; if that one committed, the INSERT fails with a duplicate key
//! (1062), the transaction is rolled back and the stored operation is read in a **new**
//! transaction — the seed's rule, because a read inside the failed transaction would use
//! that transaction's first snapshot. The stored result is replayed when the payload's
//! fingerprint matches ([`frozen_balances::FrozenError::PayloadMismatch`] when not).
//!
//! Rows are locked one by one in one fixed order (orders by id, then balances sorted by
//! account and asset), as on PostgreSQL. InnoDB can still deadlock where PostgreSQL does
//! not: inserters of one key that waited behind a transaction that rolled back each hold
//! a shared next-key lock on the key and then want to insert it (MySQL reference manual,
//! "Locks Set by Different SQL Statements in InnoDB"). A deadlock (1213) rolls the whole
//! transaction back; the attempt is retried with the same business id, at most
//! [`MAX_DEADLOCK_ATTEMPTS`] times in all, and counted in the caller's [`Tally`].

mod cancel;
mod deposit;
mod fill;
mod place;

use std::sync::atomic::{AtomicU32, Ordering};

use frozen_balances::hooks::{HookPoint, Hooks};
use frozen_balances::{
    Asset, Deltas, Event, LockedRow, LockedRows, Outcome, Recorded, check_change,
};
use mysql_async::prelude::Queryable;
use mysql_async::{IsolationLevel, Row, Transaction, TxOpts};

use crate::error::{ER_DUP_ENTRY, ER_LOCK_DEADLOCK, InnoError};

pub use cancel::cancel;
pub use deposit::deposit;
pub use fill::fill;
pub use place::place;
pub(crate) use place::place_once;

/// Attempts of one event when each ends in a deadlock (1213), the first included.
pub const MAX_DEADLOCK_ATTEMPTS: u32 = 5;

/// What the bounded retry saw, summed over the events a caller ran with it.
#[derive(Debug, Default)]
pub struct Tally {
    deadlocks: AtomicU32,
    duplicates: AtomicU32,
}

impl Tally {
    /// Deadlocks InnoDB reported (error 1213), each followed by a retry or by
    /// [`frozen_balances::FrozenError::DeadlockRetriesExhausted`].
    pub fn deadlocks(&self) -> u32 {
        self.deadlocks.load(Ordering::SeqCst)
    }

    /// Registrations refused with a duplicate key (error 1062), each answered by a read
    /// of the committed operation in a new transaction.
    pub fn duplicates(&self) -> u32 {
        self.duplicates.load(Ordering::SeqCst)
    }
}

/// Runs hook `point` of `event` (the hook sees no PostgreSQL transaction on this
/// engine).
///
/// Errors: [`frozen_balances::FrozenError::HookAborted`].
pub(crate) async fn hook(
    event: &Event<'_>,
    hooks: &dyn Hooks,
    point: HookPoint,
) -> Result<(), InnoError> {
    Ok(event.hook(hooks, point, None).await?)
}

/// Starts an event's transaction: REPEATABLE READ, set explicitly.
///
/// Errors: the server's.
pub(crate) async fn begin(conn: &mut mysql_async::Conn) -> Result<Transaction<'_>, InnoError> {
    let mut options = TxOpts::default();
    options.with_isolation_level(IsolationLevel::RepeatableRead);
    Ok(conn.start_transaction(options).await?)
}

// ANCHOR: register (quoted by docs/articles/frozen-balances.md; `./run.sh cite --check`)
const REGISTER_SQL: &str = "\
INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, outcome)
VALUES (?, ?, ?, ?, ?, 'PENDING')";
// ANCHOR_END: register

/// Step 1 of every event: the new operation's id, or `None` when the business id is
/// already committed (1062; the caller rolls back and calls [`replay`]).
///
/// Errors: the server's (1213 for the retry).
pub(crate) async fn register(
    tx: &mut Transaction<'_>,
    event: &Event<'_>,
    tally: &Tally,
) -> Result<Option<i64>, InnoError> {
    let inserted = tx
        .exec_drop(
            REGISTER_SQL,
            (
                event.tenant_id,
                event.business_id,
                event.kind.as_str(),
                &event.payload,
                &event.hash,
            ),
        )
        .await;
    match inserted.map_err(InnoError::from) {
        Ok(()) => {
            let id = tx
                .last_insert_id()
                .ok_or_else(|| InnoError::invariant("no id for the new operation"))?;
            Ok(Some(id as i64))
        }
        Err(error) if error.code() == Some(ER_DUP_ENTRY) => {
            tally.duplicates.fetch_add(1, Ordering::SeqCst);
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// The stored operation of `event`, read in a new (read-only) transaction after the
/// failed one was rolled back; its result, marked replayed.
///
/// Errors: [`frozen_balances::FrozenError::PayloadMismatch`]; [`frozen_balances::FrozenError::CommittedPending`]; the
/// server's.
pub(crate) async fn replay<R: Recorded>(
    conn: &mut mysql_async::Conn,
    event: &Event<'_>,
) -> Result<R, InnoError> {
    let mut options = TxOpts::default();
    options
        .with_isolation_level(IsolationLevel::RepeatableRead)
        .with_readonly(true);
    let mut tx = conn.start_transaction(options).await?;
    let stored = read_operation(&mut tx, event.tenant_id, event.business_id).await?;
    tx.commit().await?;
    let Some((hash, outcome, result)) = stored else {
        return Err(event.unreadable().into());
    };
    Ok(event.replay(hash, &outcome, result)?)
}

const READ_OPERATION_SQL: &str = "\
SELECT payload_hash, outcome, result FROM balance_operation WHERE tenant_id = ? AND business_id = ?";

/// The stored operation's fingerprint, outcome and result (a plain consistent read in
/// `tx`'s snapshot).
///
/// Errors: the server's.
pub async fn read_operation<Q: Queryable>(
    tx: &mut Q,
    tenant_id: &str,
    business_id: &str,
) -> Result<Option<(String, String, Option<String>)>, InnoError> {
    Ok(tx
        .exec_first(READ_OPERATION_SQL, (tenant_id, business_id))
        .await?)
}

const RECORD_SQL: &str =
    "UPDATE balance_operation SET outcome = ?, result = ? WHERE operation_id = ?";

/// The end of every committing path: record the `applied` outcome and result,
/// `before-commit`, COMMIT, `after-commit`.
///
/// Errors: [`frozen_balances::FrozenError::HookAborted`] (rolled back before commit; committed at
/// `after-commit`); the server's.
pub(crate) async fn finish<R: Recorded>(
    mut tx: Transaction<'_>,
    hooks: &dyn Hooks,
    event: &Event<'_>,
    operation_id: i64,
    applied: (Outcome, R),
) -> Result<R, InnoError> {
    let (outcome, result) = applied;
    let text = result.encode()?;
    tx.exec_drop(RECORD_SQL, (outcome.as_str(), text, operation_id))
        .await?;
    expect_one(&tx, "the operation's record")?;
    if let Err(error) = hook(event, hooks, HookPoint::BeforeCommit).await {
        let _ = tx.rollback().await;
        return Err(error);
    }
    tx.commit().await?;
    hook(event, hooks, HookPoint::AfterCommit).await?;
    Ok(result)
}

/// Checks that the last statement affected exactly one row (matched rows: the product's
/// connections set `CLIENT_FOUND_ROWS`).
pub(crate) fn expect_one(tx: &Transaction<'_>, what: &str) -> Result<(), InnoError> {
    match tx.affected_rows() {
        1 => Ok(()),
        n => Err(InnoError::invariant(format!(
            "{what}: {n} rows affected, expected 1"
        ))),
    }
}

const EXISTING_ROWS_SQL: &str = "\
SELECT account_id, asset FROM balance WHERE tenant_id = ? AND account_id = ? AND asset = ?";

const INSERT_ROW_SQL: &str = "\
INSERT IGNORE INTO balance (tenant_id, account_id, asset, allow_negative) VALUES (?, ?, ?, ?)";

/// Creates missing balance rows at 0 (accounts are created on demand). Existing rows are
/// found by a plain read and left alone: an `INSERT IGNORE` of an existing row would take
/// a shared lock on it, and two events that then update the row would deadlock.
///
/// Errors: the server's.
pub(crate) async fn ensure_rows(
    tx: &mut Transaction<'_>,
    tenant_id: &str,
    rows: &[(&str, Asset, bool)],
) -> Result<(), InnoError> {
    let mut sorted: Vec<(&str, Asset, bool)> = rows.to_vec();
    sorted.sort_by(|a, b| (a.0, a.1.as_str()).cmp(&(b.0, b.1.as_str())));
    for (account, asset, negative) in sorted {
        let found: Option<Row> = tx
            .exec_first(EXISTING_ROWS_SQL, (tenant_id, account, asset.as_str()))
            .await?;
        if found.is_none() {
            tx.exec_drop(
                INSERT_ROW_SQL,
                (tenant_id, account, asset.as_str(), negative),
            )
            .await?;
        }
    }
    Ok(())
}

const LOCK_ROW_SQL: &str = "\
SELECT available, frozen, allow_negative FROM balance
WHERE tenant_id = ? AND account_id = ? AND asset = ? FOR UPDATE";

/// Locks the rows of `deltas` one statement at a time in the map's (sorted) order and
/// checks that the changes keep every CHECK ([`check_change`]); the rows as locked.
///
/// Errors: [`frozen_balances::FrozenError::InvariantViolated`] (a missing row or a broken CHECK),
/// [`frozen_balances::FrozenError::Amount`] (a balance past the 64-bit range); the server's.
pub(crate) async fn lock_and_check(
    tx: &mut Transaction<'_>,
    tenant_id: &str,
    deltas: &Deltas,
) -> Result<LockedRows, InnoError> {
    let mut locked = LockedRows::new();
    for ((account, asset), delta) in deltas {
        let row: Option<(i64, i64, bool)> = tx
            .exec_first(LOCK_ROW_SQL, (tenant_id, account, *asset))
            .await?;
        let (available, frozen, allow_negative) =
            row.ok_or_else(|| InnoError::invariant(format!("no balance row {account} {asset}")))?;
        let row = LockedRow {
            available,
            frozen,
            allow_negative,
        };
        check_change(account, asset, row, delta)?;
        locked.insert((account.clone(), *asset), row);
    }
    Ok(locked)
}

const APPLY_SQL: &str = "\
UPDATE balance SET available = available + ?, frozen = frozen + ?, version = version + 1
WHERE tenant_id = ? AND account_id = ? AND asset = ?";

const MOVEMENT_SQL: &str = "\
INSERT INTO balance_movement (tenant_id, business_id, account_id, asset, available_delta, frozen_delta)
VALUES (?, ?, ?, ?, ?, ?)";

/// Updates the (already locked) balance rows by `deltas`, one statement per row.
///
/// Errors: [`frozen_balances::FrozenError::InvariantViolated`] when a row is not matched; the server's.
pub(crate) async fn apply(
    tx: &mut Transaction<'_>,
    tenant_id: &str,
    deltas: &Deltas,
) -> Result<(), InnoError> {
    for ((account, asset), delta) in deltas {
        if delta.is_zero() {
            continue;
        }
        tx.exec_drop(
            APPLY_SQL,
            (delta.available, delta.frozen, tenant_id, account, *asset),
        )
        .await?;
        expect_one(tx, &format!("balance {account} {asset}"))?;
    }
    Ok(())
}

/// Writes one `balance_movement` per non-zero change of `deltas`.
///
/// Errors: the server's.
pub(crate) async fn write_movements(
    tx: &mut Transaction<'_>,
    event: &Event<'_>,
    deltas: &Deltas,
) -> Result<(), InnoError> {
    for ((account, asset), delta) in deltas {
        if delta.is_zero() {
            continue;
        }
        tx.exec_drop(
            MOVEMENT_SQL,
            (
                event.tenant_id,
                event.business_id,
                account,
                *asset,
                delta.available,
                delta.frozen,
            ),
        )
        .await?;
    }
    Ok(())
}

/// One attempt of an event, in the shape every event shares: its transaction
/// ([`begin`]); step 1, [`register`] (a committed business id rolls back and
/// [`replay`]s); the `registered` hook; `body` inside the transaction; then [`finish`]
/// with `body`'s outcome and result — or, when the hook or `body` fails, a rollback with
/// that error.
///
/// Errors: the hook's, `body`'s, [`finish`]'s; the server's.
pub(crate) async fn run_once<R: Recorded>(
    conn: &mut mysql_async::Conn,
    event: &Event<'_>,
    hooks: &dyn Hooks,
    tally: &Tally,
    body: impl AsyncFnOnce(&mut Transaction<'_>) -> Result<(Outcome, R), InnoError>,
) -> Result<R, InnoError> {
    let mut tx = begin(conn).await?;
    let Some(operation_id) = register(&mut tx, event, tally).await? else {
        tx.rollback().await?;
        return replay(conn, event).await;
    };
    let applied = match hook(event, hooks, HookPoint::Registered).await {
        Ok(()) => body(&mut tx).await,
        Err(error) => Err(error),
    };
    match applied {
        Ok(applied) => finish(tx, hooks, event, operation_id, applied).await,
        Err(error) => rollback_with(tx, error).await,
    }
}

/// Rolls `tx` back and returns `error`.
pub(crate) async fn rollback_with<T>(
    tx: Transaction<'_>,
    error: InnoError,
) -> Result<T, InnoError> {
    let _ = tx.rollback().await;
    Err(error)
}

/// Runs `$attempt` (an expression yielding a future of `Result<_, InnoError>`) again
/// while it fails with a deadlock (1213), at most [`MAX_DEADLOCK_ATTEMPTS`] times in all,
/// counting each deadlock in `$tally`.
macro_rules! retry_on_deadlock {
    ($tally:expr, $attempt:expr) => {{
        let mut attempt = 1;
        loop {
            match $attempt.await {
                Err(error) if error.code() == Some($crate::error::ER_LOCK_DEADLOCK) => {
                    $tally.count_deadlock();
                    if attempt >= $crate::events::MAX_DEADLOCK_ATTEMPTS {
                        break Err($crate::InnoError::Frozen(
                            frozen_balances::FrozenError::DeadlockRetriesExhausted {
                                attempts: attempt,
                            },
                        ));
                    }
                    attempt += 1;
                }
                other => break other,
            }
        }
    }};
}
pub(crate) use retry_on_deadlock;

impl Tally {
    pub(crate) fn count_deadlock(&self) {
        self.deadlocks.fetch_add(1, Ordering::SeqCst);
    }
}

/// Whether `error` is InnoDB's deadlock (1213).
pub fn is_deadlock(error: &InnoError) -> bool {
    error.code() == Some(ER_LOCK_DEADLOCK)
}
