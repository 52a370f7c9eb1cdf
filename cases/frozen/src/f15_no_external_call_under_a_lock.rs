//! F15 — no external call under a lock.
//! Claim: the executor calls the network with no database lock held, so while the
//! network holds its answer to w-1501, no session of the database holds a row lock or a
//! write, and a placement and another withdrawal on the same account (the same balance
//! row, alice's USDT) each complete while the answer is still being held.
//! The hold is forced, not timed: the network holds the answer until the case releases
//! it (after both operations); `HOLD_BOUND_MS` only bounds it should the case never do
//! so. Had the executor kept the row locked during the call, the placement would wait
//! for the release that comes only after it, and the hold would have run out first.
//! Negative control: a naive withdrawal makes the call inside its freezing transaction
//! (dave's USDT row locked by the freeze); a placement on the same row, started while
//! the network holds the answer, is seen blocked by the naive transaction's backend
//! (`pg_blocking_pids`); then the case releases the answer. The naive transaction rolls
//! back, and the network still has the transfer: a rollback does not undo an effect
//! outside the database.
//! Fails if: a session holds a write while the network holds the answer, the answer was
//! no longer held when both operations were done, or the naive placement was not seen
//! blocked by the naive transaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use case_kit::{AbortOnDrop, Case, Ctx};
use external_net::client::{Answer, NetClient};
use external_net::wire::{Action, Broadcast, ControlRequest, MAX_DELAY_MS};
use frozen_balances::amount::{parse_price, parse_quantity};
use frozen_balances::{
    Asset, DEFAULT_TENANT, Market, NoHooks, Outcome, PlaceRequest, PlaceResult, Side,
};
use futures_util::FutureExt;
use launch::worker::CrashWorker;

use super::fixtures::Plan;
use super::network::{
    StandIn, check_reconciles, collect, deposit, launch_executor, note_lines, states, withdraw,
};
use super::spot::balance_line;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F15",
        "no external call under a lock: placements and withdrawals complete while the network holds its answer; a call inside the freeze makes them wait",
        |ctx| run(ctx).boxed(),
    )
    .connections(5)
}

/// The negative control's anomaly.
pub const ANOMALY: &str =
    "a call inside the freezing transaction makes a placement on the same row wait for the network";

/// Safety bound of each hold, milliseconds (the stand-in's longest delay): the case
/// releases the answer itself; this ends the hold only should it never do so.
pub const HOLD_BOUND_MS: u64 = MAX_DELAY_MS;
/// Longest wait for the network to start holding, milliseconds.
const HOLD_START_WAIT_MS: u64 = 10_000;
/// The executor's bound for an answer, milliseconds: longer than any hold, so the held
/// answer is always received, never timed out.
const ANSWER_TIMEOUT_MS: u64 = HOLD_BOUND_MS + 10_000;
/// Longest wait for the control's placement to be seen blocked, milliseconds: it only
/// stops a hang (the placement cannot finish while the naive transaction holds the row).
const BLOCKED_WAIT_MS: u64 = 30_000;
/// How often the control looks at `pg_blocking_pids`, milliseconds.
const BLOCKED_POLL_MS: u64 = 5;
/// 1 USDT in minor units.
const USDT: i64 = 1_000_000;

fn buy(business_id: &str, account: &str) -> anyhow::Result<PlaceRequest> {
    let market = Market::BtcUsdt;
    Ok(PlaceRequest {
        tenant_id: DEFAULT_TENANT.into(),
        business_id: business_id.into(),
        account_id: account.into(),
        market,
        side: Side::Buy,
        quantity: parse_quantity(market, "0.1000")?,
        limit_price: parse_price(market, "5000.00")?,
    })
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let net = StandIn::start(ctx).await?;
    let mut db = ctx.connect().await?;
    let t = DEFAULT_TENANT;
    deposit(&mut db, t, "dep-1501", "alice", Asset::Usdt, 10_000 * USDT).await?;
    withdraw(
        &mut db,
        t,
        "w-1501",
        "alice",
        Asset::Usdt,
        100 * USDT,
        "addr-alice-1501",
    )
    .await?;
    hold_next_answer(&net).await?;
    ctx.note("the network holds w-1501's answer until the case releases it");
    let mut executor = launch_executor(
        ctx,
        &net,
        &["--answer-timeout-ms", &ANSWER_TIMEOUT_MS.to_string()],
    )?;
    net.wait_holding(1, Duration::from_millis(HOLD_START_WAIT_MS))
        .await?;

    work_during_the_hold(ctx, &net, &mut db).await?;
    net.net().release_held().await?;
    ctx.note("the case releases w-1501's answer");

    check_after_release(ctx, &mut executor, &db).await?;

    run_control(ctx, &net, Plan::Forced).await?;
    super::network::note_log(&net, ctx).await?;
    check_reconciles(ctx, &mut db, "reconciliation at the end").await?;
    Ok(())
}

