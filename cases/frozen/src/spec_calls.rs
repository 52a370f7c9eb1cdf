//! The frozen-balance events as spec steps (`call NAME: place …`), and where the F
//! family's spec files live: `cases/frozen/specs/`, read when the family is built, so a
//! new file is a new case with no rebuild (`f<NN>_<what>.spec` is the case `F<NN>`,
//! `sN_<what>.spec` the case `F-SN`; `case_kit::spec::cases_in`).
//!
//! Each operation is the library's own event (`frozen_balances::place`, …: one READ
//! COMMITTED transaction, SPEC §8) on the session's connection, then a read of the
//! balance it changed. Amounts are decimal text in whole coins, parsed by the library's
//! rules (`frozen_balances::amount`); an order is named by the business id it was placed
//! under (`order=place-0101`), or by its number (`order=#3`).
//! - `deposit account=A asset=USDT amount=10000 key=K` → `outcome=OK available=… frozen=…`
//! - `place account=A side=BUY qty=1.0 price=5000 key=K [market=BTC-USDT]
//!   [fail-at=POINT]` →
//!   `outcome=OK order=1 freeze=5005.000000 fee_reserve=5.000000 available=… frozen=…`
//!   (`freeze` is what the order froze, or would have; `available`/`frozen` the balance of
//!   that asset after the event); with `fail-at=balances-updated` the placement is
//!   aborted at that hook point (`ERROR event aborted by hook at balances-updated`)
//! - `fill buy=ORDER sell=ORDER qty=0.4 price=4900 key=K` → `outcome=OK notional=…
//!   buyer_fee=… seller_fee=… buyer_frozen_taken=… buyer_returned=… seller_received=…
//!   buy_status=OPEN sell_status=FILLED`, or `outcome=ORDER_CLOSED closed=1 status=…`
//! - `cancel account=A order=ORDER key=K` → `outcome=OK released=… status=CANCELLED
//!   available=… frozen=…`
//! - `withdraw account=A asset=BTC amount=0.5 to=DEST key=K` → `outcome=OK available=…
//!   frozen=…` (the request only: freeze, record and outbox event; SPEC §8)
//! - `settle key=W status=CONFIRMED [detail=TEXT]` → `outcome=OK status=CONFIRMED
//!   consumed=… released=…` (units; a withdrawal's settlement, as the executor does it)
//! - `balance account=A asset=USDT` → `available=… frozen=…`
//! - `reconcile` → `clean=true BTC=0.00000000 USDT=0.000000` (the per-asset sums of the
//!   default tenant), or `clean=false`, the sums, the findings' counts and each finding
//!   (`| row default/bob BTC: stored …`)
//!
//! Every operation takes `tenant=T` (default [`DEFAULT_TENANT`]). `replayed=true` is
//! added to an event read back from an earlier request with the same business id. An
//! error prints as its SQLSTATE and the server's message, or the library's error text
//! (`invalid request: …`, `business id reused for a different payload …`).

use std::path::Path;
use std::sync::Arc;

use case_kit::Ctx;
use case_kit::spec::{self, Call, Calls};
use frozen_balances::amount::{format_units, parse_amount, parse_price, parse_quantity};
use frozen_balances::withdraw::{self, WithdrawRequest};
use frozen_balances::{
    Asset, CancelRequest, DEFAULT_TENANT, DepositRequest, EventKind, FillRequest, FrozenError,
    Hooks, Market, NoHooks, PlaceRequest,
};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_postgres::Client;

use super::fixtures::FailAt;
use super::spec_naive;
use super::spec_network::{self, Network};
use super::spec_spot::{self, Spot};
use super::spec_workers::{self, Workers};

/// Where the F family's spec files are (read when the family is built).
pub const SPEC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/specs");

