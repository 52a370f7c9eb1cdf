//! What a spec is once read, whichever format it was written in: sessions, steps,
//! permutation lines with their markers, and the parse error.

use std::fmt::Write as _;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_postgres::Client;

use crate::Racer;
use crate::ctx::Ctx;

/// A library operation as a step: an operation name and its `key=value` arguments.
/// Two calls are equal when their operation and arguments are: the line they were
/// written on is where to point an error, not part of what they do.
#[derive(Debug, Clone)]
pub struct Call {
    /// The operation, e.g. `debit`.
    pub op: String,
    /// Its arguments in the order written, e.g. `[("account", "acct-0001")]`.
    pub args: Vec<(String, String)>,
    /// The line of the case file it was read from (1-based), for an error that names it
    /// when the file is read ([`crate::spec::cases_on`]); 0 for a call made in code.
    pub line: usize,
}

impl PartialEq for Call {
    fn eq(&self, other: &Call) -> bool {
        self.op == other.op && self.args == other.args
    }
}

impl Eq for Call {}

impl Call {
    /// A call made in code (line 0): operation `op` with `args` in order.
    pub fn new(op: impl Into<String>, args: Vec<(String, String)>) -> Call {
        Call {
            op: op.into(),
            args,
            line: 0,
        }
    }

