//! Reads the header of every case file (`cases/*/src/*.rs`: `//! <ID> — …`, then
//! `Claim:` or `Anomaly:` and `Fails if:`) into `$OUT_DIR/case_headers.rs`, so a run's
//! `index.html` states each case's claim and what counts as failure as its file does.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let cases = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cases");
    println!("cargo::rerun-if-changed={}", cases.display());
    let mut entries = Vec::new();
    for family in std::fs::read_dir(&cases).into_iter().flatten().flatten() {
        let src = family.path().join("src");
        println!("cargo::rerun-if-changed={}", src.display());
        let mut files: Vec<_> = std::fs::read_dir(&src)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        for file in files {
            if let Ok(text) = std::fs::read_to_string(&file)
                && let Some(entry) = header(&text)
            {
                entries.push(entry);
            }
        }
    }
    let mut out = String::from(
        "/// (id, claim, fails if) of every case file's header.\npub const CASE_HEADERS: &[(&str, &str, &str)] = &[\n",
    );
    for (id, claim, fails) in entries {
        let _ = writeln!(out, "    ({id:?}, {claim:?}, {fails:?}),");
    }
    out.push_str("];\n");
    let target = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("case_headers.rs");
    std::fs::write(target, out).expect("writing case_headers.rs");
}

/// A label opening a header paragraph: `Claim:`, `Claim (…):`, `Fails if:`, `Setup:`.
fn label(line: &str) -> Option<(&str, &str)> {
    let (head, rest) = line.split_once(':')?;
    let name = head.split(" (").next().unwrap_or(head);
    let shaped = name.len() <= 12
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name.chars().all(|c| c.is_ascii_alphabetic() || c == ' ');
    shaped.then_some((name, rest.trim()))
}

/// `(id, claim, fails)` of a case file's `//!` header; `None` for another file.
fn header(text: &str) -> Option<(String, String, String)> {
    let lines: Vec<&str> = text
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(str::trim)
        .collect();
    let (id, intro) = lines.first()?.split_once(" — ")?;
    if id.contains(' ') {
        return None;
    }
    let mut sections: Vec<(String, String)> = vec![("Intro".into(), intro.to_string())];
    for line in &lines[1..] {
        if line.is_empty() || line.starts_with("- ") {
            sections.push(("Other".into(), String::new()));
        } else if let Some((name, rest)) = label(line) {
            sections.push((name.to_string(), rest.to_string()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push(' ');
            body.push_str(line);
        }
    }
    let find = |names: &[&str]| {
        sections
            .iter()
            .find(|(n, _)| names.contains(&n.as_str()))
            .map(|(_, b)| b.trim().to_string())
    };
    let claim = find(&["Claim", "Anomaly"])
        .or_else(|| find(&["Intro"]))
        .unwrap_or_default();
    let fails = find(&["Fails if"]).unwrap_or_default();
    Some((id.to_string(), claim, fails))
}
