//! The load: N clients debiting random funded accounts for a fixed time (or, for the
//! ceiling, committing one-row inserts), a sampler of lock waits, and the reconciliation
//! afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use case_kit::{ChaCha8Rng, seeded_rng};
use launch::service::{Service, ServiceOptions};
use points_ledger::batcher::{BatchLimits, BatchSizes, Batcher, FixedConnections};
use points_ledger::onetrip::{PreparedOnetripCall, transfer_onetrip_prepared};
use points_ledger::striping::{create_redeem_stripes, striped_debit};
use points_ledger::{
    NoHooks, Outcome, TransferMode, TransferRequest, reconcile, transfer, transfer_in,
};
use rand::RngExt;
use scratch_pg::Cluster;
use serde::Serialize;
use tokio::sync::Barrier;
use tokio_postgres::types::Type;

use crate::cpu::{self, PerDebit};
use crate::http_client::DebitClient;

/// Points granted to each funded account: far more than a run can debit.
const FUNDING_POINTS: i64 = 1_000_000_000;
/// Debit amounts are drawn from this range, in points.
const AMOUNT_RANGE: std::ops::RangeInclusive<i64> = 1..=100;
/// How often the sampler reads `pg_stat_activity`, in milliseconds.
const SAMPLE_INTERVAL_MS: u64 = 50;
/// Connections used to fund the accounts.
const FUNDING_CONNECTIONS: usize = 8;
/// The funded template every measured database is cloned from.
const TEMPLATE: &str = "bench_template";

/// Per-request timeout of the service variant's HTTP clients, milliseconds.
const HTTP_TIMEOUT_MS: u64 = 10_000;
/// `--worker-threads` of the service variant's ledger-svc: one, a current-thread runtime.
/// On a machine whose few cores PostgreSQL, the load and the service share, a second
/// runtime thread costs more CPU per request in wakeups between threads than it gives
/// (measured on the 2-core development machine: about 200 µs of service CPU per debit
/// with one thread against 230 with two, at 8 clients).
const SERVICE_WORKER_THREADS: u16 = 1;
/// The client id of the service variant's debits (with `--auth`, the caller its token
/// authenticates).
const BENCH_CLIENT: &str = "bench";

/// The table the ceiling's clients insert into: one row per commit, no index.
const CEILING_TABLE_SQL: &str =
    "CREATE TABLE bench_commit (worker integer NOT NULL, n bigint NOT NULL)";
/// The ceiling's whole transaction: one row, one durable commit, one round trip.
const CEILING_INSERT_SQL: &str = "INSERT INTO bench_commit (worker, n) VALUES ($1, $2)";

/// A measured design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// Not a debit: the smallest durable write transaction (one-row INSERT in its own
    /// implicit transaction) from N connections, the rate of commits the cluster allows at
    /// that concurrency; every debit is at least one such commit.
    Ceiling,
    /// SPEC §3 transfer over database connections; every debit credits `sys-redeem`.
    Raw,
    /// The same debits through ledger-svc over HTTP (one keep-alive HTTP/1.1 connection
    /// per client, unique keys; the service with a pool of as many connections as
    /// clients and [`SERVICE_WORKER_THREADS`] runtime thread), still crediting
    /// `sys-redeem`.
    Service,
    /// The raw transfer with the sink striped (`points_ledger::striping`): no hot row.
    Fix,
    /// The same transfer in one round trip (`points_ledger::transfer_onetrip`), hot sink.
    #[value(name = "onetrip")]
    OneTrip,
    /// The one-trip transfer with the striped sink.
    #[serde(rename = "onetrip+fix")]
    #[value(name = "onetrip+fix")]
    OneTripFix,
    /// The batch transfer (`points_ledger::batch`): the clients submit to one
    /// `points_ledger::batcher::Batcher` whose drainers (the default count, each on its
    /// own connection) take what is queued in their lanes and execute it in one
    /// transaction; the sink striped over `BenchDb::batch_stripes` (by default one stripe
    /// per drainer's lane), each stripe updated once per batch.
    Batch,
    /// The same debits through ledger-svc `--transfer-mode batch` over HTTP (as
    /// [`Variant::Service`]), with `--redeem-stripes` set to the same stripes.
    #[serde(rename = "service+batch")]
    #[value(name = "service+batch")]
    ServiceBatch,
}

