//! Withdrawals to an external network, and deposits it reports (SPEC §8,
//! "further F cases" F13–F16).
//!
//! A withdrawal has an effect the database cannot roll back: a transfer on another
//! system. So the database only ever commits business state and a pending event, and
//! never waits for the other system while it holds a balance row lock:
//!
//! 1. [`request`] (one READ COMMITTED transaction, its business id registered first, as
//!    every event): freezes the amount with the conditional update of a placement,
//!    writes the `withdrawal` record as `REQUESTED`, its first history row, and a
//!    `withdrawal_outbox` event. No external call.
//! 2. An executor (the `withdrawal-executor` process of the `external-net` crate) reads
//!    [`pending`] outbox events, calls the network **outside any transaction**, with the
//!    withdrawal id as the network's idempotency key, and records what it learnt with
//!    [`mark`] (`BROADCAST` when the network accepted, `UNKNOWN` when the answer was lost
//!    or timed out; neither touches a balance row).
//! 3. [`settle`] (one transaction, its own business id `<withdrawal id>#settle`): the
//!    network says the transfer is `CONFIRMED` → the frozen amount is consumed (it goes to
//!    [`SYS_WITHDRAWAL`], so per asset the books still sum to 0); `FAILED` (the network
//!    refused the broadcast) or `REJECTED` (a status query says so) → it is released to
//!    available. Registered once: a second settlement replays the first and moves
//!    nothing; another outcome for the same withdrawal is a
//!    [`FrozenError::PayloadMismatch`]. The settlement also closes the outbox event.
//!
//! States: `REQUESTED → BROADCAST → CONFIRMED | REJECTED`, `REQUESTED → UNKNOWN →
//! CONFIRMED | REJECTED | REQUESTED` (the network never received it: broadcast again
//! under the same id), `REQUESTED → FAILED`. Every transition appends a
//! `withdrawal_history` row, so a case prints the states in order.
//!
//! Deposits from the network ([`report_deposit`]): each report carries the network's
//! transaction id and its confirmations; the account is credited exactly once, in the
//! report's transaction, when the confirmations reach the required number (business id
//! `chain:<tx id>`, kind `DEPOSIT`); earlier, duplicate and later reports change
//! nothing, and a deposit dropped (a reorganisation) before it was credited is never
//! credited.
//!
//! Reconciliation ([`mod@crate::reconcile`]) counts a pending withdrawal's amount as frozen:
//! every account's frozen = the remainders of its open orders + the amounts of its
//! withdrawals in `REQUESTED`, `BROADCAST` or `UNKNOWN`.

use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use crate::asset::Asset;
use crate::decisions::{Deltas, Event, Outcome, Recorded, add_delta, check_id};
use crate::error::FrozenError;
use crate::events::{
    Registration, apply, begin, ensure_rows, finish, hook_in_tx, lock_and_check, register,
    require_row, retry_on_deadlock, write_movements,
};
use crate::hooks::{EventKind, HookPoint, Hooks};
use crate::schema::{SYS_DEPOSIT, is_system_account};

/// Receives, per asset, every withdrawal the network confirmed: what left the books.
pub const SYS_WITHDRAWAL: &str = "sys-withdrawal";
/// Suffix of a settlement's business id: `<withdrawal id>#settle`.
pub const SETTLE_SUFFIX: &str = "#settle";
/// Prefix of a network deposit's business id: `chain:<tx id>`.
pub const CHAIN_DEPOSIT_PREFIX: &str = "chain:";
/// Longest destination address, characters.
pub const MAX_DESTINATION_CHARS: usize = 128;

/// The DDL of the withdrawal tables, kept in [`crate::schema`] with the others (this path
/// stays for callers that name it here).
pub use crate::schema::WITHDRAWAL_SCHEMA_SQL as SCHEMA_SQL;

/// Creates the tables of [`SCHEMA_SQL`] (also done by [`crate::schema::install`]).
///
/// Errors: [`FrozenError::Db`].
pub async fn install(client: &Client) -> Result<(), FrozenError> {
    client.batch_execute(SCHEMA_SQL).await?;
    Ok(())
}

/// A withdrawal's status (`withdrawal.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Frozen and recorded with its outbox event; not yet sent.
    Requested,
    /// The network accepted the broadcast (its answer arrived).
    Broadcast,
    /// The broadcast's answer timed out or was lost: the network may or may not have it;
    /// the next step is a status query by the withdrawal id, never a new transfer.
    Unknown,
    /// The network confirmed the transfer; the frozen amount was consumed.
    Confirmed,
    /// The network refused the broadcast; the frozen amount was released.
    Failed,
    /// A status query found the transfer rejected; the frozen amount was released.
    Rejected,
}

