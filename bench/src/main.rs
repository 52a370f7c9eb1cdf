//! `bench` (`./run.sh bench`, its own crate so that it depends on the case kit and the ledger, not on the cases): debits per second of the SPEC §3 transfer, and what the
//! `sys-redeem` hot row costs. A benchmark, not a test: it reports figures and never
//! fails on them.
//!
//! On a fresh scratch cluster with the normal durability settings (fsync,
//! synchronous_commit and full_page_writes on), for each variant and each client count it
//! runs a fixed-duration load on its own copy of a funded database, then reconciles it:
//!
//! - `raw`: the transfer issued from N database connections, every debit crediting the
//!   one `sys-redeem` row (the hot row);
//! - `service`: the same debits through ledger-svc over HTTP from N keep-alive clients
//!   (unique idempotency keys; the service's pool has N connections);
//! - `fix`: the raw transfer with the redemption sink striped over K sub-accounts
//!   (`points_ledger::striping`), so debits of different accounts lock different rows;
//! - `onetrip`: the same transfer in one round trip (`points_ledger::transfer_onetrip`, a
//!   server-side function called as one statement), hot sink;
//! - `onetrip+fix`: the one-trip transfer with the striped sink;
//! - and the `ceiling`, which is not a debit: the smallest durable write transaction (a
//!   one-row INSERT, one commit, one round trip) from N connections. Every debit is at
//!   least one durable commit, so each variant is also reported as a share of it.
//!
//! With `--repeat R` every point runs R times (in passes over all points, client count by
//! client count, so the variants compared at one count run seconds apart); each rate is
//! the median repetition's, each ratio and share the median of the per-pass ratios.
//!
//! Output: a table on stdout and a record under `evidence/runs/bench-<stamp>-<pid>/`
//! (ignored by git, pruned with the harness's run records: `./run.sh --keep-runs N`;
//! Markdown and JSON, with the machine, PostgreSQL version and settings, and the seed),
//! an SVG plot of throughput against clients with the ceiling, the page, and one last
//! line `BENCH …` with ratios from the same run. The committed page `evidence/bench/`
//! is written only with `--accept` (as `./run.sh --accept` writes snapshots), so a run
//! leaves the working tree as it was.

mod counted;
mod cpu;
mod http_client;
mod load;
mod paired;
mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use scratch_pg::{Cluster, ClusterOptions};

use crate::load::{BenchDb, Variant};

/// Default load duration per (variant, clients) point and repetition, in seconds.
const DEFAULT_DURATION_S: u64 = 5;
/// Default warm-up before every measured point, in milliseconds.
const DEFAULT_WARMUP_MS: u64 = 500;
/// Default repetitions of every point (each figure is the median repetition's).
const DEFAULT_REPEAT: u64 = 3;
/// Default worker threads of the bench's own runtime (its clients, and in the library
/// variants the system under test's tasks: the batcher's drainers among them). One: on
/// a machine whose few cores PostgreSQL's backends need, a second runtime thread only
/// competes with them and adds wakeups between threads (the reason the service variants'
/// ledger-svc runs one too, `load::SERVICE_WORKER_THREADS`). Measured on the two-core
/// development machine, `batch` at 32 clients, five seconds, one thread against two in
/// turns: 10,807 / 10,151 / 11,929 debits/s against 9,293 / 7,857 / 9,752, the load's CPU
/// 11–13 µs per debit against 17–21 (docs/bench.md, "The load generator's threads").
const DEFAULT_LOAD_THREADS: usize = 1;

