//! The R family's case files (`cases/topology/specs/rNN_<what>.spec`, the case `RNN`):
//! a primary and its standby of the case's own ([`crate::pair`]; asynchronous, until a
//! `new-pair` step replaces it) as the spec runner's engine
//! ([`case_kit::spec::SpecEngine`]), sessions on either node, the standby's replay as
//! calls, and services and groups of debits on the pair ([`crate::spec_groups`]).
//!
//! The pair starts when the case's first connection opens (the setup's) and stops
//! (immediate shutdown, folders removed) when the expectations' connection, the last
//! one, ends; a case that ends before its expectations leaves it to the run's cluster
//! cleanup (`scratch_pg::cleanup_all_clusters`, the janitor after a kill -9). A session
//! starts on the primary's ledger database. The calls (`docs/specs.md`, "A standby in
//! one file"):
//!
//! | call | prints |
//! |---|---|
//! | `on node=primary\|standby` | moves the session to that node: `on standby` |
//! | `grant`/`debit account=A amount=N key=K client=C` | the ledger's transfer on the session's node, in the run's transfer mode: `outcome=OK balance=20` |
//! | `wait-replayed` | waits until the standby has replayed up to the primary's flush position (`pg_last_wal_replay_lsn()`, a hang bound only): `replayed up to the primary's flush position` |
//! | `pause-replay` | `pg_wal_replay_pause()` on the standby: `pause requested` |
//! | `wait-paused` | waits until `pg_get_wal_replay_pause_state()` says `paused` (the startup process pauses before the next record it would apply): `replay paused` |
//! | `naive-place account=A amount=N` | the naive placement: the balance read on the standby decides, then an unconditional `UPDATE` on the primary: `read=100 placed=true` |
//! | `stop-receiver` | SIGSTOP to the standby's WAL receiver (`pg_stat_wal_receiver`'s pid): `WAL receiver stopped (SIGSTOP)` |
//! | `received-all` | whether the standby's `pg_last_wal_receive_lsn()` reached the primary's flush position: `received_all=false` |
//! | `kill node=primary\|standby` | kill -9 of that node's postmaster and every process it started: `killed primary (kill -9)` |
//! | `start node=standby\|primary` | a killed node started again on its port (crash recovery): `started standby again` |
//! | `promote` | `pg_ctl promote` of the standby, waited for: `promoted`; from then on the standby is the primary (`on node=standby`, and the expectations run there) |
//! | `reconcile` | the ledger's reconciliation on the session's node: its summary (`balance_mismatches=0 … global_sum=0`) |
//! | `new-pair replication=synchronous\|asynchronous` | the pair, its services, groups and book ended, a new pair started, the session on its primary: `synchronous standby streaming` |
//! | `pair-service`, `send-group`, `syncrep-waits`, `answers`, `committed`, `wait-held`, `sigkill-service`, `retry`, `book`, `grant-group`, `arm-fault` | the clients on the pair ([`crate::spec_groups`], `crate::verbs::GROUPS`) |

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use points_ledger::{TransferMode, debit_in, grant_in};
use scratch_pg::{Cluster, Replication};
use tokio_postgres::{Client, SimpleQueryMessage};

use case_kit::spec::{self, Call, EngineSession, Reconciled, SessionFuture, SpecEngine};
use case_kit::{Ctx, PerCase};
use cases_ledger::spec_workers::DEFAULT_CLIENT;

use crate::pair::{self, LEDGER_DATABASE};
use crate::spec_groups::{Groups, Reach};

/// What every file's `system:` says: the ledger on a primary and its standby.
pub const SYSTEM: &str = "ledger_pair";
/// Longest wait for the standby to report its replay paused, milliseconds (a hang
/// bound only).
const PAUSE_WAIT_MS: u64 = 30_000;

case_kit::spec_files!(
    "R",
    "cases/topology/specs",
    [Arc::new(PairEngine::default())]
);

/// A primary and its standby per case.
#[derive(Default)]
pub struct PairEngine {
    /// Each running case's pair, from its first connection to its expectations.
    pairs: PerCase<Arc<Nodes>>,
}

/// The case's two nodes. A killed node stays here (stopped) until it starts again or the
/// case ends; dropping a node stops it and removes its folder.
pub struct Nodes {
    state: tokio::sync::Mutex<NodesState>,
    /// The clients on the pair ([`crate::spec_groups`]): services, groups, the book.
    groups: tokio::sync::Mutex<Groups>,
    place: Place,
}