impl Variant {
    /// Every variant, in report order.
    pub const ALL: [Variant; 8] = [
        Variant::Ceiling,
        Variant::Raw,
        Variant::Service,
        Variant::Fix,
        Variant::OneTrip,
        Variant::OneTripFix,
        Variant::Batch,
        Variant::ServiceBatch,
    ];

    /// Name used in tables and the plot.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Ceiling => "ceiling",
            Variant::Raw => "raw",
            Variant::Service => "service",
            Variant::Fix => "fix",
            Variant::OneTrip => "onetrip",
            Variant::OneTripFix => "onetrip+fix",
            Variant::Batch => "batch",
            Variant::ServiceBatch => "service+batch",
        }
    }

    /// Name in the BENCH line and in database names (no `+`).
    pub fn key(self) -> &'static str {
        match self {
            Variant::OneTripFix => "onetripfix",
            Variant::ServiceBatch => "servicebatch",
            other => other.name(),
        }
    }

    /// Whether it measures debits (every variant but the ceiling).
    pub fn is_debit(self) -> bool {
        self != Variant::Ceiling
    }

    fn mode(self) -> TransferMode {
        match self {
            Variant::OneTrip | Variant::OneTripFix => TransferMode::OneTrip,
            _ => TransferMode::Statements,
        }
    }

    /// Whether it executes debits in batches (and so reports the batch sizes seen).
    pub fn is_batched(self) -> bool {
        matches!(self, Variant::Batch | Variant::ServiceBatch)
    }

    fn striped(self) -> bool {
        matches!(self, Variant::Fix | Variant::OneTripFix)
    }
}

/// How one client issues a debit (or the ceiling's commit).
enum Debitor {
    /// A database connection, with the one-trip call prepared on it in the one-trip
    /// variants (once per connection, as the batch variant's drainers prepare theirs).
    Sql(tokio_postgres::Client, Option<PreparedOnetripCall>),
    Http(DebitClient),
    Batch(Arc<Batcher>),
}

impl Debitor {
    /// One debit; `Ok(true)` when it committed OK, `Ok(false)` when refused. For the
    /// ceiling, one committed insert (`worker`, `n`).
    async fn debit(
        &mut self,
        variant: Variant,
        stripes: u32,
        (worker, n): (i32, i64),
        account: &str,
        amount: i64,
    ) -> anyhow::Result<bool> {
        let key = format!("{}-{worker}-{n}", variant.key());
        match self {
            Debitor::Sql(client, _) if variant == Variant::Ceiling => {
                client
                    .execute_typed(
                        CEILING_INSERT_SQL,
                        &[(&worker, Type::INT4), (&n, Type::INT8)],
                    )
                    .await?;
                Ok(true)
            }
            Debitor::Sql(client, prepared) => {
                let request = if variant.striped() {
                    striped_debit("bench", key, account, amount, stripes)
                } else {
                    TransferRequest::debit("bench", key, account, amount)
                };
                let done = match prepared {
                    Some(call) => {
                        transfer_onetrip_prepared(client, Some(call), &request, &NoHooks).await?
                    }
                    None => transfer_in(variant.mode(), client, &request, &NoHooks).await?,
                };
                Ok(done.outcome == Outcome::Ok)
            }
            Debitor::Batch(batcher) => {
                let request = striped_debit("bench", key, account, amount, stripes);
                let done = batcher.submit(request).await?;
                Ok(done.outcome == Outcome::Ok)
            }
            Debitor::Http(client) => match client.debit(account, &key, amount).await? {
                201 => Ok(true),
                409 => Ok(false),
                other => anyhow::bail!("status {other}"),
            },
        }
    }
}

