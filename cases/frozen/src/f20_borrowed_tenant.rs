//! F20 — a borrowed tenant: the tenant is who the caller is, not what it declares.
//! Claim: with `--auth-tokens`, a spot request's tenant is its authenticated caller
//! (`ledger-svc`'s `http::auth::tenant_id`), so tenant B's caller, declaring tenant A in
//! `X-Tenant-Id`, neither receives A's stored placement, nor cancels A's order, nor reads
//! A's balances: each is 403 and records nothing; B's token with A's `X-Client-Id` is 403
//! too; no token or an unknown one is 401; B's own tenant does not hold A's order (404)
//! or A's account (404); A's order and balances are untouched.
//! Negative control: the same three requests to a service without `--auth-tokens`,
//! where `X-Tenant-Id` is trusted as declared: B receives A's stored 201 with A's order
//! id, cancels A's order (201, the freeze released) and reads A's balances (200).
//! Fails if: the control's B does not get all three (the control proved nothing), or,
//! with tokens, any of B's attempts is not refused as above, a refusal shows A's order
//! id, or anything is recorded by a refused request. Seed 003 keys balances by
//! `(tenant_id, account_id, asset)` and operations by `(tenant_id, business_id)`.
//!
//! Rust, not a file: two services run side by side (with and without `--auth-tokens`),
//! and each refused request is sent with one forged header of its own (`X-Tenant-Id`,
//! `X-Client-Id`, another tenant's token, none, an unknown one); the spot verbs send as
//! the family's one caller and forge no header.

use futures_util::FutureExt;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::json;

use super::spot::{OTHER_TENANT, SpotCalls, SpotReply, TENANT_HEADER, recorded, spot_service};
use case_kit::{Case, Ctx};
use frozen_balances::{Asset, DEFAULT_TENANT};
use launch::service::{Auth, Reply, Service, ServiceOptions};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F20",
        "a borrowed tenant: B cannot act in A's tenant once callers authenticate",
        |ctx| run(ctx).boxed(),
    )
    // The service's pool and the case's own connection.
    .connections(POOL_SIZE as u32 + 1)
}

/// What the negative control exposes.
pub const ANOMALY: &str = "B, declaring tenant A, receives A's stored placement, cancels A's \
                           order and reads A's balances";

/// The victim tenant.
const TENANT_A: &str = DEFAULT_TENANT;
/// The tenant whose caller borrows A's.
const TENANT_B: &str = OTHER_TENANT;
/// Pooled connections of each service.
const POOL_SIZE: usize = 2;
/// A's trader.
const ACCOUNT: &str = "alice";
/// A well-formed bearer token that is in no token file.
const UNKNOWN_TOKEN: &str = "not-a-listed-token-0000000000000000";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_control(ctx, Auth::Off).await?;
    run_authenticated(ctx).await
}

/// A's placement, stored before B tries anything: its reply.
async fn a_places(service: &Service, deposit: &str, business_id: &str) -> anyhow::Result<Reply> {
    service
        .deposit(TENANT_A, deposit, ACCOUNT, "USDT", "10000")
        .await?;
    super::spot::place(service, business_id, ACCOUNT, "BUY", "1.0", "5000").await
}

/// The negative control: A places an order, then B's caller declares tenant A and sends
/// A's business id and body, a cancel of A's order, and a read of A's balances (with B's
/// own token if the service has tokens). `auth`: [`Auth::Off`] in the case (the leak); a
/// test runs it with [`Auth::On`], where the leak cannot happen and the control must FAIL.
///
/// Errors: the service does not start, transport or database errors.
pub async fn run_control(ctx: &mut Ctx, auth: Auth) -> anyhow::Result<()> {
    let service = start(ctx, auth).await?;
    let a = a_places(&service, "dep-2001", "place-2001").await?;
    let order = a.order_id().unwrap_or_default();
    ctx.note(format!(
        "{}: A places BUY 1.0 @ 5000 for {ACCOUNT}: {} order_id={order}",
        mode(&service),
        a.summary()
    ));
    ctx.check_eq(
        "control: A's placement",
        "201 OK replayed=false".to_string(),
        a.summary(),
    );
    let as_b = Borrower::new(&service, Some(TENANT_A));
    let replay = as_b.place("place-2001").await?;
    let cancel = as_b.cancel(order, "cancel-2001").await?;
    let read = as_b.balances().await?;
    ctx.note(format!(
        "{}: B declares tenant {TENANT_A}{}: placement {} order_id={}; cancel {} released={}; \
         balances {} USDT {}",
        mode(&service),
        if service.authenticated() {
            " with its own token"
        } else {
            ""
        },
        replay.summary(),
        replay
            .order_id()
            .map_or_else(|| "none".to_owned(), |id| id.to_string()),
        cancel.summary(),
        cancel.text("released"),
        read.status,
        read.asset_line(Asset::Usdt)
    ));
    let got_a_order = replay.status == 201 && replay.replayed && replay.order_id() == Some(order);
    ctx.exposes(
        ANOMALY,
        got_a_order && cancel.status == 201 && read.status == 200,
        format!(
            "placement {}, cancel {}, balances {}",
            replay.status, cancel.status, read.status
        ),
    );
    service.stop_checked(ctx).await
}

