//! The points ledger on a forgetful disk, for P1 and P2's file (`spec_cluster.rs`'s
//! `install-ledger`, `debit-load`, `power-cut`, `amcheck`): a cluster on the disk with
//! the ledger's schema and seeds, 32 clients debiting through `ledger-svc` until a
//! number of acknowledgements is seen, the power cut at that moment (never after a
//! measured time), and the checks after recovery: acknowledged debits present, unknown
//! ones resolved once by a same-key retry, reconciliation, `amcheck`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use case_kit::Ctx;
use cases_ledger::queries::txns_for_key;
use launch::power::{PowerCluster, PowerCut};
use launch::service::{Auth, Service, ServiceOptions};
use tokio::sync::Notify;
use tokio_postgres::Client;

/// The database the P cases create on their own cluster.
pub const DATABASE: &str = "ledger";
/// The client id of every debit (`X-Client-Id`).
pub const CLIENT_ID: &str = "app-p";
/// Points granted to each test account before the load (never exhausted: no debit is
/// refused for want of points).
pub const GRANT: i64 = 1_000_000;
/// Points per debit.
pub const DEBIT: i64 = 1;
/// Clients debiting at once.
pub const CLIENTS: usize = 32;
/// Acknowledged debits seen before the power is cut.
pub const ACKNOWLEDGED_BEFORE_CUT: usize = 96;
/// Per-request timeout of a debit during the load, milliseconds (a hang bound only).
pub const DEBIT_TIMEOUT_MS: u64 = 10_000;

/// Starts a cluster on a forgetful disk in the case's folder with `settings`, installs
/// the ledger ([`install`]), then checkpoints and writes everything back (the setup is
/// durable; the load after it is what a cut tests).
///
/// Errors: the mount, the cluster or the SQL fail.
pub async fn ledger_cluster(
    ctx: &Ctx,
    settings: &[(&str, &str)],
    initdb_args: &[&str],
) -> anyhow::Result<PowerCluster> {
    let power = PowerCluster::start(&ctx.work_dir()?, settings, initdb_args).await?;
    power.cluster.create_database(DATABASE, None).await?;
    let mut client = power.cluster.connect(DATABASE).await?;
    install(&mut client).await?;
    client.batch_execute("CHECKPOINT").await?;
    power.disk.sync_all()?;
    Ok(power)
}

/// Installs the ledger's schema and seeds on `client`'s database and grants [`GRANT`]
/// to each test account; returns how many accounts were granted.
///
/// Errors: the SQL fails.
pub async fn install(client: &mut Client) -> anyhow::Result<u32> {
    points_ledger::schema::install(client).await?;
    points_ledger::schema::seed(client).await?;
    for n in 1..=points_ledger::TEST_ACCOUNT_COUNT {
        let account = points_ledger::test_account(n);
        points_ledger::grant(client, "ops", &format!("grant-{n}"), &account, GRANT).await?;
    }
    Ok(points_ledger::TEST_ACCOUNT_COUNT)
}

/// Starts `ledger-svc` on the cluster's ledger database (no authentication: the P cases
/// are about durability), its log `<case>-<name>.log`.
///
/// Errors: as `Service::launch`.
pub async fn service(ctx: &Ctx, power: &PowerCluster, name: &str) -> anyhow::Result<Service> {
    service_on(power, DATABASE, ctx.log_file(name)?).await
}

/// Starts `ledger-svc` on `database` of the cluster (no authentication, a pool of 8),
/// its log at `log`.
///
/// Errors: as `Service::launch`.
pub async fn service_on(
    power: &PowerCluster,
    database: &str,
    log: std::path::PathBuf,
) -> anyhow::Result<Service> {
    let options = ServiceOptions {
        auth: Auth::Off,
        pool_size: 8,
        ..ServiceOptions::default()
    };
    Service::launch(&power.cluster.url(database), log, options).await
}

/// What the clients saw.
#[derive(Debug, Default)]
pub struct Load {
    /// Keys answered 201.
    pub acknowledged: Vec<String>,
    /// Keys without an answer (the connection broke at the cut): unknown.
    pub unknown: Vec<String>,
    /// Keys refused (4xx): none expected.
    pub refused: Vec<String>,
}

