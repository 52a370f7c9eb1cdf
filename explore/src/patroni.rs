//! `--topology patroni`: the run on a Patroni cluster (`scratch_pg::patroni`: etcd, two
//! Patroni nodes on Debian's PostgreSQL 15 in `synchronous_mode`, HAProxy routing to the
//! node whose `GET /primary` answers 200), the service reaching the leader through
//! HAProxy, and the nemesis's cluster faults (docs/explore.md, "On a Patroni cluster"):
//!
//! - `kill-leader`: kill -9 of the leader's Patroni and postmaster, Patroni promotes the
//!   synchronous standby, then the killed node's Patroni is started again;
//! - `pause-leader`: SIGSTOP of the leader's Patroni and postmaster until another node
//!   answers `/primary` (the lease ran out, past the TTL), then SIGCONT;
//! - `stop-standby`: SIGSTOP of the synchronous standby's WAL receiver until a COMMIT
//!   is seen waiting for it (`SyncRep` in `pg_stat_activity`) and then for
//!   [`STOP_STANDBY_HOLD_MS`] (longer than the service's request bound), then SIGCONT;
//! - `switchover`: `patronictl switchover` to the standby.
//!
//! After each, [`wait_healthy`]: a leader, every other node a streaming synchronous
//! standby (Patroni's REST API), HAProxy routing to the leader only, within
//! [`HEALTHY_WITHIN_MS`] (a hang bound).
//!
//! The cluster lives in `<temp>/explore-patroni-<pid>/`; [`cleanup`] (Ctrl-C) and the
//! janitor ([`spawn_janitor`], after a kill -9 of the run) kill its processes and
//! remove the folder.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use scratch_pg::patroni::{PatroniCluster, PatroniOptions};

/// The service's request bound on this topology, milliseconds (`--request-timeout-ms`):
/// a COMMIT waiting for a stopped standby is answered 503 `UNKNOWN` when it runs out.
pub const REQUEST_BOUND_MS: u64 = 3_000;
/// How long `stop-standby` keeps the receiver stopped once a COMMIT waits for it,
/// milliseconds: past [`REQUEST_BOUND_MS`].
pub const STOP_STANDBY_HOLD_MS: u64 = REQUEST_BOUND_MS + 1_000;
/// Longest wait for the cluster to be healthy again, for a new leader, or for a COMMIT
/// waiting on the stopped standby, milliseconds (a hang bound, above the 20 s lease).
pub const HEALTHY_WITHIN_MS: u64 = 90_000;
/// `max_connections` of each node.
const MAX_CONNECTIONS: u32 = 100;
/// Pause between two looks, milliseconds (pacing only).
const POLL_MS: u64 = 100;

/// The cluster's folder for this process.
pub fn work_dir() -> PathBuf {
    std::env::temp_dir().join(format!("explore-patroni-{}", std::process::id()))
}

/// Starts the cluster in [`work_dir`]`/cluster` (two nodes, `synchronous_mode`) and
/// waits until it is healthy. Blocks (about 10 s; longer when the programs are fetched).
///
/// Errors: the programs cannot be had (not root, no network), or the cluster did not
/// come up.
pub fn start(server_user: &str) -> anyhow::Result<PatroniCluster> {
    let options = PatroniOptions {
        dir: work_dir().join("cluster"),
        scope: "explore".to_owned(),
        nodes: 2,
        synchronous_mode: true,
        maximum_lag_on_failover: None,
        max_connections: MAX_CONNECTIONS,
        server_user: server_user.to_owned(),
    };
    std::fs::create_dir_all(work_dir())?;
    let cluster = PatroniCluster::start(options).context("starting the Patroni cluster")?;
    wait_healthy(&cluster)?;
    Ok(cluster)
}

/// The `explore` database `database` through HAProxy.
pub fn haproxy_url(cluster: &PatroniCluster, database: &str) -> String {
    format!(
        "postgresql://postgres@127.0.0.1:{}/{database}",
        cluster.haproxy_port()
    )
}

/// A connection configuration for database `database` straight to node `index`.
pub fn node_config(
    cluster: &PatroniCluster,
    index: usize,
    database: &str,
) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(cluster.nodes()[index].pg_port)
        .user("postgres")
        .dbname(database)
        .connect_timeout(Duration::from_secs(5));
    config
}

