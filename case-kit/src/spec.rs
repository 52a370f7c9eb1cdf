//! Cases as data: interleaving specs. A spec file holds a setup, named sessions with
//! short steps and permutation lines; the runner plays each permutation on its own
//! sessions and writes every step, its rows, SQLSTATE or outcome, and every lock wait to
//! the transcript. The idea is PostgreSQL's isolation tester (`src/test/isolation`); the
//! format, parser and runner here are our own.
//!
//! # The format
//!
//! ```text
//! # a comment (a line whose first non-blank character is #)
//! title: one line, the case's title
//! claim: what the interleaving shows (continues on lines indented deeper)
//! fails: what counts as failure
//! system: ledger_template          (the family's template database; checked)
//! clean: no                        (yes: every permutation leaves the family's
//!                                   invariants intact, so its reconciliation covers
//!                                   the case's own database, the first permutation's)
//! setup: UPDATE account SET balance = 100 WHERE account_id = 'acct-0001'
//! setup call: grant account=acct-0002 amount=100 key=g-1
//! teardown: SELECT balance FROM account WHERE account_id = 'acct-0001'
//! session a
//!   setup: BEGIN
//!   step a1: UPDATE account SET balance = balance - 80 WHERE account_id = 'acct-0001'
//!   call a2: debit account=acct-0001 amount=30 key=k-1
//!   teardown: ROLLBACK
//! permutation: a1 b1 a2 b2
//! ```
//!
//! - `setup` (SQL) and `setup call` (a library operation) run in order on a fresh
//!   connection before each permutation; `teardown` SQL runs after it, and its rows are
//!   printed (the usual place for the final balances). Both may repeat.
//! - `session NAME` opens a session: its own connection, its optional `setup` SQL (often
//!   `BEGIN ISOLATION LEVEL …`) and `teardown` SQL, and its steps in order: `step NAME:
//!   SQL` (one or more statements, simple query protocol) or `call NAME: OP key=value …`,
//!   an operation of the family's library ([`Calls`]) run on the session's connection.
//!   Step names are unique across sessions.
//! - `permutation: NAMES` runs those steps in that order; with no permutation line, every
//!   order that keeps each session's steps in their order runs ([`all_orders`]).
//! - A value continues on the following lines indented deeper than its key.
//!
//! # Running a permutation
//!
//! The first permutation runs in the case's own database, each later one in a fresh
//! clone of the family's template ([`Ctx::extra_database`], `<case db>_p2`, …), so every
//! permutation starts from the same state; the family's reconciliation sees the case's
//! own database, the first permutation's. A step is sent on its session's connection; the runner then
//! polls until every step in flight has either completed or is blocked, which it learns
//! from PostgreSQL itself: `pg_blocking_pids(pid) && <the spec's session pids>` on a
//! separate monitor connection (PostgreSQL docs §9.27, "System Information Functions"),
//! never from how long a step took; a completed step counts once its backend is no
//! longer `active` (after an error PostgreSQL answers before it releases the locks). A
//! blocked step is printed as `<waiting ...>`; when it completes, `<... completed>` and
//! its result follow. A step of a session that is
//! still waiting first waits for that session (at most [`STEP_WAIT_MS`]), as when its
//! waiting step ends in a deadlock error. Results: each row as `column=value`, `(0 rows)`
//! for a statement that returns rows but found none, `ERROR <SQLSTATE>: <message>` (the
//! primary message only: details name pids and xids), or the operation's outcome.
//!
//! Each permutation ends with a check that it ran every step and left none waiting; the
//! transcript itself is compared with the case's snapshot, so a lock wait that no longer
//! happens changes the transcript and fails the case.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::case::Case;
use crate::ctx::Ctx;

/// Longest a step may stay in flight (running or waiting) before the permutation fails:
/// the bound of every wait of the runner (for quiet, for a waiting session, at the end).
pub const STEP_WAIT_MS: u64 = 10_000;
/// How often the runner looks at steps in flight (completion, then `pg_blocking_pids`).
pub const POLL_INTERVAL_MS: u64 = 5;
/// Longest a spec file may be: a spec is a short interleaving, not a program.
pub const MAX_SPEC_LINES: usize = 200;

/// A library operation as a step: an operation name and its `key=value` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The operation, e.g. `debit`.
    pub op: String,
    /// Its arguments in the order written, e.g. `[("account", "acct-0001")]`.
    pub args: Vec<(String, String)>,
}