/// One client's loop: debits with keys `p-c<client>-<n>` until it sees no answer (the
/// cut) or `stop`; counts acknowledgements into `acknowledged` and wakes `seen`.
async fn client_loop(
    http: reqwest::Client,
    url: String,
    client: usize,
    shared: Arc<(AtomicUsize, Notify, AtomicBool)>,
) -> Load {
    let mut load = Load::default();
    let account = points_ledger::test_account((client % 10) as u32 + 1);
    for n in 0.. {
        if shared.2.load(Ordering::SeqCst) {
            break;
        }
        let key = format!("p-c{client:02}-{n:04}");
        let sent = http
            .post(format!("{url}/accounts/{account}/debits"))
            .header("x-client-id", CLIENT_ID)
            .header("idempotency-key", &key)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("amount={DEBIT}"))
            .timeout(Duration::from_millis(DEBIT_TIMEOUT_MS))
            .send()
            .await;
        match sent.map(|response| response.status().as_u16()) {
            Ok(201) => {
                load.acknowledged.push(key);
                shared.0.fetch_add(1, Ordering::SeqCst);
                shared.1.notify_one();
            }
            Ok(status) if (400..500).contains(&status) => load.refused.push(key),
            _ => {
                load.unknown.push(key);
                break;
            }
        }
    }
    load
}

/// [`CLIENTS`] clients debit through `service` until [`ACKNOWLEDGED_BEFORE_CUT`]
/// acknowledgements are seen; then the power is cut ([`cut_under_load`]).
///
/// Errors: as [`cut_under_load`].
pub async fn load_then_cut(
    power: &mut PowerCluster,
    service: Service,
    tear: Option<&forgetful_fs::Tear>,
) -> anyhow::Result<(Load, PowerCut)> {
    let running = RunningLoad::start(&service, CLIENTS);
    running.wait_acknowledged(ACKNOWLEDGED_BEFORE_CUT).await;
    cut_under_load(power, service, running, tear).await
}

/// Clients debiting through a service, until a cut stops them.
pub struct RunningLoad {
    /// Acknowledgements seen, their wake-up, and the flag that stops the clients.
    shared: Arc<(AtomicUsize, Notify, AtomicBool)>,
    tasks: Vec<tokio::task::JoinHandle<Load>>,
}

impl RunningLoad {
    /// `clients` clients debit through `service`, each with keys `p-c<client>-<n>`,
    /// until it sees no answer (the cut) or the load is stopped.
    pub fn start(service: &Service, clients: usize) -> RunningLoad {
        let shared = Arc::new((AtomicUsize::new(0), Notify::new(), AtomicBool::new(false)));
        let url = service.public_url("");
        let tasks = (0..clients)
            .map(|client| {
                let (http, url) = (service.http().clone(), url.clone());
                tokio::spawn(client_loop(http, url, client, shared.clone()))
            })
            .collect();
        RunningLoad { shared, tasks }
    }

    /// Returns once `acknowledged` debits were answered 201 (the count decides, not
    /// the clock), or once [`DEBIT_TIMEOUT_MS`] passed without a new one (a hang bound
    /// only: the load stalled); returns the count seen then.
    pub async fn wait_acknowledged(&self, acknowledged: usize) -> usize {
        let seen = || self.shared.0.load(Ordering::SeqCst);
        while seen() < acknowledged {
            let woken = self.shared.1.notified();
            if seen() >= acknowledged {
                break;
            }
            let bound = Duration::from_millis(DEBIT_TIMEOUT_MS);
            if tokio::time::timeout(bound, woken).await.is_err() {
                break;
            }
        }
        seen()
    }

    /// Stops the clients and returns what they saw, all together.
    ///
    /// Errors: a client task panicked.
    pub async fn stop(self) -> anyhow::Result<Load> {
        self.shared.2.store(true, Ordering::SeqCst);
        let mut load = Load::default();
        for task in self.tasks {
            let one = task.await?;
            load.acknowledged.extend(one.acknowledged);
            load.unknown.extend(one.unknown);
            load.refused.extend(one.refused);
        }
        Ok(load)
    }
}

/// The power cut under load: SIGKILL of the service and of every postgres process,
/// the clients stopped (a debit in flight has no answer: unknown), the disk's unsynced
/// data dropped (`tear`'s file's last write torn), the cluster started again (crash
/// recovery; a failure is reported in the cut, not as an error).
///
/// Errors: a client task panicked; the service could not be killed.
pub async fn cut_under_load(
    power: &mut PowerCluster,
    service: Service,
    running: RunningLoad,
    tear: Option<&forgetful_fs::Tear>,
) -> anyhow::Result<(Load, PowerCut)> {
    service.kill()?;
    let killed = power.kill_all().await?;
    let load = running.stop().await?;
    let dropped = power.disk.cut(tear);
    let recovery = power.start_after_crash().await?;
    Ok((
        load,
        PowerCut {
            killed: killed + 1,
            dropped,
            recovery,
        },
    ))
}