    /// The value of argument `name`, if given.
    pub fn arg(&self, name: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The call as written: `debit account=acct-0001 amount=30`.
    pub fn display(&self) -> String {
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
    /// The action on one line: SQL with its whitespace collapsed, or the call.
    pub fn display(&self) -> String {
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
    /// The permutation lines; empty: every order.
    pub permutations: Vec<Vec<Entry>>,
    /// How the transcript is laid out: ours, or PostgreSQL's expected-output layout.
    pub layout: Layout,
    /// Where a spec copied from PostgreSQL comes from (`src/test/isolation/specs/x.spec
    /// at <commit>`); empty for our own specs.
    pub upstream: String,
    /// The expected output the transcript must match in meaning
    /// ([`super::same_meaning`]): the file as shown, and its text.
    pub expected: Option<(String, String)>,
    /// A race instead of sessions: N sessions doing one operation, released together.
    pub race: Option<Race>,
    /// What must hold once everything else has run, in the order written: `check:`,
    /// `rows:`, `count:`, `reconcile:`, `exposes:` (read and checked by the `expect` module).
    pub expectations: Vec<Expect>,
    /// `schedule: last|exclusive|concurrent`: when the case runs among the others
    /// (`last`: the family's reconciliation, after every other case); `None`: the
    /// default, concurrent.
    pub schedule: Option<crate::schedule::Schedule>,
    /// `restart immediate: REASON`: once every permutation has run, the cluster is
    /// stopped in immediate mode and started again (WAL recovery; the `restart` module);
    /// the reason is the case's [`crate::Case::restarts_server`].
    pub restart: Option<String>,
    /// `after restart: SQL` / `after restart call: OP …`: run after the restart, in
    /// order, on a new connection, their results printed.
    pub after_restart: Vec<Action>,
}

/// A race (`race call: 32 debit … key=k-{i}` or `race step: 32 UPDATE …`): `count`
/// sessions, each on its own connection opened beforehand, run `action` (with `{i}`
/// replaced by the session's 0-based index) released together by a barrier; their
/// outcomes are counted by kind (`ok=14 insufficient=18`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Race {
    /// How many sessions.
    pub count: usize,
    /// What each does.
    pub action: Action,
    /// `race hold: SQL`: a holder runs it in an open transaction before the race and
    /// rolls back only once all `count` sessions are seen waiting for a lock at one
    /// moment, so the race is forced, not hoped for.
    pub hold: Option<String>,
    /// `expect: ok=14 insufficient=18`: the outcome counts that must be seen, every
    /// other kind 0.
    pub expect: Option<String>,
    /// `race alongside: OP …`: a call of the family run beside the racers on a
    /// connection of its own, from their release until it ends (L8: release a request
    /// held at a hook point once the others are seen waiting); its result is printed.
    pub alongside: Option<Call>,
}

/// A reconciliation's answer: `Ok((clean, summary))`, the summary as `kind=N …` words,
/// or why it could not run.
pub type Reconciled = Result<(bool, String), String>;

/// An operation's answer to come ([`Calls::run`]): the outcome as printed, or an error
/// as printed after `ERROR `.
pub type CallFuture<'a> = BoxFuture<'a, Result<String, String>>;

/// One expectation of a spec: what must hold once its steps have run (read and checked
/// by the `expect` module, which documents each key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// `check: SQL`: one row, first column true.
    True(String),
    /// `rows: SQL` with its `= …` lines: the rows as printed, in order.
    Rows {
        /// The query.
        sql: String,
        /// The rows expected, as `column=value …` (or `(0 rows)`).
        rows: Vec<String>,
    },
    /// `count: N SQL`: the query returns N rows.
    Count {
        /// The figure.
        figure: usize,
        /// The query.
        sql: String,
    },
    /// `reconcile: clean` (no words) or `reconcile: kind=N …`.
    Reconcile(Vec<String>),
    /// `reconcile others: clean`.
    ReconcileOthers,
    /// `exposes: ANOMALY` with `outcome KIND >= N`: a race's outcome counts decide.
    ExposesOutcome {
        /// The anomaly as named in the check.
        anomaly: String,
        /// The outcome kind counted (`check_violation`).
        kind: String,
        /// At least this many racers.
        at_least: usize,
    },
    /// `exposes: ANOMALY` with its query.
    Exposes {
        /// The anomaly as named in the check.
        anomaly: String,
        /// One row; its first column: whether the anomaly happened.
        sql: String,
    },
    /// `shows: STEP WORDS` (the words must be in what the step printed), or `exposes:
    /// ANOMALY` with `step STEP shows WORDS` (the anomaly happened when they are).
    Shows {
        /// `Some` for a negative control's verdict: the anomaly as named in the check.
        anomaly: Option<String>,
        /// The step whose printed result is read (its result lines, once it completed).
        step: String,
        /// Each must be one of the whitespace-separated words of that result.
        words: Vec<String>,
    },
}

/// How a spec's transcript is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Ours: `step a1: SQL`, rows as `column=value`, `ERROR <SQLSTATE>: message`.
    #[default]
    Ours,
    /// PostgreSQL's isolation tester's (`src/test/isolation/expected/*.out`): a
    /// `Parsed test spec with N sessions` header, `starting permutation:` lines, the
    /// SQL as written, rows as an aligned table with `(N rows)`, `ERROR:  message`,
    /// notices as `s1: NOTICE:  message`.
    Postgres,
}

/// One step of a permutation line: its name and its blocker markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The step.
    pub name: String,
    /// Its markers, `s2b(s1a)` or `s1a(*)`; empty for most steps.
    pub blockers: Vec<Blocker>,
}

impl Entry {
    /// A step without markers.
    pub fn plain(name: impl Into<String>) -> Entry {
        Entry {
            name: name.into(),
            blockers: Vec::new(),
        }
    }
}

/// A marker of a permutation step, as in PostgreSQL's isolation tester (PostgreSQL 14
/// and later, `src/test/isolation/README`, "Permutations"): it holds back the report
/// of the step's completion, so a transcript does not depend on timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocker {
    /// `(*)`: the step is reported `<waiting ...>` when it is sent, even when it
    /// completes at once; its completion is reported no earlier than after the next
    /// step is sent (for a step that ends in a deadlock error whichever way it goes).
    Once,
    /// `(other)`: the step is reported waiting while step `other` is in flight (sent
    /// and its completion not yet reported).
    Step(String),
    /// `(other notices N)`: the step is reported waiting until the session of step
    /// `other` has received at least N notices.
    Notices(String, usize),
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
        match self.line {
            0 => write!(f, "{}", self.message),
            line => write!(f, "line {line}: {}", self.message),
        }
    }
}