/// One (variant, clients) point of one repetition.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// The design measured.
    pub variant: Variant,
    /// Concurrent clients.
    pub clients: usize,
    /// Which repetition (0-based).
    pub repetition: usize,
    /// Measured wall time in seconds.
    pub elapsed_s: f64,
    /// Debits that committed OK.
    pub ok: u64,
    /// Debits refused (INSUFFICIENT/NO_ACCOUNT; expected 0 with the funding used).
    pub refused: u64,
    /// Debits that failed with an error.
    pub errors: u64,
    /// OK debits per second (for the ceiling: commits per second).
    pub debits_per_s: f64,
    /// Median latency of a debit, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// Share of sampled active client backends waiting on a heavyweight lock
    /// (`pg_stat_activity.wait_event_type = 'Lock'`), 0..1.
    pub lock_wait_share: f64,
    /// CPU microseconds each part spent per committed debit (ceiling: per commit) in the
    /// measured seconds ([`crate::cpu`]).
    pub cpu: PerDebit,
    /// Batched variants: the batches executed in the measured seconds, their mean size
    /// and the size at or below which 99% of them were (requests per batch); else `None`.
    pub batch_sizes: Option<BatchFigures>,
    /// Whether the reconciliation afterwards found nothing (for the ceiling: whether the
    /// table holds exactly one row per acknowledged commit).
    pub reconciled_clean: bool,
    /// The reconciliation's one-line summary.
    pub findings: String,
}

/// The batch sizes of a measured window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BatchFigures {
    /// Batches executed.
    pub batches: u64,
    /// Mean requests per batch.
    pub mean: f64,
    /// 99th percentile of requests per batch (nearest rank).
    pub p99: usize,
}

impl BatchFigures {
    fn of(sizes: &BatchSizes) -> BatchFigures {
        BatchFigures {
            batches: sizes.batches(),
            mean: sizes.mean(),
            p99: sizes.p99(),
        }
    }
}

/// The cluster and its funded template.
pub struct BenchDb {
    cluster: Cluster,
    accounts: Vec<String>,
    stripes: u32,
    /// How the batched variants form batches (the library batcher's limits, and
    /// ledger-svc's `--batch-max-requests`/`--batch-drainers`).
    pub batch_limits: BatchLimits,
    /// Redemption stripes the batched variants' debits credit (1: the one `sys-redeem`;
    /// more: one lane of the batcher per stripe, `points_ledger::batcher::lane_of`).
    pub batch_stripes: u32,
}

