//! L13 — four locking strategies side by side: the L3 race (32 threads debit 7 from 100,
//! released by one barrier) under each design, one table.
//! Claim: the conditional UPDATE (READ COMMITTED, EvalPlanQual), `SELECT … FOR UPDATE`
//! then check then update, and SERIALIZABLE with a bounded retry on 40001 each give
//! 14 OK / 18 INSUFFICIENT / balance 2; REPEATABLE READ without a retry hands 40001
//! ("could not serialize access due to concurrent update", docs 13.2.2) to 31 of the 32
//! callers and debits only once.
//! Setup that makes it certain: in the two snapshot strategies every participant takes
//! its snapshot (a first `SELECT`) before the barrier, so every snapshot predates the
//! first commit and each later update of the row is a conflict.
//! Fails if: a correct design gives another split, a database error, or a retry count
//! over its bound; the no-retry design shows no 40001; or balances and entries disagree.

use futures_util::FutureExt;
use points_ledger::{
    LedgerError, Outcome, TransferRequest, debit_in, grant_in, reconcile, record_transfer,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel};

use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L13",
        "locking strategies side by side: conditional UPDATE, FOR UPDATE, SERIALIZABLE + retry, REPEATABLE READ",
        |ctx| run(ctx).boxed(),
    )
    .connections(34)
}

const THREADS: usize = 32;
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 7;
const CLIENT: &str = "app-l13";
/// Most attempts of one SERIALIZABLE debit. A debit fails only when another one
/// committed a change to the row after its snapshot, and at most 14 can commit one, so
/// 15 attempts always suffice; the bound leaves room.
pub const SERIALIZABLE_MAX_ATTEMPTS: u32 = 32;

/// One design of the debit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    /// `points_ledger::debit`: `UPDATE … WHERE balance >= amount` under READ COMMITTED.
    ConditionalUpdate,
    /// READ COMMITTED: `SELECT balance … FOR UPDATE`, check in the application, update.
    ForUpdate,
    /// SERIALIZABLE: read, check, update; on 40001 roll back and try again.
    SerializableRetry,
    /// REPEATABLE READ: read, check, update; 40001 goes to the caller.
    RepeatableReadNoRetry,
}

impl Strategy {
    const ALL: [Strategy; 4] = [
        Strategy::ConditionalUpdate,
        Strategy::ForUpdate,
        Strategy::SerializableRetry,
        Strategy::RepeatableReadNoRetry,
    ];

    fn name(self) -> &'static str {
        match self {
            Strategy::ConditionalUpdate => "conditional-update",
            Strategy::ForUpdate => "for-update",
            Strategy::SerializableRetry => "serializable-retry",
            Strategy::RepeatableReadNoRetry => "repeatable-read",
        }
    }

    /// Each strategy debits its own account, so the four races do not share a row
    /// (they share `sys-redeem`, and run one after another).
    fn account(self) -> &'static str {
        match self {
            Strategy::ConditionalUpdate => "acct-0003",
            Strategy::ForUpdate => "acct-0004",
            Strategy::SerializableRetry => "acct-0005",
            Strategy::RepeatableReadNoRetry => "acct-0006",
        }
    }
}

/// What one participant's debit ended as.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    /// The business outcome, after `attempts` tries (1 without a retry).
    Outcome { outcome: Outcome, attempts: u32 },
    /// A database error reached the caller, by SQLSTATE.
    Error(Option<String>),
}

/// What the REPEATABLE READ row's check names: the design that fails.
pub const ANOMALY: &str = "REPEATABLE READ without a retry hands 40001 to its callers";

/// How the 32 debits of each strategy are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interleaving {
    /// All 32 at once, released by one barrier (after their snapshot, where they take one).
    Race,
    /// One after another, each alone: no conflict can happen, and the REPEATABLE READ
    /// row's check must report failure.
    Serial,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, Interleaving::Race).await
}

