//! Counted figures: what one debit costs PostgreSQL, counted rather than timed, so that
//! two runs on a busy machine agree (docs/batch.md, "Counted figures").
//!
//! A second scratch cluster runs its server under `valgrind --tool=cachegrind` (every
//! backend is a forked child of the postmaster, so each writes its own count of executed
//! user-space instructions when it exits), without autovacuum and with no checkpoint
//! inside the counting (`checkpoint_timeout` an hour: no full-page images either). For
//! each counted variant, two sessions run on two fresh copies of one funded template: one
//! makes [`WARMUP_DEBITS`] debits, the other the same ones and then `measured` more; every
//! figure is the second's minus the first's, divided by the debits in between. So
//! connection start, catalog caches and plans made once per session cancel out, and what
//! is left is what the extra debits cost: instructions of every backend the session
//! used, WAL bytes (`pg_current_wal_insert_lsn`), commits (`pg_stat_database`), heap
//! tuples written (inserted plus updated), index entries inserted (a tuple inserted or
//! updated other than HOT adds one entry to each index of its table) and the share of
//! `idem_request`'s updates that were HOT (`pg_stat_user_tables`). The work is the same
//! in every run (a fixed seed draws the accounts and amounts), and the instruction counts
//! of two runs agree to far better than 1%.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use case_kit::{ChaCha8Rng, seeded_rng};
use launch::service::{Service, ServiceOptions};
use points_ledger::batch::{PreparedBatchCall, transfer_batch, transfer_batch_prepared};
use points_ledger::onetrip::{PreparedOnetripCall, transfer_onetrip_prepared};
use points_ledger::striping::{create_redeem_stripes, striped_debit};
use points_ledger::{NoHooks, TransferMode, TransferRequest, transfer_in};
use rand::RngExt;
use scratch_pg::{Cluster, ClusterOptions};
use serde::Serialize;
use tokio_postgres::types::Type;

use crate::http_client::DebitClient;

/// Debits every counted session makes before the measured ones (both sessions of a
/// variant make them; they cancel out).
pub const WARMUP_DEBITS: usize = 24;
/// Measured debits per counted variant by default (`--count-debits`): the second
/// session's extra debits, a multiple of every batch size counted.
pub const DEFAULT_COUNT_DEBITS: usize = 120;
/// The seed of the counted sessions' accounts and amounts: fixed, so that every run
/// counts the same work.
const COUNT_SEED: u64 = 51;
/// Debits per call of the batch counted by the BENCH line (`batch_insns_per_debit@12`).
pub const BATCH_COUNTED_SIZE: usize = 12;
/// The counted cluster's funded template.
const TEMPLATE: &str = "count_template";
/// Debits per grant call while funding the template.
const FUNDING_BATCH: usize = 64;
/// Points granted to each funded account.
const FUNDING_POINTS: i64 = 1_000_000_000;
/// How long a counted backend may take to exit after its connection closed, ms (it
/// writes its instruction count first; a bound on a hang, not a measurement).
const BACKEND_EXIT_TIMEOUT_MS: u64 = 60_000;
/// `--worker-threads` of the counted service (as in the timed bench).
const SERVICE_WORKER_THREADS: &str = "1";
/// The client id of the counted service's debits.
const SERVICE_CLIENT: &str = "bench";
/// Per-request timeout of the counted service's client, ms (under valgrind a debit takes
/// tens of milliseconds).
const SERVICE_TIMEOUT_MS: u64 = 60_000;
/// The ceiling's table and its one-row commit, as in the timed bench.
const CEILING_TABLE_SQL: &str =
    "CREATE TABLE bench_commit (worker integer NOT NULL, n bigint NOT NULL)";
