//! L14 — transfers between any two accounts: with the rows locked in sorted order no
//! deadlock can form; locked in request order, opposite transfers deadlock (40P01).
//! Claim, in three parts:
//! 1. 200 transfers from 32 connections, both directions between acct-0001 and
//!    acct-0002, through `points_ledger::transfer_between` (sorted lock order): no 40P01,
//!    all 200 OK, balances conserved and equal to what the requests add up to.
//! 2. Negative control: the same transaction locking `from` then `to` (request order),
//!    four pairs of opposite transfers (acct-0003↔0004, 0005↔0006, 0007↔0008,
//!    0009↔0010), each participant holding its first row lock when all meet at a
//!    barrier before the second → one 40P01 per pair, every run (docs 13.3.4
//!    "Deadlocks": PostgreSQL aborts one transaction of the cycle).
//! 3. The same forced deadlocks with a bounded retry on 40P01 under the same key (the
//!    victim first waits until the row it was refused is free): every transfer completes
//!    exactly once (one transaction per key), one retry per pair.
//!
//! Fails if: part 1 sees a deadlock, an error or other balances; part 2 sees no 40P01;
//! part 3 leaves a transfer undone or done twice.

use std::sync::Arc;

use futures_util::FutureExt;
use points_ledger::{
    LedgerError, NoHooks, Outcome, TransferRequest, between, grant_in, reconcile, record_transfer,
    transfer_between,
};
use tokio::sync::Barrier;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel};

use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L14",
        "transfers between any two accounts: sorted lock order, no deadlock; request order deadlocks",
        |ctx| run(ctx).boxed(),
    )
    .connections(34)
}

/// What the negative control's check names.
pub const ANOMALY: &str = "locking in request order deadlocks (40P01) between opposite transfers";

const CLIENT: &str = "app-l14";
/// Part 1.
const TRANSFERS: usize = 200;
const CONNECTIONS: usize = 32;
const ACCOUNT_A: &str = "acct-0001";
const ACCOUNT_B: &str = "acct-0002";
const START_BALANCE: i64 = 10_000;
/// Part 1's amounts cycle through 1..=MAX_AMOUNT points.
const MAX_AMOUNT: i64 = 9;
/// Parts 2 and 3: the account pairs of opposite transfers.
const PAIRS: [(&str, &str); 4] = [
    ("acct-0003", "acct-0004"),
    ("acct-0005", "acct-0006"),
    ("acct-0007", "acct-0008"),
    ("acct-0009", "acct-0010"),
];
const PAIR_START_BALANCE: i64 = 1_000;
const PAIR_AMOUNT: i64 = 10;
/// Most attempts of one transfer in part 3 (a transfer is the victim of its pair's one
/// cycle at most once: its retry meets no barrier).
pub const DEADLOCK_MAX_ATTEMPTS: u32 = 3;

/// How the request-order transfers of parts 2 and 3 are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockPlan {
    /// All 8 run at once, each holding its first row lock when all meet at a barrier:
    /// every pair forms a cycle.
    ForcedCycle,
    /// One after another on one connection, no barrier: no cycle can form, and the
    /// negative control must report failure.
    Serial,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, LockPlan::ForcedCycle).await
}

