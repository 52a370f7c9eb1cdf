//! Case files on an engine that is not PostgreSQL (an SQLite file, a MariaDB
//! connection): the family supplies its engine ([`SpecEngine`]), and the spec's SQL
//! steps, setup, teardown, `check:`/`rows:`/`count:`/`exposes:` queries and its calls
//! run there, on connections the engine opens ([`EngineSession`]).
//!
//! The format is ours (`docs/adding-a-case.md`), read by the same parser; what differs
//! from PostgreSQL's runner:
//!
//! - waits are seen only where the engine reports them ([`EngineSession::wait_id`],
//!   [`EngineSession::waiting`]: MariaDB's `INNODB_TRX` and `PROCESSLIST`); then a
//!   permutation plays as on PostgreSQL, without markers or notices ([`Waits`]). Elsewhere (SQLite) steps run one
//!   at a time, each to its end, in the permutation's order: no `<waiting ...>` is
//!   printed, and a step that would wait for another session's lock waits inside the
//!   engine (SQLite's busy timeout) and prints what it ends with;
//! - no `race call:`/`race step:`, no `restart immediate:` and no PostgreSQL layout
//!   (refused when the file is read, with the reason);
//! - the spec's setup runs on a connection of its own, closed before the sessions open;
//!   the teardown gets another;
//! - permutation N runs on the engine's database N ([`SpecEngine::connect`]: a fresh one
//!   for each, the first the case's own);
//! - `check:` and `exposes:` read the first column as true when it is `t`, `true` or
//!   `1` (SQLite and MariaDB have no boolean type: a comparison is 1 or 0);
//! - `reconcile:` asks the expectation connection ([`EngineSession::reconcile`]),
//!   `reconcile others:` the engine ([`SpecEngine::reconcile_others`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::model::{Action, Call, Expect, Layout, Spec};
use super::play::{POLL_INTERVAL_MS, StepBound};
use super::{load, spec_id};
use crate::case::Case;
use crate::ctx::Ctx;
use crate::race::AbortOnDrop;

pub use super::model::Reconciled;

/// Every other clean database of a family, each with its [`Reconciled`].
pub type ReconciledOthers = Result<Vec<(String, Reconciled)>, String>;

/// One connection of an engine, for a session, the setup or the expectations.
pub trait EngineSession: Send {
    /// Runs `sql` (one or more statements) and returns what the transcript prints: each
    /// row as `column=value` (`null` for NULL), `(0 rows)` for a statement that returns
    /// rows but found none, nothing for one that returns none, or one line
    /// `ERROR <code>: <message>` (the engine's own code name).
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>>;

    /// Runs a family operation on this connection: `Ok` its outcome as printed, `Err`
    /// its error as printed after `ERROR `.
    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>>;

    /// The family's reconciliation of the database this connection is on, for
    /// `reconcile:`: `Ok((clean, summary))`, the summary as `kind=N …` words. Default:
    /// the family has none (a failed check).
    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        async { Err("this family offers no reconciliation".to_string()) }.boxed()
    }

    /// The connection's id on the server (MariaDB's `CONNECTION_ID()`), as
    /// [`EngineSession::waiting`] reports it. `None` (the default): the engine observes
    /// no waits, and the steps run one at a time, each to its end. When every session
    /// of a permutation has one, the steps run as on PostgreSQL: a step seen blocked
    /// prints `<waiting ...>`, the next step is sent, and `<... completed>` follows once
    /// it ends.
    fn wait_id(&self) -> Option<u64> {
        None
    }

    /// Which of `ids` (connections' [`EngineSession::wait_id`]s) wait for a lock now,
    /// as the engine itself reports it (MariaDB: `INNODB_TRX.trx_state = 'LOCK WAIT'`, or
    /// a lock wait above InnoDB in `PROCESSLIST.STATE`):
    /// an observation, never a guess from time. Asked on a connection of its own (the
    /// monitor). Default: none.
    ///
    /// Errors: the engine could not be asked (the monitor is reopened once).
    fn waiting<'a>(&'a mut self, _ids: &'a [u64]) -> BoxFuture<'a, Result<Vec<u64>, String>> {
        async { Ok(Vec::new()) }.boxed()
    }
}

