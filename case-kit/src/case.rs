//! What a case is, and the family it belongs to.
//!
//! A [`Case`] owns its data (id, title, body), so cases can be built at run time as well
//! as from a `fn`. A [`Family`] groups the cases of one system under test: their id
//! prefix, the [`Engine`] each case gets (a PostgreSQL database cloned from the family's
//! own template, an SQLite file, or nothing), and where their snapshots live.

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::ctx::Ctx;
use crate::engine::{Engine, InstallFn, PgTemplate};
use crate::options::Choices;
use crate::schedule::Schedule;

/// The async body of a case: borrows the context for as long as it runs.
pub type CaseBody = dyn for<'a> Fn(&'a mut Ctx) -> BoxFuture<'a, anyhow::Result<()>> + Send + Sync;

/// PostgreSQL connections a case holds at once unless it declares more with
/// [`Case::connections`].
pub const DEFAULT_CONNECTIONS: u32 = 2;

/// One numbered case: an id (`L3`), a title naming the claim or the anomaly, its body,
/// and how it is scheduled.
#[derive(Clone)]
pub struct Case {
    /// Short id, e.g. `L3`; what `./run.sh L3` selects. Starts with its family's prefix.
    pub id: String,
    /// One line: the claim or, for a negative control, the anomaly it shows.
    pub title: String,
    /// When it may run.
    pub schedule: Schedule,
    /// Whether its database or file must reconcile clean afterwards (false for negative
    /// controls, whose data is broken on purpose, and for the reconciliation case).
    pub clean: bool,
    /// The most PostgreSQL connections the case holds at one moment: its own, a race's
    /// participants, the pool of a service it starts, a crash-worker's. The runner never
    /// lets concurrent cases declare more together than the cluster accepts.
    pub connections: u32,
    /// Choices this case keeps whatever the run's ([`Case::pin`]): a ledger case that
    /// needs an open transaction at a hook point pins the statement transfer mode.
    pub pinned: Choices,
    /// Why the case crashes or restarts the PostgreSQL server, when it does
    /// ([`Case::restarts_server`]); `None` for a case that leaves the server running. A
    /// run against an existing server (`--database-url`) lists such cases as not run
    /// with this reason.
    pub restarts_server: Option<String>,
    /// What the case needs from the machine, as a check that says why it is missing
    /// (`None`: present), e.g. root and `/dev/fuse` to mount a file system. A run where
    /// it is missing lists the case as not run with that reason ([`Case::requires`]).
    pub requirement: Option<fn() -> Option<String>>,
    /// Why the case cannot run at all, known before anything starts: a case file that
    /// cannot be read, parsed or run on its family's engine (`<file>: line N: …`,
    /// [`crate::spec::cases_on`]). The harness refuses a selection holding one as a
    /// usage error before it starts a server ([`Case::broken`]); run anyway, the case
    /// fails with this reason.
    pub problem: Option<String>,
    /// The body.
    pub body: Arc<CaseBody>,
}

impl Case {
    /// A case scheduled [`Schedule::Concurrent`], clean, holding
    /// [`DEFAULT_CONNECTIONS`]; `body` is usually `|ctx| run(ctx).boxed()`.
    pub fn new<F>(id: impl Into<String>, title: impl Into<String>, body: F) -> Case
    where
        F: for<'a> Fn(&'a mut Ctx) -> BoxFuture<'a, anyhow::Result<()>> + Send + Sync + 'static,
    {
        Case {
            id: id.into(),
            title: title.into(),
            schedule: Schedule::Concurrent,
            clean: true,
            connections: DEFAULT_CONNECTIONS,
            pinned: Choices::default(),
            restarts_server: None,
            requirement: None,
            problem: None,
            body: Arc::new(body),
        }
    }

    /// Sets when it runs.
    pub fn schedule(mut self, schedule: Schedule) -> Case {
        self.schedule = schedule;
        self
    }

    /// Marks its data as broken on purpose (a negative control, or a case that tampers):
    /// the family's reconciliation does not include it.
    pub fn not_clean(mut self) -> Case {
        self.clean = false;
        self
    }

    /// Declares that the case crashes or restarts the PostgreSQL server (through
    /// [`Ctx::restart_cluster_immediate`]), saying why in `reason` (one line, e.g.
    /// `immediate stop with a debit open, then WAL recovery`). Schedules it
    /// [`Schedule::Exclusive`]. Only a case that declared this may restart the server;
    /// a run against an existing server does not run it.
    pub fn restarts_server(mut self, reason: impl Into<String>) -> Case {
        self.restarts_server = Some(reason.into());
        self.schedule = Schedule::Exclusive;
        self
    }

    /// Declares the most PostgreSQL connections it holds at once (see
    /// [`Case::connections`](struct.Case.html#structfield.connections)).
    pub fn connections(mut self, connections: u32) -> Case {
        self.connections = connections;
        self
    }
}

