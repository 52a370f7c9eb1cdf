//! A run's `index.html`, from its record (`results.json`, `environment.json`, the
//! `<id>.txt` transcripts and `<id>.snap.diff` diffs): the SUMMARY, seed, re-run command
//! and environment; a table per family; then each case with its claim, what counts as
//! failure, its checks, its picture (a race's sessions, a spec's permutations), its
//! transcript and, when its snapshot differed, the diff.

use std::collections::BTreeMap;
use std::path::Path;

use maud::{Markup, html};
use serde_json::Value;

use crate::{diff_block, pictures, text};

/// What a case's file header says: the claim and what counts as failure.
#[derive(Debug, Clone, Default)]
pub struct Header {
    /// The case's claim (or, for a negative control, the anomaly it shows).
    pub claim: String,
    /// What counts as failure (`Fails if:`).
    pub fails: String,
}

/// The run in `dir`, read from its files; `headers` by case id (a spec case's own
/// claim and failure condition, recorded under its `details`, win over these).
///
/// Errors: `results.json` is missing or not JSON.
pub fn render(dir: &Path, headers: &BTreeMap<String, Header>) -> anyhow::Result<Markup> {
    let results = crate::read_json(&dir.join("results.json"))?;
    let environment = crate::read_json(&dir.join("environment.json")).unwrap_or(Value::Null);
    let empty = Vec::new();
    let cases = results["cases"].as_array().unwrap_or(&empty);
    let mut families: Vec<(String, Vec<&Value>)> = Vec::new();
    for case in cases {
        let family = text(&case["family"]);
        match families.iter_mut().find(|(name, _)| *name == family) {
            Some((_, members)) => members.push(case),
            None => families.push((family, vec![case])),
        }
    }
    let body = html! {
        (summary(&results, &environment))
        (environment_list(&environment))
        @for (family, members) in &families {
            h2 { "Family " (family) }
            (family_table(members, headers))
        }
        h2 { "Cases" }
        @for case in cases {
            (case_section(dir, case, headers))
        }
    };
    Ok(crate::page("ledger-harness run", body))
}

/// The SUMMARY line, seed and re-run command.
fn summary(results: &Value, environment: &Value) -> Markup {
    let status = text(&results["status"]);
    let class = if status == "pass" { "pass" } else { "fail" };
    html! {
        p {
            span.summary.(class) id="summary" {
                "SUMMARY passed=" (text(&results["passed"])) " failed=" (text(&results["failed"]))
            }
        }
        p {
            "seed " code id="seed" { (text(&results["seed"])) }
            " · re-run: " code id="replay" { (text(&environment["replay"])) }
            " · wall time " (text(&results["wall_ms"])) " ms"
        }
    }
}

/// Where and how the run ran.
fn environment_list(environment: &Value) -> Markup {
    let postgres = &environment["postgres"];
    let families: Vec<String> = environment["families"]
        .as_array()
        .map(|list| list.iter().map(text).collect())
        .unwrap_or_default();
    html! {
        h2 { "Environment" }
        dl.env {
            dt { "started at" } dd { (text(&environment["started_at"])) }
            dt { "command" } dd { code { (command(&environment["command"])) } }
            dt { "commit" } dd { code { (text(&environment["git_commit"])) } }
            dt { "families run" } dd { (families.join(", ")) }
            dt { "transfer mode" } dd { (transfer_mode(environment)) }
            @if postgres.is_object() {
                dt { "PostgreSQL" } dd { (text(&postgres["facts"]["version"])) }
                dt { "package" } dd {
                    @if postgres["package"].is_null() { (text(&postgres["binaries"])) }
                    @else { (text(&postgres["package"])) }
                }
                dt { "durability" } dd {
                    "fsync=" (text(&postgres["facts"]["fsync"]))
                    " synchronous_commit=" (text(&postgres["facts"]["synchronous_commit"]))
                    " full_page_writes=" (text(&postgres["facts"]["full_page_writes"]))
                }
            } @else {
                dt { "PostgreSQL" } dd.muted { "not started (no selected family needed it)" }
            }
            @if environment["sqlite"].is_object() {
                dt { "SQLite" } dd {
                    (text(&environment["sqlite"]["version"])) " — "
                    (text(&environment["sqlite"]["settings"]))
                }
            }
            @if let Some(not_run) = environment["not_run"].as_array().filter(|l| !l.is_empty()) {
                dt { "not run" } dd {
                    @for item in not_run { (text(&item["id"])) ": " (text(&item["reason"])) br; }
                }
            }
        }
    }
}

