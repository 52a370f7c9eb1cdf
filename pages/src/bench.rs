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
    };
    crate::page("ledger-harness bench", body)
}

fn number(value: &Value, decimals: usize) -> String {
    match value.as_f64() {
        Some(n) => format!("{n:.decimals$}"),
        None => text(value),
    }
}
