//! The bench end to end in about two and a half minutes (most of it the counted sessions
//! under valgrind): every variant at 2 clients, one repetition of
//! 1 s after a 100 ms warm-up, 50 funded accounts, one round of paired slices, 12 counted
//! debits per counted variant. It must exit 0, reconcile every point clean without a
//! failed debit, fill the CPU column (the service's own figure only for the service),
//! print a counted line for every counted variant, write its four files (the page too)
//! and end with a BENCH line holding the paired and counted figures. Starts a scratch
//! cluster and the debug `ledger-svc` found next to the `bench` binary (`cargo build
//! --bins` builds both). The figures themselves are not checked: a test asserts
//! behaviour, the bench reports speed.

use std::process::Command;

#[test]
fn a_short_bench_measures_every_variant() {
    let out = tempfile::tempdir().expect("temporary folder");
    let output = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--duration-s", "1", "--warmup-ms", "100", "--repeat", "1"])
        .args(["--clients", "2", "--accounts", "50", "--seed", "7"])
        .args([
            "--count-debits",
            "12",
            "--pair-rounds",
            "1",
            "--pair-slice-s",
            "1",
        ])
        .arg("--out")
        .arg(out.path())
        .env_remove("LEDGER_HARNESS_AUTH")
        .output()
        .expect("running bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|line| line.starts_with("| ") && !line.starts_with("| variant"))
        .map(|line| line.split('|').map(str::trim).collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|cells| cells[1]).collect();
    assert_eq!(
        names,
        [
            "ceiling",
            "raw",
            "service",
            "fix",
            "onetrip",
            "onetrip+fix",
            "batch",
            "service+batch"
        ],
        "{stdout}"
    );
    for cells in &rows {
        // ["", variant, clients, debits/s, share, p50, p99, lock-wait, CPU, batch sizes,
        //  ok, errors, reconciled, rates, ""]
        assert_eq!(cells[2], "2", "{cells:?}");
        assert!(
            cells[10].parse::<u64>().unwrap() > 0,
            "no OK debit: {cells:?}"
        );
        assert_eq!(cells[11], "0", "failed debits: {cells:?}");
        assert_eq!(cells[12], "clean", "{cells:?}");
        let batched = cells[1].contains("batch");
        assert_eq!(cells[9] != "-", batched, "batch sizes: {cells:?}");
        let cpu: Vec<&str> = cells[8].split(" / ").collect();
        assert_eq!(cpu.len(), 3, "{cells:?}");
        assert_ne!(cpu[0], "-", "load CPU: {cells:?}");
        assert_ne!(cpu[2], "-", "PostgreSQL CPU: {cells:?}");
        assert_eq!(
            cpu[1] != "-",
            cells[1].starts_with("service"),
            "service CPU: {cells:?}"
        );
    }
    let counted: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("counted "))
        .filter_map(|line| line.split(':').next())
        .collect();
    assert_eq!(
        counted,
        [
            "ceiling",
            "raw",
            "service",
            "fix",
            "onetrip",
            "onetrip+fix",
            "batch@1",
            "batch@12",
            "service+batch@1",
            "floor@1",
            "floor@12"
        ],
        "{stdout}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("BENCH service/raw@8=n/a ")
            && last.contains(" best_ceiling_pct@8=n/a")
            && last.contains(" servicebatch/onetripfix@32=n/a "),
        "no 8-client point, so every @8 figure is n/a: {last}"
    );
    for figure in [
        "batch/onetripfix@32_ci95=",
        "batch_ceiling_pct@32_ci95=",
        "batch/floor_insns@12=",
        "wal_bytes_per_debit@batch=",
    ] {
        assert!(last.contains(figure), "{figure} missing: {last}");
    }
    assert!(!last.contains("wal_bytes_per_debit@batch=n/a"), "{last}");
    for file in ["results.md", "results.json", "throughput.svg", "index.html"] {
        assert!(out.path().join(file).is_file(), "{file} missing");
    }
}
