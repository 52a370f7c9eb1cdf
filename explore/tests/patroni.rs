//! `--topology patroni`: a short exploration (150 s of load, 4 clients) against the
//! Patroni cluster (etcd, two Patroni nodes in `synchronous_mode`, HAProxy) must end
//! with exit status 0, `violations=0`, and every one of the seven kinds of its rounds
//! (`kill-service`, `pause`, `withhold`, `kill-leader`, `pause-leader`, `stop-standby`,
//! `switchover`) counted at least once as a fault that took effect; its cluster folder
//! must be gone afterwards. About 3 minutes (each cluster fault waits out a 20 s lease
//! or a rejoin). Root only, with the Patroni programs cached or fetchable (as R6–R11);
//! otherwise it says why and passes without running. Uses the debug `ledger-svc` next
//! to the `explore` binary (`cargo build --bins`).

use std::process::Command;

/// Seconds of load: a full round of seven kinds takes about 1.5 minutes.
const DURATION_S: &str = "150";

// Ignored by default: three minutes of Patroni failovers would push `.ci/run` past its
// 20-minute budget, and R6–R11 (in `./run.sh`) already fail each fault over in CI. Run
// it with `cargo test -p explore --test patroni -- --ignored` (docs/explore.md).
#[test]
#[ignore = "three minutes of Patroni failovers; run with -- --ignored (docs/explore.md)"]
fn a_patroni_exploration_runs_every_fault_with_no_violation() {
    if let Err(why) = scratch_pg::patroni::fetch(&scratch_pg::binaries::default_cache_dir()) {
        eprintln!("the Patroni exploration not run: {why}");
        return;
    }
    let evidence = tempfile::tempdir().expect("temporary folder");
    let child = Command::new(env!("CARGO_BIN_EXE_explore"))
        .args(["--seed", "11", "--duration-s", DURATION_S, "--clients", "4"])
        .args(["--topology", "patroni"])
        .arg("--evidence-dir")
        .arg(evidence.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running explore");
    let pid = child.id();
    let output = child.wait_with_output().expect("explore's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "explore must end clean\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("EXPLORE seed=11 "), "last line: {last}");
    assert!(last.contains(" violations=0"), "{last}");
    assert!(!last.contains("missing-faults"), "{last}");
    for kind in [
        "kill-service",
        "pause",
        "withhold",
        "kill-leader",
        "pause-leader",
        "stop-standby",
        "switchover",
    ] {
        let count: usize = last
            .split([' ', '(', ')'])
            .find_map(|word| word.strip_prefix(&format!("{kind}:")))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{kind} not named: {last}"));
        assert!(count >= 1, "{kind} never took effect: {last}");
    }
    let work = std::env::temp_dir().join(format!("explore-patroni-{pid}"));
    assert!(!work.exists(), "{} left behind", work.display());
}