/// The case under `plan` (the case itself runs [`LockPlan::ForcedCycle`]).
///
/// Errors: database errors outside the transfers; a racer could not connect.
pub async fn run_with(ctx: &mut Ctx, plan: LockPlan) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    sorted_order(ctx, &mut db).await?;
    grant_pairs(mode, &mut db).await?;
    request_order_no_retry(ctx, plan).await?;
    request_order_with_retry(ctx, plan, &db).await?;
    let findings = reconcile(&mut db).await?;
    ctx.check(
        "reconciliation of the case's database: no findings",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// Grants [`PAIR_START_BALANCE`] to both accounts of every pair.
async fn grant_pairs(mode: points_ledger::TransferMode, db: &mut Client) -> anyhow::Result<()> {
    for (a, b) in PAIRS {
        grant_in(mode, db, "ops", &format!("g-14-{a}"), a, PAIR_START_BALANCE).await?;
        grant_in(mode, db, "ops", &format!("g-14-{b}"), b, PAIR_START_BALANCE).await?;
    }
    Ok(())
}

/// Part 2: request order, no retry. The negative control sees whether a deadlock
/// happened; checks every transfer either committed or was the deadlock victim.
async fn request_order_no_retry(ctx: &mut Ctx, plan: LockPlan) -> anyhow::Result<()> {
    let ended = request_order_round(ctx, plan, "nr", 1).await?;
    let deadlocks = ended.iter().filter(|e| e.deadlocked).count();
    let ok = ended
        .iter()
        .filter(|e| e.outcome == Some(Outcome::Ok))
        .count();
    ctx.note(format!(
        "request order, no retry: transfers={} ok={ok} deadlocks={deadlocks}",
        ended.len()
    ));
    ctx.exposes(ANOMALY, deadlocks >= 1, format!("deadlocks={deadlocks}"));
    ctx.check_eq(
        "request order: every transfer either committed or was the deadlock victim",
        ended.len(),
        ok + deadlocks,
    );
    Ok(())
}

/// Part 3: request order, bounded retry on 40P01 under the same key. Checks every
/// transfer OK with one retry per pair, one transaction per key, and each pair's sum kept.
async fn request_order_with_retry(
    ctx: &mut Ctx,
    plan: LockPlan,
    db: &Client,
) -> anyhow::Result<()> {
    let ended = request_order_round(ctx, plan, "rt", DEADLOCK_MAX_ATTEMPTS).await?;
    let ok = ended
        .iter()
        .filter(|e| e.outcome == Some(Outcome::Ok))
        .count();
    let retries: u32 = ended.iter().map(|e| e.attempts - 1).sum();
    ctx.note(format!(
        "request order, retry on 40P01: transfers={} ok={ok} retried={retries}",
        ended.len()
    ));
    ctx.check_eq("with retry: every transfer OK", ended.len(), ok);
    ctx.check_eq(
        "with retry: one retry per pair (its deadlock victim)",
        PAIRS.len() as u32,
        retries,
    );
    ctx.check(
        format!("with retry: every transfer within {DEADLOCK_MAX_ATTEMPTS} attempts"),
        ended.iter().all(|e| e.attempts <= DEADLOCK_MAX_ATTEMPTS),
        "",
    );
    let mut once = 0;
    for (index, _) in ended.iter().enumerate() {
        let key = round_key("rt", index);
        if queries::txns_for_key(db, CLIENT, &key).await? == 1 {
            once += 1;
        }
    }
    ctx.check_eq("with retry: one transaction per key", ended.len(), once);
    let mut pairs_conserved = true;
    for (a, b) in PAIRS {
        let sum =
            queries::existing_balance(db, a).await? + queries::existing_balance(db, b).await?;
        pairs_conserved &= sum == 2 * PAIR_START_BALANCE;
    }
    ctx.check(
        "each pair's two balances still sum to 2000",
        pairs_conserved,
        format!("conserved={pairs_conserved}"),
    );
    Ok(())
}

/// Part 1: 200 transfers in both directions from 32 connections, sorted lock order.
async fn sorted_order(ctx: &mut Ctx, db: &mut Client) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    grant_in(mode, db, "ops", "g-14-a", ACCOUNT_A, START_BALANCE).await?;
    grant_in(mode, db, "ops", "g-14-b", ACCOUNT_B, START_BALANCE).await?;
    let results = sorted_transfers(ctx).await?;
    let ok = results
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Ok)))
        .count();
    let deadlocks = results
        .iter()
        .filter(|r| matches!(r, Err(Some(code)) if code == SqlState::T_R_DEADLOCK_DETECTED.code()))
        .count();
    let errors = results.iter().filter(|r| r.is_err()).count();
    let (a, b) = (
        queries::existing_balance(db, ACCOUNT_A).await?,
        queries::existing_balance(db, ACCOUNT_B).await?,
    );
    ctx.note(format!(
        "sorted order: transfers={} ok={ok} deadlocks={deadlocks} {ACCOUNT_A}={a} {ACCOUNT_B}={b}",
        results.len()
    ));
    ctx.check_eq("sorted order: transfers OK", TRANSFERS, ok);
    ctx.check_eq("sorted order: 40P01 deadlocks", 0, deadlocks);
    ctx.check_eq("sorted order: errors", 0, errors);
    let net_a_to_b: i64 = (0..TRANSFERS)
        .map(|index| {
            let req = sorted_request(index);
            if req.from == ACCOUNT_A {
                req.amount
            } else {
                -req.amount
            }
        })
        .sum();
    ctx.check_eq(
        "sorted order: acct-0001 = 10000 - net moved to acct-0002",
        START_BALANCE - net_a_to_b,
        a,
    );
    ctx.check_eq(
        "sorted order: the two balances sum to 20000",
        2 * START_BALANCE,
        a + b,
    );
    ctx.check_eq(
        "sorted order: transfer transactions",
        TRANSFERS as i64,
        queries::count_txns(db, ACCOUNT_A, "TRANSFER").await?,
    );
    ctx.check_eq(
        "sorted order: acct-0001 recomputed from entries",
        a,
        queries::sum_of_entries(db, ACCOUNT_A).await?,
    );
    Ok(())
}

