//! The idempotent transfer (SPEC §3): one READ COMMITTED transaction per request.
//!
//! Every operation moves points between two accounts: a DEBIT from a user to
//! [`SYS_REDEEM`], a GRANT from [`SYS_ISSUER`] to a user. The request is registered under
//! its `(client_id, idem_key)` first, so a retry with the same key replays the recorded
//! result instead of moving points twice (key semantics after the IETF draft
//! draft-ietf-httpapi-idempotency-key-header; see SPEC §4 for the deliberate differences).

use std::fmt;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, IsolationLevel, Row, Transaction};

use crate::error::LedgerError;
use crate::fingerprint;
use crate::schema::{SYS_ISSUER, SYS_REDEEM};
use crate::vocabulary::{HookPoint, Kind, Outcome};

/// One transfer request: move `amount` points from `from` to `to`, at most once per
/// `(client_id, idem_key)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferRequest {
    /// The caller's self-declared identity; scopes `idem_key`.
    pub client_id: String,
    /// The idempotency key, created when the client decides to act and reused on every retry.
    pub idem_key: String,
    /// DEBIT or GRANT (recorded in `ledger_txn.kind` and part of the fingerprint).
    pub kind: Kind,
    /// Account debited (locked first).
    pub from: String,
    /// Account credited (locked second; must exist).
    pub to: String,
    /// Points to move; must be > 0.
    pub amount: i64,
    /// The business reference of a DEBIT: the redemption order it pays, `None` when the
    /// caller names none. Part of the fingerprint when present
    /// ([`fingerprint::request_hash_with_order`]; absent, the fingerprint is the one
    /// requests had before the field existed) and stored in `ledger_txn.order_id` in the
    /// transaction that moves the points, so a reconciliation of orders against the
    /// ledger can ask "was this order paid twice?". The library stores it as given; the
    /// HTTP route checks its grammar (`order_id` in the debit body). Absent from the
    /// serialized form when `None`, so older serialized requests read back unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_id: Option<String>,
}

impl TransferRequest {
    /// A DEBIT of `amount` points: `from` = `account`, `to` = [`SYS_REDEEM`].
    pub fn debit(
        client_id: impl Into<String>,
        idem_key: impl Into<String>,
        account: impl Into<String>,
        amount: i64,
    ) -> Self {
        TransferRequest::debit_into(client_id, idem_key, account, SYS_REDEEM, amount)
    }

    /// A DEBIT of `amount` points from `account` into the redemption account `sink`
    /// ([`SYS_REDEEM`], or a stripe of it: [`crate::striping::redeem_account_for`]).
    pub fn debit_into(
        client_id: impl Into<String>,
        idem_key: impl Into<String>,
        account: impl Into<String>,
        sink: impl Into<String>,
        amount: i64,
    ) -> Self {
        TransferRequest {
            client_id: client_id.into(),
            idem_key: idem_key.into(),
            kind: Kind::Debit,
            from: account.into(),
            to: sink.into(),
            amount,
            order_id: None,
        }
    }

    /// A GRANT of `amount` points: `from` = [`SYS_ISSUER`], `to` = `account`.
    pub fn grant(
        client_id: impl Into<String>,
        idem_key: impl Into<String>,
        account: impl Into<String>,
        amount: i64,
    ) -> Self {
        TransferRequest {
            client_id: client_id.into(),
            idem_key: idem_key.into(),
            kind: Kind::Grant,
            from: SYS_ISSUER.to_owned(),
            to: account.into(),
            amount,
            order_id: None,
        }
    }

    /// This request carrying the business reference `order_id` (see
    /// [`TransferRequest::order_id`]).
    pub fn with_order(mut self, order_id: impl Into<String>) -> Self {
        self.order_id = Some(order_id.into());
        self
    }

    /// The fingerprint of this request, see [`fingerprint::request_hash_with_order`] (32
    /// lower-case hex chars; client id and key are not part of it, the order id is).
    pub fn request_hash(&self) -> String {
        fingerprint::request_hash_with_order(
            self.kind,
            &self.from,
            &self.to,
            self.amount,
            self.order_id.as_deref(),
        )
    }
}

