//! R1 on the frozen balances' spot routes (SPEC §8, `ledger-svc`'s `/spot/…`) through the
//! pooler: the same service flags, the spot tables installed in the ledger's database
//! (no table is shared with the ledger), the service's pool of [`CLIENTS`] over the
//! pooler's [`POOLER_POOL_SIZE`] server sessions. Claims:
//! - a placement race (the L3 race's twin, as F's conditional freeze): carol holds 7007
//!   USDT and 32 BUY 0.1 @ 5000 orders (500.5 frozen each, the fee reserve included) are
//!   sent at once while a holder straight to PostgreSQL locks her USDT balance row,
//!   until all four pooled server sessions are seen waiting on a lock (the other 28
//!   queue in the pooler): 14 OK, 18 INSUFFICIENT, 0 available and 7007 frozen;
//! - one business id at once (F4): 16 identical placements for dave, held the same way:
//!   one executed, 15 replayed with one body, one operation, one order, frozen once;
//! - a lost placement response (F7): the fault `spot-after-commit` pauses the committed
//!   answer, the client gives up once it is seen held, the same-id retry replays the
//!   order the first attempt created; frozen once.
//!
//! The frozen balances reconcile after (per asset, `frozen_balances::reconcile`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cases_frozen::spot::{SpotCalls, SpotReply, balance_line, spot_service};
use frozen_balances::{Asset, DEFAULT_TENANT};
use launch::lost::give_up_once_held;
use launch::service::{Reply, Service};
use scratch_pg::Cluster;
use scratch_pg::bouncer::Bouncer;
use serde_json::json;

use crate::pair::LEDGER_DATABASE;
use crate::pooled::{
    self, CLIENTS, POOLER_POOL_SIZE, Pending, SERVICE_BOUND_MS, count, held_at_once,
};
use case_kit::Ctx;

/// The row lock on one balance (tenant, account, asset).
const BALANCE_LOCK_SQL: &str = "SELECT 1 FROM balance \
     WHERE tenant_id = $1 AND account_id = $2 AND asset = $3 FOR UPDATE";
/// The fault point of the lost response.
const AFTER_COMMIT: &str = "spot-after-commit";
/// carol's USDT before the race: room for exactly 14 freezes of 500.5.
const RACE_DEPOSIT: &str = "7007";
/// Deposits of dave and erin: room for one BUY 1.0 @ 5000 (5005 frozen) and more.
const DEPOSIT: &str = "10000";
const SAME_ID_REQUESTS: usize = 16;
/// A balance line after one BUY 1.0 @ 5000 from [`DEPOSIT`].
const FROZEN_ONCE: &str = "available=4995.000000 frozen=5005.000000";

/// The three claims on the spot routes, then the reconciliation.
///
/// Errors: the schema could not be installed; the service did not start or stop; SQL,
/// transport or fault-route errors.
pub async fn through_spot(
    ctx: &mut Ctx,
    primary: &Cluster,
    bouncer: &Bouncer,
) -> anyhow::Result<()> {
    let db = primary.connect(LEDGER_DATABASE).await?;
    frozen_balances::schema::install_and_seed(&db).await?;
    let options = spot_service(pooled::service_options(true, &[]));
    let service = pooled::launch(ctx, bouncer, options, "ledger-svc-spot").await?;
    let t = DEFAULT_TENANT;
    service
        .deposit(t, "dep-r1-carol", "carol", "USDT", RACE_DEPOSIT)
        .await?;
    for account in ["dave", "erin"] {
        let id = format!("dep-r1-{account}");
        service.deposit(t, &id, account, "USDT", DEPOSIT).await?;
    }
    race(ctx, primary, &service, &db).await?;
    same_id(ctx, primary, &service, &db).await?;
    lost_response(ctx, &service, &db).await?;
    let mut client = primary.connect(LEDGER_DATABASE).await?;
    let findings = frozen_balances::reconcile(&mut client).await?;
    ctx.check(
        "spot: the frozen balances reconcile clean",
        findings.is_clean(),
        findings.summary(),
    );
    pooled::stop(ctx, service).await
}

/// A placement for `account` under `business_id`, spawned.
fn place(
    service: &Arc<Service>,
    business_id: String,
    account: &str,
    quantity: &'static str,
) -> Pending {
    let (service, account) = (service.clone(), account.to_owned());
    tokio::spawn(async move {
        let timeout = Duration::from_millis(SERVICE_BOUND_MS);
        service
            .place(
                DEFAULT_TENANT,
                &business_id,
                &account,
                "BUY",
                quantity,
                "5000",
                timeout,
            )
            .await
    })
}

/// Sends what `send` spawns while `account`'s USDT row is locked (see
/// [`held_at_once`]).
async fn held_on_usdt(
    primary: &Cluster,
    account: &str,
    send: impl FnOnce() -> Vec<Pending>,
) -> anyhow::Result<(Vec<Reply>, usize)> {
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
        [&DEFAULT_TENANT, &account, &"USDT"];
    held_at_once(primary, BALANCE_LOCK_SQL, &params, send).await
}

/// Orders of `account` in the default tenant.
async fn orders_of(db: &tokio_postgres::Client, account: &str) -> anyhow::Result<i64> {
    Ok(db
        .query_one(
            "SELECT count(*) FROM spot_order WHERE tenant_id = $1 AND account_id = $2",
            &[&DEFAULT_TENANT, &account],
        )
        .await?
        .get(0))
}

