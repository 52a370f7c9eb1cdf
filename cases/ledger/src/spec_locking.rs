//! Locking designs raced inside one step (L13, L14): N racers, each on a connection of
//! its own opened beforehand (`case_kit::race`), released together by one barrier; a
//! design whose race must be forced meets the others at that barrier *inside* its
//! transaction (after its snapshot, or between its two row locks), so the conflict is
//! certain, not hoped for. A file may hold one `race call:`; these steps let it hold
//! several races, one after another, each printing its counts.
//!
//! - `debit-race racers=N strategy=S account=ID amount=N key=PREFIX [client=C]
//!   [run=together|one-by-one]`: N debits of `amount` from ACCOUNT (keys `PREFIX-NN`)
//!   by one design (L13). `conditional-update`: the ledger's debit in the case's
//!   transfer mode (`UPDATE … WHERE balance >= amount`, READ COMMITTED), after the
//!   barrier. `for-update`: after the barrier, READ COMMITTED `SELECT balance … FOR
//!   UPDATE`, the check in the application, `UPDATE`. `serializable-retry`: SERIALIZABLE
//!   read, check, update; on 40001 rolled back and tried again, at most
//!   [`SERIALIZABLE_MAX_ATTEMPTS`] attempts. `repeatable-read`: REPEATABLE READ read,
//!   check, update; 40001 goes to the caller. In the two snapshot designs each racer's
//!   first SELECT (which takes the snapshot, PostgreSQL docs 13.2.2) runs before the
//!   barrier, so every snapshot predates the first commit; a retry meets no barrier.
//!   A debit that commits records its transfer the ledger's way
//!   (`points_ledger::record_transfer`), so the database still reconciles. Prints the
//!   counts: `ok=14 insufficient=18 serialization_failures=0 other_errors=0`, and for
//!   `serializable-retry` whether any debit retried and how many retries there were
//!   (`retried=true retries=N`, a count that varies from run to run).
//! - `transfers racers=N count=N between=A,B max-amount=N key=PREFIX [client=C]`:
//!   `count` transfers through `points_ledger::transfer_between` (rows locked in sorted
//!   order), spread over the racers (racer r runs transfers r, r+N, …); transfer i goes
//!   A→B when i is even, B→A when odd, of `1 + i % max-amount` points, key
//!   `PREFIX-NNN` (L14): `transfers=200 ok=200 deadlocks=0 errors=0`.
//! - `request-order-transfers pairs=A:B,… amount=N key=PREFIX retry=on-deadlock|no
//!   [client=C] [run=together|one-by-one]`: two transfers per pair, A→B and B→A (keys
//!   `PREFIX-0`, `PREFIX-1`, …), the naive design that locks `from` then `to` (request
//!   order): each racer holds its first row lock when all meet at the barrier, then asks
//!   for the second, so every pair closes a cycle and PostgreSQL aborts one of its two
//!   transactions with 40P01 (docs 13.3.4). With `retry=on-deadlock` the victim waits
//!   until the row it was refused is free (locks and releases it in a transaction of its
//!   own, holding nothing else, so it cannot close a cycle) and tries again under the
//!   same key, at most [`DEADLOCK_MAX_ATTEMPTS`] attempts. Prints `transfers=8 ok=4
//!   deadlocks=4 retried=0 most_attempts=1 other_errors=0` (`deadlocks`: transfers
//!   refused with 40P01 at some attempt; `retried`: attempts after the first).
//!
//! `run=one-by-one`: the same debits or transfers one after another on the session's
//! connection, none concurrent, so no conflict can happen (the negative controls' test).

use std::collections::BTreeMap;
use std::sync::Arc;

use case_kit::spec::Call;
use points_ledger::{
    LedgerError, NoHooks, Outcome, TransferMode, TransferRequest, between, debit_in,
    record_transfer, transfer_between,
};
use tokio::sync::Barrier;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel};

/// Most attempts of one `serializable-retry` debit. A debit fails only when another one
/// committed a change to the row after its snapshot, and at most 14 of L13's can commit
/// one, so 15 attempts always suffice there; the bound leaves room.
pub const SERIALIZABLE_MAX_ATTEMPTS: u32 = 32;

