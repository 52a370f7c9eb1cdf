//! The external network of F13–F16 as spec steps: the `net-standin` process, what the
//! case has it report or refuse, the `withdrawal-executor` process run to its end, and
//! the network's own log. The processes are launched by `launch::network`.
//!
//! - `network` starts the case's stand-in (its store and log beside the run's logs):
//!   `ready`; it is killed when the case ends;
//! - `network-deposit tx=T account=A asset=BTC amount=0.3 confirmations=N [dropped=yes]`
//!   sets what the network reports of an incoming transfer: `reported`;
//! - `network-refuse [count=N]` has it refuse the next N broadcasts (422, `REJECTED`):
//!   `refusing the next N broadcast(s)`; `network-drop [count=N]` has it store the next N
//!   and close the connection without an answer (a lost answer):
//!   `dropping the answers to the next N broadcast(s)`;
//! - `executor command=run [retry-under-new-id=yes]` or `executor command=scan-deposits
//!   confirmations=N` runs `withdrawal-executor` on the case's database and network to
//!   its end (at most `network::EXECUTOR_RUN_LIMIT_MS`): `exited with status 0 | LINE |
//!   …`, its stdout lines in order; another end is an error with its stderr;
//!   `retry-under-new-id=yes` is the naive executor F14's control refutes;
//! - `executor command=run stop=HOOK` (`after-unknown`, …) returns once the executor says
//!   it is paused there: `paused: PAUSED_IN_TX point=… …`; `kill-executor` sends it a
//!   real SIGKILL: `signal=9 shell_status=137`;
//! - `network-log` prints the network's own records: `transfers=N | #1 id=… to=…
//!   0.50000000 BTC status=CONFIRMED broadcasts_received=1 | query #1 id=… answered=… |
//!   deposit tx=… …`, and keeps the transfers and queries in the case's database, as
//!   tables `network_transfer (seq, id, destination, status, broadcasts)` and
//!   `network_query (seq, id, status)` (replaced at each `network-log`), so that the
//!   file's expectations can query what went out.

use std::path::PathBuf;

use case_kit::spec::Call;
use external_net::wire::{Action, ControlRequest, DepositState, QueryRecord, TransferRecord};
use frozen_balances::Asset;
use frozen_balances::amount::{format_units, parse_amount};
use launch::worker::CrashWorker;
use tokio_postgres::Client;

use super::network::{StandIn, collect, executor_binary};

/// The case's network: where its stand-in keeps its store and log, and the stand-in
/// once `network` started it.
pub struct Network {
    database_url: String,
    log: PathBuf,
    store: PathBuf,
    standin: tokio::sync::Mutex<Option<StandIn>>,
    paused: tokio::sync::Mutex<Option<CrashWorker>>,
}

fn text(e: anyhow::Error) -> String {
    format!("{e:#}")
}

impl Network {
    /// No stand-in yet; `log` and `store` are its paths once started.
    pub fn new(database_url: String, log: PathBuf, store: PathBuf) -> Network {
        Network {
            database_url,
            log,
            store,
            standin: tokio::sync::Mutex::new(None),
            paused: tokio::sync::Mutex::new(None),
        }
    }

    /// Kills the stand-in now (its handle's drop), when the case ends or is cancelled.
    pub fn end(&self) {
        if let Ok(mut paused) = self.paused.try_lock() {
            paused.take();
        }
        if let Ok(mut standin) = self.standin.try_lock() {
            standin.take();
        }
    }

