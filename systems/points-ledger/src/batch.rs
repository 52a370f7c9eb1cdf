//! The batch transfer: many requests executed in one transaction by one server-side call
//! over arrays (`ledger_transfer_batch`, [`crate::schema::BATCH_FUNCTION_SQL`]), each
//! with its own outcome, replay and fingerprint exactly as [`crate::transfer()`] gives
//! them alone.
//!
//! [`transfer_batch`] sends `BEGIN ISOLATION LEVEL READ COMMITTED`, one `SELECT * FROM
//! ledger_transfer_batch(...)` carrying every request, and `COMMIT`: three round trips and
//! one commit (one WAL flush) for the whole batch, where the statement mode pays 6–9
//! round trips and one commit per request. The batch is collected by
//! [`crate::batcher::Batcher`]; this module only runs one.
//!
//! What is the same as a request alone: the registration under `(client_id, idem_key)`,
//! the conditional debit (decided on the row locked and re-read after any wait), the
//! `ledger_txn` row with its two entries and the recorded outcome, the replay of a known
//! key (fingerprint compared here by [`crate::transfer::replay`]), and the errors of a
//! request that cannot be done (frozen, expired, credit account missing, out of range),
//! which leave nothing of that request and never fail its neighbours. What differs:
//!
//! - **Locks.** Every account the batch names is locked by one statement in account-id
//!   order before any balance changes, so two batches never deadlock; each changed
//!   balance (the sink's among them) is written once per batch.
//! - **The same key twice in one call.** The first is executed in this transaction; each
//!   later one waits for it: it runs in a following transaction on the same connection
//!   after the first's COMMIT, where it is a replay (or `KeyReused` for another payload),
//!   as it would be alone.
//! - **Hook points.** [`HookPoint::BeforeCommit`] is passed once per request, in arrival
//!   order, with the batch's transaction open; a hook's abort rolls the whole batch back
//!   and every request in it gets [`LedgerError::HookAborted`]. The after-commit point is
//!   the caller's ([`crate::transfer::after_commit`]): [`transfer_batch`] returns before
//!   it. `registered` and `entries-written` lie inside the server's statement.
//! - **A database error** (a lost connection, a deadlock with a transaction of another
//!   mode, a failed COMMIT) fails the whole batch: every request in it gets
//!   [`LedgerError::BatchFailed`], and none was acknowledged.

use std::collections::HashSet;

use futures_util::future::join3;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, Row, Statement};

use crate::error::LedgerError;
use crate::transfer::{HookContext, Hooks, TransferRequest, TransferResult, replay};
use crate::vocabulary::{HookPoint, Outcome};

/// SQLSTATE raised by the function when one call names a key twice.
pub const SQLSTATE_DUPLICATE_KEY_IN_BATCH: &str = "LD004";

/// How often the function tries to register a key whose conflicting row is not visible
/// (the bound of [`crate::transfer()`]).
const REGISTER_ATTEMPTS: i32 = crate::transfer::REGISTER_ATTEMPTS as i32;

/// The start of a batch's transaction.
const BEGIN_SQL: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// The one statement of a batch (parameters by name).
pub const BATCH_CALL_SQL: &str = "\
SELECT ord, status, account_id, request_hash, outcome, txn_id, balance_after
FROM ledger_transfer_batch(
    p_client_ids => $1, p_idem_keys => $2, p_request_hashes => $3, p_kinds => $4,
    p_froms => $5, p_tos => $6, p_amounts => $7, p_order_ids => $8, p_attempts => $9)";

/// The parameter types of [`BATCH_CALL_SQL`], in order.
pub const BATCH_CALL_TYPES: [Type; 9] = [
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT4,
];

/// The batch call prepared once on one connection (a named statement): its later calls
/// skip the parse, analysis and plan of the calling statement (about 6,000 PostgreSQL
/// instructions a debit at 12 a call, docs/batch.md, "The levers"). Only on a connection
/// of its own: behind a transaction pooler a named statement prepared on one server
/// session may be executed on another, where it does not exist, so there the call stays
/// unnamed ([`transfer_batch`]).
#[derive(Debug, Clone)]
pub struct PreparedBatchCall(Statement);

