//! The frozen-balance events as spec steps (`call NAME: place …`) on PostgreSQL, and
//! where the F family's spec files live: `cases/frozen/specs/`, read when the family is
//! built, so a new file is a new case with no rebuild (`f<NN>_<what>.spec` is the case
//! `F<NN>`, `sN_<what>.spec` the case `F-SN`; `case_kit::spec::cases_in`).
//!
//! The verbs, their arguments and what they print are declared in [`super::verbs`]
//! (`./run.sh --verbs F`, docs/specs.md's verb reference). The events (`deposit`,
//! `place`, `fill`, `cancel`, `balance`, `reconcile`) are read and printed by
//! [`super::spec_events`], the same code family I runs on InnoDB; here they are the
//! library's own (`frozen_balances::place`, …: one READ COMMITTED transaction, SPEC §8)
//! on the session's connection ([`EventEngine`] for a `tokio_postgres::Client`), and
//! so are the withdrawals (`withdraw`, `settle`) and the naive designs
//! ([`super::spec_naive`]). Crash-workers ([`super::spec_workers`]), the external
//! network ([`super::spec_network`]), the spot routes ([`super::spec_spot`]) and events
//! held at a hook point, their `release` and the free rounds ([`super::spec_races`]) run
//! in the modules they name. An error prints as its SQLSTATE and the server's message, or
//! the library's error text (`invalid request: …`, `business id reused for a different
//! payload …`).

use std::sync::Arc;

use case_kit::spec::verbs::Verbs;
use case_kit::spec::{self, Call, CallFuture, Calls};
use case_kit::{Ctx, Racer};
use frozen_balances::amount::format_units;
use frozen_balances::withdraw::{self, WithdrawRequest};
use frozen_balances::{Asset, Findings, FrozenError, Hooks, NoHooks};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, TryFutureExt};
use launch::worker::PausedWorkers;
use tokio_postgres::Client;

use super::spec_events::{self, Answer, Args, Done, EventEngine, Line, Request};
use super::spec_locks::Locks;
use super::spec_naive;
use super::spec_network::Network;
use super::spec_races::Races;
use super::spec_settle::Deadlocks;
use super::spec_spot::{self, Spot};
use super::spec_workers;
use super::verbs;

/// The frozen-balance events as spec operations (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct FrozenCalls;

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

/// The library's events on a session's connection.
impl EventEngine for Client {
    fn event<'a>(&'a mut self, request: Request<'a>, hooks: &'a dyn Hooks) -> Answer<'a, Done> {
        async move {
            match request {
                Request::Deposit(req) => frozen_balances::deposit(self, req, hooks)
                    .await
                    .map(Done::Deposit),
                Request::Place(req) => frozen_balances::place(self, req, hooks)
                    .await
                    .map(Done::Place),
                Request::Fill(req) => frozen_balances::fill(self, req, hooks)
                    .await
                    .map(Done::Fill),
                Request::Cancel(req) => frozen_balances::cancel(self, req, hooks)
                    .await
                    .map(Done::Cancel),
            }
            .map_err(shown)
        }
        .boxed()
    }

    fn balance<'a>(&'a mut self, tenant: &'a str, account: &'a str, asset: Asset) -> Line<'a> {
        async move {
            match frozen_balances::query::balance(self, tenant, account, asset).await {
                Ok(b) => format!(
                    "available={} frozen={}",
                    format_units(asset, b.available),
                    format_units(asset, b.frozen)
                ),
                Err(error) => format!("balance unreadable: {}", shown(error)),
            }
        }
        .boxed()
    }

    fn placed<'a>(&'a mut self, tenant: &'a str, name: &'a str) -> Answer<'a, Option<i64>> {
        async move {
            let row = self
                .query_opt(
                    "SELECT order_id FROM spot_order WHERE tenant_id = $1 AND place_business_id = $2",
                    &[&tenant, &name],
                )
                .await
                .map_err(|e| shown(e.into()))?;
            Ok(row.map(|r| r.get(0)))
        }
        .boxed()
    }

    fn reconcile(&mut self) -> Answer<'_, Findings> {
        frozen_balances::reconcile(self).map_err(shown).boxed()
    }
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
    let after = EventEngine::balance(client, &tenant, &req.account_id, asset).await;
    let mut text = format!("outcome={} {after}", r.outcome.as_str());
    spec_events::replayed(&mut text, r.replayed);
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
    spec_events::replayed(&mut text, r.replayed);
    Ok(text)
}

async fn naive_cancel(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let tenant = args.tenant();
    let order = spec_events::order_id(client, &tenant, args.text("order")?).await?;
    let (key, current) = (args.text("key")?, args.text("current")?);
    let (account, units) =
        spec_naive::cancel_at_current_price(client, &tenant, key, order, current)
            .await
            .map_err(|e| format!("{e:#}"))?;
    let after = EventEngine::balance(client, &tenant, &account, Asset::Usdt).await;
    Ok(format!(
        "outcome=OK {} status=CANCELLED {after}",
        spec_naive::released(units)
    ))
}

