//! What the part-2 F cases share: the library's events with short names, a hook that
//! holds one kind of event at one point until the case lets it go, a wait for a backend
//! that is blocked on a lock, and the open-orders invariant checked after every clean
//! case.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use case_kit::Ctx;
use frozen_balances::amount::{parse_price, parse_quantity};
use frozen_balances::{
    Asset, CancelRequest, CancelResult, DEFAULT_TENANT, DepositRequest, EventKind, FillRequest,
    FillResult, FrozenError, HookAbort, HookContext, HookPoint, Hooks, Market, NoHooks,
    PlaceRequest, PlaceResult, Side,
};
use futures_util::future::BoxFuture;
use tokio::sync::Notify;

/// The tenant every F case uses.
pub const T: &str = DEFAULT_TENANT;
/// How long [`wait_for_lock_waiters`] looks before it gives up, milliseconds.
pub const LOCK_WAIT_MAX_MS: u64 = 10_000;

/// Deposits `coins` whole coins of `asset` to `account` from `sys-deposit`.
///
/// Errors: the library's.
pub async fn deposit(
    db: &mut tokio_postgres::Client,
    business_id: &str,
    account: &str,
    asset: Asset,
    coins: i64,
) -> anyhow::Result<()> {
    frozen_balances::deposit(
        db,
        &deposit_request(business_id, account, asset, coins),
        &NoHooks,
    )
    .await?;
    Ok(())
}

/// The deposit of `coins` whole coins of `asset` to `account` from `sys-deposit` under
/// `business_id`, for the default tenant.
pub fn deposit_request(
    business_id: &str,
    account: &str,
    asset: Asset,
    coins: i64,
) -> DepositRequest {
    DepositRequest {
        tenant_id: T.into(),
        business_id: business_id.into(),
        account_id: account.into(),
        asset,
        amount: coins * asset.units_per_coin(),
    }
}

/// A placement request of `side` on `market`, quantity and limit as decimal text.
///
/// Errors: text that is no quantity or price of the market.
pub fn order(
    business_id: &str,
    account: &str,
    market: Market,
    side: Side,
    quantity: &str,
    price: &str,
) -> anyhow::Result<PlaceRequest> {
    Ok(PlaceRequest {
        tenant_id: T.into(),
        business_id: business_id.into(),
        account_id: account.into(),
        market,
        side,
        quantity: parse_quantity(market, quantity)?,
        limit_price: parse_price(market, price)?,
    })
}

/// Places `req` without hooks.
///
/// Errors: the library's.
pub async fn place(
    db: &mut tokio_postgres::Client,
    req: &PlaceRequest,
) -> Result<PlaceResult, FrozenError> {
    frozen_balances::place(db, req, &NoHooks).await
}

/// The id of an order that must have been placed.
///
/// Errors: the placement failed or was refused.
pub async fn placed(db: &mut tokio_postgres::Client, req: &PlaceRequest) -> anyhow::Result<i64> {
    let result = place(db, req).await?;
    result
        .order_id
        .ok_or_else(|| anyhow::anyhow!("{} was refused: {:?}", req.business_id, result.outcome))
}

/// A fill request on BTC-USDT, quantity and price as decimal text.
///
/// Errors: text that is no quantity or price of BTC-USDT.
pub fn fill_request(
    fill_id: &str,
    buy: i64,
    sell: i64,
    quantity: &str,
    price: &str,
) -> anyhow::Result<FillRequest> {
    Ok(FillRequest {
        tenant_id: T.into(),
        fill_id: fill_id.into(),
        buy_order_id: buy,
        sell_order_id: sell,
        quantity: parse_quantity(Market::BtcUsdt, quantity)?,
        price: parse_price(Market::BtcUsdt, price)?,
    })
}

/// Settles `req` with `hooks`.
///
/// Errors: the library's.
pub async fn fill(
    db: &mut tokio_postgres::Client,
    req: &FillRequest,
    hooks: &dyn Hooks,
) -> Result<FillResult, FrozenError> {
    frozen_balances::fill(db, req, hooks).await
}

/// Cancels `order` of `account` under `business_id` with `hooks`.
///
/// Errors: the library's.
pub async fn cancel(
    db: &mut tokio_postgres::Client,
    business_id: &str,
    account: &str,
    order: i64,
    hooks: &dyn Hooks,
) -> Result<CancelResult, FrozenError> {
    frozen_balances::cancel(db, &cancel_request(business_id, account, order), hooks).await
}

/// The cancel of `order` of `account` under `business_id`, for the default tenant.
pub fn cancel_request(business_id: &str, account: &str, order: i64) -> CancelRequest {
    CancelRequest {
        tenant_id: T.into(),
        business_id: business_id.into(),
        account_id: account.into(),
        order_id: order,
    }
}