/// Where the case's pairs and service logs go, taken from the case's context when its
/// first connection opens (a `new-pair` step has none).
struct Place {
    pg_bin: PathBuf,
    /// The run's folder for the case's own folders (`<run>/files`).
    files: PathBuf,
    /// The run's log folder.
    logs: PathBuf,
    case_id: String,
    /// Pairs started by `new-pair` so far, for their folders' names.
    pairs: AtomicUsize,
}

impl Place {
    /// Errors: the run has no scratch cluster; the folders cannot be made.
    fn of(ctx: &Ctx) -> anyhow::Result<Place> {
        let parent = |path: PathBuf| path.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(Place {
            pg_bin: ctx.pg_bin()?,
            files: parent(ctx.own_folder("pair")?),
            logs: parent(ctx.log_file("ledger-svc")?),
            case_id: ctx.case_id().to_owned(),
            pairs: AtomicUsize::new(0),
        })
    }

    /// A new pair in folders `<case>-pairN-primary` and `<case>-pairN-standby`.
    ///
    /// Errors: a node did not start; SQL errors.
    async fn start(&self, replication: Replication) -> anyhow::Result<pair::Pair> {
        let n = self.pairs.fetch_add(1, Ordering::SeqCst) + 1;
        let dir = |node: &str| (self.files).join(format!("{}-pair{n}-{node}", self.case_id));
        let (primary, standby) = (dir("primary"), dir("standby"));
        pair::start_pair_at(self.pg_bin.clone(), primary, standby, replication).await
    }
}

struct NodesState {
    primary: Option<Cluster>,
    standby: Option<Cluster>,
    /// Whether the standby was promoted (the expectations then run on it).
    promoted: bool,
}

impl NodesState {
    fn node(&self, name: &str) -> Result<&Cluster, String> {
        let node = if name == "standby" {
            &self.standby
        } else {
            &self.primary
        };
        node.as_ref().ok_or_else(|| format!("no {name} node"))
    }
}

impl SpecEngine for PairEngine {
    case_kit::spec_declares!(SYSTEM, crate::verbs::ALL);

    fn describe(&self, ctx: &mut Ctx) {
        // A pair left by an earlier run of the case (one that ended before its
        // expectations) stops now.
        self.pairs.remove(ctx);
    }

    fn connect<'a>(&'a self, ctx: &'a Ctx, opening: spec::Opening) -> SessionFuture<'a> {
        let permutation = opening.permutation;
        async move {
            anyhow::ensure!(
                permutation == 1,
                "one permutation only: the pair is the case's"
            );
            let known = self.pairs.get(ctx);
            let pair = match known {
                Some(pair) => pair,
                None => {
                    let started = pair::start_pair(ctx, Replication::Asynchronous).await?;
                    let state = NodesState {
                        primary: Some(started.primary),
                        standby: Some(started.standby),
                        promoted: false,
                    };
                    let pair = Arc::new(Nodes {
                        state: tokio::sync::Mutex::new(state),
                        groups: tokio::sync::Mutex::default(),
                        place: Place::of(ctx)?,
                    });
                    self.pairs.insert(ctx, pair.clone());
                    pair
                }
            };
            let session = NodeSession::open(pair, cases_ledger::modes::mode(ctx)).await?;
            Ok(Box::new(session) as Box<dyn EngineSession>)
        }
        .boxed()
    }

    fn expectations<'a>(&'a self, ctx: &'a Ctx) -> SessionFuture<'a> {
        async move {
            // The last connection: it holds the pair alone, which stops when it ends.
            let pair = self.pairs.remove(ctx);
            let pair = pair.ok_or_else(|| anyhow::anyhow!("the case's pair is not running"))?;
            let session = NodeSession::open(pair, cases_ledger::modes::mode(ctx)).await?;
            Ok(Box::new(session) as Box<dyn EngineSession>)
        }
        .boxed()
    }
}

/// A session's connection to one node of the pair.
struct NodeSession {
    client: Client,
    mode: TransferMode,
    pair: Arc<Nodes>,
}

impl NodeSession {
    /// A session on the primary (the promoted standby once there was a promotion).
    async fn open(pair: Arc<Nodes>, mode: TransferMode) -> anyhow::Result<NodeSession> {
        let client = {
            let state = pair.state.lock().await;
            let name = if state.promoted { "standby" } else { "primary" };
            let node = state.node(name).map_err(anyhow::Error::msg)?;
            node.connect(LEDGER_DATABASE).await?
        };
        Ok(NodeSession { client, mode, pair })
    }