/// Debit throughput of the ledger with and without the hot row.
#[derive(Debug, Parser)]
#[command(name = "bench")]
struct Args {
    /// Seconds of load per (variant, clients) point and repetition.
    #[arg(long, default_value_t = DEFAULT_DURATION_S)]
    duration_s: u64,
    /// Unmeasured load before each point's measured seconds, milliseconds: every client
    /// debits at once, so connections, the service's pool and PostgreSQL's caches are warm
    /// when the clock starts (the same for every variant).
    #[arg(long, default_value_t = DEFAULT_WARMUP_MS)]
    warmup_ms: u64,
    /// Repetitions of every point; each figure is the median repetition's.
    #[arg(long, default_value_t = DEFAULT_REPEAT, value_parser = clap::value_parser!(u64).range(1..=100))]
    repeat: u64,
    /// Concurrent client counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// Variants to measure, comma-separated [default: all, in report order]; a BENCH
    /// figure whose variants were not measured reads `n/a`.
    #[arg(long, value_delimiter = ',', value_enum)]
    variants: Vec<Variant>,
    /// Funded accounts the load picks from at random.
    #[arg(long, default_value_t = 1000)]
    accounts: u32,
    /// Redemption stripes of the `fix` variant.
    #[arg(long, default_value_t = 64)]
    stripes: u32,
    /// Most debits one batch takes, in the batched variants.
    #[arg(long, default_value_t = points_ledger::batcher::BATCH_MAX_REQUESTS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    batch_max_requests: usize,
    /// Batches executed at once (drainers), in the batched variants.
    #[arg(long, default_value_t = points_ledger::batcher::BATCH_DRAINERS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    batch_drainers: usize,
    /// Redemption stripes the batched variants' debits credit [default: as many as
    /// drainers, one per drainer's lane: `points_ledger::batcher::lane_of`]; 1 is the one
    /// hot `sys-redeem`. At most `--stripes` (the stripes the database has).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    batch_stripes: Option<u32>,
    /// Seed for the random accounts and amounts [default: from the clock; printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Worker threads of the bench's own runtime, which runs the load's clients and, in the
    /// library variants, the system under test's tasks (the batcher's drainers).
    #[arg(long, default_value_t = DEFAULT_LOAD_THREADS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    load_threads: usize,
    /// Debits counted per counted variant (instructions, WAL bytes, tuples:
    /// `bench/src/counted.rs`), rounded up to a multiple of 12; 0 counts nothing.
    #[arg(long, default_value_t = counted::DEFAULT_COUNT_DEBITS)]
    count_debits: usize,
    /// SQL run on the counted template after the schema, for measuring a lever before it
    /// is made (`ALTER TABLE idem_request SET (fillfactor = 70)`); the timed cluster does
    /// not see it.
    #[arg(long)]
    count_template_sql: Option<String>,
    /// Only the counted figures: print them and the BENCH line, start no timed cluster and
    /// write nothing.
    #[arg(long)]
    count_only: bool,
    /// Rounds of the paired slices (ceiling, batch, onetrip+fix at 32 clients, one short
    /// slice each per round: `bench/src/paired.rs`); 0 measures none. Only when those
    /// three variants are measured.
    #[arg(long, default_value_t = paired::DEFAULT_PAIR_ROUNDS)]
    pair_rounds: usize,
    /// Measured seconds of each paired slice.
    #[arg(long, default_value_t = paired::DEFAULT_PAIR_SLICE_S)]
    pair_slice_s: u64,
    /// Folder for the run's record (table, plot, page) [default:
    /// evidence/runs/bench-<stamp>-<pid>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write the record over the committed page, `evidence/bench/` (the figures the
    /// docs cite): review with `git diff`, commit when meant. Refused from a dev build.
    #[arg(long)]
    accept: bool,
    /// Start the service variant's ledger-svc with `--auth-tokens` (its debits then carry
    /// a bearer token; `launch::service`).
    #[arg(long, env = launch::service::AUTH_ENV, value_parser = clap::builder::BoolishValueParser::new())]
    auth: bool,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.load_threads)
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(run(args)),
        Err(error) => Err(anyhow::Error::new(error).context("starting the bench's runtime")),
    };
    if let Err(error) = outcome {
        eprintln!("bench error: {error:#}");
        std::process::exit(2);
    }
}

