//! I12 — the reconciliation's reads and InnoDB's gap locks.
//! Claim: the product's reconciliation reads in a consistent snapshot (plain SELECTs),
//! which take no locks: a deposit to the account being reconciled completes while the
//! reconciliation's transaction is open, and the reconciliation keeps seeing its
//! snapshot. A locking read of the same rows under REPEATABLE READ (`LOCK IN SHARE
//! MODE`, as a "consistent" total is sometimes taken) sets next-key locks — the rows
//! and the gaps between them (MySQL reference manual, "InnoDB Locking", gap locks) — so
//! the deposit's INSERT of its movement into that range waits until the reading
//! transaction ends. PostgreSQL has no gap locks; its `FOR SHARE` locks rows only.
//! Setup: alice deposits 10 000 USDT. A transaction reads the sum of alice's USDT
//! movements — in a consistent snapshot (the product's way) — and stays open; a deposit
//! of 1 USDT to alice starts. Then the same with the locking read.
//! Checks: with the snapshot read, the deposit completes while the reading transaction is
//! open, and the open transaction still sums 10 000.
//! Negative control: with the locking read, the deposit waits for a lock (observed in
//! `INNODB_TRX`) until the reading transaction commits. Under [`Plan::Harmless`] the
//! second read is a plain one too, the deposit does not wait, and the control's check
//! must fail.
//! Fails if: the deposit waits behind the product's read, or not behind the locking one.

use case_kit::{Case, Ctx};
use frozen_balances::Asset;
use futures_util::FutureExt;
use mysql_async::prelude::Queryable;

use crate::fixtures::{Db, Plan, T, deposit, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I12",
        "reconciliation reads and gap locks: the snapshot read blocks no deposit, a locking read does",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .connections(4)
}

const SUM_SQL: &str = "SELECT CAST(COALESCE(SUM(available_delta), 0) AS SIGNED) FROM balance_movement \
                       WHERE tenant_id = ? AND account_id = 'alice' AND asset = 'USDT'";

/// The case body; under [`Plan::Harmless`] the second read does not lock, so the
/// control must not see the deposit wait.
///
/// Errors: SQL errors.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let db = Db::open_named(&format!("i_i12_{plan:?}").to_lowercase()).await?;
    let mut conn = db.connect().await?;
    deposit(&mut conn, "dep-i1201", "alice", Asset::Usdt, 10_000).await?;

    let mut reader = db.connect().await?;
    reader
        .query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        .await?;
    let sum: Option<i64> = reader.exec_first(SUM_SQL, (T,)).await?;
    let waited = deposit_while_open(&db, "dep-i1202").await?;
    let still: Option<i64> = reader.exec_first(SUM_SQL, (T,)).await?;
    reader.query_drop("COMMIT").await?;
    ctx.check(
        "with the snapshot read open, the deposit completes without waiting; the snapshot still sums 10000",
        !waited && sum == still && sum == Some(10_000_000_000),
        format!("waited={waited} sum_before={sum:?} sum_after={still:?}"),
    );

    let locking = plan == Plan::Forced;
    let sql = if locking {
        format!("{SUM_SQL} LOCK IN SHARE MODE")
    } else {
        SUM_SQL.to_string()
    };
    reader.query_drop("START TRANSACTION").await?;
    let _: Option<i64> = reader.exec_first(sql, (T,)).await?;
    let mut releasing = Some(reader);
    let waited = deposit_while_open_then(&db, "dep-i1203", &mut releasing).await?;
    ctx.exposes(
        "a locking read (LOCK IN SHARE MODE) of alice's movements makes the deposit wait (gap lock)",
        waited,
        format!("waited={waited}"),
    );
    ctx.check_eq(
        "alice USDT after both deposits",
        "available=10002.000000 frozen=0.000000".to_string(),
        line(&mut conn, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, &mut conn).await?;
    Ok(())
}

/// Deposits 1 USDT to alice under `business_id` while a reading transaction is open;
/// whether it waited for a lock (observed) instead of completing. A deposit that waits
/// is abandoned (its connection closed, its transaction rolled back).
async fn deposit_while_open(db: &Db, business_id: &str) -> anyhow::Result<bool> {
    deposit_while_open_then(db, business_id, &mut None).await
}

/// As [`deposit_while_open`]; with a `reader`, commits it (the reading transaction) and,
/// when the deposit waited, waits for the deposit to complete.
async fn deposit_while_open_then(
    db: &Db,
    business_id: &str,
    reader: &mut Option<mysql_async::Conn>,
) -> anyhow::Result<bool> {
    let mut depositor = db.connect().await?;
    // Its own observer: the observation is dropped mid-query when the deposit completes
    // first, which leaves that connection unusable.
    let mut observer = db.connect().await?;
    let id = business_id.to_string();
    let mut task =
        tokio::spawn(async move { deposit(&mut depositor, &id, "alice", Asset::Usdt, 1).await });
    let waited = tokio::select! {
        done = &mut task => {
            done??;
            false
        }
        seen = db.wait_for_lock_waiters(&mut observer, 1) => {
            seen?;
            true
        }
    };
    match reader.take() {
        Some(mut reader) => {
            reader.query_drop("COMMIT").await?;
            if waited {
                task.await??;
            }
        }
        None if waited => task.abort(),
        None => {}
    }
    Ok(waited)
}