/// What a transfer reports to its caller, identical for the first execution and every replay
/// (except `replayed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferResult {
    /// The business outcome.
    pub outcome: Outcome,
    /// `ledger_txn.txn_id` for [`Outcome::Ok`], otherwise `None`.
    pub txn_id: Option<i64>,
    /// Reported balance in points: OK DEBIT → `from`'s balance after; OK GRANT → `to`'s
    /// balance after; INSUFFICIENT → `from`'s balance when the debit was refused;
    /// NO_ACCOUNT → 0. A replay reports the stored value, not the current balance.
    pub balance: i64,
    /// `true` when this result was read back from an earlier request with the same key
    /// (HTTP: `Idempotent-Replayed: true`); nothing was executed by this call.
    pub replayed: bool,
}

/// What a hook sees: where the transfer is, which request, and the open transaction.
#[derive(Clone, Copy)]
pub struct HookContext<'a> {
    /// The hook point being passed.
    pub point: HookPoint,
    /// The request being executed.
    pub request: &'a TransferRequest,
    /// The open transaction, so a hook may inspect (or write through) it; `None` at
    /// [`HookPoint::AfterCommit`]. The transaction's own lifetime parameter is shortened to
    /// `'a` (`Transaction` is covariant), which keeps the context to one lifetime.
    pub transaction: Option<&'a Transaction<'a>>,
}

impl fmt::Debug for HookContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookContext")
            .field("point", &self.point)
            .field("request", self.request)
            .field("in_transaction", &self.transaction.is_some())
            .finish()
    }
}

/// A hook's request to abort the transfer (see [`Hooks::at`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hook aborted the transfer: {reason}")]
pub struct HookAbort {
    /// Free text for logs; not part of [`LedgerError::HookAborted`].
    pub reason: String,
}

impl HookAbort {
    /// An abort with the given reason.
    pub fn new(reason: impl Into<String>) -> Self {
        HookAbort {
            reason: reason.into(),
        }
    }
}

/// Code run at each [`HookPoint`] of [`transfer`].
///
/// The future may take as long as it likes (the crash-worker pauses at `before-commit`
/// forever and is killed; the service's after-commit hook may withhold a response); the
/// transaction, with its row locks, stays open meanwhile. Returning `Err(HookAbort)`
/// before commit rolls the transfer back and makes [`transfer`] return
/// [`LedgerError::HookAborted`]; at `after-commit` the transfer stays committed but
/// [`transfer`] still returns that error.
pub trait Hooks: Send + Sync {
    /// Called once per hook point passed.
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>>;

    /// Whether [`Hooks::at`] may do anything at `point` (wait, abort, use the
    /// transaction). `false` promises that passing `point` is a no-op, so the batch mode
    /// need not stop there: it then sends its BEGIN, its call and its COMMIT in one round
    /// trip ([`crate::batch`]). Default `true`.
    fn acts_at(&self, _point: HookPoint) -> bool {
        true
    }
}

/// Hooks that do nothing (normal operation).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {
    fn at<'a>(&'a self, _ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn acts_at(&self, _point: HookPoint) -> bool {
        false
    }
}

/// How often step 1 retries when the conflicting registration is not visible (see
/// [`LedgerError::RegistrationVanished`]).
pub(crate) const REGISTER_ATTEMPTS: u32 = 3;

// Step 1. ON CONFLICT DO NOTHING waits on the unique index while a concurrent transaction
// holds the same key, then returns no row if that transaction committed (PostgreSQL docs,
// INSERT, "ON CONFLICT Clause"). It also inserts nothing when a transaction of this key
// exists without its record (removed by hand): that key must never execute again.
// ANCHOR: register (quoted by docs/articles/points-ledger.md; `./run.sh cite --check`)
const REGISTER_SQL: &str = "\
INSERT INTO idem_request (client_id, idem_key, request_hash, outcome)
SELECT $1, $2, $3, 'PENDING'
WHERE NOT EXISTS (SELECT 1 FROM ledger_txn t WHERE t.client_id = $1 AND t.idem_key = $2)
ON CONFLICT (client_id, idem_key) DO NOTHING
RETURNING 1";
// ANCHOR_END: register