/// The benchmark: prints its settings, starts the cluster, prepares the template,
/// measures every point in passes, then prints and writes the report.
///
/// Errors: the cluster, the template or a point failed, or the report could not be
/// written.
async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let seed = checked_seed(&args)?;
    let folders = output_folders(&args)?;
    launch::service::set_run_auth(args.auth);
    print_settings(&args, seed);
    let counted = count(&args).await?;
    if args.count_only {
        let figures = report::Figures {
            points: &[],
            counted: &counted,
            paired: None,
        };
        println!("{}", report::bench_line(&figures));
        return Ok(());
    }
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(ClusterOptions::default()))
        .await?
        .context("starting the scratch cluster")?;
    let facts = cluster.server_facts().await?;
    println!(
        "postgres {} (fsync={} synchronous_commit={} full_page_writes={})",
        facts.server_version, facts.fsync, facts.synchronous_commit, facts.full_page_writes
    );
    let mut db = BenchDb::prepare(cluster, args.accounts, args.stripes).await?;
    db.batch_limits = points_ledger::batcher::BatchLimits {
        max_requests: args.batch_max_requests,
        drainers: args.batch_drainers,
    };
    db.batch_stripes = batch_stripes(&args);
    let results = measure_all(&db, &args, seed).await?;
    let paired = pairs(&db, &args, seed).await?;
    let points = report::summarize(&results);
    println!("{}", report::HEADER);
    for point in &points {
        println!("{}", report::row(point));
    }
    let context = report::Context {
        seed,
        warmup_ms: args.warmup_ms,
        duration_s: args.duration_s,
        repeat: args.repeat as usize,
        accounts: args.accounts,
        stripes: args.stripes,
        load_threads: args.load_threads,
        postgres: facts,
        machine: report::machine(),
        wall_time_s: started.elapsed().as_secs_f64(),
    };
    let figures = report::Figures {
        points: &points,
        counted: &counted,
        paired: paired.as_ref(),
    };
    for out in &folders {
        report::write(out, &context, &figures, &results)
            .with_context(|| format!("writing the record in {}", out.display()))?;
        println!(
            "wrote {}/results.md, results.json, throughput.svg, index.html (the page)",
            out.display()
        );
    }
    if !args.accept {
        println!("{ACCEPTED_DIR}/ (committed) unchanged: `./run.sh bench --accept` writes it");
    }
    println!("{}", report::bench_line(&figures));
    Ok(())
}

/// The folders the record is written to, made now, before minutes of measuring: the
/// run's ([`record_folder`]) and, with `--accept`, the committed page's. None with
/// `--count-only`, which writes nothing.
///
/// Errors: a folder that cannot be made, with its path.
fn output_folders(args: &Args) -> anyhow::Result<Vec<PathBuf>> {
    if args.count_only {
        return Ok(Vec::new());
    }
    let mut folders = vec![record_folder(args)];
    if args.accept {
        folders.push(PathBuf::from(ACCEPTED_DIR));
    }
    for out in &folders {
        std::fs::create_dir_all(out)
            .with_context(|| format!("creating {} (--out names another folder)", out.display()))?;
    }
    Ok(folders)
}

/// The committed bench page, written only with `--accept`.
const ACCEPTED_DIR: &str = "evidence/bench";

/// Where this run's record goes: `--out`, else `evidence/runs/bench-<UTC start>-<pid>`
/// (named as the harness's run records are, so `prune_runs` in
/// `harness/src/evidence.rs` counts it among them).
fn record_folder(args: &Args) -> PathBuf {
    args.out.clone().unwrap_or_else(|| {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(':', "");
        PathBuf::from("evidence/runs").join(format!("bench-{stamp}-{}", std::process::id()))
    })
}

/// The run's seed (`--seed`, else from the clock), once the options agree.
///
/// Errors: `--batch-stripes` is more than `--stripes`; `--accept` from a dev build.
fn checked_seed(args: &Args) -> anyhow::Result<u64> {
    if args.accept && cfg!(debug_assertions) {
        anyhow::bail!(
            "--accept writes the committed page, whose figures need the release build; \
             run `./run.sh bench --accept` without LEDGER_BUILD_PROFILE=dev"
        );
    }
    if cfg!(debug_assertions) {
        eprintln!(
            "bench: an unoptimised (dev) build; its figures are not comparable with a release build's"
        );
    }
    if batch_stripes(args) > args.stripes.max(1) {
        anyhow::bail!(
            "--batch-stripes {} is more than the {} stripes the database has (--stripes)",
            batch_stripes(args),
            args.stripes
        );
    }
    Ok(args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    }))
}