/// Waits until the cluster is healthy: a node answers `/primary` with 200, every other
/// node is a streaming synchronous standby, HAProxy routes to the leader only. Returns
/// the leader's index.
///
/// Errors: not within [`HEALTHY_WITHIN_MS`] each.
pub fn wait_healthy(cluster: &PatroniCluster) -> anyhow::Result<usize> {
    let (leader, _) = cluster.wait_leader(None, HEALTHY_WITHIN_MS)?;
    for index in (0..cluster.nodes().len()).filter(|&i| i != leader) {
        cluster.wait_streaming(index, true, HEALTHY_WITHIN_MS)?;
    }
    cluster.wait_routed_to(leader, HEALTHY_WITHIN_MS)?;
    Ok(leader)
}

/// Runs `work` on the cluster off the async threads.
///
/// Errors: `work`'s, or the blocking task panicked.
pub async fn blocking<T: Send + 'static>(
    cluster: &Arc<Mutex<PatroniCluster>>,
    work: impl FnOnce(&mut PatroniCluster) -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let cluster = cluster.clone();
    tokio::task::spawn_blocking(move || {
        work(&mut cluster.lock().unwrap_or_else(|p| p.into_inner()))
    })
    .await?
}

/// The node names `index` is, for the history's details.
fn name(cluster: &PatroniCluster, index: usize) -> String {
    cluster.nodes()[index].name.clone()
}

/// `kill-leader`: kill -9 of the leader's Patroni and postmaster, a new leader awaited,
/// the killed node's Patroni started again, the cluster healthy. The history's detail.
///
/// Errors: no leader; no new leader, or not healthy again, within the bounds.
pub fn kill_leader(cluster: &mut PatroniCluster) -> anyhow::Result<String> {
    let old = cluster.leader().context("no leader to kill")?;
    cluster.kill_node(old);
    let (new, failover_ms) = cluster.wait_leader(Some(old), HEALTHY_WITHIN_MS)?;
    cluster.start_node(old)?;
    let leader = wait_healthy(cluster)?;
    Ok(format!(
        "killed {} (kill -9 of Patroni and postmaster); {} promoted after failover_ms={failover_ms}; {} started again; healthy, leader {}",
        name(cluster, old),
        name(cluster, new),
        name(cluster, old),
        name(cluster, leader)
    ))
}

/// `pause-leader`: SIGSTOP of the leader's Patroni and postmaster until another node is
/// the leader, then SIGCONT, the cluster healthy. The history's detail.
///
/// Errors: no leader; no new leader, or not healthy again, within the bounds (the node
/// is continued first).
pub fn pause_leader(cluster: &mut PatroniCluster) -> anyhow::Result<String> {
    let old = cluster.leader().context("no leader to pause")?;
    cluster.signal_node(old, true)?;
    let promoted = cluster.wait_leader(Some(old), HEALTHY_WITHIN_MS);
    cluster.signal_node(old, false)?;
    let (new, failover_ms) = promoted?;
    let leader = wait_healthy(cluster)?;
    Ok(format!(
        "paused {} (SIGSTOP of Patroni and postmaster) until {} was promoted after failover_ms={failover_ms}; continued; healthy, leader {}",
        name(cluster, old),
        name(cluster, new),
        name(cluster, leader)
    ))
}

/// `switchover`: `patronictl switchover` from the leader to the other node, the cluster
/// healthy. The history's detail.
///
/// Errors: no leader, `patronictl` failed, or not healthy again within the bounds.
pub fn switchover(cluster: &mut PatroniCluster) -> anyhow::Result<String> {
    let old = cluster.leader().context("no leader to switch over from")?;
    let candidate = (0..cluster.nodes().len())
        .find(|&i| i != old)
        .context("no other node")?;
    cluster.switchover(old, candidate)?;
    let leader = wait_healthy(cluster)?;
    Ok(format!(
        "patronictl switchover {} -> {}; healthy, leader {}",
        name(cluster, old),
        name(cluster, candidate),
        name(cluster, leader)
    ))
}