impl Status {
    /// Every status.
    pub const ALL: [Status; 6] = [
        Status::Requested,
        Status::Broadcast,
        Status::Unknown,
        Status::Confirmed,
        Status::Failed,
        Status::Rejected,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Requested => "REQUESTED",
            Status::Broadcast => "BROADCAST",
            Status::Unknown => "UNKNOWN",
            Status::Confirmed => "CONFIRMED",
            Status::Failed => "FAILED",
            Status::Rejected => "REJECTED",
        }
    }

    /// Whether the withdrawal still holds its frozen amount.
    pub fn is_pending(self) -> bool {
        matches!(
            self,
            Status::Requested | Status::Broadcast | Status::Unknown
        )
    }
}

enum_names::name_traits!(Status, "withdrawal status");

/// A withdrawal of `amount` minor units of `asset` from `account_id` to `destination`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithdrawRequest {
    /// Tenant.
    pub tenant_id: String,
    /// The withdrawal id: its business id, and the id the network sees.
    pub withdrawal_id: String,
    /// The debited account (not a system account).
    pub account_id: String,
    /// The asset.
    pub asset: Asset,
    /// Minor units, 1 to the asset's maximum.
    pub amount: i64,
    /// Address on the network, 1 to [`MAX_DESTINATION_CHARS`] characters.
    pub destination: String,
}

impl WithdrawRequest {
    /// `WITHDRAW|account|asset|amount|destination`.
    pub fn payload(&self) -> String {
        format!(
            "WITHDRAW|{}|{}|{}|{}",
            self.account_id,
            self.asset.as_str(),
            self.amount,
            self.destination
        )
    }

    /// Checks ids, the account, the amount and the destination.
    ///
    /// Errors: [`FrozenError::Invalid`].
    pub fn validate(&self) -> Result<(), FrozenError> {
        check_id("tenant id", &self.tenant_id)?;
        check_id("withdrawal id", &self.withdrawal_id)?;
        check_id("account id", &self.account_id)?;
        if self.withdrawal_id.ends_with(SETTLE_SUFFIX) {
            return Err(FrozenError::Invalid(format!(
                "a withdrawal id may not end with {SETTLE_SUFFIX}"
            )));
        }
        if is_system_account(&self.account_id) {
            return Err(FrozenError::Invalid(format!(
                "{} is a system account",
                self.account_id
            )));
        }
        if self.amount <= 0 || self.amount > self.asset.max_units() {
            return Err(FrozenError::Invalid(format!(
                "withdrawal amount must be 1 to {} {} units",
                self.asset.max_units(),
                self.asset
            )));
        }
        let chars = self.destination.chars().count();
        if chars == 0
            || chars > MAX_DESTINATION_CHARS
            || self.destination.chars().any(|c| c.is_control() || c == '|')
        {
            return Err(FrozenError::Invalid(format!(
                "destination must have 1 to {MAX_DESTINATION_CHARS} characters, no control \
                 characters and no '|'"
            )));
        }
        Ok(())
    }
}

/// What a withdrawal request reports, the same on every replay (except `replayed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithdrawResult {
    /// OK (frozen, REQUESTED) or INSUFFICIENT (nothing moved).
    pub outcome: Outcome,
    /// The asset.
    pub asset: Asset,
    /// Minor units frozen (or that would have been).
    pub amount: i64,
    /// Available after the freeze (OK) or when refused (INSUFFICIENT), minor units.
    pub available: i64,
    /// Read back from an earlier request with the same id; nothing executed now.
    #[serde(skip)]
    pub replayed: bool,
}

impl Recorded for WithdrawResult {
    fn mark_replayed(&mut self) {
        self.replayed = true;
    }
}

// As a placement's freeze (events/place.rs): "enough?" and "take it" in one evaluation.
const FREEZE_SQL: &str = "\
UPDATE balance
SET available = available - $4, frozen = frozen + $4, version = version + 1
WHERE tenant_id = $1 AND account_id = $2 AND asset = $3 AND available >= $4
RETURNING available";

const AVAILABLE_SQL: &str = "\
SELECT available FROM balance WHERE tenant_id = $1 AND account_id = $2 AND asset = $3";

const INSERT_WITHDRAWAL_SQL: &str = "\
INSERT INTO withdrawal (tenant_id, withdrawal_id, account_id, asset, amount, destination, status)
VALUES ($1, $2, $3, $4, $5, $6, 'REQUESTED')";

const HISTORY_SQL: &str = "\
INSERT INTO withdrawal_history (tenant_id, withdrawal_id, status, detail) VALUES ($1, $2, $3, $4)";

const OUTBOX_SQL: &str = "\
INSERT INTO withdrawal_outbox (tenant_id, withdrawal_id) VALUES ($1, $2)";

