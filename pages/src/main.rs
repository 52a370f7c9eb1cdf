//! `evidence-pages`: renders a page again from the files it is made of, for records
//! written before the pages existed or copied elsewhere.
//!
//! - `evidence-pages bench DIR`: `DIR/index.html` from `DIR/results.json` (`evidence/bench`).
//! - `evidence-pages matrix DIR`: `DIR/matrix.html` from `DIR/matrix.json` (`evidence`).
//! - `evidence-pages explore DIR`: `DIR/timeline.html` from an exploration's record.
//!
//! A run record's `index.html` needs the case files' headers the harness carries; it is
//! written by every run (`harness::write_run_page`).
//!
//! Exit status: 0 when the page was written, 2 on bad usage or unreadable input.

use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [what, dir] => render(what, Path::new(dir)),
        _ => Err(anyhow::anyhow!(
            "usage: evidence-pages bench|matrix|explore DIR"
        )),
    };
    match result {
        Ok(path) => println!("wrote {}", path.display()),
        Err(error) => {
            eprintln!("evidence-pages: {error:#}");
            std::process::exit(2);
        }
    }
}

/// Writes the page `what` of `dir`; returns its path.
///
/// Errors: an unknown page kind; the input cannot be read; the page cannot be written.
fn render(what: &str, dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let (path, page) = match what {
        "bench" => (
            dir.join("index.html"),
            evidence_pages::bench::render(&evidence_pages::read_json(&dir.join("results.json"))?),
        ),
        "matrix" => (
            dir.join("matrix.html"),
            evidence_pages::matrix::render(&evidence_pages::read_json(&dir.join("matrix.json"))?),
        ),
        "explore" => (
            dir.join("timeline.html"),
            evidence_pages::explore::render(dir),
        ),
        other => anyhow::bail!("unknown page {other:?}: bench, matrix or explore"),
    };
    evidence_pages::write(&path, &page)?;
    Ok(path)
}