/// While the network holds w-1501's answer: checks no session holds a write, then that
/// a placement and the withdrawal w-1502 on alice's USDT both complete, and that the
/// answer was still held when both were done.
///
/// Errors: the library's; the stand-in did not answer.
async fn work_during_the_hold(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &mut tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let writing = sessions_in_a_write(db).await?;
    ctx.check_eq(
        "while the network holds the answer, no session holds a row lock or a write (pg_stat_activity.backend_xid)",
        0,
        writing,
    );
    let started = Instant::now();
    let placed = frozen_balances::place(db, &buy("place-1501", "alice")?, &NoHooks).await?;
    let place_ms = started.elapsed().as_millis();
    ctx.check_eq(
        "placement on alice's USDT during the hold: OK",
        Outcome::Ok.as_str(),
        placed.outcome.as_str(),
    );
    let started = Instant::now();
    let second = withdraw(
        db,
        t,
        "w-1502",
        "alice",
        Asset::Usdt,
        50 * USDT,
        "addr-alice-1502",
    )
    .await?;
    let withdraw_ms = started.elapsed().as_millis();
    ctx.check_eq(
        "withdrawal w-1502 during the hold: OK",
        Outcome::Ok.as_str(),
        second.outcome.as_str(),
    );
    // Timing, for a reader: the verdict is the order of events checked next.
    ctx.note(format!(
        "during the hold: placement elapsed_ms={place_ms}, withdrawal elapsed_ms={withdraw_ms}"
    ));
    ctx.check_eq(
        "the network was still holding w-1501's answer when both were done",
        1,
        net.net().control_state().await?.holding,
    );
    Ok(())
}

/// Reads the executor to its end once the answer is released: checks it exited with
/// status 0, both withdrawals went `REQUESTED BROADCAST CONFIRMED`, and alice's USDT.
///
/// Errors: the executor ran too long; database errors.
async fn check_after_release(
    ctx: &mut Ctx,
    executor: &mut CrashWorker,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let (lines, end, stderr) = collect(executor).await?;
    note_lines(ctx, "executor", &lines);
    ctx.check_eq(
        "executor exited with status 0",
        "exited with status 0".to_string(),
        format!("{end}{stderr}"),
    );
    for id in ["w-1501", "w-1502"] {
        ctx.check_eq(
            format!("{id} states in order"),
            "REQUESTED BROADCAST CONFIRMED".to_string(),
            states(db, t, id).await?,
        );
    }
    ctx.check_eq(
        "alice USDT: 150 out, 500.5 frozen by the open order",
        "available=9349.500000 frozen=500.500000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    Ok(())
}

/// Holds the next broadcast's answer until [`NetClient::release_held`] (at most
/// [`HOLD_BOUND_MS`]).
///
/// [`NetClient::release_held`]: external_net::client::NetClient::release_held
async fn hold_next_answer(net: &StandIn) -> anyhow::Result<()> {
    net.net()
        .control(&ControlRequest {
            action: Action::Delay,
            delay_ms: HOLD_BOUND_MS,
            count: 1,
        })
        .await
}

/// Client sessions of this database, other than `db`'s own, inside a transaction that
/// has a transaction id: one that wrote or locked a row (`SELECT … FOR UPDATE` takes one
/// too; PostgreSQL docs §27.2.3, `backend_xid`).
async fn sessions_in_a_write(db: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND backend_type = 'client backend' \
               AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL",
            &[],
        )
        .await?
        .get(0))
}

/// Looks every [`BLOCKED_POLL_MS`] whether backend `waiter` is blocked by backend
/// `holder` (`pg_blocking_pids`, PostgreSQL docs §9.27), until it is, until `finished`
/// says the waiter's work is over, or for at most [`BLOCKED_WAIT_MS`] (a hang bound).
async fn seen_blocked(
    watcher: &tokio_postgres::Client,
    waiter: i32,
    holder: i32,
    finished: &AtomicBool,
) -> anyhow::Result<bool> {
    let look = async {
        loop {
            // Read before the look: a waiter finished before it cannot be blocked in it.
            let over = finished.load(Ordering::SeqCst);
            let blocked: bool = watcher
                .query_one("SELECT $2 = ANY(pg_blocking_pids($1))", &[&waiter, &holder])
                .await?
                .get(0);
            if blocked || over {
                return anyhow::Ok(blocked);
            }
            tokio::time::sleep(Duration::from_millis(BLOCKED_POLL_MS)).await;
        }
    };
    // The limit only stops a hang: not seen blocked by then is `false`.
    let limit = Duration::from_millis(BLOCKED_WAIT_MS);
    tokio::time::timeout(limit, look).await.unwrap_or(Ok(false))
}

// The naive withdrawal's freeze: the same conditional update as the product's, inside a
// transaction that then calls the network before it ends.
const NAIVE_FREEZE_SQL: &str = "\
UPDATE balance SET available = available - $1, frozen = frozen + $1, version = version + 1
WHERE tenant_id = 'default' AND account_id = 'dave' AND asset = 'USDT' AND available >= $1";