/// Requests a withdrawal: registers its id, freezes the amount (conditional update;
/// not enough available → INSUFFICIENT recorded, nothing else), writes the movement, the
/// `REQUESTED` record, its history row and the outbox event, records OK — one
/// transaction, no call to the network. Hooks: `registered`, `balances-updated` (OK
/// path), `before-commit`, `after-commit`.
///
/// Errors: [`FrozenError::Invalid`] before any database access;
/// [`FrozenError::PayloadMismatch`]; [`FrozenError::NoBalance`] (an asset the account
/// holds no row of: rolled back, not recorded); [`FrozenError::HookAborted`];
/// [`FrozenError::Db`].
pub async fn request(
    client: &mut Client,
    req: &WithdrawRequest,
    hooks: &dyn Hooks,
) -> Result<WithdrawResult, FrozenError> {
    req.validate()?;
    retry_on_deadlock!(request_once(client, req, hooks))
}

/// One attempt of [`request`]: registers, freezes, records the withdrawal, commits (see
/// there).
///
/// Errors: as [`request`]; a deadlock (40P01) as [`FrozenError::Db`], for the retry.
async fn request_once(
    client: &mut Client,
    req: &WithdrawRequest,
    hooks: &dyn Hooks,
) -> Result<WithdrawResult, FrozenError> {
    let event = Event::new(
        EventKind::Withdraw,
        &req.tenant_id,
        &req.withdrawal_id,
        req.payload(),
    );
    let tx = begin(client).await?;
    let operation_id = match register::<WithdrawResult>(&tx, &event).await? {
        Registration::New(id) => id,
        Registration::Replay(result) => {
            tx.rollback().await?;
            return Ok(result);
        }
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::Registered).await?;
    let Some(available) = freeze_amount(&tx, req).await? else {
        let result = refusal(&tx, req).await?;
        return finish(
            tx,
            hooks,
            &event,
            operation_id,
            Outcome::Insufficient,
            result,
        )
        .await;
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::BalancesUpdated).await?;
    let result = record_request(&tx, &event, req, available).await?;
    finish(tx, hooks, &event, operation_id, Outcome::Ok, result).await
}

/// Inside `tx`: refuses an account with no balance row of the asset
/// ([`crate::events::require_row`]: nothing created, not recorded), then freezes
/// `req.amount` with the conditional UPDATE; the available left (minor units), or `None`
/// when there was not enough (nothing changed).
///
/// Errors: [`FrozenError::NoBalance`]; [`FrozenError::Db`].
async fn freeze_amount(
    tx: &Transaction<'_>,
    req: &WithdrawRequest,
) -> Result<Option<i64>, FrozenError> {
    require_row(tx, &req.tenant_id, &req.account_id, req.asset).await?;
    let asset = req.asset.as_str();
    let frozen = tx
        .query_typed_opt(
            FREEZE_SQL,
            &[
                (&req.tenant_id, Type::TEXT),
                (&req.account_id, Type::TEXT),
                (&asset, Type::TEXT),
                (&req.amount, Type::INT8),
            ],
        )
        .await?;
    Ok(match frozen {
        Some(row) => Some(row.try_get("available")?),
        None => None,
    })
}

/// Inside `tx`, after a refused freeze: the INSUFFICIENT result, with the available of
/// the asset (minor units) read now.
///
/// Errors: [`FrozenError::Db`].
async fn refusal(
    tx: &Transaction<'_>,
    req: &WithdrawRequest,
) -> Result<WithdrawResult, FrozenError> {
    let asset = req.asset.as_str();
    let available: i64 = tx
        .query_typed_one(
            AVAILABLE_SQL,
            &[
                (&req.tenant_id, Type::TEXT),
                (&req.account_id, Type::TEXT),
                (&asset, Type::TEXT),
            ],
        )
        .await?
        .try_get("available")?;
    Ok(WithdrawResult {
        outcome: Outcome::Insufficient,
        asset: req.asset,
        amount: req.amount,
        available,
        replayed: false,
    })
}

/// Inside `tx`, after the freeze: writes its movement, the `REQUESTED` withdrawal, its
/// first history row and the outbox event, and returns the OK result with `available`
/// (minor units, after the freeze).
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (delta overflow).
async fn record_request(
    tx: &Transaction<'_>,
    event: &Event<'_>,
    req: &WithdrawRequest,
    available: i64,
) -> Result<WithdrawResult, FrozenError> {
    let mut deltas = Deltas::new();
    add_delta(
        &mut deltas,
        &req.account_id,
        req.asset,
        -req.amount,
        req.amount,
    )?;
    write_movements(tx, event, &deltas).await?;
    let asset = req.asset.as_str();
    tx.execute_typed(
        INSERT_WITHDRAWAL_SQL,
        &[
            (&req.tenant_id, Type::TEXT),
            (&req.withdrawal_id, Type::TEXT),
            (&req.account_id, Type::TEXT),
            (&asset, Type::TEXT),
            (&req.amount, Type::INT8),
            (&req.destination, Type::TEXT),
        ],
    )
    .await?;
    let status = Status::Requested.as_str();
    let detail = "frozen; outbox event written";
    tx.execute_typed(
        HISTORY_SQL,
        &[
            (&req.tenant_id, Type::TEXT),
            (&req.withdrawal_id, Type::TEXT),
            (&status, Type::TEXT),
            (&detail, Type::TEXT),
        ],
    )
    .await?;
    tx.execute_typed(
        OUTBOX_SQL,
        &[
            (&req.tenant_id, Type::TEXT),
            (&req.withdrawal_id, Type::TEXT),
        ],
    )
    .await?;
    Ok(WithdrawResult {
        outcome: Outcome::Ok,
        asset: req.asset,
        amount: req.amount,
        available,
        replayed: false,
    })
}