/// The case id of file `name` of family `prefix`: `<prefix>NN_<what>.spec` (the
/// prefix in lower case) keeps the id `<prefix>NN`, tried first; otherwise as
/// [`spec_id`] (`sN_<what>.spec` is `<prefix>-SN`). For the S family the first form
/// always wins, so its files are all `sNN_<what>.spec` = `SNN`.
pub fn engine_spec_id(prefix: &str, name: &str) -> Option<String> {
    let converted = name
        .strip_suffix(".spec")
        .and_then(|stem| stem.strip_prefix(&prefix.to_ascii_lowercase()))
        .and_then(|rest| rest.split('_').next())
        .filter(|digits| !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()))
        .and_then(|digits| digits.parse::<u32>().ok());
    converted
        .map(|number| format!("{prefix}{number}"))
        .or_else(|| spec_id(prefix, name))
}

/// A family's engine for its case files: its connections and its operations.
pub trait SpecEngine: Send + Sync {
    /// Whether `call` names a known operation with the arguments it needs; checked when
    /// the file is read, before anything runs.
    fn check(&self, call: &Call) -> Result<(), String>;

    /// Writes to the run record what a reader of the evidence should know about the
    /// engine (its version), when a case starts. Default: nothing.
    fn describe(&self, _ctx: &mut Ctx) {}

    /// Opens a connection to the database of permutation `permutation` (1-based) of
    /// the case in `ctx`: the first is the case's own; each later one a fresh database
    /// of its own, in the state the first started in.
    ///
    /// Errors: the database cannot be opened.
    fn connect<'a>(
        &'a self,
        ctx: &'a Ctx,
        permutation: usize,
    ) -> BoxFuture<'a, anyhow::Result<Box<dyn EngineSession>>>;

    /// The connection the expectations run on. Default: one to the case's own database
    /// (`connect(ctx, 1)`); an engine may let it see more (the SQLite engine attaches
    /// the case's other files).
    ///
    /// Errors: as [`SpecEngine::connect`].
    fn expectations<'a>(
        &'a self,
        ctx: &'a Ctx,
    ) -> BoxFuture<'a, anyhow::Result<Box<dyn EngineSession>>> {
        self.connect(ctx, 1)
    }

    /// `reconcile others: clean`: the reconciliation of every other clean database of
    /// the family, as `(name, Ok((clean, summary)) or Err(reason))`. Default: the family
    /// has none (a failed check).
    fn reconcile_others<'a>(&'a self, _ctx: &'a Ctx) -> BoxFuture<'a, ReconciledOthers> {
        async { Err("this family offers no reconciliation".to_string()) }.boxed()
    }
}

/// The case files of family `prefix` in `dir` run on `engine` (as
/// [`super::cases_in`] for PostgreSQL: `sN_<what>.spec` is `<prefix>-SN`,
/// `<prefix>NN_<what>.spec` keeps the id `<prefix>NN`, sorted by number; a file that
/// cannot be read, parsed or run on this engine still becomes a case, one that fails
/// with the reason). `system` is what every file's `system:` must say (the schema the
/// engine's databases get).
pub fn engine_cases_in(
    prefix: &str,
    dir: &Path,
    shown_dir: &str,
    system: &str,
    engine: Arc<dyn SpecEngine>,
) -> Vec<Case> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".spec"))
        .collect();
    let number = |name: &str| {
        let id = engine_spec_id(prefix, name).unwrap_or_default();
        let digits: String = id.chars().filter(char::is_ascii_digit).collect();
        (!id.contains('-'), digits.parse::<u32>().unwrap_or(u32::MAX))
    };
    files.sort_by_key(|name| (number(name), name.clone()));
    files
        .into_iter()
        .map(|name| {
            let shown = format!("{shown_dir}/{name}");
            let loaded = load(dir, &name, &shown).and_then(|spec| {
                runnable(&spec, system, engine.as_ref())
                    .map(|()| spec)
                    .map_err(|error| format!("{shown}: {error}"))
            });
            let id = engine_spec_id(prefix, &name).unwrap_or_else(|| format!("{prefix}-S-{name}"));
            match loaded {
                Ok(spec) => engine_case(id, shown, Arc::new(spec), engine.clone()),
                Err(reason) => Case::new(id, "spec file that cannot be run", move |_| {
                    let reason = reason.clone();
                    async move { Err(anyhow::anyhow!(reason)) }.boxed()
                })
                .not_clean(),
            }
        })
        .collect()
}