/// Most attempts of one request-order transfer with `retry=on-deadlock` (a transfer is
/// the victim of its pair's one cycle at most once: its retry meets no barrier).
pub const DEADLOCK_MAX_ATTEMPTS: u32 = 3;

/// One design of the debit (`debit-race strategy=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    ConditionalUpdate,
    ForUpdate,
    SerializableRetry,
    RepeatableRead,
}

impl Strategy {
    fn named(name: &str) -> Result<Strategy, String> {
        Ok(match name {
            "conditional-update" => Strategy::ConditionalUpdate,
            "for-update" => Strategy::ForUpdate,
            "serializable-retry" => Strategy::SerializableRetry,
            "repeatable-read" => Strategy::RepeatableRead,
            other => return Err(format!("no strategy {other:?}")),
        })
    }
}

/// How one debit or transfer ended.
#[derive(Debug, Clone, Default)]
struct Ended {
    /// The business outcome; `None` when an error reached the caller.
    outcome: Option<Outcome>,
    /// The SQLSTATE of the error that reached the caller (empty when it had none).
    error: Option<String>,
    /// Attempts made (1 without a retry).
    attempts: u32,
    /// Whether an attempt was aborted with 40P01.
    deadlocked: bool,
}

impl Ended {
    fn of(result: Result<Outcome, LedgerError>, attempts: u32) -> Ended {
        match result {
            Ok(outcome) => Ended {
                outcome: Some(outcome),
                attempts,
                ..Ended::default()
            },
            Err(error) => Ended {
                error: Some(error.sqlstate().unwrap_or_default().to_string()),
                attempts,
                ..Ended::default()
            },
        }
    }

    fn failed_with(&self, code: &SqlState) -> bool {
        self.error.as_deref() == Some(code.code())
    }
}

/// The transfers of `transfers`: `count` of them over `racers` racers.
#[derive(Debug, Clone)]
struct Sorted {
    racers: usize,
    count: usize,
    between: (String, String),
    max_amount: i64,
    client: String,
    key: String,
}

impl Sorted {
    /// Transfer `index`: even ones A→B, odd ones B→A, amounts `1 + index % max_amount`.
    fn request(&self, index: usize) -> TransferRequest {
        let (a, b) = &self.between;
        let amount = 1 + (index as i64 % self.max_amount);
        let (from, to) = if index.is_multiple_of(2) {
            (a, b)
        } else {
            (b, a)
        };
        between(
            &self.client,
            format!("{}-{index:03}", self.key),
            from,
            to,
            amount,
        )
    }
}

/// What each racer does: one debit, a share of the sorted transfers, or one
/// request-order transfer.
#[derive(Debug, Clone)]
enum Job {
    Debit {
        mode: TransferMode,
        strategy: Strategy,
        request: TransferRequest,
    },
    Sorted(Sorted),
    RequestOrder {
        pairs: Vec<(String, String)>,
        amount: i64,
        client: String,
        key: String,
        max_attempts: u32,
    },
}

impl Job {
    /// Racer `index`'s part, on `client`, meeting the others at `barrier`.
    async fn run(&self, index: usize, client: &mut Client, barrier: &Barrier) -> Vec<Ended> {
        match self {
            Job::Debit {
                mode,
                strategy,
                request,
            } => {
                let mut request = request.clone();
                request.idem_key = format!("{}-{index:02}", request.idem_key);
                vec![debit_by(*mode, *strategy, client, barrier, &request).await]
            }
            Job::Sorted(sorted) => {
                barrier.wait().await;
                let mut ended = Vec::new();
                for transfer in (index..sorted.count).step_by(sorted.racers) {
                    let request = sorted.request(transfer);
                    let result = transfer_between(client, &request, &NoHooks).await;
                    ended.push(Ended::of(result.map(|r| r.outcome), 1));
                }
                ended
            }
            Job::RequestOrder {
                pairs,
                amount,
                client: client_id,
                key,
                max_attempts,
            } => {
                let (a, b) = &pairs[index / 2];
                let (from, to) = if index.is_multiple_of(2) {
                    (a, b)
                } else {
                    (b, a)
                };
                let request = between(client_id, format!("{key}-{index}"), from, to, *amount);
                vec![with_retry(client, &request, barrier, *max_attempts).await]
            }
        }
    }
}