impl PreparedBatchCall {
    /// Prepares the call on `client`.
    ///
    /// Errors: [`LedgerError::Db`] (the function is not installed: SQLSTATE 42883).
    pub async fn prepare(client: &Client) -> Result<PreparedBatchCall, LedgerError> {
        Ok(PreparedBatchCall(
            client
                .prepare_typed(BATCH_CALL_SQL, &BATCH_CALL_TYPES)
                .await?,
        ))
    }

    /// The call prepared elsewhere (a pool's statement cache) from [`BATCH_CALL_SQL`] and
    /// [`BATCH_CALL_TYPES`].
    pub fn from_statement(statement: Statement) -> PreparedBatchCall {
        PreparedBatchCall(statement)
    }
}

/// One request's answer from [`transfer_batch`], before its after-commit hook.
pub type BatchAnswer = Result<TransferResult, LedgerError>;

/// Executes `requests` at most once per `(client_id, idem_key)` each, with the outcomes,
/// replays and errors each would get from [`crate::transfer()`] alone, in as few
/// transactions as the keys allow: one, unless a key appears more than once (then one
/// more per repetition, after the earlier one's COMMIT). The answers come back in the
/// order of `requests`. The connection must not be inside a transaction. Runs
/// [`HookPoint::BeforeCommit`] of `hooks` once per request in the open transaction; the
/// caller runs the after-commit point.
///
/// Never fails as a whole: a request with an amount ≤ 0 gets
/// [`LedgerError::InvalidAmount`] alone; a database error gets every request of its
/// transaction [`LedgerError::BatchFailed`] (nothing of it committed, unless the error was
/// the COMMIT's own reply lost with the connection: then the outcome is unknown and a
/// retry with the same key tells).
pub async fn transfer_batch(
    client: &mut Client,
    requests: &[TransferRequest],
    hooks: &dyn Hooks,
) -> Vec<BatchAnswer> {
    transfer_batch_prepared(client, None, requests, hooks).await
}

/// [`transfer_batch`] with the call `prepared` on this connection
/// ([`PreparedBatchCall`]), or unnamed when `None`.
pub async fn transfer_batch_prepared(
    client: &mut Client,
    prepared: Option<&PreparedBatchCall>,
    requests: &[TransferRequest],
    hooks: &dyn Hooks,
) -> Vec<BatchAnswer> {
    let mut answers: Vec<Option<BatchAnswer>> = requests.iter().map(|_| None).collect();
    let mut waiting: Vec<usize> = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        if request.amount <= 0 {
            answers[index] = Some(Err(LedgerError::InvalidAmount(request.amount)));
        } else {
            waiting.push(index);
        }
    }
    while !waiting.is_empty() {
        let (round, later) = first_of_each_key(requests, &waiting);
        let round_requests: Vec<&TransferRequest> = round.iter().map(|&i| &requests[i]).collect();
        let results = run_one(client, prepared, &round_requests, hooks).await;
        for (index, answer) in round.into_iter().zip(results) {
            answers[index] = Some(answer);
        }
        waiting = later;
    }
    answers
        .into_iter()
        .map(|answer| answer.expect("every request is answered by one round"))
        .collect()
}

/// Splits `waiting` into the first request of each key (this round) and the rest (later
/// rounds), both in arrival order.
fn first_of_each_key(requests: &[TransferRequest], waiting: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let (mut round, mut later) = (Vec::new(), Vec::new());
    for &index in waiting {
        let request = &requests[index];
        if seen.insert((request.client_id.as_str(), request.idem_key.as_str())) {
            round.push(index);
        } else {
            later.push(index);
        }
    }
    (round, later)
}

