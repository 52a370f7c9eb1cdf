//! What a case sees: its own database or file, connections, a race helper that releases
//! N connections together, and a check recorder that writes the transcript (SPEC §7).
//!
//! The runner builds an [`Env`] once per run and a [`Ctx`] per case; cases know nothing
//! of the cluster's lifecycle, evidence files or exit codes.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use rand_chacha::ChaCha8Rng;

use crate::env::Env;
use crate::options::Choices;
use crate::race::{Racer, race};
use crate::report::{Check, Line};
use crate::resource::Resource;
use crate::rng::seeded_rng;

/// How many characters of a racer's result `{:?}` the evidence page shows.
pub const RACE_OUTCOME_CHARS: usize = 400;

/// Restarts the run's scratch cluster in immediate mode (no checkpoint; WAL recovery on
/// start): made by [`Ctx::server_restart`] for a case that declared
/// [`crate::Case::restarts_server`].
#[derive(Clone)]
pub struct ServerRestart {
    cluster: Arc<std::sync::Mutex<scratch_pg::Cluster>>,
}

impl std::fmt::Debug for ServerRestart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerRestart")
    }
}

impl ServerRestart {
    /// Stops the cluster in immediate mode and starts it again.
    ///
    /// Errors: the cluster's stop or start failed.
    pub async fn immediate(&self) -> anyhow::Result<()> {
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .restart_immediate()
        })
        .await??;
        Ok(())
    }
}

/// The context a case runs in.
pub struct Ctx {
    env: Arc<Env>,
    family: String,
    case_id: String,
    resource: Resource,
    lines: Vec<Line>,
    details: BTreeMap<String, serde_json::Value>,
    pinned: Choices,
    may_restart_server: bool,
    /// Each race's sessions as drawn on the evidence page ([`Ctx::race`]); moved into
    /// `details["races"]` by [`Ctx::take`].
    races: std::sync::Mutex<Vec<serde_json::Value>>,
}

