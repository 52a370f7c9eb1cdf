//! The harness binary end to end, in a scratch evidence folder: exit statuses, the
//! re-run command, snapshot diffs, and what each snapshot mode writes; what is refused
//! before anything starts; and `./run.sh` itself (its help, options passed through, a
//! short bench leaving the tree clean). Each run boots its
//! own scratch cluster (about a second).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A throw-away evidence folder, removed on drop.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let root =
            std::env::temp_dir().join(format!("ledger-harness-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("evidence/snapshots/L")).unwrap();
        Scratch { root }
    }

    fn evidence(&self) -> PathBuf {
        self.root.join("evidence")
    }

    fn snapshot(&self, id: &str) -> PathBuf {
        self.evidence().join(format!("snapshots/L/{id}.snap"))
    }

    /// Runs the harness with `args` from the scratch root; `ci` sets `CI=true` or `CI=false`.
    fn harness(&self, args: &[&str], ci: bool) -> Output {
        Command::new(env!("CARGO_BIN_EXE_harness"))
            .args(["--evidence-dir", "evidence", "--seed", "7"])
            .args(args)
            .current_dir(&self.root)
            .env("CI", if ci { "true" } else { "false" })
            .env_remove("INSTA_UPDATE")
            .output()
            .expect("harness runs")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or_default()
}

/// The committed snapshot of L1, from the repository.
fn committed(id: &str) -> String {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../evidence/snapshots/L/{id}.snap"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A snapshot file's body: what follows the header's closing `---` line.
fn body(snapshot: &str) -> &str {
    snapshot
        .strip_prefix("---\n")
        .and_then(|rest| rest.split_once("\n---\n"))
        .map(|(_, body)| body)
        .unwrap_or_else(|| panic!("no header in {snapshot:?}"))
}

#[test]
fn list_and_usage_errors() {
    let scratch = Scratch::new("list");
    let listed = scratch.harness(&["--list"], true);
    assert!(listed.status.success());
    let text = stdout(&listed);
    for family in harness::families() {
        assert!(
            text.contains(&format!("family {} :: {}", family.prefix, family.title)),
            "{text}"
        );
        for case in &family.cases {
            assert!(
                text.contains(&format!("  {:<7} {}", case.id, case.title)),
                "{text}"
            );
        }
    }
    assert!(text.contains("CANARY"), "{text}");

    let unknown = scratch.harness(&["L999"], true);
    assert_eq!(unknown.status.code(), Some(2));

    let accept_in_ci = scratch.harness(&["--accept", "L1"], true);
    assert_eq!(accept_in_ci.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&accept_in_ci.stderr).contains("CI"));
}

/// The canary fails on purpose: exit 1, the re-run command names it with the seed, and
/// SUMMARY is the last line; junit.xml lists each of its checks.
#[test]
fn canary_fails_the_run() {
    let scratch = Scratch::new("canary");
    let output = scratch.harness(&["CANARY"], true);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("  FAIL {}", harness::CANARY_CHECK)),
        "{text}"
    );
    assert!(
        text.contains("re-run the failing cases: ./run.sh --seed 7 CANARY"),
        "{text}"
    );
    assert_eq!(last_line(&text), "SUMMARY passed=1 failed=1");
    assert!(!text.contains("--accept"), "{text}");
    let junit = std::fs::read_to_string(scratch.evidence().join("latest/junit.xml")).unwrap();
    assert!(junit.contains(r#"tests="2""#), "{junit}");
    assert!(junit.contains("<failure"), "{junit}");
}

/// A snapshot that no longer matches: the check fails with a diff; under CI nothing is
/// written; in review mode a `.snap.new` appears; `--accept` rewrites the snapshot, after
/// which the run passes.
#[test]
fn snapshot_mismatch_diff_and_modes() {
    let scratch = Scratch::new("snap");
    let good = committed("L1");
    let broken = good.replace("outcome=OK balance=700", "outcome=OK balance=701");
    assert_ne!(good, broken, "the committed L1 snapshot changed shape");
    std::fs::write(scratch.snapshot("L1"), &broken).unwrap();

    // CI: fails, prints the diff, writes nothing.
    let output = scratch.harness(&["L1"], true);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("  FAIL transcript matches evidence/snapshots/L/L1.snap"),
        "{text}"
    );
    assert!(
        text.contains("-  note     outcome=OK balance=701"),
        "{text}"
    );
    assert!(
        text.contains("+  note     outcome=OK balance=700"),
        "{text}"
    );
    assert!(
        text.contains("re-run the failing cases: ./run.sh --seed 7 L1"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(scratch.snapshot("L1")).unwrap(),
        broken
    );
    assert!(!scratch.snapshot("L1").with_extension("snap.new").exists());
    assert!(
        !text.contains("--accept") && !text.contains("cargo insta review"),
        "no accept or review hint under CI: {text}"
    );
    let junit = std::fs::read_to_string(scratch.evidence().join("latest/junit.xml")).unwrap();
    assert!(
        junit.contains("-  note     outcome=OK balance=701"),
        "the diff is the failure's text: {junit}"
    );

    // Review mode: the new version lands beside the snapshot.
    let output = scratch.harness(&["L1"], false);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout(&output).contains("accept the new transcripts: ./run.sh --accept L1")
            && stdout(&output).contains("<id>.snap.new: cargo insta review"),
        "{}",
        stdout(&output)
    );
    assert!(scratch.snapshot("L1").with_extension("snap.new").exists());
    assert_eq!(
        std::fs::read_to_string(scratch.snapshot("L1")).unwrap(),
        broken
    );

    // Accept: the snapshot is rewritten and equals the committed one; the run passes.
    let output = scratch.harness(&["--accept", "L1"], false);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(text.contains("ok   transcript accepted into evidence/snapshots/L/L1.snap"));
    assert_eq!(
        body(&std::fs::read_to_string(scratch.snapshot("L1")).unwrap()),
        body(&good),
        "the accepted transcript is the committed one"
    );
    assert!(!scratch.snapshot("L1").with_extension("snap.new").exists());

    // And then it matches.
    let output = scratch.harness(&["L1"], true);
    assert_eq!(output.status.code(), Some(0), "{}", stdout(&output));
}