/// Every request of a failed transaction answered [`LedgerError::BatchFailed`] with
/// `error`'s SQLSTATE and message.
fn failed(requests: &[&TransferRequest], error: LedgerError) -> Vec<BatchAnswer> {
    let (code, message) = (error.sqlstate().map(str::to_owned), error.to_string());
    requests
        .iter()
        .map(|_| {
            Err(LedgerError::BatchFailed {
                code: code.clone(),
                message: message.clone(),
            })
        })
        .collect()
}

/// One transaction: BEGIN, the call, the before-commit hooks, COMMIT. Answers in the
/// order of `requests` (distinct keys). When `hooks` do nothing at before-commit
/// ([`Hooks::acts_at`]), the three are sent at once ([`run_pipelined`]).
async fn run_one(
    client: &mut Client,
    prepared: Option<&PreparedBatchCall>,
    requests: &[&TransferRequest],
    hooks: &dyn Hooks,
) -> Vec<BatchAnswer> {
    if !hooks.acts_at(HookPoint::BeforeCommit) {
        return run_pipelined(client, prepared, requests).await;
    }
    let failed = |error: LedgerError| failed(requests, error);
    let tx = match client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
        .start()
        .await
    {
        Ok(tx) => tx,
        Err(error) => return failed(error.into()),
    };
    let rows = match call(&tx, prepared, requests).await {
        Ok(rows) => rows,
        Err(error) => {
            let _ = tx.rollback().await;
            return failed(error);
        }
    };
    for request in requests {
        let context = HookContext {
            point: HookPoint::BeforeCommit,
            request,
            transaction: Some(&tx),
        };
        if hooks.at(context).await.is_err() {
            let _ = tx.rollback().await;
            return requests
                .iter()
                .map(|_| Err(LedgerError::HookAborted(HookPoint::BeforeCommit)))
                .collect();
        }
    }
    if let Err(error) = tx.commit().await {
        return failed(error.into());
    }
    requests
        .iter()
        .zip(rows)
        .map(|(request, row)| answer(request, &row))
        .collect()
}

/// One transaction in one round trip: BEGIN, the call and COMMIT are sent together
/// (tokio-postgres pipelines requests in the order their futures are first polled, its
/// docs, "Pipelining"; `join3` first polls them in argument order), and the server runs
/// them in that order. A failed call leaves the
/// transaction aborted, so the COMMIT behind it only ends it (the server answers
/// `ROLLBACK`): nothing of the batch is kept, and every request gets the call's error.
/// Answers in the order of `requests`, only after the COMMIT's reply. (A reply whose
/// row count does not match the requests, never seen, fails the batch after its COMMIT:
/// its outcome is then unknown, as after a lost reply.)
async fn run_pipelined(
    client: &Client,
    prepared: Option<&PreparedBatchCall>,
    requests: &[&TransferRequest],
) -> Vec<BatchAnswer> {
    let (begun, rows, committed) = join3(
        client.batch_execute(BEGIN_SQL),
        call(client, prepared, requests),
        client.batch_execute("COMMIT"),
    )
    .await;
    let rows = match (begun, rows, committed) {
        (Err(error), _, _) => return failed(requests, error.into()),
        (_, Err(error), _) => return failed(requests, error),
        (_, _, Err(error)) => return failed(requests, error.into()),
        (Ok(()), Ok(rows), Ok(())) => rows,
    };
    requests
        .iter()
        .zip(rows)
        .map(|(request, row)| answer(request, &row))
        .collect()
}

