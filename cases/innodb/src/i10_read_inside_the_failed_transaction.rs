//! I10 — the committed operation, read inside the failed transaction and in a new one
//! (the seed's rule on its own engine).
//! Claim: under InnoDB's default REPEATABLE READ a plain SELECT reads the snapshot the
//! transaction took at its first consistent read (MySQL reference manual, "Consistent
//! Nonlocking Reads"). A registration whose INSERT waited for a concurrent one and then
//! failed with a duplicate key (1062) finds nothing when it reads the winner in the same
//! transaction if that transaction read anything before; the product rolls back and
//! reads in a new transaction, which finds the winner and replays it.
//! Setup: alice deposits 10 000 USDT; the server's isolation default is read. The
//! product's placement `place-i1001` is held by a hook at `registered` (its operation
//! inserted, not committed). Two more registrations of that id start: the naive one
//! (`frozen_balances_innodb::naive::register_reading_inside`: reads alice's balance
//! first, then inserts, then reads inside) and the product's placement. When InnoDB
//! shows both waiting (`INNODB_TRX`), the first placement commits.
//! Checks: the default isolation is REPEATABLE-READ; the product's second placement
//! replays the first (same order); a new transaction finds the operation OK.
//! Negative control: the naive read inside the failed transaction finds nothing. Under
//! [`Plan::Harmless`] the naive registration starts after the first placement committed
//! (its snapshot includes it), finds it, and the control's check must fail.
//! Fails if: the product does not replay, or the naive read finds the operation.

use std::sync::Arc;

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, EventKind, HookPoint, Market, NoHooks, Side};
use frozen_balances_innodb::Tally;
use frozen_balances_innodb::events::read_operation;
use frozen_balances_innodb::naive::{InsideRead, register_reading_inside};
use futures_util::FutureExt;
use mysql_async::prelude::Queryable;

use crate::fixtures::{Db, Gate, Plan, T, deposit, invariant, line, order};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I10",
        "after 1062 under REPEATABLE READ: the read inside the failed transaction finds nothing, a new one finds the winner",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .connections(5)
}

const ID: &str = "place-i1001";

/// The case body; under [`Plan::Harmless`] the naive registration starts after the
/// winner committed, so the control must not see an empty read.
///
/// Errors: SQL errors; the registrations did not wait.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let db = Db::open_named(&format!("i_i10_{plan:?}").to_lowercase()).await?;
    let mut conn = db.connect().await?;
    let isolation: Option<String> = conn.query_first("SELECT @@GLOBAL.tx_isolation").await?;
    ctx.check_eq(
        "the server's default isolation level",
        "REPEATABLE-READ".to_string(),
        isolation.unwrap_or_default(),
    );
    deposit(&mut conn, "dep-i1001", "alice", Asset::Usdt, 10_000).await?;
    let req = order(ID, "alice", Market::BtcUsdt, Side::Buy, "1.0", "5000")?;
    let gate = Arc::new(Gate::new(EventKind::Place, HookPoint::Registered));
    let (mut c1, mut c2, mut c3) = (
        db.connect().await?,
        db.connect().await?,
        db.connect().await?,
    );
    let (held, first_req) = (gate.clone(), req.clone());
    let mut first = Some(tokio::spawn(async move {
        frozen_balances_innodb::place(&mut c1, &first_req, held.as_ref(), &Tally::default()).await
    }));
    gate.reached().await;
    let second_req = req.clone();
    let second = tokio::spawn(async move {
        frozen_balances_innodb::place(&mut c2, &second_req, &NoHooks, &Tally::default()).await
    });
    let naive = if plan == Plan::Forced {
        let task = tokio::spawn(async move {
            register_reading_inside(&mut c3, T, ID, "alice", Asset::Usdt).await
        });
        db.wait_for_lock_waiters(&mut conn, 2).await?;
        gate.release();
        task.await??
    } else {
        db.wait_for_lock_waiters(&mut conn, 1).await?;
        gate.release();
        first_done(ctx, &mut first).await?;
        register_reading_inside(&mut c3, T, ID, "alice", Asset::Usdt).await?
    };
    first_done(ctx, &mut first).await?;
    let replayed = second.await??;
    ctx.check(
        "the product's second placement replays the first (read in a new transaction after 1062)",
        replayed.replayed && replayed.order_id.is_some(),
        format!("replayed={}", replayed.replayed),
    );
    let mut fresh = db.connect().await?;
    let found = read_operation(&mut fresh, T, ID).await?;
    ctx.check_eq(
        "a new transaction finds the operation",
        "OK".to_string(),
        found.map(|(_, outcome, _)| outcome).unwrap_or_default(),
    );
    ctx.exposes(
        "the read inside the failed REPEATABLE READ transaction finds nothing",
        naive == InsideRead::NotFound,
        format!("{naive:?}"),
    );
    ctx.check_eq(
        "alice USDT: one freeze",
        "available=4995.000000 frozen=5005.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}

type Placing = tokio::task::JoinHandle<
    Result<frozen_balances::PlaceResult, frozen_balances_innodb::InnoError>,
>;

/// Waits for the first placement (once) and notes its outcome.
async fn first_done(ctx: &mut Ctx, first: &mut Option<Placing>) -> anyhow::Result<()> {
    if let Some(task) = first.take() {
        let winner = task.await??;
        ctx.note(format!(
            "first placement committed: {}",
            winner.outcome.as_str()
        ));
    }
    Ok(())
}