impl Call {
    /// The value of argument `name`, if given.
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    fn display(&self) -> String {
        let mut text = self.op.clone();
        for (key, value) in &self.args {
            let _ = write!(text, " {key}={value}");
        }
        text
    }
}

/// What a setup item or a step does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// SQL, one or more statements, sent as one simple query.
    Sql(String),
    /// An operation of the family's library.
    Call(Call),
}

impl Action {
    fn display(&self) -> String {
        match self {
            Action::Sql(sql) => sql.split_whitespace().collect::<Vec<_>>().join(" "),
            Action::Call(call) => call.display(),
        }
    }
}

/// One named step of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Unique across the spec's sessions.
    pub name: String,
    /// What it does.
    pub action: Action,
}

/// One session: a connection of its own.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Session {
    /// Its name (for messages only).
    pub name: String,
    /// SQL run on the session's connection before each permutation.
    pub setup: Vec<String>,
    /// SQL run on it after each permutation.
    pub teardown: Vec<String>,
    /// Its steps, in order.
    pub steps: Vec<Step>,
}

/// A parsed spec file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Spec {
    /// The case's title.
    pub title: String,
    /// What the interleaving shows.
    pub claim: String,
    /// What counts as failure.
    pub fails: String,
    /// The template database the spec's SQL is written against (its family's).
    pub system: String,
    /// Whether the family's reconciliation may cover the database it leaves.
    pub clean: bool,
    /// Run before each permutation, in order, on a connection of its own.
    pub setup: Vec<Action>,
    /// SQL run after each permutation; its rows are printed.
    pub teardown: Vec<String>,
    /// The sessions.
    pub sessions: Vec<Session>,
    /// The permutation lines (step names); empty: every order.
    pub permutations: Vec<Vec<String>>,
}

/// A spec file that could not be read: the line (1-based) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number (0: the file as a whole).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

fn error(line: usize, message: impl Into<String>) -> ParseError {
    ParseError {
        line,
        message: message.into(),
    }
}

fn parse_call(line: usize, text: &str) -> Result<Call, ParseError> {
    let mut words = text.split_whitespace();
    let op = words
        .next()
        .ok_or_else(|| error(line, "a call names an operation"))?
        .to_string();
    let mut args = Vec::new();
    for word in words {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| error(line, format!("argument {word:?} is not key=value")))?;
        args.push((key.to_string(), value.to_string()));
    }
    Ok(Call { op, args })
}

fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Parses a spec file (see the module documentation for the format).
///
/// Errors: the first problem found, with its line: an unknown key, a missing `title`,
/// `claim`, `fails`, `system` or `clean`, a step outside a session, a duplicate step
/// name, a permutation naming an unknown step, more than [`MAX_SPEC_LINES`] lines.
pub fn parse(text: &str) -> Result<Spec, ParseError> {
    let items = meaningful_lines(text)?;
    let mut spec = Spec::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut clean = None;
    let mut in_session = false;
    for (line, indent, item) in items {
        if let Some(name) = item.strip_prefix("session ") {
            if indent != 0 {
                return Err(error(line, "`session` starts at the beginning of a line"));
            }
            let name = name.trim();
            if !is_name(name) {
                return Err(error(line, format!("bad session name {name:?}")));
            }
            spec.sessions.push(Session {
                name: name.to_string(),
                ..Session::default()
            });
            in_session = true;
            continue;
        }
        let (key, value) = item
            .split_once(':')
            .ok_or_else(|| error(line, format!("expected `key: value`, found {item:?}")))?;
        let key = key.trim();
        let value = value.trim().to_string();
        if indent == 0 {
            in_session = false;
        }
        if in_session {
            let session = spec.sessions.last_mut().expect("a session is open");
            session_item(session, &mut seen, line, key, value)?;
        } else {
            top_item(&mut spec, &mut clean, line, key, value)?;
        }
    }
    finish(spec, clean, &seen)
}

/// The meaningful lines of a spec as `(line number, indent, text)`: blank lines and `#`
/// comments left out, continuation lines (indented deeper than their key) joined to it.
///
/// Errors: more than [`MAX_SPEC_LINES`] lines; a tab in an indent.
fn meaningful_lines(text: &str) -> Result<Vec<(usize, usize, String)>, ParseError> {
    let mut items: Vec<(usize, usize, String)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() > MAX_SPEC_LINES {
        return Err(error(
            0,
            format!("{} lines; a spec has at most {MAX_SPEC_LINES}", lines.len()),
        ));
    }
    for (index, raw) in lines.iter().enumerate() {
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if raw.contains('\t') {
            return Err(error(index + 1, "indent with spaces, not tabs"));
        }
        let indent = raw.len() - raw.trim_start().len();
        match items.last_mut() {
            Some((_, key_indent, value))
                if indent > *key_indent && !value.starts_with("session ") =>
            {
                value.push('\n');
                value.push_str(trimmed);
            }
            _ => items.push((index + 1, indent, trimmed.to_string())),
        }
    }
    Ok(items)
}