/// Longest wait to see debits waiting on the held row, or unsynced bytes on the disk,
/// milliseconds (a hang bound only: what decides is what is seen).
pub const SEEN_LIMIT_MS: u64 = 10_000;
/// Interval of those polls, milliseconds.
const POLL_MS: u64 = 10;

/// Holds `account`'s row (`SELECT … FOR UPDATE` in an open transaction) on a connection
/// of its own, so that every debit of it waits at its balance update; the lock lasts
/// until the connection ends (the cut ends it).
///
/// Errors: connecting or the SQL fails.
pub async fn hold_account(power: &PowerCluster, account: &str) -> anyhow::Result<Client> {
    let holder = power.cluster.connect(DATABASE).await?;
    holder.batch_execute("BEGIN").await?;
    holder
        .execute(
            "SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE",
            &[&account],
        )
        .await?;
    Ok(holder)
}

/// Sessions of the ledger database seen waiting on a lock (`pg_stat_activity`,
/// `wait_event_type = 'Lock'`): polls until at least `want` are, within
/// [`SEEN_LIMIT_MS`]; returns the count seen last (fewer than `want` when the bound
/// passed).
///
/// Errors: SQL errors.
pub async fn debits_seen_waiting(power: &PowerCluster, want: usize) -> anyhow::Result<usize> {
    let observer = power.cluster.connect(DATABASE).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(SEEN_LIMIT_MS);
    loop {
        let row = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&DATABASE],
            )
            .await?;
        let seen = row.get::<_, i64>(0) as usize;
        if seen >= want || tokio::time::Instant::now() >= deadline {
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Bytes the disk holds unsynced: polls until at least 1, within [`SEEN_LIMIT_MS`];
/// returns the count seen last (0 when the bound passed).
pub async fn unsynced_seen(power: &PowerCluster) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(SEEN_LIMIT_MS);
    loop {
        let bytes = power.disk.unsynced().bytes;
        if bytes >= 1 || tokio::time::Instant::now() >= deadline {
            return bytes;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// The acknowledged keys with no transaction after recovery, in key order.
///
/// Errors: SQL errors.
pub async fn lost_keys(client: &Client, load: &Load) -> anyhow::Result<Vec<String>> {
    let mut lost = Vec::new();
    for key in &load.acknowledged {
        if txns_for_key(client, CLIENT_ID, key).await? == 0 {
            lost.push(key.clone());
        }
    }
    lost.sort();
    Ok(lost)
}

/// `bt_index_check` on every B-tree index of the database (catalogs included); returns
/// the number checked and the failures (`index: error`).
///
/// Errors: the extension cannot be created or the index list cannot be read.
pub async fn amcheck(client: &Client) -> anyhow::Result<(usize, Vec<String>)> {
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        .await?;
    let rows = client
        .query(
            "SELECT c.oid::regclass::text FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam \
             WHERE a.amname = 'btree' AND c.relpersistence = 'p' AND i.indisready AND i.indisvalid \
             ORDER BY 1",
            &[],
        )
        .await?;
    let mut failures = Vec::new();
    for row in &rows {
        let index: String = row.get(0);
        if let Err(error) = client
            .execute("SELECT bt_index_check($1::text::regclass)", &[&index])
            .await
        {
            failures.push(format!(
                "{index}: {}",
                error
                    .as_db_error()
                    .map_or_else(|| error.to_string(), |db| db.message().to_string())
            ));
        }
    }
    Ok((rows.len(), failures))
}

/// Retries every unknown key once through `service` with the same key; returns the keys
/// that do not have exactly one transaction afterwards.
///
/// Errors: SQL errors.
pub async fn resolve_unknown(
    service: &Service,
    client: &Client,
    load: &Load,
) -> anyhow::Result<Vec<String>> {
    let mut wrong = Vec::new();
    for key in &load.unknown {
        let client_number: usize = key[3..5].parse().unwrap_or(0);
        let account = points_ledger::test_account((client_number % 10) as u32 + 1);
        let request = service
            .http()
            .post(service.public_url(&format!("/accounts/{account}/debits")))
            .header("x-client-id", CLIENT_ID)
            .header("idempotency-key", key)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("amount={DEBIT}"));
        let status = service
            .send(request)
            .await
            .map_or_else(|error| error.to_string(), |reply| reply.status.to_string());
        if status != "201" || txns_for_key(client, CLIENT_ID, key).await? != 1 {
            wrong.push(format!("{key}: {status}"));
        }
    }
    Ok(wrong)
}
