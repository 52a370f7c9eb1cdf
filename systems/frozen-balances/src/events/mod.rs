//! The four business events of SPEC §8: [`place`], [`fill`], [`cancel`], [`deposit`].
//!
//! Each runs as one READ COMMITTED transaction (isolation set explicitly) that first
//! registers its business id: `INSERT ... ON CONFLICT (tenant_id, business_id) DO NOTHING`.
//! A second request with the same id waits on the unique index until the first ends; if
//! it committed, the stored row is read in a new statement (a new snapshot under READ
//! COMMITTED), the transaction rolls back, and the stored result is replayed when the
//! canonical payload's fingerprint matches ([`FrozenError::PayloadMismatch`] when not).
//! Refused events (INSUFFICIENT, ORDER_CLOSED) are recorded and replayed the same way.
//!
//! Every balance change writes one `balance_movement` per (event, account, asset), in the
//! same transaction. Rows that an event updates together are locked one by one in one
//! fixed order, sorted by (account, asset) within the tenant, so two events can never
//! wait for each other in a cycle over balance rows; orders are locked before balances,
//! also sorted. A deadlock (SQLSTATE 40P01) all the same — e.g. with a writer outside the
//! product — rolls the attempt back and retries it with the same business id, at most
//! [`MAX_DEADLOCK_ATTEMPTS`] times.

mod cancel;
mod deposit;
mod fill;
mod place;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, Row, Transaction};

use crate::asset::Asset;
use crate::decisions::{Event, LockedRow, LockedRows, Recorded, check_change};
use crate::error::FrozenError;
use crate::hooks::{HookPoint, Hooks};

pub use cancel::{CancelRequest, CancelResult, cancel};
pub use deposit::{DepositRequest, DepositResult, deposit};
pub use fill::{
    FillRequest, FillResult, ORDER_COLUMNS, OrderRow, Settlement, buy_and_sell, fill, settle,
};
pub use place::{PlaceRequest, PlaceResult, place};
// The engine-independent parts, defined in `crate::decisions`, at their old paths.
pub use crate::decisions::{
    Delta, Deltas, MAX_ID_CHARS, OrderStatus, Outcome, PAYLOAD_HASH_BYTES, add_delta, check_id,
    payload_hash,
};

/// Attempts of one event when each ends in a deadlock (40P01), the first included.
pub const MAX_DEADLOCK_ATTEMPTS: u32 = 5;
/// SQLSTATE deadlock_detected (PostgreSQL docs, Appendix A).
pub const DEADLOCK_DETECTED: &str = "40P01";
/// Attempts of the registration when the conflicting row is not visible (only possible
/// when registrations are deleted concurrently).
const REGISTER_ATTEMPTS: u32 = 3;

/// Starts the event's transaction (READ COMMITTED, set explicitly).
pub(crate) async fn begin(client: &mut Client) -> Result<Transaction<'_>, FrozenError> {
    Ok(client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?)
}

/// What [`register`] found.
pub(crate) enum Registration<R> {
    /// Registered as PENDING under this `operation_id`; the event runs.
    New(i64),
    /// Known: the stored result, already marked replayed (the transaction is rolled back).
    Replay(R),
}

// ON CONFLICT DO NOTHING waits on the unique index while another transaction holds the
// same (tenant_id, business_id), then returns no row if that one committed (PostgreSQL
// docs, INSERT, "ON CONFLICT Clause").
const REGISTER_SQL: &str = "\
INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, outcome)
VALUES ($1, $2, $3, $4, $5, 'PENDING')
ON CONFLICT (tenant_id, business_id) DO NOTHING
RETURNING operation_id";

const READ_REGISTRATION_SQL: &str = "\
SELECT payload_hash, outcome, result::text AS result
FROM balance_operation
WHERE tenant_id = $1 AND business_id = $2";