impl BenchDb {
    /// Creates the template: schema, seeded accounts, the stripes, and `accounts` funded
    /// accounts `bench-0001` … granted [`FUNDING_POINTS`] each through the ledger.
    ///
    /// Errors: SQL or ledger errors.
    pub async fn prepare(cluster: Cluster, accounts: u32, stripes: u32) -> anyhow::Result<BenchDb> {
        cluster.create_database(TEMPLATE, None).await?;
        let names: Vec<String> = (1..=accounts).map(|n| format!("bench-{n:04}")).collect();
        {
            let client = cluster.connect(TEMPLATE).await?;
            points_ledger::schema::install(&client).await?;
            points_ledger::schema::seed(&client).await?;
            create_redeem_stripes(&client, stripes).await?;
            client.batch_execute(CEILING_TABLE_SQL).await?;
            client
                .execute(
                    "INSERT INTO account (account_id) SELECT unnest($1::text[])",
                    &[&names],
                )
                .await?;
        }
        let mut funders = Vec::new();
        for part in names.chunks(names.len().div_ceil(FUNDING_CONNECTIONS).max(1)) {
            let mut client = cluster.connect(TEMPLATE).await?;
            let part = part.to_vec();
            funders.push(tokio::spawn(async move {
                for account in part {
                    let request = TransferRequest::grant(
                        "bench-setup",
                        format!("fund-{account}"),
                        &account,
                        FUNDING_POINTS,
                    );
                    transfer(&mut client, &request, &NoHooks).await?;
                }
                anyhow::Ok(())
            }));
        }
        for funder in funders {
            funder.await??;
        }
        let admin = cluster.connect("postgres").await?;
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {TEMPLATE} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
            ))
            .await?;
        Ok(BenchDb {
            cluster,
            accounts: names,
            stripes,
            batch_limits: BatchLimits::default(),
            batch_stripes: 1,
        })
    }

    /// Runs `clients` clients of `variant` on a fresh copy of the template, first all
    /// together for `warmup` unmeasured (their debits commit and are reconciled with the
    /// rest), then for `duration` measured; then reconciles the copy and drops it.
    /// `repetition` only labels the result and the random draws.
    ///
    /// Errors: setup, SQL or reconciliation errors (a debit's own error is counted).
    // Long: one point from setup to teardown (copy, service or batcher, clients, load,
    // verdict, drop) reads best in order; each step is already a call of its own.
    pub async fn measure(
        &self,
        variant: Variant,
        clients: usize,
        repetition: usize,
        (warmup, duration): (Duration, Duration),
        seed: u64,
    ) -> anyhow::Result<Measurement> {
        let database = format!("bench_{}_{clients}", variant.key());
        let admin = self.fresh_copy(&database).await?;
        let service = self.launch_service(variant, &database, clients).await?;
        let batcher = self.start_batcher(variant, &database).await?;
        let point = Point {
            variant,
            clients,
            repetition,
            warmup,
            duration,
            seed,
            database: &database,
            accounts: Arc::new(self.accounts.clone()),
        };
        let barrier = Arc::new(Barrier::new(clients + 1));
        let warm_barrier = Arc::new(Barrier::new(clients + 1));
        let mut workers = Vec::new();
        for worker in 0..clients {
            let barriers = (warm_barrier.clone(), barrier.clone());
            workers.push(
                self.spawn_client(
                    &point,
                    worker,
                    (service.as_ref(), batcher.as_ref()),
                    barriers,
                )
                .await?,
            );
        }
        let load = self
            .drive(
                &point,
                (service.as_ref(), batcher.as_ref()),
                (&warm_barrier, &barrier),
                workers,
            )
            .await?;
        drop(batcher);
        if let Some(service) = service {
            service.stop().await?;
        }

        let (reconciled_clean, findings) = self.verdict(&point, &load.total).await?;
        admin
            .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
            .await?;
        let Load {
            total,
            elapsed_s,
            lock_wait_share,
            cpu,
            batch_sizes,
        } = load;
        let mut latencies = total.latencies_us;
        latencies.sort_unstable();
        Ok(Measurement {
            variant,
            clients,
            repetition,
            elapsed_s,
            ok: total.ok,
            refused: total.refused,
            errors: total.errors,
            debits_per_s: total.ok as f64 / elapsed_s,
            p50_ms: percentile_ms(&latencies, 0.50),
            p99_ms: percentile_ms(&latencies, 0.99),
            lock_wait_share,
            cpu,
            batch_sizes,
            reconciled_clean,
            findings,
        })
    }

    /// For [`Variant::Batch`], a batcher on `database` with [`BenchDb::batch_limits`]
    /// and one connection per drainer; else `None`.
    ///
    /// Errors: a connection failed.
    async fn start_batcher(
        &self,
        variant: Variant,
        database: &str,
    ) -> anyhow::Result<Option<Arc<Batcher>>> {
        if variant != Variant::Batch {
            return Ok(None);
        }
        let limits = self.batch_limits;
        let mut connections = Vec::new();
        for _ in 0..limits.drainers {
            connections.push(self.cluster.connect(database).await?);
        }
        // The call prepared once per drainer connection (connections of their own).
        let source = Box::new(FixedConnections::prepared(connections));
        Ok(Some(Arc::new(Batcher::start(
            source,
            Arc::new(NoHooks),
            limits,
        ))))
    }

    /// Creates `database` afresh from the template and checkpoints; returns the admin
    /// connection (to `postgres`) that later drops it.
    ///
    /// Errors: SQL errors.
    async fn fresh_copy(&self, database: &str) -> anyhow::Result<tokio_postgres::Client> {
        let admin = self.cluster.connect("postgres").await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {database} TEMPLATE {TEMPLATE}"))
            .await?;
        // Every point starts just after a checkpoint: none falls inside its few seconds
        // (the next timed one is checkpoint_timeout, 5 min, away; docs, 30.5 "WAL
        // Configuration"), and each starts with the same full-page-write state.
        admin.batch_execute("CHECKPOINT").await?;
        Ok(admin)
    }

    /// For [`Variant::Service`], a ledger-svc on `database` with a pool of `clients`
    /// connections and [`SERVICE_WORKER_THREADS`] runtime thread; else `None`.
    ///
    /// Errors: the service did not start.
    async fn launch_service(
        &self,
        variant: Variant,
        database: &str,
        clients: usize,
    ) -> anyhow::Result<Option<Service>> {
        let mut extra_args = vec![
            "--worker-threads".to_owned(),
            SERVICE_WORKER_THREADS.to_string(),
        ];
        if variant == Variant::ServiceBatch {
            extra_args.extend([
                "--transfer-mode".to_owned(),
                "batch".to_owned(),
                "--batch-max-requests".to_owned(),
                self.batch_limits.max_requests.to_string(),
                "--batch-drainers".to_owned(),
                self.batch_limits.drainers.to_string(),
                "--redeem-stripes".to_owned(),
                self.batch_stripes.to_string(),
            ]);
        }
        Ok(match variant {
            Variant::Service | Variant::ServiceBatch => Some(
                Service::launch(
                    &self.cluster.url(database),
                    self.cluster
                        .dir()
                        .join(format!("ledger-svc-{database}.log")),
                    ServiceOptions {
                        pool_size: clients,
                        clients: vec![BENCH_CLIENT.into()],
                        extra_args,
                        ..ServiceOptions::default()
                    },
                )
                .await?,
            ),
            _ => None,
        })
    }

    /// Opens load client `worker` of `point` (an HTTP client of `service`, else a database
    /// connection) and starts it: it waits at the first of `barriers` (warm-up), debits
    /// unmeasured for the warm-up, waits at the second, debits measured for the duration,
    /// and returns its tally and itself (still open).
    ///
    /// Errors: the connection failed.
    async fn spawn_client(
        &self,
        point: &Point<'_>,
        worker: usize,
        (service, batcher): (Option<&Service>, Option<&Arc<Batcher>>),
        (warm_barrier, barrier): (Arc<Barrier>, Arc<Barrier>),
    ) -> anyhow::Result<tokio::task::JoinHandle<(Tally, Client)>> {
        let debitor = match (service, batcher) {
            (Some(service), _) => Debitor::Http(DebitClient::new(
                service.public_addr(),
                BENCH_CLIENT,
                service.token(BENCH_CLIENT),
                Duration::from_millis(HTTP_TIMEOUT_MS),
            )),
            (None, Some(batcher)) => Debitor::Batch(batcher.clone()),
            (None, None) => {
                let client = self.cluster.connect(point.database).await?;
                let prepared = match point.variant.mode() {
                    TransferMode::OneTrip => Some(PreparedOnetripCall::prepare(&client).await?),
                    _ => None,
                };
                Debitor::Sql(client, prepared)
            }
        };
        let rng: ChaCha8Rng = seeded_rng(
            point.seed,
            &format!(
                "{}-{}-{worker}-{}",
                point.variant.key(),
                point.clients,
                point.repetition
            ),
        );
        let mut client = Client {
            debitor,
            rng,
            accounts: point.accounts.clone(),
            variant: point.variant,
            stripes: if point.variant.is_batched() {
                self.batch_stripes
            } else {
                self.stripes
            },
            worker: worker as i32,
            n: 0,
        };
        let (warmup, duration) = (point.warmup, point.duration);
        Ok(tokio::spawn(async move {
            let mut tally = Tally::default();
            // Warm-up: every client at once, so the service's pool fills and each
            // backend's caches are warm before the clock starts.
            warm_barrier.wait().await;
            client.run(&mut tally, Instant::now() + warmup, false).await;
            barrier.wait().await;
            client
                .run(&mut tally, Instant::now() + duration, true)
                .await;
            // The client goes back open: its backend must still be there when the
            // CPU counters are read again.
            (tally, client)
        }))
    }

    /// Releases the started `workers` into the warm-up and then the measured seconds
    /// (the two `barriers`), samples lock waits and CPU meanwhile, and collects their
    /// tallies.
    ///
    /// Errors: the sampler's connection or query failed, or a worker panicked.
    async fn drive(
        &self,
        point: &Point<'_>,
        (service, batcher): (Option<&Service>, Option<&Arc<Batcher>>),
        (warm_barrier, barrier): (&Barrier, &Barrier),
        workers: Vec<tokio::task::JoinHandle<(Tally, Client)>>,
    ) -> anyhow::Result<Load> {
        let sampler_client = self.cluster.connect("postgres").await?;
        warm_barrier.wait().await;
        let service_pid = service.and_then(|service| service.pid());
        let postmaster_pid = self.cluster.postmaster_pid();
        barrier.wait().await;
        let started = Instant::now();
        let cpu_before = cpu::Sample::take(service_pid, postmaster_pid);
        let sizes_before = batch_sizes(service, batcher).await?;
        let lock_wait_share =
            sample_lock_waits(&sampler_client, point.database, point.duration).await?;
        let mut total = Tally::default();
        let mut clients_done = Vec::with_capacity(point.clients);
        for worker in workers {
            let (tally, client) = worker.await?;
            total.merge(tally);
            clients_done.push(client);
        }
        let elapsed_s = started.elapsed().as_secs_f64();
        let cpu = cpu_before.per_debit(&cpu::Sample::take(service_pid, postmaster_pid), total.ok);
        let sizes_after = batch_sizes(service, batcher).await?;
        drop(clients_done);
        let batch_sizes = match (point.variant.is_batched(), sizes_before, sizes_after) {
            (true, Some(before), Some(after)) => Some(BatchFigures::of(&after.since(&before))),
            _ => None,
        };
        Ok(Load {
            total,
            elapsed_s,
            lock_wait_share,
            cpu,
            batch_sizes,
        })
    }

    /// Whether the point's database is clean afterwards, with a one-line summary: for the
    /// ceiling, one row per acknowledged commit (warm-up included); else the ledger's
    /// reconciliation.
    ///
    /// Errors: SQL or reconciliation errors.
    async fn verdict(&self, point: &Point<'_>, total: &Tally) -> anyhow::Result<(bool, String)> {
        let mut client = self.cluster.connect(point.database).await?;
        Ok(if point.variant == Variant::Ceiling {
            let rows: i64 = client
                .query_one("SELECT count(*) FROM bench_commit", &[])
                .await?
                .get(0);
            let acknowledged = total.warm_ok + total.ok;
            let clean = rows == acknowledged as i64;
            (
                clean,
                format!("{rows} rows for {acknowledged} acknowledged commits"),
            )
        } else {
            let findings = reconcile(&mut client).await?;
            (findings.is_clean(), findings.summary())
        })
    }
}

