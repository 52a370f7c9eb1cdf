//! The spot routes on a running `ledger-svc` (see `ledger-svc/src/http/spot.rs`), and
//! the balance figures a case prints, read through the library.

use std::time::Duration;

use frozen_balances::amount::format_units;
use frozen_balances::{Asset, DEFAULT_TENANT};
use launch::service::{CLIENT_TIMEOUT_MS, Reply, Service, ServiceOptions};
use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};

/// The tenant header.
pub const TENANT_HEADER: &str = "x-tenant-id";
/// The second tenant the cases trade in (F4: one business id in two tenants).
pub const OTHER_TENANT: &str = "tenant-b";
/// Every tenant the cases trade in.
pub const TENANTS: [&str; 2] = [DEFAULT_TENANT, OTHER_TENANT];

/// `options` for a service the spot cases call: with authentication the tenant is the
/// caller (`ledger-svc`'s `http::auth::tenant_id`), so each tenant of [`TENANTS`] is a
/// client of its own, admin too (its deposits and fills).
pub fn spot_service(options: ServiceOptions) -> ServiceOptions {
    let mut options = options.with_clients(&TENANTS);
    options
        .admins
        .extend(TENANTS.iter().map(|tenant| tenant.to_string()));
    options
}

/// A spot request on behalf of a tenant: `X-Tenant-Id` and, so that an authenticating
/// service's token is the tenant's own ([`Service::authorize`] picks it by
/// `X-Client-Id`), `X-Client-Id` naming the same id.
pub trait ForTenant {
    /// The request with both headers naming `tenant`.
    fn for_tenant(self, tenant: &str) -> Self;
}

impl ForTenant for reqwest::RequestBuilder {
    fn for_tenant(self, tenant: &str) -> Self {
        self.header(TENANT_HEADER, tenant)
            .header("x-client-id", tenant)
    }
}

/// The spot routes on [`Service`]; every call names its tenant and business id.
pub trait SpotCalls {
    /// `POST /spot/accounts/{account}/orders` on the public listener.
    ///
    /// Errors: the transport's (`is_timeout()` for a timeout).
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        tenant: &str,
        business_id: &str,
        account: &str,
        side: &str,
        quantity: &str,
        price: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Reply, reqwest::Error>> + Send;

    /// `POST /spot/accounts/{account}/orders/{order}/cancel` on the public listener.
    ///
    /// Errors: the transport's.
    fn cancel(
        &self,
        tenant: &str,
        business_id: &str,
        account: &str,
        order: i64,
    ) -> impl Future<Output = Result<Reply, reqwest::Error>> + Send;

    /// `POST /spot/accounts/{account}/deposits` on the admin listener; 201 or an error.
    ///
    /// Errors: transport errors or another status.
    fn deposit(
        &self,
        tenant: &str,
        business_id: &str,
        account: &str,
        asset: &str,
        amount: &str,
    ) -> impl Future<Output = anyhow::Result<Reply>> + Send;

    /// `POST /spot/fills` on the admin listener (the matching engine's call).
    ///
    /// Errors: the transport's.
    fn fill(
        &self,
        fill_id: &str,
        buy_order: i64,
        sell_order: i64,
        quantity: &str,
        price: &str,
    ) -> impl Future<Output = Result<Reply, reqwest::Error>> + Send;

    /// `GET /spot/accounts/{account}/balances` on the public listener.
    ///
    /// Errors: the transport's.
    fn balances(
        &self,
        tenant: &str,
        account: &str,
    ) -> impl Future<Output = Result<Reply, reqwest::Error>> + Send;
}