/// Runs `job` for `racers` racers, each on a connection of its own to `url`, released
/// together; or, when `together` is false, one after another on `client`, each with a
/// barrier that waits for no one. Returns how each debit or transfer ended, in racer
/// order.
///
/// Errors: a racer could not connect.
async fn run_all(
    url: &str,
    client: &mut Client,
    racers: usize,
    together: bool,
    job: Job,
) -> Result<Vec<Ended>, String> {
    if !together {
        let alone = Barrier::new(1);
        let mut ended = Vec::new();
        for index in 0..racers {
            ended.extend(job.run(index, client, &alone).await);
        }
        return Ok(ended);
    }
    let config: tokio_postgres::Config = url.parse().map_err(|e| format!("{e}"))?;
    let job = Arc::new(job);
    let ended = case_kit::race(config, racers, move |mut racer| {
        let job = job.clone();
        async move {
            job.run(racer.index, &mut racer.client, &racer.barrier)
                .await
        }
    })
    .await
    .map_err(|e| format!("{e:#}"))?;
    Ok(ended.into_iter().flatten().collect())
}

fn number(call: &Call, name: &str) -> Result<i64, String> {
    call.arg(name)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("needs {name}=N"))
}

fn word(call: &Call, name: &str) -> Result<String, String> {
    call.arg(name)
        .map(str::to_string)
        .ok_or_else(|| format!("needs {name}=X"))
}

/// Two accounts written `A,B` (`between=`) or `A:B` (each of `pairs=`).
fn two(text: &str, separator: char) -> Result<(String, String), String> {
    match text.split_once(separator) {
        Some((a, b)) if !a.is_empty() && !b.is_empty() && a != b => {
            Ok((a.to_string(), b.to_string()))
        }
        _ => Err(format!("{text:?}: two accounts, A{separator}B")),
    }
}

/// How many connections of its own a call of this module opens (its racers).
pub fn connections(call: &Call) -> u32 {
    let together = call.arg("run") != Some("one-by-one");
    match call.op.as_str() {
        "debit-race" if together => number(call, "racers").unwrap_or(0) as u32,
        "transfers" => number(call, "racers").unwrap_or(0) as u32,
        "request-order-transfers" if together => {
            2 * call.arg("pairs").map_or(0, |p| p.split(',').count()) as u32
        }
        _ => 0,
    }
}

/// What a call of this module's verbs cannot say in its declaration: `between=` and
/// `pairs=` name two different accounts each.
///
/// Errors: as [`two`].
pub fn check(call: &Call) -> Result<(), String> {
    if let Some(text) = call.arg("between") {
        two(text, ',')?;
    }
    if let Some(pairs) = call.arg("pairs") {
        for pair in pairs.split(',') {
            two(pair, ':')?;
        }
    }
    Ok(())
}