/// A withdrawal record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Withdrawal {
    /// Tenant.
    pub tenant_id: String,
    /// Its id.
    pub withdrawal_id: String,
    /// The debited account.
    pub account_id: String,
    /// The asset.
    pub asset: Asset,
    /// Minor units.
    pub amount: i64,
    /// Address on the network.
    pub destination: String,
    /// Current status.
    pub status: Status,
}

const WITHDRAWAL_COLUMNS: &str =
    "w.tenant_id, w.withdrawal_id, w.account_id, w.asset, w.amount, w.destination, w.status";

fn withdrawal_from_row(row: &tokio_postgres::Row) -> Result<Withdrawal, FrozenError> {
    let asset: &str = row.try_get("asset")?;
    let status: &str = row.try_get("status")?;
    Ok(Withdrawal {
        tenant_id: row.try_get("tenant_id")?,
        withdrawal_id: row.try_get("withdrawal_id")?,
        account_id: row.try_get("account_id")?,
        asset: asset
            .parse()
            .map_err(|_| FrozenError::InvariantViolated(format!("unknown asset {asset}")))?,
        amount: row.try_get("amount")?,
        destination: row.try_get("destination")?,
        status: status
            .parse()
            .map_err(|_| FrozenError::InvariantViolated(format!("status {status}")))?,
    })
}

/// The withdrawal `withdrawal_id` of `tenant_id`, if it exists.
///
/// Errors: [`FrozenError::Db`].
pub async fn get(
    client: &Client,
    tenant_id: &str,
    withdrawal_id: &str,
) -> Result<Option<Withdrawal>, FrozenError> {
    let row = client
        .query_typed_opt(
            &format!(
                "SELECT {WITHDRAWAL_COLUMNS} FROM withdrawal w \
                 WHERE w.tenant_id = $1 AND w.withdrawal_id = $2"
            ),
            &[(&tenant_id, Type::TEXT), (&withdrawal_id, Type::TEXT)],
        )
        .await?;
    row.as_ref().map(withdrawal_from_row).transpose()
}

/// The withdrawals with an unprocessed outbox event, oldest event first (every tenant).
/// Reads only: no row is locked, so nothing is held while the caller calls the network.
///
/// Errors: [`FrozenError::Db`].
pub async fn pending(client: &Client) -> Result<Vec<Withdrawal>, FrozenError> {
    let rows = client
        .query_typed(
            &format!(
                "SELECT {WITHDRAWAL_COLUMNS} FROM withdrawal_outbox o \
                 JOIN withdrawal w USING (tenant_id, withdrawal_id) \
                 WHERE o.processed_at IS NULL ORDER BY o.event_id"
            ),
            &[],
        )
        .await?;
    rows.iter().map(withdrawal_from_row).collect()
}

/// The statuses the withdrawal took, in order, each as `STATUS (detail)`.
///
/// Errors: [`FrozenError::Db`].
pub async fn history(
    client: &Client,
    tenant_id: &str,
    withdrawal_id: &str,
) -> Result<Vec<(Status, String)>, FrozenError> {
    let rows = client
        .query_typed(
            "SELECT status, detail FROM withdrawal_history \
             WHERE tenant_id = $1 AND withdrawal_id = $2 ORDER BY seq",
            &[(&tenant_id, Type::TEXT), (&withdrawal_id, Type::TEXT)],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let status: &str = row.try_get("status")?;
            Ok((
                status
                    .parse()
                    .map_err(|_| FrozenError::InvariantViolated(format!("status {status}")))?,
                row.try_get("detail")?,
            ))
        })
        .collect()
}

const MARK_SQL: &str = "\
UPDATE withdrawal SET status = $3, updated_at = now()
WHERE tenant_id = $1 AND withdrawal_id = $2 AND status = ANY($4::text[])";

