//! The parent's side of the crash-worker (the `crash-worker` binary of this workspace):
//! launch it as a child process with the arguments of the work it is to do (a family
//! builds them), wait until it stops inside its transaction, kill it with a real
//! SIGKILL, and tell how it ended.
//!
//! The child is spawned with [`scratch_pg::process::spawn_tied`] (parent-death signal
//! SIGKILL), so it dies with the harness even when the harness is killed; dropping a
//! [`CrashWorker`] that has not ended kills and reaps it, so a case that fails or is
//! cancelled midway leaves no worker behind.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::mpsc;

/// First word of the line the worker prints when it stops: `PAUSED_IN_TX backend_pid=<pid>`.
/// Must match `PAUSED_MARKER` in `crash-worker/src/main.rs`.
pub const PAUSED_MARKER: &str = "PAUSED_IN_TX";
/// The worker's exit status when it paused for its whole pause limit without being killed.
/// Must match `EXIT_PAUSE_LIMIT` in `crash-worker/src/main.rs` (a test checks it does).
pub const EXIT_PAUSE_LIMIT: i32 = 3;
/// How long the parent waits for the worker's [`PAUSED_MARKER`] line.
pub const PAUSED_WAIT_MS: u64 = 30_000;
/// How long the parent waits for the worker to end, after SIGKILL.
pub const EXIT_WAIT_MS: u64 = 10_000;
/// Environment variable that names the worker binary explicitly.
pub const BINARY_ENV: &str = "LEDGER_CRASH_WORKER_BIN";
/// File name of the worker binary, looked for next to the running executable.
pub const BINARY_NAME: &str = "crash-worker";

/// How long [`CrashWorker::stderr`] waits for the end of the stderr pipe once the worker
/// has been reaped.
pub const STDERR_EOF_WAIT_MS: u64 = 2_000;

/// How often an exit is polled for, in milliseconds.
const EXIT_POLL_MS: u64 = 5;

/// The worker reached its stop point: the fields of its line
/// `PAUSED_IN_TX key=value …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paused {
    /// The whole line.
    pub line: String,
    /// Its `key=value` words.
    pub fields: BTreeMap<String, String>,
}

impl Paused {
    fn parse(line: &str) -> Paused {
        let fields = line
            .split_whitespace()
            .skip(1)
            .filter_map(|word| word.split_once('='))
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        Paused {
            line: line.to_string(),
            fields,
        }
    }

    /// pid of the PostgreSQL backend serving the worker's connection (its transaction is
    /// open there, unless the stop point is after the commit): the `backend_pid=` field.
    ///
    /// Errors: the line has no such field, or it is not a number.
    pub fn backend_pid(&self) -> anyhow::Result<i32> {
        self.fields
            .get("backend_pid")
            .and_then(|pid| pid.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no backend_pid in the worker's line {:?}", self.line))
    }
}

/// How a worker process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerEnd {
    /// It exited on its own with this status.
    Exited(i32),
    /// A signal ended it (9 for SIGKILL).
    Signalled(i32),
}

impl WorkerEnd {
    fn from_status(status: ExitStatus) -> WorkerEnd {
        match (status.code(), status.signal()) {
            (Some(code), _) => WorkerEnd::Exited(code),
            (None, Some(signal)) => WorkerEnd::Signalled(signal),
            // Neither code nor signal: stopped/continued states are not reported by wait.
            (None, None) => WorkerEnd::Exited(-1),
        }
    }

    /// The status a POSIX shell reports: the exit code, or 128 + the signal number
    /// (137 after SIGKILL).
    pub fn shell_status(self) -> i32 {
        match self {
            WorkerEnd::Exited(code) => code,
            WorkerEnd::Signalled(signal) => 128 + signal,
        }
    }

    /// The signal that ended the process, if one did.
    pub fn signal(self) -> Option<i32> {
        match self {
            WorkerEnd::Signalled(signal) => Some(signal),
            WorkerEnd::Exited(_) => None,
        }
    }

    /// How it ended as a step prints it: `signal=9 shell_status=137` (`signal=none`
    /// when it exited on its own).
    pub fn words(self) -> String {
        let signal = self
            .signal()
            .map_or_else(|| "none".into(), |s| s.to_string());
        format!("signal={signal} shell_status={}", self.shell_status())
    }
}

impl std::fmt::Display for WorkerEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerEnd::Exited(code) => write!(f, "exited with status {code}"),
            WorkerEnd::Signalled(signal) => write!(
                f,
                "ended by signal {signal} (shell status {})",
                self.shell_status()
            ),
        }
    }
}

/// A running (or ended) crash-worker child process.
pub struct CrashWorker {
    child: Child,
    ended: Option<WorkerEnd>,
    lines: mpsc::UnboundedReceiver<String>,
    stderr: Arc<StderrCapture>,
}

