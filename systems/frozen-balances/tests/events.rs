//! The events of SPEC §8 against a real PostgreSQL 16 (scratch cluster): the F1, F2 and
//! F11 figures, replays of OK and refused events, payload mismatches, tenants, a race of
//! placements on too little, a hook abort between the balance update and the movements,
//! the reserve-share assertion, reconciliation finding tampering per asset, and a placement
//! on an asset the account holds no row of (refused, nothing created).

use std::sync::{Arc, Mutex, Weak};

use frozen_balances::amount::{format_units, parse_amount, parse_price, parse_quantity};
use frozen_balances::hooks::BoxFuture;
use frozen_balances::query::{balance, order};
use frozen_balances::{
    Asset, CancelRequest, DEFAULT_TENANT, DepositRequest, FillRequest, FrozenError, HookAbort,
    HookContext, HookPoint, Hooks, Market, NoHooks, OrderStatus, Outcome, PlaceRequest, SYS_FEE,
    Side, cancel, deposit, fill, place, reconcile,
};
use scratch_pg::{Cluster, ClusterOptions};
use tokio_postgres::Client;

const M: Market = Market::BtcUsdt;

fn cluster() -> Arc<Cluster> {
    static SHARED: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(cluster) = shared.upgrade() {
        return cluster;
    }
    let cluster =
        Arc::new(Cluster::start(ClusterOptions::default()).expect("start scratch PostgreSQL"));
    *shared = Arc::downgrade(&cluster);
    cluster
}

struct Db {
    cluster: Arc<Cluster>,
    name: String,
    client: Client,
}

impl Db {
    async fn new(name: &str) -> Db {
        let cluster = cluster();
        cluster.create_database(name, None).await.expect("create");
        let client = cluster.connect(name).await.expect("connect");
        frozen_balances::schema::install_and_seed(&client)
            .await
            .expect("install");
        Db {
            cluster,
            name: name.to_owned(),
            client,
        }
    }

    async fn connect(&self) -> Client {
        self.cluster.connect(&self.name).await.expect("connect")
    }

    async fn scalar(&self, sql: &str) -> i64 {
        self.client.query_one(sql, &[]).await.unwrap().get(0)
    }

    async fn text(&self, tenant: &str, account: &str, asset: Asset) -> String {
        let b = balance(&self.client, tenant, account, asset).await.unwrap();
        format!(
            "{} {}",
            format_units(asset, b.available),
            format_units(asset, b.frozen)
        )
    }
}

async fn fund(
    client: &mut Client,
    tenant: &str,
    id: &str,
    account: &str,
    asset: Asset,
    text: &str,
) {
    let req = DepositRequest {
        tenant_id: tenant.into(),
        business_id: id.into(),
        account_id: account.into(),
        asset,
        amount: parse_amount("amount", asset, text).unwrap(),
    };
    let result = deposit(client, &req, &NoHooks).await.unwrap();
    assert_eq!(result.outcome, Outcome::Ok);
}

fn order_req(
    tenant: &str,
    id: &str,
    account: &str,
    side: Side,
    qty: &str,
    price: &str,
) -> PlaceRequest {
    PlaceRequest {
        tenant_id: tenant.into(),
        business_id: id.into(),
        account_id: account.into(),
        market: M,
        side,
        quantity: parse_quantity(M, qty).unwrap(),
        limit_price: parse_price(M, price).unwrap(),
    }
}

fn fill_req(id: &str, buy: i64, sell: i64, qty: &str, price: &str) -> FillRequest {
    FillRequest {
        tenant_id: DEFAULT_TENANT.into(),
        fill_id: id.into(),
        buy_order_id: buy,
        sell_order_id: sell,
        quantity: parse_quantity(M, qty).unwrap(),
        price: parse_price(M, price).unwrap(),
    }
}

async fn assert_clean(client: &mut Client) {
    let findings = reconcile(client).await.unwrap();
    assert!(findings.is_clean(), "{:#?}", findings.lines());
}

