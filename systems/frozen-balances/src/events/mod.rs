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

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, Row, Transaction};

use crate::amount::AmountError;
use crate::asset::Asset;
use crate::error::FrozenError;
use crate::hooks::{EventKind, HookContext, HookPoint, Hooks};

pub use cancel::{CancelRequest, CancelResult, cancel};
pub use deposit::{DepositRequest, DepositResult, deposit};
pub use fill::{FillRequest, FillResult, ORDER_COLUMNS, OrderRow, Settlement, fill, settle};
pub use place::{PlaceRequest, PlaceResult, place};

/// Attempts of one event when each ends in a deadlock (40P01), the first included.
pub const MAX_DEADLOCK_ATTEMPTS: u32 = 5;
/// SQLSTATE deadlock_detected (PostgreSQL docs, Appendix A).
pub const DEADLOCK_DETECTED: &str = "40P01";
/// Longest tenant id, business id or account id, characters.
pub const MAX_ID_CHARS: usize = 255;
/// Leading SHA-256 bytes kept in a payload fingerprint.
pub const PAYLOAD_HASH_BYTES: usize = 16;
/// Attempts of the registration when the conflicting row is not visible (only possible
/// when registrations are deleted concurrently).
const REGISTER_ATTEMPTS: u32 = 3;

/// The recorded business outcome of an event (`balance_operation.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// The event took effect.
    Ok,
    /// A placement found less available than it must freeze; nothing moved.
    Insufficient,
    /// A fill or cancel named an order that is no longer open; nothing moved.
    OrderClosed,
}

impl Outcome {
    /// `OK`, `INSUFFICIENT`, `ORDER_CLOSED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::Insufficient => "INSUFFICIENT",
            Outcome::OrderClosed => "ORDER_CLOSED",
        }
    }

    /// The outcome stored as `text` (`OK`, `INSUFFICIENT`, `ORDER_CLOSED`); `None` for
    /// anything else (`PENDING`).
    pub fn parse(text: &str) -> Option<Outcome> {
        [Outcome::Ok, Outcome::Insufficient, Outcome::OrderClosed]
            .into_iter()
            .find(|o| o.as_str() == text)
    }
}

/// An order's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum OrderStatus {
    /// Holds a remainder of its freeze.
    Open,
    /// Filled completely; holds nothing.
    Filled,
    /// Cancelled; its remainder was released.
    Cancelled,
}

impl OrderStatus {
    /// `OPEN`, `FILLED`, `CANCELLED`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Open => "OPEN",
            OrderStatus::Filled => "FILLED",
            OrderStatus::Cancelled => "CANCELLED",
        }
    }

    /// The status stored as `text`.
    ///
    /// Errors: [`FrozenError::InvariantViolated`] for an unknown status.
    pub fn parse(text: &str) -> Result<OrderStatus, FrozenError> {
        [
            OrderStatus::Open,
            OrderStatus::Filled,
            OrderStatus::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
        .ok_or_else(|| FrozenError::InvariantViolated(format!("order status {text:?}")))
    }
}

/// The fingerprint of a canonical payload: SHA-256 of its UTF-8 text, the first
/// [`PAYLOAD_HASH_BYTES`] bytes as lower-case hex (32 characters).
pub fn payload_hash(payload: &str) -> String {
    let digest = Sha256::digest(payload.as_bytes());
    digest[..PAYLOAD_HASH_BYTES]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A result recorded as JSON with its operation and returned again on replay.
pub(crate) trait Recorded: Serialize + DeserializeOwned {
    fn mark_replayed(&mut self);
}

/// One event being executed: what the engine needs besides the event's own work.
pub(crate) struct Event<'r> {
    pub kind: EventKind,
    pub tenant_id: &'r str,
    pub business_id: &'r str,
    /// Canonical payload, `KIND|field|field…` with amounts in minor units.
    pub payload: String,
    pub hash: String,
}

impl<'r> Event<'r> {
    pub fn new(kind: EventKind, tenant_id: &'r str, business_id: &'r str, payload: String) -> Self {
        let hash = payload_hash(&payload);
        Event {
            kind,
            tenant_id,
            business_id,
            payload,
            hash,
        }
    }

    /// Runs hook `point`; `Err(())` when the hook aborted.
    pub async fn hook(
        &self,
        hooks: &dyn Hooks,
        point: HookPoint,
        tx: Option<&Transaction<'_>>,
    ) -> Result<(), FrozenError> {
        let ctx = HookContext {
            point,
            event: self.kind,
            tenant_id: self.tenant_id,
            business_id: self.business_id,
            transaction: tx,
        };
        hooks
            .at(ctx)
            .await
            .map_err(|_| FrozenError::HookAborted(point))
    }
}

/// Checks a tenant id, business id or account id: 1 to [`MAX_ID_CHARS`] characters,
/// none of them a control character.
pub fn check_id(what: &str, id: &str) -> Result<(), FrozenError> {
    if id.is_empty() || id.chars().count() > MAX_ID_CHARS || id.chars().any(char::is_control) {
        return Err(FrozenError::Invalid(format!(
            "{what} must have 1 to {MAX_ID_CHARS} characters and no control characters"
        )));
    }
    Ok(())
}

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
    Err(FrozenError::InvariantViolated(format!(
        "operation ({}, {}) conflicted but could not be read",
        event.tenant_id, event.business_id
    )))
}

