//! I6 — a failure between the balance update and the movement on InnoDB (F6's claim).
//! Claim: the freeze, its movement, its order and its operation commit together or not
//! at all: a failure after the conditional UPDATE rolls the whole transaction back
//! (InnoDB's undo log), and the retry with the same business id freezes once.
//! Setup: alice deposits 20 000 USDT. A hook fails the placement (BUY 1.0 @ 5000) at
//! `balances-updated`: the balance row changed, no movement, no order yet.
//! Checks: the call fails there; operations, movements, orders and balances are as
//! before; the retry executes (not a replay) and freezes 5005 once; the invariant.
//! Fails if: a trace of the failed attempt remains or the retry freezes twice.
//! (F6's negative control, each statement in its own transaction, is engine-blind and
//! runs in F6 only.)

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, EventKind, FrozenError, HookPoint, NoHooks};
use frozen_balances_innodb::{InnoError, Tally, query};
use futures_util::FutureExt;

use crate::fixtures::{alice_buy, Db, FailAt, deposit, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I6",
        "failure between balance update and movement on InnoDB: all or nothing, the retry freezes once",
        |ctx| run(ctx).boxed(),
    )
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let db = Db::open(ctx).await?;
    let mut conn = db.connect().await?;
    deposit(&mut conn, "dep-i601", "alice", Asset::Usdt, 20_000).await?;
    let req = alice_buy("place-i601")?;
    let before = query::recorded(&mut conn).await?;
    let fail = FailAt {
        kind: EventKind::Place,
        point: HookPoint::BalancesUpdated,
    };
    let failed = frozen_balances_innodb::place(&mut conn, &req, &fail, &Tally::default()).await;
    ctx.check(
        "the placement fails at balances-updated",
        matches!(
            failed,
            Err(InnoError::Frozen(FrozenError::HookAborted(
                HookPoint::BalancesUpdated
            )))
        ),
        match &failed {
            Ok(r) => r.outcome.as_str().to_string(),
            Err(e) => e.to_string(),
        },
    );
    ctx.check(
        "nothing of the failed attempt remains (operations, movements, orders, balances)",
        query::recorded(&mut conn).await? == before,
        query::counts(&mut conn).await?,
    );
    let retry = frozen_balances_innodb::place(&mut conn, &req, &NoHooks, &Tally::default()).await?;
    ctx.check_eq(
        "the retry with the same id executes (nothing was registered)",
        "OK replayed=false".to_string(),
        format!("{} replayed={}", retry.outcome.as_str(), retry.replayed),
    );
    ctx.check_eq(
        "alice USDT after the retry: frozen once",
        "available=14995.000000 frozen=5005.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}