    /// Runs a network operation (see the module documentation).
    ///
    /// Errors: no stand-in yet, or it does not answer; bad arguments; the executor
    /// cannot run or ends otherwise than with status 0.
    pub async fn run(&self, client: &Client, call: &Call) -> Result<String, String> {
        if call.op == "kill-executor" {
            let mut worker = self
                .paused
                .lock()
                .await
                .take()
                .ok_or("no paused executor")?;
            let end = worker.kill().await.map_err(text)?;
            let signal = end
                .signal()
                .map_or_else(|| "none".into(), |s| s.to_string());
            return Ok(format!(
                "signal={signal} shell_status={}",
                end.shell_status()
            ));
        }
        let mut standin = self.standin.lock().await;
        if call.op == "network" {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", self.store.display()));
            }
            let started = StandIn::start_at(self.log.clone(), self.store.clone()).await;
            *standin = Some(started.map_err(text)?);
            return Ok("ready".into());
        }
        let net = standin
            .as_ref()
            .ok_or("no network yet (a `network` step first)")?;
        match call.op.as_str() {
            "network-deposit" => report_deposit(net, call).await,
            "network-refuse" | "network-drop" => {
                let count: u32 = call
                    .arg("count")
                    .unwrap_or("1")
                    .parse()
                    .map_err(|_| "count=N")?;
                let (action, shown) = match call.op.as_str() {
                    "network-refuse" => (Action::Refuse, "refusing the next"),
                    _ => (Action::Drop, "dropping the answers to the next"),
                };
                let fault = ControlRequest {
                    action,
                    delay_ms: 0,
                    count,
                };
                net.net().control(&fault).await.map_err(text)?;
                Ok(format!("{shown} {count} broadcast(s)"))
            }
            "executor" => self.executor(net, call).await,
            _ => log(net, client).await.map_err(text),
        }
    }

    /// `withdrawal-executor <command>` to its end.
    async fn executor(&self, net: &StandIn, call: &Call) -> Result<String, String> {
        let command = call.arg("command").unwrap_or_default();
        let mut args = vec![
            command.to_string(),
            "--database-url".into(),
            self.database_url.clone(),
            "--network-url".into(),
            net.url().to_owned(),
        ];
        if call.arg("retry-under-new-id") == Some("yes") {
            args.push("--retry-under-new-id".into());
        }
        if let Some(stop) = call.arg("stop") {
            args.extend(["--stop-at".to_string(), stop.to_string()]);
        }
        match (command, call.arg("confirmations")) {
            ("run", None) => {}
            ("scan-deposits", Some(n)) => {
                args.extend(["--required-confirmations".to_string(), n.to_string()])
            }
            _ => return Err("command=run, or command=scan-deposits confirmations=N".into()),
        }
        let binary = executor_binary().map_err(text)?;
        let mut worker = CrashWorker::launch_binary(&binary, args).map_err(text)?;
        if call.arg("stop").is_some() {
            let paused = worker.wait_paused().await.map_err(text)?;
            *self.paused.lock().await = Some(worker);
            return Ok(format!("paused: {}", paused.line));
        }
        let (lines, end, stderr) = collect(&mut worker).await.map_err(text)?;
        let shown = format!("{end}");
        if shown != "exited with status 0" {
            return Err(format!("{shown}: {}", stderr.trim()));
        }
        Ok(std::iter::once(shown)
            .chain(lines)
            .collect::<Vec<_>>()
            .join(" | "))
    }
}

/// `network-deposit` (see the module documentation).
async fn report_deposit(net: &StandIn, call: &Call) -> Result<String, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let asset: Asset = arg("asset").parse().map_err(|e| format!("{e}"))?;
    let deposit = DepositState {
        tx_id: arg("tx").into(),
        tenant_id: call.arg("tenant").unwrap_or("default").into(),
        account_id: arg("account").into(),
        asset: asset.as_str().into(),
        amount: parse_amount("amount", asset, arg("amount")).map_err(|e| e.to_string())?,
        confirmations: arg("confirmations")
            .parse()
            .map_err(|_| "confirmations=N")?,
        dropped: call.arg("dropped") == Some("yes"),
    };
    net.net().set_deposit(&deposit).await.map_err(text)?;
    Ok("reported".into())
}

/// The network's own records, in order: transfers, status queries, deposits; the
/// transfers and queries also written to the case's database through `client`.
async fn log(net: &StandIn, client: &Client) -> anyhow::Result<String> {
    let transfers = net.net().transfers().await?;
    let queries = net.net().queries().await?;
    keep(client, &transfers, &queries).await?;
    let mut parts = vec![format!("transfers={}", transfers.len())];
    for t in &transfers {
        let amount = t
            .asset
            .parse::<Asset>()
            .map(|asset| format_units(asset, t.amount))
            .unwrap_or_else(|_| t.amount.to_string());
        parts.push(format!(
            "#{} id={} to={} {amount} {} status={} broadcasts_received={}",
            t.seq, t.id, t.destination, t.asset, t.status, t.broadcasts
        ));
    }
    for q in &queries {
        parts.push(format!(
            "query #{} id={} answered={}",
            q.seq, q.id, q.status
        ));
    }
    for d in net.net().deposits().await? {
        parts.push(format!(
            "deposit tx={} to={} {} units {} confirmations={} dropped={}",
            d.tx_id, d.account_id, d.amount, d.asset, d.confirmations, d.dropped
        ));
    }
    Ok(parts.join(" | "))
}

/// Replaces `network_transfer` and `network_query` in the case's database with the
/// network's records.
async fn keep(
    client: &Client,
    transfers: &[TransferRecord],
    queries: &[QueryRecord],
) -> anyhow::Result<()> {
    // Created when absent, without IF NOT EXISTS, whose notice would join the transcript.
    let exists: bool = client
        .query_one("SELECT to_regclass('network_transfer') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        client
            .batch_execute(
                "CREATE TABLE network_transfer (seq bigint PRIMARY KEY, id text, \
                 destination text, status text, broadcasts bigint);
                 CREATE TABLE network_query (seq bigint PRIMARY KEY, id text, status text)",
            )
            .await?;
    }
    client
        .batch_execute("TRUNCATE network_transfer, network_query")
        .await?;
    for t in transfers {
        client
            .execute(
                "INSERT INTO network_transfer VALUES ($1, $2, $3, $4, $5)",
                &[&t.seq, &t.id, &t.destination, &t.status, &t.broadcasts],
            )
            .await?;
    }
    for q in queries {
        client
            .execute(
                "INSERT INTO network_query VALUES ($1, $2, $3)",
                &[&q.seq, &q.id, &q.status],
            )
            .await?;
    }
    Ok(())
}