/// The negative control on dave's USDT: a naive withdrawal calls the network inside its
/// freezing transaction; a placement on the same row meanwhile. Under [`Plan::Forced`]
/// the network holds the answer, the placement starts while it does and must be seen
/// blocked by the naive transaction's backend; then the case releases the answer. Under
/// [`Plan::Harmless`] the network answers at once and the placement starts only after the
/// naive transaction ended, so it cannot be blocked and the control must FAIL. The naive
/// transaction rolls back at the end (its database stays clean).
///
/// Errors: the stand-in or the database failed.
pub async fn run_control(ctx: &mut Ctx, net: &StandIn, plan: Plan) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    let watcher = ctx.connect().await?;
    let t = DEFAULT_TENANT;
    deposit(&mut db, t, "dep-1551", "dave", Asset::Usdt, 10_000 * USDT).await?;
    if plan == Plan::Forced {
        hold_next_answer(net).await?;
    }
    let naive_db = ctx.connect().await?;
    let naive_pid: i32 = naive_db
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let place_pid: i32 = db.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let (mut naive, locked) = spawn_naive_withdrawal(naive_db, net.net().clone());
    locked.await?;
    let mut answer = None;
    match plan {
        Plan::Forced => {
            net.wait_holding(1, Duration::from_millis(HOLD_START_WAIT_MS))
                .await?;
        }
        Plan::Harmless => answer = Some((&mut naive).await??),
    }
    let finished = AtomicBool::new(false);
    let placing = async {
        let placed = frozen_balances::place(&mut db, &buy("place-1551", "dave")?, &NoHooks).await;
        finished.store(true, Ordering::SeqCst);
        anyhow::Ok(placed?)
    };
    let watching = async {
        let blocked = seen_blocked(&watcher, place_pid, naive_pid, &finished).await;
        if plan == Plan::Forced {
            net.net().release_held().await?;
        }
        blocked
    };
    let (placed, blocked) = tokio::join!(placing, watching);
    let (placed, blocked) = (placed?, blocked?);
    let answer = match answer {
        Some(answer) => answer,
        None => naive.await??,
    };
    check_control(ctx, net, &db, &answer, &placed, blocked).await
}

/// Starts the naive withdrawal w-1599 as a task on `naive_db`: freezes 100 USDT of
/// dave's inside a transaction, signals the returned receiver once the row is locked,
/// calls the network (`client`) with the transaction still open, then rolls back.
/// Returns the task, which ends with the network's answer, and the signal.
fn spawn_naive_withdrawal(
    mut naive_db: tokio_postgres::Client,
    client: NetClient,
) -> (
    AbortOnDrop<anyhow::Result<Answer>>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let (locked_tx, locked) = tokio::sync::oneshot::channel();
    let naive = AbortOnDrop::spawn(async move {
        let tx = naive_db.transaction().await?;
        tx.execute(NAIVE_FREEZE_SQL, &[&(100 * USDT)]).await?;
        let _ = locked_tx.send(());
        let answer = client
            .broadcast(
                &Broadcast {
                    id: "w-1599".into(),
                    destination: "addr-dave-1599".into(),
                    asset: "USDT".into(),
                    amount: 100 * USDT,
                },
                Duration::from_millis(ANSWER_TIMEOUT_MS),
            )
            .await;
        tx.rollback().await?;
        anyhow::Ok(answer)
    });
    (naive, locked)
}

/// The control's verdict: the naive call was answered, dave's placement OK, whether it
/// was seen `blocked` by the naive transaction (the anomaly), dave's USDT after the
/// rollback, and the transfer w-1599 still in the network.
///
/// Errors: database errors; the stand-in did not answer.
async fn check_control(
    ctx: &mut Ctx,
    net: &StandIn,
    db: &tokio_postgres::Client,
    answer: &Answer,
    placed: &PlaceResult,
    blocked: bool,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    ctx.check_eq(
        "the naive call inside the transaction was answered",
        format!("{:?}", Answer::Accepted { new: true }),
        format!("{answer:?}"),
    );
    ctx.check_eq(
        "dave's placement: OK",
        Outcome::Ok.as_str(),
        placed.outcome.as_str(),
    );
    ctx.exposes(
        ANOMALY,
        blocked,
        format!("blocked by the naive transaction's backend (pg_blocking_pids): {blocked}"),
    );
    ctx.check_eq(
        "dave USDT: the naive freeze rolled back, the order's freeze stands",
        "available=9499.500000 frozen=500.500000".to_string(),
        balance_line(db, t, "dave", Asset::Usdt).await?,
    );
    let out = net
        .net()
        .transfers()
        .await?
        .iter()
        .filter(|t| t.id == "w-1599")
        .count();
    ctx.check_eq(
        "the rollback did not undo the transfer: the network has w-1599",
        1,
        out,
    );
    Ok(())
}