/// SPEC §8 F1, and replays of every event of it.
#[tokio::test]
async fn f1_normal_path_with_price_improvement() {
    let db = Db::new("fb_f1").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-a", "alice", Asset::Usdt, "10000").await;
    fund(&mut c, t, "dep-b", "bob", Asset::Btc, "2").await;
    let buy = order_req(t, "place-a", "alice", Side::Buy, "1.0000", "5000.00");
    let placed = place(&mut c, &buy, &NoHooks).await.unwrap();
    assert_eq!(placed.outcome, Outcome::Ok);
    assert_eq!(
        db.text(t, "alice", Asset::Usdt).await,
        "4995.000000 5005.000000"
    );
    let sell = order_req(t, "place-b", "bob", Side::Sell, "1.0000", "4900.00");
    let sold = place(&mut c, &sell, &NoHooks).await.unwrap();
    assert_eq!(db.text(t, "bob", Asset::Btc).await, "1.00000000 1.00000000");
    let (b, s) = (placed.order_id.unwrap(), sold.order_id.unwrap());

    let first = fill(
        &mut c,
        &fill_req("fill-1", b, s, "0.4000", "4900"),
        &NoHooks,
    )
    .await
    .unwrap();
    assert_eq!(first.buyer_returned, 40_040_000);
    assert_eq!(first.seller_received, 1_958_040_000);
    assert_eq!(first.buy_status, Some(OrderStatus::Open));
    let last = fill(
        &mut c,
        &fill_req("fill-2", b, s, "0.6000", "4900"),
        &NoHooks,
    )
    .await
    .unwrap();
    assert_eq!(last.buyer_returned, 60_060_000);
    assert_eq!(last.buy_status, Some(OrderStatus::Filled));
    assert_eq!(last.sell_status, Some(OrderStatus::Filled));

    assert_eq!(
        db.text(t, "alice", Asset::Usdt).await,
        "5095.100000 0.000000"
    );
    assert_eq!(
        db.text(t, "alice", Asset::Btc).await,
        "1.00000000 0.00000000"
    );
    assert_eq!(db.text(t, "bob", Asset::Usdt).await, "4895.100000 0.000000");
    assert_eq!(db.text(t, "bob", Asset::Btc).await, "1.00000000 0.00000000");
    assert_eq!(db.text(t, SYS_FEE, Asset::Usdt).await, "9.800000 0.000000");

    // Replays: same results, nothing moves.
    let again = fill(
        &mut c,
        &fill_req("fill-1", b, s, "0.4000", "4900"),
        &NoHooks,
    )
    .await
    .unwrap();
    assert!(again.replayed);
    assert_eq!(FillResultCmp(&again), FillResultCmp(&first));
    let replaced = place(&mut c, &buy, &NoHooks).await.unwrap();
    assert!(replaced.replayed);
    assert_eq!(replaced.order_id, placed.order_id);
    assert_eq!(
        db.text(t, "alice", Asset::Usdt).await,
        "5095.100000 0.000000"
    );
    // A fill of a filled order: ORDER_CLOSED, recorded and replayed.
    let closed = fill(
        &mut c,
        &fill_req("fill-3", b, s, "0.1000", "4900"),
        &NoHooks,
    )
    .await
    .unwrap();
    assert_eq!(closed.outcome, Outcome::OrderClosed);
    let closed_again = fill(
        &mut c,
        &fill_req("fill-3", b, s, "0.1000", "4900"),
        &NoHooks,
    )
    .await
    .unwrap();
    assert!(closed_again.replayed);
    assert_eq!(closed_again.outcome, Outcome::OrderClosed);
    let findings = reconcile(&mut c).await.unwrap();
    assert!(findings.is_clean(), "{:#?}", findings.lines());
    assert_eq!(findings.totals_text(t), "BTC=0.00000000 USDT=0.000000");
}

/// Compares results without `replayed`.
#[derive(Debug)]
struct FillResultCmp<'a>(&'a frozen_balances::FillResult);

impl PartialEq for FillResultCmp<'_> {
    fn eq(&self, other: &Self) -> bool {
        let mut a = self.0.clone();
        let mut b = other.0.clone();
        a.replayed = false;
        b.replayed = false;
        a == b
    }
}