/// Moves the withdrawal to `to` if its status is one of `from` (one transaction, which
/// locks only the withdrawal row, never a balance row) and appends a history row.
/// Returns whether it moved. For the states without money: `BROADCAST`, `UNKNOWN`, and
/// `REQUESTED` again after a query found nothing.
///
/// Errors: [`FrozenError::Invalid`] for a settled `to` (use [`settle`]);
/// [`FrozenError::Db`].
pub async fn mark(
    client: &mut Client,
    tenant_id: &str,
    withdrawal_id: &str,
    from: &[Status],
    to: Status,
    detail: &str,
) -> Result<bool, FrozenError> {
    if !to.is_pending() {
        return Err(FrozenError::Invalid(format!(
            "{to} moves money: settle it, do not mark it"
        )));
    }
    let tx = begin(client).await?;
    let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    let to_text = to.as_str();
    let moved = tx
        .execute_typed(
            MARK_SQL,
            &[
                (&tenant_id, Type::TEXT),
                (&withdrawal_id, Type::TEXT),
                (&to_text, Type::TEXT),
                (&from, Type::TEXT_ARRAY),
            ],
        )
        .await?;
    if moved == 1 {
        tx.execute_typed(
            HISTORY_SQL,
            &[
                (&tenant_id, Type::TEXT),
                (&withdrawal_id, Type::TEXT),
                (&to_text, Type::TEXT),
                (&detail, Type::TEXT),
            ],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(moved == 1)
}

/// What a settlement reports, the same on every replay (except `replayed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettleResult {
    /// Always OK.
    pub outcome: Outcome,
    /// The final status: CONFIRMED, FAILED or REJECTED.
    pub status: Status,
    /// Minor units consumed (CONFIRMED), else 0.
    pub consumed: i64,
    /// Minor units released to available (FAILED, REJECTED), else 0.
    pub released: i64,
    /// Read back from an earlier settlement; nothing moved now.
    #[serde(skip)]
    pub replayed: bool,
}

impl Recorded for SettleResult {
    fn mark_replayed(&mut self) {
        self.replayed = true;
    }
}

const LOCK_WITHDRAWAL_SQL: &str = "\
SELECT w.tenant_id, w.withdrawal_id, w.account_id, w.asset, w.amount, w.destination, w.status
FROM withdrawal w WHERE w.tenant_id = $1 AND w.withdrawal_id = $2 FOR UPDATE";

const CLOSE_OUTBOX_SQL: &str = "\
UPDATE withdrawal_outbox SET processed_at = now()
WHERE tenant_id = $1 AND withdrawal_id = $2 AND processed_at IS NULL";

/// Settles the withdrawal as `to` (CONFIRMED: consume; FAILED or REJECTED: release), in
/// one transaction under the business id `<withdrawal id>#settle`: a second settlement
/// replays the first, another outcome is [`FrozenError::PayloadMismatch`]. Locks the
/// withdrawal row, then the balance rows in sorted order. `detail` goes to the history.
///
/// Errors: [`FrozenError::Invalid`] (`to` not a final status; a CONFIRMED or REJECTED
/// from `REQUESTED`, which no answer of the network can give); [`FrozenError::Invalid`]
/// when the withdrawal does not exist (rolled back, not recorded);
/// [`FrozenError::PayloadMismatch`]; [`FrozenError::HookAborted`]; [`FrozenError::Db`].
pub async fn settle(
    client: &mut Client,
    tenant_id: &str,
    withdrawal_id: &str,
    to: Status,
    detail: &str,
    hooks: &dyn Hooks,
) -> Result<SettleResult, FrozenError> {
    check_id("tenant id", tenant_id)?;
    check_id("withdrawal id", withdrawal_id)?;
    if to.is_pending() {
        return Err(FrozenError::Invalid(format!("{to} is not a settlement")));
    }
    retry_on_deadlock!(settle_once(
        client,
        tenant_id,
        withdrawal_id,
        to,
        detail,
        hooks
    ))
}

/// One attempt of [`settle`]: registers, locks the withdrawal, moves its amount, records
/// the status, commits (see there).
///
/// Errors: as [`settle`]; a deadlock (40P01) as [`FrozenError::Db`], for the retry.
async fn settle_once(
    client: &mut Client,
    tenant_id: &str,
    withdrawal_id: &str,
    to: Status,
    detail: &str,
    hooks: &dyn Hooks,
) -> Result<SettleResult, FrozenError> {
    let business_id = format!("{withdrawal_id}{SETTLE_SUFFIX}");
    let event = Event::new(
        EventKind::WithdrawSettle,
        tenant_id,
        &business_id,
        format!("WITHDRAW_SETTLE|{withdrawal_id}|{to}"),
    );
    let tx = begin(client).await?;
    let operation_id = match register::<SettleResult>(&tx, &event).await? {
        Registration::New(id) => id,
        Registration::Replay(result) => {
            tx.rollback().await?;
            return Ok(result);
        }
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::Registered).await?;
    let (tx, w) = lock_withdrawal(tx, tenant_id, withdrawal_id, to).await?;
    ensure_rows(&tx, tenant_id, &[(SYS_WITHDRAWAL, w.asset, false)]).await?;
    let (deltas, consumed, released) = settlement_deltas(&w, to)?;
    if let Err(error) = lock_and_check(&tx, tenant_id, &deltas).await {
        let _ = tx.rollback().await;
        return Err(error);
    }
    apply(&tx, tenant_id, &deltas).await?;
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::BalancesUpdated).await?;
    write_movements(&tx, &event, &deltas).await?;
    record_settlement(&tx, tenant_id, withdrawal_id, w.status, to, detail).await?;
    let result = SettleResult {
        outcome: Outcome::Ok,
        status: to,
        consumed,
        released,
        replayed: false,
    };
    finish(tx, hooks, &event, operation_id, Outcome::Ok, result).await
}

