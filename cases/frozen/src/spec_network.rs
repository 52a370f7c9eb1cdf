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
//! - `executor command=run [retry-under-new-id=yes] [answer-timeout-ms=N]` or `executor command=scan-deposits
//!   confirmations=N` runs `withdrawal-executor` on the case's database and network to
//!   its end (at most `network::EXECUTOR_RUN_LIMIT_MS`): `exited with status 0 | LINE |
//!   …`, its stdout lines in order; another end is an error with its stderr;
//!   `retry-under-new-id=yes` is the naive executor F14's control refutes;
//! - `executor command=run stop=HOOK` (`after-unknown`, …) returns once the executor says
//!   it is paused there: `paused: PAUSED_IN_TX point=… …`; `kill-executor` sends it a
//!   real SIGKILL: `signal=9 shell_status=137`;
//! - `network-hold [count=N]` has it store the next N broadcasts and hold their answers
//!   until `network-release` (at most `MAX_DELAY_MS`, a hang bound only), which prints
//!   `released=N`, the answers held at that moment; an `executor` or `naive-withdraw`
//!   in flight whose answer is held is reported waiting ([`Network::waiting`]), a wait
//!   neither PostgreSQL nor the runner can see;
//! - `naive-withdraw account=A asset=X amount=D to=ADDR key=W` (F15's control) freezes in
//!   a transaction on the session's connection (`application_name` `naive-withdraw`),
//!   broadcasts W with the transaction open, then rolls back: `answer=accepted new=true
//!   rolled_back=true`;
//! - `network-log` prints the network's own records: `transfers=N | #1 id=… to=…
//!   0.50000000 BTC status=CONFIRMED broadcasts_received=1 | query #1 id=… answered=… |
//!   deposit tx=… …`, and keeps the transfers and queries in the case's database, as
//!   tables `network_transfer (seq, id, destination, status, broadcasts)` and
//!   `network_query (seq, id, status)` (replaced at each `network-log`), so that the
//!   file's expectations can query what went out.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use case_kit::spec::Call;
use external_net::client::{Answer, NetClient};
use external_net::wire::{
    Action, Broadcast, ControlRequest, DepositState, MAX_DELAY_MS, QueryRecord, TransferRecord,
};
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
    /// Steps in flight that wait for a broadcast's answer ([`Network::waiting`]).
    in_flight: AtomicUsize,
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
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Kills the stand-in now (its handle's drop), when the case ends or is cancelled.
    pub fn end(&self) {
        case_kit::drop_if_free(&self.paused);
        case_kit::drop_if_free(&self.standin);
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
            return Ok(end.words());
        }
        if call.op == "network" {
            let mut standin = self.standin.lock().await;
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", self.store.display()));
            }
            let started = StandIn::start_at(self.log.clone(), self.store.clone()).await;
            *standin = Some(started.map_err(text)?);
            return Ok("ready".into());
        }
        // The client only, not the stand-in's lock: a step in flight (an executor whose
        // answer is held) must not keep the next step from reaching the network.
        let net = self.client().await?;
        match call.op.as_str() {
            "network-deposit" => report_deposit(&net, call).await,
            "network-refuse" | "network-drop" | "network-hold" => fault(&net, call).await,
            "network-release" => {
                let holding = net.control_state().await.map_err(text)?.holding;
                net.release_held().await.map_err(text)?;
                Ok(format!("released={holding}"))
            }
            "executor" => {
                let _counted = InFlight::count(&self.in_flight, call);
                self.executor(&net, call).await
            }
            "naive-withdraw" => {
                let _counted = InFlight::count(&self.in_flight, call);
                naive_withdraw(&net, client, call).await
            }
            _ => log(&net, client).await.map_err(text),
        }
    }

    /// The running stand-in's client.
    ///
    /// Errors: no `network` step yet.
    async fn client(&self) -> Result<NetClient, String> {
        let standin = self.standin.lock().await;
        let net = standin
            .as_ref()
            .ok_or("no network yet (a `network` step first)")?;
        Ok(net.net().clone())
    }

    /// Whether a step running `call` waits for the network: an `executor` or
    /// `naive-withdraw` in flight, every one of which is accounted for by an answer the
    /// stand-in holds now (`GET /control`, `holding`). So a step is reported waiting
    /// only once its broadcast is seen held, not while it is still on its way. Any other
    /// call: no.
    pub async fn waiting(&self, call: &Call) -> bool {
        if !waits_for_answers(call) {
            return false;
        }
        let in_flight = self.in_flight.load(Ordering::SeqCst) as u32;
        let Ok(net) = self.client().await else {
            return false;
        };
        match net.control_state().await {
            Ok(state) => in_flight > 0 && state.holding >= in_flight,
            Err(_) => false,
        }
    }

    /// `withdrawal-executor <command>` to its end.
    async fn executor(&self, net: &NetClient, call: &Call) -> Result<String, String> {
        let command = call.arg("command").unwrap_or_default();
        let mut args = vec![
            command.to_string(),
            "--database-url".into(),
            self.database_url.clone(),
            "--network-url".into(),
            net.base().to_owned(),
        ];
        if call.arg("retry-under-new-id") == Some("yes") {
            args.push("--retry-under-new-id".into());
        }
        if let Some(ms) = call.arg("answer-timeout-ms") {
            args.extend(["--answer-timeout-ms".to_string(), ms.to_string()]);
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

/// Whether `call` is a step that waits for a broadcast's answer while in flight: an
/// `executor` run to its end, or a `naive-withdraw`.
fn waits_for_answers(call: &Call) -> bool {
    match call.op.as_str() {
        "executor" => call.arg("stop").is_none(),
        "naive-withdraw" => true,
        _ => false,
    }
}

/// One step counted in [`Network::waiting`]'s in-flight steps while it lives.
struct InFlight<'a>(Option<&'a AtomicUsize>);

impl<'a> InFlight<'a> {
    /// Counts `call` in `counter` if it waits for answers ([`waits_for_answers`]).
    fn count(counter: &'a AtomicUsize, call: &Call) -> InFlight<'a> {
        if !waits_for_answers(call) {
            return InFlight(None);
        }
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight(Some(counter))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(counter) = self.0 {
            counter.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// `network-refuse`, `network-drop` and `network-hold` (see the module documentation).
async fn fault(net: &NetClient, call: &Call) -> Result<String, String> {
    let count: u32 = call
        .arg("count")
        .unwrap_or("1")
        .parse()
        .map_err(|_| "count=N")?;
    let (action, delay_ms, shown) = match call.op.as_str() {
        "network-refuse" => (Action::Refuse, 0, "refusing the next"),
        "network-drop" => (Action::Drop, 0, "dropping the answers to the next"),
        _ => (
            Action::Delay,
            MAX_DELAY_MS,
            "holding the answers to the next",
        ),
    };
    let fault = ControlRequest {
        action,
        delay_ms,
        count,
    };
    net.control(&fault).await.map_err(text)?;
    let until = if action == Action::Delay {
        " until released"
    } else {
        ""
    };
    Ok(format!("{shown} {count} broadcast(s){until}"))
}

/// The naive withdrawal's freeze: the product's conditional update, inside a
/// transaction that then calls the network before it ends.
const NAIVE_FREEZE_SQL: &str = "\
UPDATE balance SET available = available - $4, frozen = frozen + $4, version = version + 1
WHERE tenant_id = $1 AND account_id = $2 AND asset = $3 AND available >= $4";

/// How long `naive-withdraw` waits for the network's answer, milliseconds: longer than
/// any hold ([`MAX_DELAY_MS`]), so a held answer is received, never timed out.
pub const NAIVE_ANSWER_TIMEOUT_MS: u64 = MAX_DELAY_MS + 10_000;

/// `naive-withdraw` (see the module documentation): the freeze, the broadcast with the
/// transaction open, then a rollback.
async fn naive_withdraw(net: &NetClient, client: &Client, call: &Call) -> Result<String, String> {
    let arg = |name: &str| call.arg(name).unwrap_or_default();
    let asset: Asset = arg("asset").parse().map_err(|e| format!("{e}"))?;
    let amount = parse_amount("amount", asset, arg("amount")).map_err(|e| e.to_string())?;
    let tenant = call.arg("tenant").unwrap_or("default");
    client
        .batch_execute("BEGIN; SET LOCAL application_name = 'naive-withdraw'")
        .await
        .map_err(|e| e.to_string())?;
    let frozen = client
        .execute(
            NAIVE_FREEZE_SQL,
            &[&tenant, &arg("account"), &asset.as_str(), &amount],
        )
        .await;
    let answer = match frozen {
        Ok(_) => {
            let broadcast = Broadcast {
                id: arg("key").into(),
                destination: arg("to").into(),
                asset: asset.as_str().into(),
                amount,
            };
            let limit = Duration::from_millis(NAIVE_ANSWER_TIMEOUT_MS);
            Ok(net.broadcast(&broadcast, limit).await)
        }
        Err(error) => Err(error.to_string()),
    };
    client
        .batch_execute("ROLLBACK")
        .await
        .map_err(|e| e.to_string())?;
    let shown = match answer? {
        Answer::Accepted { new } => format!("answer=accepted new={new}"),
        Answer::Refused => "answer=refused".into(),
        Answer::Lost(why) => format!("answer=lost ({why})"),
    };
    Ok(format!("{shown} rolled_back=true"))
}

/// `network-deposit` (see the module documentation).
async fn report_deposit(net: &NetClient, call: &Call) -> Result<String, String> {
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
    net.set_deposit(&deposit).await.map_err(text)?;
    Ok("reported".into())
}

/// The network's own records, in order: transfers, status queries, deposits; the
/// transfers and queries also written to the case's database through `client`.
async fn log(net: &NetClient, client: &Client) -> anyhow::Result<String> {
    let transfers = net.transfers().await?;
    let queries = net.queries().await?;
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
    for d in net.deposits().await? {
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
