//! The bench's table (stdout, Markdown, JSON), its plot (SVG) and the BENCH line.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use crate::counted::{BATCH_COUNTED_SIZE, Counted};
use crate::load::{Measurement, Variant};
use crate::paired::{Paired, show};

/// Every figure of a run: the passes' points, the counted variants, the paired slices.
pub struct Figures<'a> {
    /// The passes' points.
    pub points: &'a [Point],
    /// The counted variants (empty when not counted).
    pub counted: &'a [Counted],
    /// The paired slices, when measured.
    pub paired: Option<&'a Paired>,
}

/// Everything needed to read the figures later.
#[derive(Debug, Clone, Serialize)]
pub struct Context {
    /// Seed of the random accounts and amounts.
    pub seed: u64,
    /// Unmeasured warm-up before each point and repetition, milliseconds.
    pub warmup_ms: u64,
    /// Load duration per point and repetition, seconds.
    pub duration_s: u64,
    /// Repetitions of every point.
    pub repeat: usize,
    /// Funded accounts.
    pub accounts: u32,
    /// Stripes of the `fix` variant.
    pub stripes: u32,
    /// Worker threads of the bench's own runtime (`--load-threads`).
    pub load_threads: usize,
    /// Server version and durability settings as read from the server.
    pub postgres: scratch_pg::ServerFacts,
    /// CPU model, cores and memory of this machine.
    pub machine: String,
    /// Wall time of the whole bench, seconds.
    pub wall_time_s: f64,
}

/// `<cpu model>, <n> cores, <memory> GiB` from /proc.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("MemTotal:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    format!("{cpu}, {cores} cores, {memory_gib:.0} GiB")
}

/// The summary table's header (Markdown; also printed on stdout).
pub const HEADER: &str = "| variant | clients | debits/s | share of ceiling | p50 ms | p99 ms | lock-wait share | CPU µs per debit: load / service / PostgreSQL | batch size mean / p99 | ok | errors | reconciled | debits/s of each repetition |";

/// One (variant, clients) point over its repetitions: the median repetition's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// The design measured.
    pub variant: Variant,
    /// Concurrent clients.
    pub clients: usize,
    /// The median repetition (by debits/s; for an even count the upper middle one): its
    /// rate, latencies and counts are the point's figures.
    pub median: Measurement,
    /// Debits (ceiling: commits) per second of every repetition, by repetition.
    pub rates_per_s: Vec<f64>,
    /// The share of the ceiling at the same clients (0..1): the median over the
    /// repetitions of this repetition's rate over the ceiling's in the same repetition
    /// (`None` for the ceiling itself or without a ceiling point).
    pub share_of_ceiling: Option<f64>,
    /// Whether every repetition reconciled clean.
    pub reconciled_clean: bool,
    /// The first unclean repetition's findings, else the median's summary.
    pub findings: String,
}

/// Groups the repetitions by (variant, clients), in the order first measured.
pub fn summarize(results: &[Measurement]) -> Vec<Point> {
    let mut keys: Vec<(Variant, usize)> = Vec::new();
    for m in results {
        if !keys.contains(&(m.variant, m.clients)) {
            keys.push((m.variant, m.clients));
        }
    }
    keys.sort_by_key(|(variant, clients)| {
        (Variant::ALL.iter().position(|v| v == variant), *clients)
    });
    let mut points: Vec<Point> = keys
        .into_iter()
        .map(|(variant, clients)| {
            let mut reps: Vec<&Measurement> = results
                .iter()
                .filter(|m| m.variant == variant && m.clients == clients)
                .collect();
            reps.sort_by_key(|m| m.repetition);
            let mut by_rate = reps.clone();
            by_rate.sort_by(|a, b| a.debits_per_s.total_cmp(&b.debits_per_s));
            let median = by_rate[by_rate.len() / 2].clone();
            let unclean = reps.iter().find(|m| !m.reconciled_clean);
            Point {
                variant,
                clients,
                rates_per_s: reps.iter().map(|m| m.debits_per_s).collect(),
                share_of_ceiling: None,
                reconciled_clean: unclean.is_none(),
                findings: unclean.map_or_else(|| median.findings.clone(), |m| m.findings.clone()),
                median,
            }
        })
        .collect();
    let ceilings: Vec<(usize, Vec<f64>)> = points
        .iter()
        .filter(|p| p.variant == Variant::Ceiling)
        .map(|p| (p.clients, p.rates_per_s.clone()))
        .collect();
    for point in points.iter_mut().filter(|p| p.variant.is_debit()) {
        point.share_of_ceiling = ceilings
            .iter()
            .find(|(clients, _)| *clients == point.clients)
            .and_then(|(_, ceiling)| median_ratio(&point.rates_per_s, ceiling));
    }
    points
}

