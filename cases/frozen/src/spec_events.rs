//! The frozen balances' events as calls ([`super::verbs::EVENTS`]), written once over
//! either engine: a call's arguments read into the library's requests
//! (`frozen_balances::PlaceRequest`, …) and the answer printed, the same on PostgreSQL
//! (family F, [`super::spec_calls`]) and InnoDB (family I, `cases_innodb::spec_engine`).
//! What differs between the engines is behind [`EventEngine`]: the events themselves,
//! a balance row, the order placed under a business id, the reconciliation, and what
//! an event met on its way.
//!
//! Amounts are decimal text in whole coins, parsed by the library's rules
//! (`frozen_balances::amount`); an order is named by the business id it was placed under
//! (`order=place-0101`) or by its number (`order=#3`); every event takes `tenant=T`
//! (default [`DEFAULT_TENANT`]); `replayed=true` is added to an event read back from an
//! earlier request with the same business id.

use case_kit::spec::Call;
use frozen_balances::amount::{format_units, parse_amount, parse_price, parse_quantity};
use frozen_balances::{
    Asset, CancelRequest, CancelResult, DEFAULT_TENANT, DepositRequest, DepositResult, EventKind,
    FillRequest, FillResult, Findings, HookPoint, Hooks, Market, NoHooks, OrderStatus,
    PlaceRequest, PlaceResult,
};
use futures_util::future::BoxFuture;

use super::fixtures::FailAt;

/// What an engine answers: its result, or its error as printed after `ERROR `.
pub type Answer<'a, T> = BoxFuture<'a, Result<T, String>>;
/// A line an engine prints whatever happens (a read's error in its words).
pub type Line<'a> = BoxFuture<'a, String>;

/// An event's request, as the library takes it.
pub enum Request<'a> {
    /// `deposit`.
    Deposit(&'a DepositRequest),
    /// `place`.
    Place(&'a PlaceRequest),
    /// `fill`.
    Fill(&'a FillRequest),
    /// `cancel`.
    Cancel(&'a CancelRequest),
}

/// An event's result, of the kind its [`Request`] was.
pub enum Done {
    /// `deposit`'s.
    Deposit(DepositResult),
    /// `place`'s.
    Place(PlaceResult),
    /// `fill`'s.
    Fill(FillResult),
    /// `cancel`'s.
    Cancel(CancelResult),
}

/// One engine's connection as the events need it: the product's events on it, and the
/// reads their answers print. Errors are already in the engine's printed form
/// (PostgreSQL's SQLSTATE and message, MariaDB's code, SQLSTATE and message, or the
/// library's text).
pub trait EventEngine: Send {
    /// The product's event (`frozen_balances::place` or its InnoDB port, …) with
    /// `hooks`: a [`Done`] of the request's kind.
    fn event<'a>(&'a mut self, request: Request<'a>, hooks: &'a dyn Hooks) -> Answer<'a, Done>;
    /// `available=… frozen=…` of one balance row in whole coins of `asset`, or
    /// `balance unreadable: …`.
    fn balance<'a>(&'a mut self, tenant: &'a str, account: &'a str, asset: Asset) -> Line<'a>;
    /// The order placed under business id `name`, if any.
    fn placed<'a>(&'a mut self, tenant: &'a str, name: &'a str) -> Answer<'a, Option<i64>>;
    /// The engine's reconciliation of the connection's database.
    fn reconcile(&mut self) -> Answer<'_, Findings>;
    /// Words added after an event's answer (InnoDB: ` duplicates=N deadlocks=N` when
    /// the event met them). Default: none.
    fn met(&self) -> String {
        String::new()
    }
}

/// An event's answer as printed, and whether it was a replay.
type Printed = Result<(String, bool), String>;

/// The answer to a request that is of another kind than asked.
fn mismatched() -> String {
    "the engine answered an event of another kind".into()
}

/// A call's arguments, read with the error a spec author can act on.
pub struct Args<'c>(pub &'c Call);