/// Runs a call of this module (see the module documentation) on the case's database at
/// `url`, `client` being the session's connection.
///
/// Errors: the arguments; a racer could not connect.
pub async fn run(
    mode: TransferMode,
    url: &str,
    client: &mut Client,
    call: &Call,
) -> Result<String, String> {
    let together = call.arg("run") != Some("one-by-one");
    let client_id = call
        .arg("client")
        .unwrap_or(super::spec_workers::DEFAULT_CLIENT)
        .to_string();
    match call.op.as_str() {
        "debit-race" => {
            let strategy = Strategy::named(&word(call, "strategy")?)?;
            let request = TransferRequest::debit(
                client_id,
                word(call, "key")?,
                word(call, "account")?,
                number(call, "amount")?,
            );
            let job = Job::Debit {
                mode,
                strategy,
                request,
            };
            let racers = number(call, "racers")? as usize;
            let ended = run_all(url, client, racers, together, job).await?;
            Ok(debit_counts(&ended, strategy))
        }
        "transfers" => {
            let racers = number(call, "racers")? as usize;
            let job = Job::Sorted(Sorted {
                racers,
                count: number(call, "count")? as usize,
                between: two(&word(call, "between")?, ',')?,
                max_amount: number(call, "max-amount")?,
                client: client_id,
                key: word(call, "key")?,
            });
            let ended = run_all(url, client, racers, true, job).await?;
            Ok(transfer_counts(&ended))
        }
        "request-order-transfers" => {
            let pairs: Vec<(String, String)> = word(call, "pairs")?
                .split(',')
                .map(|pair| two(pair, ':'))
                .collect::<Result<_, _>>()?;
            let racers = 2 * pairs.len();
            let job = Job::RequestOrder {
                pairs,
                amount: number(call, "amount")?,
                client: client_id,
                key: word(call, "key")?,
                max_attempts: match call.arg("retry") {
                    Some("on-deadlock") => DEADLOCK_MAX_ATTEMPTS,
                    _ => 1,
                },
            };
            let ended = run_all(url, client, racers, together, job).await?;
            Ok(request_order_counts(&ended))
        }
        other => Err(format!("no locking operation {other:?}")),
    }
}

/// `ok=14 insufficient=18 [other outcomes] serialization_failures=0 other_errors=0`, and
/// for `serializable-retry` ` retried=true retries=N`.
fn debit_counts(ended: &[Ended], strategy: Strategy) -> String {
    let mut outcomes = BTreeMap::from([("ok".to_string(), 0), ("insufficient".to_string(), 0)]);
    for outcome in ended.iter().filter_map(|e| e.outcome) {
        *outcomes
            .entry(outcome.as_str().to_ascii_lowercase())
            .or_default() += 1;
    }
    let serialization = SqlState::T_R_SERIALIZATION_FAILURE;
    let failures = ended
        .iter()
        .filter(|e| e.failed_with(&serialization))
        .count();
    let errors = ended.iter().filter(|e| e.error.is_some()).count() - failures;
    let ok = outcomes.remove("ok").unwrap_or(0);
    let mut text = format!("ok={ok}");
    for (kind, n) in outcomes {
        text.push_str(&format!(" {kind}={n}"));
    }
    text.push_str(&format!(
        " serialization_failures={failures} other_errors={errors}"
    ));
    if strategy == Strategy::SerializableRetry {
        let retries: u32 = ended.iter().map(|e| e.attempts.saturating_sub(1)).sum();
        text.push_str(&format!(" retried={} retries={retries}", retries >= 1));
    }
    text
}

/// `transfers=200 ok=200 deadlocks=0 errors=0`.
fn transfer_counts(ended: &[Ended]) -> String {
    let ok = ended
        .iter()
        .filter(|e| e.outcome == Some(Outcome::Ok))
        .count();
    let deadlocks = ended
        .iter()
        .filter(|e| e.failed_with(&SqlState::T_R_DEADLOCK_DETECTED))
        .count();
    let errors = ended.iter().filter(|e| e.error.is_some()).count();
    format!(
        "transfers={} ok={ok} deadlocks={deadlocks} errors={errors}",
        ended.len()
    )
}

/// `transfers=8 ok=4 deadlocks=4 retried=0 most_attempts=1 other_errors=0`.
fn request_order_counts(ended: &[Ended]) -> String {
    let ok = ended
        .iter()
        .filter(|e| e.outcome == Some(Outcome::Ok))
        .count();
    let deadlocks = ended.iter().filter(|e| e.deadlocked).count();
    let retried: u32 = ended.iter().map(|e| e.attempts.saturating_sub(1)).sum();
    let most = ended.iter().map(|e| e.attempts).max().unwrap_or(0);
    let deadlock = SqlState::T_R_DEADLOCK_DETECTED;
    let other = ended
        .iter()
        .filter(|e| e.error.is_some() && !e.failed_with(&deadlock))
        .count();
    format!(
        "transfers={} ok={ok} deadlocks={deadlocks} retried={retried} most_attempts={most} other_errors={other}",
        ended.len()
    )
}