// Step 1, key known but no record: the transaction left behind by a removed record.
const ORPHAN_TXN_SQL: &str = "\
SELECT txn_id FROM ledger_txn WHERE client_id = $1 AND idem_key = $2";

/// SQLSTATE numeric_value_out_of_range (PostgreSQL docs, Appendix A).
const NUMERIC_VALUE_OUT_OF_RANGE: &str = "22003";

/// The C routines (`R` field of the error, PostgreSQL docs 55.8 "Error and Notice Message
/// Fields") that report an overflow of bigint `+` and `-`: the ledger's own balance
/// arithmetic, when the error has no context (no function or trigger around it).
const OWN_ARITHMETIC_ROUTINES: [&str; 2] = ["int8pl", "int8mi"];

// Step 1, key known: a new statement takes a new snapshot under READ COMMITTED and so sees
// the row committed by the transaction we waited for.
pub(crate) const READ_REGISTRATION_SQL: &str = "\
SELECT request_hash, outcome, txn_id, balance_after
FROM idem_request
WHERE client_id = $1 AND idem_key = $2";

// Step 2. If a concurrent transaction changed the row, PostgreSQL waits for it and
// re-evaluates the WHERE clause on the new row version (docs, 13.2.1 "Read Committed
// Isolation Level"), so "enough?" and "take it" are one evaluation.
// ANCHOR: debit_from (quoted by docs/citing.md and docs/articles/points-ledger.md; `./run.sh cite --check`)
const DEBIT_FROM_SQL: &str = "\
UPDATE account
SET balance = balance - $2
WHERE account_id = $1 AND (allow_negative OR balance >= $2)
RETURNING balance";
// ANCHOR_END: debit_from

// Step 2, refused: INSUFFICIENT with the current balance if `from` exists, else NO_ACCOUNT
// with 0; recorded on the registration.
const RECORD_REFUSAL_SQL: &str = "\
WITH current AS (SELECT balance FROM account WHERE account_id = $3)
UPDATE idem_request
SET outcome = CASE WHEN EXISTS (SELECT 1 FROM current) THEN 'INSUFFICIENT' ELSE 'NO_ACCOUNT' END,
    balance_after = COALESCE((SELECT balance FROM current), 0)
WHERE client_id = $1 AND idem_key = $2
RETURNING outcome, balance_after";

// End of step 2 and step 3 in one statement: credit `to` (locked after `from`), then the
// ledger_txn row (with the request's order id, NULL without one) and its two entries
// (-amount on `from` first, +amount on `to`). Each INSERT reads its input from the
// previous CTE, so a missing `to` leaves all three empty and the statement returns no row.
// ANCHOR: credit_and_record (quoted by docs/articles/points-ledger.md; `./run.sh cite --check`)
const CREDIT_AND_RECORD_SQL: &str = "\
WITH credited AS (
    UPDATE account SET balance = balance + $5 WHERE account_id = $4 RETURNING balance
), txn AS (
    INSERT INTO ledger_txn (client_id, idem_key, kind, order_id)
    SELECT $1, $2, $3, $7 FROM credited
    RETURNING txn_id
), entries AS (
    INSERT INTO ledger_entry (txn_id, account_id, amount)
    SELECT txn.txn_id, e.account_id, e.amount
    FROM txn CROSS JOIN (VALUES (1, $6, -$5), (2, $4, $5)) AS e(pos, account_id, amount)
    ORDER BY e.pos
    RETURNING entry_id
)
SELECT credited.balance, txn.txn_id, (SELECT count(*) FROM entries) AS entry_count
FROM credited CROSS JOIN txn";
// ANCHOR_END: credit_and_record

// Step 4.
// ANCHOR: record_ok (quoted by docs/articles/points-ledger.md; `./run.sh cite --check`)
const RECORD_OK_SQL: &str = "\
UPDATE idem_request
SET outcome = 'OK', txn_id = $3, balance_after = $4
WHERE client_id = $1 AND idem_key = $2";
// ANCHOR_END: record_ok