/// The fix: the same requests and their variants on a service with `--auth-tokens`.
async fn run_authenticated(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = start(ctx, Auth::On).await?;
    let db = ctx.connect().await?;
    let a = a_places(&service, "dep-2002", "place-2002").await?;
    let order = a.order_id().unwrap_or_default();
    ctx.note(format!(
        "with tokens: A (its own token) places BUY 1.0 @ 5000 for {ACCOUNT}: {} order_id={order}",
        a.summary()
    ));
    ctx.check_eq(
        "A's placement",
        "201 OK replayed=false".to_string(),
        a.summary(),
    );
    let a_balances = service.balances(TENANT_A, ACCOUNT).await?;
    let before = recorded(&db).await?;

    borrowed_requests_refused(ctx, &service, order).await?;
    let after = recorded(&db).await?;
    ctx.check(
        "the refused requests recorded nothing (operations, movements, orders, balances)",
        after == before,
        format!("before={before} after={after}"),
    );

    // B's token in its own tenant: A's order and A's account are not there.
    own_tenant_holds_nothing(ctx, &service, order).await?;
    let a_after = service.balances(TENANT_A, ACCOUNT).await?;
    ctx.check_eq(
        "A's balances unchanged by everything B sent",
        a_balances.asset_line(Asset::Usdt),
        a_after.asset_line(Asset::Usdt),
    );
    service.stop_checked(ctx).await
}

/// B's caller with its own token tries A's tenant: declaring it in `X-Tenant-Id` (A's
/// business id and body, a cancel of A's `order`, a read of A's balances) and naming A
/// in `X-Client-Id` must each be 403; no token or an unknown one must be 401.
///
/// Errors: transport errors; no token for B.
async fn borrowed_requests_refused(
    ctx: &mut Ctx,
    service: &Service,
    order: i64,
) -> anyhow::Result<()> {
    let as_b = Borrower::new(service, Some(TENANT_A));
    for (label, reply) in [
        ("A's business id and body", as_b.place("place-2002").await?),
        (
            "a cancel of A's order",
            as_b.cancel(order, "cancel-2002").await?,
        ),
        ("a read of A's balances", as_b.balances().await?),
    ] {
        refused(
            ctx,
            &format!("B's token, X-Tenant-Id {TENANT_A}: {label}"),
            &reply,
            403,
        );
    }
    let borrowed_client = service
        .send(
            Borrower::new(service, None)
                .balances_request()
                .header("x-client-id", TENANT_A)
                .bearer_auth(token(service, TENANT_B)?),
        )
        .await?;
    refused(
        ctx,
        &format!("B's token, X-Client-Id {TENANT_A}: a read of A's balances"),
        &borrowed_client,
        403,
    );
    for (label, token) in [
        ("no token", None),
        ("an unknown token", Some(UNKNOWN_TOKEN)),
    ] {
        let mut request = Borrower::new(service, Some(TENANT_A)).place_request("place-2002");
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let reply = service.send_as_is(request).await?;
        refused(
            ctx,
            &format!("{label}, X-Tenant-Id {TENANT_A}: A's business id and body"),
            &reply,
            401,
        );
    }
    Ok(())
}