/// A run of a family that needs no PostgreSQL boots none: it passes although the
/// PostgreSQL binaries it is pointed at do not exist (any attempt to start a cluster
/// would be a harness error, exit 2), says so, and records no server.
#[test]
fn a_family_without_postgres_starts_no_postgres() {
    let family = harness::families()
        .into_iter()
        .find(|family| !family.engine.needs_postgres())
        .expect("a registered family needs no PostgreSQL");
    let scratch = Scratch::new("nopg");
    let committed_folder = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../evidence/snapshots")
        .join(family.prefix);
    let folder = scratch.evidence().join("snapshots").join(family.prefix);
    std::fs::create_dir_all(&folder).unwrap();
    for entry in std::fs::read_dir(&committed_folder).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), folder.join(entry.file_name())).unwrap();
    }
    let output = scratch.harness(&["--pg-bin", "/nonexistent/pg-bin", family.prefix], true);
    let text = stdout(&output);
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        text.contains("postgres: not started (no selected family needs it)"),
        "{text}"
    );
    assert!(!text.contains("\npostgres "), "{text}");
    assert!(last_line(&text).ends_with(" failed=0"), "{text}");
    let environment: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(scratch.evidence().join("latest/environment.json")).unwrap(),
    )
    .unwrap();
    assert!(environment["postgres"].is_null(), "{environment}");
}

