//! The I family's case files (`cases/innodb/specs/`): the run's scratch MariaDB as the
//! spec runner's engine ([`case_kit::spec::SpecEngine`]), and the frozen-balance events
//! on InnoDB (`frozen_balances_innodb`) as calls.
//!
//! A session is a `mysql_async` product connection (`CLIENT_FOUND_ROWS` on, as the
//! product's own) to the case's database `i_<case id>`; permutation N > 1 runs on
//! `i_<case id>_pN`. Each database is created afresh, with the product's tables, the
//! first time a run of the case connects to it. SQL steps run there as written (the text
//! protocol; every value prints as the server sends it, `null` for NULL; an error as
//! `ERROR <MariaDB code> (<SQLSTATE>): message`).
//!
//! The verbs are declared in [`super::verbs`] (`./run.sh --verbs I`, docs/specs.md's
//! verb reference): the frozen balances' events (`deposit`, `place`, `fill`, `cancel`,
//! `balance`, `reconcile`), read and printed by `cases_frozen::spec_events`, the same
//! code family F runs on PostgreSQL, here over `frozen_balances_innodb`'s events on the
//! session's connection ([`EventEngine`] for `OnInnoDb`), which add `duplicates=N` /
//! `deadlocks=N` when an event met them (`frozen_balances_innodb::Tally`); and the
//! engine's own: `connect`, an event held at a hook point (`hold=POINT`, on a connection
//! of its own with a [`Gate`] there) and its `release`, `lock-waits`, `kill-server` and
//! `naive-register`. `fail=POINT` aborts an event at that hook point
//! (`cases_frozen::fixtures::FailAt`).
//!
//! Every session reports its connection id ([`EngineSession::wait_id`]) and which
//! connections wait for a lock (`INNODB_TRX`, and `PROCESSLIST` for the server's own
//! locks above InnoDB: metadata, table-level, user locks; [`EngineSession::waiting`]), so
//! a step seen waiting for a lock prints `<waiting ...>` and the next step is sent.
//!
//! `reconcile:` is the family's reconciliation (`frozen_balances_innodb::reconcile`): its
//! summary `row_mismatches=N …`, then each mismatched row as `row:alice:USDT=1` and each
//! unbalanced asset with its sum in minor units as `sum:BTC=1`.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use case_kit::AbortOnDrop;
use case_kit::Ctx;
use case_kit::spec::{self, Call, EngineSession, Reconciled, SessionFuture, SpecEngine};
use cases_frozen::spec_events::{self, Answer, Args, Done, EventEngine, Line, Request};
use cases_frozen::verbs::POSTGRES_ONLY;
use frozen_balances::{Asset, Findings, HookPoint, Hooks};
use frozen_balances_innodb::naive::{InsideRead, register_reading_inside};
use frozen_balances_innodb::{self as innodb, InnoError, Tally};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, TryFutureExt};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row, Value};

use crate::fixtures::{Db, Gate};
use crate::verbs;

/// What every file's `system:` says: the product's tables on InnoDB.
pub const SYSTEM: &str = "frozen_balances_innodb";

