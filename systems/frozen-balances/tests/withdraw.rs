//! Withdrawals and network deposits against a real PostgreSQL 16 (scratch cluster):
//! a request is one transaction (an abort before COMMIT leaves nothing), a settlement
//! happens once (a second replays, another outcome is refused), the
//! transitions the network cannot cause are refused, a release returns the amount, and
//! reconciliation counts pending withdrawals as frozen and names one settled behind the
//! product's back; a deposit is credited once at the required confirmations.

use frozen_balances::hooks::BoxFuture;
use frozen_balances::withdraw::{
    self, DepositReport, ReportEffect, SYS_WITHDRAWAL, Status, WithdrawRequest,
};
use frozen_balances::{
    Asset, DEFAULT_TENANT, DepositRequest, FrozenError, HookAbort, HookContext, HookPoint, Hooks,
    NoHooks, Outcome,
};
use scratch_pg::{Cluster, ClusterOptions};
use tokio_postgres::Client;

const T: &str = DEFAULT_TENANT;

async fn frozen(client: &Client, account: &str) -> (i64, i64) {
    let b = frozen_balances::query::balance(client, T, account, Asset::Btc)
        .await
        .unwrap();
    (b.available, b.frozen)
}

fn request(id: &str, amount: i64) -> WithdrawRequest {
    WithdrawRequest {
        tenant_id: T.into(),
        withdrawal_id: id.into(),
        account_id: "bob".into(),
        asset: Asset::Btc,
        amount,
        destination: "addr".into(),
    }
}

/// Aborts every event at one hook point.
struct AbortAt(HookPoint);

impl Hooks for AbortAt {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        let result = if ctx.point == self.0 {
            Err(HookAbort::new("test"))
        } else {
            Ok(())
        };
        Box::pin(std::future::ready(result))
    }
}