impl Ctx {
    /// A context for case `case_id` of family `family` whose resource already exists
    /// (or, for a file, may be created).
    pub fn new(
        env: Arc<Env>,
        family: impl Into<String>,
        case_id: impl Into<String>,
        resource: Resource,
    ) -> Ctx {
        Ctx {
            env,
            family: family.into(),
            case_id: case_id.into(),
            resource,
            lines: Vec::new(),
            details: BTreeMap::new(),
            pinned: Choices::default(),
            may_restart_server: true,
            races: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Keeps these choices whatever the run's (the runner passes a case's
    /// [`crate::Case::pinned`]).
    pub fn pin(&mut self, pinned: &Choices) {
        self.pinned = self.pinned.overlaid(pinned);
    }

    /// The run's choice of type `T` for this case ([`crate::options`]): the case's
    /// pinned value, else the run's, else `None` (a test environment sets none). A
    /// choice that never shows in a transcript keeps one snapshot for every value.
    pub fn choice<T: std::any::Any + Copy>(&self) -> Option<T> {
        self.pinned
            .get::<T>()
            .or_else(|| self.env.choices().get::<T>())
    }

    /// Every choice in force for this case, pinned ones in place of the run's.
    pub fn choices(&self) -> Choices {
        self.env.choices().overlaid(&self.pinned)
    }

    /// Whether [`Ctx::restart_cluster_immediate`] is allowed (a context from
    /// [`Ctx::new`] allows it; the runner allows it only for a case that declared
    /// [`crate::Case::restarts_server`]).
    pub fn set_may_restart_server(&mut self, allowed: bool) {
        self.may_restart_server = allowed;
    }

    /// The case's id.
    pub fn case_id(&self) -> &str {
        &self.case_id
    }

    /// The prefix of the case's family.
    pub fn family(&self) -> &str {
        &self.family
    }

    /// What the case works on.
    pub fn resource(&self) -> &Resource {
        &self.resource
    }

    /// The run's seed (printed first by the harness; `--seed N` replays a run).
    pub fn seed(&self) -> u64 {
        self.env.seed()
    }

    /// A random generator for this case, seeded from the run's seed and the case id, so a
    /// run with the same `--seed` draws the same values. Each call starts the same
    /// sequence again: call it once and keep the generator. For racers, use
    /// [`seeded_rng`] with [`Ctx::seed`] and a label per racer.
    ///
    /// Print only what is deterministic for the transcript (counts, sums, balances), not
    /// the drawn values, or the snapshot would change with the seed.
    pub fn rng(&self) -> ChaCha8Rng {
        seeded_rng(self.seed(), &self.case_id)
    }

    /// A log file path for a process this case starts, e.g. `log_file("ledger-svc")` →
    /// `<run>/logs/L7-ledger-svc.log` in a harness run. The folder exists on return.
    ///
    /// Errors: the folder cannot be created.
    pub fn log_file(&self, name: &str) -> std::io::Result<PathBuf> {
        let dir = self.env.logs_dir();
        std::fs::create_dir_all(dir)?;
        Ok(dir.join(format!("{}-{name}.log", self.case_id)))
    }

    /// The folder of the run cluster's PostgreSQL binaries: for a case that starts
    /// clusters of its own (a primary and its standby) at the run's major version.
    ///
    /// Errors: the run has no scratch cluster (an existing server, or none).
    pub fn pg_bin(&self) -> anyhow::Result<PathBuf> {
        Ok(self.env.cluster()?.binaries().bin_dir.clone())
    }

    /// A new path `<run>/files/<case>-<name>-<n>` for a folder this case makes itself
    /// (a cluster of its own): it does not exist yet, its parent does, and the run
    /// removes it with the run's folder (the janitor too, after a kill -9 of the
    /// harness, once every postmaster under it has exited).
    ///
    /// Errors: the parent folder cannot be created.
    pub fn own_folder(&self, name: &str) -> std::io::Result<PathBuf> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let dir = self.env.files_dir();
        std::fs::create_dir_all(dir)?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Ok(dir.join(format!("{}-{name}-{n}", self.case_id)))
    }

    /// A folder of this case's own in the run's folder (`<run>/files/<id>-work/`),
    /// made empty on return (removed with the run): for a case that brings its own
    /// system, say a PostgreSQL cluster on a file system it mounts.
    ///
    /// Errors: the folder cannot be emptied or created.
    pub fn work_dir(&self) -> std::io::Result<PathBuf> {
        let dir = self.env.files_dir().join(format!("{}-work", self.case_id));
        match std::fs::remove_dir_all(&dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Name of this case's own database (a clone of its family's template).
    ///
    /// Panics when the family's engine is not PostgreSQL (the runner turns a panic into
    /// a failed check).
    pub fn database(&self) -> &str {
        match &self.resource {
            Resource::Database(name) => name,
            other => panic!(
                "case {} has no PostgreSQL database (it has {other:?})",
                self.case_id
            ),
        }
    }

    /// A connection URL of this case's database, for a child process (the crash-worker,
    /// ledger-svc).
    ///
    /// Errors: the run has no cluster.
    pub fn database_url(&self) -> anyhow::Result<String> {
        self.env.url(self.database())
    }

    /// A new connection to this case's database.
    ///
    /// Errors: connection failures; the case has no database.
    pub async fn connect(&self) -> anyhow::Result<tokio_postgres::Client> {
        self.env.connect(self.database()).await
    }

    /// Clones its family's template as another database of this case,
    /// `<its database>_<suffix>` (dropping an older one of that name first), and returns
    /// the name: for a case that tries several orders of the same steps (a spec's
    /// permutations), each on the same starting state. Nothing is dropped while the name
    /// is new, so no checkpoint is forced (`DROP DATABASE` forces one); the extra
    /// databases go with the scratch cluster and are not reconciled.
    ///
    /// Errors: the case has no database; its family has no template in this run; SQL
    /// errors of the drop or the clone.
    pub async fn extra_database(&self, suffix: &str) -> anyhow::Result<String> {
        let template = self
            .env
            .template_of(&self.family)
            .ok_or_else(|| anyhow::anyhow!("family {} has no template in this run", self.family))?;
        let name = format!("{}_{suffix}", self.database());
        self.env.clone_database(template, &name).await?;
        Ok(name)
    }

    /// The connection settings of `database` on the run's server, for a connection a
    /// case drives itself (a spec session that keeps its notices).
    ///
    /// Errors: the run has no PostgreSQL server.
    pub fn config_for(&self, database: &str) -> anyhow::Result<tokio_postgres::Config> {
        self.env.config(database)
    }

    /// A new connection to another database of the run (e.g. for reconciliation).
    ///
    /// Errors: connection failures.
    pub async fn connect_to(&self, database: &str) -> anyhow::Result<tokio_postgres::Client> {
        self.env.connect(database).await
    }

    /// The clean databases of this case's family registered so far (a case scheduled
    /// [`crate::Schedule::Last`] sees all of them), excluding this case's own, sorted.
    pub fn clean_databases(&self) -> Vec<String> {
        let own = self.resource.name();
        let mut names = self.env.clean_of(&self.family);
        names.retain(|name| name != &own);
        names
    }

    /// This case's own SQLite file (in the run's folder, removed with the run). The
    /// folder exists on return; the file does not exist when the case starts.
    ///
    /// Panics when the family's engine is not an SQLite file.
    pub fn sqlite_path(&self) -> PathBuf {
        match &self.resource {
            Resource::SqliteFile(path) => path.clone(),
            other => panic!(
                "case {} has no SQLite file (it has {other:?})",
                self.case_id
            ),
        }
    }

    /// The clean SQLite files of this case's family registered so far, excluding this
    /// case's own, sorted.
    pub fn clean_sqlite_files(&self) -> Vec<PathBuf> {
        self.clean_databases()
            .into_iter()
            .map(PathBuf::from)
            .collect()
    }

    /// Races `participants` OS threads on this case's database, each with its own
    /// runtime and its own connection opened beforehand; all start `body` at the same
    /// moment (a barrier), and may meet again at [`Racer::barrier`]. Returns the results
    /// in index order. Declare the participants in the case's
    /// [`crate::Case::connections`].
    ///
    /// Errors: a participant could not connect (then no participant runs `body`, so none
    /// waits at the barrier for one that never comes), or a participant panicked.
    ///
    /// For the run's evidence page each participant's start and end (microseconds after
    /// the race was called, read off the clock only to draw it, never to decide a check)
    /// and its result (`{:?}`, cut to `RACE_OUTCOME_CHARS`, 400 characters) go to the case's
    /// `details["races"]`.
    pub async fn race<T, F, Fut>(&self, participants: usize, body: F) -> anyhow::Result<Vec<T>>
    where
        T: Send + std::fmt::Debug + 'static,
        F: Fn(Racer) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = T>,
    {
        let origin = std::time::Instant::now();
        let spans = Arc::new(std::sync::Mutex::new(vec![(0u128, 0u128); participants]));
        let recorded = spans.clone();
        let results = race(
            self.env.config(self.database())?,
            participants,
            move |racer| {
                let index = racer.index;
                let spans = recorded.clone();
                let running = body(racer);
                async move {
                    let start = origin.elapsed().as_micros();
                    let result = running.await;
                    let end = origin.elapsed().as_micros();
                    if let Ok(mut spans) = spans.lock() {
                        spans[index] = (start, end);
                    }
                    result
                }
            },
        )
        .await?;
        let spans = spans.lock().map(|s| s.clone()).unwrap_or_default();
        let sessions: Vec<serde_json::Value> = results
            .iter()
            .zip(spans)
            .map(|(result, (start_us, end_us))| {
                let outcome: String = format!("{result:?}")
                    .chars()
                    .take(RACE_OUTCOME_CHARS)
                    .collect();
                serde_json::json!({ "start_us": start_us, "end_us": end_us, "outcome": outcome })
            })
            .collect();
        if let Ok(mut races) = self.races.lock() {
            races.push(serde_json::json!({ "sessions": sessions }));
        }
        Ok(results)
    }

    /// Restarts the cluster in immediate mode (no checkpoint; WAL recovery on start).
    /// Only for cases that declared [`crate::Case::restarts_server`] (which schedules
    /// them [`crate::Schedule::Exclusive`]).
    ///
    /// Errors: the case did not declare it; no scratch cluster (none, or an existing
    /// server); the cluster's stop or start failed.
    pub async fn restart_cluster_immediate(&self) -> anyhow::Result<()> {
        self.server_restart()?.immediate().await
    }

    /// A handle that restarts the cluster as [`Ctx::restart_cluster_immediate`] does,
    /// for code that keeps it beyond this borrow of the context (a family's spec
    /// operations take it in [`crate::spec::Calls::for_case`]: L15's `crash-server`).
    ///
    /// Errors: the case did not declare [`crate::Case::restarts_server`]; no scratch
    /// cluster (none, or an existing server).
    pub fn server_restart(&self) -> anyhow::Result<ServerRestart> {
        anyhow::ensure!(
            self.may_restart_server,
            "case {} restarts the server but does not declare Case::restarts_server",
            self.case_id
        );
        Ok(ServerRestart {
            cluster: self.env.shared_cluster()?,
        })
    }

    /// Adds `  note <text>`.
    pub fn note(&mut self, text: impl Into<String>) {
        self.lines.push(Line::Note { text: text.into() });
    }

    /// Records a fact for the run record (`results.json`, under the case's `details`),
    /// not for the transcript: what varies with the rest of the run (the list of
    /// databases a reconciliation covered, say) goes here, so that another case's
    /// arrival never changes this case's snapshot.
    pub fn record(&mut self, key: impl Into<String>, value: serde_json::Value) {
        self.details.insert(key.into(), value);
    }

    /// Records whether `actual == expected`. Returns whether it held.
    pub fn check_eq<T: PartialEq + Display>(
        &mut self,
        name: impl Into<String>,
        expected: T,
        actual: T,
    ) -> bool {
        let passed = expected == actual;
        self.lines.push(Line::Check(Check {
            name: name.into(),
            passed,
            expected: Some(expected.to_string()),
            actual: Some(actual.to_string()),
            compared: Default::default(),
        }));
        passed
    }

    /// Records a condition with a short description of what was seen. Returns `passed`.
    pub fn check(&mut self, name: impl Into<String>, passed: bool, seen: impl Display) -> bool {
        self.check_compared(name, passed, seen, crate::report::Compared::default())
    }

    /// [`Ctx::check`] with what the check compared (rows, values), kept for the run
    /// record and its page; the transcript line is the same as [`Ctx::check`]'s.
    /// Returns `passed`.
    pub fn check_compared(
        &mut self,
        name: impl Into<String>,
        passed: bool,
        seen: impl Display,
        compared: crate::report::Compared,
    ) -> bool {
        let seen = seen.to_string();
        self.lines.push(Line::Check(Check {
            name: name.into(),
            passed,
            expected: None,
            actual: (!seen.is_empty()).then_some(seen),
            compared,
        }));
        passed
    }

    /// A negative control's verdict: passes only when the naive design `misbehaved` as
    /// predicted; prints `negative control exposes: <anomaly>`. If the naive code
    /// happened to behave, this check FAILs: the control proved nothing.
    pub fn exposes(&mut self, anomaly: impl Display, misbehaved: bool, seen: impl Display) -> bool {
        self.check(
            format!("negative control exposes: {anomaly}"),
            misbehaved,
            seen,
        )
    }

    /// The transcript lines so far.
    pub fn lines(&self) -> &[Line] {
        &self.lines
    }

    /// The lines so far as printed, one per line (for a test's failure message).
    pub fn transcript(&self) -> String {
        self.lines.iter().map(|line| line.render() + "\n").collect()
    }

    /// Whether the negative control's check `negative control exposes: <anomaly>` held;
    /// with `anomaly` `None`, the first such check of any anomaly. `None` when there is
    /// no such check (a test should treat that as its own failure).
    pub fn exposed(&self, anomaly: Option<&str>) -> Option<bool> {
        let prefix = "negative control exposes: ";
        self.checks()
            .find(|check| match (check.name.strip_prefix(prefix), anomaly) {
                (Some(named), Some(anomaly)) => named == anomaly,
                (Some(_), None) => true,
                (None, _) => false,
            })
            .map(|check| check.passed)
    }

    /// The verdicts of every `negative control exposes: …` check so far, in order (empty
    /// when there is none: a control's test should treat that as its own failure).
    pub fn exposed_all(&self) -> Vec<bool> {
        self.checks()
            .filter(|check| check.name.starts_with("negative control exposes: "))
            .map(|check| check.passed)
            .collect()
    }

    /// The checks so far that failed.
    pub fn failed_checks(&self) -> Vec<&Check> {
        self.checks().filter(|check| !check.passed).collect()
    }

    fn checks(&self) -> impl Iterator<Item = &Check> {
        self.lines.iter().filter_map(|line| match line {
            Line::Check(check) => Some(check),
            Line::Note { .. } => None,
        })
    }

    /// Takes the recorded lines and details (the runner does this when the case ends).
    pub fn take(&mut self) -> (Vec<Line>, BTreeMap<String, serde_json::Value>) {
        let races = std::mem::take(self.races.get_mut().unwrap_or_else(|p| p.into_inner()));
        if !races.is_empty() {
            self.details
                .insert("races".into(), serde_json::Value::Array(races));
        }
        (
            std::mem::take(&mut self.lines),
            std::mem::take(&mut self.details),
        )
    }
}