/// Locks the withdrawal row and returns `tx` with the withdrawal, when it may become `to`
/// (FAILED from `REQUESTED`; CONFIRMED or REJECTED from `BROADCAST` or `UNKNOWN`); else
/// rolls `tx` back.
///
/// Errors: [`FrozenError::Invalid`] (no such withdrawal, or not from its status: rolled
/// back); [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (an unknown asset or
/// status).
async fn lock_withdrawal<'t>(
    tx: Transaction<'t>,
    tenant_id: &str,
    withdrawal_id: &str,
    to: Status,
) -> Result<(Transaction<'t>, Withdrawal), FrozenError> {
    let row = tx
        .query_typed_opt(
            LOCK_WITHDRAWAL_SQL,
            &[(&tenant_id, Type::TEXT), (&withdrawal_id, Type::TEXT)],
        )
        .await?;
    let Some(row) = row else {
        let _ = tx.rollback().await;
        return Err(FrozenError::Invalid(format!(
            "no withdrawal {withdrawal_id}"
        )));
    };
    let w = withdrawal_from_row(&row)?;
    let allowed = match to {
        Status::Failed => w.status == Status::Requested,
        _ => matches!(w.status, Status::Broadcast | Status::Unknown),
    };
    if !allowed {
        let _ = tx.rollback().await;
        return Err(FrozenError::Invalid(format!(
            "withdrawal {withdrawal_id} is {}: it cannot become {to}",
            w.status
        )));
    }
    Ok((tx, w))
}

/// The balance changes of settling `w` as `to`, with the amounts consumed and released
/// (minor units): CONFIRMED moves the frozen amount to [`SYS_WITHDRAWAL`]'s available;
/// FAILED or REJECTED returns it to the account's available.
///
/// Errors: [`FrozenError::InvariantViolated`] (delta overflow).
fn settlement_deltas(w: &Withdrawal, to: Status) -> Result<(Deltas, i64, i64), FrozenError> {
    let mut deltas = Deltas::new();
    let (consumed, released) = if to == Status::Confirmed {
        add_delta(&mut deltas, &w.account_id, w.asset, 0, -w.amount)?;
        add_delta(&mut deltas, SYS_WITHDRAWAL, w.asset, w.amount, 0)?;
        (w.amount, 0)
    } else {
        add_delta(&mut deltas, &w.account_id, w.asset, w.amount, -w.amount)?;
        (0, w.amount)
    };
    Ok((deltas, consumed, released))
}

/// Inside `tx`, after the movements: moves the withdrawal from its locked status `from`
/// to `to`, appends the history row with `detail` and closes its outbox event.
///
/// Errors: [`FrozenError::Db`].
async fn record_settlement(
    tx: &Transaction<'_>,
    tenant_id: &str,
    withdrawal_id: &str,
    from: Status,
    to: Status,
    detail: &str,
) -> Result<(), FrozenError> {
    let from = [from.as_str()];
    let to_text = to.as_str();
    tx.execute_typed(
        MARK_SQL,
        &[
            (&tenant_id, Type::TEXT),
            (&withdrawal_id, Type::TEXT),
            (&to_text, Type::TEXT),
            (&from.as_slice(), Type::TEXT_ARRAY),
        ],
    )
    .await?;
    tx.execute_typed(
        HISTORY_SQL,
        &[
            (&tenant_id, Type::TEXT),
            (&withdrawal_id, Type::TEXT),
            (&to_text, Type::TEXT),
            (&detail, Type::TEXT),
        ],
    )
    .await?;
    tx.execute_typed(
        CLOSE_OUTBOX_SQL,
        &[(&tenant_id, Type::TEXT), (&withdrawal_id, Type::TEXT)],
    )
    .await?;
    Ok(())
}

/// One report of an incoming network transfer, as the network's scan shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepositReport {
    /// Tenant credited.
    pub tenant_id: String,
    /// The network's transaction id.
    pub tx_id: String,
    /// The account credited (not a system account).
    pub account_id: String,
    /// The asset.
    pub asset: Asset,
    /// Minor units, 1 to the asset's maximum.
    pub amount: i64,
    /// Confirmations the network reports now.
    pub confirmations: u32,
    /// The network dropped the transaction (a reorganisation).
    pub dropped: bool,
}

