//! What a person reads: the summary table, the checker's report (`report.md`), the
//! violations as JSON, and the timeline picture (`timeline.svg`).

use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::checker::{Report, excerpt};
use crate::history::{Event, Phase};
use crate::plan::FaultKind;

/// Most history lines printed per excerpt (all are in `violations.json`).
pub const MAX_EXCERPT_LINES: usize = 30;
/// Width of one time bucket of the timeline, milliseconds: attempts within a bucket of a
/// client are drawn as one bar with the worst outcome (info over fail over ok).
pub const TIMELINE_BUCKET_MS: u64 = 50;

/// The summary table (Markdown; also readable as plain text), with a row per fault
/// kind of `kinds` (the run's: `crate::run::shown_kinds`).
pub fn summary_table(report: &Report, kinds: &[FaultKind]) -> String {
    let c = &report.counts;
    let mut text = String::new();
    let _ = writeln!(text, "| what | count |");
    let _ = writeln!(text, "|---|---|");
    let _ = writeln!(text, "| operations | {} |", c.ops);
    let _ = writeln!(
        text,
        "| - acknowledged (201) / refused (409, 404, 422) / unknown (info) / unsent | {} / {} / {} / {} |",
        c.acknowledged, c.refused, c.unknown, c.unsent
    );
    let _ = writeln!(
        text,
        "| - unknown that the database shows executed | {} |",
        c.unknown_executed
    );
    let _ = writeln!(
        text,
        "| - key reused with another payload | {} |",
        c.key_reuses
    );
    let _ = writeln!(
        text,
        "| attempts (ok / fail / info) | {} ({} / {} / {}) |",
        c.attempts, c.attempts_ok, c.attempts_fail, c.attempts_info
    );
    let _ = writeln!(text, "| - retries with the same key | {} |", c.retries);
    let _ = writeln!(text, "| - answers replayed | {} |", c.replays);
    for kind in kinds {
        let _ = writeln!(
            text,
            "| faults: {} | {} |",
            kind.as_str(),
            c.faults.get(kind.as_str()).copied().unwrap_or(0)
        );
    }
    let _ = writeln!(
        text,
        "| faults without effect (nothing passed the hook) | {} |",
        c.faults_without_effect
    );
    let _ = writeln!(text, "| violations | {} |", report.violations.len());
    for group in &report.groups {
        let _ = writeln!(text, "| - {} | {} |", group.kind, group.count);
    }
    text
}

/// The violations by kind, each with its first and its smallest excerpt.
pub fn violations_text(report: &Report, raw: &[String]) -> String {
    let mut text = String::new();
    if report.groups.is_empty() {
        text.push_str("No violations.\n");
        return text;
    }
    for group in &report.groups {
        let _ = writeln!(text, "### {} ({})\n", group.kind, group.count);
        let _ = writeln!(
            text,
            "first (t={:.3} s): {}\n",
            group.first.t_us as f64 / 1e6,
            group.first.summary
        );
        let _ = writeln!(
            text,
            "```\n{}```\n",
            excerpt(raw, &group.first.lines, MAX_EXCERPT_LINES)
        );
        if group.smallest != group.first {
            let _ = writeln!(
                text,
                "smallest excerpt ({} lines, t={:.3} s): {}\n",
                group.smallest.lines.len(),
                group.smallest.t_us as f64 / 1e6,
                group.smallest.summary
            );
            let _ = writeln!(
                text,
                "```\n{}```\n",
                excerpt(raw, &group.smallest.lines, MAX_EXCERPT_LINES)
            );
        } else {
            text.push_str("(the first is also the smallest)\n\n");
        }
    }
    text
}

/// Colour of an outcome: the run page's colours of its kinds (`evidence_pages::kinds`,
/// docs/pages.md), so one colour means one kind on every page: ok green `#3d8b2f`, fail
/// (a definite no: refused) red `#c0392b`, info (unknown) amber `#d68910`.
fn outcome_colour(rank: u8) -> RGBColor {
    match rank {
        1 => RGBColor(0x3d, 0x8b, 0x2f), // ok
        2 => RGBColor(0xc0, 0x39, 0x2b), // fail: refused
        _ => RGBColor(0xd6, 0x89, 0x10), // info: unknown
    }
}

