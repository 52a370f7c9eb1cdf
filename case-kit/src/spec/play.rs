//! Playing one permutation: the sessions, each step sent on its session's connection,
//! waits read from PostgreSQL, markers honoured, notices printed in the order they
//! arrived, the transcript lines in the spec's layout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::model::{Action, Blocker, Calls, Entry, Layout, Spec, Step};
use super::result::{NoticeLog, Outcome, connect_noticed, is_error, run_action, run_sql};
use crate::ctx::Ctx;
use crate::race::AbortOnDrop;

/// Longest a step may stay in flight (running, waiting or held back by a marker)
/// before the permutation fails: the bound of every wait of the runner. PostgreSQL's
/// tester allows 300 s (`PGISOLATIONTIMEOUT`), and so do we; the case's own timeout
/// (`CASE_TIMEOUT_MS`) bounds the whole case first.
pub const STEP_WAIT_MS: u64 = 300_000;

/// The hang bound of the steps in flight, [`STEP_WAIT_MS`] from when a runner starts to
/// wait for them: a bound only, never what decides a claim. One definition for both
/// runners (PostgreSQL's here, the other engines' in `engines.rs`).
pub(crate) struct StepBound {
    deadline: Instant,
}

impl StepBound {
    /// Starts the bound now.
    pub(crate) fn start() -> StepBound {
        StepBound {
            deadline: Instant::now() + Duration::from_millis(STEP_WAIT_MS),
        }
    }

    /// `Ok` within the bound.
    ///
    /// Errors: past it, `step NAMES still in flight after 300 s` naming `in_flight`.
    pub(crate) fn check<'a>(&self, in_flight: impl Iterator<Item = &'a str>) -> anyhow::Result<()> {
        if Instant::now() < self.deadline {
            return Ok(());
        }
        let stuck: Vec<&str> = in_flight.collect();
        anyhow::bail!(
            "step {} still in flight after {} s",
            stuck.join(", "),
            STEP_WAIT_MS / 1000
        )
    }
}
/// How often the runner looks at steps in flight (completion, then
/// `pg_isolation_test_session_is_blocked`).
pub const POLL_INTERVAL_MS: u64 = 5;

/// A step in flight on its session's connection.
struct Flight {
    step: String,
    /// Its place in the permutation: completions print in this order.
    sent: usize,
    blockers: Vec<Blocker>,
    /// Sent with `(*)` in this round: reported waiting, not looked at until the next.
    fresh_once: bool,
    /// Aborted when the flight is dropped (a case cancelled midway), so no step task
    /// outlives its case.
    handle: AbortOnDrop<(Client, Outcome)>,
}

struct Live {
    pid: i32,
    client: Option<Client>,
    flight: Option<Flight>,
}

/// One permutation's sessions and its transcript lines.
pub struct Play<'a> {
    monitor: Client,
    sessions: Vec<Live>,
    pids: Vec<i32>,
    spec: &'a Spec,
    calls: Arc<dyn Calls>,
    notices: NoticeLog,
    notices_printed: usize,
    lines: &'a mut Vec<String>,
}

