//! PostgreSQL as an engine of the one runner: a family's operations over a
//! `tokio_postgres` connection ([`Calls`], its verb set) in the family's template
//! database. It offers everything the runner can do: waits read from PostgreSQL itself
//! (`pg_isolation_test_session_is_blocked`, the function PostgreSQL's own isolation
//! tester asks; PostgreSQL docs §9.27, "System Information Functions"), notices,
//! races, crashes and PostgreSQL's expected-output layout.

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_postgres::Client;

use super::engine::{
    EngineSession, Opening, Reconciled, ReconciledOthers, SessionFuture, SpecEngine,
};
use super::model::{Call, Calls, Layout};
use super::result::{connect_noticed, run_sql};
use crate::ctx::Ctx;

/// A family's operations on PostgreSQL, in databases cloned from `template`.
pub struct PgEngine {
    template: String,
    calls: Arc<dyn Calls>,
}

impl PgEngine {
    /// The engine of a family whose case files say `system: <template>` and whose
    /// calls are `calls`.
    pub fn new(template: impl Into<String>, calls: Arc<dyn Calls>) -> PgEngine {
        PgEngine {
            template: template.into(),
            calls,
        }
    }
}

/// The database of permutation `permutation` of the case in `ctx`: its own, then
/// `<its database>_pN` ([`Ctx::extra_database`]).
fn database(ctx: &Ctx, permutation: usize) -> String {
    match permutation {
        1 => ctx.database().to_string(),
        n => format!("{}_p{n}", ctx.database()),
    }
}

impl SpecEngine for PgEngine {
    fn system(&self) -> &str {
        &self.template
    }

    fn verbs(&self) -> Vec<&'static super::verbs::Verbs> {
        self.calls.verbs()
    }

    fn check(&self, call: &Call) -> Result<(), String> {
        self.calls.check(call)
    }

    fn postgres(&self) -> Option<Arc<dyn Calls>> {
        Some(self.calls.clone())
    }

    fn for_case(&self, ctx: &Ctx) -> Option<Arc<dyn SpecEngine>> {
        let calls = self.calls.for_case(ctx)?;
        Some(Arc::new(PgEngine::new(self.template.clone(), calls)))
    }

    fn connections(&self, call: &Call) -> u32 {
        self.calls.connections(call)
    }

    fn held<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, bool> {
        self.calls.waiting(call)
    }

    fn end(&self) {
        self.calls.end();
    }

    fn begin<'a>(&'a self, ctx: &'a Ctx, permutation: usize) -> BoxFuture<'a, anyhow::Result<()>> {
        async move {
            if permutation > 1 {
                let made = ctx.extra_database(&format!("p{permutation}")).await?;
                debug_assert_eq!(made, database(ctx, permutation));
            }
            Ok(())
        }
        .boxed()
    }

    fn connect<'a>(&'a self, ctx: &'a Ctx, opening: Opening) -> SessionFuture<'a> {
        async move {
            let name = database(ctx, opening.permutation);
            let client = match opening.session {
                Some((index, log)) => connect_noticed(ctx.config_for(&name)?, index, log).await?,
                None => ctx.connect_to(&name).await?,
            };
            let pid: i32 = client
                .query_one("SELECT pg_backend_pid()", &[])
                .await?
                .get(0);
            let session = PgSession {
                client,
                pid,
                layout: opening.layout,
                calls: self.calls.clone(),
            };
            Ok(Box::new(session) as Box<dyn EngineSession>)
        }
        .boxed()
    }

    fn reconcile_others<'a>(&'a self, ctx: &'a Ctx) -> BoxFuture<'a, ReconciledOthers> {
        async move {
            let mut reconciled = Vec::new();
            for name in ctx.clean_databases() {
                let outcome = match ctx.connect_to(&name).await {
                    Ok(mut client) => self.calls.reconcile(&mut client).await,
                    Err(error) => Err(format!("{error:#}")),
                };
                reconciled.push((name, outcome));
            }
            Ok(reconciled)
        }
        .boxed()
    }
}

/// One connection to a case's PostgreSQL database, with its backend pid.
struct PgSession {
    client: Client,
    pid: i32,
    layout: Layout,
    calls: Arc<dyn Calls>,
}

impl EngineSession for PgSession {
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>> {
        run_sql(&self.client, sql, self.layout).boxed()
    }

    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>> {
        self.calls.run(&mut self.client, call)
    }

    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        self.calls.reconcile(&mut self.client)
    }

    fn wait_id(&self) -> Option<u64> {
        Some(self.pid as u64)
    }

    /// Blocked by a lock held by one of `among` or by a backend the family's
    /// operations started ([`Calls::backends`]), or waiting for a safe snapshot.
    fn waiting<'a>(
        &'a mut self,
        ids: &'a [u64],
        among: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<u64>, String>> {
        async move {
            let mut pids: Vec<i32> = among.iter().map(|&id| id as i32).collect();
            pids.extend(self.calls.backends());
            let mut waiting = Vec::new();
            for &id in ids {
                let row = self
                    .client
                    .query_one(
                        "SELECT pg_catalog.pg_isolation_test_session_is_blocked($1::int4, $2::int4[])",
                        &[&(id as i32), &pids],
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if row.get::<_, bool>(0) {
                    waiting.push(id);
                }
            }
            Ok(waiting)
        }
        .boxed()
    }

    /// `pg_stat_activity.state` is `active` (PostgreSQL docs §27.2.3): after an error
    /// PostgreSQL sends the error first, then aborts the transaction and releases its
    /// locks (PostgresMain's error recovery, `src/backend/tcop/postgres.c`).
    fn still_active(&mut self, id: u64) -> BoxFuture<'_, Result<bool, String>> {
        async move {
            let row = self
                .client
                .query_opt(
                    "SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1::int4",
                    &[&(id as i32)],
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok(row.is_some_and(|row| row.get::<_, Option<bool>>(0).unwrap_or(false)))
        }
        .boxed()
    }

    fn cancel(&mut self, id: u64) -> BoxFuture<'_, bool> {
        async move {
            self.client
                .execute("SELECT pg_cancel_backend($1::int4)", &[&(id as i32)])
                .await
                .is_ok()
        }
        .boxed()
    }
}