/// Compares fingerprints and decodes the stored result.
fn replay<R: Recorded>(event: &Event<'_>, row: &Row) -> Result<R, FrozenError> {
    let stored_hash: String = row.try_get("payload_hash")?;
    if stored_hash != event.hash {
        return Err(FrozenError::PayloadMismatch {
            stored_hash,
            payload_hash: event.hash.clone(),
        });
    }
    let outcome: String = row.try_get("outcome")?;
    let result: Option<String> = row.try_get("result")?;
    let (Some(_), Some(result)) = (Outcome::parse(&outcome), result) else {
        return Err(FrozenError::CommittedPending {
            tenant_id: event.tenant_id.to_owned(),
            business_id: event.business_id.to_owned(),
        });
    };
    let mut decoded: R = serde_json::from_str(&result).map_err(|error| {
        FrozenError::InvariantViolated(format!("stored result does not decode: {error}"))
    })?;
    decoded.mark_replayed();
    Ok(decoded)
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
    let text = serde_json::to_string(&result)
        .map_err(|error| FrozenError::InvariantViolated(format!("result encoding: {error}")))?;
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

/// One balance row's change inside an event, minor units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delta {
    /// Change of `available`.
    pub available: i64,
    /// Change of `frozen`.
    pub frozen: i64,
}

/// The changes of one event, keyed and therefore iterated in lock order: sorted by
/// account id, then asset name (the tenant is the same for all rows of an event).
pub type Deltas = BTreeMap<(String, &'static str), Delta>;

/// Adds `available` and `frozen` to the change of (`account`, `asset`).
pub fn add_delta(
    deltas: &mut Deltas,
    account: &str,
    asset: Asset,
    available: i64,
    frozen: i64,
) -> Result<(), FrozenError> {
    let entry = deltas
        .entry((account.to_owned(), asset.as_str()))
        .or_default();
    let overflow = || FrozenError::InvariantViolated("a delta overflows 64 bits".into());
    entry.available = entry
        .available
        .checked_add(available)
        .ok_or_else(overflow)?;
    entry.frozen = entry.frozen.checked_add(frozen).ok_or_else(overflow)?;
    Ok(())
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

/// A locked balance row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockedRow {
    pub available: i64,
    pub frozen: i64,
    pub allow_negative: bool,
}

const LOCK_ROW_SQL: &str = "\
SELECT available, frozen, allow_negative FROM balance
WHERE tenant_id = $1 AND account_id = $2 AND asset = $3
FOR UPDATE";

/// Locks the rows of `deltas` one statement at a time, in the map's (sorted) order, and
/// checks that the changes keep every CHECK: frozen ≥ 0, available ≥ 0 unless
/// `allow_negative`, no 64-bit overflow. A violation is a bug
/// ([`FrozenError::InvariantViolated`]), found before anything is written.
pub(crate) async fn lock_and_check(
    tx: &Transaction<'_>,
    tenant_id: &str,
    deltas: &Deltas,
) -> Result<BTreeMap<(String, &'static str), LockedRow>, FrozenError> {
    let mut locked = BTreeMap::new();
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
        let (Some(available), Some(frozen)) = (
            row.available.checked_add(delta.available),
            row.frozen.checked_add(delta.frozen),
        ) else {
            // A request that would carry a balance past the bigint range (many maximal
            // deposits): the client's request cannot be done; nothing is recorded.
            let asset: Asset = asset
                .parse()
                .map_err(|_| FrozenError::InvariantViolated(format!("unknown asset {asset}")))?;
            return Err(FrozenError::Amount(AmountError::OutOfRange {
                what: "the balance after this event",
                asset,
            }));
        };
        match (available, frozen) {
            (available, frozen) if frozen >= 0 && (row.allow_negative || available >= 0) => {}
            _ => {
                return Err(FrozenError::InvariantViolated(format!(
                    "{account} {asset}: available {} frozen {} cannot take available {:+} frozen {:+}",
                    row.available, row.frozen, delta.available, delta.frozen
                )));
            }
        }
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
        if *delta == Delta::default() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_hash_shape_and_vector() {
        // printf 'DEPOSIT|alice|USDT|10000000000' | sha256sum | cut -c1-32
        let h = payload_hash("DEPOSIT|alice|USDT|10000000000");
        assert_eq!(h, "20973e635cf07627df8e928c1cf31694");
        assert_ne!(h, payload_hash("DEPOSIT|alice|USDT|10000000001"));
    }

    #[test]
    fn deltas_iterate_in_lock_order_and_merge() {
        let mut d = Deltas::new();
        add_delta(&mut d, "sys-fee", Asset::Usdt, 5, 0).unwrap();
        add_delta(&mut d, "bob", Asset::Usdt, 1, 0).unwrap();
        add_delta(&mut d, "bob", Asset::Btc, 0, -1).unwrap();
        add_delta(&mut d, "alice", Asset::Usdt, 2, -3).unwrap();
        add_delta(&mut d, "alice", Asset::Usdt, 1, 0).unwrap();
        let keys: Vec<_> = d.keys().cloned().collect();
        assert_eq!(
            keys,
            vec![
                ("alice".to_owned(), "USDT"),
                ("bob".to_owned(), "BTC"),
                ("bob".to_owned(), "USDT"),
                ("sys-fee".to_owned(), "USDT"),
            ]
        );
        assert_eq!(
            d[&("alice".to_owned(), "USDT")],
            Delta {
                available: 3,
                frozen: -3
            }
        );
    }
}
