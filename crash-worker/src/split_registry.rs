//! The worker's split-registry mode (`--registry-database-url URL`, case L22): the naive
//! design that keeps the idempotency keys in ANOTHER database of the same cluster than
//! the ledger, so the key and the debit are two transactions that cannot commit together.
//!
//! One debit, on two connections, both READ COMMITTED:
//!
//! 1. registry: `INSERT` the key as `PENDING` into `idem_registry` (created if
//!    missing); a key already there is replayed from its stored outcome and balance
//!    (or refused when the fingerprint differs), and nothing else happens.
//! 2. ledger: the conditional debit of `account`, the credit of `sys-redeem`, the
//!    `ledger_txn` row and its two entries. The ledger does not know the registry's key,
//!    so the transaction is recorded under its own reference `<key>@<xid>`
//!    (`txid_current()`), unique per execution; the ledger's `idem_request` is not used.
//! 3. registry: the key's outcome `OK` with the balance after.
//! 4. COMMIT the one named by `--commit-first` (`key` or `debit`), then, with
//!    `--stop-between-commits`, print `PAUSED_IN_TX backend_pid=<ledger backend>` and
//!    wait to be killed (bounded by `--pause-limit-ms`; then the second transaction is
//!    rolled back and the exit status is 3), then COMMIT the other.
//!
//! A refused debit (insufficient balance) records `INSUFFICIENT` in the registry and
//! commits nothing in the ledger. On completion the worker prints `RESULT outcome=…
//! replayed=… balance=…[ txn_id=…]` like the default mode.

use tokio_postgres::types::Type;
use tokio_postgres::{IsolationLevel, Row, Transaction};

use crate::{EXIT_PAUSE_LIMIT, Stop, connect};

/// DDL of the registry's table `idem_registry` in the registry database, run
/// (idempotently) on every start.
const REGISTRY_SCHEMA_SQL: &str = "\
CREATE TABLE IF NOT EXISTS idem_registry (
    client_id     text   NOT NULL,
    idem_key      text   NOT NULL,
    request_hash  text   NOT NULL,
    outcome       text   NOT NULL CHECK (outcome IN ('PENDING', 'OK', 'INSUFFICIENT')),
    balance_after bigint NULL,
    PRIMARY KEY (client_id, idem_key)
)";

const REGISTER_SQL: &str = "\
INSERT INTO idem_registry (client_id, idem_key, request_hash, outcome)
VALUES ($1, $2, $3, 'PENDING')
ON CONFLICT (client_id, idem_key) DO NOTHING
RETURNING 1";

const READ_SQL: &str = "\
SELECT request_hash, outcome, balance_after FROM idem_registry
WHERE client_id = $1 AND idem_key = $2";

const RECORD_SQL: &str = "\
UPDATE idem_registry SET outcome = $3, balance_after = $4
WHERE client_id = $1 AND idem_key = $2";

const DEBIT_SQL: &str = "\
UPDATE account SET balance = balance - $2
WHERE account_id = $1 AND balance >= $2
RETURNING balance";

const BALANCE_SQL: &str = "SELECT balance FROM account WHERE account_id = $1";

const CREDIT_AND_RECORD_SQL: &str = "\
WITH credited AS (
    UPDATE account SET balance = balance + $3 WHERE account_id = 'sys-redeem' RETURNING 1
), txn AS (
    INSERT INTO ledger_txn (client_id, idem_key, kind)
    SELECT $1, $2 || '@' || txid_current()::text, 'DEBIT' FROM credited
    RETURNING txn_id
), entries AS (
    INSERT INTO ledger_entry (txn_id, account_id, amount)
    SELECT txn.txn_id, e.account_id, e.amount
    FROM txn CROSS JOIN (VALUES (1, $4, -$3::bigint), (2, 'sys-redeem', $3::bigint)) AS e(pos, account_id, amount)
    ORDER BY e.pos
    RETURNING 1
)
SELECT txn.txn_id, (SELECT count(*) FROM entries) AS entries FROM txn";

/// Which of the two transactions commits first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CommitFirst {
    /// The registry's key first, then the ledger's debit.
    Key,
    /// The ledger's debit first, then the registry's key.
    Debit,
}

/// What the split-registry run is to do (from the command line).
pub(crate) struct SplitArgs<'a> {
    pub ledger_url: &'a str,
    pub registry_url: &'a str,
    pub client_id: &'a str,
    pub key: &'a str,
    pub account: &'a str,
    pub amount: i64,
    pub commit_first: CommitFirst,
    pub stop_between_commits: bool,
    pub pause_limit_ms: u64,
}

/// Runs the debit as the module describes; returns the exit status.
///
/// Errors: connections or statements failed, or the key was used for another request.
pub(crate) async fn run(args: &SplitArgs<'_>) -> anyhow::Result<i32> {
    anyhow::ensure!(args.amount > 0, "--amount must be positive");
    let (mut ledger, ledger_pid) = connect(args.ledger_url).await?;
    let (mut registry, _) = connect(args.registry_url).await?;
    registry.batch_execute(REGISTRY_SCHEMA_SQL).await?;
    let request =
        points_ledger::TransferRequest::debit(args.client_id, args.key, args.account, args.amount);
    let request_hash = request.request_hash();

    let keys = registry
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    if let Some(stored) = register_key(&keys, args, &request_hash).await? {
        keys.rollback().await?;
        return replay(&stored, &request_hash);
    }

    let debits = ledger
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    let Some(balance) = debit(&debits, args).await? else {
        return refuse(debits, keys, args).await;
    };
    let txn_id = credit_and_record(&debits, args).await?;
    record(&keys, args, "OK", balance).await?;
    if !commit_in_order(keys, debits, args, ledger_pid).await? {
        return Ok(EXIT_PAUSE_LIMIT);
    }
    println!("RESULT outcome=OK replayed=false balance={balance} txn_id={txn_id}");
    Ok(0)
}