/// Whether `spec` can run on an engine: its `system:`, its calls, and none of what only
/// PostgreSQL's runner does.
fn runnable(spec: &Spec, system: &str, engine: &dyn SpecEngine) -> Result<(), String> {
    if spec.system != system {
        return Err(format!(
            "system: {} is not this family's {system}",
            spec.system
        ));
    }
    let refused = if spec.race.is_some() {
        Some("a race")
    } else if spec.restart.is_some() {
        Some("`restart immediate:`")
    } else if spec.layout == Layout::Postgres {
        Some("PostgreSQL's format")
    } else if spec
        .expectations
        .iter()
        .any(|e| matches!(e, Expect::ExposesOutcome { .. }))
    {
        Some("`exposes:` decided by a race's outcomes")
    } else {
        None
    };
    if let Some(what) = refused {
        return Err(format!("{what} runs on PostgreSQL only"));
    }
    let steps = spec
        .sessions
        .iter()
        .flat_map(|s| &s.steps)
        .map(|s| &s.action);
    for action in spec.setup.iter().chain(steps) {
        if let Action::Call(call) = action {
            engine
                .check(call)
                .map_err(|e| format!("call {}: {e}", call.display()))?;
        }
    }
    Ok(())
}

/// A case that runs `spec` on `engine`.
pub fn engine_case(
    id: String,
    shown: String,
    spec: Arc<Spec>,
    engine: Arc<dyn SpecEngine>,
) -> Case {
    let (clean, schedule) = (spec.clean, spec.schedule);
    let case = Case::new(id, spec.title.clone(), move |ctx: &mut Ctx| {
        let (spec, engine, shown) = (spec.clone(), engine.clone(), shown.clone());
        async move { run(ctx, &shown, &spec, engine.as_ref()).await }.boxed()
    });
    let case = match schedule {
        Some(schedule) => case.schedule(schedule),
        None => case,
    };
    if clean { case } else { case.not_clean() }
}

/// Runs every permutation of `spec` on `engine`, then its expectations, writing the
/// transcript in our layout (as the PostgreSQL runner does, without waits).
///
/// Errors: an expectation connection that cannot be opened.
pub async fn run(
    ctx: &mut Ctx,
    shown: &str,
    spec: &Spec,
    engine: &dyn SpecEngine,
) -> anyhow::Result<()> {
    engine.describe(ctx);
    ctx.record("claim", serde_json::Value::String(spec.claim.clone()));
    ctx.record("fails", serde_json::Value::String(spec.fails.clone()));
    let orders = spec.orders();
    let steps: usize = spec.sessions.iter().map(|s| s.steps.len()).sum();
    let how = if spec.permutations.is_empty() {
        "every order"
    } else {
        "as listed"
    };
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    ctx.note(format!(
        "spec {shown}: {}, {}, {} ({how})",
        plural(spec.sessions.len(), "session"),
        plural(steps, "step"),
        plural(orders.len(), "permutation")
    ));
    for (number, order) in orders.iter().enumerate() {
        let label = format!("permutation {} of {}", number + 1, orders.len());
        let names: Vec<&str> = order.iter().map(|e| e.name.as_str()).collect();
        ctx.note(format!("{label}: {}", names.join(" ")));
        let mut lines = Vec::new();
        let outcome = play(ctx, number + 1, spec, &names, engine, &mut lines).await;
        for line in lines.iter().filter(|line| !line.trim().is_empty()) {
            ctx.note(format!("  {}", line.trim_end()));
        }
        let seen = outcome.err().map(|e| format!("{e:#}")).unwrap_or_default();
        ctx.check(format!("{label} ran every step"), seen.is_empty(), seen);
    }
    if !spec.expectations.is_empty() {
        let mut db = engine.expectations(ctx).await?;
        expect(ctx, db.as_mut(), engine, &spec.expectations).await;
    }
    Ok(())
}