/// The median over the repetitions of `top[i] / bottom[i]` (repetition i of each ran
/// within the same pass, minutes closer in time than the same variant's repetitions,
/// which matters on a machine whose load changes); `None` when a pair is missing or a
/// denominator is 0.
fn median_ratio(top: &[f64], bottom: &[f64]) -> Option<f64> {
    if top.is_empty() || top.len() != bottom.len() || bottom.iter().any(|b| *b <= 0.0) {
        return None;
    }
    let mut ratios: Vec<f64> = top.iter().zip(bottom).map(|(a, b)| a / b).collect();
    ratios.sort_by(f64::total_cmp);
    Some(ratios[ratios.len() / 2])
}

/// One repetition's line while the bench runs.
pub fn progress(m: &Measurement) -> String {
    format!(
        "{} @{}: {:.0}/s p50 {:.2} ms p99 {:.2} ms lock-wait {:.0}% cpu µs/debit {} batch {} ok {} errors {} {}",
        m.variant.name(),
        m.clients,
        m.debits_per_s,
        m.p50_ms,
        m.p99_ms,
        m.lock_wait_share * 100.0,
        cpu_cell(&m.cpu),
        batch_cell(m),
        m.ok,
        m.errors,
        if m.reconciled_clean {
            "clean"
        } else {
            m.findings.as_str()
        },
    )
}

/// `mean / p99` requests per batch of a batched variant, `-` for the others.
fn batch_cell(m: &Measurement) -> String {
    match &m.batch_sizes {
        Some(sizes) => format!("{:.1} / {}", sizes.mean, sizes.p99),
        None => "-".to_owned(),
    }
}

/// `load / service / PostgreSQL` CPU microseconds per debit, `-` where not measured.
fn cpu_cell(cpu: &crate::cpu::PerDebit) -> String {
    let us = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |us| format!("{us:.0}"));
    format!(
        "{} / {} / {}",
        us(cpu.load_us),
        us(cpu.service_us),
        us(cpu.postgres_us)
    )
}

/// One table row.
pub fn row(p: &Point) -> String {
    let m = &p.median;
    format!(
        "| {} | {} | {:.0} | {} | {:.2} | {:.2} | {:.0}% | {} | {} | {} | {} | {} | {} |",
        p.variant.name(),
        p.clients,
        m.debits_per_s,
        match p.share_of_ceiling {
            Some(share) => format!("{:.0}%", share * 100.0),
            None if p.variant == Variant::Ceiling => "100% (the ceiling)".into(),
            None => "n/a".into(),
        },
        m.p50_ms,
        m.p99_ms,
        m.lock_wait_share * 100.0,
        cpu_cell(&m.cpu),
        batch_cell(m),
        m.ok,
        m.errors,
        if p.reconciled_clean {
            "clean".to_string()
        } else {
            p.findings.clone()
        },
        p.rates_per_s
            .iter()
            .map(|rate| format!("{rate:.0}"))
            .collect::<Vec<_>>()
            .join(" / "),
    )
}

fn rates(points: &[Point], variant: Variant, clients: usize) -> Option<&[f64]> {
    points
        .iter()
        .find(|p| p.variant == variant && p.clients == clients)
        .map(|p| p.rates_per_s.as_slice())
}

/// `top`'s debits/s over `bottom`'s at `clients`: the median of the per-repetition ratios.
fn ratio(points: &[Point], top: Variant, bottom: Variant, clients: usize) -> String {
    match (rates(points, top, clients), rates(points, bottom, clients)) {
        (Some(a), Some(b)) => {
            median_ratio(a, b).map_or_else(|| "n/a".into(), |r| format!("{r:.2}"))
        }
        _ => "n/a".into(),
    }
}

