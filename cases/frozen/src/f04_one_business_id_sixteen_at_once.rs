//! F4 — one business id, sixteen at once (the seed's table, row 1).
//! Claim: sixteen identical placements under one business id, sent at the same moment,
//! freeze once; the other fifteen wait on the registration and replay its result with
//! the same body. The business id is scoped by the tenant: the same id under another
//! tenant is another placement with its own freeze.
//! Setup: alice deposits 10 000 USDT; 16 clients send BUY 1.0 @ 5000 with id
//! `place-0401` through the service, released together.
//! Checks: 16 × 201; exactly 1 executed, 15 replayed; one body; one operation, one
//! order, alice 4995 available / 5005 frozen. The id with quantity 2.0 → 422
//! KEY_REUSED, nothing recorded. The id under tenant `tenant-b` → 201, not replayed, a
//! second, independent freeze.
//! Fails if: more or fewer than one freeze, differing bodies, or the 422 records anything.

use std::sync::Arc;

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, DEFAULT_TENANT};
use futures_util::FutureExt;
use launch::service::{Service, ServiceOptions};
use reqwest::header::CONTENT_TYPE;
use serde_json::json;

use super::spot::{
    ForTenant, OTHER_TENANT, SpotCalls, SpotReply, balance_line, place, recorded, spot_service,
};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F4",
        "one business id, sixteen at once: one freeze, fifteen replays",
        |ctx| run(ctx).boxed(),
    )
    .connections(CLIENTS as u32 + 2)
}

const CLIENTS: usize = 16;
const BUSINESS_ID: &str = "place-0401";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = Service::start(
        ctx,
        spot_service(ServiceOptions {
            pool_size: CLIENTS,
            ..ServiceOptions::default()
        }),
    )
    .await?;
    let db = ctx.connect().await?;
    let t = DEFAULT_TENANT;
    service
        .deposit(t, "dep-0401", "alice", "USDT", "10000")
        .await?;

    let replies = sixteen_at_once(&service).await?;
    check_one_freeze(ctx, &db, &replies).await?;
    key_reused_records_nothing(ctx, &service, &db).await?;
    another_tenant_freezes_again(ctx, &service, &db).await?;
    service.stop_checked(ctx).await?;
    Ok(())
}

/// Sends the sixteen placements, released together by a barrier; returns (status,
/// replayed, body) of each.
async fn sixteen_at_once(service: &Service) -> anyhow::Result<Vec<(u16, bool, String)>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let body = json!({"market": "BTC-USDT", "side": "BUY", "quantity": "1.0", "price": "5000"})
        .to_string();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let request = service
            .authorize(
                service
                    .http()
                    .post(service.public_url("/spot/accounts/alice/orders"))
                    .for_tenant(DEFAULT_TENANT)
                    .header("idempotency-key", BUSINESS_ID)
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.clone()),
            )
            .build()?;
        let http = service.http().clone();
        let barrier = barrier.clone();
        tasks.push(case_kit::AbortOnDrop::spawn(async move {
            barrier.wait().await;
            let response = http.execute(request).await?;
            let status = response.status().as_u16();
            let replayed = response
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            let text = response.text().await?;
            Ok::<_, reqwest::Error>((status, replayed, text))
        }));
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await??);
    }
    Ok(replies)
}

/// Checks the sixteen `(status, replayed, body)` replies: all 201, one executed, fifteen
/// replayed, one body; one operation and one order recorded, alice frozen once.
///
/// Errors: database errors.
async fn check_one_freeze(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    replies: &[(u16, bool, String)],
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let created = replies.iter().filter(|r| r.0 == 201).count();
    let fresh = replies.iter().filter(|r| r.0 == 201 && !r.1).count();
    let replayed = replies.iter().filter(|r| r.0 == 201 && r.1).count();
    let bodies: std::collections::BTreeSet<&str> = replies.iter().map(|r| r.2.as_str()).collect();
    ctx.note(format!(
        "created={created} executed={fresh} replayed={replayed} distinct_bodies={}",
        bodies.len()
    ));
    ctx.check_eq("all sixteen answered 201", CLIENTS, created);
    ctx.check_eq("executed once", 1, fresh);
    ctx.check_eq("replayed", CLIENTS - 1, replayed);
    ctx.check_eq("one body for all sixteen", 1, bodies.len());
    let operations: i64 = db
        .query_one(
            "SELECT count(*) FROM balance_operation WHERE tenant_id = $1 AND business_id = $2",
            &[&t, &BUSINESS_ID],
        )
        .await?
        .get(0);
    let orders: i64 = db
        .query_one("SELECT count(*) FROM spot_order", &[])
        .await?
        .get(0);
    ctx.check_eq("operations for the id", 1, operations);
    ctx.check_eq("orders", 1, orders);
    ctx.check_eq(
        "alice USDT: frozen once",
        "available=4995.000000 frozen=5005.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    Ok(())
}

/// The id again with quantity 2.0: checks 422 KEY_REUSED and that nothing was recorded.
///
/// Errors: transport or database errors.
async fn key_reused_records_nothing(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let before = recorded(db).await?;
    let other = place(service, BUSINESS_ID, "alice", "BUY", "2.0", "5000").await?;
    ctx.note(format!("the id with quantity 2.0: {}", other.summary()));
    ctx.check_eq(
        "the id with another quantity",
        "422 KEY_REUSED".to_string(),
        other.status_outcome(),
    );
    ctx.check(
        "the 422 recorded nothing",
        recorded(db).await? == before,
        "",
    );
    Ok(())
}

/// The id under tenant-b (after a deposit there): checks a placement of its own, not a
/// replay, with its own freeze, and the default tenant's alice unchanged.
///
/// Errors: transport or database errors.
async fn another_tenant_freezes_again(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    service
        .deposit(OTHER_TENANT, "dep-0401", "alice", "USDT", "10000")
        .await?;
    let timeout = std::time::Duration::from_millis(launch::service::CLIENT_TIMEOUT_MS);
    let elsewhere = service
        .place(
            OTHER_TENANT,
            BUSINESS_ID,
            "alice",
            "BUY",
            "1.0",
            "5000",
            timeout,
        )
        .await?;
    ctx.note(format!(
        "the id under tenant {OTHER_TENANT}: {}",
        elsewhere.summary()
    ));
    ctx.check_eq(
        "another tenant: a placement of its own",
        "201 OK replayed=false".to_string(),
        elsewhere.summary(),
    );
    ctx.check_eq(
        "tenant-b alice USDT: its own freeze",
        "available=4995.000000 frozen=5005.000000".to_string(),
        balance_line(db, OTHER_TENANT, "alice", Asset::Usdt).await?,
    );
    ctx.check_eq(
        "default alice USDT: unchanged",
        "available=4995.000000 frozen=5005.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    Ok(())
}