impl Case {
    /// Declares what the case needs from the machine: `check` returns why it is
    /// missing, or `None` (see [`Case::requirement`](struct.Case.html#structfield.requirement)).
    pub fn requires(mut self, check: fn() -> Option<String>) -> Case {
        self.requirement = Some(check);
        self
    }

    /// Marks the case as one that cannot run, for `reason` (see
    /// [`Case::problem`](struct.Case.html#structfield.problem)).
    pub fn broken(mut self, reason: impl Into<String>) -> Case {
        self.problem = Some(reason.into());
        self
    }

    /// Why the case cannot run on this machine, or `None` when it can.
    pub fn unavailable(&self) -> Option<String> {
        self.requirement.and_then(|check| check())
    }

    /// Keeps the choice of type `T` at `value` for this case whatever the run's (see
    /// [`crate::options`]); `name` is its name in the run record.
    pub fn pin<T>(mut self, name: &'static str, value: T) -> Case
    where
        T: std::any::Any + Send + Sync + Copy + fmt::Display,
    {
        self.pinned.set(name, value);
        self
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("id", &self.id)
            .field("title", &self.title)
            .field("schedule", &self.schedule)
            .field("clean", &self.clean)
            .field("connections", &self.connections)
            .field("pinned", &self.pinned)
            .field("restarts_server", &self.restarts_server)
            .field("requirement", &self.requirement.is_some())
            .field("problem", &self.problem)
            .finish()
    }
}

/// The cases of one system under test.
#[derive(Debug, Clone)]
pub struct Family {
    /// Id prefix of its cases (`L`); `./run.sh L` runs the family.
    pub prefix: &'static str,
    /// One line naming the system, e.g. `points ledger on PostgreSQL (SPEC §1–§7)`.
    pub title: &'static str,
    /// What each case works on.
    pub engine: Engine,
    /// The cases of a default run, in id order. At most one is scheduled
    /// [`Schedule::Last`]: the family's reconciliation, which sees the clean databases
    /// (or files) of the family's other cases.
    pub cases: Vec<Case>,
    /// Cases compiled and tested but run only when named (a template to copy, a canary
    /// that must fail); they have no snapshot.
    pub extras: Vec<Case>,
    /// The verb sets its case files may call ([`crate::spec::verbs`]), as
    /// `./run.sh --verbs` lists them; empty for a family whose verbs are not declared
    /// in a table yet.
    pub verbs: Vec<&'static crate::spec::verbs::Verbs>,
}

impl Family {
    /// A family on PostgreSQL: every case database is cloned from `template`, made once
    /// per run by `install`; `cases` is its default run (no extras), `verbs` the verb sets
    /// its case files may call.
    pub fn on_postgres(
        prefix: &'static str,
        title: &'static str,
        template: &'static str,
        install: InstallFn,
        cases: Vec<Case>,
        verbs: &[&'static crate::spec::verbs::Verbs],
    ) -> Family {
        Family {
            prefix,
            title,
            engine: Engine::Postgres(PgTemplate { template, install }),
            cases,
            extras: Vec::new(),
            verbs: verbs.to_vec(),
        }
    }

    /// The folder of the family's snapshots under the snapshot root:
    /// `evidence/snapshots/<prefix>/<id>.snap`.
    pub fn snapshot_folder(&self) -> &'static str {
        self.prefix
    }

    /// Whether `case_id` is one of the default cases (not an extra).
    pub fn is_default(&self, case_id: &str) -> bool {
        self.cases.iter().any(|case| case.id == case_id)
    }
}

/// A family's Rust cases and its case files as one list in id order: by the number
/// after the id's leading letters (`I3` before `I10`); an id with no number last.
/// One definition for the families that mix both (I, P, R).
pub fn in_id_order(mut cases: Vec<Case>) -> Vec<Case> {
    let number = |case: &Case| {
        case.id
            .trim_start_matches(|c: char| c.is_ascii_alphabetic())
            .parse::<u32>()
            .unwrap_or(u32::MAX)
    };
    cases.sort_by_key(number);
    cases
}

/// Declares each case module of a family and lists it in `cases()`, in the order given:
///
/// ```ignore
/// case_kit::register_cases! {
///     l01_normal_path,
///     pub l04_lost_update,   // public: a test runs it under another plan
/// }
/// ```
///
/// Each module has `pub fn case() -> Case`. Adding a case is one new file and one line
/// here.
#[macro_export]
macro_rules! register_cases {
    ($($visibility:vis $module:ident),* $(,)?) => {
        $($visibility mod $module;)*

        /// Every registered case of the family, in id order: what a full run runs.
        pub fn cases() -> Vec<$crate::Case> {
            vec![$($module::case()),*]
        }
    };
}