/// Colour of each fault kind's window, none of them an outcome kind's hue.
fn fault_colour(kind: FaultKind) -> RGBColor {
    match kind {
        FaultKind::KillService => RGBColor(0, 140, 140),
        FaultKind::CrashPostgres => RGBColor(120, 80, 40),
        FaultKind::Pause => RGBColor(0, 130, 200),
        FaultKind::Withhold => RGBColor(200, 0, 120),
        FaultKind::PowerCut => RGBColor(60, 60, 60),
        FaultKind::KillLeader => RGBColor(200, 60, 0),
        FaultKind::PauseLeader => RGBColor(120, 0, 200),
        FaultKind::StopStandby => RGBColor(0, 150, 60),
        FaultKind::Switchover => RGBColor(180, 150, 0),
    }
}

/// The chart of the timeline: seconds across, lanes up.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// What the timeline shows, read from the history.
struct Tally {
    /// Per client, each [`TIMELINE_BUCKET_MS`] bucket's worst outcome: 0 no attempt,
    /// 1 ok, 2 fail, 3 info.
    lanes: Vec<Vec<u8>>,
    /// Each fault's kind, start and end, microseconds.
    windows: Vec<(FaultKind, u64, u64)>,
    /// The history's last time, microseconds (at least 1).
    end_us: u64,
}

/// Draws the timeline: one lane per client (its attempts, coloured by outcome, in
/// [`TIMELINE_BUCKET_MS`] buckets) and the nemesis's windows as shaded spans with a lane
/// of their own on top.
///
/// Errors: drawing or writing failed.
pub fn timeline(path: &Path, events: &[(usize, Event)], clients: u32) -> anyhow::Result<()> {
    let tally = tally(events, clients);
    let height = 140 + 28 * (clients + 1);
    let root = SVGBackend::new(path, (1400, height)).into_drawing_area();
    root.fill(&WHITE).map_err(drawing)?;
    let mut chart = chart(&root, clients, tally.end_us)?;
    draw_windows(&mut chart, &tally.windows, clients)?;
    draw_lanes(&mut chart, &tally.lanes)?;
    draw_legend(&root)?;
    root.present().map_err(drawing)?;
    Ok(())
}

/// Reads `events` into lanes for `clients` clients and fault windows (an attempt marks
/// every bucket from its `invoke` to its end; a window needs its start and its end).
fn tally(events: &[(usize, Event)], clients: u32) -> Tally {
    let end_us = events
        .iter()
        .map(|(_, e)| e.t_us())
        .max()
        .unwrap_or(1)
        .max(1);
    let bucket_us = TIMELINE_BUCKET_MS * 1_000;
    let buckets = (end_us / bucket_us + 1) as usize;
    let mut lanes = vec![vec![0u8; buckets]; clients as usize];
    let mut open: std::collections::HashMap<(u32, u64), u64> = Default::default();
    let mut windows: Vec<(FaultKind, u64, u64)> = Vec::new();
    let mut starts: std::collections::HashMap<u32, (FaultKind, u64)> = Default::default();
    for (_, event) in events {
        match event {
            Event::Invoke {
                t_us, client, op, ..
            } => {
                open.insert((*client, *op), *t_us);
            }
            Event::Ok(c) | Event::Fail(c) | Event::Info(c) => {
                let rank = match event {
                    Event::Ok(_) => 1,
                    Event::Fail(_) => 2,
                    _ => 3,
                };
                if let Some(from) = open.remove(&(c.client, c.op))
                    && let Some(lane) = lanes.get_mut(c.client as usize)
                {
                    for bucket in (from / bucket_us)..=(c.t_us / bucket_us) {
                        let slot = &mut lane[bucket as usize];
                        *slot = (*slot).max(rank);
                    }
                }
            }
            Event::Nemesis {
                t_us,
                fault,
                kind,
                phase,
                ..
            } => match phase {
                Phase::Start => {
                    starts.insert(*fault, (*kind, *t_us));
                }
                Phase::End => {
                    if let Some((kind, from)) = starts.remove(fault) {
                        windows.push((kind, from, *t_us));
                    }
                }
            },
            _ => {}
        }
    }
    Tally {
        lanes,
        windows,
        end_us,
    }
}