/// Each operation with its required arguments, then its optional ones (`tenant` is
/// optional everywhere).
const OPERATIONS: [(&str, &[&str], &[&str]); 10] = [
    ("deposit", &["account", "asset", "amount", "key"], &[]),
    (
        "place",
        &["account", "side", "qty", "price", "key"],
        &["market", "fail-at"],
    ),
    ("fill", &["buy", "sell", "qty", "price", "key"], &["market"]),
    ("cancel", &["account", "order", "key"], &[]),
    (
        "withdraw",
        &["account", "asset", "amount", "to", "key"],
        &[],
    ),
    ("balance", &["account", "asset"], &[]),
    ("reconcile", &[], &[]),
    ("naive-cancel", &["order", "key", "current"], &[]),
    ("settle", &["key", "status"], &["detail"]),
    (
        "naive-place",
        &["account", "side", "qty", "price", "key"],
        &["fail"],
    ),
];

/// The frozen-balance events as spec operations (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct FrozenCalls;

/// A call's arguments, read with the error a spec author can act on.
struct Args<'c>(&'c Call);

impl Args<'_> {
    fn text(&self, name: &str) -> Result<&str, String> {
        self.0.arg(name).ok_or_else(|| format!("needs {name}="))
    }
    fn tenant(&self) -> String {
        self.0.arg("tenant").unwrap_or(DEFAULT_TENANT).to_string()
    }
    fn market(&self) -> Result<Market, String> {
        self.0
            .arg("market")
            .unwrap_or("BTC-USDT")
            .parse()
            .map_err(|e| format!("{e}"))
    }
    fn asset(&self) -> Result<Asset, String> {
        self.text("asset")?.parse().map_err(|e| format!("{e}"))
    }
    fn amount(&self) -> Result<i64, String> {
        parse_amount("amount", self.asset()?, self.text("amount")?).map_err(|e| e.to_string())
    }
    fn quantity(&self) -> Result<i64, String> {
        parse_quantity(self.market()?, self.text("qty")?).map_err(|e| e.to_string())
    }
    fn price(&self) -> Result<i64, String> {
        parse_price(self.market()?, self.text("price")?).map_err(|e| e.to_string())
    }
}

/// An error as printed after `ERROR `: SQLSTATE and the server's message, or the
/// library's text.
fn shown(error: FrozenError) -> String {
    match &error {
        FrozenError::Db { code, source } => match (code, source.as_db_error()) {
            (Some(code), Some(db)) => format!("{code}: {}", db.message()),
            _ => format!("(no SQLSTATE): {source}"),
        },
        _ => error.to_string(),
    }
}

/// `available=… frozen=…` of one balance row, in whole coins of `asset`.
async fn balance(client: &Client, tenant: &str, account: &str, asset: Asset) -> String {
    match frozen_balances::query::balance(client, tenant, account, asset).await {
        Ok(b) => format!(
            "available={} frozen={}",
            format_units(asset, b.available),
            format_units(asset, b.frozen)
        ),
        Err(error) => format!("balance unreadable: {}", shown(error)),
    }
}

/// The order an argument names: `#N`, or the business id it was placed under.
///
/// Errors: no order placed under that id; a database error.
async fn order_id(client: &Client, tenant: &str, name: &str) -> Result<i64, String> {
    if let Some(number) = name.strip_prefix('#') {
        return number
            .parse()
            .map_err(|_| format!("bad order number {name:?}"));
    }
    let row = client
        .query_opt(
            "SELECT order_id FROM spot_order WHERE tenant_id = $1 AND place_business_id = $2",
            &[&tenant, &name],
        )
        .await
        .map_err(|e| shown(e.into()))?;
    row.map(|r| r.get(0))
        .ok_or_else(|| format!("no order placed under business id {name:?}"))
}

fn replayed(text: &mut String, replayed: bool) {
    if replayed {
        text.push_str(" replayed=true");
    }
}

async fn deposit(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let (tenant, asset) = (args.tenant(), args.asset()?);
    let req = DepositRequest {
        tenant_id: tenant.clone(),
        business_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
        asset,
        amount: args.amount()?,
    };
    let result = frozen_balances::deposit(client, &req, &NoHooks)
        .await
        .map_err(shown)?;
    let after = balance(client, &tenant, &req.account_id, asset).await;
    let mut text = format!("outcome={} {after}", result.outcome.as_str());
    replayed(&mut text, result.replayed);
    Ok(text)
}

