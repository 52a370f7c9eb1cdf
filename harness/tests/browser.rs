//! A run's `index.html` in a real browser (headless Chromium, Debian's `chromium`):
//! a scratch run with failing cases (the canary, and L1 against a snapshot changed on
//! purpose) is rendered and its DOM checked — one row per case, the FAIL rows, the
//! failing checks, the diff, and the canary's hostile markup shown as text, never run
//! nor turned into an element — and a screenshot is saved into that run's record. When
//! `evidence/latest` exists (after `./run.sh`) its page is checked the same way and its
//! screenshot saved beside it as `screenshot.png`. The scratch run's pictures are
//! checked for what a reviewer reads at a glance (a legend on each, results coloured by
//! their kind and in their own words, a check's compared rows and values), and a record
//! made up with one racer of each outcome kind shows each in its kind's colour.
//!
//! Chromium is installed with apt when the test runs as root and it is missing; where
//! it cannot be had, the test says why and passes without checking.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Hang bound for one Chromium invocation, seconds (the machine may be loaded).
const CHROMIUM_BOUND_S: u32 = 180;

/// The flags Chromium needs here: headless, no sandbox as root, and nothing that reaches
/// for the network (without them it hangs on refused connections).
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Chromium's path, installing Debian's package when root and missing; `Err(reason)`
/// when it cannot be had.
fn chromium() -> Result<&'static str, String> {
    if on_path("chromium") {
        return Ok("chromium");
    }
    if !nix::unistd::Uid::effective().is_root() {
        return Err(
            "chromium is not installed and the test is not root (apt-get install chromium)".into(),
        );
    }
    if !on_path("apt-get") {
        return Err("chromium is not installed and there is no apt-get".into());
    }
    let install = || {
        Command::new("apt-get")
            .args([
                "-o",
                "DPkg::Lock::Timeout=600",
                "install",
                "-y",
                "-q",
                "chromium",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "update", "-q"])
            .status();
        install();
    }
    if on_path("chromium") {
        Ok("chromium")
    } else {
        Err("apt-get install chromium did not give a chromium binary".into())
    }
}

/// Runs Chromium on `page` with `extra` arguments and a fresh profile; its stdout.
fn run_chromium(binary: &str, page: &Path, extra: &[String]) -> String {
    let profile = tempfile_dir("profile");
    let output = Command::new("timeout")
        .arg(CHROMIUM_BOUND_S.to_string())
        .arg(binary)
        .args(FLAGS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn tempfile_dir(name: &str) -> PathBuf {
    // The tests of this file run on threads of one process, each Chromium with a profile
    // of its own: two sharing one folder meet at its `SingletonLock` and the second exits.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "ledger-harness-browser-{name}-{}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What a page's DOM shows: the case rows and which of them FAIL.
struct Dom {
    text: String,
    rows: Vec<(String, bool)>,
}

fn dom(binary: &str, page: &Path) -> Dom {
    let text = run_chromium(binary, page, &["--dump-dom".to_string()]);
    let row = regex::Regex::new(r#"<tr class="case-row (pass|fail)" data-case="([^"]+)""#).unwrap();
    let rows = row
        .captures_iter(&text)
        .map(|c| (c[2].to_string(), &c[1] == "fail"))
        .collect();
    Dom { text, rows }
}

/// Saves a full-page screenshot of `page` as `<its folder>/screenshot.png`.
fn screenshot(binary: &str, page: &Path) -> PathBuf {
    let shot = page.parent().unwrap().join("screenshot.png");
    run_chromium(
        binary,
        page,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,4000".into(),
        ],
    );
    let bytes = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        bytes.starts_with(b"\x89PNG"),
        "{} is no PNG",
        shot.display()
    );
    shot
}

/// The cases of a record's `results.json`: (id, failed).
fn results(record: &Path) -> Vec<(String, bool)> {
    let text = std::fs::read_to_string(record.join("results.json")).unwrap();
    let results: serde_json::Value = serde_json::from_str(&text).unwrap();
    results["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["failed"].as_u64().unwrap() > 0,
            )
        })
        .collect()
}