    /// A new connection to node `name`.
    async fn connect(&self, name: &str) -> Result<Client, String> {
        let state = self.pair.state.lock().await;
        let node = state.node(name)?;
        node.connect(LEDGER_DATABASE)
            .await
            .map_err(|e| e.to_string())
    }

    async fn transfer(&mut self, call: &Call) -> Result<String, String> {
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        let amount: i64 = arg("amount")
            .parse()
            .map_err(|_| "amount is not a number")?;
        let client = call.arg("client").unwrap_or(DEFAULT_CLIENT);
        let (key, account) = (arg("key"), arg("account"));
        let result = match call.op.as_str() {
            "grant" => grant_in(self.mode, &mut self.client, client, key, account, amount).await,
            _ => debit_in(self.mode, &mut self.client, client, key, account, amount).await,
        };
        let result = result.map_err(|e| e.to_string())?;
        let outcome = format!("{:?}", result.outcome).to_uppercase();
        Ok(format!(
            "outcome={outcome} balance={} replayed={}",
            result.balance, result.replayed
        ))
    }

    async fn standby_sql(&self, sql: &str) -> Result<String, String> {
        let standby = self.connect("standby").await?;
        let row = standby
            .query_one(sql, &[])
            .await
            .map_err(|e| e.to_string())?;
        Ok(row.get(0))
    }

    async fn wait_paused(&self) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_millis(PAUSE_WAIT_MS);
        loop {
            let sql = "SELECT pg_get_wal_replay_pause_state()";
            let state = self.standby_sql(sql).await?;
            if state == "paused" {
                return Ok("replay paused".into());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "replay not paused after {PAUSE_WAIT_MS} ms: {state}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(spec::POLL_INTERVAL_MS)).await;
        }
    }

    /// `naive-place`: the standby's read decides, the primary takes the amount.
    async fn naive_place(&self, call: &Call) -> Result<String, String> {
        let account = call.arg("account").unwrap_or_default().replace('\'', "''");
        let amount: i64 = call
            .arg("amount")
            .unwrap_or_default()
            .parse()
            .map_err(|_| "amount")?;
        let read = format!("SELECT balance::text FROM account WHERE account_id = '{account}'");
        let read: i64 = self
            .standby_sql(&read)
            .await?
            .parse()
            .map_err(|_| "balance")?;
        let placed = read >= amount;
        if placed {
            let primary = self.connect("primary").await?;
            let update = "UPDATE account SET balance = balance - $1 WHERE account_id = $2";
            let updated = primary.execute(update, &[&amount, &account]).await;
            updated.map_err(|e| e.to_string())?;
        }
        Ok(format!("read={read} placed={placed}"))
    }

    /// The replication calls: what the standby has, and the WAL receiver.
    async fn replication(&self, op: &str) -> Result<String, String> {
        let state = self.pair.state.lock().await;
        let (primary, standby) = (state.node("primary")?, state.node("standby")?);
        match op {
            "wait-replayed" => {
                let waited = crate::wal::wait_replayed(primary, standby).await;
                waited.map_err(|e| format!("{e:#}"))?;
                Ok("replayed up to the primary's flush position".into())
            }
            "received-all" => {
                let flushed = crate::wal::flushed(primary)
                    .await
                    .map_err(|e| e.to_string())?;
                let all = crate::wal::received_up_to(standby, &flushed).await;
                Ok(format!("received_all={}", all.map_err(|e| e.to_string())?))
            }
            _ => {
                let pid = standby
                    .wal_receiver_pid()
                    .await
                    .map_err(|e| e.to_string())?;
                kill(Pid::from_raw(pid), Signal::SIGSTOP).map_err(|e| e.to_string())?;
                Ok("WAL receiver stopped (SIGSTOP)".into())
            }
        }
    }

    /// `kill`, `start` and `promote`: the failover's steps on the case's nodes.
    async fn failover(&self, op: &str, name: &str) -> Result<String, String> {
        let mut state = self.pair.state.lock().await;
        let slot = if name == "standby" {
            &mut state.standby
        } else {
            &mut state.primary
        };
        match op {
            "kill" | "start" => {
                let node = slot.take().ok_or_else(|| format!("no {name} node"))?;
                let done = if op == "kill" {
                    pair::kill_node(node).await
                } else {
                    pair::start_again(node).await
                };
                *slot = Some(done.map_err(|e| format!("{e:#}"))?);
                Ok(if op == "kill" {
                    format!("killed {name} (kill -9)")
                } else {
                    format!("started {name} again")
                })
            }
            _ => {
                let standby = state.node("standby")?;
                standby.promote().await.map_err(|e| e.to_string())?;
                state.promoted = true;
                Ok("promoted".into())
            }
        }
    }
}

