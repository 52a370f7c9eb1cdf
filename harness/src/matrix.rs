//! `./run.sh matrix`: the selected cases (every default case unless named) once per
//! supported PostgreSQL major ([`scratch_pg::versions::PINNED`], oldest first), one
//! ordinary harness run each (`harness --pg N --seed S`, the same seed for all), then
//! `evidence/matrix.md` and `evidence/matrix.json`: one row per case, one column per
//! version, pass/fail and the case's duration; and every case whose redacted transcript
//! differs between versions, with the diff against the default major's transcript.
//!
//! Each run compares its transcripts with the one set of snapshots, so a transcript that
//! depends on the version also fails that run's snapshot check; [`EXPLAINED`] says why
//! such a difference is expected, and the matrix prints it next to the diff.
//!
//! Each run's own record stays in `evidence/runs/` (its folder is named in the matrix);
//! its standard output is kept as `evidence/runs/matrix-<stamp>/pg<N>.out`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// Exit status of a matrix in which a run failed a check.
const EXIT_CHECK_FAILED: i32 = 1;
/// Exit status when a run could not be made or read.
const EXIT_HARNESS_ERROR: i32 = 2;

/// Version-dependent transcript differences that are understood: (case id, why). Empty:
/// no case's transcript has differed between 15, 16, 17 and 18 so far (LIMITS.md).
pub const EXPLAINED: &[(&str, &str)] = &[];

/// What the matrix passes on to each run.
#[derive(Debug, Clone)]
pub struct MatrixArgs {
    /// Case ids or family prefixes; empty: every default case.
    pub cases: Vec<String>,
    /// The seed of every run; `None`: one drawn from the clock, shared by all.
    pub seed: Option<u64>,
    /// The evidence folder (`matrix.md`, `matrix.json` and the runs go there).
    pub evidence_dir: PathBuf,
    /// `--sequential` for each run.
    pub sequential: bool,
    /// `--server-user` for each run.
    pub server_user: String,
}

/// One case's result in one run (from its `results.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CaseCell {
    status: String,
    passed: usize,
    failed: usize,
    duration_ms: u128,
}

/// One version's run.
#[derive(Debug, Clone, Serialize)]
struct VersionRun {
    major: u32,
    server_version: String,
    package: String,
    exit_code: i32,
    passed: usize,
    failed: usize,
    wall_ms: u128,
    run_dir: String,
    output: String,
}

/// A case whose redacted transcript is not the same on every version.
#[derive(Debug, Clone, Serialize)]
struct Difference {
    id: String,
    /// The versions that share one transcript, group by group (the default major's
    /// group first).
    groups: Vec<Vec<u32>>,
    /// Unified diff: the default major's transcript → each other group's.
    diff: String,
    /// Why, when the difference is understood ([`EXPLAINED`]); `null` otherwise.
    explanation: Option<String>,
}

/// One row.
#[derive(Debug, Clone, Serialize)]
struct CaseRow {
    id: String,
    title: String,
    family: String,
    /// Major (as text) → result; a version whose run lacks the case has no entry.
    results: BTreeMap<String, CaseCell>,
}

/// `evidence/matrix.json`.
#[derive(Debug, Serialize)]
struct Matrix {
    started_at: String,
    git_commit: String,
    seed: u64,
    command: String,
    wall_ms: u128,
    versions: Vec<VersionRun>,
    cases: Vec<CaseRow>,
    differences: Vec<Difference>,
}

#[derive(Deserialize)]
struct ResultsFile {
    cases: Vec<ResultCase>,
}

#[derive(Deserialize)]
struct ResultCase {
    id: String,
    title: String,
    family: String,
    status: String,
    passed: usize,
    failed: usize,
    duration_ms: u128,
}

/// Runs the matrix and returns the exit status: 0 when every run passed, 1 when a run
/// failed a check, 2 when a run could not be made or read.
pub fn run(args: &MatrixArgs) -> i32 {
    match run_matrix(args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("harness matrix: {error:#}");
            EXIT_HARNESS_ERROR
        }
    }
}