/// One `key: value` inside a session: `setup:`, `teardown:`, `step NAME:` or
/// `call NAME:`; step names are unique across the spec (`seen`).
///
/// Errors: any other key; a step name used twice; a call that does not parse.
fn session_item(
    session: &mut Session,
    seen: &mut std::collections::BTreeSet<String>,
    line: usize,
    key: &str,
    value: String,
) -> Result<(), ParseError> {
    let (kind, name) = key.split_once(' ').unwrap_or((key, ""));
    let name = name.trim();
    match (kind, name) {
        ("setup", "") => session.setup.push(value),
        ("teardown", "") => session.teardown.push(value),
        ("step" | "call", name) if is_name(name) => {
            if !seen.insert(name.to_string()) {
                return Err(error(line, format!("step {name:?} is defined twice")));
            }
            let action = if kind == "step" {
                Action::Sql(value)
            } else {
                Action::Call(parse_call(line, &value)?)
            };
            session.steps.push(Step {
                name: name.to_string(),
                action,
            });
        }
        _ => {
            return Err(error(
                line,
                format!(
                    "in a session: `setup:`, `teardown:`, `step NAME:` or `call NAME:`, not {key:?}"
                ),
            ));
        }
    }
    Ok(())
}

/// One `key: value` outside sessions: the spec's title, claim, expected failure, system,
/// cleanliness, setup, teardown and permutations.
///
/// Errors: an unknown key; a step outside a session; a bad `clean:`; an empty
/// permutation; a call that does not parse.
fn top_item(
    spec: &mut Spec,
    clean: &mut Option<bool>,
    line: usize,
    key: &str,
    value: String,
) -> Result<(), ParseError> {
    match key {
        "title" => spec.title = value,
        "claim" => spec.claim = value,
        "fails" => spec.fails = value,
        "system" => spec.system = value,
        "clean" => {
            *clean = Some(match value.as_str() {
                "yes" => true,
                "no" => false,
                other => {
                    return Err(error(line, format!("clean: yes or no, not {other:?}")));
                }
            })
        }
        "setup" => spec.setup.push(Action::Sql(value)),
        "setup call" => spec.setup.push(Action::Call(parse_call(line, &value)?)),
        "teardown" => spec.teardown.push(value),
        "permutation" => {
            let names: Vec<String> = value.split_whitespace().map(String::from).collect();
            if names.is_empty() {
                return Err(error(line, "a permutation names at least one step"));
            }
            spec.permutations.push(names);
        }
        "step" | "call" => return Err(error(line, "a step belongs to a session")),
        other => return Err(error(line, format!("unknown key {other:?}"))),
    }
    Ok(())
}

/// The whole-spec checks once every line is read: the required keys, a step in every
/// session, permutations naming known steps.
///
/// Errors: the first of those that fails.
fn finish(
    mut spec: Spec,
    clean: Option<bool>,
    seen: &std::collections::BTreeSet<String>,
) -> Result<Spec, ParseError> {
    for (key, value) in [
        ("title", &spec.title),
        ("claim", &spec.claim),
        ("fails", &spec.fails),
        ("system", &spec.system),
    ] {
        if value.is_empty() {
            return Err(error(0, format!("`{key}:` is missing")));
        }
    }
    spec.clean = clean.ok_or_else(|| error(0, "`clean: yes|no` is missing"))?;
    if spec.sessions.is_empty() || spec.sessions.iter().any(|s| s.steps.is_empty()) {
        return Err(error(0, "every spec has a session, every session a step"));
    }
    for permutation in &spec.permutations {
        for name in permutation {
            if !seen.contains(name) {
                return Err(error(0, format!("permutation names unknown step {name:?}")));
            }
        }
    }
    Ok(spec)
}

