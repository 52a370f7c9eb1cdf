//! `harness --repeat N [IDS]` (`./run.sh --repeat N L3`): runs the same selection N
//! times, each as its own harness process (its own seed unless `--seed` is given, its own
//! cluster, its own run record), prints one line per run, then the failing runs with
//! their seed, record and FAIL lines, and ends with
//! `REPEAT runs=N passed_runs=P failed_runs=F`. Exit status 0 when every run passed, 1
//! when one failed (a check, or a harness error), 128 + signal when interrupted (the run
//! in progress records itself as interrupted; the rest do not start).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

/// The most runs `--repeat` accepts.
pub const MAX_REPEAT: u32 = 1_000;

/// The pid of the run in progress, for the signal handler (0: none).
static CHILD: AtomicI32 = AtomicI32::new(0);
/// The signal received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    SIGNAL.store(signal, Ordering::SeqCst);
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // A Ctrl-C reaches the child through the terminal's process group already; a
        // signal sent to this process alone is passed on. kill() is async-signal-safe.
        unsafe {
            libc::kill(child, signal);
        }
    }
}

/// One finished run.
struct Run {
    number: u32,
    code: Option<i32>,
    seed: String,
    evidence: String,
    last: String,
    fails: Vec<String>,
}

/// The arguments without `--repeat N` / `--repeat=N`.
fn forwarded() -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for arg in std::env::args_os().skip(1) {
        if skip_next {
            skip_next = false;
            continue;
        }
        let text = arg.to_string_lossy();
        if text == "--repeat" {
            skip_next = true;
        } else if !text.starts_with("--repeat=") {
            out.push(arg);
        }
    }
    out
}

/// Runs the selection `times` times and exits.
pub fn run(times: u32) -> ! {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        unsafe {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
    let args = forwarded();
    let exe = std::env::current_exe().expect("the harness's own path");
    let mut runs: Vec<Run> = Vec::new();
    for number in 1..=times {
        if SIGNAL.load(Ordering::SeqCst) != 0 {
            break;
        }
        let run = run_once(&exe, &args, number);
        println!(
            "repeat {number}/{times}: {} (seed={}, {})",
            if run.last.is_empty() {
                format!("exit {:?}", run.code)
            } else {
                run.last.clone()
            },
            run.seed,
            if run.evidence.is_empty() {
                "no evidence folder"
            } else {
                &run.evidence
            }
        );
        let interrupted = was_interrupted(run.code);
        runs.push(run);
        if interrupted {
            break;
        }
    }
    report(&runs, times, &args)
}

/// Whether a run's exit status (`None`: killed by a signal) says it was interrupted.
fn was_interrupted(code: Option<i32>) -> bool {
    matches!(code, Some(129 | 130 | 143) | None)
}

/// Runs the harness `exe` once with `args` as run `number` (its pid in [`CHILD`] while
/// it runs, for the signal handler) and reads from its standard output the seed, the
/// evidence folder, the last line and the failing cases' lines. Exits with status 2 when
/// the run cannot start.
fn run_once(exe: &std::path::Path, args: &[OsString], number: u32) -> Run {
    let mut child = match Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            eprintln!("harness: cannot start run {number}: {error}");
            std::process::exit(2);
        }
    };
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    let mut run = Run {
        number,
        code: None,
        seed: String::new(),
        evidence: String::new(),
        last: String::new(),
        fails: Vec::new(),
    };
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("seed=") {
            run.seed = rest.split_whitespace().next().unwrap_or("").to_string();
        } else if let Some(rest) = line.strip_prefix("evidence folder: ") {
            run.evidence = rest.split(" (").next().unwrap_or(rest).to_string();
        } else if line.trim_start().starts_with("FAIL") || line.starts_with("CASE ") {
            run.fails.push(line.clone());
        }
        if !line.trim().is_empty() {
            run.last = line;
        }
    }
    let status = child.wait();
    CHILD.store(0, Ordering::SeqCst);
    run.code = status.ok().and_then(|s| s.code());
    run.fails = failing_cases(std::mem::take(&mut run.fails));
    run
}

/// Of `lines` (CASE headers and FAIL lines, in output order), only the CASE lines followed
/// by a FAIL line, and those FAIL lines.
fn failing_cases(lines: Vec<String>) -> Vec<String> {
    let mut kept = Vec::new();
    let mut header: Option<String> = None;
    for line in lines {
        if line.starts_with("CASE ") {
            header = Some(line);
        } else {
            if let Some(h) = header.take() {
                kept.push(h);
            }
            kept.push(line);
        }
    }
    kept
}

/// Prints each failed run (its last line, seed, record, re-run command and FAIL lines)
/// and the closing REPEAT line, then exits: 128 + signal when interrupted, 1 when a run
/// failed, else 0.
fn report(runs: &[Run], times: u32, args: &[OsString]) -> ! {
    let finished: Vec<&Run> = runs
        .iter()
        .filter(|run| !was_interrupted(run.code))
        .collect();
    let failed: Vec<&&Run> = finished.iter().filter(|run| run.code != Some(0)).collect();
    for run in &failed {
        println!(
            "failed run {}: {} (seed={}, {}); re-run: ./run.sh --seed {} {}",
            run.number,
            run.last,
            run.seed,
            run.evidence,
            run.seed,
            selection_words(args)
        );
        for line in &run.fails {
            println!("    {line}");
        }
    }
    let signal = SIGNAL.load(Ordering::SeqCst);
    let passed = finished.len() - failed.len();
    if signal != 0 || finished.len() < runs.len() {
        println!(
            "REPEAT interrupted after {} of {times} runs: passed_runs={passed} failed_runs={}",
            finished.len(),
            failed.len()
        );
        std::process::exit(128 + if signal != 0 { signal } else { libc::SIGINT });
    }
    println!(
        "REPEAT runs={times} passed_runs={passed} failed_runs={}",
        failed.len()
    );
    std::process::exit(if failed.is_empty() { 0 } else { 1 });
}

/// The case ids and family prefixes among the forwarded arguments (for the re-run
/// command; options are left out, `--seed` is given anew).
fn selection_words(args: &[OsString]) -> String {
    let mut words = Vec::new();
    let mut after_value_flag = false;
    for arg in args {
        let text = arg.to_string_lossy();
        if after_value_flag {
            after_value_flag = false;
            continue;
        }
        if matches!(
            text.as_ref(),
            "--seed" | "--server-user" | "--pg-bin" | "--evidence-dir"
        ) {
            after_value_flag = true;
            continue;
        }
        if !text.starts_with('-') {
            words.push(text.into_owned());
        }
    }
    words.join(" ")
}
