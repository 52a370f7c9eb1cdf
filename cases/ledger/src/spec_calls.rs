//! The ledger's library operations as spec steps (`call NAME: debit …`), and where the
//! L family's spec files live: `cases/ledger/specs/sN_<what>.spec`, each a case
//! `L-SN` found on disk at start-up (no registration line; see `case_kit::spec`).
//!
//! Operations, each one `points_ledger::transfer` (its own READ COMMITTED transaction, SPEC
//! §3) on the session's connection:
//! - `debit account=ID amount=N key=K [client=C]`: a DEBIT of N points into `sys-redeem`;
//! - `grant account=ID amount=N key=K [client=C]`: a GRANT of N points from `sys-issuer`;
//! - `reconcile`: the ledger's reconciliation (`points_ledger::reconcile`, one REPEATABLE
//!   READ snapshot) of the case's database, printed as its summary
//!   (`balance_mismatches=0 … global_sum=0`);
//! - `reconcile-orders ORDER=ACCOUNT:AMOUNT …`: the business system's orders against the
//!   ledger (`points_ledger::reconcile_orders`): `findings=1: order ord-2102 has 2
//!   debits (app-a/k-2102, app-a/k-2103)`.
//!
//! Further operations: the repair ([`super::spec_repair`]), crash-workers ([`super::spec_workers`]), `ledger-svc` over HTTP
//! ([`super::spec_service`]), the naive debit of the negative controls
//! ([`super::spec_naive`]), a retrying proxy and the naive keyless endpoint
//! ([`super::spec_proxy`]), the key registry in another database
//! ([`super::spec_split`]), a write load beside reconciliation rounds
//! ([`super::spec_load`]), locking designs raced inside one step
//! ([`super::spec_locking`]), a crash of the server in a step ([`super::spec_crash`]).
//!
//! `client` defaults to [`DEFAULT_CLIENT`]. The outcome prints as
//! `outcome=OK balance=20` (`replayed=true` added for a replay); an error as its SQLSTATE
//! and the server's message, or the ledger's own error text.

use std::sync::Arc;

use case_kit::spec::verbs::Verbs;
use case_kit::spec::{self, Call, CallFuture, Calls};
use case_kit::{Ctx, Racer};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use launch::worker::PausedWorkers;
use points_ledger::{NoHooks, TransferMode, TransferRequest, transfer_in};

use super::spec_service::Services;
use super::spec_workers;
use super::verbs;
use tokio_postgres::Client;

/// The client id of a call that names none.
pub use super::spec_workers::DEFAULT_CLIENT;

/// The ledger's operations, in a transfer mode (a spec case runs them in its mode,
/// [`super::modes::mode`], through [`Calls::for_case`]).
#[derive(Debug, Clone, Default)]
pub struct LedgerCalls {
    /// How each `debit` and `grant` reaches the database.
    pub mode: TransferMode,
    /// The crash-workers of the case (`worker`, `kill-worker`; [`super::spec_workers`]);
    /// `None` until [`Calls::for_case`] gives the case's database.
    pub workers: Option<Arc<PausedWorkers>>,
    /// The case's `ledger-svc` (`service`, `post-debit`, …; [`super::spec_service`]);
    /// `None` until [`Calls::for_case`].
    pub services: Option<Arc<Services>>,
    /// The case's database, for a call that needs a connection of its own (`repair`'s
    /// debits while frozen; [`super::spec_repair`]); `None` until [`Calls::for_case`].
    pub database_url: Option<String>,
    /// The case's retrying proxies and keyless endpoint (`proxy`, `proxy-debit`, …;
    /// [`super::spec_proxy`]); `None` until [`Calls::for_case`].
    pub proxies: Option<Arc<super::spec_proxy::Proxies>>,
    /// The case's write load and reconciliation rounds (`load-writer`,
    /// `reconcile-rounds`; [`super::spec_load`]).
    pub load: Arc<super::spec_load::Load>,
    /// The cluster's restart for `crash-server` ([`super::spec_crash`]); `None` unless
    /// the case declared that it restarts the server.
    pub restart: Option<case_kit::ServerRestart>,
}

fn request(call: &Call) -> Result<TransferRequest, String> {
    let account = call.arg("account").ok_or("needs account=ID")?;
    let key = call.arg("key").ok_or("needs key=K")?;
    let amount: i64 = call
        .arg("amount")
        .ok_or("needs amount=N")?
        .parse()
        .map_err(|_| "amount=N takes an integer number of points".to_string())?;
    let client = call.arg("client").unwrap_or(DEFAULT_CLIENT);
    for (name, _) in &call.args {
        if !["account", "key", "amount", "client"].contains(&name.as_str()) {
            return Err(format!("unknown argument {name:?}"));
        }
    }
    match call.op.as_str() {
        "debit" => Ok(TransferRequest::debit(client, key, account, amount)),
        "grant" => Ok(TransferRequest::grant(client, key, account, amount)),
        other => Err(format!("unknown operation {other:?} (debit, grant)")),
    }
}