const CEILING_INSERT_SQL: &str = "INSERT INTO bench_commit (worker, n) VALUES ($1, $2)";
/// The schema's floor: the rows a batch writes, nothing decided ([`floor.sql`]).
const FLOOR_FUNCTION_SQL: &str = include_str!("floor.sql");
/// The floor's call, with the batch call's arrays.
const FLOOR_CALL_SQL: &str = "SELECT bench_floor_batch($1, $2, $3, $4, $5, $6, $7, $8)";
/// The floor's parameter types: the batch call's eight arrays, without its attempts.
const FLOOR_CALL_TYPES: &[Type] = points_ledger::batch::BATCH_CALL_TYPES.split_at(8).0;
/// The figures a counted database's statistics give, read after its sessions ended.
const STATS_SQL: &str = "\
SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       coalesce(sum(s.n_tup_ins + s.n_tup_upd), 0)::bigint,
       coalesce(sum((s.n_tup_ins + s.n_tup_upd - s.n_tup_hot_upd)
                    * (SELECT count(*) FROM pg_index i WHERE i.indrelid = s.relid AND i.indpred IS NULL)), 0)::bigint,
       coalesce(sum(s.n_tup_upd) FILTER (WHERE s.relname = 'idem_request'), 0)::bigint,
       coalesce(sum(s.n_tup_hot_upd) FILTER (WHERE s.relname = 'idem_request'), 0)::bigint
FROM pg_stat_user_tables s";

/// How a counted variant makes its debits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// The ceiling's one-row commit (a "debit" is one commit).
    Ceiling,
    /// One debit per call by `transfer_in` in the mode, the sink striped or not.
    Single(TransferMode, bool),
    /// `ledger_transfer_batch` calls of this many debits (`transfer_batch`, pipelined).
    Batch(usize),
    /// The floor's calls of this many debits.
    Floor(usize),
    /// Debits through ledger-svc over HTTP, one at a time (pool of one connection), in the
    /// statement mode or the batch mode (then batches of one).
    Service(bool),
}

/// The counted variants, in report order: the timed bench's, each batch at 1 and at
/// [`BATCH_COUNTED_SIZE`] debits per call, and the floor at both.
const COUNTED: [(&str, Work); 11] = [
    ("ceiling", Work::Ceiling),
    ("raw", Work::Single(TransferMode::Statements, false)),
    ("service", Work::Service(false)),
    ("fix", Work::Single(TransferMode::Statements, true)),
    ("onetrip", Work::Single(TransferMode::OneTrip, false)),
    ("onetrip+fix", Work::Single(TransferMode::OneTrip, true)),
    ("batch@1", Work::Batch(1)),
    ("batch@12", Work::Batch(BATCH_COUNTED_SIZE)),
    ("service+batch@1", Work::Service(true)),
    ("floor@1", Work::Floor(1)),
    ("floor@12", Work::Floor(BATCH_COUNTED_SIZE)),
];

/// One counted variant's figures, each per measured debit (the ceiling: per commit).
#[derive(Debug, Clone, Serialize)]
pub struct Counted {
    /// `raw`, `batch@12` (debits per call after the `@`), `floor@12`, ….
    pub variant: String,
    /// Debits measured (the second session's extra ones).
    pub debits: usize,
    /// User-space instructions of PostgreSQL's backends (cachegrind's `Ir`); `None`
    /// without valgrind.
    pub insns_per_debit: Option<f64>,
    /// WAL bytes written.
    pub wal_bytes_per_debit: f64,
    /// Transactions committed.
    pub commits_per_debit: f64,
    /// Heap tuples written (inserted plus updated versions).
    pub heap_tuples_per_debit: f64,
    /// Index entries inserted (partial indexes not counted: the bench's debits carry no
    /// order id, the one partial index's column).
    pub index_entries_per_debit: f64,
    /// Share of `idem_request`'s updates that were HOT, 0..1 (`None` without updates).
    pub idem_hot_share: Option<f64>,
}

/// What one session cost, in totals.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    insns: u64,
    wal_bytes: i64,
    commits: i64,
    heap_tuples: i64,
    index_entries: i64,
    idem_updates: i64,
    idem_hot: i64,
}

/// The counting cluster (under cachegrind when valgrind is there) and its template.
pub struct CountDb {
    /// `None` only while dropped.
    cluster: Option<Cluster>,
    /// Where the backends write `cg.<pid>`; `None` without valgrind.
    counts_dir: Option<PathBuf>,
    accounts: Vec<String>,
    /// Stripes of the striped variants (`fix`, `onetrip+fix`) and of the batched ones.
    stripes: (u32, u32),
}