/// Plays one permutation (`names`, the steps in order) on database `permutation`: the
/// spec's setup, each session's setup, the steps, each session's and the spec's
/// teardown.
///
/// Errors: a connection that cannot be opened; a setup that fails.
async fn play(
    ctx: &Ctx,
    permutation: usize,
    spec: &Spec,
    names: &[&str],
    engine: &dyn SpecEngine,
    lines: &mut Vec<String>,
) -> anyhow::Result<()> {
    let mut setup = engine.connect(ctx, permutation).await?;
    for action in &spec.setup {
        let outcome = act(setup.as_mut(), action).await;
        if let Some(failed) = outcome.iter().find(|line| line.starts_with("ERROR")) {
            anyhow::bail!("setup {} failed: {failed}", action.display());
        }
        if let (Action::Sql(_), false) = (action, outcome.is_empty()) {
            lines.push(format!("setup: {}", action.display()));
            lines.extend(outcome.into_iter().map(|row| format!("  {row}")));
        }
    }
    // Closed before the sessions start, so a step that closes its own connection
    // leaves the file with none open (S7); the teardown gets a connection of its own.
    drop(setup);
    let mut sessions = open_sessions(ctx, permutation, spec, engine).await?;
    if sessions.iter().all(|s| s.wait_id().is_some()) && !sessions.is_empty() {
        let mut waits = Waits::new(ctx, permutation, engine, sessions, lines);
        waits.play(spec, names).await?;
        let sessions = waits.into_sessions();
        return teardown(ctx, permutation, spec, engine, sessions, lines).await;
    }
    for name in names {
        let (index, step) = find(spec, name);
        let outcome = act(sessions[index].as_mut(), &step.action).await;
        lines.push(format!("step {}: {}", step.name, step.action.display()));
        lines.extend(outcome.into_iter().map(|line| format!("  {line}")));
    }
    teardown(ctx, permutation, spec, engine, sessions, lines).await
}

/// The step `name` of `spec` and the index of its session.
fn find<'s>(spec: &'s Spec, name: &str) -> (usize, &'s super::model::Step) {
    spec.sessions
        .iter()
        .enumerate()
        .find_map(|(i, s)| s.steps.iter().find(|st| st.name == name).map(|st| (i, st)))
        .expect("permutations name known steps")
}

/// One connection per session of `spec` on database `permutation`, each with its own
/// setup run.
///
/// Errors: a connection that cannot be opened; a session setup that fails.
async fn open_sessions(
    ctx: &Ctx,
    permutation: usize,
    spec: &Spec,
    engine: &dyn SpecEngine,
) -> anyhow::Result<Vec<Box<dyn EngineSession>>> {
    let mut sessions = Vec::new();
    for session in &spec.sessions {
        let mut connection = engine.connect(ctx, permutation).await?;
        for sql in &session.setup {
            let outcome = connection.sql(sql).await;
            if let Some(failed) = outcome.iter().find(|line| line.starts_with("ERROR")) {
                anyhow::bail!("setup of session {}: {failed}", session.name);
            }
        }
        sessions.push(connection);
    }
    Ok(sessions)
}

/// Each session's teardown on its connection, then the spec's on a new one (its rows
/// printed).
///
/// Errors: the teardown's connection cannot be opened.
async fn teardown(
    ctx: &Ctx,
    permutation: usize,
    spec: &Spec,
    engine: &dyn SpecEngine,
    mut sessions: Vec<Box<dyn EngineSession>>,
    lines: &mut Vec<String>,
) -> anyhow::Result<()> {
    for (session, connection) in spec.sessions.iter().zip(sessions.iter_mut()) {
        for sql in &session.teardown {
            connection.sql(sql).await;
        }
    }
    let mut teardown = engine.connect(ctx, permutation).await?;
    for sql in &spec.teardown {
        lines.push(format!("teardown: {}", Action::Sql(sql.clone()).display()));
        let outcome = teardown.sql(sql).await;
        lines.extend(outcome.into_iter().map(|line| format!("  {line}")));
    }
    Ok(())
}