/// SPEC §8 F2: partial fill, cancel, cancel replayed; a second cancel id is ORDER_CLOSED.
#[tokio::test]
async fn f2_partial_fill_then_cancel() {
    let db = Db::new("fb_f2").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-a", "alice", Asset::Usdt, "10000").await;
    fund(&mut c, t, "dep-b", "bob", Asset::Btc, "2").await;
    let b = place(
        &mut c,
        &order_req(t, "p-a", "alice", Side::Buy, "1.0", "5000"),
        &NoHooks,
    )
    .await
    .unwrap()
    .order_id
    .unwrap();
    let s = place(
        &mut c,
        &order_req(t, "p-b", "bob", Side::Sell, "0.4", "5000"),
        &NoHooks,
    )
    .await
    .unwrap()
    .order_id
    .unwrap();
    fill(&mut c, &fill_req("f-1", b, s, "0.4", "5000"), &NoHooks)
        .await
        .unwrap();
    assert_eq!(
        db.text(t, "alice", Asset::Usdt).await,
        "4995.000000 3003.000000"
    );
    let req = CancelRequest {
        tenant_id: t.into(),
        business_id: "c-1".into(),
        account_id: "alice".into(),
        order_id: b,
    };
    let cancelled = cancel(&mut c, &req, &NoHooks).await.unwrap();
    assert_eq!(cancelled.released, 3_003_000_000);
    assert_eq!(
        db.text(t, "alice", Asset::Usdt).await,
        "7998.000000 0.000000"
    );
    assert_eq!(
        db.text(t, "alice", Asset::Btc).await,
        "0.40000000 0.00000000"
    );
    let again = cancel(&mut c, &req, &NoHooks).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.released, 3_003_000_000);
    assert_eq!(
        db.text(t, "alice", Asset::Usdt).await,
        "7998.000000 0.000000"
    );
    let other = CancelRequest {
        business_id: "c-2".into(),
        ..req.clone()
    };
    let closed = cancel(&mut c, &other, &NoHooks).await.unwrap();
    assert_eq!(closed.outcome, Outcome::OrderClosed);
    assert_eq!(closed.order_status, OrderStatus::Cancelled);
    // Another account's cancel of the order: no such order for it, nothing recorded.
    let before = db.scalar("SELECT count(*) FROM balance_operation").await;
    let foreign = CancelRequest {
        business_id: "c-3".into(),
        account_id: "bob".into(),
        ..req
    };
    assert!(matches!(
        cancel(&mut c, &foreign, &NoHooks).await,
        Err(FrozenError::NoOrder(_))
    ));
    assert_eq!(
        db.scalar("SELECT count(*) FROM balance_operation").await,
        before
    );
    assert_clean(&mut c).await;
}

/// SPEC §8 F11's sub-unit fees.
#[tokio::test]
async fn f11_sub_unit_fees() {
    let db = Db::new("fb_f11").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-a", "alice", Asset::Usdt, "10000").await;
    fund(&mut c, t, "dep-b", "bob", Asset::Btc, "2").await;
    let placed = place(
        &mut c,
        &order_req(t, "p-a", "alice", Side::Buy, "0.0002", "5000.05"),
        &NoHooks,
    )
    .await
    .unwrap();
    assert_eq!(placed.frozen_amount, 1_000_010 + 1_001);
    assert_eq!(placed.fee_reserve, 1_001);
    let b = placed.order_id.unwrap();
    let s = place(
        &mut c,
        &order_req(t, "p-b", "bob", Side::Sell, "0.0002", "5000.05"),
        &NoHooks,
    )
    .await
    .unwrap()
    .order_id
    .unwrap();
    for id in ["f-1", "f-2"] {
        let r = fill(&mut c, &fill_req(id, b, s, "0.0001", "5000.05"), &NoHooks)
            .await
            .unwrap();
        assert_eq!(r.outcome, Outcome::Ok);
        assert_eq!(r.buyer_fee, 500);
    }
    let alice = balance(&c, t, "alice", Asset::Usdt).await.unwrap();
    assert_eq!(alice.frozen, 0);
    assert_eq!(order(&c, t, b).await.unwrap().unwrap().remainder(), 0);
    assert_clean(&mut c).await;
}