impl Calls for LedgerCalls {
    fn verbs(&self) -> Vec<&'static Verbs> {
        verbs::ALL.to_vec()
    }

    /// The declarations ([`super::verbs`]), then what they cannot say: a worker's hook
    /// point, a repair's attempts, the orders of `reconcile-orders`.
    fn check(&self, call: &Call) -> Result<(), String> {
        spec::verbs::check(&self.verbs(), &call.op, &call.args)?;
        match call.op.as_str() {
            "worker" => spec_workers::check(call).unwrap_or(Ok(())),
            "repair" => super::spec_repair::check(call).unwrap_or(Ok(())),
            "reconcile-orders" => orders(call).map(|_| ()),
            op if verbs::LOCKING.has(op) => super::spec_locking::check(call),
            _ => Ok(()),
        }
    }

    fn for_case(&self, ctx: &Ctx) -> Option<Arc<dyn Calls>> {
        let mode = super::modes::mode(ctx);
        let url = ctx.database_url().ok();
        let workers = url.clone().map(|url| Arc::new(PausedWorkers::new(url)));
        let log = ctx.log_file("ledger-svc").ok();
        let services = url
            .zip(log)
            .map(|(url, log)| Arc::new(Services::new(url, log, mode)));
        Some(Arc::new(LedgerCalls {
            mode,
            workers,
            services,
            database_url: ctx.database_url().ok(),
            proxies: ctx
                .database_url()
                .ok()
                .map(|url| Arc::new(super::spec_proxy::Proxies::new(url))),
            load: Arc::default(),
            restart: ctx.server_restart().ok(),
        }))
    }

    fn backends(&self) -> Vec<i32> {
        self.workers
            .as_ref()
            .map(|w| w.backends())
            .unwrap_or_default()
    }

    fn connections(&self, call: &Call) -> u32 {
        // A service's pool; a worker's own connection.
        match call.op.as_str() {
            // Its pool, and the monitor that sees its backends wait.
            "service" => launch::service::DEFAULT_POOL_SIZE as u32 + 1,
            "worker" => 1,
            // The keyless endpoint's connection.
            "proxy" if call.arg("to") == Some("keyless") => 1,
            // The admin connection and the split ledger's; a worker's two and the
            // two that read what it left.
            "split-databases" => 2,
            "split-worker" => 4,
            // Their racers.
            op if verbs::LOCKING.has(op) => super::spec_locking::connections(call),
            _ => 0,
        }
    }

    fn end(&self) {
        if let Some(workers) = &self.workers {
            workers.end();
        }
        if let Some(services) = &self.services {
            services.end();
        }
        if let Some(proxies) = &self.proxies {
            proxies.end();
        }
    }

    fn waiting<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, bool> {
        async move {
            match &self.services {
                Some(services) => services.waiting(call).await,
                None => false,
            }
        }
        .boxed()
    }

    fn run_racing<'a>(&'a self, racer: &'a mut Racer, call: &'a Call) -> CallFuture<'a> {
        if call.op != "naive-debit" {
            return self.run(&mut racer.client, call);
        }
        super::spec_naive::run(&mut racer.client, call, Some(racer.barrier.as_ref())).boxed()
    }

    fn reconcile<'a>(
        &'a self,
        client: &'a mut Client,
    ) -> BoxFuture<'a, Result<(bool, String), String>> {
        async move {
            let findings = points_ledger::reconcile(client)
                .await
                .map_err(|e| format!("{e:#}"))?;
            Ok((findings.is_clean(), findings.summary()))
        }
        .boxed()
    }

    fn run<'a>(&'a self, client: &'a mut Client, call: &'a Call) -> CallFuture<'a> {
        async move {
            if call.op == "naive-debit" {
                return super::spec_naive::run(client, call, None).await;
            }
            if call.op == "reconcile" {
                let findings = points_ledger::reconcile(client)
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                return Ok(findings.summary());
            }
            if call.op == "repair" {
                let url = self
                    .database_url
                    .as_deref()
                    .ok_or("no database for a repair")?;
                return super::spec_repair::run(client, call, self.mode, url).await;
            }
            if call.op == "reconcile-orders" {
                return reconcile_orders(client, call).await;
            }
            if let Some(result) = self.run_later_ops(client, call).await {
                return result;
            }
            if verbs::SERVICE.has(&call.op) {
                let services = self.services.as_ref().ok_or("no database for a service")?;
                return services.run(call).await;
            }
            if verbs::PROCESSES.has(&call.op) || call.op == "kill-worker" {
                let workers = self.workers.as_ref().ok_or("no database for a worker")?;
                return spec_workers::run(workers, call).await;
            }
            let request = request(call)?;
            match transfer_in(self.mode, client, &request, &NoHooks).await {
                Ok(result) => {
                    let mut text = format!(
                        "outcome={} balance={}",
                        result.outcome.as_str(),
                        result.balance
                    );
                    if result.replayed {
                        text.push_str(" replayed=true");
                    }
                    Ok(text)
                }
                Err(points_ledger::LedgerError::Db { code, source }) => {
                    Err(match (code, source.as_db_error()) {
                        (Some(code), Some(db)) => format!("{code}: {}", db.message()),
                        _ => format!("(no SQLSTATE): {source}"),
                    })
                }
                Err(other) => Err(other.to_string()),
            }
        }
        .boxed()
    }
}