/// Every order of the steps that keeps each session's steps in their own order, as
/// `(session, step)` indexes, sessions tried in spec order (so the first order runs the
/// first session's steps first). `steps_per_session = [2, 1]` gives 3 orders; in
/// general the multinomial coefficient `(Σn)! / Π(n!)`.
pub fn all_orders(steps_per_session: &[usize]) -> Vec<Vec<(usize, usize)>> {
    fn recurse(
        counts: &[usize],
        taken: &mut Vec<usize>,
        order: &mut Vec<(usize, usize)>,
        out: &mut Vec<Vec<(usize, usize)>>,
    ) {
        let mut any = false;
        for session in 0..counts.len() {
            if taken[session] < counts[session] {
                any = true;
                order.push((session, taken[session]));
                taken[session] += 1;
                recurse(counts, taken, order, out);
                taken[session] -= 1;
                order.pop();
            }
        }
        if !any {
            out.push(order.clone());
        }
    }
    let mut out = Vec::new();
    recurse(
        steps_per_session,
        &mut vec![0; steps_per_session.len()],
        &mut Vec::new(),
        &mut out,
    );
    out
}

impl Spec {
    /// The permutations to run, as step names: the permutation lines, else every order
    /// ([`all_orders`]).
    pub fn orders(&self) -> Vec<Vec<String>> {
        if !self.permutations.is_empty() {
            return self.permutations.clone();
        }
        let counts: Vec<usize> = self.sessions.iter().map(|s| s.steps.len()).collect();
        all_orders(&counts)
            .into_iter()
            .map(|order| {
                order
                    .into_iter()
                    .map(|(session, step)| self.sessions[session].steps[step].name.clone())
                    .collect()
            })
            .collect()
    }

    fn find(&self, name: &str) -> Option<(usize, &Step)> {
        self.sessions
            .iter()
            .enumerate()
            .find_map(|(index, session)| {
                session
                    .steps
                    .iter()
                    .find(|step| step.name == name)
                    .map(|step| (index, step))
            })
    }
}

/// The library operations a family offers as steps (`call NAME: OP key=value …`), each
/// run on the session's own connection, so the family's own transaction can be a step.
pub trait Calls: Send + Sync {
    /// Whether `call` names a known operation with the arguments it needs; the message
    /// says what is wrong. Checked before anything runs.
    fn check(&self, call: &Call) -> Result<(), String>;

    /// Runs `call` on `client`. `Ok` is the outcome as printed (`outcome=OK balance=20`);
    /// `Err` an error as printed after `ERROR ` (its SQLSTATE first when it has one).
    fn run<'a>(
        &'a self,
        client: &'a mut Client,
        call: &'a Call,
    ) -> BoxFuture<'a, Result<String, String>>;

    /// These operations as the case's choices run them ([`Ctx::choice`]), when that
    /// matters to the family (the ledger's one-trip transfer); `None` (the default):
    /// the same operations whatever the run chose.
    fn for_case(&self, _ctx: &Ctx) -> Option<Arc<dyn Calls>> {
        None
    }
}

/// A family without library operations: every `call` is refused.
pub struct NoCalls;

impl Calls for NoCalls {
    fn check(&self, call: &Call) -> Result<(), String> {
        Err(format!("this family offers no operation {:?}", call.op))
    }

    fn run<'a>(
        &'a self,
        _: &'a mut Client,
        call: &'a Call,
    ) -> BoxFuture<'a, Result<String, String>> {
        let message = format!("no operation {:?}", call.op);
        async move { Err(message) }.boxed()
    }
}

/// The id of spec file `sN_<what>.spec` in family `prefix`: `<prefix>-SN` (`L-S1`).
/// Hand-written case ids are `<prefix>N` and never contain `-`, so the two cannot meet.
pub fn spec_id(prefix: &str, file_name: &str) -> Option<String> {
    let stem = file_name.strip_suffix(".spec")?;
    let number = stem.strip_prefix('s')?.split('_').next()?;
    if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit()) || number.starts_with('0') {
        return None;
    }
    Some(format!("{prefix}-S{number}"))
}