/// What [`report_deposit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReportEffect {
    /// Below the required confirmations: recorded as seen, nothing credited.
    Seen,
    /// The confirmations reached the required number: credited now.
    Credited,
    /// Credited before; this report changes nothing.
    AlreadyCredited,
    /// Dropped before it was credited: it never will be.
    Dropped,
    /// Dropped earlier; this report changes nothing.
    AlreadyDropped,
    /// A drop reported after the credit: the credit reversed now ([`crate::reorg`]).
    Reversed,
    /// Reversed earlier; this report (a drop, or the transaction reported again) changes
    /// nothing: a reversed transaction is never credited again.
    AlreadyReversed,
}

const UPSERT_CHAIN_SQL: &str = "\
INSERT INTO chain_deposit (tenant_id, tx_id, account_id, asset, amount, confirmations, status)
VALUES ($1, $2, $3, $4, $5, $6, 'SEEN')
ON CONFLICT (tenant_id, tx_id) DO UPDATE SET confirmations = GREATEST(chain_deposit.confirmations, EXCLUDED.confirmations)
RETURNING account_id, asset, amount, status";

const CHAIN_STATUS_SQL: &str =
    "UPDATE chain_deposit SET status = $3 WHERE tenant_id = $1 AND tx_id = $2";

/// Applies one deposit report in one transaction: the `chain_deposit` row is created or
/// locked first (so reports of one transaction are serialised), then credited from
/// `sys-deposit` when `confirmations >= required` and it is neither credited nor dropped
/// (business id `chain:<tx id>`, kind `DEPOSIT`, with its movements, as a deposit); a
/// drop reported after the credit reverses it ([`crate::reorg`]).
///
/// Errors: [`FrozenError::Invalid`] (ids, amount, a system account, `required` 0, or a
/// report whose account, asset or amount differ from the first report of the
/// transaction); [`FrozenError::Db`].
pub async fn report_deposit(
    client: &mut Client,
    report: &DepositReport,
    required: u32,
) -> Result<ReportEffect, FrozenError> {
    check_id("tenant id", &report.tenant_id)?;
    check_id("transaction id", &report.tx_id)?;
    check_id("account id", &report.account_id)?;
    if is_system_account(&report.account_id) || required == 0 {
        return Err(FrozenError::Invalid(
            "a deposit goes to a user account and needs at least 1 confirmation".into(),
        ));
    }
    if report.amount <= 0 || report.amount > report.asset.max_units() {
        return Err(FrozenError::Invalid("deposit amount out of range".into()));
    }
    retry_on_deadlock!(report_once(client, report, required))
}

async fn report_once(
    client: &mut Client,
    report: &DepositReport,
    required: u32,
) -> Result<ReportEffect, FrozenError> {
    let t = &report.tenant_id;
    let tx = begin(client).await?;
    ensure_rows(
        &tx,
        t,
        &[
            (&report.account_id, report.asset, false),
            (SYS_DEPOSIT, report.asset, true),
        ],
    )
    .await?;
    let asset = report.asset.as_str();
    let confirmations = i32::try_from(report.confirmations).unwrap_or(i32::MAX);
    let row = tx
        .query_typed_one(
            UPSERT_CHAIN_SQL,
            &[
                (t, Type::TEXT),
                (&report.tx_id, Type::TEXT),
                (&report.account_id, Type::TEXT),
                (&asset, Type::TEXT),
                (&report.amount, Type::INT8),
                (&confirmations, Type::INT4),
            ],
        )
        .await?;
    let (account, stored_asset, amount, status): (String, String, i64, String) = (
        row.try_get("account_id")?,
        row.try_get("asset")?,
        row.try_get("amount")?,
        row.try_get("status")?,
    );
    if account != report.account_id || stored_asset != asset || amount != report.amount {
        let _ = tx.rollback().await;
        return Err(FrozenError::Invalid(format!(
            "report of {} differs from its first report",
            report.tx_id
        )));
    }
    let effect = apply_report(&tx, report, &status, required).await?;
    tx.commit().await?;
    Ok(effect)
}

/// What a report does to a deposit in `status`, inside the report's transaction (the
/// `chain_deposit` row locked): credit at `required` confirmations, a drop before the
/// credit, the reversal of a drop after it ([`crate::reorg`]), or nothing.
///
/// Errors: [`FrozenError::Db`]; [`FrozenError::InvariantViolated`] (delta overflow).
async fn apply_report(
    tx: &Transaction<'_>,
    report: &DepositReport,
    status: &str,
    required: u32,
) -> Result<ReportEffect, FrozenError> {
    let t = &report.tenant_id;
    Ok(match (status, report.dropped) {
        ("CREDITED", true) => {
            let credited = crate::reorg::Credited {
                tenant_id: t,
                tx_id: &report.tx_id,
                account_id: &report.account_id,
                asset: report.asset,
                amount: report.amount,
                business_id: format!("{CHAIN_DEPOSIT_PREFIX}{}#reversal", report.tx_id),
            };
            crate::reorg::reverse(tx, &credited).await?;
            ReportEffect::Reversed
        }
        ("REVERSED", _) => ReportEffect::AlreadyReversed,
        ("CREDITED", false) => ReportEffect::AlreadyCredited,
        ("DROPPED", _) => ReportEffect::AlreadyDropped,
        (_, true) => {
            tx_status(tx, t, &report.tx_id, "DROPPED").await?;
            ReportEffect::Dropped
        }
        (_, false) if report.confirmations < required => ReportEffect::Seen,
        (_, false) => {
            credit(tx, report).await?;
            tx_status(tx, t, &report.tx_id, "CREDITED").await?;
            ReportEffect::Credited
        }
    })
}