/// One (variant, clients) point of one repetition while it is measured.
struct Point<'a> {
    variant: Variant,
    clients: usize,
    repetition: usize,
    /// Unmeasured load before the measured seconds.
    warmup: Duration,
    /// Measured load.
    duration: Duration,
    /// The run's seed, for the clients' random draws.
    seed: u64,
    /// The point's copy of the template.
    database: &'a str,
    /// The funded accounts, shared by the clients.
    accounts: Arc<Vec<String>>,
}

/// What the measured seconds of one point gave.
struct Load {
    /// Every client's tally, merged.
    total: Tally,
    /// Measured wall time in seconds.
    elapsed_s: f64,
    /// Share of sampled active backends waiting on a lock, 0..1.
    lock_wait_share: f64,
    /// CPU per committed debit (or commit).
    cpu: PerDebit,
    /// The batch sizes of the measured seconds (batched variants).
    batch_sizes: Option<BatchFigures>,
}

/// The batch sizes seen so far: the library batcher's, or the service's (`GET /batch`
/// on its admin listener); `None` without either.
///
/// Errors: the service's answer could not be read.
async fn batch_sizes(
    service: Option<&Service>,
    batcher: Option<&Arc<Batcher>>,
) -> anyhow::Result<Option<BatchSizes>> {
    if let Some(batcher) = batcher {
        return Ok(Some(batcher.sizes()));
    }
    let Some(service) = service else {
        return Ok(None);
    };
    let reply = service
        .send(service.http().get(service.admin_url("/batch")))
        .await?;
    let counts = reply.body["sizes"]
        .as_array()
        .map(|sizes| sizes.iter().map(|n| n.as_u64().unwrap_or(0)).collect())
        .unwrap_or_default();
    Ok(Some(BatchSizes { counts }))
}