/// A drawing error as the run's error.
fn drawing<E: std::error::Error + Send + Sync>(error: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("{error}")
}

/// `us` microseconds in seconds.
fn seconds(us: u64) -> f64 {
    us as f64 / 1e6
}

/// The chart on `root`, its caption, axes and lane labels drawn: 0 to `end_us` across,
/// lanes centred on integers (client i on i, the nemesis on `clients`).
fn chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    clients: u32,
    end_us: u64,
) -> anyhow::Result<Chart<'a, 'b>> {
    let nemesis_lane = clients as f64;
    let top = clients as f64 + 0.5;
    let mut chart = ChartBuilder::on(root)
        .caption(
            "Operations per client (green ok, red fail: refused, amber info: unknown) and nemesis windows",
            ("sans-serif", 18),
        )
        .margin(12)
        .margin_top(30)
        .x_label_area_size(36)
        .y_label_area_size(110)
        .build_cartesian_2d(0.0..seconds(end_us), -0.5..top)
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("seconds since the start")
        .y_labels(clients as usize + 3)
        .y_label_formatter(&|y| {
            let lane = y.round();
            if (y - lane).abs() > 0.01 || lane < 0.0 || lane > nemesis_lane {
                String::new()
            } else if lane == nemesis_lane {
                "nemesis".to_owned()
            } else {
                format!("client {lane}")
            }
        })
        .draw()
        .map_err(drawing)?;
    Ok(chart)
}

/// Each fault's window: a light span across the clients' lanes and a solid bar in the
/// nemesis lane, kind by kind.
fn draw_windows(
    chart: &mut Chart<'_, '_>,
    windows: &[(FaultKind, u64, u64)],
    clients: u32,
) -> anyhow::Result<()> {
    let top = clients as f64 + 0.5;
    for kind in FaultKind::ALL {
        let colour = fault_colour(kind);
        let spans: Vec<Rectangle<(f64, f64)>> = windows
            .iter()
            .filter(|(k, _, _)| *k == kind)
            .flat_map(|(_, from, to)| {
                [
                    Rectangle::new(
                        [(seconds(*from), 0.0), (seconds(*to), clients as f64)],
                        colour.mix(0.12).filled(),
                    ),
                    Rectangle::new(
                        [
                            (seconds(*from), clients as f64 + 0.15),
                            (seconds(*to), top - 0.15),
                        ],
                        colour.filled(),
                    ),
                ]
            })
            .collect();
        chart.draw_series(spans).map_err(drawing)?;
    }
    Ok(())
}

/// Each client's lane: one bar per run of buckets with the same outcome.
fn draw_lanes(chart: &mut Chart<'_, '_>, lanes: &[Vec<u8>]) -> anyhow::Result<()> {
    let bucket_us = TIMELINE_BUCKET_MS * 1_000;
    for (client, lane) in lanes.iter().enumerate() {
        let mut bars = Vec::new();
        let mut run_start = 0usize;
        for bucket in 1..=lane.len() {
            if bucket == lane.len() || lane[bucket] != lane[run_start] {
                if lane[run_start] > 0 {
                    let from = (run_start as u64 * bucket_us) as f64 / 1e6;
                    let to = (bucket as u64 * bucket_us) as f64 / 1e6;
                    bars.push(Rectangle::new(
                        [(from, client as f64 - 0.3), (to, client as f64 + 0.3)],
                        outcome_colour(lane[run_start]).filled(),
                    ));
                }
                run_start = bucket;
            }
        }
        chart.draw_series(bars).map_err(drawing)?;
    }
    Ok(())
}

/// The legend of the fault kinds, in a row above the plot.
fn draw_legend(root: &DrawingArea<SVGBackend<'_>, Shift>) -> anyhow::Result<()> {
    for (i, kind) in FaultKind::ALL.iter().enumerate() {
        let x = 130 + 140 * i as i32;
        root.draw(&Rectangle::new(
            [(x, 8), (x + 14, 20)],
            fault_colour(*kind).filled(),
        ))
        .map_err(drawing)?;
        root.draw(&Text::new(kind.as_str(), (x + 20, 7), ("sans-serif", 14)))
            .map_err(drawing)?;
    }
    Ok(())
}