/// The case under `interleaving` (the case itself runs [`Interleaving::Race`]).
///
/// Errors: database errors outside the debits; a racer could not connect.
pub async fn run_with(ctx: &mut Ctx, interleaving: Interleaving) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    ctx.note(format!(
        "{:<19} {:>2} {:>12} {:>5} {:>7} {:>11}",
        "strategy", "ok", "insufficient", "40001", "balance", "entries_sum"
    ));
    let mut serializable_retries = 0;
    for strategy in Strategy::ALL {
        let account = strategy.account();
        grant_in(
            mode,
            &mut db,
            "ops",
            &format!("g-13-{}", strategy.name()),
            account,
            START_BALANCE,
        )
        .await?;
        let ended = debit_all(ctx, mode, strategy, interleaving).await?;
        check_row(ctx, &db, strategy, &Tally::of(&ended)).await?;
        if strategy == Strategy::SerializableRetry {
            serializable_retries = check_attempts(ctx, strategy.name(), &ended);
        }
    }
    // The count varies from run to run; the redaction layer hides `*_retries=`.
    ctx.note(format!("serializable_retries={serializable_retries}"));
    ctx.record("serializable_retries", serializable_retries.into());
    let findings = reconcile(&mut db).await?;
    ctx.check(
        "reconciliation of the case's database: no findings",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// The [`THREADS`] debits of `strategy` on its account, scheduled as `interleaving` says
/// (keys `k-13-<strategy>-NN`). Returns how each ended.
///
/// Errors: a racer could not connect.
async fn debit_all(
    ctx: &Ctx,
    mode: points_ledger::TransferMode,
    strategy: Strategy,
    interleaving: Interleaving,
) -> anyhow::Result<Vec<Ended>> {
    let account = strategy.account();
    Ok(match interleaving {
        Interleaving::Race => {
            ctx.race(THREADS, move |mut racer| async move {
                let key = format!("k-13-{}-{:02}", strategy.name(), racer.index);
                debit_by(
                    mode,
                    strategy,
                    &mut racer.client,
                    &racer.barrier,
                    &key,
                    account,
                )
                .await
            })
            .await?
        }
        Interleaving::Serial => {
            let mut ended = Vec::with_capacity(THREADS);
            for index in 0..THREADS {
                // A race of one: its own connection, a barrier that waits for no one.
                let mut one = ctx
                    .race(1, move |mut racer| async move {
                        let key = format!("k-13-{}-{index:02}", strategy.name());
                        debit_by(
                            mode,
                            strategy,
                            &mut racer.client,
                            &racer.barrier,
                            &key,
                            account,
                        )
                        .await
                    })
                    .await?;
                ended.append(&mut one);
            }
            ended
        }
    })
}

/// How one strategy's debits ended, counted.
struct Tally {
    ok: usize,
    insufficient: usize,
    /// Errors with SQLSTATE 40001.
    serialization_failures: usize,
    /// Every other error.
    other_errors: usize,
}

impl Tally {
    /// Counts how the debits of `ended` ended.
    fn of(ended: &[Ended]) -> Tally {
        let count = |want: Outcome| {
            ended
                .iter()
                .filter(|e| matches!(e, Ended::Outcome { outcome, .. } if *outcome == want))
                .count()
        };
        let (ok, insufficient) = (count(Outcome::Ok), count(Outcome::Insufficient));
        let serialization_failures = ended
            .iter()
            .filter(|e| matches!(e, Ended::Error(Some(code)) if code == SqlState::T_R_SERIALIZATION_FAILURE.code()))
            .count();
        let other_errors = ended
            .iter()
            .filter(|e| matches!(e, Ended::Error(_)))
            .count()
            - serialization_failures;
        Tally {
            ok,
            insufficient,
            serialization_failures,
            other_errors,
        }
    }
}

/// One row of the table: notes `strategy`'s counts with its account's balance and sum of
/// entries, and checks them (the REPEATABLE READ row: 40001 to 31 callers, the control's
/// verdict; the others: 14 OK, 18 INSUFFICIENT, no error, balance 2).
async fn check_row(
    ctx: &mut Ctx,
    db: &Client,
    strategy: Strategy,
    tally: &Tally,
) -> anyhow::Result<()> {
    let account = strategy.account();
    let Tally {
        ok,
        insufficient,
        serialization_failures,
        other_errors,
    } = *tally;
    let balance = queries::existing_balance(db, account).await?;
    let entries = queries::sum_of_entries(db, account).await?;
    ctx.note(format!(
        "{:<19} {ok:>2} {insufficient:>12} {serialization_failures:>5} {balance:>7} {entries:>11}",
        strategy.name()
    ));
    let label = strategy.name();
    match strategy {
        Strategy::RepeatableReadNoRetry => {
            ctx.exposes(
                ANOMALY,
                serialization_failures >= 1,
                format!("serialization_failures={serialization_failures}"),
            );
            ctx.check_eq(
                format!("{label}: 40001 reaches 31 of 32 callers"),
                THREADS - 1,
                serialization_failures,
            );
            ctx.check_eq(format!("{label}: one debit committed"), 1, ok);
            ctx.check_eq(
                format!("{label}: balance = 100 - 7"),
                START_BALANCE - DEBIT,
                balance,
            );
        }
        _ => {
            ctx.check_eq(format!("{label}: ok = floor(100/7)"), 14, ok);
            ctx.check_eq(format!("{label}: insufficient"), 18, insufficient);
            ctx.check_eq(
                format!("{label}: errors reaching the caller"),
                0,
                serialization_failures + other_errors,
            );
            ctx.check_eq(format!("{label}: balance"), 2, balance);
        }
    }
    ctx.check_eq(
        format!("{label}: balance recomputed from entries"),
        balance,
        entries,
    );
    Ok(())
}

/// The SERIALIZABLE row's attempts: checks every debit took at most
/// [`SERIALIZABLE_MAX_ATTEMPTS`] and some retried. Returns the number of retries.
fn check_attempts(ctx: &mut Ctx, label: &str, ended: &[Ended]) -> u32 {
    let attempts: Vec<u32> = ended
        .iter()
        .filter_map(|e| match e {
            Ended::Outcome { attempts, .. } => Some(*attempts),
            Ended::Error(_) => None,
        })
        .collect();
    let serializable_retries = attempts.iter().map(|a| a - 1).sum::<u32>();
    let most = attempts.iter().copied().max().unwrap_or(0);
    ctx.check(
        format!(
            "{label}: every debit within {SERIALIZABLE_MAX_ATTEMPTS} attempts, and some retried"
        ),
        most <= SERIALIZABLE_MAX_ATTEMPTS && serializable_retries >= 1,
        format!(
            "within_bound={} retried={}",
            most <= SERIALIZABLE_MAX_ATTEMPTS,
            serializable_retries >= 1
        ),
    );
    serializable_retries
}

/// One participant's debit of [`DEBIT`] from `account` by `strategy`; meets the others at
/// `barrier` (after taking its snapshot where the strategy has one).
async fn debit_by(
    mode: points_ledger::TransferMode,
    strategy: Strategy,
    client: &mut Client,
    barrier: &tokio::sync::Barrier,
    key: &str,
    account: &str,
) -> Ended {
    let req = TransferRequest::debit(CLIENT, key, account, DEBIT);
    match strategy {
        Strategy::ConditionalUpdate => {
            barrier.wait().await;
            match debit_in(mode, client, CLIENT, key, account, DEBIT).await {
                Ok(result) => Ended::Outcome {
                    outcome: result.outcome,
                    attempts: 1,
                },
                Err(error) => Ended::Error(error.sqlstate().map(str::to_owned)),
            }
        }
        Strategy::ForUpdate => {
            barrier.wait().await;
            ended(
                read_check_update(client, &req, IsolationLevel::ReadCommitted, true, None).await,
                1,
            )
        }
        Strategy::RepeatableReadNoRetry => ended(
            read_check_update(
                client,
                &req,
                IsolationLevel::RepeatableRead,
                false,
                Some(barrier),
            )
            .await,
            1,
        ),
        Strategy::SerializableRetry => {
            let mut attempts = 0;
            loop {
                attempts += 1;
                // Only the first attempt meets the others: every first snapshot predates
                // every commit, so conflicts are certain; a retry runs when it can.
                let meet = (attempts == 1).then_some(barrier);
                let result =
                    read_check_update(client, &req, IsolationLevel::Serializable, false, meet)
                        .await;
                let retry = matches!(&result, Err(error)
                    if error.sqlstate() == Some(SqlState::T_R_SERIALIZATION_FAILURE.code()));
                if !retry || attempts >= SERIALIZABLE_MAX_ATTEMPTS {
                    return ended(result, attempts);
                }
            }
        }
    }
}

fn ended(result: Result<Outcome, LedgerError>, attempts: u32) -> Ended {
    match result {
        Ok(outcome) => Ended::Outcome { outcome, attempts },
        Err(error) => Ended::Error(error.sqlstate().map(str::to_owned)),
    }
}

/// One transaction at `isolation`: `SELECT balance` (`FOR UPDATE` when `lock`), meet at
/// `barrier` if given, check `balance >= amount` in the application, then
/// `UPDATE … SET balance = balance - amount` and record the transfer the ledger's way
/// (`record_transfer`) before COMMIT. Not enough → INSUFFICIENT, rolled back (nothing
/// recorded: no key is reused in this case).
async fn read_check_update(
    client: &mut Client,
    req: &TransferRequest,
    isolation: IsolationLevel,
    lock: bool,
    barrier: Option<&tokio::sync::Barrier>,
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