/// INSUFFICIENT is recorded and replayed even after a deposit; a new id succeeds;
/// another payload under a used id is a mismatch and records nothing.
#[tokio::test]
async fn refused_placement_stays_refused_and_payload_mismatch() {
    let db = Db::new("fb_refused").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    let req = order_req(t, "p-1", "alice", Side::Buy, "1.0", "5000");
    let refused = place(&mut c, &req, &NoHooks).await.unwrap();
    assert_eq!(refused.outcome, Outcome::Insufficient);
    assert_eq!(refused.available, 0);
    fund(&mut c, t, "dep-a", "alice", Asset::Usdt, "10000").await;
    let replay = place(&mut c, &req, &NoHooks).await.unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.outcome, Outcome::Insufficient);
    let fresh = place(
        &mut c,
        &PlaceRequest {
            business_id: "p-2".into(),
            ..req.clone()
        },
        &NoHooks,
    )
    .await
    .unwrap();
    assert_eq!(fresh.outcome, Outcome::Ok);
    let before = db.scalar("SELECT count(*) FROM balance_operation").await;
    let other = PlaceRequest {
        quantity: parse_quantity(M, "2.0").unwrap(),
        business_id: "p-2".into(),
        ..req.clone()
    };
    assert!(matches!(
        place(&mut c, &other, &NoHooks).await,
        Err(FrozenError::PayloadMismatch { .. })
    ));
    // The same id for another kind of event is another payload too.
    let dep = DepositRequest {
        tenant_id: t.into(),
        business_id: "p-2".into(),
        account_id: "alice".into(),
        asset: Asset::Usdt,
        amount: 1,
    };
    assert!(matches!(
        deposit(&mut c, &dep, &NoHooks).await,
        Err(FrozenError::PayloadMismatch { .. })
    ));
    assert_eq!(
        db.scalar("SELECT count(*) FROM balance_operation").await,
        before
    );
    assert_clean(&mut c).await;
}

/// One business id under two tenants: two independent freezes.
#[tokio::test]
async fn business_ids_are_scoped_by_tenant() {
    let db = Db::new("fb_tenants").await;
    let mut c = db.connect().await;
    for tenant in [DEFAULT_TENANT, "tenant-b"] {
        fund(&mut c, tenant, "dep-1", "alice", Asset::Usdt, "10000").await;
        let r = place(
            &mut c,
            &order_req(tenant, "same-id", "alice", Side::Buy, "1.0", "5000"),
            &NoHooks,
        )
        .await
        .unwrap();
        assert_eq!(r.outcome, Outcome::Ok);
        assert!(!r.replayed);
        assert_eq!(
            db.text(tenant, "alice", Asset::Usdt).await,
            "4995.000000 5005.000000"
        );
    }
    assert_clean(&mut c).await;
}

/// 32 placements of 5005 on 6000 from 32 connections at once: exactly one freezes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_placements_on_too_little() {
    let db = Db::new("fb_race").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-a", "alice", Asset::Usdt, "6000").await;
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let mut client = db.connect().await;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let req = order_req(t, &format!("p-{i}"), "alice", Side::Buy, "1.0", "5000");
            place(&mut client, &req, &NoHooks).await.unwrap().outcome
        }));
    }
    let mut ok = 0;
    for task in tasks {
        if task.await.unwrap() == Outcome::Ok {
            ok += 1;
        }
    }
    assert_eq!(ok, 1);
    assert_eq!(
        db.text(t, "alice", Asset::Usdt).await,
        "995.000000 5005.000000"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM balance_operation WHERE outcome = 'INSUFFICIENT'")
            .await,
        31
    );
    assert_clean(&mut c).await;
}

/// Aborts at one point.
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

/// A failure between the balance update and the movements rolls everything back; the
/// same id then succeeds once. At after-commit the event stays committed.
#[tokio::test]
async fn abort_after_balances_updated_rolls_back_everything() {
    let db = Db::new("fb_abort").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-a", "alice", Asset::Usdt, "10000").await;
    let req = order_req(t, "p-1", "alice", Side::Buy, "1.0", "5000");
    for point in [
        HookPoint::Registered,
        HookPoint::BalancesUpdated,
        HookPoint::BeforeCommit,
    ] {
        assert!(matches!(
            place(&mut c, &req, &AbortAt(point)).await,
            Err(FrozenError::HookAborted(p)) if p == point
        ));
        assert_eq!(
            db.text(t, "alice", Asset::Usdt).await,
            "10000.000000 0.000000"
        );
        assert_eq!(
            db.scalar("SELECT count(*) FROM balance_operation WHERE business_id = 'p-1'")
                .await,
            0
        );
        assert_eq!(db.scalar("SELECT count(*) FROM spot_order").await, 0);
    }
    assert!(matches!(
        place(&mut c, &req, &AbortAt(HookPoint::AfterCommit)).await,
        Err(FrozenError::HookAborted(HookPoint::AfterCommit))
    ));
    let replay = place(&mut c, &req, &NoHooks).await.unwrap();
    assert!(replay.replayed);
    assert_eq!(
        db.text(t, "alice", Asset::Usdt).await,
        "4995.000000 5005.000000"
    );
    assert_clean(&mut c).await;
}

