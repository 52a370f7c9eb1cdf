//! I7 — a response lost after commit on InnoDB (F7's claim, in the library).
//! Claim: when the answer of a committed placement never reaches the caller, the retry
//! with the same business id hits the duplicate key (1062), reads the committed
//! operation in a new transaction and replays its result: the same order, one freeze.
//! Setup: alice deposits 10 000 USDT. A hook aborts the placement (BUY 1.0 @ 5000) at
//! `after-commit`: committed, but the caller gets an error instead of the result (the
//! service's lost response, here at the library's edge; F7 cuts it on the wire).
//! Checks: the first call fails at after-commit yet the operation is OK; the retry
//! replays (one duplicate key counted) with the committed order id; alice 5005 frozen
//! once; one order; the invariant.
//! Fails if: the retry executes again, reports another order, or freezes twice.

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, EventKind, FrozenError, HookPoint, NoHooks};
use frozen_balances_innodb::events::read_operation;
use frozen_balances_innodb::{InnoError, Tally, query};
use futures_util::FutureExt;
use mysql_async::prelude::Queryable;

use crate::fixtures::{alice_buy, Db, FailAt, T, deposit, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I7",
        "response lost after commit on InnoDB: the retry replays through 1062 and a new transaction",
        |ctx| run(ctx).boxed(),
    )
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = Db::open(ctx).await?;
    let mut conn = db.connect().await?;
    deposit(&mut conn, "dep-i701", "alice", Asset::Usdt, 10_000).await?;
    let req = alice_buy("place-i701")?;
    let lose = FailAt {
        kind: EventKind::Place,
        point: HookPoint::AfterCommit,
    };
    let lost = frozen_balances_innodb::place(&mut conn, &req, &lose, &Tally::default()).await;
    let stored = read_operation(&mut conn, T, &req.business_id).await?;
    ctx.check(
        "the caller got no result, yet the placement is committed OK",
        matches!(
            lost,
            Err(InnoError::Frozen(FrozenError::HookAborted(
                HookPoint::AfterCommit
            )))
        ) && stored
            .as_ref()
            .is_some_and(|(_, outcome, _)| outcome == "OK"),
        format!(
            "call: {}; stored outcome: {:?}",
            lost.as_ref()
                .map_or_else(ToString::to_string, |r| r.outcome.as_str().to_string()),
            stored.as_ref().map(|(_, outcome, _)| outcome.clone())
        ),
    );
    let committed_order: Option<i64> = conn
        .exec_first(
            "SELECT order_id FROM spot_order WHERE place_business_id = ?",
            (&req.business_id,),
        )
        .await?;
    let tally = Tally::default();
    let retry = frozen_balances_innodb::place(&mut conn, &req, &NoHooks, &tally).await?;
    ctx.check(
        "the retry replays the committed result: same order, one duplicate key (1062)",
        retry.replayed && retry.order_id == committed_order && tally.duplicates() == 1,
        format!(
            "replayed={} same_order={} duplicates={}",
            retry.replayed,
            retry.order_id == committed_order,
            tally.duplicates()
        ),
    );
    ctx.check_eq(
        "alice USDT: frozen once; one order",
        "available=4995.000000 frozen=5005.000000 operations=2 movements=3 orders=1".to_string(),
        format!(
            "{} {}",
            line(&mut conn, "alice", Asset::Usdt).await?,
            query::counts(&mut conn)
                .await?
                .rsplit_once(" balances")
                .map_or("", |(head, _)| head)
        ),
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}
