//! The explorer's checker can fail: a short run (8 s of load) against ledger-svc started
//! with the planted bug `reexecute-known-keys` (a known key is executed again under a
//! derived key) must end with exit status 1 and report `phantom-effect` — transactions
//! that no operation of the history asked for — although the ledger's own reconciliation
//! stays clean. Starts a scratch cluster and the debug `ledger-svc` found next to the
//! `explore` binary (`cargo build --bins` builds both).

use std::process::Command;

#[test]
fn the_planted_bug_is_caught_in_a_short_run() {
    let evidence = tempfile::tempdir().expect("temporary folder");
    let output = Command::new(env!("CARGO_BIN_EXE_explore"))
        .args(["--seed", "7", "--duration-s", "8", "--clients", "4"])
        .args(["--planted-bug", "reexecute-known-keys"])
        .arg("--evidence-dir")
        .arg(evidence.path())
        .output()
        .expect("running explore");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "explore must find violations\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("EXPLORE seed=7 "), "last line: {last}");
    assert!(
        last.contains("phantom-effect:"),
        "the re-executions must show as phantom effects: {last}"
    );
    assert!(
        !last.contains("reconcile-"),
        "reconciliation stays clean: {last}"
    );
    let run = std::fs::read_dir(evidence.path().join("explore"))
        .expect("run folders")
        .filter_map(Result::ok)
        .find(|entry| entry.file_name() != "latest")
        .expect("one run folder")
        .path();
    for file in [
        "history.jsonl",
        "operations.tsv",
        "faults.tsv",
        "report.md",
        "timeline.svg",
        "final-state.json",
    ] {
        assert!(
            run.join(file).is_file(),
            "{file} missing in {}",
            run.display()
        );
    }
}
