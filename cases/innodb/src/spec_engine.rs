//! The I family's case files (`cases/innodb/specs/`): the run's scratch MariaDB as the
//! spec runner's engine ([`case_kit::spec::SpecEngine`]), and the frozen-balance events
//! on InnoDB (`frozen_balances_innodb`) as calls.
//!
//! A session is a `mysql_async` product connection (`CLIENT_FOUND_ROWS` on, as the
//! product's own) to the case's database `i_<case id>`; permutation N > 1 runs on
//! `i_<case id>_pN`. Each database is created afresh, with the product's tables, the
//! first time a run of the case connects to it. SQL steps run there as written (the text
//! protocol; every value prints as the server sends it, `null` for NULL; an error as
//! `ERROR <MariaDB code> (<SQLSTATE>): message`). The calls print as the F family's
//! (`cases_frozen::spec_calls`), on InnoDB:
//!
//! - `connect client=default` → `connected client=default`: the session's connection
//!   replaced by one with the client's default options (no `CLIENT_FOUND_ROWS`);
//!   `client=product` goes back
//! - `deposit account=A asset=USDT amount=10000 key=K` → `outcome=OK available=… frozen=…`
//! - `place account=A side=BUY qty=1.0 price=5000 key=K [market=BTC-USDT]` →
//!   `outcome=OK order=1 freeze=5005.000000 fee_reserve=5.000000 available=… frozen=…`
//! - `fill buy=ORDER sell=ORDER qty=0.4 price=4900 key=K` → `outcome=OK notional=…
//!   buyer_fee=… seller_fee=… buyer_frozen_taken=… buyer_returned=… seller_received=…
//!   buy_status=OPEN sell_status=FILLED`, or `outcome=ORDER_CLOSED closed=1 status=…`
//! - `cancel account=A order=ORDER key=K` → `outcome=OK released=… status=CANCELLED
//!   available=… frozen=…`
//! - `balance account=A asset=USDT` → `available=… frozen=…`
//! - `reconcile` → `clean=true BTC=0.00000000 USDT=0.000000`, or `clean=false`, the
//!   sums, the findings' counts and each finding (`row default/alice USDT: …`, `;`
//!   between them)
//!
//! An order is named by the business id it was placed under (`buy=place-i101`) or by its
//! number (`#3`); every call takes `tenant=T` (default `default`); `replayed=true` is
//! added to an event read back from an earlier request with the same business id, and
//! `duplicates=N`/`deadlocks=N` when the event met InnoDB's duplicate-key (1062) or
//! deadlock (1213) errors on its way (`frozen_balances_innodb::Tally`). Every event takes
//! `fail=POINT` (a hook point such as `balances-updated` or `after-commit`): the event
//! is aborted there (`cases_frozen::fixtures::FailAt`) and prints its error.
//! `reconcile:` is the family's reconciliation (`frozen_balances_innodb::reconcile`): its
//! summary `row_mismatches=N …`, then each mismatched row as `row:alice:USDT=1` and each
//! unbalanced asset with its sum in minor units as `sum:BTC=1`.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use case_kit::spec::{self, Call, EngineSession, Reconciled, SpecEngine};
use case_kit::{Case, Ctx};
use frozen_balances::amount::{format_units, parse_amount, parse_price, parse_quantity};
use frozen_balances::{
    Asset, CancelRequest, DEFAULT_TENANT, DepositRequest, EventKind, FillRequest, HookPoint, Hooks,
    Market, NoHooks, PlaceRequest,
};
use frozen_balances_innodb::{InnoError, Tally};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use crate::fixtures::{Db, FailAt};

/// Where the family's case files are.
pub const SPEC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/specs");
/// What every file's `system:` says: the product's tables on InnoDB.
pub const SYSTEM: &str = "frozen_balances_innodb";

/// Each operation with its required arguments, then its optional ones (`tenant` is
/// optional everywhere).
const OPERATIONS: [(&str, &[&str], &[&str]); 7] = [
    ("connect", &["client"], &[]),
    ("deposit", &["account", "asset", "amount", "key"], &["fail"]),
    (
        "place",
        &["account", "side", "qty", "price", "key"],
        &["market", "fail"],
    ),
    (
        "fill",
        &["buy", "sell", "qty", "price", "key"],
        &["market", "fail"],
    ),
    ("cancel", &["account", "order", "key"], &["fail"]),
    ("balance", &["account", "asset"], &[]),
    ("reconcile", &[], &[]),
];