/// Executes `req` at most once per `(client_id, idem_key)`, exactly as SPEC §3 describes,
/// in one transaction started with isolation level READ COMMITTED (set explicitly).
///
/// 1. Register the key as `PENDING` (`INSERT ... ON CONFLICT DO NOTHING`). If the key is
///    known, read the stored row in a new statement, roll back, and replay it
///    (`replayed = true`) when the fingerprint matches.
/// 2. Debit `from` with a conditional UPDATE; if refused, record and commit INSUFFICIENT
///    (current balance) or NO_ACCOUNT (0). Then credit `to`.
/// 3. Write the `ledger_txn` row and its two entries.
/// 4. Record OK with the txn id and the reported balance, then COMMIT.
///
/// Lock order is `from`, then `to`. Hooks run at [`HookPoint::Registered`],
/// [`HookPoint::EntriesWritten`] (OK path only), [`HookPoint::BeforeCommit`] and
/// [`HookPoint::AfterCommit`] (every committing path); a replay runs no hooks.
///
/// Statements: START TRANSACTION, the freeze check ([`mod@crate::repair`]; a frozen account
/// → [`LedgerError::AccountFrozen`], rolled back), then 4 statements and COMMIT on the OK
/// path, 3 and COMMIT on a refusal, 2 and ROLLBACK on a replay; each is sent with its parameter types
/// (`query_typed`), one round trip, no prepared statement.
///
/// A key whose record expired (a tombstone, see [`crate::retention`]) or whose record was
/// removed while its transaction exists is never executed again: [`LedgerError::KeyExpired`]
/// (after the fingerprint check: another payload under an expired key is `KeyReused`).
///
/// Errors: [`LedgerError::InvalidAmount`] (`amount <= 0`, before any database access),
/// [`LedgerError::KeyReused`], [`LedgerError::KeyExpired`], [`LedgerError::OutOfRange`]
/// (the balance arithmetic itself overflowed bigint), [`LedgerError::CommittedPending`] (also for a stored outcome
/// that is not one of OK/INSUFFICIENT/NO_ACCOUNT), [`LedgerError::RegistrationVanished`],
/// [`LedgerError::CreditAccountMissing`], [`LedgerError::HookAborted`], and
/// [`LedgerError::Db`] (e.g. SQLSTATE 23514 if the CHECK `balance_non_negative` fires,
/// 40P01 on a deadlock, no SQLSTATE when the connection is lost). On every error except
/// `HookAborted(AfterCommit)` nothing was committed.
pub async fn transfer(
    client: &mut Client,
    req: &TransferRequest,
    hooks: &dyn Hooks,
) -> Result<TransferResult, LedgerError> {
    if req.amount <= 0 {
        return Err(LedgerError::InvalidAmount(req.amount));
    }
    let request_hash = req.request_hash();
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;

    // ANCHOR: transfer_steps (quoted by docs/articles/points-ledger.md; `./run.sh cite --check`)
    // A repair's freeze refuses the transfer before anything is recorded (crate::repair).
    if let Some(account) = crate::repair::frozen_account(&tx, &req.from, &req.to).await? {
        let _ = tx.rollback().await;
        return Err(LedgerError::AccountFrozen(account));
    }

    // Step 1: register the key, or replay what it recorded.
    if let Some(known) = register_or_find(&tx, req, &request_hash).await? {
        tx.rollback().await?;
        return known.answer(req, &request_hash);
    }
    if hooks
        .at(in_tx(HookPoint::Registered, req, &tx))
        .await
        .is_err()
    {
        return abort(tx, HookPoint::Registered).await;
    }

    // Step 2: the conditional debit.
    let Some(debited) = conditional_debit(&tx, req).await? else {
        let result = record_refusal(&tx, req).await?;
        return commit(tx, hooks, req, result).await;
    };
    let from_balance_after = debited;

    // End of step 2 (credit `to`) and step 3 (ledger_txn and entries), one statement.
    let (to_balance_after, txn_id) = match credit_and_record(&tx, req).await {
        Ok(recorded) => recorded,
        Err(error) => {
            let _ = tx.rollback().await;
            return Err(error);
        }
    };
    if hooks
        .at(in_tx(HookPoint::EntriesWritten, req, &tx))
        .await
        .is_err()
    {
        return abort(tx, HookPoint::EntriesWritten).await;
    }

    // Step 4: record OK with the reported balance.
    let result = record_ok_result(&tx, req, from_balance_after, to_balance_after, txn_id).await?;
    commit(tx, hooks, req, result).await
    // ANCHOR_END: transfer_steps
}