/// The worker's stderr as read so far by the reader thread, and whether the pipe reached
/// end-of-file (the worker and every holder of the pipe have closed it).
#[derive(Default)]
struct StderrCapture {
    state: Mutex<(String, bool)>,
    closed: Condvar,
}

impl StderrCapture {
    fn push(&self, bytes: &[u8]) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0.push_str(&String::from_utf8_lossy(bytes));
    }

    fn close(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.closed.notify_all();
    }

    /// The text read so far; with `wait_for_eof`, first waits up to `limit` for the end
    /// of the pipe, so that nothing the worker wrote before exiting is missed.
    fn text(&self, wait_for_eof: Option<Duration>) -> String {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = match wait_for_eof {
            Some(limit) => {
                self.closed
                    .wait_timeout_while(state, limit, |state| !state.1)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
            None => state,
        };
        state.0.clone()
    }
}

impl std::fmt::Debug for CrashWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrashWorker")
            .field("pid", &self.child.id())
            .field("ended", &self.ended)
            .finish()
    }
}

impl CrashWorker {
    /// Finds the worker binary: the path in [`BINARY_ENV`] if set; otherwise
    /// [`BINARY_NAME`] next to the running executable, or one folder up (test binaries
    /// live in `target/<profile>/deps`, the worker in `target/<profile>`).
    ///
    /// Errors: no such file (build it with `cargo build --bins`).
    pub fn locate() -> anyhow::Result<PathBuf> {
        case_kit::process::locate_binary(BINARY_NAME, BINARY_ENV)
    }

    /// Launches the worker found by [`CrashWorker::locate`] with `args`.
    ///
    /// Errors: see [`CrashWorker::locate`] and [`CrashWorker::launch_binary`].
    pub fn launch<I, S>(args: I) -> anyhow::Result<CrashWorker>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        CrashWorker::launch_binary(&CrashWorker::locate()?, args)
    }

    /// Launches `binary` with `args` as a child tied to this process (it receives
    /// SIGKILL when we die), with stdout and stderr captured and stdin closed.
    ///
    /// Errors: the process could not be started.
    pub fn launch_binary<I, S>(binary: &Path, args: I) -> anyhow::Result<CrashWorker>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(binary);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = scratch_pg::process::spawn_tied(command, None, nix::libc::SIGKILL)
            .with_context(|| format!("starting {}", binary.display()))?;

        let (sender, lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().expect("stdout is piped");
        std::thread::Builder::new()
            .name("crash-worker-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            })
            .context("starting the stdout reader")?;
        let stderr = Arc::new(StderrCapture::default());
        let mut pipe = child.stderr.take().expect("stderr is piped");
        let sink = stderr.clone();
        std::thread::Builder::new()
            .name("crash-worker-stderr".into())
            .spawn(move || {
                let mut buffer = [0u8; 1024];
                while let Ok(read) = pipe.read(&mut buffer) {
                    if read == 0 {
                        break;
                    }
                    sink.push(&buffer[..read]);
                }
                sink.close();
            })
            .context("starting the stderr reader")?;
        Ok(CrashWorker {
            child,
            ended: None,
            lines,
            stderr,
        })
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the worker wrote to stderr (its error messages): so far while it runs; all
    /// of it once it has been reaped (then this waits up to [`STDERR_EOF_WAIT_MS`] for
    /// the reader thread to drain the pipe, since the exit can be seen before the last
    /// bytes are read).
    pub fn stderr(&self) -> String {
        let wait_for_eof = self
            .ended
            .map(|_| Duration::from_millis(STDERR_EOF_WAIT_MS));
        self.stderr.text(wait_for_eof)
    }

    /// Waits up to [`PAUSED_WAIT_MS`] for the `PAUSED_IN_TX …` line. Other lines are
    /// skipped.
    ///
    /// Errors: the worker ended first (its status and stderr are in the message), the
    /// line is malformed, or the wait timed out.
    pub async fn wait_paused(&mut self) -> anyhow::Result<Paused> {
        let wait = Duration::from_millis(PAUSED_WAIT_MS);
        let line = tokio::time::timeout(wait, async {
            while let Some(line) = self.lines.recv().await {
                if line.split_whitespace().next() == Some(PAUSED_MARKER) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match line {
            Ok(Some(line)) => Ok(Paused::parse(&line)),
            Ok(None) => {
                let end = self.wait(Duration::from_millis(EXIT_WAIT_MS)).await?;
                anyhow::bail!(
                    "the worker {end} before reaching its stop point; stderr: {}",
                    self.stderr().trim()
                )
            }
            Err(_) => anyhow::bail!(
                "the worker did not report {PAUSED_MARKER} within wait_ms={PAUSED_WAIT_MS}; stderr: {}",
                self.stderr().trim()
            ),
        }
    }

    /// The next line the worker prints on stdout, waiting up to `limit`; `None` when
    /// stdout closed (the worker ended) first.
    ///
    /// Errors: no line within `limit`.
    pub async fn next_line(&mut self, limit: Duration) -> anyhow::Result<Option<String>> {
        tokio::time::timeout(limit, self.lines.recv())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "no line from the worker within wait_ms={}",
                    limit.as_millis()
                )
            })
    }

    /// Sends SIGKILL (unless the worker has already been reaped) and waits up to
    /// [`EXIT_WAIT_MS`] for it to end.
    ///
    /// Errors: the signal could not be sent, or the process did not end in time.
    pub async fn kill(&mut self) -> anyhow::Result<WorkerEnd> {
        if self.poll_end()?.is_none() {
            // The child is not reaped yet, so its pid cannot have been reused.
            kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL)
                .context("sending SIGKILL to the worker")?;
        }
        self.wait(Duration::from_millis(EXIT_WAIT_MS)).await
    }

    /// Waits up to `limit` for the worker to end on its own, and reaps it.
    ///
    /// Errors: it is still running after `limit`, or waiting failed.
    pub async fn wait(&mut self, limit: Duration) -> anyhow::Result<WorkerEnd> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(end) = self.poll_end()? {
                return Ok(end);
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "the worker was still running after wait_ms={}",
                    limit.as_millis()
                );
            }
            tokio::time::sleep(Duration::from_millis(EXIT_POLL_MS)).await;
        }
    }

    /// How the worker ended, if it has (reaping it); `None` while it runs.
    ///
    /// Errors: `waitpid` failed.
    pub fn poll_end(&mut self) -> anyhow::Result<Option<WorkerEnd>> {
        if self.ended.is_none()
            && let Some(status) = self.child.try_wait().context("waiting for the worker")?
        {
            self.ended = Some(WorkerEnd::from_status(status));
        }
        Ok(self.ended)
    }
}

