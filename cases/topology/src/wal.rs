//! WAL positions read from the nodes, and the one wait the cases need: a standby that
//! has replayed everything the primary flushed (observed in `pg_last_wal_replay_lsn`,
//! bounded by a timeout against a hang only).

use std::time::{Duration, Instant};

use scratch_pg::Cluster;

use crate::pair::LEDGER_DATABASE;

/// Longest wait for a standby to replay the primary's WAL, milliseconds (a hang bound).
pub const CATCH_UP_TIMEOUT_MS: u64 = 30_000;
/// Pause between two looks at the standby's replay position, milliseconds.
const POLL_MS: u64 = 10;

/// The primary's flushed WAL position (`pg_current_wal_flush_lsn()`), as text.
///
/// Errors: SQL errors.
pub async fn flushed(primary: &Cluster) -> anyhow::Result<String> {
    let client = primary.connect(LEDGER_DATABASE).await?;
    Ok(client
        .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
        .await?
        .get(0))
}

/// Whether `standby` has received (written to its own disk) WAL up to `lsn`
/// (`pg_last_wal_receive_lsn() >= lsn`).
///
/// Errors: SQL errors.
pub async fn received_up_to(standby: &Cluster, lsn: &str) -> anyhow::Result<bool> {
    let client = standby.connect(LEDGER_DATABASE).await?;
    Ok(client
        .query_one(
            "SELECT coalesce(pg_last_wal_receive_lsn() >= $1::text::pg_lsn, false)",
            &[&lsn],
        )
        .await?
        .get(0))
}

/// Waits until `standby` has replayed WAL up to the primary's flush position as read
/// now.
///
/// Errors: SQL errors; not caught up within [`CATCH_UP_TIMEOUT_MS`].
pub async fn wait_replayed(primary: &Cluster, standby: &Cluster) -> anyhow::Result<()> {
    let target = flushed(primary).await?;
    let client = standby.connect(LEDGER_DATABASE).await?;
    let deadline = Instant::now() + Duration::from_millis(CATCH_UP_TIMEOUT_MS);
    loop {
        let replayed: bool = client
            .query_one(
                "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                &[&target],
            )
            .await?
            .get(0);
        if replayed {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the standby did not replay up to {target} within {CATCH_UP_TIMEOUT_MS} ms"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// The timeline of a node's current WAL position (the first 8 hex digits of
/// `pg_walfile_name`; a primary only), e.g. `00000002`
/// after one promotion.
///
/// Errors: SQL errors.
pub async fn timeline(node: &Cluster) -> anyhow::Result<String> {
    let client = node.connect(LEDGER_DATABASE).await?;
    Ok(client
        .query_one(
            "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
            &[],
        )
        .await?
        .get(0))
}
