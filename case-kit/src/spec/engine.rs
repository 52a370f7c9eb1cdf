//! The one engine trait every case file runs on: PostgreSQL ([`super::PgEngine`]), an
//! SQLite file, a MariaDB connection, a replicated pair, a forgetful disk. The runner
//! (`runner.rs`) plays every permutation the same way on each; what differs is what an
//! engine offers, asked through this trait:
//!
//! - **waits**: an engine whose connections have an id ([`EngineSession::wait_id`]) and
//!   a monitor that reports which wait for a lock ([`EngineSession::waiting`]) gets
//!   `<waiting ...>` and `<... completed>` lines, and the markers of PostgreSQL's tester;
//!   elsewhere (SQLite) each step runs to its end before the next is sent, and a step
//!   that would wait for another session's lock waits inside the engine (SQLite's busy
//!   timeout) and prints what it ends with;
//! - **notices**: a connection may append what the server says besides its results to
//!   the permutation's [`NoticeLog`] (PostgreSQL's `NOTICE:` lines);
//! - **races, restarts and PostgreSQL's layout**: offered by an engine over PostgreSQL
//!   ([`SpecEngine::postgres`]); a file that needs one is refused on another engine when
//!   it is read, with the reason;
//! - **databases**: permutation N runs on the engine's database N
//!   ([`SpecEngine::begin`], [`SpecEngine::connect`]), a fresh one for each, the first
//!   the case's own;
//! - **reconciliation**: `reconcile:` asks the expectation connection
//!   ([`EngineSession::reconcile`]), `reconcile others:` the engine
//!   ([`SpecEngine::reconcile_others`]).
//!
//! The idea is sqllogictest-rs's `AsyncDB`: one small adapter per engine, one runner.

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use super::model::{Call, Calls, Layout};
use super::result::NoticeLog;
use super::verbs::Verbs;
use crate::ctx::Ctx;

pub use super::model::Reconciled;

/// Every other clean database of a family, each with its [`Reconciled`].
pub type ReconciledOthers = Result<Vec<(String, Reconciled)>, String>;

/// A connection being opened ([`SpecEngine::connect`], [`SpecEngine::expectations`]).
pub type SessionFuture<'a> = BoxFuture<'a, anyhow::Result<Box<dyn EngineSession>>>;

/// The two declarations every family's engine makes, [`SpecEngine::system`] and
/// [`SpecEngine::verbs`], written once inside its `impl SpecEngine`:
///
/// ```ignore
/// impl SpecEngine for SqliteEngine {
///     case_kit::spec_declares!(SYSTEM, crate::verbs::ALL);
///     …
/// }
/// ```
///
/// `$system` is what every file's `system:` says; `$verbs` the family's verb sets (a
/// slice of `&'static Verbs`).
#[macro_export]
macro_rules! spec_declares {
    ($system:expr, $verbs:expr) => {
        fn system(&self) -> &str {
            $system
        }

        fn verbs(&self) -> Vec<&'static $crate::spec::verbs::Verbs> {
            $verbs.to_vec()
        }
    };
}

/// What a connection is opened for: the permutation whose database it is on, the
/// layout its rows print in, and, for a spec session, its index and the permutation's
/// notice log.
#[derive(Clone)]
pub struct Opening {
    /// 1-based: the first is the case's own database.
    pub permutation: usize,
    /// How its rows and errors print.
    pub layout: Layout,
    /// `Some((index, log))` for session `index` of the spec: its notices go to `log`.
    pub session: Option<(usize, NoticeLog)>,
}

impl Opening {
    /// A connection for the setup, teardown, monitor or expectations of `permutation`.
    pub fn plain(permutation: usize, layout: Layout) -> Opening {
        Opening {
            permutation,
            layout,
            session: None,
        }
    }
}

/// One connection of an engine, for a session, the setup, the monitor or the
/// expectations.
pub trait EngineSession: Send {
    /// Runs `sql` (one or more statements) and returns what the transcript prints: each
    /// row as `column=value` (`null` for NULL), `(0 rows)` for a statement that returns
    /// rows but found none, nothing for one that returns none, or one line
    /// `ERROR <code>: <message>` (the engine's own code name).
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>>;

    /// Runs a family operation on this connection: `Ok` its outcome as printed (a
    /// result of several lines prints as several lines), `Err` its error as printed
    /// after `ERROR `.
    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>>;