/// A hook that holds the first event of `kind` passing `point` until [`Gate::release`],
/// and tells the case when it got there ([`Gate::reached`]). Every other event and point
/// passes straight through. One-shot.
pub struct Gate {
    kind: EventKind,
    point: HookPoint,
    armed: AtomicBool,
    arrived: Notify,
    go: Notify,
}

impl Gate {
    /// A gate for `kind` at `point`.
    pub fn new(kind: EventKind, point: HookPoint) -> Gate {
        Gate {
            kind,
            point,
            armed: AtomicBool::new(true),
            arrived: Notify::new(),
            go: Notify::new(),
        }
    }

    /// The kind of event it holds.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// Waits until the held event has reached the point (at once if it already has).
    pub async fn reached(&self) {
        self.arrived.notified().await;
    }

    /// Lets the held event go on (also if it arrives later).
    pub fn release(&self) {
        self.go.notify_one();
    }
}

impl Hooks for Gate {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(async move {
            if ctx.event == self.kind
                && ctx.point == self.point
                && self.armed.swap(false, Ordering::SeqCst)
            {
                self.arrived.notify_one();
                self.go.notified().await;
            }
            Ok(())
        })
    }
}

/// A hook that aborts every event of `kind` at `point` (a failure between two steps).
pub struct FailAt {
    /// The kind that fails.
    pub kind: EventKind,
    /// Where.
    pub point: HookPoint,
}

impl Hooks for FailAt {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        let fail = ctx.event == self.kind && ctx.point == self.point;
        Box::pin(std::future::ready(if fail {
            Err(HookAbort::new(format!(
                "injected failure at {}",
                self.point
            )))
        } else {
            Ok(())
        }))
    }
}

/// A hook that counts the attempts of each business id (each attempt of an event passes
/// `registered` once, so attempts − 1 = retries).
#[derive(Default)]
pub struct CountAttempts {
    seen: Mutex<std::collections::BTreeMap<String, u32>>,
}

impl CountAttempts {
    /// Attempts per business id, sorted by id.
    pub fn attempts(&self) -> std::collections::BTreeMap<String, u32> {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl Hooks for CountAttempts {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        if ctx.point == HookPoint::Registered {
            *self
                .seen
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .entry(ctx.business_id.to_owned())
                .or_default() += 1;
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Waits until at least `n` backends of this database wait for a lock
/// ([`case_kit::locks::wait_for_lock_waiters`]): the moment a second event is known to be
/// blocked behind one a gate holds. Looks at most [`LOCK_WAIT_MAX_MS`].
///
/// Errors: database errors; nobody blocked in time.
pub async fn wait_for_lock_waiters(db: &tokio_postgres::Client, n: i64) -> anyhow::Result<()> {
    let waiting =
        case_kit::locks::wait_for_lock_waiters(db, n, Duration::from_millis(LOCK_WAIT_MAX_MS))
            .await?;
    anyhow::ensure!(
        waiting >= n,
        "fewer than {n} backends blocked on a lock after {LOCK_WAIT_MAX_MS} ms (at most {waiting})"
    );
    Ok(())
}

/// Name of the invariant check.
pub const INVARIANT: &str = "invariant: every account's frozen equals the remainders of its \
     open orders, and a closed order holds nothing";

/// Checks [`INVARIANT`] on the case's database (the complaint of users who saw "funds
/// frozen but no open orders"), and that the reconciliation is clean. Returns whether
/// both held.
///
/// Errors: database errors.
pub async fn invariant(ctx: &mut Ctx, db: &mut tokio_postgres::Client) -> anyhow::Result<bool> {
    let findings = frozen_balances::reconcile(db).await?;
    Ok(check_findings(ctx, &findings))
}

/// Checks [`INVARIANT`] and a clean reconciliation on `findings`, however they were
/// read (PostgreSQL here, InnoDB in the I cases). Returns whether both held.
pub fn check_findings(ctx: &mut Ctx, findings: &frozen_balances::Findings) -> bool {
    let held = ctx.check(
        INVARIANT,
        findings.frozen_mismatches.is_empty() && findings.closed_with_remainder.is_empty(),
        format!(
            "frozen_mismatches={} closed_with_remainder={}",
            findings.frozen_mismatches.len(),
            findings.closed_with_remainder.len()
        ),
    );
    let clean = ctx.check(
        "reconciliation clean",
        findings.is_clean(),
        findings.summary(),
    );
    held && clean
}

/// How a negative control runs: with the fault forced (what `./run.sh` does), or under
/// a plan where the fault cannot happen, so that its `negative control exposes` check
/// must FAIL (what `cases/innodb/tests/innodb_controls.rs` shows for I4; F's controls
/// are spec files run with their fault taken out, `cases/frozen/tests/frozen_controls.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The window is forced open (barrier, hook point or injected failure).
    Forced,
    /// The same naive code where the fault cannot happen.
    Harmless,
}
