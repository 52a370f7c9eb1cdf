//! The external network of F13–F16: the `net-standin` process (its own durable store,
//! started per case as a child tied to the harness, killed on drop), the
//! `withdrawal-executor` process, and the figures a case prints from both — the
//! network's own log of transfers by id is part of every transcript.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use case_kit::Ctx;
use external_net::client::NetClient;
use frozen_balances::amount::format_units;
use frozen_balances::{Asset, NoHooks};
use launch::worker::{CrashWorker, WorkerEnd};

/// Environment variable naming the `net-standin` binary.
pub const STANDIN_BIN_ENV: &str = "LEDGER_NET_STANDIN_BIN";
/// Environment variable naming the `withdrawal-executor` binary.
pub const EXECUTOR_BIN_ENV: &str = "LEDGER_WITHDRAWAL_EXECUTOR_BIN";
/// Longest wait for the stand-in's address line, milliseconds.
pub const STANDIN_START_TIMEOUT_MS: u64 = 10_000;
/// Longest run of one executor process that is not meant to stop, milliseconds.
pub const EXECUTOR_RUN_LIMIT_MS: u64 = 20_000;
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
        let binary = case_kit::process::locate_binary("net-standin", STANDIN_BIN_ENV)?;
        let log = ctx.log_file("net-standin")?;
        let store: PathBuf = log.with_file_name(format!("{}-net-standin.sqlite", ctx.case_id()));
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
        let mut child = scratch_pg::process::spawn_tied(command, None, libc::SIGKILL)
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

    /// Notes the network's own log: one line per transfer, then one per status query.
    /// Returns the transfers.
    ///
    /// Errors: the stand-in did not answer.
    pub async fn note_log(
        &self,
        ctx: &mut Ctx,
    ) -> anyhow::Result<Vec<external_net::wire::TransferRecord>> {
        let transfers = self.client.transfers().await?;
        ctx.note(format!("network log: {} transfer(s)", transfers.len()));
        for t in &transfers {
            let amount = t
                .asset
                .parse::<Asset>()
                .map(|asset| format_units(asset, t.amount))
                .unwrap_or_else(|_| t.amount.to_string());
            ctx.note(format!(
                "network transfer #{} id={} to={} {} {} status={} broadcasts_received={}",
                t.seq, t.id, t.destination, amount, t.asset, t.status, t.broadcasts
            ));
        }
        for q in self.client.queries().await? {
            ctx.note(format!(
                "network status query #{} id={} answered={}",
                q.seq, q.id, q.status
            ));
        }
        Ok(transfers)
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

/// Runs `withdrawal-executor <subcommand>` to its end: its stdout lines and how it ended.
///
/// Errors: spawn failure, or it ran past [`EXECUTOR_RUN_LIMIT_MS`] (then it is killed).
pub async fn run_executor_command(
    ctx: &Ctx,
    net: &StandIn,
    subcommand: &str,
    extra: &[&str],
) -> anyhow::Result<(Vec<String>, WorkerEnd, String)> {
    let mut args = vec![
        subcommand.to_owned(),
        "--database-url".into(),
        ctx.database_url()?,
        "--network-url".into(),
        net.url().to_owned(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut worker = CrashWorker::launch_binary(&executor_binary()?, args)?;
    collect(&mut worker).await
}

/// Runs `withdrawal-executor <subcommand>` to its end ([`run_executor_command`]), notes
/// each stdout line as `<label>: <line>` and checks `<label> exited with status 0`.
/// Returns the lines.
///
/// Errors: as [`run_executor_command`].
pub async fn run_executor_checked(
    ctx: &mut Ctx,
    net: &StandIn,
    label: &str,
    subcommand: &str,
    extra: &[&str],
) -> anyhow::Result<Vec<String>> {
    let (lines, end, stderr) = run_executor_command(ctx, net, subcommand, extra).await?;
    note_lines(ctx, label, &lines);
    ctx.check_eq(
        format!("{label} exited with status 0"),
        "exited with status 0".to_string(),
        format!("{end}{stderr}"),
    );
    Ok(lines)
}

/// Reads every stdout line of `worker` until it closes, then its end and stderr.
///
/// Errors: it ran past [`EXECUTOR_RUN_LIMIT_MS`] (then it is killed).
pub async fn collect(worker: &mut CrashWorker) -> anyhow::Result<(Vec<String>, WorkerEnd, String)> {
    let deadline = Instant::now() + Duration::from_millis(EXECUTOR_RUN_LIMIT_MS);
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match worker.next_line(left).await {
            Ok(Some(line)) => lines.push(line),
            Ok(None) => break,
            Err(error) => {
                let _ = worker.kill().await;
                return Err(error.context("the executor ran too long"));
            }
        }
    }
    let end = worker
        .wait(Duration::from_millis(EXECUTOR_RUN_LIMIT_MS))
        .await?;
    Ok((lines, end, worker.stderr()))
}

/// Notes each executor line as `executor: <line>`.
pub fn note_lines(ctx: &mut Ctx, label: &str, lines: &[String]) {
    for line in lines {
        ctx.note(format!("{label}: {line}"));
    }
}

/// The withdrawal's statuses in order, `REQUESTED BROADCAST CONFIRMED`.
///
/// Errors: database errors.
pub async fn states(
    db: &tokio_postgres::Client,
    tenant: &str,
    withdrawal: &str,
) -> anyhow::Result<String> {
    let history = frozen_balances::withdraw::history(db, tenant, withdrawal).await?;
    Ok(history
        .iter()
        .map(|(status, _)| status.as_str())
        .collect::<Vec<_>>()
        .join(" "))
}

/// Requests a withdrawal through the library.
///
/// Errors: the library's.
pub async fn withdraw(
    db: &mut tokio_postgres::Client,
    tenant: &str,
    withdrawal: &str,
    account: &str,
    asset: Asset,
    amount: i64,
    destination: &str,
) -> anyhow::Result<frozen_balances::withdraw::WithdrawResult> {
    let request = frozen_balances::withdraw::WithdrawRequest {
        tenant_id: tenant.to_owned(),
        withdrawal_id: withdrawal.to_owned(),
        account_id: account.to_owned(),
        asset,
        amount,
        destination: destination.to_owned(),
    };
    Ok(frozen_balances::withdraw::request(db, &request, &NoHooks).await?)
}

/// Deposits through the library.
///
/// Errors: the library's.
pub async fn deposit(
    db: &mut tokio_postgres::Client,
    tenant: &str,
    business_id: &str,
    account: &str,
    asset: Asset,
    amount: i64,
) -> anyhow::Result<()> {
    frozen_balances::deposit(
        db,
        &frozen_balances::DepositRequest {
            tenant_id: tenant.to_owned(),
            business_id: business_id.to_owned(),
            account_id: account.to_owned(),
            asset,
            amount,
        },
        &NoHooks,
    )
    .await?;
    Ok(())
}

/// Runs the reconciliation and records the check `<label>: no findings`.
///
/// Errors: database errors.
pub async fn check_reconciles(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    label: &str,
) -> anyhow::Result<bool> {
    let findings = frozen_balances::reconcile(db).await?;
    let clean = findings.is_clean();
    let seen = if clean {
        findings.summary()
    } else {
        findings.lines().join("; ")
    };
    Ok(ctx.check(format!("{label}: no findings"), clean, seen))
}
