//! The ledger's tables (SPEC §2), the one-trip transfer's server-side function, and the
//! seeded accounts (SPEC §6).
//!
//! Table, column and constraint names are a contract: the cases query them directly and
//! one case drops the CHECK `balance_non_negative` by name.

use tokio_postgres::Client;
use tokio_postgres::types::Type;

use crate::error::LedgerError;

/// Account id of the issuer: the source of all points. It may go negative; its negative
/// balance equals the total issued (SPEC §2).
pub const SYS_ISSUER: &str = "sys-issuer";

/// Account id of the redemption sink: the destination of every debit (SPEC §2).
pub const SYS_REDEEM: &str = "sys-redeem";

/// Account ids starting with this prefix are reserved for system accounts
/// ([`SYS_ISSUER`], [`SYS_REDEEM`] and its stripes `sys-redeem-NN`).
pub const SYSTEM_ACCOUNT_PREFIX: &str = "sys-";

/// Whether `account_id` names a system account (see [`SYSTEM_ACCOUNT_PREFIX`]); the
/// public HTTP routes refuse them.
pub fn is_system_account(account_id: &str) -> bool {
    account_id.starts_with(SYSTEM_ACCOUNT_PREFIX)
}

/// Number of seeded ordinary accounts (`acct-0001` … `acct-0010`, SPEC §6).
pub const TEST_ACCOUNT_COUNT: u32 = 10;

/// The id of seeded test account `n` (1-based): `test_account(1) == "acct-0001"`.
/// Numbers above 9999 get more digits (`acct-10000`); [`seed`] creates 1..=[`TEST_ACCOUNT_COUNT`].
pub fn test_account(n: u32) -> String {
    format!("acct-{n:04}")
}

/// DDL for the four ledger tables, their constraints and indexes (SPEC §2).
///
/// - `account`: `balance` in points, a cached value derived from `ledger_entry`; the CHECK
///   `balance_non_negative` allows a negative balance only where `allow_negative`.
/// - `idem_request`: one row per `(client_id, idem_key)`; `outcome` is `PENDING` only inside
///   the registering transaction; `txn_id` is set for `OK`; `balance_after` is the balance
///   reported to the client (points). `EXPIRED` marks a tombstone left by the retention
///   sweep ([`crate::retention`]): the stored response (`balance_after`, the outcome) is
///   gone, the fingerprint and `txn_id` stay, and `expired_at` says when the record
///   expired (set exactly for `EXPIRED`, CHECK `idem_request_tombstone_check`).
/// - `ledger_txn`: one row per executed transfer; its own `UNIQUE (client_id, idem_key)`
///   guarantees one key never produces two transactions, even if idempotency logic failed.
///   `order_id` is the business reference a debit carries (a redemption order id,
///   [`crate::TransferRequest::order_id`]), NULL without one; deliberately not unique:
///   the ledger records what it was asked, and a reconciliation of orders against the
///   ledger is what finds an order paid twice (index `ledger_txn_order_id_idx`).
/// - `ledger_entry`: the record of fact, signed amounts in points (never 0).
///
/// Plain `CREATE` statements: running it twice fails with SQLSTATE 42P07.
pub const SCHEMA_SQL: &str = r#"
CREATE TABLE account (
    account_id     text    PRIMARY KEY,
    allow_negative boolean NOT NULL DEFAULT false,
    balance        bigint  NOT NULL DEFAULT 0,
    CONSTRAINT balance_non_negative CHECK (allow_negative OR balance >= 0)
);

CREATE TABLE idem_request (
    client_id     text        NOT NULL,
    idem_key      text        NOT NULL,
    request_hash  text        NOT NULL,
    outcome       text        NOT NULL
        CONSTRAINT idem_request_outcome_check
        CHECK (outcome IN ('PENDING', 'OK', 'INSUFFICIENT', 'NO_ACCOUNT', 'EXPIRED')),
    txn_id        bigint      NULL,
    balance_after bigint      NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expired_at    timestamptz NULL,
    CONSTRAINT idem_request_tombstone_check
        CHECK ((outcome = 'EXPIRED') = (expired_at IS NOT NULL)),
    PRIMARY KEY (client_id, idem_key)
);