/// The placement request a `place` or `naive-place` call names.
fn place_request(args: &Args<'_>) -> Result<PlaceRequest, String> {
    Ok(PlaceRequest {
        tenant_id: args.tenant(),
        business_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
        market: args.market()?,
        side: args.text("side")?.parse().map_err(|e| format!("{e}"))?,
        quantity: args.quantity()?,
        limit_price: args.price()?,
    })
}

/// The hooks of a `place` call: none, or `fail-at=POINT` (the placement aborted at that
/// hook point, a failure between two of its steps).
fn place_hooks(args: &Args<'_>) -> Result<Box<dyn Hooks>, String> {
    Ok(match args.0.arg("fail-at") {
        None => Box::new(NoHooks),
        Some(point) => Box::new(FailAt {
            kind: EventKind::Place,
            point: point.parse().map_err(|e| format!("{e}"))?,
        }),
    })
}

async fn place(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let (tenant, req, hooks) = (args.tenant(), place_request(args)?, place_hooks(args)?);
    let result = frozen_balances::place(client, &req, hooks.as_ref())
        .await
        .map_err(shown)?;
    let asset = result.frozen_asset;
    let after = balance(client, &tenant, &req.account_id, asset).await;
    let order = result.order_id.map(|id| format!(" order={id}"));
    let mut text = format!(
        "outcome={}{} freeze={} fee_reserve={} {after}",
        result.outcome.as_str(),
        order.unwrap_or_default(),
        format_units(asset, result.frozen_amount),
        format_units(asset, result.fee_reserve),
    );
    replayed(&mut text, result.replayed);
    Ok(text)
}

async fn fill(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let (tenant, market) = (args.tenant(), args.market()?);
    let req = FillRequest {
        tenant_id: tenant.clone(),
        fill_id: args.text("key")?.into(),
        buy_order_id: order_id(client, &tenant, args.text("buy")?).await?,
        sell_order_id: order_id(client, &tenant, args.text("sell")?).await?,
        quantity: args.quantity()?,
        price: args.price()?,
    };
    let r = frozen_balances::fill(client, &req, &NoHooks)
        .await
        .map_err(shown)?;
    let mut text = format!("outcome={}", r.outcome.as_str());
    if let Some((order, status)) = r.closed_order {
        text.push_str(&format!(" closed={order} status={}", status.as_str()));
    } else {
        let q = |units| format_units(market.quote(), units);
        let status = |s: Option<frozen_balances::OrderStatus>| s.map_or("-", |s| s.as_str());
        text.push_str(&format!(
            " notional={} buyer_fee={} seller_fee={} buyer_frozen_taken={} \
             buyer_returned={} seller_received={} buy_status={} sell_status={}",
            q(r.notional),
            q(r.buyer_fee),
            q(r.seller_fee),
            q(r.buyer_frozen_taken),
            q(r.buyer_returned),
            q(r.seller_received),
            status(r.buy_status),
            status(r.sell_status),
        ));
    }
    replayed(&mut text, r.replayed);
    Ok(text)
}

async fn cancel(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let tenant = args.tenant();
    let req = CancelRequest {
        tenant_id: tenant.clone(),
        business_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
        order_id: order_id(client, &tenant, args.text("order")?).await?,
    };
    let r = frozen_balances::cancel(client, &req, &NoHooks)
        .await
        .map_err(shown)?;
    let after = balance(client, &tenant, &req.account_id, r.asset).await;
    let mut text = format!(
        "outcome={} released={} status={} {after}",
        r.outcome.as_str(),
        format_units(r.asset, r.released),
        r.order_status.as_str()
    );
    replayed(&mut text, r.replayed);
    Ok(text)
}

async fn withdraw(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let (tenant, asset) = (args.tenant(), args.asset()?);
    let req = WithdrawRequest {
        tenant_id: tenant.clone(),
        withdrawal_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
        asset,
        amount: args.amount()?,
        destination: args.text("to")?.into(),
    };
    let r = withdraw::request(client, &req, &NoHooks)
        .await
        .map_err(shown)?;
    let after = balance(client, &tenant, &req.account_id, asset).await;
    let mut text = format!("outcome={} {after}", r.outcome.as_str());
    replayed(&mut text, r.replayed);
    Ok(text)
}