/// A reserve corrupted behind the product's back is caught by the assertion: the fill is
/// refused as a bug, nothing moves, frozen never goes negative.
#[tokio::test]
async fn reserve_share_assertion_refuses_a_corrupted_order() {
    let db = Db::new("fb_assert").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-a", "alice", Asset::Usdt, "10000").await;
    fund(&mut c, t, "dep-b", "bob", Asset::Btc, "2").await;
    let b = place(
        &mut c,
        &order_req(t, "p-a", "alice", Side::Buy, "0.0002", "5000.05"),
        &NoHooks,
    )
    .await
    .unwrap()
    .order_id
    .unwrap();
    let s = place(
        &mut c,
        &order_req(t, "p-b", "bob", Side::Sell, "0.0002", "5000.05"),
        &NoHooks,
    )
    .await
    .unwrap()
    .order_id
    .unwrap();
    db.client
        .execute(
            "UPDATE spot_order SET fee_reserve = 0 WHERE order_id = $1",
            &[&b],
        )
        .await
        .unwrap();
    let error = fill(
        &mut c,
        &fill_req("f-1", b, s, "0.0001", "5000.05"),
        &NoHooks,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, FrozenError::InvariantViolated(_)),
        "{error}"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM balance_operation WHERE business_id = 'f-1'")
            .await,
        0
    );
    assert_eq!(db.scalar("SELECT min(frozen) FROM balance").await, 0);
}

/// Tamper −1 unit of bob's BTC, +1 unit of his USDT: a cross-asset sum would still be 0;
/// the per-asset checks name both rows and both assets.
#[tokio::test]
async fn cross_asset_tamper_is_named_per_asset() {
    let db = Db::new("fb_tamper").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-b", "bob", Asset::Btc, "2").await;
    fund(&mut c, t, "dep-c", "bob", Asset::Usdt, "10").await;
    assert_clean(&mut c).await;
    db.client
        .batch_execute(
            "UPDATE balance SET available = available - 1 WHERE account_id = 'bob' AND asset = 'BTC';
             UPDATE balance SET available = available + 1 WHERE account_id = 'bob' AND asset = 'USDT';",
        )
        .await
        .unwrap();
    let cross: i64 = db
        .scalar("SELECT SUM(available + frozen)::bigint FROM balance")
        .await;
    assert_eq!(cross, 0, "the cross-asset sum hides the tamper");
    let findings = reconcile(&mut c).await.unwrap();
    assert_eq!(findings.row_mismatches.len(), 2, "{:#?}", findings.lines());
    let unbalanced: Vec<String> = findings
        .unbalanced_assets()
        .iter()
        .map(|a| format!("{} {}", a.asset, a.total))
        .collect();
    assert_eq!(unbalanced, vec!["BTC -1", "USDT 1"]);
    assert_eq!(findings.count(), 4);
}

/// Counts how often each event passes `registered` (one per attempt).
#[derive(Default)]
struct CountAttempts(std::sync::atomic::AtomicU32);

impl Hooks for CountAttempts {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        if ctx.point == HookPoint::Registered {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

/// How long the fill's session waits before it checks for a deadlock (PostgreSQL's
/// `deadlock_timeout`, default 1 s), long enough for the outsider to start waiting.
const FILL_DEADLOCK_TIMEOUT: &str = "3s";

/// A deadlock with a writer outside the product (it holds sys-fee's row, then asks for
/// alice's, which the fill already holds): PostgreSQL aborts the fill with 40P01 (the
/// writer's own deadlock check is set to come later), the fill retries under the same
/// business id and settles once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_is_retried_with_the_same_business_id() {
    let db = Db::new("fb_deadlock").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-a", "alice", Asset::Usdt, "10000").await;
    fund(&mut c, t, "dep-b", "bob", Asset::Btc, "2").await;
    let b = place(
        &mut c,
        &order_req(t, "p-a", "alice", Side::Buy, "1.0", "5000"),
        &NoHooks,
    )
    .await
    .unwrap()
    .order_id
    .unwrap();
    let s = place(
        &mut c,
        &order_req(t, "p-b", "bob", Side::Sell, "1.0", "5000"),
        &NoHooks,
    )
    .await
    .unwrap()
    .order_id
    .unwrap();