async fn count(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_once_reconcile_and_credit_once() {
    let cluster = Cluster::start(ClusterOptions::default()).expect("start scratch PostgreSQL");
    cluster.create_database("withdraw", None).await.unwrap();
    let mut db = cluster.connect("withdraw").await.unwrap();
    frozen_balances::schema::install_and_seed(&db)
        .await
        .unwrap();
    let deposit = DepositRequest {
        tenant_id: T.into(),
        business_id: "dep-1".into(),
        account_id: "bob".into(),
        asset: Asset::Btc,
        amount: 1_000,
    };
    frozen_balances::deposit(&mut db, &deposit, &NoHooks)
        .await
        .unwrap();

    // One transaction: a failure just before COMMIT leaves no freeze, no record, no
    // outbox event and no operation; the same id then succeeds.
    for point in [HookPoint::BalancesUpdated, HookPoint::BeforeCommit] {
        assert!(matches!(
            withdraw::request(&mut db, &request("w-1", 300), &AbortAt(point)).await,
            Err(FrozenError::HookAborted(p)) if p == point
        ));
        assert_eq!(frozen(&db, "bob").await, (1_000, 0));
        for table in ["withdrawal", "withdrawal_outbox", "withdrawal_history"] {
            let sql = format!("SELECT count(*) FROM {table}");
            assert_eq!(
                count(&db, &sql).await,
                0,
                "{table} after an abort at {point}"
            );
        }
        let sql = "SELECT count(*) FROM balance_operation WHERE business_id = 'w-1'";
        assert_eq!(count(&db, sql).await, 0);
    }
    let first = withdraw::request(&mut db, &request("w-1", 300), &NoHooks)
        .await
        .unwrap();
    assert_eq!(first.outcome, Outcome::Ok);
    assert_eq!(frozen(&db, "bob").await, (700, 300));
    assert!(
        frozen_balances::reconcile(&mut db)
            .await
            .unwrap()
            .is_clean()
    );
    // Another payload under the same id: refused.
    assert!(matches!(
        withdraw::request(&mut db, &request("w-1", 301), &NoHooks).await,
        Err(FrozenError::PayloadMismatch { .. })
    ));
    // CONFIRMED straight from REQUESTED: no answer of the network gives that.
    assert!(matches!(
        withdraw::settle(&mut db, T, "w-1", Status::Confirmed, "x", &NoHooks).await,
        Err(FrozenError::Invalid(_))
    ));
    assert!(
        withdraw::mark(
            &mut db,
            T,
            "w-1",
            &[Status::Requested],
            Status::Unknown,
            "lost"
        )
        .await
        .unwrap()
    );
    let settled = withdraw::settle(&mut db, T, "w-1", Status::Confirmed, "ok", &NoHooks)
        .await
        .unwrap();
    assert_eq!((settled.consumed, settled.replayed), (300, false));
    let again = withdraw::settle(&mut db, T, "w-1", Status::Confirmed, "ok", &NoHooks)
        .await
        .unwrap();
    assert!(again.replayed);
    assert!(matches!(
        withdraw::settle(&mut db, T, "w-1", Status::Rejected, "no", &NoHooks).await,
        Err(FrozenError::PayloadMismatch { .. })
    ));
    assert_eq!(frozen(&db, "bob").await, (700, 0));
    assert_eq!(frozen(&db, SYS_WITHDRAWAL).await, (300, 0));
    assert!(withdraw::pending(&db).await.unwrap().is_empty());

    // A refused broadcast releases.
    withdraw::request(&mut db, &request("w-2", 200), &NoHooks)
        .await
        .unwrap();
    let failed = withdraw::settle(&mut db, T, "w-2", Status::Failed, "refused", &NoHooks)
        .await
        .unwrap();
    assert_eq!(failed.released, 200);
    assert_eq!(frozen(&db, "bob").await, (700, 0));
    let history: Vec<Status> = withdraw::history(&db, T, "w-1")
        .await
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(
        history,
        vec![Status::Requested, Status::Unknown, Status::Confirmed]
    );
    assert!(
        frozen_balances::reconcile(&mut db)
            .await
            .unwrap()
            .is_clean()
    );

    // A pending withdrawal settled behind the product's back: named.
    withdraw::request(&mut db, &request("w-3", 100), &NoHooks)
        .await
        .unwrap();
    db.batch_execute("UPDATE withdrawal SET status = 'CONFIRMED' WHERE withdrawal_id = 'w-3'")
        .await
        .unwrap();
    let found = frozen_balances::reconcile(&mut db).await.unwrap();
    assert_eq!(found.frozen_mismatches.len(), 1, "{:?}", found.lines());
    assert_eq!(found.frozen_mismatches[0].frozen, 100);
    assert_eq!(found.frozen_mismatches[0].pending_withdrawals, 0);
    db.batch_execute("UPDATE withdrawal SET status = 'REQUESTED' WHERE withdrawal_id = 'w-3'")
        .await
        .unwrap();

    // Deposits: credited once at 2 confirmations.
    let report = |confirmations, dropped| DepositReport {
        tenant_id: T.into(),
        tx_id: "tx-1".into(),
        account_id: "carol".into(),
        asset: Asset::Btc,
        amount: 50,
        confirmations,
        dropped,
    };
    let mut effects = Vec::new();
    for (confirmations, dropped) in [(1, false), (2, false), (2, false), (3, true)] {
        effects.push(
            withdraw::report_deposit(&mut db, &report(confirmations, dropped), 2)
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        effects,
        vec![
            ReportEffect::Seen,
            ReportEffect::Credited,
            ReportEffect::AlreadyCredited,
            ReportEffect::Reversed
        ]
    );
    // The drop after the credit reversed it: carol had it all available, so no
    // shortfall (F25).
    assert_eq!(frozen(&db, "carol").await, (0, 0));
    let mut other = report(1, false);
    other.amount = 51;
    assert!(matches!(
        withdraw::report_deposit(&mut db, &other, 2).await,
        Err(FrozenError::Invalid(_))
    ));
    assert!(
        frozen_balances::reconcile(&mut db)
            .await
            .unwrap()
            .is_clean()
    );
}
