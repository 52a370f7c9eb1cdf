//! What a case sees: its own seeded database, connections, a race helper that releases
//! N connections together, and a check recorder that writes the transcript (SPEC §7).
//!
//! The runner (the `harness` binary) builds an [`Env`] once per run and a [`Ctx`] per
//! case; cases know nothing of the cluster's lifecycle, evidence files or exit codes.

use std::fmt::Display;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use scratch_pg::Cluster;
use serde::Serialize;

/// When a case may run relative to the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Schedule {
    /// Alongside other cases (it touches only its own database).
    Concurrent,
    /// Alone: it restarts the cluster or kills processes that others would notice.
    Exclusive,
    /// After every other case of the run (it inspects their databases).
    Last,
}

/// The async body of a case.
pub type CaseFn = for<'a> fn(&'a mut Ctx) -> BoxFuture<'a, anyhow::Result<()>>;

/// One numbered case: an id (`L3`), a title naming the claim or the anomaly, and its body.
#[derive(Clone, Copy)]
pub struct Case {
    /// Short id, `L1` … `L11`; what `./run.sh L3` selects.
    pub id: &'static str,
    /// One line: the claim or, for a negative control, the anomaly it shows.
    pub title: &'static str,
    /// When it may run.
    pub schedule: Schedule,
    /// Whether its database must reconcile clean afterwards (false for negative
    /// controls, whose databases are broken on purpose).
    pub clean: bool,
    /// The body.
    pub run: CaseFn,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("id", &self.id)
            .field("title", &self.title)
            .finish()
    }
}

/// One check's result, as written to the transcript and the result file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked, e.g. `successes = floor(100/7)`.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// Expected value, when the check compares values.
    pub expected: Option<String>,
    /// Actual value, when the check compares values.
    pub actual: Option<String>,
}

/// A transcript line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Line {
    /// `  note <text>`: a figure worth seeing, not a verdict.
    Note {
        /// The text.
        text: String,
    },
    /// `  ok   …` or `  FAIL …`.
    Check(Check),
}

impl Line {
    /// The line as printed, without a trailing newline.
    pub fn render(&self) -> String {
        match self {
            Line::Note { text } => format!("  note {text}"),
            Line::Check(check) => {
                let verdict = if check.passed { "ok  " } else { "FAIL" };
                match (&check.expected, &check.actual) {
                    (Some(expected), Some(actual)) => {
                        format!(
                            "  {verdict} {} (expected={expected}, actual={actual})",
                            check.name
                        )
                    }
                    (None, Some(actual)) => format!("  {verdict} {} ({actual})", check.name),
                    _ => format!("  {verdict} {}", check.name),
                }
            }
        }
    }
}

/// Shared by all cases of one run.
pub struct Env {
    /// The scratch cluster; locked only to read its address or to restart it.
    pub cluster: Arc<Mutex<Cluster>>,
    /// The database that holds the schema and the seeded accounts; cloned per case.
    pub template: String,
    /// Databases meant to be clean, registered as their cases finish (for L11).
    pub clean_databases: Mutex<Vec<String>>,
    /// The run's seed for any random input (printed first; replays a run).
    pub seed: u64,
    /// Where cases put the logs of processes they start (ledger-svc, crash-worker);
    /// `None` means `logs/` in the cluster folder.
    pub(crate) logs_dir: Option<PathBuf>,
}

impl Env {
    /// Sets the folder for the logs of processes that cases start; the harness points it
    /// at the run's evidence (`evidence/runs/<run>/logs/`).
    pub fn with_logs_dir(mut self, dir: PathBuf) -> Env {
        self.logs_dir = Some(dir);
        self
    }

    /// The folder for the logs of processes that cases start (created on demand); without
    /// [`Env::with_logs_dir`], `logs/` inside the cluster folder, removed with the cluster.
    pub fn logs_dir(&self) -> PathBuf {
        self.logs_dir
            .clone()
            .unwrap_or_else(|| self.cluster().dir().join("logs"))
    }

    /// The database name a case gets, e.g. `case_l3`.
    pub fn database_for(case_id: &str) -> String {
        format!("case_{}", case_id.to_ascii_lowercase())
    }

    fn cluster(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.cluster
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A tokio-postgres config for `database` on the run's cluster.
    pub fn config(&self, database: &str) -> tokio_postgres::Config {
        self.cluster().config(database)
    }

    /// A connection URL over TCP for `database` (`postgresql://postgres@127.0.0.1:PORT/db`),
    /// for child processes such as the crash-worker.
    pub fn url(&self, database: &str) -> String {
        self.cluster().url(database)
    }

    /// Connects to `database`, spawning the connection task on the current runtime.
    ///
    /// Errors: connection failures.
    pub async fn connect(&self, database: &str) -> anyhow::Result<tokio_postgres::Client> {
        connect_with(self.config(database)).await
    }
}

async fn connect_with(config: tokio_postgres::Config) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A ChaCha8 generator (portable: the same seed gives the same values on every platform
/// and version of `rand_chacha` 0.10) for the stream `label` of `seed`. Different labels
/// give independent streams, so concurrent cases and racers do not share one.
pub fn seeded_rng(seed: u64, label: &str) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ fnv1a_64(label.as_bytes()))
}