/// What step 1 found under a key that was already known; the transfer rolls back and
/// answers with [`KeyKnown::answer`].
pub(crate) enum KeyKnown {
    /// The key's registration (the row of [`READ_REGISTRATION_SQL`]): a replay.
    Stored(Row),
    /// No registration, but a transaction of this key (its `txn_id` row): never again.
    Orphan(Row),
    /// The conflicting registration vanished [`REGISTER_ATTEMPTS`] times.
    Vanished,
}

impl KeyKnown {
    /// The transfer's answer: the replayed result ([`replay`]), or
    /// [`LedgerError::KeyExpired`] for an orphan, or
    /// [`LedgerError::RegistrationVanished`].
    pub(crate) fn answer(
        self,
        req: &TransferRequest,
        request_hash: &str,
    ) -> Result<TransferResult, LedgerError> {
        match self {
            KeyKnown::Stored(row) => replay(req, request_hash, &row),
            KeyKnown::Orphan(row) => Err(LedgerError::KeyExpired {
                txn_id: Some(row.try_get("txn_id")?),
                tombstone: false,
            }),
            KeyKnown::Vanished => Err(LedgerError::RegistrationVanished {
                client_id: req.client_id.clone(),
                idem_key: req.idem_key.clone(),
            }),
        }
    }
}

/// Step 1 inside `tx`: registers the key as PENDING (`None`), or, when it is already
/// known, reads what it left (its registration, else its orphaned transaction) in new
/// statements; when neither is visible (deleted behind our back), registers again, up to
/// [`REGISTER_ATTEMPTS`] times. Rolls nothing back: the caller does.
///
/// Errors: [`LedgerError::Db`].
async fn register_or_find(
    tx: &Transaction<'_>,
    req: &TransferRequest,
    request_hash: &str,
) -> Result<Option<KeyKnown>, LedgerError> {
    let mut attempt = 0;
    loop {
        if register(tx, req, request_hash).await? {
            return Ok(None);
        }
        if let Some(row) = read_registration(tx, req).await? {
            return Ok(Some(KeyKnown::Stored(row)));
        }
        let orphan = tx
            .query_typed_opt(
                ORPHAN_TXN_SQL,
                &[(&req.client_id, Type::TEXT), (&req.idem_key, Type::TEXT)],
            )
            .await?;
        if let Some(row) = orphan {
            return Ok(Some(KeyKnown::Orphan(row)));
        }
        // The conflicting row is gone again (deleted behind our back): try once more.
        attempt += 1;
        if attempt >= REGISTER_ATTEMPTS {
            return Ok(Some(KeyKnown::Vanished));
        }
    }
}

/// Step 1, key known: the key's registration read in a new statement
/// ([`READ_REGISTRATION_SQL`]), `None` when it is not visible.
///
/// Errors: [`LedgerError::Db`].
pub(crate) async fn read_registration(
    tx: &Transaction<'_>,
    req: &TransferRequest,
) -> Result<Option<Row>, LedgerError> {
    Ok(tx
        .query_typed_opt(
            READ_REGISTRATION_SQL,
            &[(&req.client_id, Type::TEXT), (&req.idem_key, Type::TEXT)],
        )
        .await?)
}

/// Step 4 inside `tx`: records OK with `txn_id` and the reported balance (points; `to`'s
/// balance after for a GRANT, else `from`'s) and returns the result to commit.
///
/// Errors: [`LedgerError::Db`].
async fn record_ok_result(
    tx: &Transaction<'_>,
    req: &TransferRequest,
    from_balance_after: i64,
    to_balance_after: i64,
    txn_id: i64,
) -> Result<TransferResult, LedgerError> {
    let balance = match req.kind {
        Kind::Debit | Kind::Transfer => from_balance_after,
        Kind::Grant => to_balance_after,
    };
    record_ok(tx, req, txn_id, balance).await?;
    Ok(TransferResult {
        outcome: Outcome::Ok,
        txn_id: Some(txn_id),
        balance,
        replayed: false,
    })
}