/// Step 1 of every event: register the business id, or read back what it recorded. On
/// [`Registration::Replay`] the caller rolls the transaction back and returns the result.
pub(crate) async fn register<R: Recorded>(
    tx: &Transaction<'_>,
    event: &Event<'_>,
) -> Result<Registration<R>, FrozenError> {
    let kind = event.kind.as_str();
    for _ in 0..REGISTER_ATTEMPTS {
        let registered = tx
            .query_typed_opt(
                REGISTER_SQL,
                &[
                    (&event.tenant_id, Type::TEXT),
                    (&event.business_id, Type::TEXT),
                    (&kind, Type::TEXT),
                    (&event.payload, Type::TEXT),
                    (&event.hash, Type::TEXT),
                ],
            )
            .await?;
        if let Some(row) = registered {
            return Ok(Registration::New(row.try_get("operation_id")?));
        }
        let stored = tx
            .query_typed_opt(
                READ_REGISTRATION_SQL,
                &[
                    (&event.tenant_id, Type::TEXT),
                    (&event.business_id, Type::TEXT),
                ],
            )
            .await?;
        if let Some(row) = stored {
            return Ok(Registration::Replay(replay(event, &row)?));
        }
    }
    Err(event.unreadable())
}

/// Compares fingerprints and decodes the stored result ([`Event::replay`]).
fn replay<R: Recorded>(event: &Event<'_>, row: &Row) -> Result<R, FrozenError> {
    let outcome: String = row.try_get("outcome")?;
    event.replay(
        row.try_get("payload_hash")?,
        &outcome,
        row.try_get("result")?,
    )
}

const RECORD_SQL: &str = "\
UPDATE balance_operation SET outcome = $2, result = $3::text::jsonb WHERE operation_id = $1";

/// The end of every committing path: record `outcome` and `result`, `before-commit`,
/// COMMIT, `after-commit`.
pub(crate) async fn finish<R: Recorded>(
    tx: Transaction<'_>,
    hooks: &dyn Hooks,
    event: &Event<'_>,
    operation_id: i64,
    outcome: Outcome,
    result: R,
) -> Result<R, FrozenError> {
    let text = result.encode()?;
    let outcome_text = outcome.as_str();
    tx.execute_typed(
        RECORD_SQL,
        &[
            (&operation_id, Type::INT8),
            (&outcome_text, Type::TEXT),
            (&text, Type::TEXT),
        ],
    )
    .await?;
    if let Err(error) = event.hook(hooks, HookPoint::BeforeCommit, Some(&tx)).await {
        let _ = tx.rollback().await;
        return Err(error);
    }
    tx.commit().await?;
    event.hook(hooks, HookPoint::AfterCommit, None).await?;
    Ok(result)
}

