//! The external network of F13–F16 as spec steps: the `net-standin` process, what the
//! case has it report or refuse, the `withdrawal-executor` process run to its end, and
//! the network's own log. The processes are launched by `launch::network`.
//!
//! - `network` starts the case's stand-in (its store and log beside the run's logs):
//!   `ready`; it is killed when the case ends;
//! - `network-deposit tx=T account=A asset=BTC amount=0.3 confirmations=N [dropped=yes]`
//!   sets what the network reports of an incoming transfer: `reported`;
//! - `network-refuse [count=N]` has it refuse the next N broadcasts (422, `REJECTED`):
//!   `refusing the next N broadcast(s)`;
//! - `executor command=run` or `executor command=scan-deposits confirmations=N` runs
//!   `withdrawal-executor` on the case's database and network to its end (at most
//!   `network::EXECUTOR_RUN_LIMIT_MS`): `exited with status 0 | LINE | …`, its stdout
//!   lines in order; another end is an error with its stderr;
//! - `network-log` prints the network's own records: `transfers=N | #1 id=… to=…
//!   0.50000000 BTC status=CONFIRMED broadcasts_received=1 | query #1 id=… answered=… |
//!   deposit tx=… …`.

use std::path::PathBuf;

use case_kit::spec::Call;
use external_net::wire::{Action, ControlRequest, DepositState};
use frozen_balances::Asset;
use frozen_balances::amount::{format_units, parse_amount};
use launch::worker::CrashWorker;

use super::network::{StandIn, collect, executor_binary};

/// Each operation with its required arguments, then its optional ones.
const OPERATIONS: [(&str, &[&str], &[&str]); 5] = [
    ("network", &[], &[]),
    (
        "network-deposit",
        &["tx", "account", "asset", "amount", "confirmations"],
        &["dropped", "tenant"],
    ),
    ("network-refuse", &[], &["count"]),
    ("executor", &["command"], &["confirmations"]),
    ("network-log", &[], &[]),
];

/// Whether `call` is a network operation with what it needs; `None` for another op.
pub fn check(call: &Call) -> Option<Result<(), String>> {
    let (_, required, optional) = OPERATIONS.iter().find(|(op, _, _)| *op == call.op)?;
    if let Some(missing) = required.iter().find(|name| call.arg(name).is_none()) {
        return Some(Err(format!("needs {missing}=")));
    }
    let known = |name: &str| required.contains(&name) || optional.contains(&name);
    Some(match call.args.iter().find(|(name, _)| !known(name)) {
        Some((name, _)) => Err(format!("unknown argument {name:?}")),
        None => Ok(()),
    })
}

/// The case's network: where its stand-in keeps its store and log, and the stand-in
/// once `network` started it.
pub struct Network {
    database_url: String,
    log: PathBuf,
    store: PathBuf,
    standin: tokio::sync::Mutex<Option<StandIn>>,
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
        }
    }

    /// Kills the stand-in now (its handle's drop), when the case ends or is cancelled.
    pub fn end(&self) {
        if let Ok(mut standin) = self.standin.try_lock() {
            standin.take();
        }
    }

    /// Runs a network operation (see the module documentation).
    ///
    /// Errors: no stand-in yet, or it does not answer; bad arguments; the executor
    /// cannot run or ends otherwise than with status 0.
    pub async fn run(&self, call: &Call) -> Result<String, String> {
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
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        match call.op.as_str() {
            "network-deposit" => {
                let asset: Asset = arg("asset").parse().map_err(|e| format!("{e}"))?;
                let deposit = DepositState {
                    tx_id: arg("tx").into(),
                    tenant_id: call.arg("tenant").unwrap_or("default").into(),
                    account_id: arg("account").into(),
                    asset: asset.as_str().into(),
                    amount: parse_amount("amount", asset, arg("amount"))
                        .map_err(|e| e.to_string())?,
                    confirmations: arg("confirmations")
                        .parse()
                        .map_err(|_| "confirmations=N")?,
                    dropped: call.arg("dropped") == Some("yes"),
                };
                net.net().set_deposit(&deposit).await.map_err(text)?;
                Ok("reported".into())
            }
            "network-refuse" => {
                let count: u32 = call
                    .arg("count")
                    .unwrap_or("1")
                    .parse()
                    .map_err(|_| "count=N")?;
                let refuse = ControlRequest {
                    action: Action::Refuse,
                    delay_ms: 0,
                    count,
                };
                net.net().control(&refuse).await.map_err(text)?;
                Ok(format!("refusing the next {count} broadcast(s)"))
            }
            "executor" => self.executor(net, call).await,
            _ => log(net).await.map_err(text),
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
        match (command, call.arg("confirmations")) {
            ("run", None) => {}
            ("scan-deposits", Some(n)) => {
                args.extend(["--required-confirmations".to_string(), n.to_string()])
            }
            _ => return Err("command=run, or command=scan-deposits confirmations=N".into()),
        }
        let binary = executor_binary().map_err(text)?;
        let mut worker = CrashWorker::launch_binary(&binary, args).map_err(text)?;
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

/// The network's own records, in order: transfers, status queries, deposits.
async fn log(net: &StandIn) -> anyhow::Result<String> {
    let transfers = net.net().transfers().await?;
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
    for q in net.net().queries().await? {
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
