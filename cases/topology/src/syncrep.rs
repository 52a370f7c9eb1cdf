//! A synchronous standby that stops acknowledging, as R2 forces it: the standby's WAL
//! receiver stopped (SIGSTOP), so every COMMIT on the primary that writes WAL waits in
//! `SyncRep` (PostgreSQL's src/backend/replication/syncrep.c) for a flush report that
//! never comes; the waits seen in `pg_stat_activity`, ended by `pg_cancel_backend`, or
//! cut by a failover whose promoted standby holds only what its receiver wrote to disk;
//! and, for every R case, the sessions seen waiting in `pg_stat_activity` ([`sessions_waiting`]).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use scratch_pg::Cluster;

use crate::pair::{self, LEDGER_DATABASE, Pair};

/// Longest wait for a state the case observes, milliseconds (a hang bound only).
pub const OBSERVE_LIMIT_MS: u64 = 60_000;
/// Pause between two looks at `pg_stat_activity`, milliseconds (pacing only).
const POLL_MS: u64 = 10;

/// Cancels every such wait, the way a DBA would (`pg_cancel_backend`, PostgreSQL docs,
/// "Server Signaling Functions"); the count of sessions signalled.
const CANCEL_WAITING_SQL: &str = "\
SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
WHERE datname = $1 AND wait_event = 'SyncRep'";

/// Stops the standby's WAL receiver (SIGSTOP): from now on the standby writes and
/// flushes nothing more, so no COMMIT after this is acknowledged by it.
///
/// Errors: no WAL receiver runs; the signal could not be sent.
pub async fn stop_receiver(standby: &Cluster) -> anyhow::Result<()> {
    let pid = standby.wal_receiver_pid().await?;
    kill(Pid::from_raw(pid), Signal::SIGSTOP).context("stopping the WAL receiver")?;
    Ok(())
}

/// What a session of the ledger database is seen waiting for in `pg_stat_activity`.
#[derive(Debug, Clone, Copy)]
pub enum Wait {
    /// A heavyweight lock (`wait_event_type = 'Lock'`): a row lock another holds.
    Lock,
    /// The synchronous standby (`wait_event = 'SyncRep'`): a COMMIT.
    Standby,
}

impl Wait {
    fn condition(self) -> &'static str {
        match self {
            Wait::Lock => "wait_event_type = 'Lock'",
            Wait::Standby => "wait_event = 'SyncRep'",
        }
    }
}

/// Looks with `look` every [`POLL_MS`] until what it saw is `done`, for at most
/// `limit_ms`; returns the last thing seen and whether it was `done`. The family's one
/// clock read for what it observes, and only a hang bound: a case checks what `look`
/// saw, never how long seeing it took.
///
/// Errors: `look`'s.
pub async fn seen_within<T, F, Fut>(
    limit_ms: u64,
    mut look: F,
    done: impl Fn(&T) -> bool,
) -> anyhow::Result<(T, bool)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_millis(limit_ms);
    loop {
        let seen = look().await?;
        if done(&seen) {
            return Ok((seen, true));
        }
        if Instant::now() >= deadline {
            return Ok((seen, false));
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Waits until at least `want` sessions of the ledger database on `primary` are seen
/// waiting for `wait` ([`seen_within`] `limit_ms`); returns the count seen then.
///
/// Errors: SQL errors; fewer seen within the hang bound.
pub async fn sessions_waiting(
    primary: &Cluster,
    wait: Wait,
    want: usize,
    limit_ms: u64,
) -> anyhow::Result<usize> {
    let observer = primary.connect(LEDGER_DATABASE).await?;
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND {}",
        wait.condition()
    );
    let (observer, sql) = (&observer, &sql);
    let look = move || async move {
        let row = observer.query_one(sql, &[&LEDGER_DATABASE]).await?;
        Ok(row.get::<_, i64>(0) as usize)
    };
    let (seen, enough) = seen_within(limit_ms, look, |seen| *seen >= want).await?;
    anyhow::ensure!(
        enough,
        "only {seen} of {want} sessions seen waiting ({wait:?})"
    );
    Ok(seen)
}

/// Waits until at least `want` sessions of the ledger database on `primary` are seen
/// waiting in `SyncRep` ([`sessions_waiting`] within [`OBSERVE_LIMIT_MS`]).
///
/// Errors: SQL errors; fewer seen within the hang bound.
pub async fn waiting_on_standby(primary: &Cluster, want: usize) -> anyhow::Result<usize> {
    sessions_waiting(primary, Wait::Standby, want, OBSERVE_LIMIT_MS).await
}

/// `pg_cancel_backend` of every session waiting in `SyncRep`; the count signalled.
///
/// Errors: SQL errors.
pub async fn cancel_waiting(primary: &Cluster) -> anyhow::Result<usize> {
    let client = primary.connect(LEDGER_DATABASE).await?;
    let row = client
        .query_one(CANCEL_WAITING_SQL, &[&LEDGER_DATABASE])
        .await?;
    Ok(row.get::<_, i64>(0) as usize)
}

/// How many of `keys` (of `client`) have a transaction on `node`.
///
/// Errors: SQL errors.
pub async fn committed_on(node: &Cluster, client: &str, keys: &[String]) -> anyhow::Result<usize> {
    let db = node.connect(LEDGER_DATABASE).await?;
    let row = db
        .query_one(
            "SELECT count(*) FROM ledger_txn WHERE client_id = $1 AND idem_key = ANY($2)",
            &[&client, &keys],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as usize)
}

/// Those of `keys` (of `client`) with no transaction on `node`, in key order.
///
/// Errors: SQL errors.
pub async fn missing_on(
    node: &Cluster,
    client: &str,
    keys: &[String],
) -> anyhow::Result<Vec<String>> {
    let db = node.connect(LEDGER_DATABASE).await?;
    let rows = db
        .query(
            "SELECT key FROM unnest($2::text[]) AS k(key) WHERE NOT EXISTS \
             (SELECT 1 FROM ledger_txn WHERE client_id = $1 AND idem_key = key) ORDER BY key",
            &[&client, &keys],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// How many of `keys` have a transaction on `node`, looked at until all of them do
/// (bounded by [`OBSERVE_LIMIT_MS`] against a hang): a COMMIT whose wait was cancelled
/// becomes visible a moment after its session sent the warning.
///
/// Errors: SQL errors.
pub async fn committed_within(
    node: &Cluster,
    client: &str,
    keys: &[String],
) -> anyhow::Result<usize> {
    let look = move || committed_on(node, client, keys);
    let (committed, _) = seen_within(OBSERVE_LIMIT_MS, look, |n| *n == keys.len()).await?;
    Ok(committed)
}

/// The failover: kill -9 of the primary, then of the standby, the standby started
/// again and promoted. The standby is killed too so that what it holds is what its WAL
/// receiver wrote to its disk: WAL the primary sent into the stopped receiver's socket
/// would otherwise arrive once it runs again. Returns the promoted node.
///
/// Errors: a node did not stop, start or promote.
pub async fn fail_over(pair: Pair) -> anyhow::Result<Cluster> {
    let Pair { primary, standby } = pair;
    let _old_primary = pair::kill_node(primary).await?;
    let standby = pair::kill_node(standby).await?;
    let standby = pair::start_again(standby).await?;
    standby.promote().await?;
    Ok(standby)
}