/// The best correct debit variant's share of the ceiling at `clients`, in percent: the
/// highest median debits/s among the variants whose every repetition reconciled clean,
/// over the ceiling's median commits/s.
fn best_ceiling_pct(points: &[Point], clients: usize) -> String {
    points
        .iter()
        .filter(|p| p.clients == clients && p.variant.is_debit() && p.reconciled_clean)
        .filter_map(|p| p.share_of_ceiling)
        .max_by(f64::total_cmp)
        .map_or_else(|| "n/a".into(), |share| format!("{:.0}", share * 100.0))
}

/// The share of the ceiling of `variant` at `clients`, in percent, if it reconciled
/// clean in every repetition.
fn ceiling_pct(points: &[Point], variant: Variant, clients: usize) -> String {
    points
        .iter()
        .find(|p| p.variant == variant && p.clients == clients && p.reconciled_clean)
        .and_then(|p| p.share_of_ceiling)
        .map_or_else(|| "n/a".into(), |share| format!("{:.0}", share * 100.0))
}

/// `BENCH service/raw@8=… service/raw@32=… fix/hot@32=… onetrip/raw@1=… onetrip/raw@8=…
/// onetripfix/raw@32=… best_ceiling_pct@8=… batch/onetripfix@32=… batch_ceiling_pct@32=…
/// servicebatch/onetripfix@32=…`: ratios of debits per second in this run, each the
/// median of the per-repetition ratios (`hot` is the `raw` variant, whose every debit
/// updates the one `sys-redeem` row), the best correct variant's share of the ceiling's
/// commits/s in percent and the batch variant's (likewise the median of per-repetition
/// shares).
///
/// Then the counted figures (`crate::counted`): `batch_insns_per_debit@12=…` (PostgreSQL
/// instructions per debit of `ledger_transfer_batch` at 12 debits a call),
/// `batch/floor_insns@12=…` (the same over the schema's floor's) and
/// `wal_bytes_per_debit@batch=…` (the same batch's WAL bytes per debit); `n/a` when not
/// counted.
///
/// With paired slices (`crate::paired`), `batch/onetripfix@32` and `batch_ceiling_pct@32`
/// are their medians instead, each followed by its 95% interval
/// (`batch/onetripfix@32_ci95=low..high`).
pub fn bench_line(figures: &Figures) -> String {
    let points = figures.points;
    let (batch_onetripfix, batch_ceiling) = match figures.paired {
        Some(p) => (
            format!(
                "{:.2} batch/onetripfix@32_ci95={:.2}..{:.2}",
                p.batch_onetripfix.median, p.batch_onetripfix.low, p.batch_onetripfix.high
            ),
            format!(
                "{:.0} batch_ceiling_pct@32_ci95={:.0}..{:.0}",
                p.batch_ceiling_pct.median, p.batch_ceiling_pct.low, p.batch_ceiling_pct.high
            ),
        ),
        None => (
            ratio(points, Variant::Batch, Variant::OneTripFix, 32),
            ceiling_pct(points, Variant::Batch, 32),
        ),
    };
    format!(
        "BENCH service/raw@8={} service/raw@32={} fix/hot@32={} onetrip/raw@1={} onetrip/raw@8={} onetripfix/raw@32={} best_ceiling_pct@8={} batch/onetripfix@32={} batch_ceiling_pct@32={} servicebatch/onetripfix@32={} {}",
        ratio(points, Variant::Service, Variant::Raw, 8),
        ratio(points, Variant::Service, Variant::Raw, 32),
        ratio(points, Variant::Fix, Variant::Raw, 32),
        ratio(points, Variant::OneTrip, Variant::Raw, 1),
        ratio(points, Variant::OneTrip, Variant::Raw, 8),
        ratio(points, Variant::OneTripFix, Variant::Raw, 32),
        best_ceiling_pct(points, 8),
        batch_onetripfix,
        batch_ceiling,
        ratio(points, Variant::ServiceBatch, Variant::OneTripFix, 32),
        counted_figures(figures.counted),
    )
}