impl Drop for CountDb {
    fn drop(&mut self) {
        // The server first (its processes write their counts as they exit), then the
        // folder of counts.
        if let Some(cluster) = self.cluster.take() {
            drop(cluster);
        }
        if let Some(dir) = &self.counts_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `valgrind` on `PATH`, installed with apt-get when missing and we are root (as the
/// browser test installs Chromium); `None` when it cannot be had.
fn valgrind() -> Option<&'static str> {
    let found = || {
        std::process::Command::new("valgrind")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if found() {
        return Some("valgrind");
    }
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!(
            "bench: valgrind is not installed and we are not root: no instruction counts (apt-get install valgrind)"
        );
        return None;
    }
    let apt = |args: &[&str]| {
        std::process::Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !apt(&["install", "-y", "-q", "valgrind"]) {
        apt(&["update", "-q"]);
        apt(&["install", "-y", "-q", "valgrind"]);
    }
    found().then_some("valgrind")
}

/// The folder the backends write their counts into (any user may write there: the server
/// runs as another user when we are root); `None` without valgrind.
///
/// Errors: the folder could not be made.
fn counts_dir() -> anyhow::Result<Option<PathBuf>> {
    if valgrind().is_none() {
        return Ok(None);
    }
    let dir = std::env::temp_dir().join(format!("bench-counts-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))?;
    Ok(Some(dir))
}

/// The counting cluster's options: no autovacuum, no checkpoint within the hour, and the
/// server under cachegrind writing into `counts_dir` (when there is one).
fn cluster_options(counts_dir: Option<&Path>) -> ClusterOptions {
    ClusterOptions {
        settings: [
            ("autovacuum", "off"),
            ("checkpoint_timeout", "1h"),
            ("max_wal_size", "4GB"),
        ]
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .to_vec(),
        server_wrapper: counts_dir.map_or_else(Vec::new, |dir| {
            vec![
                "valgrind".to_owned(),
                "-q".to_owned(),
                "--tool=cachegrind".to_owned(),
                "--cache-sim=no".to_owned(),
                "--branch-sim=no".to_owned(),
                format!("--cachegrind-out-file={}/cg.%p", dir.display()),
            ]
        }),
        ..ClusterOptions::default()
    }
}

impl CountDb {
    /// The counting cluster.
    fn cluster(&self) -> &Cluster {
        self.cluster.as_ref().expect("present until dropped")
    }

    /// Starts the counting cluster and creates its template: the schema, the seeded
    /// accounts, `stripes.0.max(stripes.1)` stripes, the ceiling's table, the floor
    /// function and `accounts` funded accounts; then `extra` SQL, if any (a lever measured
    /// before it is made).
    ///
    /// Errors: the cluster did not start, or SQL errors.
    pub async fn prepare(
        accounts: u32,
        stripes: (u32, u32),
        extra: Option<&str>,
    ) -> anyhow::Result<CountDb> {
        let counts_dir = counts_dir()?;
        let options = cluster_options(counts_dir.as_deref());
        let cluster = tokio::task::spawn_blocking(|| Cluster::start(options))
            .await?
            .context("starting the counting cluster")?;
        cluster.create_database(TEMPLATE, None).await?;
        let names: Vec<String> = (1..=accounts).map(|n| format!("bench-{n:04}")).collect();
        let mut client = cluster.connect(TEMPLATE).await?;
        points_ledger::schema::install(&client).await?;
        points_ledger::schema::seed(&client).await?;
        create_redeem_stripes(&client, stripes.0.max(stripes.1)).await?;
        client.batch_execute(CEILING_TABLE_SQL).await?;
        client.batch_execute(FLOOR_FUNCTION_SQL).await?;
        if let Some(sql) = extra {
            client.batch_execute(sql).await?;
        }
        client
            .execute(
                "INSERT INTO account (account_id) SELECT unnest($1::text[])",
                &[&names],
            )
            .await?;
        for part in names.chunks(FUNDING_BATCH) {
            let grants: Vec<TransferRequest> = part
                .iter()
                .map(|a| {
                    TransferRequest::grant("bench-setup", format!("fund-{a}"), a, FUNDING_POINTS)
                })
                .collect();
            for answer in transfer_batch(&mut client, &grants, &NoHooks).await {
                answer?;
            }
        }
        drop(client);
        let admin = cluster.connect("postgres").await?;
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {TEMPLATE} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
            ))
            .await?;
        Ok(CountDb {
            cluster: Some(cluster),
            counts_dir,
            accounts: names,
            stripes,
        })
    }

    /// Counts every variant with `measured` debits (rounded up to a multiple of every
    /// batch size), in report order, printing a line for each.
    ///
    /// Errors: a session failed.
    pub async fn count_all(&self, measured: usize) -> anyhow::Result<Vec<Counted>> {
        let measured = measured.max(1).div_ceil(BATCH_COUNTED_SIZE) * BATCH_COUNTED_SIZE;
        let mut counted = Vec::new();
        for (name, work) in COUNTED {
            let base = self.session(name, work, WARMUP_DEBITS).await?;
            let more = self.session(name, work, WARMUP_DEBITS + measured).await?;
            let figures = figures(name, measured, &base, &more, self.counts_dir.is_some());
            println!("{}", line(&figures));
            counted.push(figures);
        }
        Ok(counted)
    }

    /// One session of `work` making `debits` debits on a fresh copy of the template; its
    /// totals once its backends have exited.
    ///
    /// Errors: SQL, service or file errors.
    async fn session(&self, name: &str, work: Work, debits: usize) -> anyhow::Result<Totals> {
        let database = format!("count_{}", name.replace(['+', '@'], "_"));
        let admin = self.cluster().connect("postgres").await?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {database} TEMPLATE {TEMPLATE}"))
            .await?;
        let lsn_before = wal_lsn(&admin).await?;
        let pids = self.run_work(&admin, &database, name, work, debits).await?;
        let insns = self.instructions_of(&pids).await?;
        let wal_bytes = wal_lsn(&admin).await? - lsn_before;
        let stats = self.cluster().connect(&database).await?;
        let row = stats.query_one(STATS_SQL, &[]).await?;
        drop(stats);
        admin
            .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
            .await?;
        Ok(Totals {
            insns,
            wal_bytes,
            commits: row.get(0),
            heap_tuples: row.get(1),
            index_entries: row.get(2),
            idem_updates: row.get(3),
            idem_hot: row.get(4),
        })
    }

    /// Makes `debits` debits of `work` on `database`; the pids of the backends that did
    /// (listed through `admin` just before their connections close).
    ///
    /// Errors: SQL, ledger or service errors.
    async fn run_work(
        &self,
        admin: &tokio_postgres::Client,
        database: &str,
        name: &str,
        work: Work,
        debits: usize,
    ) -> anyhow::Result<Vec<i32>> {
        let mut draws = Draws {
            rng: seeded_rng(COUNT_SEED, name),
            accounts: &self.accounts,
            stripes: self.stripes,
            n: 0,
        };
        if let Work::Service(batched) = work {
            return self
                .run_service(admin, database, batched, &mut draws, debits)
                .await;
        }
        let mut client = self.cluster().connect(database).await?;
        // The calls prepared once per connection, as in the timed bench.
        let batch_call = PreparedBatchCall::prepare(&client).await?;
        let onetrip_call = PreparedOnetripCall::prepare(&client).await?;
        let floor = client
            .prepare_typed(FLOOR_CALL_SQL, FLOOR_CALL_TYPES)
            .await?;
        let per_call = match work {
            Work::Batch(size) | Work::Floor(size) => size,
            _ => 1,
        };
        for _ in 0..debits.div_ceil(per_call) {
            match work {
                Work::Ceiling => {
                    let n = draws.next_n();
                    client
                        .execute_typed(CEILING_INSERT_SQL, &[(&0i32, Type::INT4), (&n, Type::INT8)])
                        .await?;
                }
                Work::Single(TransferMode::OneTrip, striped) => {
                    let request = draws.request(striped, false);
                    transfer_onetrip_prepared(&client, Some(&onetrip_call), &request, &NoHooks)
                        .await?;
                }
                Work::Single(mode, striped) => {
                    let request = draws.request(striped, false);
                    transfer_in(mode, &mut client, &request, &NoHooks).await?;
                }
                Work::Batch(size) => {
                    let requests: Vec<_> = (0..size).map(|_| draws.request(true, true)).collect();
                    let call = Some(&batch_call);
                    for answer in
                        transfer_batch_prepared(&mut client, call, &requests, &NoHooks).await
                    {
                        answer?;
                    }
                }
                Work::Floor(size) => {
                    let requests: Vec<_> = (0..size).map(|_| draws.request(true, true)).collect();
                    floor_call(&client, &floor, &requests).await?;
                }
                Work::Service(_) => unreachable!("handled above"),
            }
        }
        let pids = backends_of(admin, database).await?;
        drop(client);
        Ok(pids)
    }

    /// The service's session: a ledger-svc with one pooled connection on `database`,
    /// `debits` debits through HTTP one after another, then stopped.
    ///
    /// Errors: the service or a debit failed.
    async fn run_service(
        &self,
        admin: &tokio_postgres::Client,
        database: &str,
        batched: bool,
        draws: &mut Draws<'_>,
        debits: usize,
    ) -> anyhow::Result<Vec<i32>> {
        let mut extra_args = vec![
            "--worker-threads".to_owned(),
            SERVICE_WORKER_THREADS.to_owned(),
        ];
        if batched {
            extra_args
                .extend(["--transfer-mode", "batch", "--batch-drainers", "1"].map(str::to_owned));
            extra_args.extend(["--redeem-stripes".to_owned(), self.stripes.1.to_string()]);
        }
        let service = Service::launch(
            &self.cluster().url(database),
            self.cluster()
                .dir()
                .join(format!("ledger-svc-{database}.log")),
            ServiceOptions {
                pool_size: 1,
                clients: vec![SERVICE_CLIENT.into()],
                extra_args,
                ..ServiceOptions::default()
            },
        )
        .await?;
        let mut client = DebitClient::new(
            service.public_addr(),
            SERVICE_CLIENT,
            service.token(SERVICE_CLIENT),
            Duration::from_millis(SERVICE_TIMEOUT_MS),
        );
        for _ in 0..debits {
            let request = draws.request(batched, batched);
            match client
                .debit(&request.from, &request.idem_key, request.amount)
                .await?
            {
                201 => {}
                other => anyhow::bail!("counted service debit: status {other}"),
            }
        }
        let pids = backends_of(admin, database).await?;
        drop(client);
        service.stop().await?;
        Ok(pids)
    }

    /// The instructions the backends `pids` executed, once each has exited and written
    /// its count; 0 without valgrind.
    ///
    /// Errors: a backend did not exit within [`BACKEND_EXIT_TIMEOUT_MS`], or its count
    /// could not be read.
    async fn instructions_of(&self, pids: &[i32]) -> anyhow::Result<u64> {
        let deadline = Instant::now() + Duration::from_millis(BACKEND_EXIT_TIMEOUT_MS);
        for pid in pids {
            while Path::new(&format!("/proc/{pid}")).exists() {
                anyhow::ensure!(Instant::now() < deadline, "backend {pid} did not exit");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let Some(dir) = &self.counts_dir else {
            return Ok(0);
        };
        let mut total = 0;
        for pid in pids {
            let path = dir.join(format!("cg.{pid}"));
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            total += cachegrind_total(&text)
                .with_context(|| format!("no summary line in {}", path.display()))?;
            let _ = std::fs::remove_file(&path);
        }
        Ok(total)
    }
}

/// The counted variant's figures from the two sessions' totals.
fn figures(name: &str, measured: usize, base: &Totals, more: &Totals, counted: bool) -> Counted {
    let per = |more: i64, base: i64| (more - base) as f64 / measured as f64;
    let idem_updates = more.idem_updates - base.idem_updates;
    Counted {
        variant: name.to_owned(),
        debits: measured,
        insns_per_debit: counted.then(|| (more.insns as f64 - base.insns as f64) / measured as f64),
        wal_bytes_per_debit: per(more.wal_bytes, base.wal_bytes),
        commits_per_debit: per(more.commits, base.commits),
        heap_tuples_per_debit: per(more.heap_tuples, base.heap_tuples),
        index_entries_per_debit: per(more.index_entries, base.index_entries),
        idem_hot_share: (idem_updates > 0)
            .then(|| (more.idem_hot - base.idem_hot) as f64 / idem_updates as f64),
    }
}

/// The printed line of one counted variant.
pub fn line(c: &Counted) -> String {
    format!(
        "counted {}: {} insns, {:.0} WAL bytes, {:.3} commits, {:.2} heap tuples, {:.2} index entries per debit, idem_request HOT {}",
        c.variant,
        c.insns_text(),
        c.wal_bytes_per_debit,
        c.commits_per_debit,
        c.heap_tuples_per_debit,
        c.index_entries_per_debit,
        c.hot_text(),
    )
}

impl Counted {
    /// Instructions per debit as printed: `n/a` where nothing counted them.
    pub fn insns_text(&self) -> String {
        (self.insns_per_debit).map_or_else(|| "n/a".to_owned(), |i| format!("{i:.0}"))
    }

    /// `idem_request`'s HOT share as printed (`100%`), `-` where it had no update.
    pub fn hot_text(&self) -> String {
        (self.idem_hot_share).map_or_else(|| "-".to_owned(), |s| format!("{:.0}%", s * 100.0))
    }
}

/// The `summary: N` total of a cachegrind output file (its `Ir`, the only event counted
/// with `--cache-sim=no --branch-sim=no`).
fn cachegrind_total(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("summary:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// The server's WAL insert position, in bytes from the start.
///
/// Errors: SQL errors.
async fn wal_lsn(client: &tokio_postgres::Client) -> anyhow::Result<i64> {
    let row = client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The pids of the client backends connected to `database`.
///
/// Errors: SQL errors.
async fn backends_of(admin: &tokio_postgres::Client, database: &str) -> anyhow::Result<Vec<i32>> {
    let rows = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'",
            &[&database],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// One call of the floor with `requests` (`floor`: its call prepared once per session, as
/// the batch call is), in its own transaction, pipelined as the batch call is (BEGIN, the
/// call, COMMIT).
///
/// Errors: SQL errors.
async fn floor_call(
    client: &tokio_postgres::Client,
    floor: &tokio_postgres::Statement,
    requests: &[TransferRequest],
) -> anyhow::Result<()> {
    let column = |field: fn(&TransferRequest) -> String| -> Vec<String> {
        requests.iter().map(field).collect()
    };
    let (client_ids, keys, hashes) = (
        column(|r| r.client_id.clone()),
        column(|r| r.idem_key.clone()),
        column(|r| r.request_hash()),
    );
    let (kinds, froms, tos) = (
        column(|r| r.kind.as_str().to_owned()),
        column(|r| r.from.clone()),
        column(|r| r.to.clone()),
    );
    let amounts: Vec<i64> = requests.iter().map(|r| r.amount).collect();
    let order_ids: Vec<Option<String>> = requests.iter().map(|r| r.order_id.clone()).collect();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
        &client_ids,
        &keys,
        &hashes,
        &kinds,
        &froms,
        &tos,
        &amounts,
        &order_ids,
    ];
    let call = client.query(floor, &params);
    // tokio's join polls its futures in argument order the first time: the three requests
    // go out in that order, in one round trip.
    let (begun, called, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        call,
        client.batch_execute("COMMIT")
    );
    begun?;
    called?;
    committed?;
    Ok(())
}

/// The counted sessions' random draws: the same sequence in both sessions of a variant.
struct Draws<'a> {
    rng: ChaCha8Rng,
    accounts: &'a [String],
    /// Stripes of the striped single-debit variants and of the batched ones.
    stripes: (u32, u32),
    n: i64,
}

impl Draws<'_> {
    /// The next number (a ceiling row, a key).
    fn next_n(&mut self) -> i64 {
        self.n += 1;
        self.n
    }

    /// The next debit: a random funded account and amount, crediting the stripes
    /// (`striped`: of the batched variants when `batched`) or the hot sink.
    fn request(&mut self, striped: bool, batched: bool) -> TransferRequest {
        let account = self.accounts[self.rng.random_range(0..self.accounts.len())].clone();
        let amount = self.rng.random_range(1..=100);
        let key = format!("count-{}", self.next_n());
        match (striped, batched) {
            (true, true) => striped_debit("bench", key, &account, amount, self.stripes.1),
            (true, false) => striped_debit("bench", key, &account, amount, self.stripes.0),
            (false, _) => TransferRequest::debit("bench", key, &account, amount),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cachegrind_total;

    #[test]
    fn the_summary_line_gives_the_total() {
        let text = "desc: I1 cache: ...\ncmd: postgres\nevents: Ir\nfl=x\n1 2\nsummary: 40703032\n";
        assert_eq!(cachegrind_total(text), Some(40_703_032));
        assert_eq!(cachegrind_total("events: Ir\n"), None);
    }
}
