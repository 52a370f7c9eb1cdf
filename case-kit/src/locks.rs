//! Lock waits read from PostgreSQL: how a case proves that sessions really queued behind
//! a lock it holds (a count of blocked backends at one moment), instead of reading an
//! overlap off a clock.

use std::time::Duration;

/// How often [`wait_for_lock_waiters`] looks at `pg_stat_activity`, milliseconds.
pub const LOCK_POLL_MS: u64 = 5;

/// Backends of the connected database that wait for a heavyweight lock right now
/// (`pg_stat_activity.wait_event_type = 'Lock'`, PostgreSQL docs §27.2.3): a row lock
/// shows as `transactionid` (the first waiter) or `tuple` (the ones queued behind it).
const LOCK_WAITERS_SQL: &str = "\
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'";

/// Backends of `db`'s database waiting for a lock at one moment (one look).
///
/// Errors: database errors.
pub async fn lock_waiters(db: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(db.query_one(LOCK_WAITERS_SQL, &[]).await?.get(0))
}

/// Looks every [`LOCK_POLL_MS`] until at least `at_least` backends of `db`'s database
/// wait for a lock at one moment; returns the count of that look. `limit` only stops a
/// hang: when it runs out, returns the most seen at any one look (below `at_least`), so
/// the caller can fail a check naming it. Sessions that reach the database late on a
/// loaded machine are counted later, never not.
///
/// Errors: database errors.
pub async fn wait_for_lock_waiters(
    db: &tokio_postgres::Client,
    at_least: i64,
    limit: Duration,
) -> anyhow::Result<i64> {
    let mut most = 0;
    let look = async {
        loop {
            let waiting = lock_waiters(db).await?;
            most = most.max(waiting);
            if waiting >= at_least {
                return anyhow::Ok(waiting);
            }
            tokio::time::sleep(Duration::from_millis(LOCK_POLL_MS)).await;
        }
    };
    // `limit` only stops a hang: the verdict is the count, never the time.
    match tokio::time::timeout(limit, look).await {
        Ok(found) => found,
        Err(_) => Ok(most),
    }
}

/// Waits like [`wait_for_lock_waiters`] until at least `at_least` backends of `db`'s
/// database wait for a lock, then rolls back `holder` (the transaction that holds the
/// contested row), whatever was seen, so the waiters go on either way. Returns the count
/// seen, for the caller's check.
///
/// Errors: database errors (of the look or of the rollback).
pub async fn release_once_queued(
    db: &tokio_postgres::Client,
    holder: tokio_postgres::Transaction<'_>,
    at_least: i64,
    limit: Duration,
) -> anyhow::Result<i64> {
    let waiting = wait_for_lock_waiters(db, at_least, limit).await;
    holder.rollback().await?;
    waiting
}