/// One load client: its connection, its random draws, and its next key number.
struct Client {
    debitor: Debitor,
    rng: ChaCha8Rng,
    accounts: Arc<Vec<String>>,
    variant: Variant,
    stripes: u32,
    worker: i32,
    /// The next debit's number (keys and ceiling rows stay unique across warm-up and
    /// measurement).
    n: i64,
}

impl Client {
    /// Debits back to back until `deadline`; counted in `tally` when `measured`, else only
    /// as warm-up commits.
    async fn run(&mut self, tally: &mut Tally, deadline: Instant, measured: bool) {
        while Instant::now() < deadline {
            let account = &self.accounts[self.rng.random_range(0..self.accounts.len())];
            let amount = self.rng.random_range(AMOUNT_RANGE);
            let began = Instant::now();
            let result = self
                .debitor
                .debit(
                    self.variant,
                    self.stripes,
                    (self.worker, self.n),
                    account,
                    amount,
                )
                .await;
            self.n += 1;
            if !measured {
                tally.warm_ok += u64::from(matches!(result, Ok(true)));
                continue;
            }
            tally.latencies_us.push(began.elapsed().as_micros() as u32);
            match result {
                Ok(true) => tally.ok += 1,
                Ok(false) => tally.refused += 1,
                Err(_) => tally.errors += 1,
            }
        }
    }
}