/// One racer's debit of `request` by `strategy`; meets the others at `barrier` (after
/// taking its snapshot where the strategy has one).
async fn debit_by(
    mode: TransferMode,
    strategy: Strategy,
    client: &mut Client,
    barrier: &Barrier,
    request: &TransferRequest,
) -> Ended {
    match strategy {
        Strategy::ConditionalUpdate => {
            barrier.wait().await;
            let (client_id, key) = (&request.client_id, &request.idem_key);
            let result = debit_in(mode, client, client_id, key, &request.from, request.amount);
            Ended::of(result.await.map(|r| r.outcome), 1)
        }
        Strategy::ForUpdate => {
            barrier.wait().await;
            let isolation = IsolationLevel::ReadCommitted;
            Ended::of(
                read_check_update(client, request, isolation, true, None).await,
                1,
            )
        }
        Strategy::RepeatableRead => {
            let isolation = IsolationLevel::RepeatableRead;
            let result = read_check_update(client, request, isolation, false, Some(barrier));
            Ended::of(result.await, 1)
        }
        Strategy::SerializableRetry => {
            let mut attempts = 0;
            loop {
                attempts += 1;
                // Only the first attempt meets the others: every first snapshot predates
                // every commit, so conflicts are certain; a retry runs when it can.
                let meet = (attempts == 1).then_some(barrier);
                let isolation = IsolationLevel::Serializable;
                let result = read_check_update(client, request, isolation, false, meet).await;
                let retry = matches!(&result, Err(error)
                    if error.sqlstate() == Some(SqlState::T_R_SERIALIZATION_FAILURE.code()));
                if !retry || attempts >= SERIALIZABLE_MAX_ATTEMPTS {
                    return Ended::of(result, attempts);
                }
            }
        }
    }
}

/// One transaction at `isolation`: `SELECT balance` (`FOR UPDATE` when `lock`), meet at
/// `barrier` if given, check `balance >= amount` in the application, then
/// `UPDATE … SET balance = balance - amount` and record the transfer the ledger's way
/// (`record_transfer`) before COMMIT. Not enough → INSUFFICIENT, rolled back (nothing
/// recorded: no key is reused).
async fn read_check_update(
    client: &mut Client,
    req: &TransferRequest,
    isolation: IsolationLevel,
    lock: bool,
    barrier: Option<&Barrier>,
) -> Result<Outcome, LedgerError> {
    let started = client
        .build_transaction()
        .isolation_level(isolation)
        .start()
        .await;
    let tx = match started {
        Ok(tx) => tx,
        Err(error) => {
            // Meet the others anyway: none may wait for a participant that never comes.
            if let Some(barrier) = barrier {
                barrier.wait().await;
            }
            return Err(error.into());
        }
    };
    let read_sql = if lock {
        "SELECT balance FROM account WHERE account_id = $1 FOR UPDATE"
    } else {
        "SELECT balance FROM account WHERE account_id = $1"
    };
    // The first statement takes the transaction's snapshot under REPEATABLE READ and
    // SERIALIZABLE (docs 13.2.2): before the barrier, so before any other debit commits.
    let read = tx.query_one(read_sql, &[&req.from]).await;
    if let Some(barrier) = barrier {
        barrier.wait().await;
    }
    let balance: i64 = read?.get(0);
    if balance < req.amount {
        tx.rollback().await?;
        return Ok(Outcome::Insufficient);
    }
    let after: i64 = tx
        .query_one(
            "UPDATE account SET balance = balance - $2 WHERE account_id = $1 RETURNING balance",
            &[&req.from, &req.amount],
        )
        .await?
        .get(0);
    record_transfer(&tx, req, after).await?;
    tx.commit().await?;
    Ok(Outcome::Ok)
}