/// Usage errors name what the user typed — the flag when the flag was used, the
/// environment variable when that was — and what to do, without internal words; they
/// come before any cluster starts (exit 2, no evidence folder).
#[test]
fn error_messages_name_the_flag_or_the_variable() {
    let scratch = Scratch::new("messages");
    let stderr = |output: &Output| String::from_utf8_lossy(&output.stderr).into_owned();
    let internal = ["source:", "caller", "ClusterError", "Binaries("];

    let flag = scratch.harness(&["--pg-bin", "/nonexistent", "L1"], true);
    assert_eq!(flag.status.code(), Some(2));
    let text = stderr(&flag);
    assert!(
        text.contains("--pg-bin /nonexistent: no such folder"),
        "{text}"
    );
    assert!(text.contains("postgres and initdb"), "{text}");

    let env = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--evidence-dir", "evidence", "L1"])
        .current_dir(&scratch.root)
        .env("PG_BIN", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(env.status.code(), Some(2));
    let env_text = stderr(&env);
    assert!(
        env_text.contains("PG_BIN=/nonexistent: no such folder"),
        "{env_text}"
    );
    assert!(env_text.contains("unset it"), "{env_text}");

    // A SQLite-only selection needs no PostgreSQL, so a bad PG_BIN does not stop it.
    let listed = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--list"])
        .env("PG_BIN", "/nonexistent")
        .output()
        .unwrap();
    assert!(listed.status.success());

    let mut texts = vec![text, env_text];
    if nix::unistd::geteuid().is_root() {
        let user = scratch.harness(&["--server-user", "nosuchuser-lh", "L1"], true);
        assert_eq!(user.status.code(), Some(2));
        let user_text = stderr(&user);
        assert!(
            user_text.contains("--server-user nosuchuser-lh: no such user"),
            "{user_text}"
        );
        assert!(!user_text.contains("LEDGER_PG_USER"), "{user_text}");
        let by_env = Command::new(env!("CARGO_BIN_EXE_harness"))
            .args(["--evidence-dir", "evidence", "L1"])
            .current_dir(&scratch.root)
            .env("LEDGER_PG_USER", "nosuchuser-lh")
            .output()
            .unwrap();
        let env_user = stderr(&by_env);
        assert!(
            env_user.contains("LEDGER_PG_USER=nosuchuser-lh: no such user"),
            "{env_user}"
        );
        texts.push(user_text);
        texts.push(env_user);
    }
    for text in &texts {
        for word in internal {
            assert!(!text.contains(word), "internal word {word:?} in {text}");
        }
    }
    assert!(
        !scratch.evidence().join("runs").exists(),
        "a usage error made an evidence folder"
    );
}

/// `--repeat N` runs the selection N times and reports the failing runs; after each
/// run the old records under `runs/` are pruned to the newest 20 (`KEEP_RUNS`), and the
/// folder `latest` points at survives.
#[test]
fn repeat_reports_failing_runs_and_old_records_are_pruned() {
    let scratch = Scratch::new("repeat");
    std::fs::create_dir_all(scratch.evidence().join("snapshots/S")).unwrap();
    let s1 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../evidence/snapshots/S/S1.snap");
    std::fs::copy(&s1, scratch.evidence().join("snapshots/S/S1.snap")).unwrap();
    let runs = scratch.evidence().join("runs");
    for minute in 0..25 {
        std::fs::create_dir_all(runs.join(format!("2020-01-01T00{minute:02}00Z-999999999")))
            .unwrap();
    }

    let passing = scratch.harness(&["--repeat", "2", "S1"], true);
    let text = stdout(&passing);
    assert_eq!(passing.status.code(), Some(0), "{text}");
    assert_eq!(text.matches("SUMMARY passed=").count(), 2, "{text}");
    assert!(text.contains("repeat 1/2: SUMMARY") && text.contains("repeat 2/2: SUMMARY"));
    assert_eq!(
        last_line(&text),
        "REPEAT runs=2 passed_runs=2 failed_runs=0"
    );
    let kept: Vec<String> = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(kept.len(), 20, "{kept:?}");
    let latest = std::fs::canonicalize(scratch.evidence().join("latest")).unwrap();
    assert!(latest.starts_with(std::fs::canonicalize(&runs).unwrap()));
    assert!(latest.exists(), "latest was pruned");

    // S2 has no snapshot in this scratch folder, so each run fails its snapshot check.
    let failing = scratch.harness(&["--repeat", "2", "S1", "S2"], true);
    let text = stdout(&failing);
    assert_eq!(failing.status.code(), Some(1), "{text}");
    assert!(text.contains("failed run 1: SUMMARY"), "{text}");
    assert!(text.contains("failed run 2: SUMMARY"), "{text}");
    assert!(text.contains("re-run: ./run.sh --seed "), "{text}");
    assert!(text.contains("FAIL transcript matches"), "{text}");
    assert_eq!(
        last_line(&text),
        "REPEAT runs=2 passed_runs=0 failed_runs=2"
    );

    let refused = scratch.harness(&["--repeat", "0", "S1"], true);
    assert_eq!(refused.status.code(), Some(2));
}

/// The claims table (`docs/claims.md`, linked from the README) names every default case
/// of every family, and only cases that exist.
#[test]
fn claims_table_names_every_default_case() {
    let section =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/claims.md"))
            .unwrap();
    let rows: Vec<&str> = section
        .lines()
        .filter(|line| line.starts_with("| ") && !line.starts_with("| family"))
        .collect();
    let words: std::collections::BTreeSet<String> = rows
        .iter()
        .flat_map(|row| row.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')))
        .map(str::to_owned)
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for family in harness::families() {
        for case in &family.cases {
            ids.insert(case.id.to_string());
            assert!(
                words.contains(case.id.as_str()),
                "{} is in no row of the claims table (docs/claims.md)",
                case.id
            );
        }
    }
    for word in &words {
        if looks_like_case_id(word) {
            assert!(
                ids.contains(word),
                "the claims table names {word}, which is no case"
            );
        }
    }
}

/// `L3`, `F10`, `S5`, `L-S4`: a family letter, then digits (or `-S` and digits).
fn looks_like_case_id(word: &str) -> bool {
    let mut chars = word.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    let rest: String = chars.collect();
    let digits = rest.strip_prefix("-S").unwrap_or(&rest);
    matches!(first, 'L' | 'F' | 'S')
        && !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
}

/// The README's commands stay true: every `--option` its `./run.sh` lines name (bench
/// and explore aside) is one the harness accepts, and every file it links to exists.
#[test]
fn readme_commands_and_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let harness_help = stdout(
        &Command::new(env!("CARGO_BIN_EXE_harness"))
            .arg("--help")
            .output()
            .expect("--help runs"),
    );
    let option = regex::Regex::new(r"--[a-z][a-z-]+").unwrap();
    let mut seen = 0;
    for line in readme
        .lines()
        .filter(|l| l.trim_start().starts_with("./run.sh"))
    {
        let command = line.split('#').next().unwrap();
        // bench, explore and conformance are other binaries, with their own --help.
        if command
            .split_whitespace()
            .nth(1)
            .is_some_and(|w| w == "bench" || w == "explore" || w == "conformance")
        {
            continue;
        }
        for found in option.find_iter(command) {
            assert!(
                harness_help.contains(found.as_str()),
                "README: {line:?} names {}, which the harness does not take",
                found.as_str()
            );
            seen += 1;
        }
    }
    assert!(
        seen >= 3,
        "README names too few options ({seen}): the check checks nothing"
    );
    let link = regex::Regex::new(r"\]\(([^)#:]+)\)").unwrap();
    for target in link.captures_iter(&readme) {
        assert!(
            root.join(&target[1]).exists(),
            "README links to {}, which does not exist",
            &target[1]
        );
    }
}

/// The workspace's root, where `run.sh` is.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `./run.sh ARGS` from the workspace in the dev profile (the binaries `cargo test` has
/// just built), with `CI=true`.
fn run_sh(args: &[&str]) -> Output {
    Command::new(workspace().join("run.sh"))
        .args(args)
        .env("LEDGER_BUILD_PROFILE", "dev")
        .env("CI", "true")
        .env_remove("INSTA_UPDATE")
        .output()
        .expect("run.sh runs")
}

/// A case file that cannot run is a usage error before anything starts: exit 2, no
/// server, no evidence folder, and each file named with its line: an unknown verb with
/// the family's verbs and the closest one, an unknown argument with the closest, a
/// syntax error. The files are read from a scratch folder (`LEDGER_SPEC_DIR_L`), never
/// written into the workspace.
#[test]
fn a_bad_case_file_is_a_usage_error_naming_its_line() {
    let scratch = Scratch::new("badspec");
    let specs = scratch.root.join("specs");
    std::fs::create_dir_all(&specs).unwrap();
    let l3 =
        std::fs::read_to_string(workspace().join("cases/ledger/specs/l03_real_concurrency.spec"))
            .unwrap();
    let line_of = |text: &str, start: &str| {
        1 + text
            .lines()
            .position(|line| line.starts_with(start))
            .unwrap_or_else(|| panic!("L3 has no line {start:?}"))
    };
    let grant_line = line_of(&l3, "setup call: grant");
    let race_line = line_of(&l3, "race call:");
    std::fs::write(
        specs.join("s1_typo.spec"),
        l3.replace("setup call: grant", "setup call: grnat"),
    )
    .unwrap();
    std::fs::write(
        specs.join("s2_argument.spec"),
        l3.replace("amount=7 key", "amout=7 key"),
    )
    .unwrap();
    std::fs::write(
        specs.join("s3_syntax.spec"),
        "title: t\nclaim: c\nfails: f\nsystem: ledger_template\nbogus: 1\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_harness"))
        .args(["--evidence-dir", "evidence", "L-S1", "L-S2", "L-S3"])
        .current_dir(&scratch.root)
        .env("LEDGER_SPEC_DIR_L", &specs)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let shown = specs.display();
    for expected in [
        format!("{shown}/s1_typo.spec: line {grant_line}: call grnat "),
        "unknown verb \"grnat\"; did you mean \"grant\"?".to_string(),
        "this family's verbs: debit, grant, ".to_string(),
        format!("{shown}/s2_argument.spec: line {race_line}: call debit "),
        "amout=7 key=k-03-{i} client".to_string(),
        "debit takes no amout=; did you mean amount=?".to_string(),
        format!("{shown}/s3_syntax.spec: line 5: unknown key \"bogus\""),
        "3 selected case files cannot be run; nothing was started".to_string(),
    ] {
        assert!(stderr.contains(&expected), "{expected:?} not in:\n{stderr}");
    }
    assert!(
        output.stdout.is_empty(),
        "printed before refusing: {:?}",
        output.stdout
    );
    assert!(
        !scratch.evidence().join("runs").exists(),
        "an evidence folder was made"
    );

    // Not selected, the broken files stop nothing: --list still lists them.
    let listed = Command::new(env!("CARGO_BIN_EXE_harness"))
        .arg("--list")
        .env("LEDGER_SPEC_DIR_L", &specs)
        .output()
        .unwrap();
    assert!(listed.status.success());
}