impl Args<'_> {
    /// The argument `name`.
    ///
    /// Errors: `needs NAME=`.
    pub fn text(&self, name: &str) -> Result<&str, String> {
        self.0.arg(name).ok_or_else(|| format!("needs {name}="))
    }
    /// `tenant=`, or [`DEFAULT_TENANT`].
    pub fn tenant(&self) -> String {
        self.0.arg("tenant").unwrap_or(DEFAULT_TENANT).to_string()
    }
    /// `market=`, or BTC-USDT.
    ///
    /// Errors: no such market.
    pub fn market(&self) -> Result<Market, String> {
        let market = self.0.arg("market").unwrap_or("BTC-USDT");
        market.parse().map_err(|e| format!("{e}"))
    }
    /// `asset=`.
    ///
    /// Errors: missing, or no such asset.
    pub fn asset(&self) -> Result<Asset, String> {
        self.text("asset")?.parse().map_err(|e| format!("{e}"))
    }
    /// `amount=` in minor units of `asset=`.
    ///
    /// Errors: the library's rules.
    pub fn amount(&self) -> Result<i64, String> {
        parse_amount("amount", self.asset()?, self.text("amount")?).map_err(|e| e.to_string())
    }
    /// `qty=` in lots of the market.
    ///
    /// Errors: the library's rules.
    pub fn quantity(&self) -> Result<i64, String> {
        parse_quantity(self.market()?, self.text("qty")?).map_err(|e| e.to_string())
    }
    /// `price=` in ticks of the market.
    ///
    /// Errors: the library's rules.
    pub fn price(&self) -> Result<i64, String> {
        parse_price(self.market()?, self.text("price")?).map_err(|e| e.to_string())
    }

    /// The placement request a `place` (or `naive-place`) call names.
    ///
    /// Errors: a missing or ill-formed argument.
    pub fn place_request(&self) -> Result<PlaceRequest, String> {
        Ok(PlaceRequest {
            tenant_id: self.tenant(),
            business_id: self.text("key")?.into(),
            account_id: self.text("account")?.into(),
            market: self.market()?,
            side: self.text("side")?.parse().map_err(|e| format!("{e}"))?,
            quantity: self.quantity()?,
            limit_price: self.price()?,
        })
    }
}

/// The kind of the event `op` names, `None` for a call that is no event.
pub fn event_kind(op: &str) -> Option<EventKind> {
    Some(match op {
        "deposit" => EventKind::Deposit,
        "place" => EventKind::Place,
        "fill" => EventKind::Fill,
        "cancel" => EventKind::Cancel,
        _ => return None,
    })
}

/// The event a `hold=POINT` call is to hold, and where: its kind and hook point, for a
/// session that holds none yet (`holding`: whether it does). Both engines hold it the
/// same way, on a connection of its own with a gate at that point.
///
/// Errors: the session already holds an event; the call is no event; no such hook point.
pub fn to_hold(call: &Call, holding: bool) -> Result<(EventKind, HookPoint), String> {
    if holding {
        return Err("this session already holds an event: release it first".into());
    }
    let kind = event_kind(&call.op).ok_or_else(|| format!("{} is no event", call.op))?;
    let point = Args(call)
        .text("hold")?
        .parse()
        .map_err(|e| format!("{e}"))?;
    Ok((kind, point))
}

/// The hooks of an event of `kind`: `fail=POINT` (InnoDB) or `fail-at=POINT`
/// (PostgreSQL; each family's check refuses the other's) aborts it at that hook point
/// ([`FailAt`]); none otherwise.
///
/// Errors: no such hook point.
pub fn hooks(call: &Call, kind: EventKind) -> Result<Box<dyn Hooks>, String> {
    Ok(match call.arg("fail").or(call.arg("fail-at")) {
        Some(point) => Box::new(FailAt {
            kind,
            point: point.parse().map_err(|e| format!("{e}"))?,
        }),
        None => Box::new(NoHooks),
    })
}

/// Runs the call `call` names: an event (with the hooks its `fail=`/`fail-at=` says),
/// `balance` or `reconcile` (its findings' lines joined by `separator`).
///
/// Errors: what [`event`] and [`reconciled`] say; a call that is none of these.
pub async fn run<E: EventEngine>(
    engine: &mut E,
    call: &Call,
    separator: &str,
) -> Result<String, String> {
    let args = Args(call);
    match call.op.as_str() {
        "balance" => {
            let account = args.text("account")?;
            Ok(engine.balance(&args.tenant(), account, args.asset()?).await)
        }
        "reconcile" => reconciled(engine, &args.tenant(), separator).await,
        op => {
            let kind = event_kind(op).ok_or_else(|| format!("{op} is no event"))?;
            event(engine, call, hooks(call, kind)?.as_ref()).await
        }
    }
}

/// Runs the event `call` names on `engine` with `hooks` and prints its answer.
///
/// Errors: a missing or ill-formed argument, an unknown order, the engine's error.
pub async fn event<E: EventEngine>(
    engine: &mut E,
    call: &Call,
    hooks: &dyn Hooks,
) -> Result<String, String> {
    let args = Args(call);
    let (mut text, was_replayed) = match call.op.as_str() {
        "deposit" => deposit(engine, &args, hooks).await?,
        "place" => place(engine, &args, hooks).await?,
        "fill" => fill(engine, &args, hooks).await?,
        "cancel" => cancel(engine, &args, hooks).await?,
        other => return Err(format!("{other} is no event")),
    };
    replayed(&mut text, was_replayed);
    text.push_str(&engine.met());
    Ok(text)
}