/// A request-order transfer with up to `max_attempts` attempts, retrying only on 40P01
/// under the same key; only the first attempt meets the others at `barrier`.
async fn with_retry(
    client: &mut Client,
    req: &TransferRequest,
    barrier: &Barrier,
    max_attempts: u32,
) -> Ended {
    let mut end = Ended::default();
    loop {
        end.attempts += 1;
        let meet = (end.attempts == 1).then_some(barrier);
        match request_order_transfer(client, req, meet).await {
            Ok(outcome) => {
                end.outcome = Some(outcome);
                return end;
            }
            Err(error) if error.sqlstate() == Some(SqlState::T_R_DEADLOCK_DETECTED.code()) => {
                end.deadlocked = true;
                if end.attempts >= max_attempts {
                    end.error = Some(SqlState::T_R_DEADLOCK_DETECTED.code().to_string());
                    return end;
                }
                // Back off until the winner is done: lock and release the row this
                // transfer was refused, in a transaction of its own (it holds nothing
                // now, so this cannot close a cycle). A timed backoff would only make a
                // second deadlock unlikely; this makes it impossible here.
                if let Err(error) = wait_for_row(client, &req.to).await {
                    end.error = Some(error.code().map(|c| c.code()).unwrap_or("").into());
                    return end;
                }
            }
            Err(error) => {
                end.error = Some(error.sqlstate().unwrap_or_default().to_string());
                return end;
            }
        }
    }
}

/// An account's row locked as an UPDATE of it would lock it (`$1`: the account id).
const LOCK_ROW_SQL: &str = "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE";

/// Locks and releases `account`'s row: returns once no other transaction holds it.
async fn wait_for_row(client: &mut Client, account: &str) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.query_one(LOCK_ROW_SQL, &[&account]).await?;
    tx.commit().await
}

/// The naive transfer: one READ COMMITTED transaction that locks `from`, meets the
/// others at `barrier` (if given) while holding that lock, then locks `to` (request
/// order: opposite transfers take the same two locks in opposite orders), debits `from`
/// conditionally and records the transfer the ledger's way (`record_transfer`), so a
/// committed one leaves the ledger whole. A deadlock victim rolls back entirely, key
/// registration included, so its retry with the same key runs afresh.
async fn request_order_transfer(
    client: &mut Client,
    req: &TransferRequest,
    barrier: Option<&Barrier>,
) -> Result<Outcome, LedgerError> {
    let started = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await;
    let first = match &started {
        Ok(tx) => tx.query_one(LOCK_ROW_SQL, &[&req.from]).await.map(|_| ()),
        Err(_) => Ok(()),
    };
    if let Some(barrier) = barrier {
        barrier.wait().await;
    }
    let tx = started?;
    first?;
    tx.query_one(LOCK_ROW_SQL, &[&req.to]).await?;
    let debited = tx
        .query_opt(
            "UPDATE account SET balance = balance - $2 \
             WHERE account_id = $1 AND balance >= $2 RETURNING balance",
            &[&req.from, &req.amount],
        )
        .await?;
    let Some(debited) = debited else {
        tx.rollback().await?;
        return Ok(Outcome::Insufficient);
    };
    record_transfer(&tx, req, debited.get(0)).await?;
    tx.commit().await?;
    Ok(Outcome::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_accounts_and_the_racers_a_call_opens() {
        assert_eq!(
            two("acct-0001,acct-0002", ','),
            Ok(("acct-0001".into(), "acct-0002".into()))
        );
        assert!(two("acct-0001", ',').is_err());
        assert!(two("acct-0001:acct-0001", ':').is_err());
        let call = |op: &str, args: &[(&str, &str)]| Call {
            op: op.into(),
            args: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            line: 0,
        };
        let pairs = [("pairs", "a:b,c:d")];
        assert_eq!(connections(&call("request-order-transfers", &pairs)), 4);
        let alone = [("pairs", "a:b,c:d"), ("run", "one-by-one")];
        assert_eq!(connections(&call("request-order-transfers", &alone)), 0);
        assert_eq!(connections(&call("debit-race", &[("racers", "32")])), 32);
    }
}
