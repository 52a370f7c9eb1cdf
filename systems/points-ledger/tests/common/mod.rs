//! Shared scaffolding of the integration tests: one scratch PostgreSQL 16 cluster shared by
//! the tests of a binary that overlap in time, and one fresh database per test.
#![allow(dead_code)]

use std::sync::{Arc, Mutex, Weak};

use scratch_pg::{Cluster, ClusterOptions};
use tokio_postgres::Client;

/// The shared cluster. Held through `Arc`s by the running tests and only weakly here, so
/// the last test to finish drops it, which stops the server and removes its folder (a
/// cluster kept in a static would never be dropped). A later test starts a new one.
pub fn cluster() -> Arc<Cluster> {
    static SHARED: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(cluster) = shared.upgrade() {
        return cluster;
    }
    let cluster =
        Arc::new(Cluster::start(ClusterOptions::default()).expect("start scratch PostgreSQL"));
    *shared = Arc::downgrade(&cluster);
    cluster
}

/// A test database: schema installed and accounts seeded. Keep `cluster` alive as long as
/// the database is used.
pub struct TestDb {
    pub cluster: Arc<Cluster>,
    pub name: String,
    pub client: Client,
}

impl TestDb {
    /// Creates database `name` (must be unique within the test binary), installs the schema
    /// and seeds the accounts.
    pub async fn new(name: &str) -> TestDb {
        let cluster = cluster();
        cluster
            .create_database(name, None)
            .await
            .expect("create database");
        let client = cluster.connect(name).await.expect("connect");
        points_ledger::schema::install(&client)
            .await
            .expect("install schema");
        points_ledger::schema::seed(&client).await.expect("seed");
        TestDb {
            cluster,
            name: name.to_owned(),
            client,
        }
    }

    /// The database's URL over TCP (for a service process).
    pub fn url(&self) -> String {
        self.cluster.url(&self.name)
    }

    /// Another connection to the same database.
    pub async fn connect(&self) -> Client {
        self.cluster.connect(&self.name).await.expect("connect")
    }

    /// `account.balance` of `account_id`, points.
    pub async fn balance(&self, account_id: &str) -> i64 {
        self.client
            .query_one(
                "SELECT balance FROM account WHERE account_id = $1",
                &[&account_id],
            )
            .await
            .expect("read balance")
            .get(0)
    }

    /// A single `bigint` from `sql` (no parameters).
    pub async fn scalar(&self, sql: &str) -> i64 {
        self.client
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// Row counts of `idem_request`, `ledger_txn` and `ledger_entry`: what a refused or
    /// failed request must leave alone.
    pub async fn recorded(&self) -> (i64, i64, i64) {
        (
            self.scalar("SELECT count(*) FROM idem_request").await,
            self.scalar("SELECT count(*) FROM ledger_txn").await,
            self.scalar("SELECT count(*) FROM ledger_entry").await,
        )
    }
}