/// A step in flight on an engine: its session's connection is in the task.
struct Flight {
    step: String,
    /// Its place in the permutation: completions print in this order.
    sent: usize,
    /// The session's [`EngineSession::wait_id`] when it was sent.
    id: u64,
    handle: AbortOnDrop<(Box<dyn EngineSession>, Vec<String>)>,
}

/// A permutation played with waits observed on the engine (every session has a
/// [`EngineSession::wait_id`]), as PostgreSQL's runner plays one (`play.rs`), without
/// markers or notices: a step is sent, the runner looks until every step in flight has
/// ended or is reported waiting by the engine ([`EngineSession::waiting`]), then prints
/// the step with its result or `<waiting ...>`, then the completions of steps shown
/// waiting, in the order they were sent.
struct Waits<'a> {
    ctx: &'a Ctx,
    permutation: usize,
    engine: &'a dyn SpecEngine,
    /// A session's connection while it has no step in flight.
    home: Vec<Option<Box<dyn EngineSession>>>,
    flights: Vec<Option<Flight>>,
    /// The connection [`EngineSession::waiting`] is asked on, opened at first need.
    monitor: Option<Box<dyn EngineSession>>,
    lines: &'a mut Vec<String>,
}

impl<'a> Waits<'a> {
    fn new(
        ctx: &'a Ctx,
        permutation: usize,
        engine: &'a dyn SpecEngine,
        sessions: Vec<Box<dyn EngineSession>>,
        lines: &'a mut Vec<String>,
    ) -> Waits<'a> {
        Waits {
            ctx,
            permutation,
            engine,
            flights: sessions.iter().map(|_| None).collect(),
            home: sessions.into_iter().map(Some).collect(),
            monitor: None,
            lines,
        }
    }

    /// Sends every step of `names` in order, then waits for those still in flight.
    ///
    /// Errors: a step still in flight after [`STEP_WAIT_MS`](super::play::STEP_WAIT_MS);
    /// a step task that panicked; the engine could not be asked about waits.
    async fn play(&mut self, spec: &Spec, names: &[&str]) -> anyhow::Result<()> {
        for (order, name) in names.iter().enumerate() {
            let (index, step) = find(spec, name);
            self.send(index, step, order).await?;
        }
        self.drain(None).await
    }

    /// The sessions' connections, once none has a step in flight (after [`Waits::play`]).
    fn into_sessions(self) -> Vec<Box<dyn EngineSession>> {
        self.home.into_iter().flatten().collect()
    }

    /// Sends `step` on session `index` (after the session's previous step ended) and
    /// prints it and what it released.
    async fn send(
        &mut self,
        index: usize,
        step: &super::model::Step,
        order: usize,
    ) -> anyhow::Result<()> {
        self.drain(Some(index)).await?;
        let mut session = self.home[index].take().expect("an idle session");
        let id = session.wait_id().unwrap_or_default();
        let action = step.action.clone();
        let handle = AbortOnDrop::spawn(async move {
            let outcome = act(session.as_mut(), &action).await;
            (session, outcome)
        });
        self.flights[index] = Some(Flight {
            step: step.name.clone(),
            sent: order,
            id,
            handle,
        });
        self.settle(None).await?;
        let shown = step.action.display();
        if self.flights[index]
            .as_ref()
            .is_some_and(|f| f.handle.is_finished())
        {
            let outcome = self.land(index).await?;
            self.lines.push(format!("step {}: {shown}", step.name));
            self.lines
                .extend(outcome.into_iter().map(|l| format!("  {l}")));
        } else {
            let line = format!("step {}: {shown} <waiting ...>", step.name);
            self.lines.push(line);
        }
        self.print_completed().await?;
        Ok(())
    }

    /// Takes the ended step of session `index` back: its connection home, its outcome.
    async fn land(&mut self, index: usize) -> anyhow::Result<Vec<String>> {
        let flight = self.flights[index].take().expect("a step in flight");
        let (session, outcome) = flight.handle.await?;
        self.home[index] = Some(session);
        Ok(outcome)
    }

    /// Prints `<... completed>` and the result of every ended step, in the order sent;
    /// returns how many.
    async fn print_completed(&mut self) -> anyhow::Result<usize> {
        let mut ended: Vec<(usize, usize)> = (0..self.flights.len())
            .filter_map(|i| self.flights[i].as_ref().map(|f| (f.sent, i)))
            .filter(|(_, i)| {
                self.flights[*i]
                    .as_ref()
                    .is_some_and(|f| f.handle.is_finished())
            })
            .collect();
        ended.sort();
        for (_, index) in &ended {
            let step = self.flights[*index].as_ref().map(|f| f.step.clone());
            let outcome = self.land(*index).await?;
            self.lines.push(format!(
                "step {}: <... completed>",
                step.unwrap_or_default()
            ));
            self.lines
                .extend(outcome.into_iter().map(|l| format!("  {l}")));
        }
        Ok(ended.len())
    }

    /// Looks until every step in flight has ended or is reported waiting by the engine;
    /// `must_finish`: a session whose step must end.
    async fn settle(&mut self, must_finish: Option<usize>) -> anyhow::Result<()> {
        let bound = StepBound::start();
        loop {
            let running: Vec<(usize, u64)> = (0..self.flights.len())
                .filter_map(|i| self.flights[i].as_ref().map(|f| (i, f)))
                .filter(|(_, f)| !f.handle.is_finished())
                .map(|(i, f)| (i, f.id))
                .collect();
            let quiet = if running.is_empty() {
                true
            } else if running.iter().any(|(i, _)| Some(*i) == must_finish) {
                false
            } else {
                let ids: Vec<u64> = running.iter().map(|(_, id)| *id).collect();
                let waiting = self.waiting(&ids).await?;
                ids.iter().all(|id| waiting.contains(id))
            };
            if quiet {
                return Ok(());
            }
            self.bail_after(&bound)?;
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
    }

    /// Which of `ids` the engine reports waiting, on the monitor (opened, or reopened
    /// once after an error: a server restarted by a step closes it).
    async fn waiting(&mut self, ids: &[u64]) -> anyhow::Result<Vec<u64>> {
        for attempt in 0..2 {
            if self.monitor.is_none() {
                self.monitor = Some(self.engine.connect(self.ctx, self.permutation).await?);
            }
            let monitor = self.monitor.as_mut().expect("a monitor");
            match monitor.waiting(ids).await {
                Ok(waiting) => return Ok(waiting),
                Err(error) if attempt == 1 => anyhow::bail!("waits unreadable: {error}"),
                Err(_) => self.monitor = None,
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Waits until `session` (every session for `None`) has no step in flight, printing
    /// completions meanwhile.
    async fn drain(&mut self, session: Option<usize>) -> anyhow::Result<()> {
        let bound = StepBound::start();
        loop {
            let busy = |w: &Self| match session {
                Some(s) => w.flights[s].is_some(),
                None => w.flights.iter().any(Option::is_some),
            };
            if !busy(self) {
                return Ok(());
            }
            self.settle(session).await?;
            if self.print_completed().await? == 0 && busy(self) {
                self.bail_after(&bound)?;
                tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
            }
        }
    }

    fn bail_after(&self, bound: &StepBound) -> anyhow::Result<()> {
        bound.check(self.flights.iter().flatten().map(|f| f.step.as_str()))
    }
}

/// A setup item or a step on `connection`: SQL's rows, or the call's outcome (`ERROR `
/// and its error).
async fn act(connection: &mut dyn EngineSession, action: &Action) -> Vec<String> {
    match action {
        Action::Sql(sql) => connection.sql(sql).await,
        Action::Call(call) => match connection.call(call).await {
            Ok(outcome) => vec![outcome],
            Err(error) => vec![format!("ERROR {error}")],
        },
    }
}

/// Whether a printed row's first cell is true: `t`, `true` or `1`.
fn first_is_true(row: &str) -> bool {
    let first = row.split_whitespace().next().unwrap_or("");
    ["=t", "=true", "=1"].iter().any(|end| first.ends_with(end))
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Checks `expectations` in order on `db` (as the PostgreSQL runner's `expect` module
/// does; the keys are documented there).
async fn expect(
    ctx: &mut Ctx,
    db: &mut dyn EngineSession,
    engine: &dyn SpecEngine,
    expectations: &[Expect],
) {
    for expectation in expectations {
        match expectation {
            Expect::True(sql) => {
                let outcome = db.sql(sql).await;
                let passed = outcome.len() == 1 && first_is_true(&outcome[0]);
                ctx.check(one_line(sql), passed, outcome.join(" "));
            }
            Expect::Rows { sql, rows } => {
                let outcome = db.sql(sql).await;
                ctx.check(format!("rows of {}", one_line(sql)), &outcome == rows, "");
                for row in &outcome {
                    ctx.note(format!("  {row}"));
                }
            }
            Expect::Count { figure, sql } => {
                let outcome = db.sql(sql).await;
                let seen = match outcome.as_slice() {
                    [only] if only == "(0 rows)" => Ok(0),
                    [only] if only.starts_with("ERROR") => Err(only.clone()),
                    rows => Ok(rows.len()),
                };
                let shown = seen.clone().map_or_else(|e| e, |n| format!("rows={n}"));
                let name = format!("count {figure}: {}", one_line(sql));
                ctx.check(name, seen == Ok(*figure), shown);
            }
            Expect::Reconcile(words) => match db.reconcile().await {
                Err(error) => _ = ctx.check("reconciliation ran", false, error),
                Ok((clean, summary)) if words.is_empty() => {
                    ctx.check("reconciliation: no findings", clean, summary);
                }
                Ok((_, summary)) => {
                    let seen: Vec<&str> = summary.split_whitespace().collect();
                    let passed = words.iter().all(|w| seen.contains(&w.as_str()));
                    let name = format!("reconciliation finds {}", words.join(" "));
                    ctx.check(name, passed, summary);
                }
            },
            Expect::ReconcileOthers => reconcile_others(ctx, engine).await,
            Expect::Exposes { anomaly, sql } => {
                let outcome = db.sql(sql).await;
                let first = outcome.first().cloned().unwrap_or_default();
                let happened = outcome.len() == 1 && first_is_true(&first);
                ctx.exposes(anomaly, happened, first);
            }
            Expect::ExposesOutcome { .. } => {
                ctx.check("exposes: outcome needs a race", false, "");
            }
            Expect::Shows {
                anomaly,
                step,
                words,
            } => super::expect::shows(ctx, anomaly, step, words),
        }
    }
}

/// `reconcile others: clean` on an engine: every other clean database reconciles; the
/// run record lists them (`details["reconciled_databases"]`), the transcript only those
/// with findings.
async fn reconcile_others(ctx: &mut Ctx, engine: &dyn SpecEngine) {
    let reconciled = match engine.reconcile_others(ctx).await {
        Ok(reconciled) => reconciled,
        Err(error) => {
            ctx.check("reconciliation of the others ran", false, error);
            return;
        }
    };
    super::expect::check_others(ctx, reconciled);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_cell_is_true_as_any_engine_says_it() {
        assert!(first_is_true("ok=1 units=120"));
        assert!(first_is_true("?column?=t"));
        assert!(!first_is_true("ok=0 units=120"));
        assert!(!first_is_true("ok=10"));
        assert!(!first_is_true("(0 rows)"));
    }

    #[test]
    fn a_converted_case_keeps_its_id_even_in_family_s() {
        assert_eq!(engine_spec_id("S", "s01_x.spec").as_deref(), Some("S1"));
        assert_eq!(engine_spec_id("S", "s10_x.spec").as_deref(), Some("S10"));
        assert_eq!(engine_spec_id("I", "i03_x.spec").as_deref(), Some("I3"));
        assert_eq!(engine_spec_id("I", "s2_x.spec").as_deref(), Some("I-S2"));
        assert_eq!(engine_spec_id("I", "x.spec"), None);
    }
}