/// The call of `ledger_transfer_batch` with one array per field (`prepared`, else an
/// unnamed statement); its rows in the order of `requests`.
///
/// Errors: [`LedgerError::Db`].
async fn call(
    tx: &impl GenericClient,
    prepared: Option<&PreparedBatchCall>,
    requests: &[&TransferRequest],
) -> Result<Vec<Row>, LedgerError> {
    let column = |field: fn(&TransferRequest) -> String| -> Vec<String> {
        requests.iter().map(|request| field(request)).collect()
    };
    let client_ids = column(|r| r.client_id.clone());
    let idem_keys = column(|r| r.idem_key.clone());
    let hashes = column(|r| r.request_hash());
    let kinds = column(|r| r.kind.as_str().to_owned());
    let froms = column(|r| r.from.clone());
    let tos = column(|r| r.to.clone());
    let amounts: Vec<i64> = requests.iter().map(|r| r.amount).collect();
    let order_ids: Vec<Option<String>> = requests.iter().map(|r| r.order_id.clone()).collect();
    let params: [&(dyn ToSql + Sync); 9] = [
        &client_ids,
        &idem_keys,
        &hashes,
        &kinds,
        &froms,
        &tos,
        &amounts,
        &order_ids,
        &REGISTER_ATTEMPTS,
    ];
    let mut rows = match prepared {
        Some(PreparedBatchCall(statement)) => tx.query(statement, &params).await?,
        None => {
            let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                .iter()
                .zip(BATCH_CALL_TYPES.iter())
                .map(|(param, ty)| (*param, ty.clone()))
                .collect();
            tx.query_typed(BATCH_CALL_SQL, &typed).await?
        }
    };
    rows.sort_by_key(|row| row.get::<_, i32>("ord"));
    if rows.len() != requests.len() {
        return Err(LedgerError::BatchFailed {
            code: None,
            message: format!(
                "ledger_transfer_batch returned {} rows for {} requests",
                rows.len(),
                requests.len()
            ),
        });
    }
    Ok(rows)
}

/// One request's answer from its row, as [`crate::transfer_onetrip`] reads its one row.
fn answer(request: &TransferRequest, row: &Row) -> BatchAnswer {
    let status: &str = row.try_get("status")?;
    match status {
        "executed" => {
            let outcome: &str = row.try_get("outcome")?;
            let Ok(outcome) = outcome.parse::<Outcome>() else {
                return Err(LedgerError::CommittedPending {
                    client_id: request.client_id.clone(),
                    idem_key: request.idem_key.clone(),
                });
            };
            let balance: Option<i64> = row.try_get("balance_after")?;
            Ok(TransferResult {
                outcome,
                txn_id: row.try_get("txn_id")?,
                balance: balance.unwrap_or(0),
                replayed: false,
            })
        }
        "stored" => replay(request, &request.request_hash(), row),
        "orphan" => Err(LedgerError::KeyExpired {
            txn_id: row.try_get("txn_id")?,
            tombstone: false,
        }),
        "frozen" => Err(LedgerError::AccountFrozen(row.try_get("account_id")?)),
        "no_credit" => Err(LedgerError::CreditAccountMissing(request.to.clone())),
        "out_of_range" => Err(LedgerError::OutOfRange {
            account: row.try_get("account_id")?,
            amount: request.amount,
        }),
        _ => Err(LedgerError::RegistrationVanished {
            client_id: request.client_id.clone(),
            idem_key: request.idem_key.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_names_every_parameter_of_the_function() {
        for name in [
            "p_client_ids",
            "p_idem_keys",
            "p_request_hashes",
            "p_kinds",
            "p_froms",
            "p_tos",
            "p_amounts",
            "p_order_ids",
            "p_attempts",
        ] {
            assert!(crate::schema::BATCH_FUNCTION_SQL.contains(name), "{name}");
            assert!(BATCH_CALL_SQL.contains(&format!("{name} =>")), "{name}");
        }
    }

    #[test]
    fn a_repeated_key_waits_for_the_next_round() {
        let requests = [
            TransferRequest::debit("c", "k1", "acct-0001", 5),
            TransferRequest::debit("c", "k2", "acct-0001", 5),
            TransferRequest::debit("c", "k1", "acct-0001", 5),
            TransferRequest::debit("d", "k1", "acct-0001", 5),
            TransferRequest::debit("c", "k1", "acct-0001", 6),
        ];
        let (round, later) = first_of_each_key(&requests, &[0, 1, 2, 3, 4]);
        assert_eq!(round, vec![0, 1, 3]);
        assert_eq!(later, vec![2, 4]);
        let (round, later) = first_of_each_key(&requests, &later);
        assert_eq!((round, later), (vec![2], vec![4]));
    }
}