/// The counted part of the BENCH line.
fn counted_figures(counted: &[Counted]) -> String {
    let find = |name: String| counted.iter().find(|c| c.variant == name);
    let batch = find(format!("batch@{BATCH_COUNTED_SIZE}"));
    let floor = find(format!("floor@{BATCH_COUNTED_SIZE}"));
    let insns = |c: Option<&Counted>| c.and_then(|c| c.insns_per_debit);
    let na = || "n/a".to_owned();
    format!(
        "batch_insns_per_debit@{BATCH_COUNTED_SIZE}={} batch/floor_insns@{BATCH_COUNTED_SIZE}={} wal_bytes_per_debit@batch={}",
        insns(batch).map_or_else(na, |i| format!("{i:.0}")),
        insns(batch)
            .zip(insns(floor))
            .map_or_else(na, |(b, f)| format!("{:.2}", b / f)),
        batch.map_or_else(na, |c| format!("{:.0}", c.wal_bytes_per_debit)),
    )
}

/// The counted figures' table (Markdown), one row per counted variant.
pub fn counted_table(counted: &[Counted]) -> String {
    let mut md = String::from(
        "| counted variant | PostgreSQL instructions per debit | WAL bytes per debit | commits per debit | heap tuples per debit | index entries per debit | idem_request updates HOT |\n|---|---|---|---|---|---|---|\n",
    );
    for c in counted {
        md.push_str(&format!(
            "| {} | {} | {:.0} | {:.3} | {:.2} | {:.2} | {} |\n",
            c.variant,
            c.insns_text(),
            c.wal_bytes_per_debit,
            c.commits_per_debit,
            c.heap_tuples_per_debit,
            c.index_entries_per_debit,
            c.hot_text(),
        ));
    }
    md
}

/// The sections of results.md after the passes' table: the paired slices, the counted
/// figures, the BENCH line.
fn later_sections(figures: &Figures) -> String {
    let mut md = String::new();
    if let Some(paired) = figures.paired {
        md.push_str(&paired_section(paired));
    }
    if !figures.counted.is_empty() {
        md.push_str(COUNTED_INTRO);
        md.push_str(&counted_table(figures.counted));
    }
    md.push_str(&format!("\n`{}`\n", bench_line(figures)));
    md
}