/// Runs every pinned major in turn, writes `matrix.json` and `matrix.md`, prints the
/// outcome and returns the exit status ([`run`] says which).
///
/// Errors: the output folder, a run, its record or the matrix files could not be made
/// or read.
fn run_matrix(args: &MatrixArgs) -> anyhow::Result<i32> {
    let launched = Instant::now();
    let started_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let majors: Vec<u32> = scratch_pg::versions::PINNED
        .iter()
        .map(|release| release.major)
        .collect();
    println!(
        "matrix: PostgreSQL {} with seed={seed} (one full run each)",
        scratch_pg::versions::supported_list()
    );
    let out_dir = args.evidence_dir.join("runs").join(format!(
        "matrix-{}-{}",
        started_at.replace(':', ""),
        std::process::id()
    ));
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let harness = std::env::current_exe().context("locating the harness binary")?;
    // A bar on a terminal, a status line per major off one (case_kit::progress).
    let progress = case_kit::progress::Progress::new("matrix", majors.len() as u64);
    let runs = run_versions(&harness, args, &majors, seed, &out_dir, &progress)?;

    let cases = rows(&majors, &runs.results);
    let differences = differences(&majors, &cases, &runs.transcripts);
    let matrix = Matrix {
        started_at,
        git_commit: crate::evidence::git_commit(),
        seed,
        command: command_text(args, seed),
        wall_ms: launched.elapsed().as_millis(),
        versions: runs.versions,
        cases,
        differences,
    };
    let json_path = args.evidence_dir.join("matrix.json");
    let md_path = args.evidence_dir.join("matrix.md");
    fs::write(&json_path, serde_json::to_string_pretty(&matrix)? + "\n")?;
    fs::write(&md_path, markdown(&matrix))?;
    let html_path = args.evidence_dir.join("matrix.html");
    evidence_pages::write(
        &html_path,
        &evidence_pages::matrix::render(&serde_json::to_value(&matrix)?),
    )?;
    println!("matrix page: {}", html_path.display());
    print_outcome(&matrix, &md_path, &json_path);
    Ok(exit_status(&matrix))
}

/// What the versions' runs left: one [`VersionRun`] each, and per major its results file
/// and its redacted transcripts (case id → text).
struct Runs {
    versions: Vec<VersionRun>,
    results: BTreeMap<u32, ResultsFile>,
    transcripts: BTreeMap<u32, BTreeMap<String, String>>,
}

/// Runs the `harness` binary once per major in `majors` (output kept as
/// `out_dir/pg<N>.out`, steps shown on `progress`) and reads each run's record.
///
/// Errors: a run could not start, named no evidence folder, or left a record that cannot
/// be read.
fn run_versions(
    harness: &Path,
    args: &MatrixArgs,
    majors: &[u32],
    seed: u64,
    out_dir: &Path,
    progress: &case_kit::progress::Progress,
) -> anyhow::Result<Runs> {
    let mut runs = Runs {
        versions: Vec::new(),
        results: BTreeMap::new(),
        transcripts: BTreeMap::new(),
    };
    for &major in majors {
        let output = out_dir.join(format!("pg{major}.out"));
        progress.start_step(&format!("PostgreSQL {major}"));
        let (exit_code, run_dir) = run_one(harness, args, major, seed, &output, progress)?;
        progress.finish_step();
        let run_dir = run_dir.with_context(|| {
            format!(
                "the PostgreSQL {major} run (exit {exit_code}) named no evidence folder; see {}",
                output.display()
            )
        })?;
        let (version, file, by_case) = read_run(major, exit_code, &run_dir, &output)?;
        runs.versions.push(version);
        runs.results.insert(major, file);
        runs.transcripts.insert(major, by_case);
    }
    Ok(runs)
}

