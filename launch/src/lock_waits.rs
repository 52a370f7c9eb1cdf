//! Whether the requests a case's steps sent to `ledger-svc` all wait: each is either
//! held at a fault point of the service ([`Service::holding`]) or served by a backend of
//! the service waiting for a lock, seen on a monitor connection of the case's own
//! ([`LockMonitor`]). A family's service steps (the ledger's `post-debit`, the spot
//! routes' `post-place`, …) count their requests in flight and ask
//! [`LockMonitor::all_waiting`].

use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tokio_postgres::{Client, NoTls};

use crate::service::Service;

/// A connection of its own to a case's database, opened on first use, that sees the
/// service's backends wait for a lock.
pub struct LockMonitor {
    database_url: String,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for LockMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockMonitor")
            .field("database_url", &self.database_url)
            .finish_non_exhaustive()
    }
}

impl LockMonitor {
    /// Not connected yet, for the database at `database_url`.
    pub fn new(database_url: String) -> LockMonitor {
        LockMonitor {
            database_url,
            client: Mutex::new(None),
        }
    }

    /// The monitor's connection, opened now if it is not yet; held while the guard
    /// lives (other queries of the monitor wait).
    ///
    /// Errors: the connection cannot be opened.
    pub async fn connection(&self) -> Result<MappedMutexGuard<'_, Client>, tokio_postgres::Error> {
        let mut slot = self.client.lock().await;
        if slot.is_none() {
            let (client, connection) = tokio_postgres::connect(&self.database_url, NoTls).await?;
            tokio::spawn(connection);
            *slot = Some(client);
        }
        Ok(MutexGuard::map(slot, |slot| {
            slot.as_mut().expect("connected")
        }))
    }

    /// Backends of the service (`application_name` `ledger-svc`) waiting for a lock now,
    /// as the lock manager says (`pg_blocking_pids`: a `wait_event` may still read `Lock`
    /// after the lock was granted, until the waiter runs again).
    ///
    /// Errors: the connection cannot be opened, or the query fails.
    pub async fn service_lock_waits(&self) -> Result<u64, tokio_postgres::Error> {
        let client = self.connection().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'ledger-svc' \
                 AND cardinality(pg_blocking_pids(pid)) > 0",
                &[],
            )
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Whether the `in_flight` requests the steps sent to `service` all wait: at least
    /// one is in flight, and the requests held at its fault points (`GET /faults`, 0 when
    /// it does not answer) and its backends waiting for a lock (0 when the monitor
    /// cannot tell) account for every one. So a second request is reported waiting only
    /// once it is itself seen waiting, not because the first is held.
    pub async fn all_waiting(&self, service: &Service, in_flight: u64) -> bool {
        let held = service.holding(None).await.unwrap_or(0);
        let waiting = self.service_lock_waits().await.unwrap_or(0);
        in_flight > 0 && held + waiting >= in_flight
    }
}
