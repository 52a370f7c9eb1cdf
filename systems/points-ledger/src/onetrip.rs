//! The one-round-trip transfer: the whole of SPEC §3 (register, conditional debit, credit,
//! transaction, entries, outcome) in one server-side function, called as one statement
//! in its own implicit transaction.
//!
//! [`transfer`](crate::transfer()) sends START TRANSACTION, the freeze check and four
//! statements and COMMIT, each a round trip (8–9 with a refusal or a replay's reads);
//! [`transfer_onetrip`] sends one: `SELECT * FROM ledger_transfer_onetrip(...)`, whose
//! PL/pgSQL body runs the same statements on the server. Same outcomes, same replay, same
//! fingerprint (computed here and compared here, by the same code), same lock order
//! (`from`, then `to`), same tables written in the same order. What differs:
//!
//! - **Hook points.** Only [`HookPoint::AfterCommit`] exists: `registered`,
//!   `entries-written` and `before-commit` lie inside the server's statement, where no
//!   client code can run, so [`transfer_onetrip`] never calls hooks there (LIMITS.md,
//!   "The one-trip transfer", says what this means for L7–L10).
//! - **Isolation.** A single statement cannot set its own isolation level; the function
//!   refuses to run unless the transaction is READ COMMITTED (SQLSTATE
//!   [`SQLSTATE_NOT_READ_COMMITTED`]), so it can never run under another level unnoticed.
//!   The service sets `default_transaction_isolation` on its sessions explicitly.
//! - **Errors raised by the function itself** carry our own SQLSTATEs (class `LD`, unused
//!   by PostgreSQL, docs Appendix A) and are mapped back to the same [`LedgerError`]s:
//!   a missing credit account, and our own balance arithmetic leaving the bigint range
//!   (checked in the UPDATEs' own WHERE clauses, so the arithmetic itself never
//!   overflows; a 22003 from a trigger stays [`LedgerError::Db`]).
//!
//! Inside a VOLATILE PL/pgSQL function under READ COMMITTED each statement takes a new
//! snapshot (PostgreSQL docs, 38.7 "Function Volatility Categories"), so the read after
//! `ON CONFLICT DO NOTHING` sees the row committed by the transaction it waited for,
//! exactly as the separate statement does; the conditional UPDATE re-checks the newest
//! row version after a wait (EvalPlanQual, docs 13.2.1) as it does outside a function.
//!
//! The function is installed by [`crate::schema::install`]. Its parameters are named and
//! called by name (`p_amount => $7`), so one more request field is one more parameter
//! with a `DEFAULT` and one more `=>` in [`ONETRIP_CALL_SQL`], as the debit's business
//! reference was added ([`TransferRequest::order_id`] as `p_order_id`, stored in
//! `ledger_txn.order_id` by the same INSERT as in the statement mode).

use std::fmt;
use std::str::FromStr;

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::LedgerError;
use crate::transfer::{Hooks, TransferRequest, TransferResult, after_commit, replay};
use crate::vocabulary::{HookPoint, Outcome, UnknownName};

/// How a transfer is sent to the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransferMode {
    /// SPEC §3 as written: one transaction of separate statements, with every hook point
    /// ([`crate::transfer()`]).
    #[default]
    Statements,
    /// The same work in one statement calling `ledger_transfer_onetrip`
    /// ([`transfer_onetrip`]); only the `after-commit` hook point exists.
    OneTrip,
}

impl TransferMode {
    /// Both modes, the default first.
    pub const ALL: [TransferMode; 2] = [TransferMode::Statements, TransferMode::OneTrip];

    /// The spelling of `--transfer-mode`: `statements` or `onetrip`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransferMode::Statements => "statements",
            TransferMode::OneTrip => "onetrip",
        }
    }

    /// Whether `point` is passed by a transfer in this mode (in [`TransferMode::OneTrip`]
    /// only [`HookPoint::AfterCommit`]).
    pub fn has_hook_point(self, point: HookPoint) -> bool {
        match self {
            TransferMode::Statements => true,
            TransferMode::OneTrip => point == HookPoint::AfterCommit,
        }
    }
}

impl fmt::Display for TransferMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TransferMode {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        TransferMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == text)
            .ok_or_else(|| UnknownName {
                what: "transfer mode",
                input: text.to_owned(),
            })
    }
}

/// SQLSTATE raised by the function when the transaction is not READ COMMITTED.
pub const SQLSTATE_NOT_READ_COMMITTED: &str = "LD001";
/// SQLSTATE raised by the function when the credited account does not exist (mapped to
/// [`LedgerError::CreditAccountMissing`]; the whole statement is rolled back).
pub const SQLSTATE_CREDIT_ACCOUNT_MISSING: &str = "LD002";
/// SQLSTATE raised by the function when `balance - amount` on `from` or
/// `balance + amount` on `to` would leave the bigint range (mapped to
/// [`LedgerError::OutOfRange`]; DETAIL is `from` or `to`).
pub const SQLSTATE_OUT_OF_RANGE: &str = "LD003";