case_kit::spec_files!(
    crate::PREFIX,
    "cases/innodb/specs",
    [Arc::new(MariaDbEngine::default())]
);

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
    case_kit::spec_declares!(SYSTEM, verbs::ALL);

    /// The declarations ([`super::verbs`]), then what they cannot say: an event takes
    /// no argument only PostgreSQL's take, is either aborted or held, and at a hook
    /// point the library names.
    fn check(&self, call: &Call) -> Result<(), String> {
        spec::verbs::check(&self.verbs(), &call.op, &call.args)?;
        cases_frozen::verbs::refuse_the_others(call, &POSTGRES_ONLY, "InnoDB")?;
        if call.arg("fail").is_some() && call.arg("hold").is_some() {
            return Err("fail= and hold= together: an event is either aborted or held".into());
        }
        match call.arg("fail").or(call.arg("hold")) {
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

    fn connect<'a>(&'a self, ctx: &'a Ctx, opening: spec::Opening) -> SessionFuture<'a> {
        let permutation = opening.permutation;
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
            let session = Session {
                db,
                conn,
                held: None,
            };
            Ok(Box::new(session) as Box<dyn EngineSession>)
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
    /// The event this session holds at a hook point (`hold=POINT`), until `release`.
    held: Option<Held>,
}

/// An event paused at a hook point on a connection of its own, until released.
struct Held {
    gate: Arc<Gate>,
    task: AbortOnDrop<Result<String, String>>,
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

    /// An event with `hold=POINT`: run on a connection of its own with a [`Gate`] at
    /// that point; returns once the event is paused there (`held at balances-updated`),
    /// or with its error if it ended before reaching it.
    async fn hold(&mut self, call: &Call) -> Result<String, String> {
        let (kind, point) = spec_events::to_hold(call, self.held.is_some())?;
        let gate = Arc::new(Gate::new(kind, point));
        let mut conn = self.db.connect().await.map_err(|e| format!("{e:#}"))?;
        let (held, call) = (gate.clone(), call.clone());
        let mut task = AbortOnDrop::spawn(async move {
            spec_events::event(&mut OnInnoDb::new(&mut conn), &call, held.as_ref()).await
        });
        tokio::select! {
            () = gate.reached() => {}
            ended = &mut task => {
                let ended = ended.map_err(|e| e.to_string())?;
                return Err(format!("ended before {point}: {}", ended.unwrap_or_else(|e| e)));
            }
        }
        self.held = Some(Held { gate, task });
        Ok(format!("held at {point}"))
    }

    /// `release`: lets the held event go on and prints what it ends with. An event whose
    /// connection died meanwhile (`kill-server`, I8) prints `MariaDB client: connection
    /// lost`: the driver's own words vary with the moment the socket is found closed
    /// (closed, reset, broken pipe).
    async fn release(&mut self) -> Result<String, String> {
        let held = self.held.take().ok_or("no event held on this session")?;
        held.gate.release();
        let ended = held.task.await.map_err(|e| e.to_string())?;
        ended.map_err(|error| match error.starts_with("MariaDB client:") {
            true => "MariaDB client: connection lost".to_string(),
            false => error,
        })
    }
}

/// The product's events on one connection, and what they met on their way (a fresh
/// [`Tally`] per call). Family P runs them on a MariaDB of a case's own
/// (`cases_power::spec_mariadb`).
pub struct OnInnoDb<'c> {
    conn: &'c mut Conn,
    tally: Tally,
}

impl<'c> OnInnoDb<'c> {
    /// The events on `conn`, nothing met yet.
    pub fn new(conn: &'c mut Conn) -> OnInnoDb<'c> {
        OnInnoDb {
            conn,
            tally: Tally::default(),
        }
    }
}

impl EventEngine for OnInnoDb<'_> {
    fn event<'a>(&'a mut self, request: Request<'a>, hooks: &'a dyn Hooks) -> Answer<'a, Done> {
        let (conn, tally) = (&mut *self.conn, &self.tally);
        async move {
            let done = match request {
                Request::Deposit(r) => innodb::deposit(conn, r, hooks, tally)
                    .await
                    .map(Done::Deposit),
                Request::Place(r) => innodb::place(conn, r, hooks, tally).await.map(Done::Place),
                Request::Fill(r) => innodb::fill(conn, r, hooks, tally).await.map(Done::Fill),
                Request::Cancel(r) => innodb::cancel(conn, r, hooks, tally)
                    .await
                    .map(Done::Cancel),
            };
            done.map_err(shown)
        }
        .boxed()
    }

    fn balance<'a>(&'a mut self, tenant: &'a str, account: &'a str, asset: Asset) -> Line<'a> {
        innodb::query::balance_line(self.conn, tenant, account, asset)
            .map(|line| line.unwrap_or_else(|e| format!("balance unreadable: {}", shown(e))))
            .boxed()
    }

    fn placed<'a>(&'a mut self, tenant: &'a str, name: &'a str) -> Answer<'a, Option<i64>> {
        self.conn
            .exec_first(
                "SELECT order_id FROM spot_order WHERE tenant_id = ? AND place_business_id = ?",
                (tenant, name),
            )
            .map_err(|e| shown(e.into()))
            .boxed()
    }

    fn reconcile(&mut self) -> Answer<'_, Findings> {
        innodb::reconcile(self.conn).map_err(shown).boxed()
    }

    /// ` duplicates=N` / ` deadlocks=N` when the event met InnoDB's duplicate keys
    /// (1062) or deadlocks (1213) on its way.
    fn met(&self) -> String {
        let mut words = String::new();
        if self.tally.duplicates() > 0 {
            words.push_str(&format!(" duplicates={}", self.tally.duplicates()));
        }
        if self.tally.deadlocks() > 0 {
            words.push_str(&format!(" deadlocks={}", self.tally.deadlocks()));
        }
        words
    }
}