async fn settle(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let (tenant, key) = (args.tenant(), args.text("key")?);
    let to: withdraw::Status = args.text("status")?.parse().map_err(|e| format!("{e}"))?;
    let detail = args.0.arg("detail").unwrap_or("settled by the spec");
    let r = withdraw::settle(client, &tenant, key, to, detail, &NoHooks)
        .await
        .map_err(shown)?;
    let mut text = format!(
        "outcome={} status={} consumed={} released={}",
        r.outcome.as_str(),
        r.status.as_str(),
        r.consumed,
        r.released
    );
    replayed(&mut text, r.replayed);
    Ok(text)
}

async fn naive_cancel(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let tenant = args.tenant();
    let order = order_id(client, &tenant, args.text("order")?).await?;
    let (key, current) = (args.text("key")?, args.text("current")?);
    let (account, units) =
        spec_naive::cancel_at_current_price(client, &tenant, key, order, current)
            .await
            .map_err(|e| format!("{e:#}"))?;
    let after = balance(client, &tenant, &account, Asset::Usdt).await;
    Ok(format!(
        "outcome=OK {} status=CANCELLED {after}",
        spec_naive::released(units)
    ))
}

async fn naive_place(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let (tenant, req) = (args.tenant(), place_request(args)?);
    let fail = match args.0.arg("fail") {
        None => false,
        Some("after-update") => true,
        Some(other) => return Err(format!("fail={other}: only fail=after-update")),
    };
    let done = spec_naive::place_per_statement(client, &req, fail)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let after = balance(client, &tenant, &req.account_id, Asset::Usdt).await;
    Ok(format!("outcome={done} {after}"))
}

async fn reconcile(client: &mut Client, tenant: &str) -> Result<String, String> {
    let findings = frozen_balances::reconcile(client).await.map_err(shown)?;
    let sums = findings.totals_text(tenant);
    Ok(if findings.is_clean() {
        format!("clean=true {sums}")
    } else {
        // Each finding names its row, asset or order: `row default/bob BTC: …`.
        let named = findings.lines().join(" | ");
        format!("clean=false {sums} {} | {named}", findings.summary())
    })
}

impl Calls for FrozenCalls {
    fn check(&self, call: &Call) -> Result<(), String> {
        if let Some(checked) = spec_workers::check(call)
            .or_else(|| spec_network::check(call))
            .or_else(|| spec_spot::check(call))
        {
            return checked;
        }
        let (_, required, optional) = OPERATIONS
            .iter()
            .find(|(op, _, _)| *op == call.op)
            .ok_or_else(|| {
                let known: Vec<&str> = OPERATIONS.iter().map(|(op, _, _)| *op).collect();
                format!("unknown operation {:?} ({})", call.op, known.join(", "))
            })?;
        if let Some(missing) = required.iter().find(|name| call.arg(name).is_none()) {
            return Err(format!("needs {missing}="));
        }
        let known =
            |name: &str| name == "tenant" || required.contains(&name) || optional.contains(&name);
        match call.args.iter().find(|(name, _)| !known(name)) {
            Some((name, _)) => Err(format!("unknown argument {name:?}")),
            None => Ok(()),
        }
    }

    fn connections(&self, call: &Call) -> u32 {
        // A worker's own connection; an executor's; a service's pool.
        match call.op.as_str() {
            "worker" | "executor" => 1,
            "spot-service" => spec_spot::POOL_SIZE as u32,
            _ => 0,
        }
    }

    fn for_case(&self, ctx: &Ctx) -> Option<Arc<dyn Calls>> {
        let url = ctx.database_url().ok()?;
        let log = ctx.log_file("net-standin").ok()?;
        let store = log.with_file_name(format!("{}-net-standin.sqlite", ctx.case_id()));
        Some(Arc::new(CaseCalls {
            workers: Workers::new(url.clone()),
            network: Network::new(url.clone(), log, store),
            spot: Spot::new(url, ctx.log_file("ledger-svc").ok()?),
        }))
    }