#[test]
fn a_failing_run_in_a_real_browser() {
    let binary = match chromium() {
        Ok(binary) => binary,
        Err(reason) => {
            println!("browser test skipped: {reason}");
            return;
        }
    };
    let scratch = Scratch(tempfile_dir("run"));
    let root = &scratch.0;
    let snapshots = root.join("evidence/snapshots/L");
    std::fs::create_dir_all(&snapshots).unwrap();
    std::fs::create_dir_all(root.join("evidence/snapshots/S")).unwrap();
    for snapshot in ["S/S1", "L/L3", "L/L-S11"] {
        std::fs::copy(
            repo().join(format!("evidence/snapshots/{snapshot}.snap")),
            root.join(format!("evidence/snapshots/{snapshot}.snap")),
        )
        .unwrap();
    }
    let good = std::fs::read_to_string(repo().join("evidence/snapshots/L/L1.snap")).unwrap();
    let broken = good.replace("outcome=OK balance=700", "outcome=OK balance=701");
    assert_ne!(good, broken, "the committed L1 snapshot changed shape");
    std::fs::write(snapshots.join("L1.snap"), broken).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args([
            "--evidence-dir",
            "evidence",
            "--seed",
            "7",
            "CANARY",
            "L1",
            "S1",
            "L3",
            "L-S11",
        ])
        .current_dir(root)
        .env("CI", "true")
        .env_remove("INSTA_UPDATE")
        .output()
        .expect("harness runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let record = std::fs::canonicalize(root.join("evidence/latest")).unwrap();
    let page = record.join("index.html");
    let seen = dom(binary, &page);

    let mut rows = seen.rows.clone();
    rows.sort();
    assert_eq!(
        rows,
        vec![
            ("CANARY".into(), true),
            ("L-S11".into(), false),
            ("L1".into(), true),
            ("L3".into(), false),
            ("S1".into(), false)
        ],
        "case rows"
    );
    assert_eq!(seen.rows.len(), results(&record).len());
    assert!(seen.text.contains("SUMMARY passed="), "no SUMMARY");
    let canary_check = html_text(harness::CANARY_CHECK);
    assert!(
        seen.text.contains(&format!(
            r#"<td class="fail">FAIL</td><td>{canary_check}</td>"#
        )),
        "the canary's FAIL check row in {}",
        snippet(&seen.text, "FAIL</td>")
    );
    let diff_line =
        regex::Regex::new(r#"<span class="del">-\s+note\s+outcome=OK balance=701"#).unwrap();
    assert!(
        diff_line.is_match(&seen.text),
        "L1's diff in {}",
        snippet(&seen.text, "class=\"del\"")
    );
    // The hostile note: shown as text, not run (the title stays), not an element.
    assert!(
        seen.text.contains(
            "&lt;script&gt;document.title='pwned'&lt;/script&gt;&lt;img src=x id=hostile-markup&gt;"
        ),
        "the escaped hostile string"
    );
    assert!(
        seen.text.contains("<title>ledger-harness run</title>"),
        "the page's title changed: a script ran"
    );
    assert!(
        !seen.text.contains(r#"id="hostile-markup""#),
        "the hostile markup became an element"
    );

    pictures_tell_the_truth(&seen.text);
    compared_in_the_record(&record);

    let shot = screenshot(binary, &page);
    println!("screenshot of a failing run: {}", shot.display());
}

/// The page of the scratch run (L3 a race, L-S11 an upstream spec, S1 a case file on
/// SQLite with `rows:` checks): every picture has its legend; L3's results are coloured
/// by kind (OK green, INSUFFICIENT red) and labelled in their own words, not Rust debug
/// text; L-S11's deadlock victim is a refused step in a swimlane; S1's `rows:` checks
/// show expected and actual rows; L3's `check:` shows the balance it compared, not
/// `?column?=t` alone.
fn pictures_tell_the_truth(page: &str) {
    let figures = page.matches("<figure").count();
    let legends = page.matches(r#"<div class="legend">"#).count();
    assert!(
        figures >= 4,
        "L1, S1, L3 and L-S11 each draw a picture: {figures}"
    );
    assert_eq!(figures, legends, "a legend on every picture");
    let l3 = section(page, "L3");
    for (kind, colour, words) in [
        ("ok", OK_COLOUR, "outcome=OK balance="),
        ("refused", REFUSED_COLOUR, "outcome=INSUFFICIENT balance=2"),
    ] {
        let bar = regex::Regex::new(&format!(
            r#"<rect class="bar" data-kind="{kind}" [^>]*fill="{colour}""#
        ))
        .unwrap();
        assert!(
            bar.is_match(&l3),
            "L3's {kind} bars in {colour}: {}",
            snippet(&l3, "<rect")
        );
        assert!(l3.contains(words), "L3's label {words:?}");
    }
    assert!(
        !l3.contains("Ok(&quot;") && !l3.contains("Ok(\""),
        "debug text in L3's labels"
    );
    assert!(
        l3.contains("<li><code>balance=2</code></li>"),
        "L3's compared balance"
    );
    let ls11 = section(page, "L-S11");
    assert!(
        ls11.contains(r#"<figure class="spec">"#)
            && ls11.contains(r#"<rect class="step" data-kind="refused""#),
        "L-S11's swimlane with its refused step: {}",
        snippet(&ls11, "<figure")
    );
    let s1 = section(page, "S1");
    assert!(
        s1.contains(
            r#"<td class="compared expected-rows"><ul><li class="same"><code>units=120</code>"#
        ) && s1.contains(
            r#"<td class="compared actual-rows"><ul><li class="same"><code>units=120</code>"#
        ),
        "S1's rows: check with both sides: {}",
        snippet(&s1, "expected-rows")
    );
}

/// The scratch run's `results.json`: S1's `rows:` check on the units holds its expected
/// and actual rows, L3's `check:` on the balance the value it compared.
fn compared_in_the_record(record: &Path) {
    let text = std::fs::read_to_string(record.join("results.json")).unwrap();
    let results: serde_json::Value = serde_json::from_str(&text).unwrap();
    let check = |id: &str, prefix: &str| -> serde_json::Value {
        let cases = results["cases"].as_array().unwrap();
        let case = cases.iter().find(|c| c["id"] == id).expect(id);
        let checks = case["checks"].as_array().unwrap();
        let found = checks
            .iter()
            .find(|c| c["name"].as_str().unwrap().starts_with(prefix));
        found
            .unwrap_or_else(|| panic!("{id}: no check {prefix}"))
            .clone()
    };
    let rows = check("S1", "rows of SELECT units FROM stock");
    assert_eq!(
        rows["expected_rows"],
        serde_json::json!(["units=120"]),
        "{rows}"
    );
    assert_eq!(
        rows["actual_rows"],
        serde_json::json!(["units=120"]),
        "{rows}"
    );
    let balance = check("L3", "SELECT balance = 2 FROM account");
    assert_eq!(
        balance["values"],
        serde_json::json!(["balance=2"]),
        "{balance}"
    );
}

/// The colours of the kinds ok and refused (`evidence_pages::kinds::Kind::colour`).
const OK_COLOUR: &str = "#3d8b2f";
const REFUSED_COLOUR: &str = "#c0392b";

/// Case `id`'s section of a page's DOM.
fn section(page: &str, id: &str) -> String {
    let start = page
        .find(&format!(r#"id="case-{id}""#))
        .unwrap_or_else(|| panic!("no section for {id}"));
    let end = page[start..]
        .find("</section>")
        .map_or(page.len(), |e| start + e);
    page[start..end].to_string()
}

/// A record made up to hold one racer of each outcome kind (no real run can be made to
/// end a racer as unknown or as a failed call on purpose): each bar in its kind's
/// colour, the legend naming all four kinds with their counts.
#[test]
fn one_result_of_each_kind_in_a_real_browser() {
    let binary = match chromium() {
        Ok(binary) => binary,
        Err(reason) => {
            println!("browser test skipped: {reason}");
            return;
        }
    };
    let scratch = Scratch(tempfile_dir("kinds"));
    let sessions: Vec<serde_json::Value> = [
        r#"Ok("outcome=OK balance=93")"#,
        r#"Ok("outcome=INSUFFICIENT balance=2")"#,
        r#"Ok("status=503 outcome=UNKNOWN")"#,
        r#"Err("the racer panicked")"#,
    ]
    .iter()
    .enumerate()
    .map(|(i, outcome)| serde_json::json!({ "start_us": i * 10, "end_us": 100 + i * 10, "outcome": outcome }))
    .collect();
    let results = serde_json::json!({
        "status": "pass", "passed": 1, "failed": 0, "wall_ms": 1, "seed": 1,
        "cases": [{ "id": "K1", "title": "one of each kind", "family": "L", "passed": 1,
                    "failed": 0, "duration_ms": 1, "details": { "races": [{ "sessions": sessions }] },
                    "checks": [{ "name": "outcomes", "passed": true, "expected": "x", "actual": "x" }] }]
    });
    std::fs::write(scratch.0.join("results.json"), results.to_string()).unwrap();
    std::fs::write(scratch.0.join("K1.txt"), "CASE K1 :: one of each kind\n").unwrap();
    harness::write_run_page(&scratch.0).expect("the page");
    let seen = dom(binary, &scratch.0.join("index.html"));
    for (kind, colour) in [
        ("ok", OK_COLOUR),
        ("refused", REFUSED_COLOUR),
        ("unknown", "#d68910"),
        ("error", "#6c3483"),
    ] {
        let bar = format!(r#"<rect class="bar" data-kind="{kind}" "#);
        let at = seen
            .text
            .find(&bar)
            .unwrap_or_else(|| panic!("no {kind} bar"));
        let tag = &seen.text[at..at + seen.text[at..].find('>').unwrap()];
        assert!(
            tag.contains(&format!(r#"fill="{colour}""#)),
            "{kind} in {colour}: {tag}"
        );
        let key = regex::Regex::new(&format!(
            r#"(?s)<span class="key" data-kind="{kind}">.*?\((\d+)\)"#
        ))
        .unwrap();
        let count = key.captures(&seen.text).map(|c| c[1].to_string());
        assert_eq!(count.as_deref(), Some("1"), "the legend counts one {kind}");
    }
    assert!(!seen.text.contains("Err(&quot;"), "debug text on the page");
}

/// A scratch folder, removed on drop (also when an assertion fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `evidence/latest/index.html` of the last `./run.sh`, when there is one.
#[test]
fn the_latest_run_in_a_real_browser() {
    let latest = repo().join("evidence/latest");
    let Ok(record) = std::fs::canonicalize(&latest) else {
        println!("latest-run browser check skipped: no evidence/latest (run ./run.sh first)");
        return;
    };
    let page = record.join("index.html");
    if !page.exists() {
        // A record from before the pages existed: render it now.
        harness::write_run_page(&record).expect("rendering the latest record");
    }
    let binary = match chromium() {
        Ok(binary) => binary,
        Err(reason) => {
            println!("browser test skipped: {reason}");
            return;
        }
    };
    let seen = dom(binary, &page);
    // The page groups the cases by family; results.json lists them in run order.
    let (mut rows, mut expected) = (seen.rows.clone(), results(&record));
    rows.sort();
    expected.sort();
    assert_eq!(
        rows, expected,
        "one row per case, FAIL where a check failed"
    );
    let shot = screenshot(binary, &page);
    println!(
        "screenshot of the latest run ({} cases): {}",
        seen.rows.len(),
        shot.display()
    );
}

/// `text` as the DOM serialises it inside an element.
fn html_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Up to 300 characters of `text` around `needle`, for a failure message.
fn snippet(text: &str, needle: &str) -> String {
    let at = text.find(needle).unwrap_or(0);
    text.chars()
        .skip(at.saturating_sub(100))
        .take(300)
        .collect()
}