impl std::error::Error for ParseError {}

pub(crate) fn error(line: usize, message: impl Into<String>) -> ParseError {
    ParseError {
        line,
        message: message.into(),
    }
}

/// The library operations a family offers as steps (`call NAME: OP key=value …`), each
/// run on the session's own connection, so the family's own transaction can be a step.
pub trait Calls: Send + Sync {
    /// The verb sets these operations compose ([`super::verbs`]). Default: none.
    fn verbs(&self) -> Vec<&'static super::verbs::Verbs> {
        Vec::new()
    }

    /// Whether `call` names a known verb with the arguments it takes; the message says
    /// what is wrong. Checked before anything runs. Default: against [`Calls::verbs`].
    fn check(&self, call: &Call) -> Result<(), String> {
        super::verbs::check(&self.verbs(), &call.op, &call.args)
    }

    /// Runs `call` on `client`. `Ok` is the outcome as printed (`outcome=OK balance=20`);
    /// `Err` an error as printed after `ERROR ` (its SQLSTATE first when it has one).
    fn run<'a>(&'a self, client: &'a mut Client, call: &'a Call) -> CallFuture<'a>;

    /// Runs `call` as `racer` of a `race call:` ([`Race`]), on its connection: its
    /// barrier is shared by all racers, for an operation that meets the others between
    /// two of its statements (a naive read-then-write that is to be forced, not hoped
    /// for). Default: [`Calls::run`], the barrier unused (the race's own release already
    /// sent the racers together).
    fn run_racing<'a>(&'a self, racer: &'a mut Racer, call: &'a Call) -> CallFuture<'a> {
        self.run(&mut racer.client, call)
    }

    /// These operations as the case's choices run them ([`Ctx::choice`]), when that
    /// matters to the family (the ledger's one-trip transfer); `None` (the default):
    /// the same operations whatever the run chose.
    fn for_case(&self, _ctx: &Ctx) -> Option<Arc<dyn Calls>> {
        None
    }

    /// Backends the operations started outside the spec's sessions (a crash-worker's),
    /// counted with the sessions when the runner asks whether a step is blocked by
    /// another session. Default: none.
    fn backends(&self) -> Vec<i32> {
        Vec::new()
    }

    /// PostgreSQL connections `call` holds besides its session's (a service's pool, a
    /// child process's own), so a spec case declares them ([`crate::Case::connections`]).
    /// Default: none.
    fn connections(&self, _call: &Call) -> u32 {
        0
    }

    /// Whether a step running `call`, sent and not yet completed, waits on something the
    /// family's operations can see and PostgreSQL's sessions cannot: a request paused at
    /// a service's hook point, or one of the service's own backends waiting for a lock.
    /// The runner treats such a step as blocked (`<waiting ...>`), as it does a session
    /// PostgreSQL reports blocked; asked each time the runner looks while it is in
    /// flight. Default: never.
    fn waiting<'a>(&'a self, _call: &'a Call) -> BoxFuture<'a, bool> {
        async { false }.boxed()
    }

    /// Ends at once what the operations started for the case (child processes, a
    /// service), when the case ends, also when it is cancelled midway (the runner calls
    /// it from a guard's drop, so it must not block on other tasks). Default: nothing.
    fn end(&self) {}

    /// The family's reconciliation of the database `client` is connected to, for
    /// `reconcile:` (the `expect` module): `Ok((clean, summary))`, the summary as
    /// `kind=N …` words. Default: the family has none (`Err`, a failed check).
    fn reconcile<'a>(
        &'a self,
        _client: &'a mut Client,
    ) -> BoxFuture<'a, Result<(bool, String), String>> {
        async { Err("this family offers no reconciliation".to_string()) }.boxed()
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