async fn tx_status(
    tx: &tokio_postgres::Transaction<'_>,
    tenant_id: &str,
    tx_id: &str,
    status: &str,
) -> Result<(), FrozenError> {
    tx.execute_typed(
        CHAIN_STATUS_SQL,
        &[
            (&tenant_id, Type::TEXT),
            (&tx_id, Type::TEXT),
            (&status, Type::TEXT),
        ],
    )
    .await?;
    Ok(())
}

const CHAIN_OPERATION_SQL: &str = "\
INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, outcome, result)
VALUES ($1, $2, 'DEPOSIT', $3, $4, 'OK', $5::text::jsonb)";

/// The credit of a confirmed network deposit, inside the report's transaction: its
/// operation (recorded OK at once: the `chain_deposit` row lock already serialises it,
/// and its unique business id forbids a second), the locked rows, the movements.
async fn credit(
    tx: &tokio_postgres::Transaction<'_>,
    report: &DepositReport,
) -> Result<(), FrozenError> {
    let business_id = format!("{CHAIN_DEPOSIT_PREFIX}{}", report.tx_id);
    let event = Event::new(
        EventKind::Deposit,
        &report.tenant_id,
        &business_id,
        format!(
            "DEPOSIT|{}|{}|{}",
            report.account_id,
            report.asset.as_str(),
            report.amount
        ),
    );
    let mut deltas = Deltas::new();
    add_delta(&mut deltas, SYS_DEPOSIT, report.asset, -report.amount, 0)?;
    add_delta(
        &mut deltas,
        &report.account_id,
        report.asset,
        report.amount,
        0,
    )?;
    let locked = lock_and_check(tx, &report.tenant_id, &deltas).await?;
    let before = locked[&(report.account_id.clone(), report.asset.as_str())].available;
    let result = serde_json::json!({
        "outcome": "OK",
        "asset": report.asset,
        "amount": report.amount,
        "available": before + report.amount,
    })
    .to_string();
    tx.execute_typed(
        CHAIN_OPERATION_SQL,
        &[
            (&event.tenant_id, Type::TEXT),
            (&event.business_id, Type::TEXT),
            (&event.payload, Type::TEXT),
            (&event.hash, Type::TEXT),
            (&result, Type::TEXT),
        ],
    )
    .await?;
    apply(tx, &report.tenant_id, &deltas).await?;
    write_movements(tx, &event, &deltas).await?;
    Ok(())
}

/// A network deposit's row: (status, highest confirmations seen), if reported.
///
/// Errors: [`FrozenError::Db`].
pub async fn chain_deposit(
    client: &Client,
    tenant_id: &str,
    tx_id: &str,
) -> Result<Option<(String, i32)>, FrozenError> {
    let row = client
        .query_typed_opt(
            "SELECT status, confirmations FROM chain_deposit WHERE tenant_id = $1 AND tx_id = $2",
            &[(&tenant_id, Type::TEXT), (&tx_id, Type::TEXT)],
        )
        .await?;
    row.map(|row| Ok((row.try_get("status")?, row.try_get("confirmations")?)))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for s in Status::ALL {
            assert_eq!(s.as_str().parse::<Status>().unwrap(), s);
        }
        assert!("requested".parse::<Status>().is_err());
        assert!(Status::Unknown.is_pending() && !Status::Confirmed.is_pending());
    }

    #[test]
    fn requests_are_validated_before_the_database() {
        let ok = WithdrawRequest {
            tenant_id: "t".into(),
            withdrawal_id: "w-1".into(),
            account_id: "alice".into(),
            asset: Asset::Btc,
            amount: 1,
            destination: "addr-1".into(),
        };
        assert!(ok.validate().is_ok());
        for bad in [
            WithdrawRequest {
                amount: 0,
                ..ok.clone()
            },
            WithdrawRequest {
                account_id: "sys-fee".into(),
                ..ok.clone()
            },
            WithdrawRequest {
                destination: "a|b".into(),
                ..ok.clone()
            },
            WithdrawRequest {
                withdrawal_id: "w#settle".into(),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
