//! The external network of F13–F16 as processes of a case: the `net-standin` process
//! (its own durable store, started per case as a child tied to the harness, killed on
//! drop) and the `withdrawal-executor` process.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use case_kit::Ctx;
use external_net::client::NetClient;

use crate::worker::CrashWorker;

/// Environment variable naming the `net-standin` binary.
pub const STANDIN_BIN_ENV: &str = "LEDGER_NET_STANDIN_BIN";

/// Environment variable naming the `withdrawal-executor` binary.
pub const EXECUTOR_BIN_ENV: &str = "LEDGER_WITHDRAWAL_EXECUTOR_BIN";

/// Longest wait for the stand-in's address line, milliseconds.
pub const STANDIN_START_TIMEOUT_MS: u64 = 10_000;

/// Interval of the polls of the stand-in's control state, milliseconds.
pub const POLL_MS: u64 = 5;

/// A running `net-standin`.
pub struct StandIn {
    child: Child,
    client: NetClient,
}

impl StandIn {
    /// Starts the stand-in with a fresh store `<run>/logs/<case>-net-standin.sqlite`
    /// (kept with the run's logs as evidence), its stderr in
    /// `<case>-net-standin.log`, and waits for its address line.
    ///
    /// Errors: binary missing, spawn failure, no address line in time.
    pub async fn start(ctx: &Ctx) -> anyhow::Result<StandIn> {
        let log = ctx.log_file("net-standin")?;
        let store: PathBuf = log.with_file_name(format!("{}-net-standin.sqlite", ctx.case_id()));
        StandIn::start_at(log, store).await
    }

    /// [`StandIn::start`] with its stderr in `log` and a fresh store at `store` (the
    /// paths `start` derives from a case's context; a spec operation, which has no
    /// context when it runs, takes them earlier).
    ///
    /// Errors: binary missing, spawn failure, no address line in time.
    pub async fn start_at(log: PathBuf, store: PathBuf) -> anyhow::Result<StandIn> {
        let binary = case_kit::process::locate_binary("net-standin", STANDIN_BIN_ENV)?;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", store.display()));
        }
        let mut command = Command::new(&binary);
        command
            .arg("--store")
            .arg(&store)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?);
        let mut child = scratch_pg::process::spawn_tied(command, None, nix::libc::SIGKILL)
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("net-standin-stdout".into())
            .spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = sender.send(line);
            })?;
        let wait = Duration::from_millis(STANDIN_START_TIMEOUT_MS);
        let line = match tokio::time::timeout(wait, receiver).await {
            Ok(Ok(line)) => line,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "net-standin printed no address line (log: {})",
                    log.display()
                );
            }
        };
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .ok_or_else(|| anyhow!("unexpected first line from net-standin: {line:?}"))?;
        let client = NetClient::new(format!("http://{address}"))?;
        Ok(StandIn { child, client })
    }

    /// Its client.
    pub fn net(&self) -> &NetClient {
        &self.client
    }

    /// Its base URL, for the executor's `--network-url`.
    pub fn url(&self) -> &str {
        self.client.base()
    }

    /// Waits until the stand-in holds `holding` delayed answers (at most `limit`).
    ///
    /// Errors: not reached in time; the stand-in did not answer.
    pub async fn wait_holding(&self, holding: u32, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if self.client.control_state().await?.holding == holding {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the stand-in never held {holding} answers within wait_ms={}",
                    limit.as_millis()
                );
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `withdrawal-executor` binary.
///
/// Errors: not found (build it with `cargo build --bins`).
pub fn executor_binary() -> anyhow::Result<PathBuf> {
    case_kit::process::locate_binary("withdrawal-executor", EXECUTOR_BIN_ENV)
}

/// Launches `withdrawal-executor run` on the case's database and the stand-in, with
/// `extra` arguments, as a child tied to the harness (the crash-worker's handle: a
/// SIGKILL, its end, its lines).
///
/// Errors: binary missing, spawn failure.
pub fn launch_executor(ctx: &Ctx, net: &StandIn, extra: &[&str]) -> anyhow::Result<CrashWorker> {
    let mut args = vec![
        "run".to_owned(),
        "--database-url".into(),
        ctx.database_url()?,
        "--network-url".into(),
        net.url().to_owned(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    CrashWorker::launch_binary(&executor_binary()?, args)
}