/// `stop-standby`: SIGSTOP of the synchronous standby's WAL receiver until a COMMIT of
/// the run's database waits for it (`SyncRep`), then [`STOP_STANDBY_HOLD_MS`] more,
/// then SIGCONT, the cluster healthy. The history's detail, and whether a COMMIT was
/// seen waiting (the fault's effect).
///
/// Errors: no leader or no receiver, SQL errors, or not healthy again.
pub async fn stop_standby(
    cluster: &Arc<Mutex<PatroniCluster>>,
    database: &str,
) -> anyhow::Result<(String, bool)> {
    let (leader, standby, on_leader, on_standby) = blocking(cluster, {
        let database = database.to_owned();
        move |c| {
            let leader = c.leader().context("no leader")?;
            let standby = (0..c.nodes().len())
                .find(|&i| i != leader)
                .context("no standby")?;
            Ok((
                leader,
                standby,
                node_config(c, leader, &database),
                node_config(c, standby, "postgres"),
            ))
        }
    })
    .await?;
    let receiver = receiver_pid(&on_standby).await?;
    kill(Pid::from_raw(receiver), Signal::SIGSTOP)?;
    let waited = syncrep_seen(&on_leader, database).await;
    if matches!(waited, Ok(true)) {
        tokio::time::sleep(Duration::from_millis(STOP_STANDBY_HOLD_MS)).await;
    }
    kill(Pid::from_raw(receiver), Signal::SIGCONT)?;
    let seen = waited?;
    let healthy = blocking(cluster, |c| wait_healthy(c)).await?;
    let names = blocking(cluster, move |c| {
        Ok((name(c, standby), name(c, leader), name(c, healthy)))
    })
    .await?;
    Ok((
        format!(
            "stopped {}'s WAL receiver (SIGSTOP pid {receiver}); a COMMIT on {} seen waiting (SyncRep): {seen}; held {STOP_STANDBY_HOLD_MS} ms more; continued; healthy, leader {}",
            names.0, names.1, names.2
        ),
        seen,
    ))
}

/// The pid of the WAL receiver of the node `config` reaches.
///
/// Errors: connecting or the query failed; none runs.
async fn receiver_pid(config: &tokio_postgres::Config) -> anyhow::Result<i32> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    let row = client
        .query_opt("SELECT pid FROM pg_stat_wal_receiver", &[])
        .await?;
    drop(client);
    let _ = task.await;
    row.map(|row| row.get(0))
        .context("the synchronous standby runs no WAL receiver")
}

/// Whether a session of `database` on the leader `config` reaches is seen waiting for
/// the synchronous standby (`wait_event = 'SyncRep'`) within [`HEALTHY_WITHIN_MS`].
///
/// Errors: connecting or the query failed.
async fn syncrep_seen(config: &tokio_postgres::Config, database: &str) -> anyhow::Result<bool> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'SyncRep'";
    let deadline = Instant::now() + Duration::from_millis(HEALTHY_WITHIN_MS);
    let seen = loop {
        let waiting: i64 = client.query_one(sql, &[&database]).await?.get(0);
        if waiting > 0 {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    };
    drop(client);
    let _ = task.await;
    Ok(seen)
}

/// Kills the cluster's processes and removes [`work_dir`] (Ctrl-C; safe to call more
/// than once and when there is no cluster).
pub fn cleanup() {
    scratch_pg::patroni::cleanup_all();
    let work = work_dir();
    if work.exists() {
        scratch_pg::patroni::kill_left_under(&work);
        let _ = std::fs::remove_dir_all(&work);
    }
}

/// A watchdog for a kill -9 of the run: this program again as
/// `explore --janitor-for <work_dir>` in its own process group, reading a pipe; end of
/// file on it (this process gone, whatever the signal) makes it run [`janitor`]. Drop
/// the returned handle's pipe to let it finish.
///
/// Errors: the program cannot be executed again.
pub fn spawn_janitor() -> anyhow::Result<(Child, ChildStdin)> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--janitor-for")
        .arg(work_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let pipe = child.stdin.take().context("piped stdin")?;
    Ok((child, pipe))
}

/// The janitor's body: waits for end of file on stdin, then kills every process of the
/// cluster under `work` (etcd, Patroni, HAProxy, the detached postmasters:
/// `scratch_pg::patroni::kill_left_under`) and removes the folder.
pub fn janitor(work: &Path) -> ! {
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    scratch_pg::patroni::kill_left_under(work);
    let _ = std::fs::remove_dir_all(work);
    std::process::exit(0);
}
