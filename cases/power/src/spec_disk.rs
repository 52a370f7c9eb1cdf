//! One P case file's disk and what runs on it, shared by the cluster engine's calls
//! ([`crate::spec_cluster`]) and the ledger's ([`crate::spec_ledger`]).

use std::collections::HashMap;
use std::path::PathBuf;

use launch::power::PowerCluster;
use tokio_postgres::Client;

/// One case's cluster and what runs on it (fields drop in order: the load's service
/// and clients, then the cluster, then the disk).
pub(crate) struct DiskState {
    /// `<case>-work`: `disk/`, `mnt/`, `trash/`, `pg/`.
    pub(crate) work: PathBuf,
    /// The case's log files: `recovery` (the server's log when a cut's recovery
    /// fails), `ledger-svc` (the load's service), `client-outcomes` (every key the
    /// load's clients sent and what they saw).
    pub(crate) logs: HashMap<&'static str, PathBuf>,
    /// The database `cluster` made, which sessions and the expectations use.
    pub(crate) database: String,
    /// Bumped at every cut: a connection opened before it is gone.
    pub(crate) generation: u64,
    /// The load's service and clients, from `debit-load` to the cut.
    pub(crate) load: Option<(launch::service::Service, crate::ledger::RunningLoad)>,
    /// What the load's clients saw, from the cut on.
    pub(crate) seen: Option<crate::ledger::Load>,
    /// The cluster on its mounted disk, from `cluster` on.
    pub(crate) power: Option<PowerCluster>,
}

impl DiskState {
    pub(crate) fn power(&self) -> Result<&PowerCluster, String> {
        (self.power.as_ref()).ok_or_else(|| "no cluster: a `cluster` step starts one".into())
    }

    /// A log file of the case (`<case>-<name>.log`).
    pub(crate) fn log(&self, name: &str) -> Result<PathBuf, String> {
        let log = self.logs.get(name).cloned();
        log.ok_or_else(|| format!("the case has no {name} log"))
    }

    /// A new connection to the case's database.
    pub(crate) async fn connect(&self) -> Result<Client, String> {
        let power = self.power()?;
        let connected = power.cluster.connect(&self.database).await;
        connected.map_err(|e| format!("cannot connect: {e}"))
    }
}
