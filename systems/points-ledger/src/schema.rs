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
-- ANCHOR: schema (quoted by docs/articles/points-ledger.md; `./run.sh cite --check`)
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
-- Room on each page for the PENDING row's one update to its outcome, so that update is
-- HOT (no new index entry, SPEC §2.2): 100% of them in the bench's batches of 12, against
-- 97% with the pages filled (docs/batch.md, "The levers").
) WITH (fillfactor = 90);

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
    -- References ledger_txn (txn_id) and account (account_id), enforced set-based by
    -- REFERENCES_SQL (the references ledger_entry_txn_id_fkey and ledger_entry_account_id_fkey).
    txn_id     bigint    NOT NULL,
    account_id text      NOT NULL,
    amount     bigint    NOT NULL CONSTRAINT ledger_entry_amount_check CHECK (amount <> 0)
);

CREATE INDEX ledger_entry_account_id_idx ON ledger_entry (account_id);
CREATE INDEX ledger_entry_txn_id_idx ON ledger_entry (txn_id);
CREATE INDEX ledger_txn_order_id_idx ON ledger_txn (order_id) WHERE order_id IS NOT NULL;
-- ANCHOR_END: schema
"#;

/// The entries' references (SPEC §2.2), enforced set-based instead of by declared foreign
/// keys: after every statement that inserts or updates `ledger_entry` rows, one check over
/// all of them (`ledger_entry_references`, two anti-joins over the statement's rows that
/// lock every referenced row `FOR KEY SHARE`, as a foreign key's check does) refuses an
/// orphan with SQLSTATE 23503 in a declared key's words, naming
/// `ledger_entry_txn_id_fkey` or `ledger_entry_account_id_fkey`; and `account` and
/// `ledger_txn` are append-only (no DELETE, TRUNCATE or UPDATE of the key column: 23503
/// naming the reference). Where the declared keys made four checks per debit, each an
/// SPI query of its own, a batch of 12 debits makes one: 23% of the batch's instructions
/// were the keys' (docs/batch.md, "The levers").
pub const REFERENCES_SQL: &str = include_str!("sql/references.sql");

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