/// The paired slices' section of results.md.
fn paired_section(p: &Paired) -> String {
    let rates = |values: &[f64]| {
        values
            .iter()
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    format!(
        "\n## Timed in pairs\n\n{} rounds of {} s slices at 32 clients, ceiling, batch and onetrip+fix in turn (every other round in the opposite order); each ratio is one round's, the figure their median with a distribution-free interval (coverage {:.1}%){}.\n\n| | per round |\n|---|---|\n| ceiling commits/s | {} |\n| batch debits/s | {} |\n| onetrip+fix debits/s | {} |\n\n- batch / ceiling, %: {}\n- batch / onetrip+fix: {}\n",
        p.rounds,
        p.slice_s,
        p.batch_onetripfix.coverage * 100.0,
        if p.clean {
            ""
        } else {
            "; NOT every slice reconciled clean"
        },
        rates(&p.ceiling_per_s),
        rates(&p.batch_per_s),
        rates(&p.onetripfix_per_s),
        show(&p.batch_ceiling_pct, 0),
        show(&p.batch_onetripfix, 2),
    )
}

/// What the counted table is (results.md).
const COUNTED_INTRO: &str = "\n## Counted, not timed\n\nEach figure per debit (the ceiling: per commit), counted on a second scratch cluster whose\nserver runs under `valgrind --tool=cachegrind` (no autovacuum, no checkpoint inside): two\nsessions per variant on fresh copies of one funded template, one with 24 debits and one with\nthe same and the measured ones more, the figures the difference (`bench/src/counted.rs`).\n`batch@12` is `ledger_transfer_batch` called with 12 debits, `floor@12` the schema's floor\n(the same rows written with no decision and no check of its own: `bench/src/floor.sql`), the\nservice variants one debit at a time through ledger-svc (its batch mode then makes batches of\none). Instructions are the backends' user-space ones; WAL bytes from\n`pg_current_wal_insert_lsn`; heap tuples written are inserted plus updated versions; an index\nentry is added per index of a table for every tuple inserted or updated other than HOT.\n\n";

/// Writes `results.md`, `results.json`, `throughput.svg` and the page showing both,
/// `index.html` (`evidence_pages::bench`), into `out`.
///
/// Errors: file system, serialization or drawing errors.
pub fn write(
    out: &Path,
    context: &Context,
    figures: &Figures,
    results: &[Measurement],
) -> anyhow::Result<()> {
    let points = figures.points;
    let mut md = String::new();
    md.push_str("# Bench: debit throughput against the commit ceiling\n\n");
    md.push_str("Regenerate with `./run.sh bench` (see `--help` for options). Figures are from one run on the\n");
    md.push_str("machine below; compare ratios, not absolutes. `raw` is the SPEC §3 transaction as written\n");
    md.push_str("(separate statements, one hot `sys-redeem` row), `service` the same through ledger-svc over\n");
    md.push_str("HTTP, `fix` the raw transaction with the sink striped, `onetrip` the same work in one round\n");
    md.push_str("trip (a server-side function), `onetrip+fix` both; the `ceiling` is not a debit but a one-row\n");
    md.push_str("durable commit from as many connections, and each variant's share of it is its debits/s over\n");
    md.push_str(
        "the ceiling's commits/s at the same clients. Debits/s, p50 and p99 are the median\n",
    );
    md.push_str("repetition's (every repetition's rate is in the last column); shares and the BENCH ratios\n");
    md.push_str("are medians of the per-repetition ratios. The repetitions ran as passes over every point,\n");
    md.push_str(
        "client count by client count, so the variants compared within a pass ran seconds apart.\n",
    );
    md.push_str("Every point is warmed up first (all its clients at once, unmeasured). The service runs with\n");
    md.push_str("a pool of as many connections as clients (PostgreSQL sees the same concurrency as in `raw`)\n");
    md.push_str(
        "and one runtime thread (`--worker-threads 1`); each bench client keeps one HTTP/1.1\n",
    );
    md.push_str(
        "connection (hyper's connection-level client). The CPU column is the median repetition's\n",
    );
    md.push_str("user + system time per OK debit of the load generator (this process), of ledger-svc and of\n");
    md.push_str("all PostgreSQL processes: where the two cores went (see LIMITS.md, \"The service's overhead\n");
    md.push_str("in the bench\").\n\n");
    md.push_str(&format!("- machine: {}\n", context.machine));
    md.push_str(&format!(
        "- PostgreSQL {} (fsync={}, synchronous_commit={}, full_page_writes={})\n",
        context.postgres.server_version,
        context.postgres.fsync,
        context.postgres.synchronous_commit,
        context.postgres.full_page_writes
    ));
    md.push_str(&format!(
        "- seed {}, {} ms warm-up and {} s measured per point and repetition, {} repetitions, {} funded accounts, amounts 1-100 points, {} stripes for `fix` and `onetrip+fix`, {} load thread(s); wall time {:.0} s\n\n",
        context.seed,
        context.warmup_ms,
        context.duration_s,
        context.repeat,
        context.accounts,
        context.stripes,
        context.load_threads,
        context.wall_time_s
    ));
    md.push_str(HEADER);
    md.push_str("\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for p in points {
        md.push_str(&row(p));
        md.push('\n');
    }
    md.push_str(&later_sections(figures));
    std::fs::write(out.join("results.md"), md)?;
    write_json(out, context, figures, results)?;
    plot(&out.join("throughput.svg"), points)?;
    page(out)
}

/// Writes `out/results.json`: the context, the points, the counted figures, the paired
/// slices and every repetition.
///
/// Errors: serialization or file system errors.
fn write_json(
    out: &Path,
    context: &Context,
    figures: &Figures,
    results: &[Measurement],
) -> anyhow::Result<()> {
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "context": context,
            "points": figures.points,
            "counted": figures.counted,
            "paired": figures.paired,
            "repetitions": results
        }))?,
    )?;
    Ok(())
}

/// Writes `out/index.html`, the bench page (`evidence_pages::bench`), from
/// `out/results.json`.
///
/// Errors: reading the results, writing the page.
pub fn page(out: &Path) -> anyhow::Result<()> {
    let results = evidence_pages::read_json(&out.join("results.json"))?;
    evidence_pages::write(
        &out.join("index.html"),
        &evidence_pages::bench::render(&results),
    )
}

