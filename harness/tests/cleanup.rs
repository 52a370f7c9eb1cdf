//! No process of a run outlives it, and its temporary folder goes: after SIGINT, SIGTERM
//! and SIGKILL of the harness in the middle of a run (SPEC §5).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long cleanup may take after the signal (the janitor waits for the postmaster).
const CLEANUP_DEADLINE_MS: u64 = 20_000;

/// Processes whose command line mentions `needle`, as (pid, command line).
fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.contains(") Z "));
        if cmdline.contains(needle) && !zombie {
            found.push((pid, cmdline));
        }
    }
    found
}

/// Starts the harness on L3, waits until postgres is up, sends `signal`, and checks that
/// every process of the run and its folder are gone.
fn interrupt_run(signal: nix::sys::signal::Signal) {
    let evidence = tempdir_for("evidence");
    let mut harness = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--evidence-dir"])
        .arg(&evidence)
        .args(["L3", "L1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("harness starts");
    let pid = harness.id();
    let run_dir = std::env::temp_dir().join(format!("ledger-harness-{pid}"));
    let mut stdout = BufReader::new(harness.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "harness ended before postgres started"
        );
        if line.starts_with("postgres ") {
            break;
        }
    }
    let needle = run_dir.display().to_string();
    assert!(
        processes_mentioning(&needle).len() >= 2,
        "postmaster and janitor run: {:?}",
        processes_mentioning(&needle)
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
    let status = harness.wait().unwrap();
    assert!(
        !status.success(),
        "interrupted run does not report success: {status:?}"
    );

    let deadline = Instant::now() + Duration::from_millis(CLEANUP_DEADLINE_MS);
    loop {
        let left = processes_mentioning(&needle);
        if left.is_empty() && !run_dir.exists() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {signal:?}: processes {left:?}, folder exists: {}",
            run_dir.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(evidence);
}

fn tempdir_for(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cleanup-test-{what}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn sigint_mid_run_leaves_nothing() {
    interrupt_run(nix::sys::signal::Signal::SIGINT);
}

#[test]
fn sigterm_mid_run_leaves_nothing() {
    interrupt_run(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn sigkill_mid_run_leaves_nothing() {
    interrupt_run(nix::sys::signal::Signal::SIGKILL);
}

/// Longest wait for the first case of the interrupted run to finish, milliseconds.
const FIRST_CASE_DEADLINE_MS: u64 = 60_000;

/// SIGINT after L1 finished and while L18 (about 8 s of bounded waits) still runs: the
/// run's folder gets `results.json` saying `interrupted` with L1's checks and L18 as
/// unfinished, the last line says INTERRUPTED with the counts (no SUMMARY line), and
/// `evidence/latest` still points where it pointed before.
#[test]
fn sigint_records_an_interrupted_run_and_leaves_latest_alone() {
    let evidence = tempdir_for("interrupted");
    std::fs::create_dir_all(evidence.join("runs/earlier")).unwrap();
    std::os::unix::fs::symlink("runs/earlier", evidence.join("latest")).unwrap();
    let (status, text, run) = interrupt_once_l1_finished(&evidence, &["L1", "L18"]);
    assert_eq!(status.code(), Some(130), "{text}");
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("INTERRUPTED signal=SIGINT passed=")
            && last.ends_with("cases_finished=1/2"),
        "last line: {last:?}"
    );
    assert!(
        !text.contains("SUMMARY"),
        "an interrupted run printed SUMMARY: {text}"
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["status"], "interrupted");
    assert_eq!(results["signal"], "SIGINT");
    assert_eq!(results["cases"][0]["id"], "L1");
    assert!(results["passed"].as_u64().unwrap() > 0, "{results}");
    assert_eq!(results["unfinished"], serde_json::json!(["L18"]));
    assert!(
        last.contains(&format!(
            "passed={} failed={}",
            results["passed"], results["failed"]
        )),
        "{last} vs {results}"
    );
    assert_eq!(
        std::fs::read_link(evidence.join("latest")).unwrap(),
        PathBuf::from("runs/earlier"),
        "latest moved to an interrupted run"
    );
    let _ = std::fs::remove_dir_all(evidence);
}

/// `--repeat` interrupted by a SIGINT sent to the repeating harness alone: it passes the
/// signal to the run in progress, which records itself as interrupted; no further run
/// starts, and the last line says REPEAT interrupted (exit 130).
#[test]
fn sigint_stops_a_repeat_after_the_run_in_progress() {
    let evidence = tempdir_for("repeat-interrupted");
    let (status, text, run) =
        interrupt_once_l1_finished(&evidence, &["--repeat", "3", "L1", "L18"]);
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(
        text.contains("repeat 1/3: INTERRUPTED signal=SIGINT"),
        "{text}"
    );
    assert!(!text.contains("repeat 2/3"), "a second run started: {text}");
    assert_eq!(
        text.lines().last().unwrap_or_default(),
        "REPEAT interrupted after 0 of 3 runs: passed_runs=0 failed_runs=0"
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["status"], "interrupted");
    assert!(
        !evidence.join("latest").exists(),
        "latest points at an interrupted run"
    );
    let _ = std::fs::remove_dir_all(evidence);
}

/// Runs the harness with `args` on `evidence`, sends it SIGINT as soon as a run folder
/// holds `L1.txt` (L1 finished), and returns its exit status, its standard output and
/// that run folder.
fn interrupt_once_l1_finished(
    evidence: &Path,
    args: &[&str],
) -> (std::process::ExitStatus, String, PathBuf) {
    let mut harness = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--evidence-dir"])
        .arg(evidence)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("harness starts");
    let pid = harness.id();
    let mut stdout = harness.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
        text
    });
    let deadline = Instant::now() + Duration::from_millis(FIRST_CASE_DEADLINE_MS);
    let run = loop {
        let finished = std::fs::read_dir(evidence.join("runs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .find(|dir| dir.join("L1.txt").exists());
        if let Some(run) = finished {
            break run;
        }
        assert!(Instant::now() < deadline, "L1 never finished");
        std::thread::sleep(Duration::from_millis(20));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = harness.wait().unwrap();
    let text = reader.join().unwrap();
    (status, text, run)
}