async fn naive_place(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let req = args.place_request()?;
    let fail = args.0.arg("fail") == Some("after-update");
    let done = spec_naive::place_per_statement(client, &req, fail)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let after = EventEngine::balance(client, &req.tenant_id, &req.account_id, Asset::Usdt).await;
    Ok(format!("outcome={done} {after}"))
}

async fn unchecked_place(client: &mut Client, args: &Args<'_>) -> Result<String, String> {
    let req = args.place_request()?;
    let batched = args.0.arg("batch") == Some("yes");
    let done = spec_naive::place_unchecked(client, &req, batched)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let after = EventEngine::balance(client, &req.tenant_id, &req.account_id, Asset::Usdt).await;
    Ok(format!("outcome={done} {after}"))
}

/// Whether `call` is one a case's own calls run ([`CaseCalls`]): a worker's, the
/// network's, the spot routes', or a race's ([`is_a_race`]).
fn needs_the_case(call: &Call) -> bool {
    is_a_race(call)
        || [
            &verbs::WORKERS,
            &verbs::FAULTS,
            &verbs::NETWORK,
            &verbs::SPOT,
            &verbs::DEADLOCKS,
            &verbs::LOCKS,
        ]
        .iter()
        .any(|set| set.has(&call.op))
}

/// Whether `call` is one [`super::spec_races`] runs: an event with `hold=`, `release`,
/// or the free rounds.
fn is_a_race(call: &Call) -> bool {
    call.arg("hold").is_some() || call.op == "release" || verbs::RACES.has(&call.op)
}

impl Calls for FrozenCalls {
    fn verbs(&self) -> Vec<&'static Verbs> {
        verbs::ALL.to_vec()
    }

    /// The declarations ([`super::verbs`]), then what they cannot say: an event takes
    /// no argument only InnoDB's take, and a hook point is one the library names.
    fn check(&self, call: &Call) -> Result<(), String> {
        spec::verbs::check(&self.verbs(), &call.op, &call.args)?;
        verbs::refuse_the_others(call, &verbs::INNODB_ONLY, "PostgreSQL")?;
        if call.arg("fail-at").is_some() && call.arg("hold").is_some() {
            return Err("fail-at= and hold= together: an event is either aborted or held".into());
        }
        match (call.arg("fail-at"), call.arg("stop"), call.arg("hold")) {
            (Some(point), _, _) if call.op == "place" => spec_workers::hook_point(point),
            (_, Some(point), _) if call.op == "worker" => spec_workers::hook_point(point),
            (_, _, Some(point)) => spec_workers::hook_point(point),
            _ => Ok(()),
        }
    }

    fn connections(&self, call: &Call) -> u32 {
        // A worker's own connection; an executor's; a held event's; the free rounds'
        // fill and cancel; a service's pool and the monitor that sees its lock waits.
        match call.op.as_str() {
            _ if call.arg("hold").is_some() => 1,
            "worker" | "executor" => 1,
            // The two settlements of a pair.
            "naive-settle" => 2,
            // Each of `count=` placements.
            "locked-place" => call.arg("count").and_then(|n| n.parse().ok()).unwrap_or(0),
            "fill-cancel-rounds" => 2,
            "spot-service" => Spot::pool(call).unwrap_or(spec_spot::POOL_SIZE) as u32 + 1,
            _ => 0,
        }
    }

    fn for_case(&self, ctx: &Ctx) -> Option<Arc<dyn Calls>> {
        let url = ctx.database_url().ok()?;
        let log = ctx.log_file("net-standin").ok()?;
        let store = log.with_file_name(format!("{}-net-standin.sqlite", ctx.case_id()));
        Some(Arc::new(CaseCalls {
            deadlocks: Deadlocks::new(url.clone()),
            locks: Locks::new(url.clone()),
            workers: PausedWorkers::new(url.clone()),
            races: Races::new(url.clone()),
            network: Network::new(url.clone(), log, store),
            spot: Spot::new(url, ctx.log_file("ledger-svc").ok()?),
        }))
    }

    fn run<'a>(&'a self, client: &'a mut Client, call: &'a Call) -> CallFuture<'a> {
        async move {
            self.check(call)?;
            if needs_the_case(call) {
                return Err(format!(
                    "{} needs the case's database (Calls::for_case)",
                    call.op
                ));
            }
            if call.arg("meet").is_some() {
                return Err(format!("{} meet= needs a `race call:`", call.op));
            }
            let args = Args(call);
            match call.op.as_str() {
                "withdraw" => withdraw(client, &args).await,
                "settle" => settle(client, &args).await,
                "naive-cancel" => naive_cancel(client, &args).await,
                "naive-place" => naive_place(client, &args).await,
                "unchecked-place" => unchecked_place(client, &args).await,
                "reconcile-rules" => {
                    let assume_current = call.arg("assume") == Some("current");
                    frozen_balances::rules::reconcile_fills(client, assume_current)
                        .await
                        .map(|findings| findings.summary())
                        .map_err(|e| format!("{e:#}"))
                }
                _ => spec_events::run(client, call, " |").await,
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
            let findings = EventEngine::reconcile(client).await?;
            Ok((findings.is_clean(), findings.summary()))
        }
        .boxed()
    }
}