#[derive(Default)]
struct Tally {
    /// Debits (or commits) that committed OK during the warm-up (not measured).
    warm_ok: u64,
    ok: u64,
    refused: u64,
    errors: u64,
    latencies_us: Vec<u32>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.warm_ok += other.warm_ok;
        self.ok += other.ok;
        self.refused += other.refused;
        self.errors += other.errors;
        self.latencies_us.extend(other.latencies_us);
    }
}

/// Nearest-rank percentile of sorted microsecond latencies, in milliseconds.
fn percentile_ms(sorted_us: &[u32], quantile: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((quantile * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    sorted_us[rank - 1] as f64 / 1000.0
}

/// Samples `pg_stat_activity` every [`SAMPLE_INTERVAL_MS`] for `duration`: the share of
/// active client backends of `database` waiting on a lock (docs, 27.2.3
/// "pg_stat_activity", wait_event_type `Lock`).
async fn sample_lock_waits(
    client: &tokio_postgres::Client,
    database: &str,
    duration: Duration,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + duration;
    let (mut waiting, mut active) = (0i64, 0i64);
    let mut interval = tokio::time::interval(Duration::from_millis(SAMPLE_INTERVAL_MS));
    while Instant::now() < deadline {
        interval.tick().await;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) \
                 FROM pg_stat_activity \
                 WHERE datname = $1 AND backend_type = 'client backend' AND state = 'active'",
                &[&database],
            )
            .await?;
        waiting += row.get::<_, i64>(0);
        active += row.get::<_, i64>(1);
    }
    Ok(if active == 0 {
        0.0
    } else {
        waiting as f64 / active as f64
    })
}

#[cfg(test)]
mod tests {
    use super::percentile_ms;

    #[test]
    fn nearest_rank_percentiles() {
        let sorted: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
        assert_eq!(percentile_ms(&sorted, 0.50), 50.0);
        assert_eq!(percentile_ms(&sorted, 0.99), 99.0);
        assert_eq!(percentile_ms(&[], 0.5), 0.0);
    }
}