/// How often the function tries to register when the conflicting row is not visible,
/// the bound [`crate::transfer()`] uses (see [`LedgerError::RegistrationVanished`]).
const REGISTER_ATTEMPTS: i32 = crate::transfer::REGISTER_ATTEMPTS as i32;

/// The function, installed by [`crate::schema::install`] (`CREATE OR REPLACE`: running it
/// twice is harmless). Returns one row: `status` (`executed`, `stored`, `orphan`,
/// `frozen`, `vanished`), and per status the `account_id` (frozen), the stored
/// `request_hash`, `outcome`, `txn_id` and `balance_after` (stored, executed; `txn_id`
/// for an orphan).
///
/// `#variable_conflict use_column`: the OUT columns share names with table columns; in
/// the body a bare name is always the column (PostgreSQL docs, 41.11.1 "Variable
/// Substitution"), and every variable is prefixed `p_` or `v_`.
pub const FUNCTION_SQL: &str = r#"
CREATE OR REPLACE FUNCTION ledger_transfer_onetrip(
    p_client_id    text,
    p_idem_key     text,
    p_request_hash text,
    p_kind         text,
    p_from         text,
    p_to           text,
    p_amount       bigint,
    p_attempts     integer DEFAULT 3,
    p_order_id     text    DEFAULT NULL
) RETURNS TABLE (
    status        text,
    account_id    text,
    request_hash  text,
    outcome       text,
    txn_id        bigint,
    balance_after bigint
) LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    v_frozen     text;
    v_attempt    integer := 0;
    v_hash       text;
    v_outcome    text;
    v_txn        bigint;
    v_balance    bigint;
    v_from_after bigint;
    v_to_after   bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'ledger_transfer_onetrip must run at READ COMMITTED, not %',
            current_setting('transaction_isolation') USING ERRCODE = 'LD001';
    END IF;

    -- A repair's freeze refuses the transfer before anything is recorded.
    SELECT f.account_id INTO v_frozen FROM account_freeze f
    WHERE f.account_id IN (p_from, p_to) ORDER BY f.account_id LIMIT 1;
    IF FOUND THEN
        RETURN QUERY SELECT 'frozen'::text, v_frozen, NULL::text, NULL::text, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;

    -- Step 1: register the key, or return what it recorded (compared by the caller).
    LOOP
        INSERT INTO idem_request (client_id, idem_key, request_hash, outcome)
        SELECT p_client_id, p_idem_key, p_request_hash, 'PENDING'
        WHERE NOT EXISTS (
            SELECT 1 FROM ledger_txn t WHERE t.client_id = p_client_id AND t.idem_key = p_idem_key)
        ON CONFLICT (client_id, idem_key) DO NOTHING;
        EXIT WHEN FOUND;
        SELECT r.request_hash, r.outcome, r.txn_id, r.balance_after
        INTO v_hash, v_outcome, v_txn, v_balance
        FROM idem_request r WHERE r.client_id = p_client_id AND r.idem_key = p_idem_key;
        IF FOUND THEN
            RETURN QUERY SELECT 'stored'::text, NULL::text, v_hash, v_outcome, v_txn, v_balance;
            RETURN;
        END IF;
        SELECT t.txn_id INTO v_txn
        FROM ledger_txn t WHERE t.client_id = p_client_id AND t.idem_key = p_idem_key;
        IF FOUND THEN
            RETURN QUERY SELECT 'orphan'::text, NULL::text, NULL::text, NULL::text, v_txn, NULL::bigint;
            RETURN;
        END IF;
        v_attempt := v_attempt + 1;
        IF v_attempt >= p_attempts THEN
            RETURN QUERY SELECT 'vanished'::text, NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::bigint;
            RETURN;
        END IF;
    END LOOP;

    -- Step 2: the conditional debit (EvalPlanQual after a wait). The last condition keeps
    -- the subtraction inside bigint (only an allow_negative account can get there).
    UPDATE account a SET balance = a.balance - p_amount
    WHERE a.account_id = p_from AND (a.allow_negative OR a.balance >= p_amount)
      AND a.balance >= p_amount + (-9223372036854775807 - 1)
    RETURNING a.balance INTO v_from_after;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM account a WHERE a.account_id = p_from AND a.allow_negative
                   AND a.balance < p_amount + (-9223372036854775807 - 1)) THEN
            RAISE EXCEPTION 'debit of % points would take % below the bigint range', p_amount, p_from
                USING ERRCODE = 'LD003', DETAIL = 'from';
        END IF;
        -- Refused: INSUFFICIENT with the current balance, or NO_ACCOUNT with 0; recorded.
        WITH current AS (SELECT a.balance FROM account a WHERE a.account_id = p_from)
        UPDATE idem_request r
        SET outcome = CASE WHEN EXISTS (SELECT 1 FROM current) THEN 'INSUFFICIENT' ELSE 'NO_ACCOUNT' END,
            balance_after = COALESCE((SELECT c.balance FROM current c), 0)
        WHERE r.client_id = p_client_id AND r.idem_key = p_idem_key
        RETURNING r.outcome, r.balance_after INTO v_outcome, v_balance;
        RETURN QUERY SELECT 'executed'::text, NULL::text, p_request_hash, v_outcome, NULL::bigint, v_balance;
        RETURN;
    END IF;

    -- End of step 2: credit `to` (locked after `from`; it must exist).
    UPDATE account a SET balance = a.balance + p_amount
    WHERE a.account_id = p_to AND a.balance <= 9223372036854775807 - p_amount
    RETURNING a.balance INTO v_to_after;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM account a WHERE a.account_id = p_to) THEN
            RAISE EXCEPTION 'credit of % points would take % above the bigint range', p_amount, p_to
                USING ERRCODE = 'LD003', DETAIL = 'to';
        END IF;
        RAISE EXCEPTION 'credit account % does not exist', p_to USING ERRCODE = 'LD002';
    END IF;

    -- Step 3: the transaction (with the request's order id, NULL without one) and its
    -- two entries (-amount on `from` first).
    INSERT INTO ledger_txn (client_id, idem_key, kind, order_id)
    VALUES (p_client_id, p_idem_key, p_kind, p_order_id)
    RETURNING ledger_txn.txn_id INTO v_txn;
    INSERT INTO ledger_entry (txn_id, account_id, amount)
    VALUES (v_txn, p_from, -p_amount), (v_txn, p_to, p_amount);

    -- Step 4: the outcome, with the reported balance (GRANT: `to`'s, else `from`'s).
    v_balance := CASE WHEN p_kind = 'GRANT' THEN v_to_after ELSE v_from_after END;
    UPDATE idem_request r SET outcome = 'OK', txn_id = v_txn, balance_after = v_balance
    WHERE r.client_id = p_client_id AND r.idem_key = p_idem_key;
    RETURN QUERY SELECT 'executed'::text, NULL::text, p_request_hash, 'OK'::text, v_txn, v_balance;
END
$fn$;
"#;

/// The one statement [`transfer_onetrip`] sends (parameters by name; see the module
/// documentation for adding a field).
const ONETRIP_CALL_SQL: &str = "\
SELECT status, account_id, request_hash, outcome, txn_id, balance_after
FROM ledger_transfer_onetrip(
    p_client_id => $1, p_idem_key => $2, p_request_hash => $3, p_kind => $4,
    p_from => $5, p_to => $6, p_amount => $7, p_attempts => $8, p_order_id => $9)";

/// Executes `req` at most once per `(client_id, idem_key)` with exactly the outcomes,
/// replay and fingerprint of [`crate::transfer()`], in one round trip: one statement in
/// its own implicit transaction (the connection must not be inside a transaction, and
/// its transactions must be READ COMMITTED, the default). The statement's end is the
/// commit; then [`HookPoint::AfterCommit`] runs on every committing path (OK,
/// INSUFFICIENT, NO_ACCOUNT), the only hook point of this mode; a replay runs none.
///
/// Errors: as [`crate::transfer()`] (the same variants, in the same situations), plus
/// [`LedgerError::Db`] with SQLSTATE [`SQLSTATE_NOT_READ_COMMITTED`] when the session's
/// transactions are not READ COMMITTED, and SQLSTATE 42883 when the function is not
/// installed. On every error except `HookAborted(AfterCommit)` nothing was committed.
pub async fn transfer_onetrip(
    client: &Client,
    req: &TransferRequest,
    hooks: &dyn Hooks,
) -> Result<TransferResult, LedgerError> {
    if req.amount <= 0 {
        return Err(LedgerError::InvalidAmount(req.amount));
    }
    let request_hash = req.request_hash();
    let kind = req.kind.as_str();
    let row = client
        .query_typed_one(
            ONETRIP_CALL_SQL,
            &[
                (&req.client_id, Type::TEXT),
                (&req.idem_key, Type::TEXT),
                (&request_hash, Type::TEXT),
                (&kind, Type::TEXT),
                (&req.from, Type::TEXT),
                (&req.to, Type::TEXT),
                (&req.amount, Type::INT8),
                (&REGISTER_ATTEMPTS, Type::INT4),
                (&req.order_id, Type::TEXT),
            ],
        )
        .await
        .map_err(|error| own_error(error, req))?;
    let status: &str = row.try_get("status")?;
    match status {
        "executed" => {
            let outcome: &str = row.try_get("outcome")?;
            let Ok(outcome) = outcome.parse::<Outcome>() else {
                return Err(LedgerError::CommittedPending {
                    client_id: req.client_id.clone(),
                    idem_key: req.idem_key.clone(),
                });
            };
            let balance: Option<i64> = row.try_get("balance_after")?;
            let result = TransferResult {
                outcome,
                txn_id: row.try_get("txn_id")?,
                balance: balance.unwrap_or(0),
                replayed: false,
            };
            after_commit(hooks, req, result).await
        }
        "stored" => replay(req, &request_hash, &row),
        "orphan" => Err(LedgerError::KeyExpired {
            txn_id: row.try_get("txn_id")?,
            tombstone: false,
        }),
        "frozen" => Err(LedgerError::AccountFrozen(row.try_get("account_id")?)),
        _ => Err(LedgerError::RegistrationVanished {
            client_id: req.client_id.clone(),
            idem_key: req.idem_key.clone(),
        }),
    }
}

/// Maps the function's own SQLSTATEs back to the errors [`crate::transfer()`] reports;
/// everything else stays [`LedgerError::Db`].
fn own_error(error: tokio_postgres::Error, req: &TransferRequest) -> LedgerError {
    let Some(db) = error.as_db_error() else {
        return LedgerError::from(error);
    };
    match db.code().code() {
        SQLSTATE_CREDIT_ACCOUNT_MISSING => LedgerError::CreditAccountMissing(req.to.clone()),
        SQLSTATE_OUT_OF_RANGE => LedgerError::OutOfRange {
            account: if db.detail() == Some("from") {
                req.from.clone()
            } else {
                req.to.clone()
            },
            amount: req.amount,
        },
        _ => LedgerError::from(error),
    }
}

/// [`crate::transfer()`] or [`transfer_onetrip`], by `mode`.
///
/// Errors: those of the chosen function.
pub async fn transfer_in(
    mode: TransferMode,
    client: &mut Client,
    req: &TransferRequest,
    hooks: &dyn Hooks,
) -> Result<TransferResult, LedgerError> {
    match mode {
        TransferMode::Statements => crate::transfer::transfer(client, req, hooks).await,
        TransferMode::OneTrip => transfer_onetrip(client, req, hooks).await,
    }
}

/// [`crate::grant()`] in `mode`: a GRANT (`sys-issuer` → `account`) without hooks.
///
/// Errors: as [`transfer_in`].
pub async fn grant_in(
    mode: TransferMode,
    client: &mut Client,
    client_id: &str,
    idem_key: &str,
    account: &str,
    amount: i64,
) -> Result<TransferResult, LedgerError> {
    let req = TransferRequest::grant(client_id, idem_key, account, amount);
    transfer_in(mode, client, &req, &crate::NoHooks).await
}

/// [`crate::debit()`] in `mode`: a DEBIT (`account` → `sys-redeem`) without hooks.
///
/// Errors: as [`transfer_in`].
pub async fn debit_in(
    mode: TransferMode,
    client: &mut Client,
    client_id: &str,
    idem_key: &str,
    account: &str,
    amount: i64,
) -> Result<TransferResult, LedgerError> {
    let req = TransferRequest::debit(client_id, idem_key, account, amount);
    transfer_in(mode, client, &req, &crate::NoHooks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names_round_trip() {
        for mode in TransferMode::ALL {
            assert_eq!(mode.as_str().parse::<TransferMode>().unwrap(), mode);
        }
        assert!("one-trip".parse::<TransferMode>().is_err());
        assert!(TransferMode::OneTrip.has_hook_point(HookPoint::AfterCommit));
        assert!(!TransferMode::OneTrip.has_hook_point(HookPoint::BeforeCommit));
        assert!(TransferMode::Statements.has_hook_point(HookPoint::Registered));
    }

    #[test]
    fn the_call_names_every_parameter_of_the_function() {
        for name in [
            "p_client_id",
            "p_idem_key",
            "p_request_hash",
            "p_kind",
            "p_from",
            "p_to",
            "p_amount",
            "p_attempts",
            "p_order_id",
        ] {
            assert!(FUNCTION_SQL.contains(name), "{name}");
            assert!(ONETRIP_CALL_SQL.contains(&format!("{name} =>")), "{name}");
        }
    }
}