fn command(value: &Value) -> String {
    value
        .as_array()
        .map(|words| words.iter().map(text).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| text(value))
}

/// The run's transfer mode: its `--transfer-mode` option (default `statements`).
fn transfer_mode(environment: &Value) -> String {
    let words: Vec<String> = environment["command"]
        .as_array()
        .map(|list| list.iter().map(text).collect())
        .unwrap_or_default();
    for (i, word) in words.iter().enumerate() {
        if let Some(mode) = word.strip_prefix("--transfer-mode=") {
            return mode.to_string();
        }
        if word == "--transfer-mode"
            && let Some(mode) = words.get(i + 1)
        {
            return mode.clone();
        }
    }
    match &environment["transfer_mode"] {
        Value::String(mode) => mode.clone(),
        _ => "statements (default)".into(),
    }
}

/// A case's claim and failure condition: a spec case's own, else its file header's.
fn header_of(case: &Value, headers: &BTreeMap<String, Header>) -> Header {
    let details = &case["details"];
    if details["claim"].is_string() {
        return Header {
            claim: text(&details["claim"]),
            fails: text(&details["fails"]),
        };
    }
    headers.get(&text(&case["id"])).cloned().unwrap_or_default()
}

/// `holds`, `FAIL`, or for a negative control whose checks all passed, `control: anomaly shown`.
fn verdict(case: &Value) -> (&'static str, &'static str) {
    let failed = case["failed"].as_u64().unwrap_or(0);
    if failed > 0 {
        return ("FAIL", "fail");
    }
    let control = case["checks"].as_array().is_some_and(|checks| {
        checks
            .iter()
            .any(|c| text(&c["name"]).starts_with("negative control exposes"))
    });
    if control {
        ("ok: control exposes its anomaly", "pass")
    } else {
        ("ok: holds", "pass")
    }
}

fn family_table(members: &[&Value], headers: &BTreeMap<String, Header>) -> Markup {
    html! {
        table.family {
            tr { th { "id" } th { "title" } th { "claim" } th { "verdict" }
                 th { "checks ok" } th { "checks failed" } th { "duration (ms)" } }
            @for case in members {
                @let (word, class) = verdict(case);
                @let id = text(&case["id"]);
                tr.case-row.(class) data-case=(id) {
                    td { a href={ "#case-" (id) } { (id) } }
                    td { (text(&case["title"])) }
                    td { (header_of(case, headers).claim) }
                    td.(class) { (word) }
                    td.num { (text(&case["passed"])) }
                    td.num { (text(&case["failed"])) }
                    td.num { (text(&case["duration_ms"])) }
                }
            }
        }
    }
}

/// One case: claim, failure condition, checks, picture, transcript, diff.
fn case_section(dir: &Path, case: &Value, headers: &BTreeMap<String, Header>) -> Markup {
    let id = text(&case["id"]);
    let (word, class) = verdict(case);
    let header = header_of(case, headers);
    let transcript = std::fs::read_to_string(dir.join(format!("{id}.txt"))).unwrap_or_default();
    let diff = std::fs::read_to_string(dir.join(format!("{id}.snap.diff"))).ok();
    let empty = Vec::new();
    let checks = case["checks"].as_array().unwrap_or(&empty);
    html! {
        section.case.(class) id={ "case-" (id) } {
            h3 { (id) " — " (text(&case["title"])) " " span.(class) { "[" (word) "]" } }
            p { b { "Claim: " } (header.claim) }
            @if !header.fails.is_empty() { p { b { "Fails if: " } (header.fails) } }
            table.checks {
                tr { th { "" } th { "check" } th { "expected" } th { "actual" } }
                @for check in checks { (check_row(check)) }
            }
            (pictures::for_case(case, &transcript))
            @if let Some(diff) = &diff {
                h4 { "Snapshot → this run" }
                (diff_block(diff))
            }
            details open[class == "fail"] {
                summary { "transcript (" (transcript.lines().count()) " lines)" }
                pre.transcript { (transcript) }
            }
        }
    }
}