impl SpotCalls for Service {
    async fn place(
        &self,
        tenant: &str,
        business_id: &str,
        account: &str,
        side: &str,
        quantity: &str,
        price: &str,
        timeout: Duration,
    ) -> Result<Reply, reqwest::Error> {
        let body =
            json!({"market": "BTC-USDT", "side": side, "quantity": quantity, "price": price});
        self.send(
            self.http()
                .post(self.public_url(&format!("/spot/accounts/{account}/orders")))
                .for_tenant(tenant)
                .header("idempotency-key", business_id)
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string())
                .timeout(timeout),
        )
        .await
    }

    async fn cancel(
        &self,
        tenant: &str,
        business_id: &str,
        account: &str,
        order: i64,
    ) -> Result<Reply, reqwest::Error> {
        self.send(
            self.http()
                .post(self.public_url(&format!("/spot/accounts/{account}/orders/{order}/cancel")))
                .for_tenant(tenant)
                .header("idempotency-key", business_id)
                .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS)),
        )
        .await
    }

    async fn deposit(
        &self,
        tenant: &str,
        business_id: &str,
        account: &str,
        asset: &str,
        amount: &str,
    ) -> anyhow::Result<Reply> {
        let reply = self
            .send(
                self.http()
                    .post(self.admin_url(&format!("/spot/accounts/{account}/deposits")))
                    .for_tenant(tenant)
                    .header("idempotency-key", business_id)
                    .header(CONTENT_TYPE, "application/json")
                    .body(json!({"asset": asset, "amount": amount}).to_string()),
            )
            .await?;
        anyhow::ensure!(
            reply.status == 201,
            "deposit of {amount} {asset} to {account} answered {}",
            reply.status_outcome()
        );
        Ok(reply)
    }

    async fn fill(
        &self,
        fill_id: &str,
        buy_order: i64,
        sell_order: i64,
        quantity: &str,
        price: &str,
    ) -> Result<Reply, reqwest::Error> {
        let body = json!({"buy_order_id": buy_order, "sell_order_id": sell_order,
                          "quantity": quantity, "price": price});
        self.send(
            self.http()
                .post(self.admin_url("/spot/fills"))
                .for_tenant(DEFAULT_TENANT)
                .header("idempotency-key", fill_id)
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string()),
        )
        .await
    }

    async fn balances(&self, tenant: &str, account: &str) -> Result<Reply, reqwest::Error> {
        self.send(
            self.http()
                .get(self.public_url(&format!("/spot/accounts/{account}/balances")))
                .for_tenant(tenant),
        )
        .await
    }
}

/// [`SpotCalls::place`] with the ordinary client timeout.
///
/// Errors: the transport's.
pub async fn place(
    service: &Service,
    business_id: &str,
    account: &str,
    side: &str,
    quantity: &str,
    price: &str,
) -> anyhow::Result<Reply> {
    let timeout = Duration::from_millis(CLIENT_TIMEOUT_MS);
    Ok(service
        .place(
            DEFAULT_TENANT,
            business_id,
            account,
            side,
            quantity,
            price,
            timeout,
        )
        .await?)
}

/// What a case reads from a spot reply.
pub trait SpotReply {
    /// `order_id` of a placement.
    fn order_id(&self) -> Option<i64>;
    /// A string member, `none` when absent.
    fn text(&self, name: &str) -> String;
    /// `<status> <outcome> replayed=<bool>`.
    fn summary(&self) -> String;
    /// One asset's `available frozen` from a balances reply, e.g.
    /// `available=5095.100000 frozen=0.000000`.
    fn asset_line(&self, asset: Asset) -> String;
}

impl SpotReply for Reply {
    fn order_id(&self) -> Option<i64> {
        self.integer("order_id")
    }

    fn text(&self, name: &str) -> String {
        self.body[name].as_str().unwrap_or("none").to_owned()
    }

    fn summary(&self) -> String {
        format!("{} replayed={}", self.status_outcome(), self.replayed)
    }

    fn asset_line(&self, asset: Asset) -> String {
        let empty = Vec::new();
        let row = self.body["balances"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .find(|b| b["asset"] == asset.as_str())
            .cloned()
            .unwrap_or(Value::Null);
        format!(
            "available={} frozen={}",
            row["available"].as_str().unwrap_or("none"),
            row["frozen"].as_str().unwrap_or("none")
        )
    }
}

/// `available=… frozen=…` of one balance row, read through the library (0 and 0 when the
/// row does not exist).
///
/// Errors: database errors.
pub async fn balance_line(
    client: &tokio_postgres::Client,
    tenant: &str,
    account: &str,
    asset: Asset,
) -> anyhow::Result<String> {
    let b = frozen_balances::query::balance(client, tenant, account, asset).await?;
    Ok(format!(
        "available={} frozen={}",
        format_units(asset, b.available),
        format_units(asset, b.frozen)
    ))
}

/// Counts of what a refused request must leave alone: operations, movements, orders,
/// and a digest of every balance row.
///
/// Errors: database errors.
pub async fn recorded(client: &tokio_postgres::Client) -> anyhow::Result<String> {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM balance_operation)::text || '/' ||
                    (SELECT count(*) FROM balance_movement)::text || '/' ||
                    (SELECT count(*) FROM spot_order)::text || '/' ||
                    md5(COALESCE((SELECT string_agg(tenant_id || account_id || asset || available
                        || ':' || frozen, ',' ORDER BY tenant_id, account_id, asset)
                        FROM balance), ''))",
            &[],
        )
        .await?;
    Ok(row.get(0))
}
