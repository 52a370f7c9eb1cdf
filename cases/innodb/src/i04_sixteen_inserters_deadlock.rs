//! I4 — sixteen inserters of one business id, and the deadlocks InnoDB reports (1213).
//! Claim: sixteen identical placements under one business id that all wait behind an
//! uncommitted registration of that id which then rolls back (a first attempt that
//! failed) make InnoDB report deadlocks: each waiter holds a shared next-key lock on the
//! key and then wants to insert it (MySQL reference manual, "Locks Set by Different SQL
//! Statements in InnoDB", the duplicate-key example). The product's bounded retry
//! (at most 5 attempts, same business id) answers each of the sixteen exactly once: one
//! freeze, fifteen replays of it. PostgreSQL's `ON CONFLICT DO NOTHING` has no such
//! deadlock (F4).
//! Setup: alice deposits 20 000 USDT. A blocker session inserts the registration of
//! `place-i401` and keeps its transaction open; sixteen product placements of BUY 1.0 @
//! 5000 under that id start; the case waits until InnoDB shows all sixteen waiting
//! (`INNODB_TRX`), then rolls the blocker back.
//! Checks: sixteen answers, no error; one executed, fifteen replayed, one order id; at
//! least one deadlock reported and retried (the count varies from run to run and goes to
//! the run record); one operation, one order, alice 5005 frozen.
//! Negative control: the same with the placement's retry removed
//! (`frozen_balances_innodb::naive::place_without_retry`, id `place-i402`): deadlock
//! errors (1213) reach callers. Under [`Plan::Harmless`] no blocker rolls back, nobody
//! deadlocks, and the control's check must fail.
//! Fails if: a caller gets an error or a second freeze, no deadlock is reported, or the
//! control's callers see no 1213.
//!
//! Rust, not a file: each of the sixteen placements meets a number of deadlocks (1213)
//! that varies from run to run; a file prints each call's answer with its `deadlocks=N`,
//! so its transcript would vary; this case checks that some occurred and records the count.

use std::sync::Arc;

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, NoHooks, PlaceRequest, PlaceResult};
use frozen_balances_innodb::{InnoError, Tally, error::ER_LOCK_DEADLOCK};
use futures_util::FutureExt;
use mysql_async::prelude::Queryable;

use crate::fixtures::{Db, Plan, T, alice_buy, deposit, deposit_request, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I4",
        "sixteen inserters of one business id: InnoDB deadlocks (1213), the bounded retry answers each once",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .connections(CLIENTS as u32 + 2)
}

const CLIENTS: usize = 16;

/// The case body; under [`Plan::Harmless`] the control's placements have no blocker
/// that rolls back, so the control must not see a deadlock.
///
/// Errors: SQL errors; the placements did not all wait.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let db = Db::open_named(&format!("i_i4_{plan:?}").to_lowercase()).await?;
    let mut conn = db.connect().await?;
    deposit(&mut conn, &deposit_request("dep-i401", "alice", Asset::Usdt, 20_000)).await?;
    let req = alice_buy("place-i401")?;
    let tally = Arc::new(Tally::default());
    let answers = sixteen(&db, &req, tally.clone(), true, true).await?;
    check_once(ctx, &answers, &tally);
    ctx.check_eq(
        "alice USDT: one freeze",
        "available=14995.000000 frozen=5005.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, &mut conn).await?;

    let naive_req = alice_buy("place-i402")?;
    let naive_tally = Arc::new(Tally::default());
    let naive = sixteen(&db, &naive_req, naive_tally, false, plan == Plan::Forced).await?;
    let deadlocked = naive
        .iter()
        .filter(|a| matches!(a, Err(e) if e.code() == Some(ER_LOCK_DEADLOCK)))
        .count();
    ctx.record("control_deadlock_errors", deadlocked.into());
    ctx.exposes(
        "without the retry, InnoDB's deadlock (1213) reaches callers of one business id",
        deadlocked > 0,
        format!("deadlocked_n={deadlocked}"),
    );
    Ok(())
}

/// Runs the sixteen placements of `req` (the product's, or without the retry when
/// `retry` is false). With `blocked`, a blocker session first registers the id
/// uncommitted; when all sixteen wait for it (observed), it rolls back.
async fn sixteen(
    db: &Db,
    req: &PlaceRequest,
    tally: Arc<Tally>,
    retry: bool,
    blocked: bool,
) -> anyhow::Result<Vec<Result<PlaceResult, InnoError>>> {
    let mut blocker = db.connect().await?;
    let mut observer = db.connect().await?;
    if blocked {
        blocker.query_drop("START TRANSACTION").await?;
        blocker
            .exec_drop(
                "INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, outcome) \
                 VALUES (?, ?, 'PLACE', 'an attempt that fails', '-', 'PENDING')",
                (T, &req.business_id),
            )
            .await?;
    }
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut conn = db.connect().await?;
        let (req, tally) = (req.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            if retry {
                frozen_balances_innodb::place(&mut conn, &req, &NoHooks, &tally).await
            } else {
                frozen_balances_innodb::naive::place_without_retry(
                    &mut conn, &req, &NoHooks, &tally,
                )
                .await
            }
        }));
    }
    if blocked {
        db.wait_for_lock_waiters(&mut observer, CLIENTS as i64)
            .await?;
        blocker.query_drop("ROLLBACK").await?;
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await?);
    }
    Ok(answers)
}

fn check_once(ctx: &mut Ctx, answers: &[Result<PlaceResult, InnoError>], tally: &Tally) {
    let errors: Vec<String> = answers
        .iter()
        .filter_map(|a| a.as_ref().err().map(ToString::to_string))
        .collect();
    ctx.check(
        "sixteen answers, none an error",
        answers.len() == CLIENTS && errors.is_empty(),
        format!("answers={} errors={errors:?}", answers.len()),
    );
    let ok: Vec<&PlaceResult> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    let executed = ok.iter().filter(|r| !r.replayed).count();
    let ids: std::collections::BTreeSet<Option<i64>> = ok.iter().map(|r| r.order_id).collect();
    ctx.check_eq(
        "one executed, fifteen replayed, one order id",
        "executed=1 replayed=15 order_ids=1".to_string(),
        format!(
            "executed={executed} replayed={} order_ids={}",
            ok.len() - executed,
            ids.len()
        ),
    );
    ctx.record("deadlocks_retried", tally.deadlocks().into());
    ctx.record("duplicate_keys_replayed", tally.duplicates().into());
    ctx.check(
        "InnoDB reported at least one deadlock (1213), each retried with the same business id",
        tally.deadlocks() >= 1,
        format!("deadlocks_n={}", tally.deadlocks()),
    );
}