/// The counted figures (`counted`), none with `--count-debits 0`.
///
/// Errors: the counting cluster or a counted session failed.
async fn count(args: &Args) -> anyhow::Result<Vec<counted::Counted>> {
    if args.count_debits == 0 {
        return Ok(Vec::new());
    }
    let stripes = (args.stripes, batch_stripes(args));
    let extra = args.count_template_sql.as_deref();
    let count_db = counted::CountDb::prepare(args.accounts, stripes, extra).await?;
    count_db.count_all(args.count_debits).await
}

/// The paired slices (`paired`), when `--pair-rounds` is not 0 and the ceiling, `batch`
/// and `onetrip+fix` are among the variants.
///
/// Errors: a slice failed.
async fn pairs(db: &BenchDb, args: &Args, seed: u64) -> anyhow::Result<Option<paired::Paired>> {
    let measured = [Variant::Ceiling, Variant::Batch, Variant::OneTripFix]
        .iter()
        .all(|v| args.variants.is_empty() || args.variants.contains(v));
    if args.pair_rounds == 0 || !measured {
        return Ok(None);
    }
    let slice = Duration::from_secs(args.pair_slice_s.max(1));
    Ok(Some(
        paired::measure(db, args.pair_rounds, slice, seed).await?,
    ))
}

/// The redemption stripes of the batched variants: `--batch-stripes`, else one per
/// drainer.
fn batch_stripes(args: &Args) -> u32 {
    args.batch_stripes.unwrap_or(args.batch_drainers as u32)
}

/// Prints the run's settings line (`seed=… warmup_ms=… …`).
fn print_settings(args: &Args, seed: u64) {
    println!(
        "seed={seed} warmup_ms={} duration_s={} repeat={} clients={:?} variants={} accounts={} stripes={} batch_max_requests={} batch_drainers={} batch_stripes={} load_threads={} service_auth={}",
        args.warmup_ms,
        args.duration_s,
        args.repeat,
        args.clients,
        if args.variants.is_empty() {
            "all".to_owned()
        } else {
            args.variants
                .iter()
                .map(|v| v.name())
                .collect::<Vec<_>>()
                .join(",")
        },
        args.accounts,
        args.stripes,
        args.batch_max_requests,
        args.batch_drainers,
        batch_stripes(args),
        args.load_threads,
        if launch::service::run_auth() {
            "tokens"
        } else {
            "off"
        }
    );
}

/// Measures every (variant, clients) point `--repeat` times, with a progress bar; the
/// measurements in the order run.
///
/// Errors: a point failed.
async fn measure_all(
    db: &BenchDb,
    args: &Args,
    seed: u64,
) -> anyhow::Result<Vec<load::Measurement>> {
    let duration = Duration::from_secs(args.duration_s);
    let warmup = Duration::from_millis(args.warmup_ms);
    let mut results = Vec::new();
    let repeat = args.repeat as usize;
    let variants: Vec<Variant> = Variant::ALL
        .into_iter()
        .filter(|v| args.variants.is_empty() || args.variants.contains(v))
        .collect();
    // A bar on a terminal; off one (or under CI=true) an occasional status line on stderr.
    let progress = case_kit::progress::Progress::new(
        "bench",
        (repeat * variants.len() * args.clients.len()) as u64,
    );
    // Pass by pass, client count by client count: the variants compared at one count run
    // one after another, so a change in the machine's load hits them alike.
    for repetition in 0..repeat {
        for &clients in &args.clients {
            for &variant in &variants {
                progress.start_step(&format!(
                    "pass {}/{repeat}: {} @ {clients} clients ({} s)",
                    repetition + 1,
                    variant.name(),
                    args.duration_s
                ));
                let result = db
                    .measure(variant, clients, repetition, (warmup, duration), seed)
                    .await?;
                progress.finish_step();
                progress.println(&format!(
                    "repetition {}/{repeat}: {}",
                    repetition + 1,
                    report::progress(&result)
                ));
                results.push(result);
            }
        }
    }
    progress.finish();
    Ok(results)
}