/// FNV-1a, 64 bit: a stable hash of a label (std's hasher makes no stability promise).
fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

/// Why a racer did not run its body.
enum RaceError {
    /// This racer failed (could not connect, or panicked): the cause to report.
    Cause(String),
    /// Another racer failed to connect (how many), so no one started.
    Abandoned(usize),
}

/// One participant of [`Ctx::race`]: its index, its own connection, and the barrier all
/// participants share (released when every participant has called `wait`).
pub struct Racer {
    /// 0-based index.
    pub index: usize,
    /// A connection of its own, opened before the race starts.
    pub client: tokio_postgres::Client,
    /// Shared by all participants; a naive design meets here between read and write.
    pub barrier: Arc<tokio::sync::Barrier>,
}

/// A spawned task that is aborted when this handle is dropped, so a case that fails or is
/// cancelled midway leaves no task behind (a plain `JoinHandle` detaches on drop).
/// Awaiting it (also through `&mut`) yields the task's output or its `JoinError`.
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T: Send + 'static> AbortOnDrop<T> {
    /// Spawns `future` on the current runtime.
    pub fn spawn(future: impl Future<Output = T> + Send + 'static) -> AbortOnDrop<T> {
        AbortOnDrop(tokio::spawn(future))
    }
}

impl<T> AbortOnDrop<T> {
    /// Whether the task has finished (without waiting).
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The context a case runs in.
pub struct Ctx {
    env: Arc<Env>,
    case_id: &'static str,
    database: String,
    lines: Vec<Line>,
}

impl Ctx {
    /// A context for `case_id` whose own database `database` already exists.
    pub fn new(env: Arc<Env>, case_id: &'static str, database: String) -> Ctx {
        Ctx {
            env,
            case_id,
            database,
            lines: Vec::new(),
        }
    }

    /// The case's id.
    pub fn case_id(&self) -> &'static str {
        self.case_id
    }

    /// The run's seed (printed first by the harness; `--seed N` replays a run).
    pub fn seed(&self) -> u64 {
        self.env.seed
    }

    /// A random generator for this case, seeded from the run's seed and the case id, so a
    /// run with the same `--seed` draws the same values. Each call starts the same
    /// sequence again: call it once and keep the generator. For racers, use
    /// [`seeded_rng`] with [`Ctx::seed`] and a label per racer.
    ///
    /// Print only what is deterministic for the transcript (counts, sums, balances), not
    /// the drawn values, or the snapshot would change with the seed.
    pub fn rng(&self) -> ChaCha8Rng {
        seeded_rng(self.seed(), self.case_id)
    }

    /// A log file path for a process this case starts, e.g. `log_file("ledger-svc")` →
    /// `<run>/logs/L7-ledger-svc.log` in a harness run. The folder exists on return.
    ///
    /// Errors: the folder cannot be created.
    pub fn log_file(&self, name: &str) -> std::io::Result<PathBuf> {
        let dir = self.env.logs_dir();
        std::fs::create_dir_all(&dir)?;
        Ok(dir.join(format!("{}-{name}.log", self.case_id)))
    }

    /// Name of this case's own database (a clone of the seeded template).
    pub fn database(&self) -> &str {
        &self.database
    }

    /// A connection URL of this case's database, for a child process (the crash-worker).
    pub fn database_url(&self) -> String {
        self.env.url(&self.database)
    }

    /// A new connection to this case's database.
    ///
    /// Errors: connection failures.
    pub async fn connect(&self) -> anyhow::Result<tokio_postgres::Client> {
        self.env.connect(&self.database).await
    }

    /// A new connection to another database of the run (e.g. for reconciliation).
    ///
    /// Errors: connection failures.
    pub async fn connect_to(&self, database: &str) -> anyhow::Result<tokio_postgres::Client> {
        self.env.connect(database).await
    }

    /// The databases of the run that are meant to be clean, registered so far (cases
    /// scheduled [`Schedule::Last`] see all of them), excluding this case's own.
    pub fn clean_databases(&self) -> Vec<String> {
        let mut names = self
            .env
            .clean_databases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        names.retain(|name| name != &self.database);
        names.sort();
        names
    }

