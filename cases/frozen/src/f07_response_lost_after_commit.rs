//! F7 — response lost after commit (the seed's table, row 4), through the service.
//! Claim: a client that times out cannot know whether its order froze funds; retrying
//! with the business id it created when it decided to order replays the committed
//! placement instead of freezing again.
//! Setup: alice deposits 10 000 USDT, carol 20 000 (room for two freezes). The service
//! commits the placement, then (fault `spot-after-commit`, action `pause`, as L7) withholds
//! the response; the client gives up the moment the service is seen holding it
//! (`launch::lost`: an event, not a client timer racing a server timer), and only then
//! is the pause released, into a closed connection.
//! Checks: the client got no response; by then alice's 5005 is already frozen; the same-id
//! retry is 201 with `Idempotent-Replayed: true` and the order id of the one order the
//! first attempt created; frozen once.
//! Negative control: carol loses the same response and retries under a NEW business id
//! → frozen twice (10 010), two orders, and reconciliation finds nothing wrong: both
//! freezes are legitimate records; only the id tells a retry from a second order.
//! Fails if: a check above does not hold, or the naive retry does not freeze twice.

use std::time::Duration;

use case_kit::{Case, Ctx};
use frozen_balances::{Asset, DEFAULT_TENANT};
use futures_util::FutureExt;
use launch::lost::give_up_once_held;
use launch::service::{Service, ServiceOptions};
use serde_json::json;

use super::fixtures::Plan;
use super::spot::{SpotCalls, SpotReply, balance_line, spot_service};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F7",
        "response lost after commit: same-id retry replays, a new id freezes twice",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .connections(POOL_SIZE as u32 + 3)
}

const POOL_SIZE: usize = 4;
/// Longest wait for the service to hold the committed response, milliseconds: it only
/// stops a hang.
const HELD_WAIT_MS: u64 = 10_000;
/// Safety bound of the after-commit pause should the case never release it, ms.
const PAUSE_BOUND_MS: u64 = 30_000;
const FAULT_POINT: &str = "spot-after-commit";

/// The case body; under [`Plan::Harmless`] carol's response is not lost, so her client
/// has no reason to retry and the control must not see a second freeze.
///
/// Errors: the service could not start, transport or database errors.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let service = Service::start(
        ctx,
        spot_service(ServiceOptions {
            fault_injection: true,
            pool_size: POOL_SIZE,
            ..ServiceOptions::default()
        }),
    )
    .await?;
    let db = ctx.connect().await?;
    let t = DEFAULT_TENANT;
    service
        .deposit(t, "dep-0701", "alice", "USDT", "10000")
        .await?;
    service
        .deposit(t, "dep-0702", "carol", "USDT", "20000")
        .await?;
    ctx.note(
        "the service pauses after the commit; the client gives up once it sees the response held",
    );

    // The positive path: lose the response, retry with the same business id.
    same_id_retry_replays(ctx, &service, &db).await?;
    // Negative control: the same lost response, then a retry under a new business id.
    new_id_retry_control(ctx, &service, &db, plan).await?;
    let mut client = ctx.connect().await?;
    let findings = frozen_balances::reconcile(&mut client).await?;
    ctx.check(
        "reconciliation finds nothing wrong (both freezes are recorded events)",
        findings.is_clean(),
        findings.summary(),
    );
    service.stop_checked(ctx).await?;
    Ok(())
}