impl Drop for CrashWorker {
    /// Kills and reaps a worker that has not ended, so none outlives its case.
    fn drop(&mut self) {
        if matches!(self.poll_end(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The crash-workers one case keeps paused (last launched, first killed), and the
/// backends of those it launched, for the case's database: what a family's `worker` and `kill-worker` steps
/// share. Dropping it kills and reaps every worker it still keeps.
#[derive(Debug)]
pub struct PausedWorkers {
    /// The case's database, for the workers ([`PausedWorkers::database_url`]).
    database_url: String,
    /// Each paused worker and its backend (`None`: kept by [`PausedWorkers::keep`]).
    paused: tokio::sync::Mutex<Vec<(CrashWorker, Option<i32>)>>,
    backends: std::sync::Mutex<Vec<i32>>,
}

impl PausedWorkers {
    /// No worker yet, for the case's database at `database_url`.
    pub fn new(database_url: String) -> PausedWorkers {
        PausedWorkers {
            database_url,
            paused: tokio::sync::Mutex::default(),
            backends: std::sync::Mutex::default(),
        }
    }

    /// The case's database, which the workers' arguments name.
    pub fn database_url(&self) -> &str {
        &self.database_url
    }

    /// Launches `crash-worker` with `args` ([`CrashWorker::launch`]), waits until it
    /// says it is paused, and keeps it and its backend (one of the case's sessions from
    /// then on, [`PausedWorkers::backends`]). Returns its paused line.
    ///
    /// Errors: it cannot be launched, does not pause, or names no backend.
    pub async fn launch<I, S>(&self, args: I) -> anyhow::Result<Paused>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut worker = CrashWorker::launch(args)?;
        let paused = worker.wait_paused().await?;
        let backend = paused.backend_pid()?;
        self.backends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(backend);
        self.paused.lock().await.push((worker, Some(backend)));
        Ok(paused)
    }

    /// Keeps a worker launched and seen paused elsewhere, for the next
    /// [`PausedWorkers::kill_last`] and for the case's end; its backend is not counted.
    pub async fn keep(&self, worker: CrashWorker) {
        self.paused.lock().await.push((worker, None));
    }

    /// Sends the last paused worker a real SIGKILL ([`CrashWorker::kill`]): how it
    /// ended, and its backend when [`PausedWorkers::launch`] started it.
    ///
    /// Errors: `no paused worker`; the kill fails.
    pub async fn kill_last(&self) -> anyhow::Result<(WorkerEnd, Option<i32>)> {
        let last = self.paused.lock().await.pop();
        let Some((mut worker, backend)) = last else {
            anyhow::bail!("no paused worker");
        };
        Ok((worker.kill().await?, backend))
    }

    /// Kills and reaps every paused worker now (their handles' drop), when the case
    /// ends or is cancelled; a worker another task is still launching is left to that
    /// task's own drop.
    pub fn end(&self) {
        case_kit::drop_if_free(&self.paused);
    }

    /// The backends of the workers launched so far.
    pub fn backends(&self) -> Vec<i32> {
        self.backends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
