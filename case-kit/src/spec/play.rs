//! Playing one permutation on any engine: the sessions, each step sent on its
//! session's connection, waits read from the engine's monitor, markers honoured,
//! notices printed in the order they arrived, the transcript lines in the spec's
//! layout.

use std::time::{Duration, Instant};

use futures_util::FutureExt;

use super::engine::{EngineSession, Opening, SpecEngine};
use super::model::{Action, Blocker, Entry, Layout, Spec, Step};
use super::result::{NoticeLog, Outcome, is_error};
use crate::ctx::Ctx;
use crate::race::AbortOnDrop;

/// Longest a step may stay in flight (running, waiting or held back by a marker)
/// before the permutation fails: the bound of every wait of the runner. PostgreSQL's
/// tester allows 300 s (`PGISOLATIONTIMEOUT`), and so do we; the case's own timeout
/// (`CASE_TIMEOUT_MS`) bounds the whole case first.
pub const STEP_WAIT_MS: u64 = 300_000;

/// The hang bound of the steps in flight, [`STEP_WAIT_MS`] from when the runner starts
/// to wait for them: a bound only, never what decides a claim.
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

/// How often the runner looks at steps in flight (completion, then the monitor).
pub const POLL_INTERVAL_MS: u64 = 5;

/// How long the monitor's reopening is tried after it failed (a server restarted by a
/// step, L15's `crash-server`, accepts connections again only once it has recovered);
/// a hang bound only.
pub const MONITOR_REOPEN_MS: u64 = 30_000;

/// A connection as a step's task hands it back, with what the step printed.
type Landed = (Box<dyn EngineSession>, Outcome);

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
    handle: AbortOnDrop<Landed>,
}

struct Live {
    /// The connection's [`EngineSession::wait_id`].
    id: Option<u64>,
    connection: Option<Box<dyn EngineSession>>,
    flight: Option<Flight>,
}

/// One permutation's sessions and its transcript lines.
pub struct Play<'a> {
    ctx: &'a Ctx,
    engine: &'a dyn SpecEngine,
    permutation: usize,
    /// The connection waits are asked on, opened at first need.
    monitor: Option<Box<dyn EngineSession>>,
    sessions: Vec<Live>,
    /// Every session's id, when every session has one: the engine observes waits.
    ids: Option<Vec<u64>>,
    spec: &'a Spec,
    notices: NoticeLog,
    notices_printed: usize,
    lines: &'a mut Vec<String>,
}

/// A setup item or a step on `connection`: SQL's rows, or the call's outcome (`ERROR `
/// and its error; a result of several lines as several lines).
pub async fn act(connection: &mut dyn EngineSession, action: &Action) -> Outcome {
    match action {
        Action::Sql(sql) => connection.sql(sql).await,
        Action::Call(call) => match connection.call(call).await {
            Ok(outcome) => outcome.lines().map(String::from).collect(),
            Err(error) => vec![format!("ERROR {error}")],
        },
    }
}