    /// Races `participants` OS threads, each with its own runtime and its own connection
    /// opened beforehand; all start `body` at the same moment (a barrier), and may meet
    /// again at [`Racer::barrier`]. Returns the results in index order.
    ///
    /// Errors: a participant could not connect (then no participant runs `body`, so none
    /// waits at the barrier for one that never comes), or a participant panicked.
    pub async fn race<T, F, Fut>(&self, participants: usize, body: F) -> anyhow::Result<Vec<T>>
    where
        T: Send + 'static,
        F: Fn(Racer) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = T>,
    {
        let config = self.env.config(&self.database);
        let body = Arc::new(body);
        // A blocking barrier that needs no runtime: every thread reaches it, whatever
        // happened before, so a failure can never leave the others waiting.
        let start = Arc::new(std::sync::Barrier::new(participants));
        let unconnected = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let shared = Arc::new(tokio::sync::Barrier::new(participants));
        let mut threads = Vec::with_capacity(participants);
        for index in 0..participants {
            let (config, body, start, unconnected, shared) = (
                config.clone(),
                body.clone(),
                start.clone(),
                unconnected.clone(),
                shared.clone(),
            );
            let thread = std::thread::Builder::new()
                .name(format!("racer-{index}"))
                .spawn(move || -> Result<T, RaceError> {
                    let ready = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(anyhow::Error::from)
                        .and_then(|runtime| {
                            let client = runtime.block_on(connect_with(config))?;
                            Ok((runtime, client))
                        });
                    if ready.is_err() {
                        unconnected.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    start.wait();
                    // After the start line the count is final. If anyone is missing, no
                    // one starts: a body that waits at the shared barrier would wait for
                    // a participant that never comes.
                    let (runtime, client) = ready.map_err(|error| {
                        RaceError::Cause(format!("racer {index} could not connect: {error:#}"))
                    })?;
                    let missing = unconnected.load(std::sync::atomic::Ordering::SeqCst);
                    if missing > 0 {
                        return Err(RaceError::Abandoned(missing));
                    }
                    Ok(runtime.block_on(body(Racer {
                        index,
                        client,
                        barrier: shared,
                    })))
                })?;
            threads.push(thread);
        }
        let joined: Vec<Result<T, RaceError>> = tokio::task::spawn_blocking(move || {
            threads
                .into_iter()
                .map(|thread| {
                    thread
                        .join()
                        .unwrap_or_else(|_| Err(RaceError::Cause("a racer panicked".into())))
                })
                .collect()
        })
        .await?;
        let mut results = Vec::with_capacity(participants);
        let mut abandoned = None;
        for outcome in joined {
            match outcome {
                Ok(value) => results.push(value),
                Err(RaceError::Cause(cause)) => anyhow::bail!("race not run: {cause}"),
                Err(RaceError::Abandoned(missing)) => abandoned = Some(missing),
            }
        }
        if let Some(missing) = abandoned {
            anyhow::bail!("race not run: {missing} racer(s) could not connect");
        }
        Ok(results)
    }

    /// Restarts the cluster in immediate mode (no checkpoint; WAL recovery on start).
    /// Only for cases scheduled [`Schedule::Exclusive`].
    ///
    /// Errors: the cluster's stop or start failed.
    pub async fn restart_cluster_immediate(&self) -> anyhow::Result<()> {
        let cluster = self.env.cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .restart_immediate()
        })
        .await??;
        Ok(())
    }

    /// Adds `  note <text>`.
    pub fn note(&mut self, text: impl Into<String>) {
        self.lines.push(Line::Note { text: text.into() });
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
        }));
        passed
    }

    /// Records a condition with a short description of what was seen. Returns `passed`.
    pub fn check(&mut self, name: impl Into<String>, passed: bool, seen: impl Display) -> bool {
        let seen = seen.to_string();
        self.lines.push(Line::Check(Check {
            name: name.into(),
            passed,
            expected: None,
            actual: (!seen.is_empty()).then_some(seen),
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

    /// Takes the recorded lines (the runner does this when the case ends).
    pub fn take_lines(&mut self) -> Vec<Line> {
        std::mem::take(&mut self.lines)
    }
}

/// Finds a workspace binary that a case starts as a child process (`ledger-svc`,
/// `crash-worker`): the path in the environment variable `env_override` if set, else
/// beside the running executable (`target/release/harness` → `target/release/<name>`),
/// else one folder up (test binaries live in `target/<profile>/deps/`).
///
/// Errors: the override names no file, or neither place has the binary (build it with
/// `cargo build --bins`).
pub fn locate_binary(name: &str, env_override: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env_override) {
        let path = PathBuf::from(path);
        anyhow::ensure!(
            path.is_file(),
            "{env_override} names {}, which is not a file",
            path.display()
        );
        return Ok(path);
    }
    let exe = std::env::current_exe()?;
    let tried: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|folder| folder.join(name))
        .collect();
    tried.iter().find(|path| path.is_file()).cloned().ok_or_else(|| {
        let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        anyhow::anyhow!(
            "{name} not found (tried {}); build it with `cargo build --bins` or set {env_override}",
            tried.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use rand::RngExt;

    use super::seeded_rng;

    #[test]
    fn seeded_streams_replay_and_differ() {
        let draw = |seed, label| -> Vec<u32> {
            let mut rng = seeded_rng(seed, label);
            (0..8).map(|_| rng.random_range(0..1_000_000)).collect()
        };
        assert_eq!(draw(42, "L3"), draw(42, "L3"));
        assert_ne!(draw(42, "L3"), draw(43, "L3"));
        assert_ne!(draw(42, "L3"), draw(42, "L4"));
    }
}