/// The batch transfer's server-side function `ledger_transfer_batch` ([`crate::batch`],
/// which calls it), installed by [`install`] (`CREATE OR REPLACE`). It takes one request
/// per array position (all arrays of one length; each `(client_id, idem_key)` at most
/// once, else SQLSTATE `LD004`, raised after the registration of step 2, so such a call
/// may first wait behind another transaction's key, or fail on its `lock_timeout` or on a
/// NULL first; [`crate::batch`] never sends one: it moves a repeated key to a later
/// transaction) and returns one row per request: `ord` (1-based position),
/// `status` (`executed`, `stored`, `orphan`, `frozen`, `vanished`, `no_credit`,
/// `out_of_range`), and per status the `account_id` (frozen, out of range), the stored
/// `request_hash`, `outcome`, `txn_id` and `balance_after` (stored, executed).
///
/// The steps, each one statement over the whole batch except the debit decisions:
///
/// 1. the freeze check;
/// 2. registration of every key, sorted by key: all registered when the INSERT inserted
///    as many rows as keys, else the keys registered told apart by its RETURNING; retried
///    for keys whose conflicting row vanished; keys already known read back in a new
///    statement;
/// 3. the accounts locked in one global order (user accounts by id, then system accounts
///    by id), `FOR NO KEY UPDATE`, so two batches never wait on each other in a circle:
///    here the user accounts and the system accounts up to the last one debited;
/// 4. the debit decisions, one loop over the requests in arrival order on the balances
///    held in arrays (no statement per request); the system accounts only credited (the
///    sink) are open: each credit's range check is kept as a bound on their balance;
/// 5. one UPDATE writing each changed locked balance once;
/// 6. the transactions (ids drawn in arrival order) and their entries, two INSERTs;
/// 7. every outcome in one statement;
/// 8. the registrations of requests that cannot be done (credit account missing, out of
///    range) deleted, as a rollback of just that request would;
/// 9. the open accounts locked last, their balances checked against the bounds and
///    credited once, so a batch holds the sink only from here to its COMMIT. Out of the
///    bounds, steps 4–9 (a `BEGIN … EXCEPTION` block, SQLSTATE `LD005`) are undone and
///    taken again with every balance locked first.
pub const BATCH_FUNCTION_SQL: &str = r#"
CREATE OR REPLACE FUNCTION ledger_transfer_batch(
    p_client_ids     text[],
    p_idem_keys      text[],
    p_request_hashes text[],
    p_kinds          text[],
    p_froms          text[],
    p_tos            text[],
    p_amounts        bigint[],
    p_order_ids      text[],
    p_attempts       integer DEFAULT 3
) RETURNS TABLE (
    ord           integer,
    status        text,
    account_id    text,
    request_hash  text,
    outcome       text,
    txn_id        bigint,
    balance_after bigint
) LANGUAGE plpgsql VOLATILE
-- The batch's keys and accounts arrive as arrays, whose size the planner cannot see in a
-- cached plan: left to itself it may read the whole idem_request table per batch (a
-- sequential scan under a hash join). Every statement here reaches a handful of rows
-- by their keys, so the function plans with index lookups only (docs 19.7.1), once per
-- session (a generic plan, not one planned again for every batch's arrays; docs 19.7.6).
-- A disabled plan node still counts its penalty in the cost, which would cross the JIT
-- thresholds and compile every statement on every call: no JIT (docs 32.2).
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_n       integer := coalesce(cardinality(p_client_ids), 0);
    v_status  text[];
    v_account text[];
    v_hash    text[];
    v_outcome text[];
    v_txn     bigint[];
    v_balance bigint[];
    v_todo    integer[];
    v_new     integer[];
    v_reg     integer[] := '{}';
    v_ok      integer[];
    v_ids     text[];
    v_bal     bigint[];
    v_old     bigint[];
    v_neg     boolean[];
    v_uids    text[];
    v_ubal    bigint[];
    v_uneg    boolean[];
    v_nuser   integer;
    v_sys     text[];
    v_names   text[];
    v_inserted bigint;
    v_ic      text[];
    v_ik      text[];
    v_sids    text[];
    v_sbal    bigint[];
    v_sneg    boolean[];
    v_lids    text[];
    v_lbal    bigint[];
    v_lneg    boolean[];
    v_split   text;
    v_drawn   bigint[] := '{}';
    v_high    numeric[];
    v_open    boolean;
    v_exact   boolean := false;
    v_status0 text[];
    v_outcome0 text[];
    v_balance0 bigint[];
    v_account0 text[];
    v_txn0    bigint[];
    v_undone  boolean := false;
    v_distinct boolean := false;
    v_attempt integer := 0;
    v_row     record;
    i         integer;
    f         integer;
    t         integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'ledger_transfer_batch must run at READ COMMITTED, not %',
            current_setting('transaction_isolation') USING ERRCODE = 'LD001';
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_status := array_fill(NULL::text, ARRAY[v_n]);
    v_account := v_status; v_hash := v_status; v_outcome := v_status;
    v_txn := array_fill(NULL::bigint, ARRAY[v_n]);
    v_balance := v_txn;

    -- 1. A repair's freeze refuses a request before anything of it is recorded. Read
    -- once for the whole batch when no account is frozen (one probe, not two per
    -- request); either way before any lock, as the one-trip function reads it.
    IF EXISTS (SELECT 1 FROM account_freeze) THEN
        FOR v_row IN
            SELECT u.g, min(f.account_id) AS frozen
            FROM unnest(p_froms, p_tos) WITH ORDINALITY u(fr, tt, g)
            JOIN account_freeze f ON f.account_id IN (u.fr, u.tt)
            GROUP BY u.g
        LOOP
            v_status[v_row.g] := 'frozen';
            v_account[v_row.g] := v_row.frozen;
        END LOOP;
    END IF;

    -- 2. Register every key, sorted by key (ON CONFLICT waits for a key another
    -- transaction holds). The keys registered are counted, and told apart by the
    -- INSERT's RETURNING only when some were not; a known key is read back in a new
    -- statement (a new snapshot).
    v_todo := ARRAY(SELECT g FROM generate_series(1, v_n) g WHERE v_status[g] IS NULL);
    WHILE cardinality(v_todo) > 0 LOOP
        WITH ins AS (
            INSERT INTO idem_request (client_id, idem_key, request_hash, outcome)
            SELECT u.c, u.k, u.h, 'PENDING'
            FROM unnest(p_client_ids, p_idem_keys, p_request_hashes) WITH ORDINALITY u(c, k, h, g)
            WHERE u.g = ANY (v_todo)
              AND NOT EXISTS (SELECT 1 FROM ledger_txn x WHERE x.client_id = u.c AND x.idem_key = u.k)
            ORDER BY u.c, u.k
            ON CONFLICT (client_id, idem_key) DO NOTHING
            RETURNING client_id, idem_key)
        SELECT count(*), array_agg(ins.client_id), array_agg(ins.idem_key)
        INTO v_inserted, v_ic, v_ik FROM ins;
        -- Each of the batch's requests registered by this one INSERT: its keys are
        -- distinct (ON CONFLICT DO NOTHING skips a row whose key an earlier row of the
        -- same INSERT took), so the check below has nothing to find.
        v_distinct := v_distinct OR v_inserted = v_n;
        -- Every key to do registered (keys are distinct): no need to tell them apart.
        IF v_inserted = cardinality(v_todo) THEN
            v_new := v_todo;
        ELSE
            v_new := ARRAY(SELECT u.g FROM unnest(p_client_ids, p_idem_keys) WITH ORDINALITY u(c, k, g)
                           WHERE u.g = ANY (v_todo)
                             AND EXISTS (SELECT 1 FROM unnest(v_ic, v_ik) i(c, k) WHERE i.c = u.c AND i.k = u.k)
                           ORDER BY u.g);
        END IF;
        v_reg := v_reg || v_new;
        EXIT WHEN cardinality(v_new) = cardinality(v_todo);
        v_todo := ARRAY(SELECT g FROM unnest(v_todo) g WHERE g <> ALL (v_new));
        FOR v_row IN
            SELECT u.g, r.request_hash, r.outcome, r.txn_id, r.balance_after
            FROM unnest(p_client_ids, p_idem_keys) WITH ORDINALITY u(c, k, g)
            JOIN idem_request r ON r.client_id = u.c AND r.idem_key = u.k
            WHERE u.g = ANY (v_todo)
        LOOP
            v_status[v_row.g] := 'stored';
            v_hash[v_row.g] := v_row.request_hash;
            v_outcome[v_row.g] := v_row.outcome;
            v_txn[v_row.g] := v_row.txn_id;
            v_balance[v_row.g] := v_row.balance_after;
        END LOOP;
        FOR v_row IN
            SELECT u.g, x.txn_id
            FROM unnest(p_client_ids, p_idem_keys) WITH ORDINALITY u(c, k, g)
            JOIN ledger_txn x ON x.client_id = u.c AND x.idem_key = u.k
            WHERE u.g = ANY (v_todo) AND v_status[u.g] IS NULL
        LOOP
            v_status[v_row.g] := 'orphan';
            v_txn[v_row.g] := v_row.txn_id;
        END LOOP;
        v_todo := ARRAY(SELECT g FROM unnest(v_todo) g WHERE v_status[g] IS NULL);
        v_attempt := v_attempt + 1;
        IF v_attempt >= p_attempts THEN
            FOREACH i IN ARRAY v_todo LOOP
                v_status[i] := 'vanished';
            END LOOP;
            EXIT;
        END IF;
    END LOOP;
    -- A batch names each (client_id, idem_key) once: the caller's contract. Any
    -- registration above is undone with the transaction the error aborts. (Two IFs: a
    -- condition with a subquery goes through the executor even when `v_distinct` would
    -- decide it, a plain variable does not.)
    IF NOT v_distinct THEN
        IF (SELECT count(*) FROM (SELECT DISTINCT u.c, u.k
                                  FROM unnest(p_client_ids, p_idem_keys) u(c, k)) d) <> v_n THEN
            RAISE EXCEPTION 'a batch names each (client_id, idem_key) once' USING ERRCODE = 'LD004';
        END IF;
    END IF;
    IF cardinality(v_reg) = 0 THEN
        RETURN QUERY SELECT g::integer, v_status[g], v_account[g], v_hash[g], v_outcome[g], v_txn[g], v_balance[g]
        FROM generate_series(1, v_n) g;
        RETURN;
    END IF;
    IF v_attempt > 0 THEN
        v_reg := ARRAY(SELECT g FROM unnest(v_reg) g ORDER BY g);
    END IF;

    -- 3. Lock the accounts named in one global order: the user accounts (outside the
    -- `sys-` prefix) by account id, then the system accounts by account id; so two
    -- batches never wait on each other in a circle. Locked now: the user accounts and the
    -- system accounts up to the last one that is debited (the issuer, for grants). The
    -- rest (the sink: only credited) are locked last, in step 9, so that a batch holds
    -- the sink only from its last statement to its COMMIT. Every lock is FOR NO KEY
    -- UPDATE, the lock an UPDATE of the balance takes: unlike FOR UPDATE it does not
    -- conflict with the FOR KEY SHARE that the foreign-key checks of another batch's
    -- entries (step 6) take on the sink, so two batches never hold that share each while
    -- both wait to lock the sink (docs 13.3.2, "Row-Level Locks").
    -- The accounts the registered requests name, repeats and all (usually every request's).
    IF cardinality(v_reg) = v_n THEN
        v_names := p_froms || p_tos;
    ELSE
        v_names := ARRAY(SELECT p_froms[g] FROM unnest(v_reg) g
                         UNION ALL SELECT p_tos[g] FROM unnest(v_reg) g);
    END IF;
    v_sys := ARRAY(SELECT DISTINCT n FROM unnest(v_names) n WHERE n LIKE 'sys-%' ORDER BY n);
    v_split := (SELECT max(p_froms[g]) FROM unnest(v_reg) g WHERE p_froms[g] LIKE 'sys-%');
    SELECT coalesce(array_agg(l.account_id ORDER BY l.sys, l.account_id), '{}'),
           coalesce(array_agg(l.balance ORDER BY l.sys, l.account_id), '{}'),
           coalesce(array_agg(l.allow_negative ORDER BY l.sys, l.account_id), '{}')
    INTO v_uids, v_ubal, v_uneg
    FROM (SELECT a.account_id, a.balance, a.allow_negative, a.account_id LIKE 'sys-%' AS sys
          FROM account a
          WHERE a.account_id = ANY (v_names)
            AND (a.account_id NOT LIKE 'sys-%' OR a.account_id <= v_split)
          ORDER BY a.account_id LIKE 'sys-%', a.account_id FOR NO KEY UPDATE) l;
    v_nuser := cardinality(v_uids);
    v_sys := ARRAY(SELECT n FROM unnest(v_sys) n WHERE v_split IS NULL OR n > v_split);
    v_status0 := v_status; v_outcome0 := v_outcome; v_balance0 := v_balance;
    v_account0 := v_account; v_txn0 := v_txn;

    <<attempt>>
    LOOP
    BEGIN
        -- The system accounts only credited (v_sys): in the first attempt read without a
        -- lock, their balances left open (v_bal holds the batch's change, from 0) and the
        -- range check of each credit recorded as a bound on the balance (v_high), checked
        -- once they are locked at the end (step 9); in the exact attempt locked here.
        IF v_exact THEN
            SELECT coalesce(array_agg(l.account_id ORDER BY l.account_id), '{}'),
                   coalesce(array_agg(l.balance ORDER BY l.account_id), '{}'),
                   coalesce(array_agg(l.allow_negative ORDER BY l.account_id), '{}')
            INTO v_sids, v_sbal, v_sneg
            FROM (SELECT a.account_id, a.balance, a.allow_negative FROM account a
                  WHERE a.account_id = ANY (v_sys) ORDER BY a.account_id FOR NO KEY UPDATE) l;
        ELSE
            SELECT coalesce(array_agg(a.account_id ORDER BY a.account_id), '{}'),
                   coalesce(array_agg(0::bigint), '{}'),
                   coalesce(array_agg(a.allow_negative ORDER BY a.account_id), '{}')
            INTO v_sids, v_sbal, v_sneg
            FROM account a WHERE a.account_id = ANY (v_sys);
        END IF;
        v_ids := v_uids || v_sids; v_bal := v_ubal || v_sbal; v_neg := v_uneg || v_sneg;
        v_old := v_bal;
        v_open := NOT v_exact AND cardinality(v_sids) > 0;
        v_high := array_fill(NULL::numeric, ARRAY[cardinality(v_ids)]);

        -- 4. The debit decisions, in arrival order, on the locked balances; the OK ones
        -- collected in that order (v_ok).
        v_ok := '{}';
        FOREACH i IN ARRAY v_reg LOOP
            f := array_position(v_ids, p_froms[i]);
            t := array_position(v_ids, p_tos[i]);
            v_status[i] := 'executed';
            IF f IS NULL THEN
                v_outcome[i] := 'NO_ACCOUNT';
                v_balance[i] := 0;
                CONTINUE;
            END IF;
            IF v_neg[f] AND v_bal[f] < p_amounts[i] + (-9223372036854775807 - 1) THEN
                v_status[i] := 'out_of_range';
                v_account[i] := p_froms[i];
                v_undone := true;
                CONTINUE;
            ELSIF NOT (v_neg[f] OR v_bal[f] >= p_amounts[i]) THEN
                v_outcome[i] := 'INSUFFICIENT';
                v_balance[i] := v_bal[f];
                CONTINUE;
            END IF;
            IF t IS NULL THEN
                v_status[i] := 'no_credit';
                v_undone := true;
                CONTINUE;
            END IF;
            IF v_open AND t > v_nuser THEN
                -- Open balance b: b + change + amount <= the bigint maximum, assumed (and
                -- the change itself kept inside bigint, else decided exactly).
                IF v_bal[t] > 9223372036854775807 - p_amounts[i] THEN
                    RAISE EXCEPTION 'the batch''s credits leave the bigint range' USING ERRCODE = 'LD005';
                END IF;
                v_high[t] := least(v_high[t], 9223372036854775807::numeric - p_amounts[i] - v_bal[t]);
            ELSIF v_bal[t] > 9223372036854775807 - p_amounts[i] THEN
                v_status[i] := 'out_of_range';
                v_account[i] := p_tos[i];
                v_undone := true;
                CONTINUE;
            END IF;
            v_bal[f] := v_bal[f] - p_amounts[i];
            v_bal[t] := v_bal[t] + p_amounts[i];
            v_outcome[i] := 'OK';
            v_ok := v_ok || i;
            f := CASE WHEN p_kinds[i] = 'GRANT' THEN t ELSE f END;
            IF v_open AND f > v_nuser THEN
                -- The balance to report is an open one: decide again, exactly.
                RAISE EXCEPTION 'reported balance is a system account''s' USING ERRCODE = 'LD005';
            END IF;
            v_balance[i] := v_bal[f];
        END LOOP;

        -- 5. Each changed balance written once (the open ones in step 9).
        UPDATE account a SET balance = n.balance
        FROM unnest(v_ids, v_bal, v_old) WITH ORDINALITY n(id, balance, old, k)
        WHERE a.account_id = n.id AND n.balance <> n.old AND NOT (v_open AND n.k > v_nuser);

        -- 6. The transactions (ids drawn in arrival order; the exact attempt first reuses
        -- those the first drew, as a sequence never gives them back) and their entries
        -- (-amount first).
        IF cardinality(v_ok) > 0 THEN
            f := 0;
            FOREACH i IN ARRAY v_ok LOOP
                f := f + 1;
                IF f > cardinality(v_drawn) THEN
                    v_drawn[f] := nextval('ledger_txn_txn_id_seq');
                END IF;
                v_txn[i] := v_drawn[f];
            END LOOP;
            INSERT INTO ledger_txn (txn_id, client_id, idem_key, kind, order_id)
            SELECT v_txn[g], p_client_ids[g], p_idem_keys[g], p_kinds[g], p_order_ids[g]
            FROM unnest(v_ok) g;
            INSERT INTO ledger_entry (txn_id, account_id, amount)
            SELECT v_txn[g], e.acct, e.amt
            FROM unnest(v_ok) g CROSS JOIN LATERAL (VALUES (1, p_froms[g], -p_amounts[g]),
                                                          (2, p_tos[g], p_amounts[g])) e(pos, acct, amt)
            ORDER BY g, e.pos;
        END IF;

        -- 7. Every outcome, with the reported balance.
        UPDATE idem_request r
        SET outcome = u.o, txn_id = u.t, balance_after = u.b
        FROM unnest(p_client_ids, p_idem_keys, v_status, v_outcome, v_txn, v_balance) u(c, k, s, o, t, b)
        WHERE u.s = 'executed' AND r.client_id = u.c AND r.idem_key = u.k;

        -- 8. A request that cannot be done leaves nothing, as its own rollback would.
        IF v_undone THEN
            DELETE FROM idem_request r
            USING unnest(p_client_ids, p_idem_keys, v_status) u(c, k, s)
            WHERE u.s IN ('no_credit', 'out_of_range') AND r.client_id = u.c AND r.idem_key = u.k;
        END IF;

        -- 9. Last, the open system accounts locked (the sink is held from here to the
        -- COMMIT only): the same accounts, each balance within its bounds, or every
        -- decision is taken again exactly; then each written once.
        IF v_open THEN
            SELECT array_agg(l.account_id ORDER BY l.account_id),
                   array_agg(l.balance ORDER BY l.account_id),
                   array_agg(l.allow_negative ORDER BY l.account_id)
            INTO v_lids, v_lbal, v_lneg
            FROM (SELECT a.account_id, a.balance, a.allow_negative FROM account a
                  WHERE a.account_id = ANY (v_sys) ORDER BY a.account_id FOR NO KEY UPDATE) l;
            IF v_lids IS DISTINCT FROM v_sids OR v_lneg IS DISTINCT FROM v_sneg
               OR EXISTS (SELECT 1 FROM unnest(v_lbal, v_high[v_nuser + 1:]) b(bal, hi)
                          WHERE b.bal > b.hi) THEN
                RAISE EXCEPTION 'a system account moved out of the bounds assumed' USING ERRCODE = 'LD005';
            END IF;
            UPDATE account a SET balance = a.balance + d.change
            FROM unnest(v_sids, v_bal[v_nuser + 1:]) d(id, change)
            WHERE a.account_id = d.id AND d.change <> 0;
        END IF;
        EXIT attempt;
    EXCEPTION WHEN SQLSTATE 'LD005' THEN
        -- Undone back to the block's start (the registrations and the user accounts'
        -- locks stay): decide again with every balance locked and known.
        IF v_exact THEN
            RAISE;
        END IF;
        v_exact := true; v_undone := false;
        v_status := v_status0; v_outcome := v_outcome0; v_balance := v_balance0;
        v_account := v_account0; v_txn := v_txn0;
    END;
    END LOOP;

    RETURN QUERY SELECT g::integer, v_status[g], v_account[g], v_hash[g], v_outcome[g], v_txn[g], v_balance[g]
    FROM generate_series(1, v_n) g;
END
$fn$;
"#;

/// Creates the tables of [`SCHEMA_SQL`] with their references ([`REFERENCES_SQL`]) and the
/// repair's ([`crate::repair::SCHEMA_SQL`]) in the connected database, and the one-trip
/// and batch transfers' functions
/// ([`ONETRIP_FUNCTION_SQL`], [`BATCH_FUNCTION_SQL`]).
///
/// The statements run as one simple-protocol query string, which PostgreSQL executes as a
/// single implicit transaction: either all tables exist afterwards or none.
///
/// Errors: [`LedgerError::Db`] (e.g. SQLSTATE 42P07 if a table already exists).
pub async fn install(client: &Client) -> Result<(), LedgerError> {
    client.batch_execute(SCHEMA_SQL).await?;
    client.batch_execute(REFERENCES_SQL).await?;
    client.batch_execute(crate::repair::SCHEMA_SQL).await?;
    client.batch_execute(ONETRIP_FUNCTION_SQL).await?;
    client.batch_execute(BATCH_FUNCTION_SQL).await?;
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