impl<'a> Play<'a> {
    /// Opens one session per spec session on `database` (each with its backend pid and
    /// its own setup run, whose rows are printed) and the monitor connection.
    ///
    /// Errors: connection failures; a session setup that fails.
    pub async fn open(
        ctx: &Ctx,
        database: &str,
        spec: &'a Spec,
        calls: Arc<dyn Calls>,
        lines: &'a mut Vec<String>,
    ) -> anyhow::Result<Play<'a>> {
        let notices = NoticeLog::default();
        let mut sessions = Vec::new();
        for (index, session) in spec.sessions.iter().enumerate() {
            let config = ctx.config_for(database)?;
            let client = connect_noticed(config, index, notices.clone()).await?;
            let pid: i32 = client
                .query_one("SELECT pg_backend_pid()", &[])
                .await?
                .get(0);
            for sql in &session.setup {
                let outcome = run_sql(&client, sql, spec.layout).await;
                if is_error(&outcome) {
                    let shown = outcome.join(" ");
                    anyhow::bail!("setup of session {}: {shown}", session.name);
                }
                print_rows(
                    lines,
                    spec.layout,
                    &format!("setup of {}", session.name),
                    sql,
                    outcome,
                );
            }
            sessions.push(Live {
                pid,
                client: Some(client),
                flight: None,
            });
        }
        Ok(Play {
            monitor: ctx.connect_to(database).await?,
            pids: sessions.iter().map(|s| s.pid).collect(),
            sessions,
            spec,
            calls,
            notices,
            notices_printed: 0,
            lines,
        })
    }

    fn print(&mut self, text: String) {
        self.lines.push(text);
    }

    fn print_outcome(&mut self, outcome: Outcome) {
        let indent = if self.spec.layout == Layout::Ours {
            "  "
        } else {
            ""
        };
        for line in outcome {
            self.lines.push(format!("{indent}{line}"));
        }
    }

    /// Prints the notices that arrived since the last call, each after its session's
    /// name, as PostgreSQL's tester does (`s1: NOTICE:  message`).
    fn print_notices(&mut self) {
        let fresh: Vec<(usize, String)> = {
            let log = self.notices.lock().unwrap_or_else(|p| p.into_inner());
            log[self.notices_printed..].to_vec()
        };
        self.notices_printed += fresh.len();
        for (session, text) in fresh {
            let name = &self.spec.sessions[session].name;
            self.lines.push(format!("{name}: {text}"));
        }
    }

    fn notices_of(&self, session: usize) -> usize {
        let log = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().filter(|(s, _)| *s == session).count()
    }

    /// Whether `session` waits, per PostgreSQL: for a lock held by another session of
    /// the spec (or a backend the family's operations started, [`Calls::backends`]), or
    /// for a safe snapshot (`pg_isolation_test_session_is_blocked`, the
    /// function PostgreSQL's own tester asks; PostgreSQL docs §9.27).
    async fn blocked(&self, session: usize) -> anyhow::Result<bool> {
        let mut pids = self.pids.clone();
        pids.extend(self.calls.backends());
        let row = self
            .monitor
            .query_one(
                "SELECT pg_catalog.pg_isolation_test_session_is_blocked($1::int4, $2::int4[])",
                &[&self.sessions[session].pid, &pids],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Whether the step in flight on `session` is a call its family reports waiting
    /// ([`Calls::waiting`]: a request paused at a service's hook point, say).
    async fn held(&self, session: usize) -> bool {
        let Some(flight) = &self.sessions[session].flight else {
            return false;
        };
        match self.spec.find(&flight.step) {
            Some((
                _,
                Step {
                    action: Action::Call(call),
                    ..
                },
            )) => self.calls.waiting(call).await,
            _ => false,
        }
    }

    /// Whether the backend of `session` still runs a statement (`pg_stat_activity.state`
    /// is `active`; PostgreSQL docs §27.2.3): it turns idle only once the statement, or
    /// the abort after its error, is over, just before the backend says it is ready.
    async fn active(&self, session: usize) -> anyhow::Result<bool> {
        let row = self
            .monitor
            .query_opt(
                "SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1::int4",
                &[&self.sessions[session].pid],
            )
            .await?;
        Ok(row.is_some_and(|row| row.get::<_, Option<bool>>(0).unwrap_or(false)))
    }

    /// Polls until every step in flight has completed (its backend idle again) or is
    /// blocked (per PostgreSQL); `must_finish` is a session whose step must complete.
    ///
    /// Errors: that did not happen within [`STEP_WAIT_MS`].
    async fn settle(&mut self, must_finish: Option<usize>) -> anyhow::Result<()> {
        let bound = StepBound::start();
        loop {
            let mut quiet = true;
            for index in 0..self.sessions.len() {
                let Some(flight) = &self.sessions[index].flight else {
                    continue;
                };
                if flight.handle.0.is_finished() {
                    // After an error PostgreSQL sends the error first, then aborts the
                    // transaction and releases its locks (PostgresMain's error recovery,
                    // src/backend/tcop/postgres.c): until the backend is idle, the steps
                    // it blocks are not settled.
                    if self.active(index).await? {
                        quiet = false;
                    }
                } else if must_finish == Some(index)
                    || !(self.blocked(index).await? || self.held(index).await)
                {
                    quiet = false;
                }
            }
            if quiet {
                return Ok(());
            }
            self.bail_after(&bound)?;
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
    }

    fn bail_after(&self, bound: &StepBound) -> anyhow::Result<()> {
        bound.check(
            self.sessions
                .iter()
                .filter_map(|s| s.flight.as_ref())
                .map(|f| f.step.as_str()),
        )
    }

    /// Whether the finished step of `session` may be reported complete: not sent with
    /// `(*)` in this round, no step it names still in flight, the notices it waits for
    /// arrived.
    fn releasable(&self, session: usize) -> bool {
        let Some(flight) = &self.sessions[session].flight else {
            return false;
        };
        if !flight.handle.0.is_finished() || flight.fresh_once {
            return false;
        }
        flight.blockers.iter().all(|blocker| match blocker {
            Blocker::Once => true,
            Blocker::Step(other) => !self
                .sessions
                .iter()
                .filter_map(|s| s.flight.as_ref())
                .any(|f| &f.step == other),
            Blocker::Notices(other, count) => self
                .spec
                .find(other)
                .is_some_and(|(s, _)| self.notices_of(s) >= *count),
        })
    }

    /// Takes the finished step of `session` back: its connection and its outcome.
    async fn land(&mut self, session: usize) -> anyhow::Result<(Flight, Outcome)> {
        let mut flight = self.sessions[session]
            .flight
            .take()
            .expect("a step in flight");
        let (client, outcome) = (&mut flight.handle).await?;
        self.sessions[session].client = Some(client);
        Ok((flight, outcome))
    }

    /// Reports, in the order they were sent, the completions of steps shown waiting
    /// that may now be reported; returns how many.
    async fn print_completed(&mut self, except: Option<usize>) -> anyhow::Result<usize> {
        let mut waiting: Vec<(usize, usize)> = (0..self.sessions.len())
            .filter(|&s| Some(s) != except)
            .filter_map(|s| self.sessions[s].flight.as_ref().map(|f| (f.sent, s)))
            .collect();
        waiting.sort();
        let mut count = 0;
        for (_, session) in waiting {
            if self.releasable(session) {
                self.print_notices();
                let (flight, outcome) = self.land(session).await?;
                self.print(format!("step {}: <... completed>", flight.step));
                self.print_outcome(outcome);
                count += 1;
            }
        }
        Ok(count)
    }

    /// Waits until `session` has no step in flight, reporting completions meanwhile.
    ///
    /// Errors: it still has one after [`STEP_WAIT_MS`].
    async fn drain(&mut self, session: Option<usize>) -> anyhow::Result<()> {
        let bound = StepBound::start();
        loop {
            let busy = |play: &Self| match session {
                Some(s) => play.sessions[s].flight.is_some(),
                None => play.sessions.iter().any(|s| s.flight.is_some()),
            };
            if !busy(self) {
                return Ok(());
            }
            self.settle(session).await?;
            if self.print_completed(None).await? == 0 && busy(self) {
                self.bail_after(&bound)?;
                tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
            }
        }
    }

    /// Sends `step` (of `session`, the `order`th of the permutation, with the markers
    /// of `entry`) and prints what it and the steps it released did.
    ///
    /// Errors: a wait that did not end within [`STEP_WAIT_MS`]; a step task that
    /// panicked.
    pub async fn send(
        &mut self,
        session: usize,
        step: &Step,
        entry: &Entry,
        order: usize,
    ) -> anyhow::Result<()> {
        // The session still waits: only another step can release it, or an error (a
        // deadlock) ends its step. Wait for that, as PostgreSQL's tester does.
        self.drain(Some(session)).await?;
        let mut client = self.sessions[session]
            .client
            .take()
            .expect("an idle session");
        let (action, calls, layout) = (step.action.clone(), self.calls.clone(), self.spec.layout);
        let handle = tokio::spawn(async move {
            let outcome = run_action(&mut client, &action, calls.as_ref(), layout).await;
            (client, outcome)
        });
        let once = entry.blockers.contains(&Blocker::Once);
        self.sessions[session].flight = Some(Flight {
            step: step.name.clone(),
            sent: order,
            blockers: entry.blockers.clone(),
            fresh_once: once,
            handle: AbortOnDrop(handle),
        });
        let shown = match (layout, &step.action) {
            (Layout::Postgres, super::model::Action::Sql(sql)) => sql.clone(),
            (_, action) => action.display(),
        };
        if !once {
            self.settle(None).await?;
        }
        self.print_notices();
        if self.releasable(session) {
            let (_, outcome) = self.land(session).await?;
            self.print(format!("step {}: {shown}", step.name));
            self.print_outcome(outcome);
        } else {
            self.print(format!("step {}: {shown} <waiting ...>", step.name));
        }
        if once {
            self.settle(None).await?;
        }
        self.print_completed(Some(session)).await?;
        if let Some(flight) = &mut self.sessions[session].flight {
            flight.fresh_once = false;
        }
        Ok(())
    }

    /// Waits for every step still in flight, then prints the notices left.
    ///
    /// Errors: one is still in flight after [`STEP_WAIT_MS`].
    pub async fn finish(&mut self) -> anyhow::Result<()> {
        self.drain(None).await?;
        self.print_notices();
        Ok(())
    }

    /// Cancels every step in flight and takes the connections back (on a failure).
    pub async fn cancel(&mut self) {
        for index in 0..self.sessions.len() {
            let Some(flight) = self.sessions[index].flight.take() else {
                continue;
            };
            let pid = self.sessions[index].pid;
            let _ = self
                .monitor
                .execute("SELECT pg_cancel_backend($1::int4)", &[&pid])
                .await;
            let abort = flight.handle.0.abort_handle();
            if tokio::time::timeout(Duration::from_millis(STEP_WAIT_MS), flight.handle)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// Runs every session's teardown (rows printed in PostgreSQL's layout only, as its
    /// tester does) and closes the sessions.
    pub async fn teardown(mut self) {
        for (index, session) in self.spec.sessions.iter().enumerate() {
            let Some(client) = self.sessions[index].client.take() else {
                continue;
            };
            for sql in &session.teardown {
                let outcome = run_sql(&client, sql, self.spec.layout).await;
                if self.spec.layout == Layout::Postgres && !is_error(&outcome) {
                    self.lines.extend(outcome);
                }
            }
        }
    }
}

/// Prints the rows a setup or teardown returned: in PostgreSQL's layout as its tester
/// does (the table, nothing when none), in ours as `<what>: SQL` and the rows indented,
/// only when the SQL returned rows.
pub fn print_rows(lines: &mut Vec<String>, layout: Layout, what: &str, sql: &str, rows: Outcome) {
    match layout {
        Layout::Postgres => lines.extend(rows),
        Layout::Ours if rows.is_empty() => {}
        Layout::Ours => {
            let shown = sql.split_whitespace().collect::<Vec<_>>().join(" ");
            lines.push(format!("{what}: {shown}"));
            lines.extend(rows.into_iter().map(|row| format!("  {row}")));
        }
    }
}

/// Runs the spec's setup on `client`; rows printed ([`print_rows`]).
///
/// Errors: a setup item that fails.
pub async fn setup(
    client: &mut Client,
    spec: &Spec,
    calls: &dyn Calls,
    lines: &mut Vec<String>,
) -> anyhow::Result<()> {
    for action in &spec.setup {
        let outcome = run_action(client, action, calls, spec.layout).await;
        if let Some(failed) = outcome.iter().find(|line| line.starts_with("ERROR")) {
            anyhow::bail!("setup {} failed: {failed}", action.display());
        }
        if let super::model::Action::Sql(sql) = action {
            print_rows(lines, spec.layout, "setup", sql, outcome);
        }
    }
    Ok(())
}

/// Runs the spec's teardown on `client`: ours prints `teardown: SQL` and its rows,
/// PostgreSQL's layout the rows only.
pub async fn teardown(client: &Client, spec: &Spec, lines: &mut Vec<String>) {
    for sql in &spec.teardown {
        let outcome = run_sql(client, sql, spec.layout).await;
        match spec.layout {
            Layout::Postgres => lines.extend(outcome),
            Layout::Ours => {
                let shown = sql.split_whitespace().collect::<Vec<_>>().join(" ");
                lines.push(format!("teardown: {shown}"));
                lines.extend(outcome.into_iter().map(|line| format!("  {line}")));
            }
        }
    }
}