impl NodeSession {
    /// `new-pair`: the case's clients and pair ended (services killed, nodes stopped
    /// and their folders removed), a new pair started, the session on its primary.
    async fn new_pair(&mut self, call: &Call) -> Result<String, String> {
        let (replication, shown) = match call.arg("replication") {
            Some("synchronous") => (Replication::Synchronous, "synchronous"),
            _ => (Replication::Asynchronous, "asynchronous"),
        };
        drop(std::mem::take(&mut *self.pair.groups.lock().await));
        let mut state = self.pair.state.lock().await;
        let old = (state.primary.take(), state.standby.take());
        tokio::task::spawn_blocking(move || drop(old))
            .await
            .map_err(|e| e.to_string())?;
        let started = self.pair.place.start(replication).await;
        let started = started.map_err(|e| format!("{e:#}"))?;
        let client = started.primary.connect(LEDGER_DATABASE).await;
        self.client = client.map_err(|e| e.to_string())?;
        *state = NodesState {
            primary: Some(started.primary),
            standby: Some(started.standby),
            promoted: false,
        };
        Ok(format!("{shown} standby streaming"))
    }

    /// A verb of [`crate::verbs::GROUPS`], on the pair's clients.
    async fn groups(&mut self, call: &Call) -> Result<String, String> {
        let state = self.pair.state.lock().await;
        let nodes: Vec<&Cluster> = [&state.primary, &state.standby]
            .into_iter()
            .flatten()
            .collect();
        let place = &self.pair.place;
        let reach = Reach {
            url: pair::multi_host_url(&nodes),
            primary: state.primary.as_ref(),
            logs: &place.logs,
            case_id: &place.case_id,
            mode: self.mode,
        };
        let mut groups = self.pair.groups.lock().await;
        groups.run(&reach, &mut self.client, call).await
    }
}

impl EngineSession for NodeSession {
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>> {
        async move { run_sql(&self.client, sql).await }.boxed()
    }

    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>> {
        async move {
            let node = call.arg("node").unwrap_or("standby");
            match call.op.as_str() {
                "on" => {
                    self.client = self.connect(node).await?;
                    Ok(format!("on {node}"))
                }
                "grant" | "debit" => self.transfer(call).await,
                "pause-replay" => {
                    self.standby_sql("SELECT pg_wal_replay_pause()::text")
                        .await?;
                    Ok("pause requested".into())
                }
                "wait-paused" => self.wait_paused().await,
                "naive-place" => self.naive_place(call).await,
                "reconcile" => Ok(self.reconcile().await?.1),
                "wait-replayed" | "received-all" | "stop-receiver" => {
                    self.replication(&call.op).await
                }
                "kill" | "start" | "promote" => self.failover(&call.op, node).await,
                "new-pair" => self.new_pair(call).await,
                op if crate::verbs::GROUPS.has(op) => self.groups(call).await,
                other => Err(format!("no operation {other:?}")),
            }
        }
        .boxed()
    }

    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        async move {
            let findings = points_ledger::reconcile(&mut self.client).await;
            let findings = findings.map_err(|e| e.to_string())?;
            Ok((findings.is_clean(), findings.summary()))
        }
        .boxed()
    }
}

/// Runs `sql` as one simple query: each row as `column=value`, `(0 rows)` for a
/// statement that returns rows but found none, or `ERROR <SQLSTATE>: message`.
async fn run_sql(client: &Client, sql: &str) -> Vec<String> {
    let messages = match client.simple_query(sql).await {
        Ok(messages) => messages,
        Err(error) => {
            return vec![match error.as_db_error() {
                Some(db) => format!("ERROR {}: {}", db.code().code(), db.message()),
                None => format!("ERROR (no SQLSTATE): {error}"),
            }];
        }
    };
    let mut out = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut rows = 0;
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(columns) => {
                names = columns.iter().map(|c| c.name().to_string()).collect();
                rows = 0;
            }
            SimpleQueryMessage::Row(row) => {
                rows += 1;
                let cells = names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| format!("{name}={}", row.get(i).unwrap_or("null")));
                out.push(cells.collect::<Vec<_>>().join(" "));
            }
            SimpleQueryMessage::CommandComplete(_) if !names.is_empty() => {
                if rows == 0 {
                    out.push("(0 rows)".into());
                }
                names.clear();
            }
            _ => {}
        }
    }
    out
}