impl LedgerCalls {
    /// The operations of [`super::spec_proxy`], [`super::spec_locking`],
    /// [`super::spec_crash`], [`super::spec_split`] and [`super::spec_load`] (L17, L13,
    /// L14, L15, L22, L20); `None` for another operation.
    async fn run_later_ops(
        &self,
        client: &mut Client,
        call: &Call,
    ) -> Option<Result<String, String>> {
        if let Some(proxies) = &self.proxies
            && verbs::PROXIES.has(&call.op)
        {
            return Some(match &self.services {
                Some(services) => proxies.run(services, call).await,
                None => Err("no database for a service".into()),
            });
        }
        if verbs::LOCKING.has(&call.op) || call.op == "crash-server" {
            let Some(url) = self.database_url.as_deref() else {
                return Some(Err("no database".into()));
            };
            return Some(match call.op.as_str() {
                "crash-server" => super::spec_crash::run(self.restart.as_ref(), url, client).await,
                _ => super::spec_locking::run(self.mode, url, client, call).await,
            });
        }
        if ["split-databases", "split-worker"].contains(&call.op.as_str()) {
            return Some(match &self.workers {
                Some(workers) => super::spec_split::run(workers, call).await,
                None => Err("no database for a worker".into()),
            });
        }
        Some(match call.op.as_str() {
            "load-writer" => Ok(self.load.write(self.mode, client, call).await),
            "naive-reconcile" => super::spec_load::naive_once(client).await,
            "reconcile-rounds" => match self.database_url.as_deref() {
                Some(url) => self.load.rounds(self.mode, url, client, call).await,
                None => Err("no database".into()),
            },
            _ => return None,
        })
    }
}

/// The orders of a `reconcile-orders` call: each argument `ORDER=ACCOUNT:AMOUNT`.
///
/// Errors: no order, or an argument not of that shape.
fn orders(call: &Call) -> Result<Vec<points_ledger::Order>, String> {
    let orders = call.args.iter().map(|(order, value)| {
        let (account, amount) = value
            .split_once(':')
            .and_then(|(a, n)| Some((a, n.parse::<i64>().ok()?)))
            .ok_or_else(|| format!("{order}={value}: ORDER=ACCOUNT:AMOUNT"))?;
        Ok(points_ledger::Order {
            order_id: order.clone(),
            account_id: account.to_string(),
            amount,
        })
    });
    let orders = orders.collect::<Result<Vec<_>, String>>()?;
    if orders.is_empty() {
        return Err("reconcile-orders ORDER=ACCOUNT:AMOUNT …".into());
    }
    Ok(orders)
}

/// `reconcile-orders ORDER=ACCOUNT:AMOUNT …`: the business system's orders against the
/// ledger (`points_ledger::reconcile_orders`), printed as `findings=N` and each
/// finding's description after a colon, `; ` between them.
///
/// Errors: the arguments; the reconciliation's queries.
async fn reconcile_orders(client: &Client, call: &Call) -> Result<String, String> {
    let orders = orders(call)?;
    let found = points_ledger::reconcile_orders(client, &orders)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let described: Vec<String> = found.iter().map(|f| f.describe()).collect();
    match described.as_slice() {
        [] => Ok("findings=0".into()),
        _ => Ok(format!(
            "findings={}: {}",
            found.len(),
            described.join("; ")
        )),
    }
}

// The L family's spec cases (`SPEC_DIR`, `cases()`): `L-S1`, `L-S2`, ….
case_kit::spec_files!("L", "cases/ledger/specs", [engine()]);

/// The L family's engine: its calls on PostgreSQL, in databases cloned from
/// [`super::TEMPLATE_DATABASE`].
pub fn engine() -> Arc<dyn spec::SpecEngine> {
    Arc::new(spec::PgEngine::new(
        super::TEMPLATE_DATABASE,
        Arc::new(LedgerCalls::default()),
    ))
}