/// The order an argument names: `#N`, or the business id it was placed under.
///
/// Errors: no order placed under that id; the engine's error.
pub async fn order_id<E: EventEngine>(
    engine: &mut E,
    tenant: &str,
    name: &str,
) -> Result<i64, String> {
    if let Some(number) = name.strip_prefix('#') {
        return number
            .parse()
            .map_err(|_| format!("bad order number {name:?}"));
    }
    engine
        .placed(tenant, name)
        .await?
        .ok_or_else(|| format!("no order placed under business id {name:?}"))
}

/// ` replayed=true` after a replay's answer.
pub fn replayed(text: &mut String, replayed: bool) {
    if replayed {
        text.push_str(" replayed=true");
    }
}

async fn deposit(engine: &mut impl EventEngine, args: &Args<'_>, hooks: &dyn Hooks) -> Printed {
    let req = DepositRequest {
        tenant_id: args.tenant(),
        business_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
        asset: args.asset()?,
        amount: args.amount()?,
    };
    let Done::Deposit(r) = engine.event(Request::Deposit(&req), hooks).await? else {
        return Err(mismatched());
    };
    let after = engine
        .balance(&req.tenant_id, &req.account_id, req.asset)
        .await;
    let text = format!("outcome={} {after}", r.outcome.as_str());
    Ok((text, r.replayed))
}

async fn place(engine: &mut impl EventEngine, args: &Args<'_>, hooks: &dyn Hooks) -> Printed {
    let req = args.place_request()?;
    let Done::Place(r) = engine.event(Request::Place(&req), hooks).await? else {
        return Err(mismatched());
    };
    let asset = r.frozen_asset;
    let after = engine.balance(&req.tenant_id, &req.account_id, asset).await;
    let order = r.order_id.map(|id| format!(" order={id}"));
    let mut text = format!(
        "outcome={}{} freeze={} fee_reserve={} {after}",
        r.outcome.as_str(),
        order.unwrap_or_default(),
        format_units(asset, r.frozen_amount),
        format_units(asset, r.fee_reserve),
    );
    if args.0.arg("show") == Some("reported") {
        let reported = format_units(asset, r.available);
        text.push_str(&format!(" reported_available={reported}"));
    }
    Ok((text, r.replayed))
}

async fn fill(engine: &mut impl EventEngine, args: &Args<'_>, hooks: &dyn Hooks) -> Printed {
    let (tenant, market) = (args.tenant(), args.market()?);
    let req = FillRequest {
        buy_order_id: order_id(engine, &tenant, args.text("buy")?).await?,
        sell_order_id: order_id(engine, &tenant, args.text("sell")?).await?,
        tenant_id: tenant,
        fill_id: args.text("key")?.into(),
        quantity: args.quantity()?,
        price: args.price()?,
    };
    let Done::Fill(r) = engine.event(Request::Fill(&req), hooks).await? else {
        return Err(mismatched());
    };
    let mut text = format!("outcome={}", r.outcome.as_str());
    if let Some((order, status)) = r.closed_order {
        text.push_str(&format!(" closed={order} status={}", status.as_str()));
    } else {
        let q = |units| format_units(market.quote(), units);
        let status = |s: Option<OrderStatus>| s.map_or("-", |s| s.as_str());
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
    Ok((text, r.replayed))
}

async fn cancel(engine: &mut impl EventEngine, args: &Args<'_>, hooks: &dyn Hooks) -> Printed {
    let tenant = args.tenant();
    let req = CancelRequest {
        order_id: order_id(engine, &tenant, args.text("order")?).await?,
        tenant_id: tenant,
        business_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
    };
    let Done::Cancel(r) = engine.event(Request::Cancel(&req), hooks).await? else {
        return Err(mismatched());
    };
    let after = engine
        .balance(&req.tenant_id, &req.account_id, r.asset)
        .await;
    let text = format!(
        "outcome={} released={} status={} {after}",
        r.outcome.as_str(),
        format_units(r.asset, r.released),
        r.order_status.as_str()
    );
    Ok((text, r.replayed))
}

/// `reconcile`: `clean=true` and `tenant`'s per-asset sums, or `clean=false`, the sums,
/// the findings' counts and each finding (`row default/bob BTC: …`), each after
/// `separator` (` |` on PostgreSQL, `;` on InnoDB).
///
/// Errors: the engine's.
pub async fn reconciled<E: EventEngine>(
    engine: &mut E,
    tenant: &str,
    separator: &str,
) -> Result<String, String> {
    let findings = engine.reconcile().await?;
    let sums = findings.totals_text(tenant);
    Ok(if findings.is_clean() {
        format!("clean=true {sums}")
    } else {
        let lines = findings.lines().join(&format!("{separator} "));
        format!(
            "clean=false {sums} {}{separator} {lines}",
            findings.summary()
        )
    })
}
