//! `matrix.html` beside `matrix.md`: each case's verdict per PostgreSQL major, from
//! `matrix.json`, with the runs and any understood differences.

use maud::{Markup, html};
use serde_json::Value;

use crate::text;

/// The matrix page from `matrix.json`'s value.
pub fn render(matrix: &Value) -> Markup {
    let empty = Vec::new();
    let versions = matrix["versions"].as_array().unwrap_or(&empty);
    let cases = matrix["cases"].as_array().unwrap_or(&empty);
    let majors: Vec<String> = versions.iter().map(|v| text(&v["major"])).collect();
    let body = html! {
        p { "seed " code { (text(&matrix["seed"])) } " · commit " code { (text(&matrix["git_commit"])) }
            " · re-run: " code { (text(&matrix["command"])) } " · wall time " (text(&matrix["wall_ms"])) " ms" }
        h2 { "Runs" }
        table #versions {
            tr { th { "major" } th { "server" } th { "package" } th { "exit" } th { "checks ok" } th { "checks failed" } th { "wall (ms)" } th { "record" } }
            @for version in versions {
                @let failed = version["failed"].as_u64().unwrap_or(0) > 0 || version["exit_code"].as_i64() != Some(0);
                tr.(if failed { "fail" } else { "pass" }) {
                    td { (text(&version["major"])) } td { (text(&version["server_version"])) }
                    td { (text(&version["package"])) } td.num { (text(&version["exit_code"])) }
                    td.num { (text(&version["passed"])) } td.num { (text(&version["failed"])) }
                    td.num { (text(&version["wall_ms"])) } td { code { (text(&version["run_dir"])) } }
                }
            }
        }
        h2 { "Cases" }
        table #cases {
            tr { th { "id" } th { "title" } @for major in &majors { th { "PostgreSQL " (major) } } }
            @for case in cases {
                tr.case-row {
                    td { (text(&case["id"])) } td { (text(&case["title"])) }
                    @for major in &majors {
                        @let cell = &case["results"][major.as_str()];
                        @let status = text(&cell["status"]);
                        @if status.is_empty() { td.muted { "—" } }
                        @else {
                            td.(if status == "pass" { "pass" } else { "fail" }) {
                                (if status == "pass" { "ok" } else { "FAIL" }) " "
                                span.muted { (text(&cell["passed"])) "/" (text(&cell["failed"])) " · " (text(&cell["duration_ms"])) " ms" }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Differences between majors" }
        @if matrix["differences"].as_array().is_none_or(|d| d.is_empty()) {
            p { "none: every case's redacted transcript is the same on every major" }
        } @else {
            pre { (serde_json::to_string_pretty(&matrix["differences"]).unwrap_or_default()) }
        }
    };
    crate::page("ledger-harness matrix", body)
}