/// The spec cases of family `prefix` found in `dir` (`*.spec`, read now; no registration
/// anywhere), sorted by number. A file that cannot be read or parsed, or whose name is
/// not `sN_<what>.spec`, still becomes a case, one that fails with the reason, so a
/// broken spec is never silently skipped. `shown_dir` is `dir` as printed (relative to the
/// workspace); `template` the family's template database (the `system:` a spec must
/// name).
pub fn cases_in(
    prefix: &str,
    dir: &Path,
    shown_dir: &str,
    template: &str,
    calls: Arc<dyn Calls>,
) -> Vec<Case> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".spec"))
        .collect();
    let number = |name: &str| {
        spec_id(prefix, name)
            .and_then(|id| id.rsplit('S').next().and_then(|n| n.parse::<u32>().ok()))
            .unwrap_or(u32::MAX)
    };
    files.sort_by_key(|name| (number(name), name.clone()));
    files
        .into_iter()
        .map(|name| {
            let shown = format!("{shown_dir}/{name}");
            let loaded = std::fs::read_to_string(dir.join(&name))
                .map_err(|error| format!("cannot read {shown}: {error}"))
                .and_then(|text| parse(&text).map_err(|error| format!("{shown}: {error}")))
                .and_then(|spec| {
                    check_spec(&spec, template, calls.as_ref())
                        .map(|()| spec)
                        .map_err(|error| format!("{shown}: {error}"))
                });
            match (spec_id(prefix, &name), loaded) {
                (Some(id), Ok(spec)) => spec_case(id, shown, Arc::new(spec), calls.clone()),
                (id, outcome) => {
                    let id = id.unwrap_or_else(|| format!("{prefix}-S-{name}"));
                    let reason = match outcome {
                        Err(reason) => reason,
                        Ok(_) => format!("{shown}: a spec file is named sN_<what>.spec"),
                    };
                    broken_case(id, reason)
                }
            }
        })
        .collect()
}

fn check_spec(spec: &Spec, template: &str, calls: &dyn Calls) -> Result<(), String> {
    if spec.system != template {
        return Err(format!(
            "system: {} is not this family's template {template}",
            spec.system
        ));
    }
    let steps = spec
        .sessions
        .iter()
        .flat_map(|s| &s.steps)
        .map(|s| &s.action);
    for action in spec.setup.iter().chain(steps) {
        if let Action::Call(call) = action {
            calls
                .check(call)
                .map_err(|e| format!("call {}: {e}", call.display()))?;
        }
    }
    Ok(())
}

fn broken_case(id: String, reason: String) -> Case {
    Case::new(id, "spec file that cannot be run", move |_ctx: &mut Ctx| {
        let reason = reason.clone();
        async move { Err(anyhow::anyhow!(reason)) }.boxed()
    })
    .not_clean()
}

/// A case that runs `spec`: one connection per session, a monitor and the setup's.
pub fn spec_case(id: String, shown: String, spec: Arc<Spec>, calls: Arc<dyn Calls>) -> Case {
    let connections = spec.sessions.len() as u32 + 2;
    let clean = spec.clean;
    let case = Case::new(id, spec.title.clone(), move |ctx: &mut Ctx| {
        let spec = spec.clone();
        let calls = calls.clone();
        let shown = shown.clone();
        async move { run(ctx, &shown, &spec, calls).await }.boxed()
    })
    .connections(connections);
    if clean { case } else { case.not_clean() }
}

/// A step's result as printed below it.
type Outcome = Vec<String>;

fn db_error(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("ERROR {}: {}", db.code().code(), db.message()),
        None => format!("ERROR (no SQLSTATE): {error}"),
    }
}

async fn run_sql(client: &Client, sql: &str) -> Outcome {
    match client.simple_query(sql).await {
        Err(error) => vec![db_error(&error)],
        Ok(messages) => {
            let mut out = Vec::new();
            let mut rows: Option<usize> = None;
            for message in messages {
                match message {
                    SimpleQueryMessage::RowDescription(_) => rows = Some(0),
                    SimpleQueryMessage::Row(row) => {
                        rows = Some(rows.unwrap_or(0) + 1);
                        let cells: Vec<String> = row
                            .columns()
                            .iter()
                            .enumerate()
                            .map(|(i, column)| {
                                format!("{}={}", column.name(), row.get(i).unwrap_or("null"))
                            })
                            .collect();
                        out.push(cells.join(" "));
                    }
                    SimpleQueryMessage::CommandComplete(_) => {
                        if rows == Some(0) {
                            out.push("(0 rows)".into());
                        }
                        rows = None;
                    }
                    _ => {}
                }
            }
            out
        }
    }
}

async fn run_action(client: &mut Client, action: &Action, calls: &dyn Calls) -> Outcome {
    match action {
        Action::Sql(sql) => run_sql(client, sql).await,
        Action::Call(call) => match calls.run(client, call).await {
            Ok(outcome) => vec![outcome],
            Err(error) => vec![format!("ERROR {error}")],
        },
    }
}