    fn run<'a>(
        &'a self,
        client: &'a mut Client,
        call: &'a Call,
    ) -> BoxFuture<'a, Result<String, String>> {
        async move {
            self.check(call)?;
            if spec_workers::check(call)
                .or_else(|| spec_network::check(call))
                .is_some()
            {
                return Err(format!(
                    "{} needs the case's database (Calls::for_case)",
                    call.op
                ));
            }
            let args = Args(call);
            match call.op.as_str() {
                "deposit" => deposit(client, &args).await,
                "place" => place(client, &args).await,
                "fill" => fill(client, &args).await,
                "cancel" => cancel(client, &args).await,
                "withdraw" => withdraw(client, &args).await,
                "naive-cancel" => naive_cancel(client, &args).await,
                "settle" => settle(client, &args).await,
                "naive-place" => naive_place(client, &args).await,
                "balance" => {
                    let account = args.text("account")?;
                    Ok(balance(client, &args.tenant(), account, args.asset()?).await)
                }
                _ => reconcile(client, &args.tenant()).await,
            }
        }
        .boxed()
    }

    /// `frozen_balances::reconcile`: clean, and its findings' counts as `kind=N` words
    /// (`row_mismatches=0 unbalanced_assets=0 frozen_mismatches=0 …`).
    fn reconcile<'a>(
        &'a self,
        client: &'a mut Client,
    ) -> BoxFuture<'a, Result<(bool, String), String>> {
        async move {
            let findings = frozen_balances::reconcile(client).await.map_err(shown)?;
            Ok((findings.is_clean(), findings.summary()))
        }
        .boxed()
    }
}

/// The operations as one case runs them: [`FrozenCalls`], the case's crash-workers
/// (`worker`, `kill-worker`; [`spec_workers`]), whose backends count with the sessions,
/// its external network (`network`, `executor`, …; [`spec_network`]) and its
/// `ledger-svc` (`spot-service`, `post-place`, …; [`spec_spot`]).
struct CaseCalls {
    workers: Workers,
    network: Network,
    spot: Spot,
}

impl Calls for CaseCalls {
    fn check(&self, call: &Call) -> Result<(), String> {
        FrozenCalls.check(call)
    }

    fn run<'a>(
        &'a self,
        client: &'a mut Client,
        call: &'a Call,
    ) -> BoxFuture<'a, Result<String, String>> {
        let checks = (
            spec_workers::check(call),
            spec_network::check(call),
            spec_spot::check(call),
        );
        match checks {
            (Some(Err(e)), _, _) | (_, Some(Err(e)), _) | (_, _, Some(Err(e))) => {
                async move { Err(e) }.boxed()
            }
            (Some(Ok(())), _, _) => self.workers.run(client, call).boxed(),
            (_, Some(Ok(())), _) => self.network.run(client, call).boxed(),
            (_, _, Some(Ok(()))) => self.spot.run(client, call).boxed(),
            _ => FrozenCalls.run(client, call),
        }
    }

    fn backends(&self) -> Vec<i32> {
        self.workers.backends()
    }

    fn connections(&self, call: &Call) -> u32 {
        FrozenCalls.connections(call)
    }

    fn end(&self) {
        self.workers.end();
        self.network.end();
        self.spot.end();
    }

    fn reconcile<'a>(
        &'a self,
        client: &'a mut Client,
    ) -> BoxFuture<'a, Result<(bool, String), String>> {
        FrozenCalls.reconcile(client)
    }
}

/// The F family's spec cases from [`SPEC_DIR`]: `f<NN>_<what>.spec` as `F<NN>`,
/// `sN_<what>.spec` as `F-SN`.
pub fn cases() -> Vec<case_kit::Case> {
    spec::cases_in("F", Path::new(SPEC_DIR), "cases/frozen/specs", engine())
}

/// The F family's engine: its calls on PostgreSQL, in databases cloned from
/// [`super::TEMPLATE_DATABASE`].
pub fn engine() -> Arc<dyn spec::SpecEngine> {
    Arc::new(spec::PgEngine::new(
        super::TEMPLATE_DATABASE,
        Arc::new(FrozenCalls),
    ))
}
