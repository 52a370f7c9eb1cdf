//! A run's `index.html` in a real browser (headless Chromium, Debian's `chromium`):
//! a scratch run with failing cases (the canary, and L1 against a snapshot changed on
//! purpose) is rendered and its DOM checked — one row per case, the FAIL rows, the
//! failing checks, the diff, and the canary's hostile markup shown as text, never run
//! nor turned into an element — and a screenshot is saved into that run's record. When
//! `evidence/latest` exists (after `./run.sh`) its page is checked the same way and its
//! screenshot saved beside it as `screenshot.png`.
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
    std::fs::copy(
        repo().join("evidence/snapshots/S/S1.snap"),
        root.join("evidence/snapshots/S/S1.snap"),
    )
    .unwrap();
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

    assert_eq!(
        seen.rows,
        vec![
            ("CANARY".into(), true),
            ("L1".into(), true),
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

    let shot = screenshot(binary, &page);
    println!("screenshot of a failing run: {}", shot.display());
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