/// `kill-server`: SIGKILL to `mariadbd`, started again on its data and port (InnoDB's
/// crash recovery): `killed signal=9 restarted=another-process` once the old process is
/// gone and a new one answers.
async fn kill_server() -> Result<String, String> {
    let (old, new) = tokio::task::spawn_blocking(crate::server::kill_and_restart)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{e:#}"))?;
    let gone = !Path::new(&format!("/proc/{old}")).exists();
    if old == new || !gone {
        return Err(format!("the old process is not gone (old={old} new={new})"));
    }
    Ok("killed signal=9 restarted=another-process".into())
}

/// `naive-register account=A asset=X key=K`: the registration that reads the balance
/// first, then inserts, then reads the operation inside the same transaction
/// (`frozen_balances_innodb::naive::register_reading_inside`): `inside_read=NotFound`,
/// `inside_read=Found:OK` or `inside_read=Registered`.
async fn naive_register(conn: &mut Conn, args: &Args<'_>) -> Result<String, String> {
    let (tenant, account, key) = (args.tenant(), args.text("account")?, args.text("key")?);
    let read = register_reading_inside(conn, &tenant, key, account, args.asset()?)
        .await
        .map_err(shown)?;
    Ok(match read {
        InsideRead::NotFound => "inside_read=NotFound".into(),
        InsideRead::Found(outcome) => format!("inside_read=Found:{outcome}"),
        InsideRead::Registered => "inside_read=Registered".into(),
    })
}

impl EngineSession for Session {
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>> {
        async move { run_sql(&mut self.conn, sql).await }.boxed()
    }

    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>> {
        async move {
            let args = Args(call);
            match call.op.as_str() {
                "connect" => return self.reconnect(args.text("client")?).await,
                "release" => return self.release().await,
                _ if call.arg("hold").is_some() => return self.hold(call).await,
                _ => {}
            }
            let conn = &mut self.conn;
            match call.op.as_str() {
                "kill-server" => kill_server().await,
                "lock-waits" => {
                    let waiting = self.db.lock_waiters(conn).await;
                    Ok(format!(
                        "lock_waits={}",
                        waiting.map_err(|e| format!("{e:#}"))?
                    ))
                }
                "naive-register" => naive_register(conn, &args).await,
                _ => spec_events::run(&mut OnInnoDb::new(conn), call, ";").await,
            }
        }
        .boxed()
    }

    fn wait_id(&self) -> Option<u64> {
        Some(u64::from(self.conn.id()))
    }

    fn waiting<'a>(
        &'a mut self,
        ids: &'a [u64],
        _among: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<u64>, String>> {
        async move {
            crate::fixtures::lock_waiting(&mut self.conn, ids)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed()
    }

    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        reconciled(&mut self.conn).boxed()
    }
}

/// The family's reconciliation on `conn` as `reconcile:` reads it: whether it is clean,
/// and its summary `row_mismatches=N …`, then `row:alice:USDT=1` per mismatched row and
/// `sum:BTC=1` per unbalanced asset (minor units).
///
/// Errors: the reconciliation's, as [`shown`].
pub async fn reconciled(conn: &mut Conn) -> Reconciled {
    let findings = OnInnoDb::new(conn).reconcile().await?;
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

/// Runs `sql` (one or more statements): rows as `column=value`, `(0 rows)` for a
/// statement with columns and no rows, or one `ERROR …` line (rows before it dropped).
pub async fn run_sql(conn: &mut Conn, sql: &str) -> Vec<String> {
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
pub fn shown(error: InnoError) -> String {
    match error {
        InnoError::Server {
            code,
            state,
            message,
        } => format!("{code} ({state}): {message}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(text: &str) -> Call {
        let mut words = text.split_whitespace();
        let op = words.next().expect("a verb").to_string();
        let args = words
            .map(|w| w.split_once('=').expect("key=value"))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Call { op, args, line: 0 }
    }

    #[test]
    fn the_events_take_innodbs_arguments_and_refuse_postgresqls() {
        let engine = MariaDbEngine::default();
        let place = "place account=alice side=BUY qty=1.0 price=5000 key=p-1";
        for good in [
            format!("{place} fail=balances-updated"),
            format!("{place} hold=balances-updated show=reported"),
            "deposit account=alice asset=USDT amount=1 key=d tenant=t".to_string(),
            "connect client=default".to_string(),
            "naive-register account=alice asset=USDT key=k".to_string(),
        ] {
            assert_eq!(engine.check(&call(&good)), Ok(()), "{good}");
        }
        for (text, said) in [
            (
                format!("{place} fail-at=balances-updated"),
                "takes no fail-at= on InnoDB",
            ),
            (
                format!("{place} fail=x hold=balances-updated"),
                "either aborted or held",
            ),
            (format!("{place} hold=nowhere"), "nowhere"),
            (
                "withdraw account=a asset=BTC amount=1 to=x key=k".into(),
                "unknown verb",
            ),
            (
                "connect client=other".into(),
                "takes one of product, default",
            ),
        ] {
            let error = engine.check(&call(&text)).expect_err(&text);
            assert!(error.contains(said), "{text}: {error}");
        }
    }
}
