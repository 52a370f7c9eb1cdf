//! Static HTML pages of the evidence, each self-contained (opens from `file://`: inline
//! CSS and SVG, no script, no network): a run's `index.html` ([`run::render`]), the
//! matrix's `matrix.html` ([`matrix::render`]), an exploration's `timeline.html`
//! ([`explore::render`]) and the bench's `index.html` ([`bench::render`]).
//!
//! Made with maud: templates are Rust code checked at compile time, and every value
//! spliced into one is HTML-escaped unless wrapped in `PreEscaped` (used only for
//! the fixed style sheet), so a transcript holding `<script>` renders as text. The pages
//! are built from the files a record already holds (`results.json`, the transcripts,
//! the diffs), so an older record can be rendered again.

pub mod bench;
pub mod explore;
pub mod kinds;
pub mod matrix;
pub mod pictures;
pub mod run;

use std::path::Path;

use maud::{DOCTYPE, Markup, PreEscaped, html};

/// The style sheet every page inlines.
const STYLE: &str = include_str!("style.css");

/// A whole page: `title` in `<title>` and `<h1>`, then `body`.
pub fn page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { (title) }
                (body)
            }
        }
    }
}

/// Writes `markup` to `path`.
///
/// Errors: file system errors, with the path.
pub fn write(path: &Path, markup: &Markup) -> anyhow::Result<()> {
    std::fs::write(path, markup.0.as_bytes())
        .map_err(|error| anyhow::anyhow!("writing {}: {error}", path.display()))
}

/// Reads a JSON file.
///
/// Errors: the file is missing or not JSON, with the path.
pub fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| anyhow::anyhow!("reading {}: {error}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|error| anyhow::anyhow!("parsing {}: {error}", path.display()))
}

/// A JSON value as text: strings without quotes, `null` as an empty string.
pub fn text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A unified diff as a `<pre>`, each line classed `add`, `del` or `hunk`.
pub fn diff_block(diff: &str) -> Markup {
    html! {
        pre.diff {
            @for line in diff.lines() {
                @let class = if line.starts_with("+++") || line.starts_with("---") {
                    "file"
                } else if line.starts_with('+') {
                    "add"
                } else if line.starts_with('-') {
                    "del"
                } else if line.starts_with("@@") {
                    "hunk"
                } else {
                    "same"
                };
                span class=(class) { (line) "\n" }
            }
        }
    }
}
