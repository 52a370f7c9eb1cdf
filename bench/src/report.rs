//! The bench's table (stdout, Markdown, JSON), its plot (SVG) and the BENCH line.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use crate::load::{Measurement, Variant};

/// Everything needed to read the figures later.
#[derive(Debug, Clone, Serialize)]
pub struct Context {
    /// Seed of the random accounts and amounts.
    pub seed: u64,
    /// Load duration per point, seconds.
    pub duration_s: u64,
    /// Funded accounts.
    pub accounts: u32,
    /// Stripes of the `fix` variant.
    pub stripes: u32,
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

const HEADER: &str = "| variant | clients | debits/s | p50 ms | p99 ms | lock-wait share | ok | errors | reconciled |";

/// One table row.
pub fn row(m: &Measurement) -> String {
    format!(
        "| {} | {} | {:.0} | {:.2} | {:.2} | {:.0}% | {} | {} | {} |",
        m.variant.name(),
        m.clients,
        m.debits_per_s,
        m.p50_ms,
        m.p99_ms,
        m.lock_wait_share * 100.0,
        m.ok,
        m.errors,
        if m.reconciled_clean {
            "clean".to_string()
        } else {
            m.findings.clone()
        },
    )
}

fn throughput(results: &[Measurement], variant: Variant, clients: usize) -> Option<f64> {
    results
        .iter()
        .find(|m| m.variant == variant && m.clients == clients)
        .map(|m| m.debits_per_s)
}

fn ratio(results: &[Measurement], top: Variant, bottom: Variant, clients: usize) -> String {
    match (
        throughput(results, top, clients),
        throughput(results, bottom, clients),
    ) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "n/a".into(),
    }
}

/// `BENCH service/raw@8=… service/raw@32=… fix/hot@32=…` (ratios of debits per second
/// in this run; `hot` is the `raw` variant, whose every debit updates the one
/// `sys-redeem` row).
pub fn bench_line(results: &[Measurement]) -> String {
    format!(
        "BENCH service/raw@8={} service/raw@32={} fix/hot@32={}",
        ratio(results, Variant::Service, Variant::Raw, 8),
        ratio(results, Variant::Service, Variant::Raw, 32),
        ratio(results, Variant::Fix, Variant::Raw, 32),
    )
}

/// Writes `results.md`, `results.json` and `throughput.svg` into `out`.
///
/// Errors: file system, serialization or drawing errors.
pub fn write(out: &Path, context: &Context, results: &[Measurement]) -> anyhow::Result<()> {
    let mut md = String::new();
    md.push_str("# Bench: debit throughput with and without the sys-redeem hot row\n\n");
    md.push_str("Regenerate with `./run.sh bench` (see `--help` for options). Figures are from one run on the\n");
    md.push_str("machine below; compare ratios, not absolutes.\n\n");
    md.push_str(&format!("- machine: {}\n", context.machine));
    md.push_str(&format!(
        "- PostgreSQL {} (fsync={}, synchronous_commit={}, full_page_writes={})\n",
        context.postgres.server_version,
        context.postgres.fsync,
        context.postgres.synchronous_commit,
        context.postgres.full_page_writes
    ));
    md.push_str(&format!(
        "- seed {}, {} s per point, {} funded accounts, amounts 1-100 points, {} stripes for `fix`; wall time {:.0} s\n\n",
        context.seed, context.duration_s, context.accounts, context.stripes, context.wall_time_s
    ));
    md.push_str(HEADER);
    md.push_str("\n|---|---|---|---|---|---|---|---|---|\n");
    for m in results {
        md.push_str(&row(m));
        md.push('\n');
    }
    md.push_str(&format!("\n`{}`\n", bench_line(results)));
    std::fs::write(out.join("results.md"), md)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(
            &serde_json::json!({ "context": context, "results": results }),
        )?,
    )?;
    plot(&out.join("throughput.svg"), results)?;
    Ok(())
}

fn plot(path: &Path, results: &[Measurement]) -> anyhow::Result<()> {
    let max_clients = results.iter().map(|m| m.clients).max().unwrap_or(1) as f64;
    let max_rate = results.iter().map(|m| m.debits_per_s).fold(1.0, f64::max) * 1.15;
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Debits per second against concurrent clients",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_clients * 1.05, 0.0..max_rate)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients")
        .y_desc("debits/s")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let colors = [RED, BLUE, GREEN];
    for (variant, color) in Variant::ALL.iter().zip(colors) {
        let points: Vec<(f64, f64)> = results
            .iter()
            .filter(|m| m.variant == *variant)
            .map(|m| (m.clients as f64, m.debits_per_s))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(variant.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