/// A step in flight on its session's connection.
struct Flight {
    step: String,
    /// Its place in the permutation: completions print in this order.
    sent: usize,
    handle: JoinHandle<(Client, Outcome)>,
}

struct Live {
    pid: i32,
    client: Option<Client>,
    flight: Option<Flight>,
}

/// One permutation's sessions and its transcript lines.
struct Play<'a> {
    monitor: Client,
    sessions: Vec<Live>,
    pids: Vec<i32>,
    calls: Arc<dyn Calls>,
    notes: &'a mut Vec<String>,
}

impl Play<'_> {
    fn print(&mut self, text: String) {
        self.notes.push(text);
    }

    fn print_outcome(&mut self, outcome: Outcome) {
        for line in outcome {
            self.notes.push(format!("  {line}"));
        }
    }

    async fn blocked(&self, session: usize) -> anyhow::Result<bool> {
        let row = self
            .monitor
            .query_one(
                "SELECT pg_blocking_pids($1::int4) && $2::int4[]",
                &[&self.sessions[session].pid, &self.pids],
            )
            .await?;
        Ok(row.get(0))
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

    /// Polls until every step in flight has completed or is blocked (per PostgreSQL);
    /// returns the sessions whose step completed, in the order the steps were sent.
    /// Errors: a step ran (not blocked) for longer than [`STEP_WAIT_MS`].
    async fn settle(&mut self, must_finish: Option<usize>) -> anyhow::Result<Vec<usize>> {
        let deadline = Instant::now() + Duration::from_millis(STEP_WAIT_MS);
        loop {
            let mut quiet = true;
            for index in 0..self.sessions.len() {
                let Some(flight) = &self.sessions[index].flight else {
                    continue;
                };
                if flight.handle.is_finished() {
                    // Its result can reach us before its backend is done with the
                    // statement: after an error PostgreSQL sends the error first, then
                    // aborts the transaction and releases its locks (the error recovery
                    // in PostgresMain, src/backend/tcop/postgres.c). Until the backend is
                    // no longer active, the steps it blocks are not settled.
                    if self.active(index).await? {
                        quiet = false;
                    }
                    continue;
                }
                if must_finish == Some(index) || !self.blocked(index).await? {
                    quiet = false;
                }
            }
            if quiet {
                break;
            }
            if Instant::now() >= deadline {
                let stuck: Vec<String> = self
                    .sessions
                    .iter()
                    .filter_map(|s| s.flight.as_ref())
                    .filter(|f| !f.handle.is_finished())
                    .map(|f| f.step.clone())
                    .collect();
                anyhow::bail!(
                    "step {} still in flight after {} s",
                    stuck.join(", "),
                    STEP_WAIT_MS / 1000
                );
            }
            tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
        }
        let mut done: Vec<(usize, usize)> = Vec::new();
        for (index, live) in self.sessions.iter().enumerate() {
            if let Some(flight) = &live.flight
                && flight.handle.is_finished()
            {
                done.push((flight.sent, index));
            }
        }
        done.sort();
        Ok(done.into_iter().map(|(_, index)| index).collect())
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

    /// Prints the completions of steps that were shown waiting.
    async fn print_completed(&mut self, done: Vec<usize>) -> anyhow::Result<()> {
        for session in done {
            let (flight, outcome) = self.land(session).await?;
            self.print(format!("step {}: <... completed>", flight.step));
            self.print_outcome(outcome);
        }
        Ok(())
    }

    async fn send(&mut self, session: usize, step: &Step, order: usize) -> anyhow::Result<()> {
        if self.sessions[session].flight.is_some() {
            // The session still waits: only another step can release it, or an error
            // (a deadlock) ends its step. Wait for that, as PostgreSQL's tester does.
            let done = self.settle(Some(session)).await?;
            self.print_completed(done).await?;
        }
        let mut client = self.sessions[session]
            .client
            .take()
            .expect("an idle session has its connection");
        let action = step.action.clone();
        let calls = self.calls.clone();
        let handle = tokio::spawn(async move {
            let outcome = run_action(&mut client, &action, calls.as_ref()).await;
            (client, outcome)
        });
        self.sessions[session].flight = Some(Flight {
            step: step.name.clone(),
            sent: order,
            handle,
        });
        let done = self.settle(None).await?;
        let shown = step.action.display();
        if done.contains(&session) {
            let (_, outcome) = self.land(session).await?;
            self.print(format!("step {}: {shown}", step.name));
            self.print_outcome(outcome);
        } else {
            self.print(format!("step {}: {shown} <waiting ...>", step.name));
        }
        let others: Vec<usize> = done.into_iter().filter(|&s| s != session).collect();
        self.print_completed(others).await
    }

    /// Waits for every step still in flight (at most [`STEP_WAIT_MS`] in all).
    async fn finish(&mut self) -> anyhow::Result<()> {
        while let Some(first) = self.sessions.iter().position(|s| s.flight.is_some()) {
            let done = self.settle(Some(first)).await?;
            self.print_completed(done).await?;
        }
        Ok(())
    }

    /// Cancels every step in flight and takes the connections back (on a failure).
    async fn cancel(&mut self) {
        for index in 0..self.sessions.len() {
            if self.sessions[index].flight.is_some() {
                let pid = self.sessions[index].pid;
                let _ = self
                    .monitor
                    .execute("SELECT pg_cancel_backend($1::int4)", &[&pid])
                    .await;
                if let Some(flight) = self.sessions[index].flight.take() {
                    let abort = flight.handle.abort_handle();
                    if tokio::time::timeout(Duration::from_millis(STEP_WAIT_MS), flight.handle)
                        .await
                        .is_err()
                    {
                        abort.abort();
                    }
                }
            }
        }
    }
}

/// Runs every permutation of `spec` in `ctx`'s database and writes the transcript.
///
/// Errors: connection failures, a failed setup (a spec's setup must succeed), a step's
/// task that panicked.
pub async fn run(
    ctx: &mut Ctx,
    shown: &str,
    spec: &Spec,
    calls: Arc<dyn Calls>,
) -> anyhow::Result<()> {
    let calls = calls.for_case(ctx).unwrap_or(calls);
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
    record_shape(ctx, spec);
    for (number, order) in orders.iter().enumerate() {
        let label = format!("permutation {} of {}", number + 1, orders.len());
        ctx.note(format!("{label}: {}", order.join(" ")));
        let database = if number == 0 {
            ctx.database().to_string()
        } else {
            ctx.extra_database(&format!("p{}", number + 1)).await?
        };
        let mut notes = Vec::new();
        let outcome = play(ctx, &database, spec, order, calls.clone(), &mut notes).await;
        for note in notes {
            ctx.note(format!("  {note}"));
        }
        match outcome {
            Ok(()) => ctx.check(
                format!("{label} ran every step, none left waiting"),
                true,
                "",
            ),
            Err(error) => ctx.check(
                format!("{label} ran every step, none left waiting"),
                false,
                format!("{error:#}"),
            ),
        };
    }
    Ok(())
}

/// Records for the evidence page the spec's claim, its failure condition and which
/// session each step belongs to (`details["claim"]`, `["fails"]`, `["spec_sessions"]`:
/// session name → its step names).
fn record_shape(ctx: &mut Ctx, spec: &Spec) {
    ctx.record("claim", serde_json::Value::String(spec.claim.clone()));
    ctx.record("fails", serde_json::Value::String(spec.fails.clone()));
    let sessions: serde_json::Map<String, serde_json::Value> = spec
        .sessions
        .iter()
        .map(|session| {
            let steps = session
                .steps
                .iter()
                .map(|step| step.name.clone().into())
                .collect();
            (session.name.clone(), serde_json::Value::Array(steps))
        })
        .collect();
    ctx.record("spec_sessions", serde_json::Value::Object(sessions));
}

/// One session per spec session on `database`, each with its backend pid (for
/// `pg_blocking_pids`) and its own setup run.
///
/// Errors: connection failures; a session setup that fails.
async fn open_sessions(ctx: &Ctx, database: &str, spec: &Spec) -> anyhow::Result<Vec<Live>> {
    let mut sessions = Vec::new();
    for session in &spec.sessions {
        let client = ctx.connect_to(database).await?;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        for sql in &session.setup {
            client.batch_execute(sql).await.map_err(|error| {
                anyhow::anyhow!("setup of session {}: {}", session.name, db_error(&error))
            })?;
        }
        sessions.push(Live {
            pid,
            client: Some(client),
            flight: None,
        });
    }
    Ok(sessions)
}

/// Plays `order` on `database`: the spec's setup, its sessions, each step sent in turn
/// (waits read from PostgreSQL), then every session's and the spec's teardown, noted.
///
/// Errors: a setup that fails; a step that cannot be sent or finished (the sessions are
/// cancelled and torn down first).
async fn play(
    ctx: &Ctx,
    database: &str,
    spec: &Spec,
    order: &[String],
    calls: Arc<dyn Calls>,
    notes: &mut Vec<String>,
) -> anyhow::Result<()> {
    let mut setup = ctx.connect_to(database).await?;
    for action in &spec.setup {
        let outcome = run_action(&mut setup, action, calls.as_ref()).await;
        if let Some(failed) = outcome.iter().find(|line| line.starts_with("ERROR")) {
            anyhow::bail!("setup {} failed: {failed}", action.display());
        }
    }
    let sessions = open_sessions(ctx, database, spec).await?;
    let pids = sessions.iter().map(|s| s.pid).collect();
    let mut play = Play {
        monitor: ctx.connect_to(database).await?,
        sessions,
        pids,
        calls,
        notes,
    };
    let mut result = Ok(());
    for (sent, name) in order.iter().enumerate() {
        let (session, step) = spec.find(name).expect("permutations name known steps");
        if let Err(error) = play.send(session, step, sent).await {
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
    for (index, session) in spec.sessions.iter().enumerate() {
        if let Some(client) = &play.sessions[index].client {
            for sql in &session.teardown {
                let _ = client.batch_execute(sql).await;
            }
        }
    }
    drop(play.sessions);
    for sql in &spec.teardown {
        let shown = Action::Sql(sql.clone()).display();
        play.notes.push(format!("teardown: {shown}"));
        for line in run_sql(&setup, sql).await {
            play.notes.push(format!("  {line}"));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "\
# comment
title: two debits
claim: the second waits
  and re-reads
fails: it does not wait
system: t
clean: no
setup: UPDATE account
  SET balance = 100
session a
  setup: BEGIN
  step a1: UPDATE x
  step a2: COMMIT
session b
  call b1: debit account=acct-0001 amount=30
permutation: a1 b1 a2
";

    #[test]
    fn parses_keys_sessions_steps_and_continuations() {
        let spec = parse(SPEC).expect("parses");
        assert_eq!(spec.claim, "the second waits\nand re-reads");
        assert_eq!(
            spec.setup,
            vec![Action::Sql("UPDATE account\nSET balance = 100".into())]
        );
        assert_eq!(spec.sessions.len(), 2);
        assert_eq!(spec.sessions[0].setup, vec!["BEGIN".to_string()]);
        assert_eq!(spec.sessions[0].steps[1].name, "a2");
        let Action::Call(call) = &spec.sessions[1].steps[0].action else {
            panic!("a call")
        };
        assert_eq!(call.op, "debit");
        assert_eq!(call.arg("amount"), Some("30"));
        assert_eq!(spec.orders(), vec![vec!["a1", "b1", "a2"]]);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let bad = [
            (
                SPEC.replace("permutation: a1 b1 a2", "permutation: a1 zz"),
                "unknown step",
            ),
            (SPEC.replace("step a2", "step a1"), "defined twice"),
            (SPEC.replace("clean: no\n", ""), "clean"),
            (SPEC.replace("title: two debits\n", ""), "title"),
            (SPEC.replace("system: t", "sytem: t"), "unknown key"),
            (SPEC.replace("  step a1", "  stop a1"), "in a session"),
        ];
        for (text, expected) in bad {
            let error = parse(&text).expect_err(expected);
            assert!(
                error.message.contains(expected),
                "{error} lacks {expected:?}"
            );
        }
    }

    #[test]
    fn every_order_keeps_each_sessions_order() {
        assert_eq!(
            all_orders(&[2, 1]),
            vec![
                vec![(0, 0), (0, 1), (1, 0)],
                vec![(0, 0), (1, 0), (0, 1)],
                vec![(1, 0), (0, 0), (0, 1)],
            ]
        );
        assert_eq!(all_orders(&[3, 3]).len(), 20);
        assert_eq!(all_orders(&[2, 2, 1]).len(), 30);
    }

    #[test]
    fn spec_ids_cannot_meet_hand_written_ids() {
        assert_eq!(spec_id("L", "s1_debit.spec").as_deref(), Some("L-S1"));
        assert_eq!(spec_id("L", "s12_x.spec").as_deref(), Some("L-S12"));
        assert_eq!(spec_id("L", "s01_x.spec"), None);
        assert_eq!(spec_id("L", "debit.spec"), None);
        assert_eq!(spec_id("L", "s1_x.txt"), None);
    }
}