/// The placement race: [`CLIENTS`] BUY 0.1 @ 5000 from carol's 7007 USDT at once.
async fn race(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let (replies, waiting) = held_on_usdt(primary, "carol", || {
        (0..CLIENTS)
            .map(|c| place(service, format!("r1-place-race-{c:02}"), "carol", "0.1"))
            .collect()
    })
    .await?;
    let (ok, insufficient) = (
        count(&replies, "201 OK"),
        count(&replies, "409 INSUFFICIENT"),
    );
    ctx.check_eq(
        "spot: race: server sessions seen waiting on the holder's lock",
        POOLER_POOL_SIZE as usize,
        waiting,
    );
    ctx.check_eq(
        "spot: race: 32 BUY 0.1 @ 5000 from 7007 USDT → OK, INSUFFICIENT, other",
        format!("{:?}", (14, 18, 0)),
        format!("{:?}", (ok, insufficient, CLIENTS - ok - insufficient)),
    );
    ctx.check_eq(
        "spot: race: carol's USDT after, her orders",
        format!("{:?}", ("available=0.000000 frozen=7007.000000", 14)),
        format!(
            "{:?}",
            (
                balance_line(db, DEFAULT_TENANT, "carol", Asset::Usdt).await?,
                orders_of(db, "carol").await?
            )
        ),
    );
    Ok(())
}

/// One business id at once: [`SAME_ID_REQUESTS`] identical placements for dave.
async fn same_id(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    const BUSINESS_ID: &str = "r1-place-same";
    let (replies, waiting) = held_on_usdt(primary, "dave", || {
        (0..SAME_ID_REQUESTS)
            .map(|_| place(service, BUSINESS_ID.to_owned(), "dave", "1.0"))
            .collect()
    })
    .await?;
    let created: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    let executed = created.iter().filter(|r| !r.replayed).count();
    let bodies: BTreeSet<String> = created.iter().map(|r| r.body.to_string()).collect();
    ctx.check_eq(
        "spot: same id: server sessions seen waiting on a lock",
        POOLER_POOL_SIZE as usize,
        waiting,
    );
    ctx.check_eq(
        "spot: same id: 16 placements → 201, executed, replayed, distinct bodies",
        format!("{:?}", (SAME_ID_REQUESTS, 1, SAME_ID_REQUESTS - 1, 1)),
        format!(
            "{:?}",
            (
                created.len(),
                executed,
                created.len() - executed,
                bodies.len()
            )
        ),
    );
    let operations: i64 = db
        .query_one(
            "SELECT count(*) FROM balance_operation WHERE tenant_id = $1 AND business_id = $2",
            &[&DEFAULT_TENANT, &BUSINESS_ID],
        )
        .await?
        .get(0);
    ctx.check_eq(
        "spot: same id: operations for the id, dave's orders, dave's USDT",
        format!("{:?}", (1, 1, FROZEN_ONCE)),
        format!(
            "{:?}",
            (
                operations,
                orders_of(db, "dave").await?,
                balance_line(db, DEFAULT_TENANT, "dave", Asset::Usdt).await?
            )
        ),
    );
    Ok(())
}

/// A lost placement response and its same-id retry (erin).
async fn lost_response(
    ctx: &mut Ctx,
    service: &Arc<Service>,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    const BUSINESS_ID: &str = "r1-place-lost";
    let bound = Duration::from_millis(SERVICE_BOUND_MS);
    service
        .arm_fault(
            AFTER_COMMIT,
            json!({"action": "pause", "hold_ms": SERVICE_BOUND_MS, "count": 1}),
        )
        .await?;
    let t = DEFAULT_TENANT;
    let attempt = service.place(t, BUSINESS_ID, "erin", "BUY", "1.0", "5000", bound);
    let gave_up = give_up_once_held(service, AFTER_COMMIT, attempt, bound).await?;
    let frozen_then = balance_line(db, t, "erin", Asset::Usdt).await?;
    service.release_fault(AFTER_COMMIT).await?;
    ctx.check_eq(
        "spot: lost response: gave up unanswered while held, erin's USDT then",
        format!("{:?}", (true, true, FROZEN_ONCE)),
        format!(
            "{:?}",
            (
                gave_up.answered.is_none(),
                gave_up.state.holding >= 1,
                frozen_then
            )
        ),
    );
    let retry = service
        .place(t, BUSINESS_ID, "erin", "BUY", "1.0", "5000", bound)
        .await?;
    let created: Option<i64> = db
        .query_opt(
            "SELECT order_id FROM spot_order WHERE tenant_id = $1 AND place_business_id = $2",
            &[&t, &BUSINESS_ID],
        )
        .await?
        .map(|row| row.get(0));
    ctx.check_eq(
        "spot: lost response: same-id retry → status, the first attempt's order, erin's orders, her USDT",
        format!("{:?}", ("201 OK replayed=true", true, 1, FROZEN_ONCE)),
        format!(
            "{:?}",
            (
                retry.summary(),
                created.is_some() && retry.order_id() == created,
                orders_of(db, "erin").await?,
                balance_line(db, t, "erin", Asset::Usdt).await?
            )
        ),
    );
    Ok(())
}