/// Step 2's conditional debit of `req.from` (`WHERE allow_negative OR balance >=
/// amount`); `from`'s balance after, or `None` when refused (or `from` is missing).
///
/// Errors: [`LedgerError::OutOfRange`] when our own arithmetic overflows
/// ([`blame`]); [`LedgerError::Db`].
pub(crate) async fn conditional_debit(
    tx: &Transaction<'_>,
    req: &TransferRequest,
) -> Result<Option<i64>, LedgerError> {
    let debited = tx
        .query_typed_opt(
            DEBIT_FROM_SQL,
            &[(&req.from, Type::TEXT), (&req.amount, Type::INT8)],
        )
        .await
        .map_err(|error| blame(error, &req.from, req.amount))?;
    Ok(match debited {
        Some(row) => Some(row.try_get("balance")?),
        None => None,
    })
}

/// A refused debit: records INSUFFICIENT (reporting `from`'s balance) or NO_ACCOUNT
/// (`from` does not exist) and returns the result to commit.
///
/// Errors: [`LedgerError::Db`].
pub(crate) async fn record_refusal(
    tx: &Transaction<'_>,
    req: &TransferRequest,
) -> Result<TransferResult, LedgerError> {
    let row = tx
        .query_typed_one(
            RECORD_REFUSAL_SQL,
            &[
                (&req.client_id, Type::TEXT),
                (&req.idem_key, Type::TEXT),
                (&req.from, Type::TEXT),
            ],
        )
        .await?;
    let outcome: &str = row.try_get("outcome")?;
    let outcome = if outcome == Outcome::Insufficient.as_str() {
        Outcome::Insufficient
    } else {
        Outcome::NoAccount
    };
    Ok(TransferResult {
        outcome,
        txn_id: None,
        balance: row.try_get("balance_after")?,
        replayed: false,
    })
}

/// Step 1: inserts the key's registration as PENDING; false when the key is already
/// registered (the insert did nothing).
pub(crate) async fn register(
    tx: &Transaction<'_>,
    req: &TransferRequest,
    request_hash: &str,
) -> Result<bool, LedgerError> {
    let registered = tx
        .query_typed_opt(
            REGISTER_SQL,
            &[
                (&req.client_id, Type::TEXT),
                (&req.idem_key, Type::TEXT),
                (&request_hash, Type::TEXT),
            ],
        )
        .await?;
    Ok(registered.is_some())
}

/// Credits `to` and writes the `ledger_txn` row (with `req.order_id`) and its two entries
/// (steps 2–3), in one statement; returns `to`'s balance after and the txn id.
///
/// Errors: [`LedgerError::CreditAccountMissing`]; [`LedgerError::Db`].
pub(crate) async fn credit_and_record(
    tx: &Transaction<'_>,
    req: &TransferRequest,
) -> Result<(i64, i64), LedgerError> {
    let kind = req.kind.as_str();
    let recorded = tx
        .query_typed_opt(
            CREDIT_AND_RECORD_SQL,
            &[
                (&req.client_id, Type::TEXT),
                (&req.idem_key, Type::TEXT),
                (&kind, Type::TEXT),
                (&req.to, Type::TEXT),
                (&req.amount, Type::INT8),
                (&req.from, Type::TEXT),
                (&req.order_id, Type::TEXT),
            ],
        )
        .await
        .map_err(|error| blame(error, &req.to, req.amount))?;
    let Some(recorded) = recorded else {
        return Err(LedgerError::CreditAccountMissing(req.to.clone()));
    };
    debug_assert_eq!(recorded.try_get::<_, i64>("entry_count").ok(), Some(2));
    Ok((recorded.try_get("balance")?, recorded.try_get("txn_id")?))
}

