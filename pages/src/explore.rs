//! An exploration's `timeline.html`: operations and faults over time with violations
//! marked (the record's `timeline.svg`, drawn by explore from its history), the
//! violations the checker found, the fault plan and the report.

use std::path::Path;

use maud::{Markup, html};

/// The timeline page of the exploration record in `dir` (from `timeline.svg`,
/// `violations.json`, `faults.tsv`, `report.md` and `explore-line.txt`, each optional).
pub fn render(dir: &Path) -> Markup {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let line = read("explore-line.txt");
    let violations = crate::read_json(&dir.join("violations.json")).unwrap_or_default();
    let found: Vec<serde_json::Value> = match &violations {
        serde_json::Value::Array(list) => list.clone(),
        serde_json::Value::Object(map) => map
            .get("violations")
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let faults = read("faults.tsv");
    let body = html! {
        p { code #explore-line { (line.trim()) } }
        figure {
            img src="timeline.svg" alt="operations per client over time, faults as bands, violations marked";
            figcaption { "Operations per client over time, the nemesis's faults as bands, violations marked (timeline.svg)" }
        }
        h2 { "Violations (" (found.len()) ")" }
        @if found.is_empty() { p.pass #no-violations { "none: the checker found the history consistent" } }
        @else {
            ol #violations { @for violation in &found { li.fail { code { (crate::text(violation)) } } } }
        }
        h2 { "Faults" }
        @for comment in faults.lines().filter(|l| l.starts_with('#')) {
            p.muted { (comment.trim_start_matches('#').trim()) }
        }
        table #faults {
            @for (i, row) in faults.lines().filter(|l| !l.starts_with('#')).enumerate() {
                tr { @for cell in row.split('\t') { @if i == 0 { th { (cell) } } @else { td { (cell) } } } }
            }
        }
        h2 { "Report" }
        pre { (read("report.md")) }
    };
    crate::page("ledger-harness exploration", body)
}