/// Step 1 inside the registry's transaction `keys`: registers the key as `PENDING`;
/// `None` when it was new, else the key's stored row (`request_hash`, `outcome`,
/// `balance_after`).
///
/// Errors: a statement failed.
async fn register_key(
    keys: &Transaction<'_>,
    args: &SplitArgs<'_>,
    request_hash: &str,
) -> anyhow::Result<Option<Row>> {
    let registered = keys
        .query_typed_opt(
            REGISTER_SQL,
            &[
                (&args.client_id, Type::TEXT),
                (&args.key, Type::TEXT),
                (&request_hash, Type::TEXT),
            ],
        )
        .await?
        .is_some();
    if registered {
        return Ok(None);
    }
    let row = keys
        .query_typed_one(
            READ_SQL,
            &[(&args.client_id, Type::TEXT), (&args.key, Type::TEXT)],
        )
        .await?;
    Ok(Some(row))
}

/// A known key: prints the `RESULT` line replayed from its `stored` row; exit status 0.
///
/// Errors: the stored fingerprint is not `request_hash` (KEY_REUSED).
fn replay(stored: &Row, request_hash: &str) -> anyhow::Result<i32> {
    let stored_hash: String = stored.get(0);
    anyhow::ensure!(
        stored_hash == request_hash,
        "the key was first used for another request (KEY_REUSED)"
    );
    let outcome: String = stored.get(1);
    let balance: Option<i64> = stored.get(2);
    println!(
        "RESULT outcome={outcome} replayed=true balance={}",
        balance.unwrap_or(0)
    );
    Ok(0)
}

/// Step 2 inside the ledger's transaction `debits`: the conditional debit of the account;
/// its balance after (points), or `None` when refused.
///
/// Errors: a statement failed.
async fn debit(debits: &Transaction<'_>, args: &SplitArgs<'_>) -> anyhow::Result<Option<i64>> {
    let debited = debits
        .query_typed_opt(
            DEBIT_SQL,
            &[(&args.account, Type::TEXT), (&args.amount, Type::INT8)],
        )
        .await?;
    Ok(debited.map(|row| row.get(0)))
}

/// A refused debit: reads the account's balance, rolls the ledger's transaction back,
/// records `INSUFFICIENT` in the registry and commits it, prints the `RESULT` line; exit
/// status 0.
///
/// Errors: a statement failed.
async fn refuse(
    debits: Transaction<'_>,
    keys: Transaction<'_>,
    args: &SplitArgs<'_>,
) -> anyhow::Result<i32> {
    let balance: Option<i64> = debits
        .query_typed_opt(BALANCE_SQL, &[(&args.account, Type::TEXT)])
        .await?
        .map(|row| row.get(0));
    debits.rollback().await?;
    record(&keys, args, "INSUFFICIENT", balance.unwrap_or(0)).await?;
    keys.commit().await?;
    println!(
        "RESULT outcome=INSUFFICIENT replayed=false balance={}",
        balance.unwrap_or(0)
    );
    Ok(0)
}

/// The rest of step 2 inside `debits`: the credit of `sys-redeem`, the `ledger_txn` row
/// under `<key>@<xid>` and its two entries; the txn id.
///
/// Errors: a statement failed.
async fn credit_and_record(debits: &Transaction<'_>, args: &SplitArgs<'_>) -> anyhow::Result<i64> {
    let recorded = debits
        .query_typed_one(
            CREDIT_AND_RECORD_SQL,
            &[
                (&args.client_id, Type::TEXT),
                (&args.key, Type::TEXT),
                (&args.amount, Type::INT8),
                (&args.account, Type::TEXT),
            ],
        )
        .await?;
    Ok(recorded.get(0))
}

/// Step 4: commits the transaction named by `--commit-first`, then (with
/// `--stop-between-commits`) pauses for the kill, then commits the other. `false` when
/// the pause reached its limit: the second transaction was rolled back.
///
/// Errors: a COMMIT or ROLLBACK failed.
async fn commit_in_order(
    keys: Transaction<'_>,
    debits: Transaction<'_>,
    args: &SplitArgs<'_>,
    ledger_pid: i32,
) -> anyhow::Result<bool> {
    let (first, second) = match args.commit_first {
        CommitFirst::Key => (keys, debits),
        CommitFirst::Debit => (debits, keys),
    };
    first.commit().await?;
    if args.stop_between_commits {
        let stop = Stop::new(ledger_pid, args.pause_limit_ms);
        if let Err(reason) = stop.pause().await {
            second.rollback().await?;
            eprintln!(
                "crash-worker: {reason} between the commits; the {} was not committed",
                match args.commit_first {
                    CommitFirst::Key => "debit",
                    CommitFirst::Debit => "key",
                }
            );
            return Ok(false);
        }
    }
    second.commit().await?;
    Ok(true)
}

/// Step 3 (or the refusal) inside the registry's transaction `keys`: the key's outcome
/// and the balance after (points).
///
/// Errors: a statement failed.
async fn record(
    keys: &Transaction<'_>,
    args: &SplitArgs<'_>,
    outcome: &str,
    balance: i64,
) -> anyhow::Result<()> {
    keys.execute_typed(
        RECORD_SQL,
        &[
            (&args.client_id, Type::TEXT),
            (&args.key, Type::TEXT),
            (&outcome, Type::TEXT),
            (&balance, Type::INT8),
        ],
    )
    .await?;
    Ok(())
}