/// The family's case files, read now (no registration, no rebuild).
pub fn cases() -> Vec<Case> {
    spec::engine_cases_in(
        crate::PREFIX,
        Path::new(SPEC_DIR),
        "cases/innodb/specs",
        SYSTEM,
        Arc::new(MariaDbEngine::default()),
    )
}

/// The run's scratch MariaDB as an engine: a database per case and permutation.
#[derive(Default)]
pub struct MariaDbEngine {
    /// Databases created in the current run of their case (cleared when it starts).
    created: Mutex<HashSet<String>>,
}

impl MariaDbEngine {
    fn created(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.created
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl SpecEngine for MariaDbEngine {
    fn check(&self, call: &Call) -> Result<(), String> {
        let (_, required, optional) = OPERATIONS
            .iter()
            .find(|(op, _, _)| *op == call.op)
            .ok_or_else(|| format!("unknown operation {:?}", call.op))?;
        if let Some(missing) = required.iter().find(|name| call.arg(name).is_none()) {
            return Err(format!("needs {missing}="));
        }
        let known =
            |name: &str| name == "tenant" || required.contains(&name) || optional.contains(&name);
        if let Some((name, _)) = call.args.iter().find(|(name, _)| !known(name)) {
            return Err(format!("unknown argument {name:?}"));
        }
        match call.arg("fail") {
            Some(point) => point
                .parse::<HookPoint>()
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    fn describe(&self, ctx: &mut Ctx) {
        // A new run of the case: its databases are made afresh at their first use.
        let own = database(ctx, 1);
        self.created()
            .retain(|name| name != &own && !name.starts_with(&format!("{own}_p")));
    }

    fn connect<'a>(
        &'a self,
        ctx: &'a Ctx,
        permutation: usize,
    ) -> BoxFuture<'a, anyhow::Result<Box<dyn EngineSession>>> {
        let name = database(ctx, permutation);
        async move {
            let fresh = !self.created().contains(&name);
            let db = if fresh {
                let db = Db::open_named(&name).await?;
                self.created().insert(name);
                db
            } else {
                Db { name }
            };
            let conn = db.connect().await?;
            Ok(Box::new(Session { db, conn }) as Box<dyn EngineSession>)
        }
        .boxed()
    }
}

/// The database of permutation `permutation` of the case in `ctx`.
fn database(ctx: &Ctx, permutation: usize) -> String {
    let own = format!("i_{}", ctx.case_id().to_lowercase());
    match permutation {
        1 => own,
        n => format!("{own}_p{n}"),
    }
}

/// One connection to a case's database: the product's, until `connect client=default`.
struct Session {
    db: Db,
    conn: Conn,
}

impl Session {
    /// `connect client=product|default`: the session's connection replaced by a new one
    /// with the product's options (`CLIENT_FOUND_ROWS`) or the client's defaults.
    async fn reconnect(&mut self, client: &str) -> Result<String, String> {
        let conn = match client {
            "product" => self.db.connect().await,
            "default" => self.db.connect_plain().await,
            other => return Err(format!("client={other}: product or default")),
        };
        self.conn = conn.map_err(|e| format!("{e:#}"))?;
        Ok(format!("connected client={client}"))
    }
}

impl EngineSession for Session {
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>> {
        async move { run_sql(&mut self.conn, sql).await }.boxed()
    }

    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>> {
        async move {
            let args = Args(call);
            if call.op == "connect" {
                return self.reconnect(args.text("client")?).await;
            }
            let conn = &mut self.conn;
            match call.op.as_str() {
                "deposit" => deposit(conn, &args).await,
                "place" => place(conn, &args).await,
                "fill" => fill(conn, &args).await,
                "cancel" => cancel(conn, &args).await,
                "balance" => {
                    let account = args.text("account")?;
                    Ok(balance(conn, &args.tenant(), account, args.asset()?).await)
                }
                "reconcile" => reconcile_call(conn, &args.tenant()).await,
                other => Err(format!("unknown operation {other:?}")),
            }
        }
        .boxed()
    }

    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        async move {
            let findings = frozen_balances_innodb::reconcile(&mut self.conn)
                .await
                .map_err(shown)?;
            let mut words = vec![findings.summary()];
            let rows = findings.row_mismatches.iter();
            words.extend(rows.map(|m| format!("row:{}:{}=1", m.account_id, m.asset)));
            let assets = findings.unbalanced_assets();
            words.extend(
                assets
                    .iter()
                    .map(|t| format!("sum:{}={}", t.asset, t.total)),
            );
            Ok((findings.is_clean(), words.join(" ")))
        }
        .boxed()
    }
}

/// Runs `sql` (one or more statements): rows as `column=value`, `(0 rows)` for a
/// statement with columns and no rows, or one `ERROR …` line (rows before it dropped).
async fn run_sql(conn: &mut Conn, sql: &str) -> Vec<String> {
    let error = |e: mysql_async::Error| vec![format!("ERROR {}", shown(e.into()))];
    let mut result = match conn.query_iter(sql).await {
        Ok(result) => result,
        Err(e) => return error(e),
    };
    let mut out = Vec::new();
    loop {
        let columns = result.columns();
        let rows: Vec<Row> = match result.collect().await {
            Ok(rows) => rows,
            Err(e) => return error(e),
        };
        if let Some(columns) = columns.filter(|c| !c.is_empty()) {
            if rows.is_empty() {
                out.push("(0 rows)".to_string());
            }
            for row in rows {
                let cells = columns.iter().enumerate().map(|(i, column)| {
                    let value = row.as_ref(i).map_or_else(|| "null".into(), print_value);
                    format!("{}={value}", column.name_str())
                });
                out.push(cells.collect::<Vec<_>>().join(" "));
            }
        }
        if result.is_empty() {
            return out;
        }
    }
}

/// A value as the server sent it (text protocol: bytes).
fn print_value(value: &Value) -> String {
    match value {
        Value::NULL => "null".to_string(),
        Value::Bytes(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::Int(n) => n.to_string(),
        Value::UInt(n) => n.to_string(),
        other => other.as_sql(true),
    }
}

/// An error as printed after `ERROR `: the MariaDB code, SQLSTATE and message, or the
/// library's text.
fn shown(error: InnoError) -> String {
    match error {
        InnoError::Server {
            code,
            state,
            message,
        } => format!("{code} ({state}): {message}"),
        other => other.to_string(),
    }
}

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
        let market = self.0.arg("market").unwrap_or("BTC-USDT");
        market.parse().map_err(|e| format!("{e}"))
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

/// `available=… frozen=…` of one balance row, in whole coins of `asset`.
async fn balance(conn: &mut Conn, tenant: &str, account: &str, asset: Asset) -> String {
    frozen_balances_innodb::query::balance_line(conn, tenant, account, asset)
        .await
        .unwrap_or_else(|e| format!("balance unreadable: {}", shown(e)))
}

/// The order an argument names: `#N`, or the business id it was placed under.
///
/// Errors: no order placed under that id; a server error.
async fn order_id(conn: &mut Conn, tenant: &str, name: &str) -> Result<i64, String> {
    if let Some(number) = name.strip_prefix('#') {
        return number
            .parse()
            .map_err(|_| format!("bad order number {name:?}"));
    }
    let row: Option<i64> = conn
        .exec_first(
            "SELECT order_id FROM spot_order WHERE tenant_id = ? AND place_business_id = ?",
            (tenant, name),
        )
        .await
        .map_err(|e| shown(e.into()))?;
    row.ok_or_else(|| format!("no order placed under business id {name:?}"))
}

/// The hooks of an event of `kind`: `fail=POINT` aborts it there ([`FailAt`]), none
/// otherwise.
fn hooks(args: &Args<'_>, kind: EventKind) -> Result<Box<dyn Hooks>, String> {
    Ok(match args.0.arg("fail") {
        Some(point) => Box::new(FailAt {
            kind,
            point: point.parse().map_err(|e| format!("{e}"))?,
        }),
        None => Box::new(NoHooks),
    })
}

/// ` replayed=true` for a replay, then ` duplicates=N` / ` deadlocks=N` when the event
/// met InnoDB's duplicate keys (1062) or deadlocks (1213) on its way.
fn replayed(text: &mut String, replayed: bool, tally: &Tally) {
    if replayed {
        text.push_str(" replayed=true");
    }
    if tally.duplicates() > 0 {
        text.push_str(&format!(" duplicates={}", tally.duplicates()));
    }
    if tally.deadlocks() > 0 {
        text.push_str(&format!(" deadlocks={}", tally.deadlocks()));
    }
}

async fn deposit(conn: &mut Conn, args: &Args<'_>) -> Result<String, String> {
    let tally = Tally::default();
    let (tenant, asset) = (args.tenant(), args.asset()?);
    let req = DepositRequest {
        tenant_id: tenant.clone(),
        business_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
        asset,
        amount: args.amount()?,
    };
    let result = frozen_balances_innodb::deposit(
        conn,
        &req,
        hooks(args, EventKind::Deposit)?.as_ref(),
        &tally,
    )
    .await
    .map_err(shown)?;
    let after = balance(conn, &tenant, &req.account_id, asset).await;
    let mut text = format!("outcome={} {after}", result.outcome.as_str());
    replayed(&mut text, result.replayed, &tally);
    Ok(text)
}

async fn place(conn: &mut Conn, args: &Args<'_>) -> Result<String, String> {
    let tally = Tally::default();
    let tenant = args.tenant();
    let req = PlaceRequest {
        tenant_id: tenant.clone(),
        business_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
        market: args.market()?,
        side: args.text("side")?.parse().map_err(|e| format!("{e}"))?,
        quantity: args.quantity()?,
        limit_price: args.price()?,
    };
    let result =
        frozen_balances_innodb::place(conn, &req, hooks(args, EventKind::Place)?.as_ref(), &tally)
            .await
            .map_err(shown)?;
    let asset = result.frozen_asset;
    let after = balance(conn, &tenant, &req.account_id, asset).await;
    let order = result.order_id.map(|id| format!(" order={id}"));
    let mut text = format!(
        "outcome={}{} freeze={} fee_reserve={} {after}",
        result.outcome.as_str(),
        order.unwrap_or_default(),
        format_units(asset, result.frozen_amount),
        format_units(asset, result.fee_reserve),
    );
    replayed(&mut text, result.replayed, &tally);
    Ok(text)
}

async fn fill(conn: &mut Conn, args: &Args<'_>) -> Result<String, String> {
    let tally = Tally::default();
    let (tenant, market) = (args.tenant(), args.market()?);
    let req = FillRequest {
        tenant_id: tenant.clone(),
        fill_id: args.text("key")?.into(),
        buy_order_id: order_id(conn, &tenant, args.text("buy")?).await?,
        sell_order_id: order_id(conn, &tenant, args.text("sell")?).await?,
        quantity: args.quantity()?,
        price: args.price()?,
    };
    let r =
        frozen_balances_innodb::fill(conn, &req, hooks(args, EventKind::Fill)?.as_ref(), &tally)
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
    replayed(&mut text, r.replayed, &tally);
    Ok(text)
}

async fn cancel(conn: &mut Conn, args: &Args<'_>) -> Result<String, String> {
    let tally = Tally::default();
    let tenant = args.tenant();
    let req = CancelRequest {
        tenant_id: tenant.clone(),
        business_id: args.text("key")?.into(),
        account_id: args.text("account")?.into(),
        order_id: order_id(conn, &tenant, args.text("order")?).await?,
    };
    let r = frozen_balances_innodb::cancel(
        conn,
        &req,
        hooks(args, EventKind::Cancel)?.as_ref(),
        &tally,
    )
    .await
    .map_err(shown)?;
    let after = balance(conn, &tenant, &req.account_id, r.asset).await;
    let mut text = format!(
        "outcome={} released={} status={} {after}",
        r.outcome.as_str(),
        format_units(r.asset, r.released),
        r.order_status.as_str()
    );
    replayed(&mut text, r.replayed, &tally);
    Ok(text)
}

/// `reconcile`: the per-asset sums, and the findings with their lines when any.
async fn reconcile_call(conn: &mut Conn, tenant: &str) -> Result<String, String> {
    let findings = frozen_balances_innodb::reconcile(conn)
        .await
        .map_err(shown)?;
    let sums = findings.totals_text(tenant);
    Ok(if findings.is_clean() {
        format!("clean=true {sums}")
    } else {
        let lines = findings.lines().join("; ");
        format!("clean=false {sums} {}; {lines}", findings.summary())
    })
}