/// alice loses the response to place-0701 and retries with the same id: checks she was
/// frozen by then, the retry replays the order the first attempt created, and she is
/// frozen once with one order.
///
/// Errors: transport or database errors.
async fn same_id_retry_replays(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    let still_held = lose_response(ctx, service, "alice", "place-0701").await?;
    ctx.check_eq(
        "alice USDT already frozen when the client gave up",
        "available=4995.000000 frozen=5005.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    ctx.check_eq("the response was still withheld then", true, still_held);
    let retry = buy(service, "alice", "place-0701", Duration::from_secs(10)).await?;
    ctx.note(format!("same-id retry: {}", retry.summary()));
    ctx.check_eq(
        "retry: 201 OK, replayed",
        "201 OK replayed=true".to_string(),
        retry.summary(),
    );
    let created: Option<i64> = db
        .query_opt(
            "SELECT order_id FROM spot_order WHERE tenant_id = $1 AND place_business_id = $2",
            &[&t, &"place-0701"],
        )
        .await?
        .map(|row| row.get(0));
    ctx.check(
        "retry reports the order the first attempt created",
        created.is_some() && retry.order_id() == created,
        if retry.order_id() == created {
            "same"
        } else {
            "different"
        },
    );
    ctx.check_eq(
        "alice USDT after the retry: frozen once",
        "available=4995.000000 frozen=5005.000000".to_string(),
        balance_line(db, t, "alice", Asset::Usdt).await?,
    );
    ctx.check_eq("alice's orders", 1, orders_of(db, "alice").await?);
    Ok(())
}

/// The negative control on carol: under [`Plan::Forced`] she loses the response to
/// place-0702 and retries under place-0703; under [`Plan::Harmless`] she is answered
/// and does not retry. Checks whether she was frozen twice.
///
/// Errors: transport or database errors.
async fn new_id_retry_control(
    ctx: &mut Ctx,
    service: &Service,
    db: &tokio_postgres::Client,
    plan: Plan,
) -> anyhow::Result<()> {
    let t = DEFAULT_TENANT;
    match plan {
        Plan::Forced => {
            lose_response(ctx, service, "carol", "place-0702").await?;
            let naive = buy(service, "carol", "place-0703", Duration::from_secs(10)).await?;
            ctx.note(format!("new-id retry: {}", naive.summary()));
        }
        Plan::Harmless => {
            let answered = buy(service, "carol", "place-0702", Duration::from_secs(10)).await?;
            ctx.note(format!("answered, no retry: {}", answered.summary()));
        }
    }
    let carol = balance_line(db, t, "carol", Asset::Usdt).await?;
    let carol_orders = orders_of(db, "carol").await?;
    ctx.exposes(
        "a retry under a new business id freezes twice (10010 frozen)",
        carol == "available=9990.000000 frozen=10010.000000" && carol_orders == 2,
        format!("carol USDT {carol} orders={carol_orders}"),
    );
    Ok(())
}

async fn buy(
    service: &Service,
    account: &str,
    business_id: &str,
    timeout: Duration,
) -> Result<launch::service::Reply, reqwest::Error> {
    service
        .place(
            DEFAULT_TENANT,
            business_id,
            account,
            "BUY",
            "1.0",
            "5000",
            timeout,
        )
        .await
}

async fn orders_of(db: &tokio_postgres::Client, account: &str) -> anyhow::Result<i64> {
    Ok(db
        .query_one(
            "SELECT count(*) FROM spot_order WHERE tenant_id = $1 AND account_id = $2",
            &[&DEFAULT_TENANT, &account],
        )
        .await?
        .get(0))
}

/// Arms an after-commit pause for one event, places and gives up the moment the service
/// holds the committed response ([`give_up_once_held`]); checks that the client had no
/// response and that the service had already committed; releases the pause. Returns
/// whether the response was being withheld at that moment.
async fn lose_response(
    ctx: &mut Ctx,
    service: &Service,
    account: &str,
    business_id: &str,
) -> anyhow::Result<bool> {
    service
        .arm_fault(
            FAULT_POINT,
            json!({"action": "pause", "hold_ms": PAUSE_BOUND_MS, "count": 1}),
        )
        .await?;
    let attempt = buy(
        service,
        account,
        business_id,
        Duration::from_millis(PAUSE_BOUND_MS),
    );
    let gave_up = give_up_once_held(
        service,
        FAULT_POINT,
        attempt,
        Duration::from_millis(HELD_WAIT_MS),
    )
    .await?;
    ctx.check(
        format!("{business_id}: the client gave up without a response"),
        gave_up.answered.is_none(),
        match &gave_up.answered {
            None => "gave up".to_string(),
            Some(Ok(reply)) => format!("got {}", reply.summary()),
            Some(Err(_)) => "a transport error first".to_string(),
        },
    );
    let state = gave_up.state;
    ctx.check(
        format!("{business_id}: the service had committed before the client gave up"),
        state.fired >= 1,
        format!("after_commit_fired={}", state.fired >= 1),
    );
    service.release_fault(FAULT_POINT).await?;
    Ok(state.holding >= 1)
}