/// B's token with no `X-Tenant-Id` (its own tenant): checks a cancel of A's `order` is
/// 404 NO_ORDER and a read of A's account 404 NO_ACCOUNT.
///
/// Errors: transport errors.
async fn own_tenant_holds_nothing(
    ctx: &mut Ctx,
    service: &Service,
    order: i64,
) -> anyhow::Result<()> {
    let as_own = Borrower::new(service, None);
    let own_cancel = as_own.cancel(order, "cancel-2003").await?;
    let own_read = as_own.balances().await?;
    ctx.note(format!(
        "B's token, no X-Tenant-Id (its own tenant {TENANT_B}): cancel of order {order}: {}; \
         balances of {ACCOUNT}: {}",
        own_cancel.summary(),
        own_read.summary()
    ));
    ctx.check_eq(
        "B's own tenant does not hold A's order",
        "404 NO_ORDER".to_string(),
        own_cancel.status_outcome(),
    );
    ctx.check_eq(
        "B's own tenant does not hold A's account",
        "404 NO_ACCOUNT".to_string(),
        own_read.status_outcome(),
    );
    Ok(())
}

/// Checks that `reply` is the refusal `status` and shows nothing of A's.
fn refused(ctx: &mut Ctx, label: &str, reply: &Reply, status: u16) {
    ctx.note(format!("{label}: {}", reply.summary()));
    ctx.check_eq(format!("{label}: refused"), status, reply.status);
    ctx.check(
        format!("{label}: shows no order id, balance or replay"),
        reply.order_id().is_none() && reply.body.get("balances").is_none() && !reply.replayed,
        reply.summary(),
    );
}

/// The bearer token of `client`.
fn token(service: &Service, client: &str) -> anyhow::Result<String> {
    service
        .token(client)
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no token for {client}"))
}

/// Tenant B's caller: `X-Client-Id` names B (so an authenticating service gets B's own
/// token, [`Service::authorize`]); `X-Tenant-Id` names `declared` when given.
struct Borrower<'a> {
    service: &'a Service,
    declared: Option<&'static str>,
}

impl<'a> Borrower<'a> {
    fn new(service: &'a Service, declared: Option<&'static str>) -> Borrower<'a> {
        Borrower { service, declared }
    }

    fn headers(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = request.header("x-client-id", TENANT_B);
        match self.declared {
            Some(tenant) => request.header(TENANT_HEADER, tenant),
            None => request,
        }
    }

    /// A's placement body under `business_id`, as built (not sent).
    fn place_request(&self, business_id: &str) -> reqwest::RequestBuilder {
        let body = json!({"market": "BTC-USDT", "side": "BUY", "quantity": "1.0", "price": "5000"});
        self.headers(
            self.service
                .http()
                .post(
                    self.service
                        .public_url(&format!("/spot/accounts/{ACCOUNT}/orders")),
                )
                .header("idempotency-key", business_id)
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string()),
        )
    }

    /// A read of [`ACCOUNT`]'s balances, without the borrower's headers.
    fn balances_request(&self) -> reqwest::RequestBuilder {
        let path = format!("/spot/accounts/{ACCOUNT}/balances");
        self.service.http().get(self.service.public_url(&path))
    }

    async fn place(&self, business_id: &str) -> anyhow::Result<Reply> {
        Ok(self.service.send(self.place_request(business_id)).await?)
    }

    async fn cancel(&self, order: i64, business_id: &str) -> anyhow::Result<Reply> {
        let path = format!("/spot/accounts/{ACCOUNT}/orders/{order}/cancel");
        let request = self
            .service
            .http()
            .post(self.service.public_url(&path))
            .header("idempotency-key", business_id);
        Ok(self.service.send(self.headers(request)).await?)
    }

    async fn balances(&self) -> anyhow::Result<Reply> {
        Ok(self
            .service
            .send(self.headers(self.balances_request()))
            .await?)
    }
}

/// A service for both tenants' callers, with or without tokens.
async fn start(ctx: &Ctx, auth: Auth) -> anyhow::Result<Service> {
    Service::start(
        ctx,
        spot_service(ServiceOptions {
            pool_size: POOL_SIZE,
            auth,
            ..ServiceOptions::default()
        }),
    )
    .await
}

fn mode(service: &Service) -> &'static str {
    if service.authenticated() {
        "with tokens"
    } else {
        "without authentication"
    }
}