/// The operations as one case runs them: [`FrozenCalls`], F8's lock outside the database
/// (`locked-place`, `resume-place`; [`super::spec_locks`]), F9's deadlocks
/// (`naive-settle`, `fill … meet=`, `fill-attempts`; [`super::spec_settle`]), the case's
/// crash-workers (`worker`, `kill-worker`; [`spec_workers`]) and held events (`hold=`,
/// `release`, `fill-cancel-rounds`; [`super::spec_races`]), whose backends count with the sessions,
/// its external network (`network`, `executor`, …; [`spec_network`]) and its
/// `ledger-svc` (`spot-service`, `post-place`, …; [`spec_spot`]), whose requests in
/// flight may count as waiting ([`Spot::waiting`]).
struct CaseCalls {
    deadlocks: Deadlocks,
    locks: Locks,
    workers: PausedWorkers,
    races: Races,
    network: Network,
    spot: Spot,
}

impl Calls for CaseCalls {
    fn verbs(&self) -> Vec<&'static Verbs> {
        FrozenCalls.verbs()
    }

    fn check(&self, call: &Call) -> Result<(), String> {
        FrozenCalls.check(call)
    }

    fn run<'a>(&'a self, client: &'a mut Client, call: &'a Call) -> CallFuture<'a> {
        let op = call.op.as_str();
        if let Err(error) = self.check(call) {
            return async move { Err(error) }.boxed();
        }
        if is_a_race(call) {
            self.races.run(client, call).boxed()
        } else if verbs::WORKERS.has(op) || verbs::FAULTS.has(op) {
            spec_workers::run(&self.workers, client, call).boxed()
        } else if verbs::NETWORK.has(op) {
            self.network.run(client, call).boxed()
        } else if verbs::SPOT.has(op) {
            self.spot.run(client, call).boxed()
        } else if verbs::DEADLOCKS.has(op) {
            self.deadlocks.run(call).boxed()
        } else if verbs::LOCKS.has(op) {
            self.locks.run(client, call).boxed()
        } else {
            FrozenCalls.run(client, call)
        }
    }

    /// A `fill … meet=registered` racer meets the others at that hook point
    /// ([`Deadlocks::fill_meeting`]); any other racer runs as a step does.
    fn run_racing<'a>(&'a self, racer: &'a mut Racer, call: &'a Call) -> CallFuture<'a> {
        if call.op != "fill" || call.arg("meet").is_none() {
            return self.run(&mut racer.client, call);
        }
        async move {
            self.check(call)?;
            let (client, barrier) = (&mut racer.client, &racer.barrier);
            self.deadlocks.fill_meeting(client, call, barrier).await
        }
        .boxed()
    }

    fn backends(&self) -> Vec<i32> {
        let mut backends = self.workers.backends();
        backends.extend(self.races.backends());
        backends
    }

    /// An `executor` or `naive-withdraw` whose broadcast's answer the network holds
    /// ([`Network::waiting`]), a `locked-place` paused until `resume-place`
    /// ([`Locks::waiting`]), or a spot request held at a fault point or behind a lock
    /// ([`Spot::waiting`]): waits neither PostgreSQL nor the runner sees.
    fn waiting<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, bool> {
        async move {
            self.locks.waiting(call)
                || self.network.waiting(call).await
                || self.spot.waiting(call).await
        }
        .boxed()
    }

    fn connections(&self, call: &Call) -> u32 {
        FrozenCalls.connections(call)
    }

    fn end(&self) {
        self.workers.end();
        self.races.end();
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

// The F family's spec cases (`SPEC_DIR`, `cases()`): `f<NN>_<what>.spec` as `F<NN>`,
// `sN_<what>.spec` as `F-SN`.
case_kit::spec_files!("F", "cases/frozen/specs", [engine()]);

/// The F family's engine: its calls on PostgreSQL, in databases cloned from
/// [`super::TEMPLATE_DATABASE`].
pub fn engine() -> Arc<dyn spec::SpecEngine> {
    Arc::new(spec::PgEngine::new(
        super::TEMPLATE_DATABASE,
        Arc::new(FrozenCalls),
    ))
}
