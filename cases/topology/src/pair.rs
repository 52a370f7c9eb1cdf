//! A primary and its standby, both scratch clusters of the run's PostgreSQL version in
//! the run's folder, the primary holding the points ledger (schema and seeded accounts)
//! in the database [`LEDGER_DATABASE`], the standby built from it (`scratch_pg`'s base
//! backup through SQL).

use std::path::PathBuf;

use anyhow::Context as _;
use case_kit::Ctx;
use scratch_pg::{Cluster, ClusterOptions, Replication, StandbyOptions};

/// The database that holds the ledger on the primary (and, replicated, the standby).
pub const LEDGER_DATABASE: &str = "ledger";
/// `max_connections` of each node: the service's pool, the case's own sessions, the
/// WAL sender.
const NODE_MAX_CONNECTIONS: u32 = 60;

/// A primary and its standby.
pub struct Pair {
    /// The node that takes writes when the case starts.
    pub primary: Cluster,
    /// The streaming standby (a hot standby: it answers reads).
    pub standby: Cluster,
}

/// Starts a primary with the ledger installed, then its standby (synchronous or
/// asynchronous), and waits until the standby streams. Blocks about 2 s.
///
/// Errors: the run has no scratch cluster to take the binaries from; a node did not
/// start; SQL errors.
pub async fn start_pair(ctx: &Ctx, replication: Replication) -> anyhow::Result<Pair> {
    let (pg_bin, primary_dir) = (ctx.pg_bin()?, ctx.own_folder("primary")?);
    start_pair_at(pg_bin, primary_dir, ctx.own_folder("standby")?, replication).await
}

/// [`start_pair`] with the binaries of `pg_bin` in the folders `primary_dir` and
/// `standby_dir` (neither exists yet): for a pair started where no [`Ctx`] is at hand
/// (a case file's `new-pair` step).
///
/// Errors: a node did not start; SQL errors.
pub async fn start_pair_at(
    pg_bin: PathBuf,
    primary_dir: PathBuf,
    standby_dir: PathBuf,
    replication: Replication,
) -> anyhow::Result<Pair> {
    let primary = start_primary_at(pg_bin, primary_dir).await?;
    let standby = primary
        .start_standby(StandbyOptions {
            dir: standby_dir,
            name: "standby".into(),
            replication,
            server_user: scratch_pg::DEFAULT_SERVER_USER.into(),
        })
        .await
        .context("starting the standby")?;
    Ok(Pair { primary, standby })
}

/// Starts a node of the run's version in the case's folder `primary` with the ledger
/// installed (schema and seeded accounts) in [`LEDGER_DATABASE`].
///
/// Errors: the run has no scratch cluster to take the binaries from; the node did not
/// start; SQL errors.
pub async fn start_primary(ctx: &Ctx) -> anyhow::Result<Cluster> {
    start_primary_at(ctx.pg_bin()?, ctx.own_folder("primary")?).await
}

async fn start_primary_at(pg_bin: PathBuf, dir: PathBuf) -> anyhow::Result<Cluster> {
    let primary = start_node(pg_bin, dir).await?;
    primary.create_database(LEDGER_DATABASE, None).await?;
    let client = primary.connect(LEDGER_DATABASE).await?;
    points_ledger::schema::install(&client).await?;
    points_ledger::schema::seed(&client).await?;
    Ok(primary)
}

async fn start_node(pg_bin: PathBuf, dir: PathBuf) -> anyhow::Result<Cluster> {
    let options = ClusterOptions {
        pg_bin: Some(pg_bin),
        dir: Some(dir),
        required_major: None,
        max_connections: NODE_MAX_CONNECTIONS,
        ..ClusterOptions::default()
    };
    Ok(tokio::task::spawn_blocking(move || Cluster::start(options)).await??)
}

/// The service's multi-host URL: both nodes, and only a session that takes writes
/// (`target_session_attrs=read-write`, PostgreSQL docs 34.1.1.3), so the service
/// reaches whichever node is the primary.
pub fn multi_host_url(nodes: &[&Cluster]) -> String {
    let hosts: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    format!(
        "postgresql://{}@{}/{LEDGER_DATABASE}?target_session_attrs=read-write",
        scratch_pg_superuser(),
        hosts.join(",")
    )
}

fn scratch_pg_superuser() -> &'static str {
    "postgres"
}

/// kill -9 of a whole node, off the async threads.
///
/// Errors: the blocking task panicked.
pub async fn kill_node(node: Cluster) -> anyhow::Result<Cluster> {
    Ok(tokio::task::spawn_blocking(move || {
        let mut node = node;
        node.kill_server().map(|()| node)
    })
    .await??)
}

/// Starts a stopped node again on its port, off the async threads.
///
/// Errors: it did not start.
pub async fn start_again(node: Cluster) -> anyhow::Result<Cluster> {
    Ok(tokio::task::spawn_blocking(move || {
        let mut node = node;
        node.start_again().map(|()| node)
    })
    .await??)
}

/// Whether `node` is in recovery (a standby).
///
/// Errors: SQL errors.
pub async fn in_recovery(node: &Cluster) -> anyhow::Result<bool> {
    let client = node.connect(LEDGER_DATABASE).await?;
    Ok(client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await?
        .get(0))
}