/// Decides who a statement's error is about: SQLSTATE 22003 reported by bigint `+`/`-`
/// with no error context is the statement's own balance arithmetic on `account`, so the
/// request cannot be done ([`LedgerError::OutOfRange`]); the same code from a trigger or a
/// function (the error then has a context, `PL/pgSQL function … line …`) or from any
/// other routine is a server-side failure and stays [`LedgerError::Db`].
fn blame(error: tokio_postgres::Error, account: &str, amount: i64) -> LedgerError {
    let own = error.as_db_error().is_some_and(|db| {
        db.code().code() == NUMERIC_VALUE_OUT_OF_RANGE
            && db.where_().is_none()
            && db
                .routine()
                .is_some_and(|routine| OWN_ARITHMETIC_ROUTINES.contains(&routine))
    });
    if own {
        LedgerError::OutOfRange {
            account: account.to_owned(),
            amount,
        }
    } else {
        LedgerError::from(error)
    }
}

/// Step 4: records outcome OK with the txn id and the reported balance.
pub(crate) async fn record_ok(
    tx: &Transaction<'_>,
    req: &TransferRequest,
    txn_id: i64,
    balance: i64,
) -> Result<(), LedgerError> {
    tx.execute_typed(
        RECORD_OK_SQL,
        &[
            (&req.client_id, Type::TEXT),
            (&req.idem_key, Type::TEXT),
            (&txn_id, Type::INT8),
            (&balance, Type::INT8),
        ],
    )
    .await?;
    Ok(())
}

/// Records, inside the caller's own transaction `tx`, a transfer whose debit of
/// `req.from` the caller has already made by its own strategy (another locking scheme,
/// say) and that left `from_balance_after`: registers the key, credits `req.to`, writes
/// the `ledger_txn` row and its two entries, and records OK, the ledger's way (SPEC §2,
/// §3). A case that bypasses [`transfer`] calls this so that reconciliation (I3, I4 and
/// the request/transaction links) still finds its database clean. Returns the txn id.
/// It commits nothing: the caller commits or rolls back `tx`.
///
/// Errors: [`LedgerError::InvalidAmount`]; [`LedgerError::KeyReused`] when the key is
/// already registered (whatever its payload: this records, it does not replay);
/// [`LedgerError::CreditAccountMissing`]; [`LedgerError::Db`].
pub async fn record_transfer(
    tx: &Transaction<'_>,
    req: &TransferRequest,
    from_balance_after: i64,
) -> Result<i64, LedgerError> {
    if req.amount <= 0 {
        return Err(LedgerError::InvalidAmount(req.amount));
    }
    let request_hash = req.request_hash();
    if !register(tx, req, &request_hash).await? {
        return Err(LedgerError::KeyReused {
            stored_hash: String::from("(already registered)"),
            request_hash,
        });
    }
    let (to_balance_after, txn_id) = credit_and_record(tx, req).await?;
    let balance = match req.kind {
        Kind::Debit | Kind::Transfer => from_balance_after,
        Kind::Grant => to_balance_after,
    };
    record_ok(tx, req, txn_id, balance).await?;
    Ok(txn_id)
}

/// [`transfer`] of a GRANT (`sys-issuer` → `account`, `amount` points) without hooks.
pub async fn grant(
    client: &mut Client,
    client_id: &str,
    idem_key: &str,
    account: &str,
    amount: i64,
) -> Result<TransferResult, LedgerError> {
    let req = TransferRequest::grant(client_id, idem_key, account, amount);
    transfer(client, &req, &NoHooks).await
}

/// [`transfer`] of a DEBIT (`account` → `sys-redeem`, `amount` points) without hooks.
pub async fn debit(
    client: &mut Client,
    client_id: &str,
    idem_key: &str,
    account: &str,
    amount: i64,
) -> Result<TransferResult, LedgerError> {
    let req = TransferRequest::debit(client_id, idem_key, account, amount);
    transfer(client, &req, &NoHooks).await
}

fn in_tx<'a>(
    point: HookPoint,
    request: &'a TransferRequest,
    transaction: &'a Transaction<'a>,
) -> HookContext<'a> {
    HookContext {
        point,
        request,
        transaction: Some(transaction),
    }
}

