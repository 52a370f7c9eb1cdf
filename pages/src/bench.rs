//! The bench page (`evidence/bench/index.html`): its plot (`throughput.svg`, beside it)
//! and its table, from `results.json`.

use maud::{Markup, html};
use serde_json::Value;

use crate::text;

/// The bench page from `results.json`'s value.
pub fn render(results: &Value) -> Markup {
    let context = &results["context"];
    let postgres = &context["postgres"];
    let empty = Vec::new();
    let points = results["points"].as_array().unwrap_or(&empty);
    let body = html! {
        p { "PostgreSQL " (text(&postgres["server_version"])) " (fsync=" (text(&postgres["fsync"]))
            ", synchronous_commit=" (text(&postgres["synchronous_commit"]))
            ", full_page_writes=" (text(&postgres["full_page_writes"])) ") · "
            (text(&context["machine"])) " · seed " code { (text(&context["seed"])) }
            " · " (text(&context["repeat"])) " repetitions of " (text(&context["duration_s"])) " s" }
        figure {
            img src="throughput.svg" alt="debits per second against clients, per variant";
            figcaption { "Debits per second against clients (throughput.svg)" }
        }
        table #points {
            tr { th { "variant" } th { "clients" } th { "median debits/s" } th { "rates (each repetition)" }
                 th { "share of ceiling" } th { "p50 ms" } th { "p99 ms" } th { "lock-wait share" } th { "reconciled" } th { "findings" } }
            @for point in points {
                @let median = &point["median"];
                @let clean = point["reconciled_clean"].as_bool().unwrap_or(false);
                tr.point.(if clean { "pass" } else { "fail" }) {
                    td { (text(&point["variant"])) } td.num { (text(&point["clients"])) }
                    td.num { (number(&median["debits_per_s"], 0)) }
                    td { (point["rates_per_s"].as_array().map(|r| r.iter().map(|v| number(v, 0)).collect::<Vec<_>>().join(", ")).unwrap_or_default()) }
                    td.num { (number(&point["share_of_ceiling"], 3)) }
                    td.num { (text(&median["p50_ms"])) } td.num { (text(&median["p99_ms"])) }
                    td.num { (number(&median["lock_wait_share"], 2)) }
                    td.(if clean { "ok" } else { "fail" }) { (if clean { "clean" } else { "NOT CLEAN" }) }
                    td { (text(&point["findings"])) }
                }
            }
        }
        (counted(results))
        (paired(&results["paired"]))
    };
    crate::page("ledger-harness bench", body)
}

/// The counted figures' table (`counted` in results.json), none when not counted.
fn counted(results: &Value) -> Markup {
    let empty = Vec::new();
    let rows = results["counted"].as_array().unwrap_or(&empty);
    html! {
        @if !rows.is_empty() {
            h2 { "Counted, not timed (per debit; the ceiling per commit)" }
            table #counted {
                tr { th { "counted variant" } th { "PostgreSQL instructions" } th { "WAL bytes" } th { "commits" }
                     th { "heap tuples" } th { "index entries" } th { "idem_request HOT share" } }
                @for row in rows {
                    tr {
                        td { (text(&row["variant"])) } td.num { (number(&row["insns_per_debit"], 0)) }
                        td.num { (number(&row["wal_bytes_per_debit"], 0)) } td.num { (number(&row["commits_per_debit"], 3)) }
                        td.num { (number(&row["heap_tuples_per_debit"], 2)) } td.num { (number(&row["index_entries_per_debit"], 2)) }
                        td.num { (number(&row["idem_hot_share"], 2)) }
                    }
                }
            }
        }
    }
}

/// The paired slices' medians and intervals (`paired` in results.json), none when not
/// measured.
fn paired(paired: &Value) -> Markup {
    let interval = |figure: &Value, decimals: usize| {
        format!(
            "{} [{}, {}]",
            number(&figure["median"], decimals),
            number(&figure["low"], decimals),
            number(&figure["high"], decimals)
        )
    };
    html! {
        @if paired.is_object() {
            h2 { "Timed in pairs (32 clients, median [95% interval] of the per-round ratios)" }
            table #paired {
                tr { th { "rounds" } th { "slice s" } th { "batch / ceiling, %" } th { "batch / onetrip+fix" } }
                tr { td.num { (text(&paired["rounds"])) } td.num { (text(&paired["slice_s"])) }
                     td.num { (interval(&paired["batch_ceiling_pct"], 0)) }
                     td.num { (interval(&paired["batch_onetripfix"], 2)) } }
            }
        }
    }
}

fn number(value: &Value, decimals: usize) -> String {
    match value.as_f64() {
        Some(n) => format!("{n:.decimals$}"),
        None => text(value),
    }
}