/// An evidence folder that cannot be written is named, with its path, before the boot.
#[test]
fn an_unwritable_evidence_folder_is_named_before_anything_starts() {
    let scratch = Scratch::new("unwritable");
    let file = scratch.root.join("a-file");
    std::fs::write(&file, "").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_harness"))
        .arg("--evidence-dir")
        .arg(file.join("evidence"))
        .arg("L1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the evidence folder cannot be written: {}",
            file.join("evidence/runs").display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("--evidence-dir"), "{stderr}");
    assert!(output.stdout.is_empty(), "started before refusing");
}

/// `--list` says what each family starts (a family that brings its own system is named,
/// not called "no database") and lists the cases in natural order: L1, L2 … L10 …,
/// then the files' L-S1, L-S2 … L-S10.
#[test]
fn the_list_says_what_each_family_starts_in_natural_order() {
    let listed = Command::new(env!("CARGO_BIN_EXE_harness"))
        .arg("--list")
        .output()
        .unwrap();
    let text = stdout(&listed);
    assert!(!text.contains("no database"), "{text}");
    for family in harness::families() {
        let header = format!("family {} :: ", family.prefix);
        let at = text
            .find(&header)
            .unwrap_or_else(|| panic!("{header} in {text}"));
        let starts = text[at..].lines().nth(1).unwrap_or_default();
        assert!(starts.starts_with("  starts: "), "{starts}");
        if matches!(family.engine, case_kit::Engine::None) {
            assert!(
                !starts.contains("its own system"),
                "family {} unnamed: {starts}",
                family.prefix
            );
        }
    }
    let family_of = |prefix: &str| {
        let at = text.find(&format!("family {prefix} :: ")).unwrap();
        text[at..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with("  "))
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect::<Vec<String>>()
    };
    assert!(text.contains("MariaDB"), "{text}");
    assert!(text.contains("FUSE"), "{text}");
    let ledger = family_of("L");
    let position = |id: &str| {
        ledger
            .iter()
            .position(|x| x == id)
            .unwrap_or_else(|| panic!("{id} in {ledger:?}"))
    };
    assert!(position("L1") < position("L2"), "{ledger:?}");
    assert!(position("L2") < position("L10"), "{ledger:?}");
    assert!(position("L10") < position("L-S1"), "{ledger:?}");
    assert!(position("L-S2") < position("L-S10"), "{ledger:?}");
    assert_eq!(ledger[0], "L1", "{ledger:?}");
}