/// One check as a table row: ok/FAIL, its name, and what it compared: its expected
/// and actual values, a `rows:` check's expected and actual rows (each row that
/// differs marked), or a query's compared values (`available=5095100000`) in place of
/// the first column it printed (`?column?=t`), which says only that it held.
fn check_row(check: &Value) -> Markup {
    let passed = check["passed"].as_bool().unwrap_or(false);
    let class = if passed { "ok" } else { "fail" };
    let list = |key: &str| -> Option<Vec<String>> {
        check[key]
            .as_array()
            .map(|rows| rows.iter().map(text).collect())
    };
    let (expected_rows, actual_rows) = (list("expected_rows"), list("actual_rows"));
    let values = list("values").filter(|v| !v.is_empty());
    html! {
        tr.check.(class) {
            td.(class) { (if passed { "ok" } else { "FAIL" }) }
            td { (text(&check["name"])) }
            @match (&expected_rows, &actual_rows) {
                (Some(expected), Some(actual)) => {
                    td.compared.expected-rows { (rows_list(expected, actual)) }
                    td.compared.actual-rows { (rows_list(actual, expected)) }
                }
                _ => {
                    td { (text(&check["expected"])) }
                    @if let Some(values) = &values {
                        td.compared.values {
                            ul { @for value in values { li { code { (value) } } } }
                            span.muted { "printed: " (text(&check["actual"])) }
                        }
                    } @else {
                        td { (text(&check["actual"])) }
                    }
                }
            }
        }
    }
}

/// `rows` as a list, each row not at the same place in `other` marked `differs`.
fn rows_list(rows: &[String], other: &[String]) -> Markup {
    html! {
        ul {
            @if rows.is_empty() { li.muted { "no rows" } }
            @for (i, row) in rows.iter().enumerate() {
                @let differs = other.get(i) != Some(row);
                li.(if differs { "differs" } else { "same" }) { code { (row) } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record with a failing case whose transcript holds markup: the page shows the
    /// markup as text, marks the row FAIL and shows the diff.
    #[test]
    fn markup_in_a_record_is_escaped() {
        let dir = std::env::temp_dir().join(format!("evidence-pages-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let results = serde_json::json!({
            "status": "fail", "passed": 1, "failed": 1, "wall_ms": 5, "seed": 7,
            "cases": [{ "id": "X<b>1", "title": "t <i>", "family": "L", "passed": 1, "failed": 1,
                        "duration_ms": 3, "details": {},
                        "checks": [{ "name": "c <script>", "passed": false, "expected": "1", "actual": "2" }] }]
        });
        std::fs::write(dir.join("results.json"), results.to_string()).unwrap();
        std::fs::write(dir.join("X<b>1.txt"), "note <script>alert(1)</script>\n").unwrap();
        std::fs::write(dir.join("X<b>1.snap.diff"), "-a <img>\n+b\n").unwrap();
        let page = render(&dir, &BTreeMap::new()).unwrap().into_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            page.contains("note &lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        assert!(!page.contains("<script>"), "{page}");
        assert!(!page.contains("<img>") && !page.contains("<b>1"), "{page}");
        assert!(
            page.contains(r#"<tr class="case-row fail" data-case="X&lt;b&gt;1">"#),
            "{page}"
        );
        assert!(
            page.contains(r#"<span class="del">-a &lt;img&gt;"#),
            "{page}"
        );
    }

    /// A `rows:` check shows its expected and actual rows, the differing one marked; a
    /// query's compared values replace the `?column?=t` it printed.
    #[test]
    fn a_check_shows_what_it_compared() {
        let rows = serde_json::json!({ "name": "rows of SELECT n", "passed": false,
            "expected": null, "actual": null,
            "expected_rows": ["n=15"], "actual_rows": ["n=14"] });
        let page = check_row(&rows).into_string();
        assert!(
            page.contains(
                r#"<td class="compared expected-rows"><ul><li class="differs"><code>n=15</code>"#
            ),
            "{page}"
        );
        assert!(
            page.contains(r#"<li class="differs"><code>n=14</code>"#),
            "{page}"
        );
        let values = serde_json::json!({ "name": "SELECT available = 5 FROM balance",
            "passed": true, "expected": null, "actual": "?column?=t",
            "values": ["available=5"] });
        let page = check_row(&values).into_string();
        assert!(page.contains("<li><code>available=5</code></li>"), "{page}");
    }
}