impl<'a> Play<'a> {
    /// Opens one session per spec session on the database of `permutation` (each with
    /// its own setup run, whose rows are printed).
    ///
    /// Errors: connection failures; a session setup that fails.
    pub async fn open(
        ctx: &'a Ctx,
        engine: &'a dyn SpecEngine,
        permutation: usize,
        spec: &'a Spec,
        lines: &'a mut Vec<String>,
    ) -> anyhow::Result<Play<'a>> {
        let notices = NoticeLog::default();
        let mut sessions = Vec::new();
        for (index, session) in spec.sessions.iter().enumerate() {
            let opening = Opening {
                permutation,
                layout: spec.layout,
                session: Some((index, notices.clone())),
            };
            let mut connection = engine.connect(ctx, opening).await?;
            for sql in &session.setup {
                let outcome = connection.sql(sql).await;
                if is_error(&outcome) {
                    let shown = outcome.join(" ");
                    anyhow::bail!("setup of session {}: {shown}", session.name);
                }
                let what = format!("setup of {}", session.name);
                print_rows(lines, spec.layout, &what, sql, outcome);
            }
            sessions.push(Live {
                id: connection.wait_id(),
                connection: Some(connection),
                flight: None,
            });
        }
        let ids = sessions.iter().map(|s| s.id).collect::<Option<Vec<u64>>>();
        Ok(Play {
            ctx,
            engine,
            permutation,
            monitor: None,
            ids: ids.filter(|ids| !ids.is_empty()),
            sessions,
            spec,
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

    /// The monitor, opened (or reopened once after an error: a server restarted by a
    /// step closes it, and accepts a new connection only once it is up again, so the
    /// reopening is tried until [`MONITOR_REOPEN_MS`] has passed) and asked `ask`.
    ///
    /// Errors: the engine could not be asked twice; the monitor could not be opened.
    async fn ask<T>(
        &mut self,
        ask: impl for<'m> Fn(
            &'m mut Box<dyn EngineSession>,
        ) -> futures_util::future::BoxFuture<'m, Result<T, String>>,
    ) -> anyhow::Result<T> {
        for attempt in 0..2 {
            if self.monitor.is_none() {
                let opening = Opening::plain(self.permutation, Layout::Ours);
                let deadline = Instant::now() + Duration::from_millis(MONITOR_REOPEN_MS);
                let monitor = loop {
                    match self.engine.connect(self.ctx, opening.clone()).await {
                        Ok(monitor) => break monitor,
                        Err(_) if attempt == 1 && Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
                        }
                        Err(error) => return Err(error),
                    }
                };
                self.monitor = Some(monitor);
            }
            let monitor = self.monitor.as_mut().expect("a monitor");
            match ask(monitor).await {
                Ok(answer) => return Ok(answer),
                Err(error) if attempt == 1 => anyhow::bail!("waits unreadable: {error}"),
                Err(_) => self.monitor = None,
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Whether the step in flight on `session` waits: the engine's monitor reports it
    /// waiting for a lock, or the family reports its call held
    /// ([`SpecEngine::held`]: a request paused at a service's hook point, say).
    async fn waits(&mut self, session: usize) -> anyhow::Result<bool> {
        let (Some(ids), Some(id)) = (self.ids.clone(), self.sessions[session].id) else {
            return Ok(false);
        };
        let waiting = self
            .ask(|m| {
                let ids = ids.clone();
                Box::pin(async move { m.waiting(&[id], &ids).await })
            })
            .await?;
        if waiting.contains(&id) {
            return Ok(true);
        }
        let Some(flight) = &self.sessions[session].flight else {
            return Ok(false);
        };
        match self.spec.find(&flight.step) {
            Some((
                _,
                Step {
                    action: Action::Call(call),
                    ..
                },
            )) => Ok(self.engine.held(call).await),
            _ => Ok(false),
        }
    }

    /// Whether the server still works on the answered step of `session`
    /// ([`EngineSession::still_active`]).
    async fn still_active(&mut self, session: usize) -> anyhow::Result<bool> {
        let (Some(_), Some(id)) = (&self.ids, self.sessions[session].id) else {
            return Ok(false);
        };
        self.ask(|m| m.still_active(id)).await
    }

    /// Polls until every step in flight has completed (and the engine no longer works
    /// on it) or waits (per the engine); `must_finish` is a session whose step must
    /// complete.
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
                if flight.handle.is_finished() {
                    if self.still_active(index).await? {
                        quiet = false;
                    }
                } else if must_finish == Some(index) || !self.waits(index).await? {
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
        if !flight.handle.is_finished() || flight.fresh_once {
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
        let (connection, outcome) = (&mut flight.handle).await?;
        self.sessions[session].connection = Some(connection);
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

    /// Waits until `session` (every session for `None`) has no step in flight,
    /// reporting completions meanwhile.
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
        let mut connection = self.sessions[session]
            .connection
            .take()
            .expect("an idle session");
        let action = step.action.clone();
        let handle = AbortOnDrop::spawn(async move {
            let outcome = act(connection.as_mut(), &action).await;
            (connection, outcome)
        });
        let once = entry.blockers.contains(&Blocker::Once);
        self.sessions[session].flight = Some(Flight {
            step: step.name.clone(),
            sent: order,
            blockers: entry.blockers.clone(),
            fresh_once: once,
            handle,
        });
        let shown = match (self.spec.layout, &step.action) {
            (Layout::Postgres, Action::Sql(sql)) => sql.clone(),
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

    /// Cancels every step in flight (on a failure): asked of the engine where it can
    /// (then the step is waited for, at most [`STEP_WAIT_MS`]), aborted otherwise.
    pub async fn cancel(&mut self) {
        for index in 0..self.sessions.len() {
            let Some(flight) = self.sessions[index].flight.take() else {
                continue;
            };
            let asked = match self.sessions[index].id {
                Some(id) => self
                    .ask(|m| m.cancel(id).map(Ok).boxed())
                    .await
                    .unwrap_or(false),
                None => false,
            };
            let abort = flight.handle.0.abort_handle();
            let limit = Duration::from_millis(if asked { STEP_WAIT_MS } else { 0 });
            if tokio::time::timeout(limit, flight.handle).await.is_err() {
                abort.abort();
            }
        }
    }

    /// Runs every session's teardown (rows printed in PostgreSQL's layout only, as its
    /// tester does) and closes the sessions.
    pub async fn teardown(mut self) {
        for (index, session) in self.spec.sessions.iter().enumerate() {
            let Some(mut connection) = self.sessions[index].connection.take() else {
                continue;
            };
            for sql in &session.teardown {
                let outcome = connection.sql(sql).await;
                if self.spec.layout == Layout::Postgres && !is_error(&outcome) {
                    self.lines.extend(outcome);
                }
            }
        }
    }
}

/// Plays the steps of `order` on the database of `permutation`: the sessions opened,
/// each step sent in turn (waits read from the engine), then every session's teardown;
/// no spec setup or teardown (a race's steps run after the race, on its setup).
///
/// Errors: a step that cannot be sent or finished (the sessions are cancelled and torn
/// down first); a session that cannot be opened.
pub async fn play_steps(
    ctx: &Ctx,
    engine: &dyn SpecEngine,
    permutation: usize,
    spec: &Spec,
    order: &[Entry],
    lines: &mut Vec<String>,
) -> anyhow::Result<()> {
    let mut play = Play::open(ctx, engine, permutation, spec, lines).await?;
    let mut result = Ok(());
    for (sent, entry) in order.iter().enumerate() {
        let (session, step) = spec
            .find(&entry.name)
            .expect("permutations name known steps");
        if let Err(error) = play.send(session, step, entry, sent).await {
            result = Err(error);
            break;
        }
    }
    if result.is_ok() {
        result = play.finish().await;
    }
    if result.is_err() {
        play.cancel().await;
    }
    play.teardown().await;
    result
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

/// Runs the spec's setup on `connection`; rows printed ([`print_rows`]).
///
/// Errors: a setup item that fails.
pub async fn setup(
    connection: &mut dyn EngineSession,
    spec: &Spec,
    lines: &mut Vec<String>,
) -> anyhow::Result<()> {
    for action in &spec.setup {
        let outcome = act(connection, action).await;
        if let Some(failed) = outcome.iter().find(|line| line.starts_with("ERROR")) {
            anyhow::bail!("setup {} failed: {failed}", action.display());
        }
        if let Action::Sql(sql) = action {
            print_rows(lines, spec.layout, "setup", sql, outcome);
        }
    }
    Ok(())
}

/// Runs the spec's teardown on `connection`: ours prints `teardown: SQL` and its rows,
/// PostgreSQL's layout the rows only.
pub async fn teardown(connection: &mut dyn EngineSession, spec: &Spec, lines: &mut Vec<String>) {
    for sql in &spec.teardown {
        let outcome = connection.sql(sql).await;
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