/// Reads one version's run from its evidence folder `run_dir`: its [`VersionRun`] (with
/// the run's `exit_code` and standard output file `output`), its results file, and its
/// transcripts redacted (case id → text).
///
/// Errors: `environment.json`, `results.json` or a case's transcript is missing or
/// unreadable.
fn read_run(
    major: u32,
    exit_code: i32,
    run_dir: &Path,
    output: &Path,
) -> anyhow::Result<(VersionRun, ResultsFile, BTreeMap<String, String>)> {
    let record: serde_json::Value = read_json(&run_dir.join("environment.json"))?;
    let file: ResultsFile = read_json(&run_dir.join("results.json"))?;
    let mut by_case = BTreeMap::new();
    for case in &file.cases {
        let raw = fs::read_to_string(run_dir.join(format!("{}.txt", case.id)))
            .with_context(|| format!("{} transcript of {}", case.id, run_dir.display()))?;
        by_case.insert(case.id.clone(), case_kit::redact::redact(&raw));
    }
    let text = |pointer: &str| {
        record
            .pointer(pointer)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let version = VersionRun {
        major,
        server_version: text("/postgres/facts/server_version"),
        package: text("/postgres/package"),
        exit_code,
        passed: file.cases.iter().map(|c| c.passed).sum(),
        failed: file.cases.iter().map(|c| c.failed).sum(),
        wall_ms: record
            .pointer("/durations/wall_ms")
            .and_then(|v| v.as_u64())
            .unwrap_or(0) as u128,
        run_dir: run_dir.display().to_string(),
        output: output.display().to_string(),
    };
    Ok((version, file, by_case))
}

/// Prints the matrix's closing lines: its wall time, the version-dependent transcripts,
/// the files written, and each version's SUMMARY.
fn print_outcome(matrix: &Matrix, md_path: &Path, json_path: &Path) {
    let unexplained = matrix
        .differences
        .iter()
        .filter(|d| d.explanation.is_none())
        .count();
    println!(
        "matrix: wall {:.1} s; {} case(s) with a version-dependent transcript ({unexplained} unexplained); written {} and {}",
        matrix.wall_ms as f64 / 1000.0,
        matrix.differences.len(),
        md_path.display(),
        json_path.display()
    );
    for run in &matrix.versions {
        println!(
            "matrix: PostgreSQL {} ({}): SUMMARY passed={} failed={}",
            run.major, run.server_version, run.passed, run.failed
        );
    }
}

/// The matrix's exit status: 0 when every run passed, [`EXIT_HARNESS_ERROR`] when a run
/// ended in a harness error, else [`EXIT_CHECK_FAILED`].
fn exit_status(matrix: &Matrix) -> i32 {
    let all_passed = matrix
        .versions
        .iter()
        .all(|run| run.exit_code == 0 && run.failed == 0);
    if all_passed {
        0
    } else if matrix.versions.iter().any(|run| run.exit_code == 2) {
        EXIT_HARNESS_ERROR
    } else {
        EXIT_CHECK_FAILED
    }
}

/// Runs one version: its standard output goes to `output`, the lines that say how it
/// goes (`postgres …`, failed checks, `run:`, `SUMMARY`) also to ours with a `[pg N]`
/// tag. Returns its exit status and the evidence folder it named.
fn run_one(
    harness: &Path,
    args: &MatrixArgs,
    major: u32,
    seed: u64,
    output: &Path,
    progress: &case_kit::progress::Progress,
) -> anyhow::Result<(i32, Option<PathBuf>)> {
    let mut command = Command::new(harness);
    command
        .arg("--evidence-dir")
        .arg(&args.evidence_dir)
        .args(["--pg", &major.to_string(), "--seed", &seed.to_string()])
        .args(["--server-user", &args.server_user]);
    if args.sequential {
        command.arg("--sequential");
    }
    command.args(&args.cases).stdout(Stdio::piped());
    progress.println(&format!(
        "[pg {major}] running: harness --pg {major} --seed {seed}"
    ));
    let mut child = command.spawn().context("starting a harness run")?;
    let mut log =
        fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    let mut run_dir = None;
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        writeln!(log, "{line}")?;
        if let Some(rest) = line.strip_prefix("evidence: ") {
            let path = rest.split(" (").next().unwrap_or(rest);
            run_dir = Some(PathBuf::from(path));
        }
        if line.starts_with("postgres ")
            || line.starts_with("SUMMARY ")
            || line.starts_with("run: ")
            || line.trim_start().starts_with("FAIL")
            || line.starts_with("re-run")
        {
            progress.println(&format!("[pg {major}] {line}"));
        }
    }
    let status = child.wait()?;
    Ok((status.code().unwrap_or(EXIT_HARNESS_ERROR), run_dir))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// One row per case, in the order of the first run that has it.
fn rows(majors: &[u32], results: &BTreeMap<u32, ResultsFile>) -> Vec<CaseRow> {
    let mut rows: Vec<CaseRow> = Vec::new();
    for major in majors {
        let Some(file) = results.get(major) else {
            continue;
        };
        for case in &file.cases {
            let row = match rows.iter_mut().find(|row| row.id == case.id) {
                Some(row) => row,
                None => {
                    rows.push(CaseRow {
                        id: case.id.clone(),
                        title: case.title.clone(),
                        family: case.family.clone(),
                        results: BTreeMap::new(),
                    });
                    rows.last_mut().expect("just pushed")
                }
            };
            row.results.insert(
                major.to_string(),
                CaseCell {
                    status: case.status.clone(),
                    passed: case.passed,
                    failed: case.failed,
                    duration_ms: case.duration_ms,
                },
            );
        }
    }
    rows
}

/// The cases whose redacted transcripts are not all equal. The reference is the default
/// major's transcript (the one the snapshots were accepted on), else the first.
fn differences(
    majors: &[u32],
    rows: &[CaseRow],
    transcripts: &BTreeMap<u32, BTreeMap<String, String>>,
) -> Vec<Difference> {
    let reference_major = if majors.contains(&scratch_pg::versions::DEFAULT_MAJOR) {
        scratch_pg::versions::DEFAULT_MAJOR
    } else {
        majors[0]
    };
    let mut found = Vec::new();
    for row in rows {
        let missing = String::from("(not run on this version)\n");
        let text_of = |major: u32| {
            transcripts
                .get(&major)
                .and_then(|by_case| by_case.get(&row.id))
                .unwrap_or(&missing)
                .clone()
        };
        let reference = text_of(reference_major);
        let mut groups: Vec<(String, Vec<u32>)> = vec![(reference.clone(), vec![])];
        let order = std::iter::once(reference_major)
            .chain(majors.iter().copied().filter(|m| *m != reference_major));
        for major in order {
            let text = text_of(major);
            match groups.iter_mut().find(|(t, _)| *t == text) {
                Some((_, members)) => members.push(major),
                None => groups.push((text, vec![major])),
            }
        }
        if groups.len() == 1 {
            continue;
        }
        let mut diff = String::new();
        for (text, members) in &groups[1..] {
            let names: Vec<String> = members.iter().map(u32::to_string).collect();
            diff.push_str(
                &similar::TextDiff::from_lines(&reference, text)
                    .unified_diff()
                    .context_radius(2)
                    .header(
                        &format!("PostgreSQL {reference_major}"),
                        &format!("PostgreSQL {}", names.join(", ")),
                    )
                    .to_string(),
            );
        }
        let mut sorted_groups: Vec<Vec<u32>> = groups.into_iter().map(|(_, m)| m).collect();
        for group in &mut sorted_groups {
            group.sort();
        }
        found.push(Difference {
            id: row.id.clone(),
            groups: sorted_groups,
            diff,
            explanation: EXPLAINED
                .iter()
                .find(|(id, _)| *id == row.id)
                .map(|(_, why)| why.to_string()),
        });
    }
    found
}

fn command_text(args: &MatrixArgs, seed: u64) -> String {
    let mut text = format!("./run.sh matrix --seed {seed}");
    if args.sequential {
        text.push_str(" --sequential");
    }
    for word in &args.cases {
        text.push(' ');
        text.push_str(word);
    }
    text
}

/// `evidence/matrix.md`.
fn markdown(matrix: &Matrix) -> String {
    let majors: Vec<u32> = matrix.versions.iter().map(|v| v.major).collect();
    let mut md = String::new();
    md.push_str("# PostgreSQL version matrix\n\n");
    md.push_str(&format!(
        "Written by `{}` (`./run.sh matrix` replays it) at {}, commit `{}`; wall {} for all \
         runs. One ordinary harness run per major (`--pg N`), the same seed for each; every \
         run compares its transcripts with the same snapshots. Regenerate with \
         `./run.sh matrix`; `harness/src/matrix.rs` says how it is made.\n\n",
        matrix.command,
        matrix.started_at,
        matrix.git_commit,
        seconds(matrix.wall_ms)
    ));
    md.push_str(&runs_section(matrix, &majors));
    md.push_str(&differences_section(matrix));
    md.push_str(&cases_section(matrix, &majors));
    md
}

/// Milliseconds as seconds with one decimal, e.g. `1.5 s`.
fn seconds(ms: u128) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// A table's header line (`first`, then a column per major) and its separator line.
fn table_header(first: &str, majors: &[u32]) -> String {
    let mut line = format!("| {first} |");
    for major in majors {
        line.push_str(&format!(" PostgreSQL {major} |"));
    }
    line.push('\n');
    line.push_str("|---|");
    for _ in majors {
        line.push_str("---|");
    }
    line.push('\n');
    line
}

/// The `## Runs` section: a row per fact (server version, package, SUMMARY, exit status,
/// wall time, record), a column per version.
fn runs_section(matrix: &Matrix, majors: &[u32]) -> String {
    let mut md = String::from("## Runs\n\n");
    md.push_str(&table_header("", majors));
    let version_row = |name: &str, cell: &dyn Fn(&VersionRun) -> String| {
        let mut line = format!("| {name} |");
        for run in &matrix.versions {
            line.push_str(&format!(" {} |", cell(run)));
        }
        line.push('\n');
        line
    };
    md.push_str(&version_row("server_version", &|r| {
        r.server_version.clone()
    }));
    md.push_str(&version_row("package", &|r| format!("`{}`", r.package)));
    md.push_str(&version_row("SUMMARY", &|r| {
        format!("passed={} failed={}", r.passed, r.failed)
    }));
    md.push_str(&version_row("exit status", &|r| r.exit_code.to_string()));
    md.push_str(&version_row("run wall", &|r| seconds(r.wall_ms)));
    md.push_str(&version_row("run record", &|r| format!("`{}`", r.run_dir)));
    md.push('\n');
    md
}

/// The `## Behaviour differences between versions` section: "None found", or per case
/// its transcript groups, why (or that it is not explained yet) and the diff.
fn differences_section(matrix: &Matrix) -> String {
    let mut md = String::from("## Behaviour differences between versions\n\n");
    if matrix.differences.is_empty() {
        md.push_str(&format!(
            "None found: each of the {} cases printed the same redacted transcript on every \
             version (compared line by line after the one redaction layer, \
             `case-kit/src/redact.rs`, which hides only durations, ids, ports, paths and \
             times).\n\n",
            matrix.cases.len()
        ));
        return md;
    }
    for difference in &matrix.differences {
        let groups: Vec<String> = difference
            .groups
            .iter()
            .map(|group| {
                group
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .collect();
        md.push_str(&format!(
            "### {}\n\nTranscript groups: {}.\n\n{}\n\n```diff\n{}```\n\n",
            difference.id,
            groups.join(" | "),
            difference.explanation.as_deref().unwrap_or(
                "**Not explained yet**: this difference is not in the list of understood \
                 ones (`harness/src/matrix.rs`, EXPLAINED); read the diff."
            ),
            difference.diff
        ));
    }
    md
}

/// The `## Cases` section: a row per case, a cell per version (pass or FAIL, checks
/// passed/failed, duration; or "not run").
fn cases_section(matrix: &Matrix, majors: &[u32]) -> String {
    let mut md = String::from(
        "## Cases\n\nEach cell: pass or FAIL (checks passed/failed), and the case's duration.\n\n",
    );
    md.push_str(&table_header("case", majors));
    for row in &matrix.cases {
        let mut line = format!("| {} {} |", row.id, row.title.replace('|', "\\|"));
        for major in majors {
            match row.results.get(&major.to_string()) {
                Some(cell) => line.push_str(&format!(
                    " {} {}/{}, {} ms |",
                    if cell.failed == 0 { "pass" } else { "FAIL" },
                    cell.passed,
                    cell.failed,
                    cell.duration_ms
                )),
                None => line.push_str(" not run |"),
            }
        }
        line.push('\n');
        md.push_str(&line);
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, majors: &[u32]) -> CaseRow {
        CaseRow {
            id: id.into(),
            title: "t".into(),
            family: "L".into(),
            results: majors
                .iter()
                .map(|m| {
                    (
                        m.to_string(),
                        CaseCell {
                            status: "pass".into(),
                            passed: 1,
                            failed: 0,
                            duration_ms: 5,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_transcript_that_differs_on_one_version_is_found_and_diffed() {
        let majors = [15, 16, 17, 18];
        let mut transcripts: BTreeMap<u32, BTreeMap<String, String>> = BTreeMap::new();
        for major in majors {
            let mut by_case = BTreeMap::new();
            by_case.insert("L1".to_string(), "CASE L1\n  ok same\n".to_string());
            let second = if major == 17 {
                "CASE L2\n  note sqlstate=40P01\n"
            } else {
                "CASE L2\n  note sqlstate=40001\n"
            };
            by_case.insert("L2".to_string(), second.to_string());
            transcripts.insert(major, by_case);
        }
        let rows = vec![row("L1", &majors), row("L2", &majors)];
        let found = differences(&majors, &rows, &transcripts);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].id, "L2");
        assert_eq!(found[0].groups, vec![vec![15, 16, 18], vec![17]]);
        assert!(
            found[0].diff.contains("-  note sqlstate=40001"),
            "{}",
            found[0].diff
        );
        assert!(
            found[0].diff.contains("+  note sqlstate=40P01"),
            "{}",
            found[0].diff
        );
        assert!(found[0].explanation.is_none());
    }

    #[test]
    fn the_markdown_has_a_column_per_version_and_a_row_per_case() {
        let majors = [15, 16];
        let matrix = Matrix {
            started_at: "now".into(),
            git_commit: "abc".into(),
            seed: 1,
            command: "./run.sh matrix --seed 1".into(),
            wall_ms: 1000,
            versions: majors
                .iter()
                .map(|&major| VersionRun {
                    major,
                    server_version: format!("{major}.1"),
                    package: "p".into(),
                    exit_code: 0,
                    passed: 1,
                    failed: 0,
                    wall_ms: 10,
                    run_dir: "d".into(),
                    output: "o".into(),
                })
                .collect(),
            cases: vec![row("L1", &[15])],
            differences: Vec::new(),
        };
        let md = markdown(&matrix);
        assert!(
            md.contains("| case | PostgreSQL 15 | PostgreSQL 16 |"),
            "{md}"
        );
        assert!(md.contains("| L1 t | pass 1/0, 5 ms | not run |"), "{md}");
        assert!(md.contains("None found"), "{md}");
    }
}