/// `./run.sh --help` names run.sh and its subcommands, builds nothing (and says
/// nothing about building) when the harness binary is fresh, and every option it lists
/// is one run.sh passes through: `--evidence-dir` (which run.sh once also set itself,
/// so that giving it failed with "cannot be used multiple times") runs S1 into the folder
/// named, and `--keep-runs 3` prunes that folder's old records of every kind to three.
#[test]
fn run_sh_help_names_itself_and_passes_every_option() {
    let help = run_sh(&["--help"]);
    let text = stdout(&help);
    assert!(help.status.success(), "{text}");
    assert!(
        text.contains("Usage: ./run.sh [OPTIONS] [CASES]..."),
        "{text}"
    );
    for sub in [
        "./run.sh matrix",
        "./run.sh explore",
        "./run.sh bench",
        "./run.sh cite",
        "./run.sh conformance",
    ] {
        assert!(text.contains(sub), "{sub} not in:\n{text}");
    }
    let stderr = String::from_utf8_lossy(&help.stderr);
    assert!(!stderr.contains("building"), "{stderr}");

    let scratch = Scratch::new("runsh");
    let snapshots = scratch.evidence().join("snapshots/S");
    std::fs::create_dir_all(&snapshots).unwrap();
    std::fs::copy(
        workspace().join("evidence/snapshots/S/S1.snap"),
        snapshots.join("S1.snap"),
    )
    .unwrap();
    let evidence = scratch.evidence();
    // Old records of each kind: the harness's, the bench's, the matrix's; a folder of
    // another name is never touched.
    for name in [
        "2020-01-01T000000Z-999999999",
        "bench-2020-01-01T000100Z-999999999",
        "matrix-2020-01-01T000200Z-999999999",
        "2020-01-01T000300Z-999999999",
        "my-notes",
    ] {
        std::fs::create_dir_all(evidence.join("runs").join(name)).unwrap();
    }
    let run = run_sh(&[
        "--evidence-dir",
        evidence.to_str().unwrap(),
        "--keep-runs",
        "3",
        "S1",
    ]);
    let text = stdout(&run);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(last_line(&text).ends_with(" failed=0"), "{text}");
    assert!(
        evidence.join("latest/results.json").exists(),
        "no record in {}",
        evidence.display()
    );
    // --keep-runs 3: this run and the two newest old ones are left, and the notes.
    let mut left: Vec<String> = std::fs::read_dir(evidence.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left.len(), 4, "{left:?}");
    for kept in [
        "2020-01-01T000300Z-999999999",
        "matrix-2020-01-01T000200Z-999999999",
        "my-notes",
    ] {
        assert!(left.contains(&kept.to_string()), "{kept} pruned: {left:?}");
    }
}