fn plot(path: &Path, points: &[Point]) -> anyhow::Result<()> {
    let max_clients = points.iter().map(|p| p.clients).max().unwrap_or(1) as f64;
    let max_rate = points
        .iter()
        .map(|p| p.median.debits_per_s)
        .fold(1.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (760, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Debits per second against concurrent clients (ceiling: one-row commits/s)",
            ("sans-serif", 18),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_clients * 1.05, 0.0..max_rate)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients")
        .y_desc("per second (median of the repetitions)")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let colors = [
        BLACK,
        RED,
        BLUE,
        GREEN,
        MAGENTA,
        RGBColor(230, 140, 0),
        CYAN,
        RGBColor(120, 60, 160),
    ];
    for (variant, color) in Variant::ALL.iter().zip(colors) {
        let series: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.variant == *variant)
            .map(|p| (p.clients as f64, p.median.debits_per_s))
            .collect();
        if series.is_empty() {
            continue;
        }
        let width = if *variant == Variant::Ceiling { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(width)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(variant.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
            });
        chart
            .draw_series(
                series
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(variant: Variant, clients: usize, repetition: usize, rate: f64) -> Measurement {
        Measurement {
            variant,
            clients,
            repetition,
            elapsed_s: 1.0,
            ok: rate as u64,
            refused: 0,
            errors: 0,
            debits_per_s: rate,
            p50_ms: rate / 100.0,
            p99_ms: rate / 10.0,
            lock_wait_share: 0.0,
            batch_sizes: None,
            cpu: crate::cpu::PerDebit {
                load_us: Some(rate),
                service_us: (variant == Variant::Service).then_some(200.0),
                postgres_us: Some(1000.0),
            },
            reconciled_clean: !(variant == Variant::Fix && repetition == 2),
            findings: format!("{} {clients} {repetition}", variant.name()),
        }
    }

    /// The median repetition's figures, the shares of the ceiling, and the BENCH keys
    /// (an unclean variant is not the best correct one).
    #[test]
    fn medians_shares_and_the_bench_line() {
        let mut results = Vec::new();
        for (repetition, scale) in [(0, 1.0), (1, 3.0), (2, 2.0)] {
            for (variant, rate) in [
                (Variant::Ceiling, 1000.0),
                (Variant::Raw, 100.0),
                (Variant::Service, 95.0),
                (Variant::Fix, 400.0),
                (Variant::OneTrip, 250.0),
                (Variant::OneTripFix, 300.0),
                (Variant::Batch, 900.0),
                (Variant::ServiceBatch, 450.0),
            ] {
                for clients in [1, 8, 32] {
                    results.push(rep(variant, clients, repetition, rate * scale));
                }
            }
        }
        let points = summarize(&results);
        assert_eq!(points.len(), 24);
        let raw8 = points
            .iter()
            .find(|p| p.variant == Variant::Raw && p.clients == 8)
            .unwrap();
        assert_eq!(raw8.median.debits_per_s, 200.0);
        assert_eq!(raw8.median.repetition, 2);
        assert_eq!(raw8.rates_per_s, vec![100.0, 300.0, 200.0]);
        assert_eq!(median_ratio(&[1.0, 9.0, 2.0], &[1.0, 3.0, 4.0]), Some(1.0));
        assert_eq!(median_ratio(&[1.0], &[0.0]), None);
        assert_eq!(raw8.share_of_ceiling, Some(0.1));
        let fix = points.iter().find(|p| p.variant == Variant::Fix).unwrap();
        assert!(!fix.reconciled_clean);
        assert_eq!(fix.findings, "fix 1 2");
        let figures = Figures {
            points: &points,
            counted: &[],
            paired: None,
        };
        assert_eq!(
            bench_line(&figures),
            "BENCH service/raw@8=0.95 service/raw@32=0.95 fix/hot@32=4.00 onetrip/raw@1=2.50 \
             onetrip/raw@8=2.50 onetripfix/raw@32=3.00 best_ceiling_pct@8=90 \
             batch/onetripfix@32=3.00 batch_ceiling_pct@32=90 servicebatch/onetripfix@32=1.50 \
             batch_insns_per_debit@12=n/a batch/floor_insns@12=n/a wal_bytes_per_debit@batch=n/a"
        );
        assert!(row(&points[0]).contains("100% (the ceiling)"));
        let service8 = points
            .iter()
            .find(|p| p.variant == Variant::Service && p.clients == 8)
            .unwrap();
        assert!(
            row(service8).contains("| 190 / 200 / 1000 |"),
            "{}",
            row(service8)
        );
        assert!(row(raw8).contains("| 200 / - / 1000 |"), "{}", row(raw8));
    }
}