/// Part 1's [`TRANSFERS`] transfers spread over [`CONNECTIONS`] racers, each in sorted
/// lock order. Returns each one's outcome, or its error's SQLSTATE.
async fn sorted_transfers(ctx: &Ctx) -> anyhow::Result<Vec<Result<Outcome, Option<String>>>> {
    let results = ctx
        .race(CONNECTIONS, |mut racer| async move {
            let mut ended = Vec::new();
            for index in (racer.index..TRANSFERS).step_by(CONNECTIONS) {
                let req = sorted_request(index);
                let result = transfer_between(&mut racer.client, &req, &NoHooks).await;
                ended.push(
                    result
                        .map(|r| r.outcome)
                        .map_err(|e| e.sqlstate().map(str::to_owned)),
                );
            }
            ended
        })
        .await?;
    Ok(results.into_iter().flatten().collect())
}

/// Part 1's transfer `index`: even ones go A→B, odd ones B→A, amounts 1..=9 in turn.
fn sorted_request(index: usize) -> TransferRequest {
    let amount = 1 + (index as i64 % MAX_AMOUNT);
    let (from, to) = if index.is_multiple_of(2) {
        (ACCOUNT_A, ACCOUNT_B)
    } else {
        (ACCOUNT_B, ACCOUNT_A)
    };
    between(CLIENT, format!("k-14-s-{index:03}"), from, to, amount)
}

fn round_key(round: &str, index: usize) -> String {
    format!("k-14-{round}-{index}")
}

/// Transfer `index` of a request-order round: pair `index / 2`, first → second for even
/// indexes, second → first for odd ones.
fn round_request(round: &str, index: usize) -> TransferRequest {
    let (a, b) = PAIRS[index / 2];
    let (from, to) = if index.is_multiple_of(2) {
        (a, b)
    } else {
        (b, a)
    };
    between(CLIENT, round_key(round, index), from, to, PAIR_AMOUNT)
}

/// How one request-order transfer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RoundEnd {
    /// The business outcome, `None` when an error reached the caller.
    outcome: Option<Outcome>,
    /// Whether an attempt was aborted with 40P01.
    deadlocked: bool,
    /// Attempts made.
    attempts: u32,
}

/// Runs the 8 request-order transfers of `round` under `plan`, each with up to
/// `max_attempts` attempts (retrying only on 40P01, with the same key; only the first
/// attempt meets the barrier).
async fn request_order_round(
    ctx: &Ctx,
    plan: LockPlan,
    round: &'static str,
    max_attempts: u32,
) -> anyhow::Result<Vec<RoundEnd>> {
    let transfers = PAIRS.len() * 2;
    match plan {
        LockPlan::ForcedCycle => {
            ctx.race(transfers, move |mut racer| async move {
                let req = round_request(round, racer.index);
                with_retry(
                    &mut racer.client,
                    &req,
                    Some(racer.barrier.clone()),
                    max_attempts,
                )
                .await
            })
            .await
        }
        LockPlan::Serial => {
            let mut client = ctx.connect().await?;
            let mut ended = Vec::with_capacity(transfers);
            for index in 0..transfers {
                let req = round_request(round, index);
                ended.push(with_retry(&mut client, &req, None, max_attempts).await);
            }
            Ok(ended)
        }
    }
}

async fn with_retry(
    client: &mut Client,
    req: &TransferRequest,
    barrier: Option<Arc<Barrier>>,
    max_attempts: u32,
) -> RoundEnd {
    let mut end = RoundEnd {
        outcome: None,
        deadlocked: false,
        attempts: 0,
    };
    loop {
        end.attempts += 1;
        let meet = if end.attempts == 1 {
            barrier.as_deref()
        } else {
            None
        };
        match request_order_transfer(client, req, meet).await {
            Ok(outcome) => {
                end.outcome = Some(outcome);
                return end;
            }
            Err(error) if error.sqlstate() == Some(SqlState::T_R_DEADLOCK_DETECTED.code()) => {
                end.deadlocked = true;
                if end.attempts >= max_attempts {
                    return end;
                }
                // Back off until the winner is done: lock and release the row this
                // transfer was refused, in a transaction of its own (it holds nothing
                // now, so this cannot close a cycle). A timed backoff would only make a
                // second deadlock unlikely; this makes it impossible here.
                if wait_for_row(client, &req.to).await.is_err() {
                    return end;
                }
            }
            Err(_) => return end,
        }
    }
}

/// Locks and releases `account`'s row: returns once no other transaction holds it.
async fn wait_for_row(client: &mut Client, account: &str) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.query_one(
        "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE",
        &[&account],
    )
    .await?;
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
    const LOCK_SQL: &str = "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE";
    let started = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await;
    let first = match &started {
        Ok(tx) => tx.query_one(LOCK_SQL, &[&req.from]).await.map(|_| ()),
        Err(_) => Ok(()),
    };
    if let Some(barrier) = barrier {
        barrier.wait().await;
    }
    let tx = started?;
    first?;
    tx.query_one(LOCK_SQL, &[&req.to]).await?;
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