/// `./run.sh bench` (a short one, from the dev build) writes its record under
/// `evidence/runs/bench-…` and leaves the tree as it was: `git status` of `evidence/`
/// is the same before and after (the committed page `evidence/bench/` changes only with
/// `--accept`).
#[test]
fn a_bench_run_leaves_the_tree_clean() {
    let status = || {
        let output = Command::new("git")
            .args([
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--",
                "evidence",
            ])
            .current_dir(workspace())
            .output()
            .expect("git status");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let before = status();
    let bench = run_sh(&[
        "bench",
        "--variants",
        "ceiling",
        "--clients",
        "1",
        "--duration-s",
        "1",
        "--warmup-ms",
        "100",
        "--repeat",
        "1",
        "--accounts",
        "50",
        "--count-debits",
        "0",
        "--pair-rounds",
        "0",
    ]);
    let text = stdout(&bench);
    let record = text
        .lines()
        .find_map(|line| line.strip_prefix("wrote "))
        .and_then(|rest| rest.split_once("/results.md"))
        .map(|(folder, _)| workspace().join(folder));
    if let Some(record) = &record {
        assert!(record.join("index.html").exists(), "{}", record.display());
        std::fs::remove_dir_all(record).unwrap();
    }
    assert!(
        bench.status.success(),
        "{text}
{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let record = record.expect("a `wrote …` line");
    assert!(
        record.starts_with(workspace().join("evidence/runs")),
        "{}",
        record.display()
    );
    assert!(
        text.contains("evidence/bench/ (committed) unchanged"),
        "{text}"
    );
    assert_eq!(status(), before, "the bench changed the tree");
}

/// docs/README.md, the index of the docs, links every file under docs/ (articles
/// included), so a newcomer finds each one.
#[test]
fn the_docs_index_lists_every_doc() {
    let docs = workspace().join("docs");
    let index = std::fs::read_to_string(docs.join("README.md")).unwrap();
    let mut files = Vec::new();
    let mut folders = vec![docs.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else {
                files.push(path.strip_prefix(&docs).unwrap().display().to_string());
            }
        }
    }
    assert!(files.len() >= 20, "{files:?}");
    for file in files.iter().filter(|f| *f != "README.md") {
        assert!(
            index.contains(&format!("]({file})")),
            "docs/README.md does not link {file}"
        );
    }
}