    /// The family's reconciliation of the database this connection is on, for
    /// `reconcile:`: `Ok((clean, summary))`, the summary as `kind=N …` words. Default:
    /// the family has none (a failed check).
    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        async { Err("this family offers no reconciliation".to_string()) }.boxed()
    }

    /// The connection's id on the server (PostgreSQL's backend pid, MariaDB's
    /// `CONNECTION_ID()`), as [`EngineSession::waiting`] reports it. `None` (the
    /// default): the engine observes no waits, and the steps run one at a time, each to
    /// its end.
    fn wait_id(&self) -> Option<u64> {
        None
    }

    /// Asked on the monitor: which of `ids` wait now for a lock held by one of `among`
    /// (every session of the permutation), as the engine itself reports it
    /// (PostgreSQL: `pg_isolation_test_session_is_blocked`; MariaDB:
    /// `INNODB_TRX.trx_state = 'LOCK WAIT'` or a lock wait in `PROCESSLIST.STATE`): an
    /// observation, never a guess from time. Default: none.
    ///
    /// Errors: the engine could not be asked (the monitor is reopened once).
    fn waiting<'a>(
        &'a mut self,
        _ids: &'a [u64],
        _among: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<u64>, String>> {
        async { Ok(Vec::new()) }.boxed()
    }

    /// Asked on the monitor once the step of connection `id` has answered: whether the
    /// server still works on it (PostgreSQL answers an error before it releases the
    /// locks: the backend is `active` until then). Default: no.
    ///
    /// Errors: the engine could not be asked.
    fn still_active(&mut self, _id: u64) -> BoxFuture<'_, Result<bool, String>> {
        async { Ok(false) }.boxed()
    }

    /// Asked on the monitor when a permutation fails: cancels what connection `id`
    /// runs (PostgreSQL: `pg_cancel_backend`); `true` when the engine could ask, so the
    /// runner waits for the step to end rather than abort it. Default: `false`.
    fn cancel(&mut self, _id: u64) -> BoxFuture<'_, bool> {
        async { false }.boxed()
    }
}

/// A family's engine for its case files: its connections and its operations (the
/// family's verb set, checked when a file is read).
pub trait SpecEngine: Send + Sync {
    /// What every file's `system:` must say: the template or schema the engine's
    /// databases get.
    fn system(&self) -> &str;

    /// The verb sets the family composes, each verb declared once by the system it
    /// drives ([`super::verbs`]): what `./run.sh --verbs` lists and the docs' verb
    /// reference shows. Default: none.
    fn verbs(&self) -> Vec<&'static Verbs> {
        Vec::new()
    }

    /// Whether `call` names a known verb with the arguments it takes; checked when the
    /// file is read, before anything runs. Default: against [`SpecEngine::verbs`]
    /// ([`super::verbs::check`]); a family adds what a declaration cannot say (a hook
    /// point's name, a list's items).
    fn check(&self, call: &Call) -> Result<(), String> {
        super::verbs::check(&self.verbs(), &call.op, &call.args)
    }

    /// The family's operations over a PostgreSQL connection, when the engine is
    /// PostgreSQL: what races (`race call:`), crashes (`restart immediate:`) and
    /// PostgreSQL's layout need. Default: `None`, and a file that needs one is refused.
    fn postgres(&self) -> Option<Arc<dyn Calls>> {
        None
    }

    /// This engine as the case's choices run it ([`Ctx::choice`]), when that matters
    /// to the family (the ledger's one-trip transfer). Default: `None`, the same
    /// whatever the run chose.
    fn for_case(&self, _ctx: &Ctx) -> Option<Arc<dyn SpecEngine>> {
        None
    }

    /// Writes to the run record what a reader of the evidence should know about the
    /// engine (its version), when a case starts. Default: nothing.
    fn describe(&self, _ctx: &mut Ctx) {}

    /// PostgreSQL connections `call` holds besides its session's (a service's pool, a
    /// child process's own), so a spec case declares them. Default: none.
    fn connections(&self, _call: &Call) -> u32 {
        0
    }

    /// Whether a step running `call`, sent and not yet answered, waits on something
    /// the family's operations see and the engine's monitor does not (a request paused
    /// at a service's hook point): the runner treats it as waiting. Default: never.
    fn held<'a>(&'a self, _call: &'a Call) -> BoxFuture<'a, bool> {
        async { false }.boxed()
    }

    /// Ends at once what the operations started for the case (child processes, a
    /// service), when the case ends, also when it is cancelled midway (called from a
    /// guard's drop: it must not block on other tasks). Default: nothing.
    fn end(&self) {}

    /// Makes the database of permutation `permutation` (1-based) of the case in `ctx`,
    /// once, before its connections open: the first is the case's own; each later one
    /// a fresh database in the state the first started in. Default: nothing to make
    /// (the engine makes it at its first connection).
    ///
    /// Errors: the database cannot be made.
    fn begin<'a>(
        &'a self,
        _ctx: &'a Ctx,
        _permutation: usize,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        async { Ok(()) }.boxed()
    }

    /// Opens a connection as `opening` says.
    ///
    /// Errors: the database cannot be opened.
    fn connect<'a>(&'a self, ctx: &'a Ctx, opening: Opening) -> SessionFuture<'a>;

    /// The connection the expectations run on. Default: one to the case's own
    /// database; an engine may let it see more (the SQLite engine attaches the case's
    /// other files).
    ///
    /// Errors: as [`SpecEngine::connect`].
    fn expectations<'a>(&'a self, ctx: &'a Ctx) -> SessionFuture<'a> {
        self.connect(ctx, Opening::plain(1, Layout::Ours))
    }

    /// `reconcile others: clean`: the reconciliation of every other clean database of
    /// the family, as `(name, Ok((clean, summary)) or Err(reason))`. Default: the family
    /// has none (a failed check).
    fn reconcile_others<'a>(&'a self, _ctx: &'a Ctx) -> BoxFuture<'a, ReconciledOthers> {
        async { Err("this family offers no reconciliation".to_string()) }.boxed()
    }
}