/// Rolls back after a hook abort. A failed ROLLBACK means the connection is gone, and the
/// server rolls back on its own, so the hook abort is the error reported either way.
async fn abort(tx: Transaction<'_>, point: HookPoint) -> Result<TransferResult, LedgerError> {
    let _ = tx.rollback().await;
    Err(LedgerError::HookAborted(point))
}

/// `before-commit`, COMMIT, `after-commit`.
pub(crate) async fn commit(
    tx: Transaction<'_>,
    hooks: &dyn Hooks,
    req: &TransferRequest,
    result: TransferResult,
) -> Result<TransferResult, LedgerError> {
    if hooks
        .at(in_tx(HookPoint::BeforeCommit, req, &tx))
        .await
        .is_err()
    {
        return abort(tx, HookPoint::BeforeCommit).await;
    }
    tx.commit().await?;
    after_commit(hooks, req, result).await
}

/// The `after-commit` hook of a committed transfer (no open transaction): `result`, or
/// [`LedgerError::HookAborted`] when the hook aborts (the client then gets no answer,
/// though the transfer is committed).
pub(crate) async fn after_commit(
    hooks: &dyn Hooks,
    req: &TransferRequest,
    result: TransferResult,
) -> Result<TransferResult, LedgerError> {
    let after = HookContext {
        point: HookPoint::AfterCommit,
        request: req,
        transaction: None,
    };
    if hooks.at(after).await.is_err() {
        return Err(LedgerError::HookAborted(HookPoint::AfterCommit));
    }
    Ok(result)
}

/// Step 1, key known: compare fingerprints, then return the stored result.
pub(crate) fn replay(
    req: &TransferRequest,
    request_hash: &str,
    row: &Row,
) -> Result<TransferResult, LedgerError> {
    let stored_hash: String = row.try_get("request_hash")?;
    if stored_hash != request_hash {
        return Err(LedgerError::KeyReused {
            stored_hash,
            request_hash: request_hash.to_owned(),
        });
    }
    let stored_outcome: &str = row.try_get("outcome")?;
    if stored_outcome == crate::retention::EXPIRED {
        return Err(LedgerError::KeyExpired {
            txn_id: row.try_get("txn_id")?,
            tombstone: true,
        });
    }
    let Ok(outcome) = stored_outcome.parse::<Outcome>() else {
        return Err(LedgerError::CommittedPending {
            client_id: req.client_id.clone(),
            idem_key: req.idem_key.clone(),
        });
    };
    let balance_after: Option<i64> = row.try_get("balance_after")?;
    Ok(TransferResult {
        outcome,
        txn_id: row.try_get("txn_id")?,
        balance: balance_after.unwrap_or(0),
        replayed: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_route_through_system_accounts() {
        let d = TransferRequest::debit("app-a", "k1", "acct-0001", 300);
        assert_eq!(
            (d.kind, d.from.as_str(), d.to.as_str()),
            (Kind::Debit, "acct-0001", SYS_REDEEM)
        );
        assert_eq!(d.request_hash(), "71ee59fc88147037d30c4e785127a745");
        let ordered = d.clone().with_order("ord-1");
        assert_eq!(ordered.order_id.as_deref(), Some("ord-1"));
        assert_ne!(ordered.request_hash(), d.request_hash());
        // A request serialized before the field existed reads back without an order.
        let old: TransferRequest = serde_json::from_str(
            r#"{"client_id":"app-a","idem_key":"k1","kind":"DEBIT","from":"acct-0001","to":"sys-redeem","amount":300}"#,
        )
        .unwrap();
        assert_eq!(old, d);
        assert!(!serde_json::to_string(&d).unwrap().contains("order_id"));
        let g = TransferRequest::grant("app-a", "k2", "acct-0001", 1000);
        assert_eq!(
            (g.kind, g.from.as_str(), g.to.as_str()),
            (Kind::Grant, SYS_ISSUER, "acct-0001")
        );
    }

    #[test]
    fn transfer_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        fn check(client: &mut Client, req: &TransferRequest) {
            let fut = transfer(client, req, &NoHooks);
            assert_send(&fut);
        }
        let _ = check;
    }
}