    // The fill's session checks for a deadlock only after FILL_DEADLOCK_TIMEOUT, by
    // when the outsider surely waits too (a check that finds no cycle yet is not
    // repeated); the outsider's own check comes much later. So the fill is the victim.
    db.client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET deadlock_timeout = '{FILL_DEADLOCK_TIMEOUT}'",
            db.name
        ))
        .await
        .unwrap();
    let mut outsider = db.connect().await;
    let x = outsider.transaction().await.unwrap();
    x.batch_execute(
        "SET LOCAL deadlock_timeout = '60s';
         SELECT 1 FROM balance WHERE account_id = 'sys-fee' AND asset = 'USDT' FOR UPDATE;",
    )
    .await
    .unwrap();
    let hooks = Arc::new(CountAttempts::default());
    let fill_hooks = hooks.clone();
    let mut fill_client = db.connect().await;
    let settling = tokio::spawn(async move {
        let req = fill_req("f-1", b, s, "1.0", "5000");
        fill(&mut fill_client, &req, fill_hooks.as_ref()).await
    });
    // Wait until the fill waits for sys-fee's row (it took alice's and bob's first).
    let watcher = db.connect().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = $1",
                &[&db.name],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the fill never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The outsider now asks for alice's USDT row: a cycle. It changes nothing.
    x.execute(
        "UPDATE balance SET version = version WHERE account_id = 'alice' AND asset = 'USDT'",
        &[],
    )
    .await
    .expect("the outsider was not the deadlock victim");
    x.commit().await.unwrap();
    let settled = settling.await.unwrap().unwrap();
    assert_eq!(settled.outcome, Outcome::Ok);
    assert!(!settled.replayed);
    // At least one retry. Under load there can be two: after the first rollback the
    // retry may lock alice's row again before the outsider, woken up, takes it, and the
    // same cycle forms once more. Either way the retries are bounded and the fill
    // settles once.
    let attempts = hooks.0.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (2..=frozen_balances::events::MAX_DEADLOCK_ATTEMPTS).contains(&attempts),
        "expected a bounded retry, saw {attempts} attempts"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM balance_operation WHERE business_id = 'f-1'")
            .await,
        1
    );
    assert_eq!(
        db.text(t, "alice", Asset::Btc).await,
        "1.00000000 0.00000000"
    );
    assert_clean(&mut c).await;
}

/// A placement freezing an asset the account holds no row of is refused before anything
/// is created (F23): no balance row, no operation, and the id stays free; with the row
/// there, the same id places.
#[tokio::test]
async fn placement_without_a_row_of_its_asset_creates_nothing() {
    let db = Db::new("fb_no_balance").await;
    let mut c = db.connect().await;
    let t = DEFAULT_TENANT;
    fund(&mut c, t, "dep-o", "oscar", Asset::Btc, "1").await;
    let req = order_req(t, "p-o", "oscar", Side::Buy, "0.1", "5000");
    assert!(matches!(
        place(&mut c, &req, &NoHooks).await,
        Err(FrozenError::NoBalance {
            asset: Asset::Usdt,
            ..
        })
    ));
    let rows = "SELECT count(*) FROM balance WHERE account_id = 'oscar'";
    assert_eq!(db.scalar(rows).await, 1);
    let ops = "SELECT count(*) FROM balance_operation WHERE business_id = 'p-o'";
    assert_eq!(db.scalar(ops).await, 0);
    fund(&mut c, t, "dep-o2", "oscar", Asset::Usdt, "1000").await;
    let placed = place(&mut c, &req, &NoHooks).await.unwrap();
    assert_eq!(placed.outcome, Outcome::Ok);
    assert_clean(&mut c).await;
}