CREATE TABLE ledger_txn (
    txn_id     bigserial   PRIMARY KEY,
    client_id  text        NOT NULL,
    idem_key   text        NOT NULL,
    kind       text        NOT NULL
        CONSTRAINT ledger_txn_kind_check CHECK (kind IN ('DEBIT', 'GRANT', 'TRANSFER', 'ADJUST')),
    created_at timestamptz NOT NULL DEFAULT now(),
    order_id   text        NULL,
    CONSTRAINT ledger_txn_client_id_idem_key_key UNIQUE (client_id, idem_key)
);

CREATE TABLE ledger_entry (
    entry_id   bigserial PRIMARY KEY,
    txn_id     bigint    NOT NULL REFERENCES ledger_txn (txn_id),
    account_id text      NOT NULL REFERENCES account (account_id),
    amount     bigint    NOT NULL CONSTRAINT ledger_entry_amount_check CHECK (amount <> 0)
);

CREATE INDEX ledger_entry_account_id_idx ON ledger_entry (account_id);
CREATE INDEX ledger_entry_txn_id_idx ON ledger_entry (txn_id);
CREATE INDEX ledger_txn_order_id_idx ON ledger_txn (order_id) WHERE order_id IS NOT NULL;
"#;

/// The one-trip transfer's server-side function `ledger_transfer_onetrip`
/// ([`crate::onetrip`], which calls it), installed by [`install`] (`CREATE OR REPLACE`:
/// running it twice is harmless). Returns one row: `status` (`executed`, `stored`, `orphan`,
/// `frozen`, `vanished`), and per status the `account_id` (frozen), the stored
/// `request_hash`, `outcome`, `txn_id` and `balance_after` (stored, executed; `txn_id`
/// for an orphan).
///
/// `#variable_conflict use_column`: the OUT columns share names with table columns; in
/// the body a bare name is always the column (PostgreSQL docs, 41.11.1 "Variable
/// Substitution"), and every variable is prefixed `p_` or `v_`.
pub const ONETRIP_FUNCTION_SQL: &str = r#"
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

/// Creates the tables of [`SCHEMA_SQL`] and the repair's ([`crate::repair::SCHEMA_SQL`])
/// in the connected database, and the one-trip transfer's function
/// ([`ONETRIP_FUNCTION_SQL`]).
///
/// The statements run as one simple-protocol query string, which PostgreSQL executes as a
/// single implicit transaction: either all tables exist afterwards or none.
///
/// Errors: [`LedgerError::Db`] (e.g. SQLSTATE 42P07 if a table already exists).
pub async fn install(client: &Client) -> Result<(), LedgerError> {
    client.batch_execute(SCHEMA_SQL).await?;
    client.batch_execute(crate::repair::SCHEMA_SQL).await?;
    client.batch_execute(ONETRIP_FUNCTION_SQL).await?;
    Ok(())
}

/// Inserts the seeded accounts, all with balance 0 points: [`SYS_ISSUER`] (with
/// `allow_negative = true`), [`SYS_REDEEM`] and `acct-0001` … `acct-0010`
/// ([`test_account`], [`TEST_ACCOUNT_COUNT`]). One INSERT statement.
///
/// Errors: [`LedgerError::Db`] (e.g. SQLSTATE 23505 if an account already exists).
pub async fn seed(client: &Client) -> Result<(), LedgerError> {
    let mut ids = vec![SYS_ISSUER.to_owned(), SYS_REDEEM.to_owned()];
    let mut allow_negative = vec![true, false];
    for n in 1..=TEST_ACCOUNT_COUNT {
        ids.push(test_account(n));
        allow_negative.push(false);
    }
    client
        .execute_typed(
            "INSERT INTO account (account_id, allow_negative, balance) \
             SELECT id, neg, 0 FROM unnest($1::text[], $2::boolean[]) AS s(id, neg)",
            &[
                (&ids, Type::TEXT_ARRAY),
                (&allow_negative, Type::BOOL_ARRAY),
            ],
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_account_names() {
        assert_eq!(test_account(1), "acct-0001");
        assert_eq!(test_account(10), "acct-0010");
    }
}