/// Runs a hook inside the transaction; on abort rolls back and returns the error.
pub(crate) async fn hook_in_tx<'t>(
    tx: Transaction<'t>,
    hooks: &dyn Hooks,
    event: &Event<'_>,
    point: HookPoint,
) -> Result<Transaction<'t>, FrozenError> {
    match event.hook(hooks, point, Some(&tx)).await {
        Ok(()) => Ok(tx),
        Err(error) => {
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}

const ENSURE_ROWS_SQL: &str = "\
INSERT INTO balance (tenant_id, account_id, asset, allow_negative)
SELECT $1, a, s, n FROM unnest($2::text[], $3::text[], $4::boolean[]) WITH ORDINALITY AS t(a, s, n, i)
ORDER BY i
ON CONFLICT (tenant_id, account_id, asset) DO NOTHING";

/// Creates missing balance rows at 0 (accounts are created on demand); existing rows are
/// left alone and not locked. `rows` in lock order.
pub(crate) async fn ensure_rows(
    tx: &Transaction<'_>,
    tenant_id: &str,
    rows: &[(&str, Asset, bool)],
) -> Result<(), FrozenError> {
    let mut sorted: Vec<(&str, Asset, bool)> = rows.to_vec();
    sorted.sort_by(|a, b| (a.0, a.1.as_str()).cmp(&(b.0, b.1.as_str())));
    let accounts: Vec<&str> = sorted.iter().map(|r| r.0).collect();
    let assets: Vec<&str> = sorted.iter().map(|r| r.1.as_str()).collect();
    let negative: Vec<bool> = sorted.iter().map(|r| r.2).collect();
    tx.execute_typed(
        ENSURE_ROWS_SQL,
        &[
            (&tenant_id, Type::TEXT),
            (&accounts, Type::TEXT_ARRAY),
            (&assets, Type::TEXT_ARRAY),
            (&negative, Type::BOOL_ARRAY),
        ],
    )
    .await?;
    Ok(())
}

/// The outstanding shortfall of an account's asset: deposits reversed after they were
/// partly spent (`crate::reorg`, F25).
const HELD_SQL: &str = "\
SELECT coalesce(sum(shortfall), 0)::bigint FROM chain_deposit
WHERE tenant_id = $1 AND account_id = $2 AND asset = $3 AND status = 'REVERSED'";

const ROW_EXISTS_SQL: &str = "\
SELECT EXISTS (SELECT 1 FROM balance WHERE tenant_id = $1 AND account_id = $2 AND asset = $3)";

/// Refuses an event that would freeze `asset` of an account holding no row of it: the
/// row is never created for a freeze (a row at 0 would then be refused as
/// INSUFFICIENT and recorded, and the account would seem to hold an asset it never
/// had). Read without a lock: a row is never deleted, so one seen stays. Then refuses
/// an account on hold for the asset ([`HELD_SQL`]: a reversed deposit's shortfall
/// outstanding).
///
/// Errors: [`FrozenError::NoBalance`]; [`FrozenError::Held`]; [`FrozenError::Db`].
pub(crate) async fn require_row(
    tx: &Transaction<'_>,
    tenant_id: &str,
    account_id: &str,
    asset: Asset,
) -> Result<(), FrozenError> {
    let exists: bool = tx
        .query_typed_one(
            ROW_EXISTS_SQL,
            &[
                (&tenant_id, Type::TEXT),
                (&account_id, Type::TEXT),
                (&asset.as_str(), Type::TEXT),
            ],
        )
        .await?
        .try_get(0)?;
    if !exists {
        return Err(FrozenError::NoBalance {
            account_id: account_id.to_owned(),
            asset,
        });
    }
    let shortfall: i64 = tx
        .query_typed_one(
            HELD_SQL,
            &[
                (&tenant_id, Type::TEXT),
                (&account_id, Type::TEXT),
                (&asset.as_str(), Type::TEXT),
            ],
        )
        .await?
        .try_get(0)?;
    if shortfall > 0 {
        return Err(FrozenError::Held {
            account_id: account_id.to_owned(),
            asset,
            shortfall,
        });
    }
    Ok(())
}

const LOCK_ROW_SQL: &str = "\
SELECT available, frozen, allow_negative FROM balance
WHERE tenant_id = $1 AND account_id = $2 AND asset = $3
FOR UPDATE";

/// Locks the rows of `deltas` one statement at a time, in the map's (sorted) order, and
/// checks that the changes keep every CHECK ([`check_change`]), before anything is
/// written.
pub(crate) async fn lock_and_check(
    tx: &Transaction<'_>,
    tenant_id: &str,
    deltas: &Deltas,
) -> Result<LockedRows, FrozenError> {
    let mut locked = LockedRows::new();
    for ((account, asset), delta) in deltas {
        let row = tx
            .query_typed_opt(
                LOCK_ROW_SQL,
                &[
                    (&tenant_id, Type::TEXT),
                    (account, Type::TEXT),
                    (asset, Type::TEXT),
                ],
            )
            .await?
            .ok_or_else(|| {
                FrozenError::InvariantViolated(format!("no balance row {account} {asset}"))
            })?;
        let row = LockedRow {
            available: row.try_get("available")?,
            frozen: row.try_get("frozen")?,
            allow_negative: row.try_get("allow_negative")?,
        };
        check_change(account, asset, row, delta)?;
        locked.insert((account.clone(), *asset), row);
    }
    Ok(locked)
}

const APPLY_SQL: &str = "\
UPDATE balance b
SET available = b.available + d.av, frozen = b.frozen + d.fr, version = b.version + 1
FROM unnest($2::text[], $3::text[], $4::int8[], $5::int8[]) AS d(account_id, asset, av, fr)
WHERE b.tenant_id = $1 AND b.account_id = d.account_id AND b.asset = d.asset";

const MOVEMENTS_SQL: &str = "\
INSERT INTO balance_movement (tenant_id, business_id, account_id, asset, available_delta, frozen_delta)
SELECT $1, $2, a, s, av, fr FROM unnest($3::text[], $4::text[], $5::int8[], $6::int8[]) AS d(a, s, av, fr)";

/// Columns of `deltas` without the zero changes, for the array parameters.
fn columns(deltas: &Deltas) -> (Vec<&str>, Vec<&str>, Vec<i64>, Vec<i64>) {
    let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((account, asset), delta) in deltas {
        if delta.is_zero() {
            continue;
        }
        columns.0.push(account.as_str());
        columns.1.push(*asset);
        columns.2.push(delta.available);
        columns.3.push(delta.frozen);
    }
    columns
}

/// Updates the (already locked) balance rows by `deltas`, in one statement.
pub(crate) async fn apply(
    tx: &Transaction<'_>,
    tenant_id: &str,
    deltas: &Deltas,
) -> Result<(), FrozenError> {
    let (accounts, assets, available, frozen) = columns(deltas);
    let updated = tx
        .execute_typed(
            APPLY_SQL,
            &[
                (&tenant_id, Type::TEXT),
                (&accounts, Type::TEXT_ARRAY),
                (&assets, Type::TEXT_ARRAY),
                (&available, Type::INT8_ARRAY),
                (&frozen, Type::INT8_ARRAY),
            ],
        )
        .await?;
    if updated != accounts.len() as u64 {
        return Err(FrozenError::InvariantViolated(format!(
            "updated {updated} balance rows, expected {}",
            accounts.len()
        )));
    }
    Ok(())
}

/// Writes one `balance_movement` per non-zero change of `deltas`.
pub(crate) async fn write_movements(
    tx: &Transaction<'_>,
    event: &Event<'_>,
    deltas: &Deltas,
) -> Result<(), FrozenError> {
    let (accounts, assets, available, frozen) = columns(deltas);
    tx.execute_typed(
        MOVEMENTS_SQL,
        &[
            (&event.tenant_id, Type::TEXT),
            (&event.business_id, Type::TEXT),
            (&accounts, Type::TEXT_ARRAY),
            (&assets, Type::TEXT_ARRAY),
            (&available, Type::INT8_ARRAY),
            (&frozen, Type::INT8_ARRAY),
        ],
    )
    .await?;
    Ok(())
}

/// Runs `$attempt` (an expression yielding a future of `Result<_, FrozenError>`) again
/// while it fails with a deadlock, at most [`MAX_DEADLOCK_ATTEMPTS`] times in all.
macro_rules! retry_on_deadlock {
    ($attempt:expr) => {{
        let mut attempt = 1;
        loop {
            match $attempt.await {
                Err(error) if error.sqlstate() == Some($crate::events::DEADLOCK_DETECTED) => {
                    if attempt >= $crate::events::MAX_DEADLOCK_ATTEMPTS {
                        break Err($crate::error::FrozenError::DeadlockRetriesExhausted {
                            attempts: attempt,
                        });
                    }
                    attempt += 1;
                }
                other => break other,
            }
        }
    }};
}
pub(crate) use retry_on_deadlock;
