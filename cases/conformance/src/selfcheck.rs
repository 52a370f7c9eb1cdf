//! `./run.sh conformance --self-check`: the suite against both bundled targets, each
//! started by the suite itself through its start command: `ledger-svc` in each transfer
//! mode (on a scratch PostgreSQL cluster, one database per mode, granted through its
//! admin URL) must pass every case; the Python target (`systems/conformance-target-py`)
//! must pass without defects and, with each defect, fail the case meant for it. One
//! SUMMARY line counts these expectations; the table says which cases caught each defect.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context as _;
use scratch_pg::{Cluster, ClusterOptions};

use crate::outcome::CaseOutcome;
use crate::suite::run_against;
use crate::target::TargetSpec;

/// The Python target's script.
pub const PYTHON_TARGET: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../systems/conformance-target-py/target.py"
);

/// Each defect of the Python target and the case meant to catch it.
pub const DEFECTS: &[(&str, &str)] = &[
    ("reexecute-on-retry", "C1"),
    ("ignores-payload", "C2"),
    ("key-race", "C3"),
    ("check-then-write", "C4"),
    ("key-in-memory", "C6"),
    ("ack-before-commit", "C6"),
    ("lenient-input", "C7"),
];

/// Among the deterministic cases C1–C7, which fail with each defect: its meant case and,
/// for a re-execution, every case that sends a key twice (a retry looks the same to the
/// target whatever made the client retry). C8, the randomized run, may catch any.
pub const CAUGHT_AMONG_C1_TO_C7: &[(&str, &[&str])] = &[
    ("reexecute-on-retry", &["C1", "C2", "C3", "C5", "C6"]),
    ("ignores-payload", &["C2"]),
    ("key-race", &["C3"]),
    ("check-then-write", &["C4"]),
    ("key-in-memory", &["C6"]),
    ("ack-before-commit", &["C6"]),
    ("lenient-input", &["C7"]),
];

/// ledger-svc's transfer modes.
pub const MODES: &[&str] = &["statements", "onetrip", "batch"];

/// What the self-check was asked.
#[derive(Debug, Clone)]
pub struct SelfCheck {
    /// Seed of C8.
    pub seed: u64,
    /// The run's evidence folder.
    pub folder: PathBuf,
    /// Unprivileged user for the scratch cluster.
    pub server_user: String,
    /// postgres and initdb.
    pub pg_bin: Option<PathBuf>,
    /// Only these cases (all when empty).
    pub cases: Vec<String>,
}

/// The temporary folder of this process's Python targets.
fn temp_dir() -> PathBuf {
    std::env::temp_dir().join(format!("conformance-{}", std::process::id()))
}

/// Removes the temporary folder (also on a signal).
pub fn cleanup() {
    let _ = std::fs::remove_dir_all(temp_dir());
}

/// A seed from the clock.
pub fn seed_from_clock() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

/// `<dir>/conformance/runs/<time>-<pid>/`, created, and `<dir>/conformance/latest`
/// pointing at it (both ignored by git, as the harness's `evidence/runs/`).
///
/// Errors: the folder cannot be made.
pub fn run_folder(evidence_dir: &Path) -> anyhow::Result<PathBuf> {
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace(':', "");
    let parent = evidence_dir.join("conformance");
    let name = format!("{stamp}-{}", std::process::id());
    let folder = parent.join("runs").join(&name);
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    prune(&parent.join("runs"), &name);
    let latest = parent.join("latest");
    let _ = std::fs::remove_file(&latest);
    let _ = std::os::unix::fs::symlink(Path::new("runs").join(name), &latest);
    Ok(folder)
}

/// Run records kept under `evidence/conformance/runs/` (the newest by name).
pub const KEEP_RUNS: usize = 20;

/// Removes the oldest run records under `runs` beyond [`KEEP_RUNS`], never `current`.
fn prune(runs: &Path, current: &str) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return;
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != current)
        .collect();
    names.sort();
    let excess = (names.len() + 1).saturating_sub(KEEP_RUNS);
    for name in names.into_iter().take(excess) {
        let _ = std::fs::remove_dir_all(runs.join(name));
    }
}

/// A free loopback port (bound and released).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The Python target with `defect` (none: clean) on a fresh SQLite file.
///
/// Errors: no free port; the folder cannot be made.
pub fn python_target(defect: Option<&str>, dir: &Path) -> anyhow::Result<TargetSpec> {
    std::fs::create_dir_all(dir)?;
    let port = free_port()?;
    let name = defect.unwrap_or("clean");
    let db = dir.join(format!("{name}.sqlite"));
    let flag = defect.map(|d| format!(" --defect {d}")).unwrap_or_default();
    Ok(TargetSpec {
        label: format!("python {name}"),
        url: format!("http://127.0.0.1:{port}"),
        start_command: Some(format!(
            "exec python3 {PYTHON_TARGET} serve --listen 127.0.0.1:{port} --db {}{flag}",
            db.display()
        )),
        setup_command: Some(format!(
            "python3 {PYTHON_TARGET} grant --db {}",
            db.display()
        )),
        ..TargetSpec::default()
    })
}

/// ledger-svc in `mode` on `database_url`.
///
/// Errors: no free port; the binary is missing.
pub fn ledger_target(mode: &str, database_url: &str) -> anyhow::Result<TargetSpec> {
    let (public, admin) = (free_port()?, free_port()?);
    let binary = launch::service::service_binary()?;
    Ok(TargetSpec {
        label: format!("ledger-svc {mode}"),
        url: format!("http://127.0.0.1:{public}"),
        admin_url: Some(format!("http://127.0.0.1:{admin}")),
        start_command: Some(format!(
            "exec {} --database-url '{database_url}' --listen 127.0.0.1:{public} \
             --admin-listen 127.0.0.1:{admin} --transfer-mode {mode}",
            binary.display()
        )),
        ..TargetSpec::default()
    })
}

/// Cases that failed (a check failed).
fn failing(outcomes: &[CaseOutcome]) -> Vec<&'static str> {
    outcomes
        .iter()
        .filter(|o| o.failed() > 0)
        .map(|o| o.id)
        .collect()
}

/// The self-check's expectations so far, as lines, and their counts.
#[derive(Default)]
struct Expectations {
    lines: Vec<String>,
    passed: usize,
    failed: usize,
}

impl Expectations {
    fn expect(&mut self, held: bool, text: String) {
        if held {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        let verdict = if held { "ok  " } else { "FAIL" };
        self.lines.push(format!("  {verdict} {text}"));
    }
}

/// Runs the self-check; returns the exit status (0: every expectation held).
///
/// Errors: the cluster cannot start; evidence cannot be written.
pub async fn self_check(args: &SelfCheck) -> anyhow::Result<i32> {
    let mut expectations = Expectations::default();
    ledger_svc_in_each_mode(args, &mut expectations).await?;
    let table = python_with_each_defect(args, &mut expectations).await;
    cleanup();
    let table = table?;
    let summary = format!(
        "SUMMARY passed={} failed={}",
        expectations.passed, expectations.failed
    );
    let text = format!(
        "self-check (seed {}):\n{}\n\n{}\n\n{summary}\n",
        args.seed,
        expectations.lines.join("\n"),
        table.join("\n")
    );
    std::fs::write(args.folder.join("self-check.txt"), &text)?;
    print!("{text}");
    Ok(i32::from(expectations.failed > 0))
}

/// ledger-svc in each of [`MODES`], each on a database of its own: every case passes and
/// none is left not run.
async fn ledger_svc_in_each_mode(
    args: &SelfCheck,
    expectations: &mut Expectations,
) -> anyhow::Result<()> {
    let cluster = start_cluster(args).await?;
    for mode in MODES {
        let database = format!("conformance_{mode}");
        prepare_database(&cluster, &database).await?;
        let spec = ledger_target(mode, &cluster.url(&database))?;
        let dir = args.folder.join(format!("ledger-svc-{mode}"));
        let outcomes = run_against(spec, &args.cases, args.seed, &dir).await?;
        let not_run: Vec<&str> = outcomes
            .iter()
            .filter(|o| o.not_run.is_some())
            .map(|o| o.id)
            .collect();
        expectations.expect(
            failing(&outcomes).is_empty() && not_run.is_empty(),
            format!(
                "ledger-svc {mode}: every case passes (failed: {:?}, not run: {not_run:?})",
                failing(&outcomes)
            ),
        );
    }
    Ok(())
}

/// The Python target clean (every case passes) and with each of [`DEFECTS`] (its meant
/// case fails and, among C1–C7, exactly the cases of [`CAUGHT_AMONG_C1_TO_C7`]).
/// Returns the table defect → meant case → cases that failed.
async fn python_with_each_defect(
    args: &SelfCheck,
    expectations: &mut Expectations,
) -> anyhow::Result<Vec<String>> {
    let mut table = vec![
        "defect | meant for | caught by".to_owned(),
        "--- | --- | ---".to_owned(),
    ];
    let clean_dir = args.folder.join("python-clean");
    let spec = python_target(None, &temp_dir())?;
    let clean = run_against(spec, &args.cases, args.seed, &clean_dir).await?;
    expectations.expect(
        failing(&clean).is_empty(),
        format!(
            "python without defects: every case passes (failed: {:?})",
            failing(&clean)
        ),
    );
    for (defect, meant) in DEFECTS {
        if !args.cases.is_empty() && !args.cases.iter().any(|c| c == meant) {
            continue;
        }
        let spec = python_target(Some(defect), &temp_dir())?;
        let dir = args.folder.join(format!("python-{defect}"));
        let outcomes = run_against(spec, &args.cases, args.seed, &dir).await?;
        let caught = failing(&outcomes);
        let among: Vec<&str> = caught.iter().copied().filter(|c| *c != "C8").collect();
        let expected = caught_among_c1_to_c7(defect);
        let selected = |c: &&str| args.cases.is_empty() || args.cases.iter().any(|s| s == c);
        let expected: Vec<&str> = expected.iter().copied().filter(selected).collect();
        expectations.expect(
            caught.contains(meant) && among == expected,
            format!(
                "python --defect {defect}: {meant} fails; among C1–C7 exactly {expected:?} \
                 (cases that failed: {caught:?})"
            ),
        );
        table.push(format!("{defect} | {meant} | {}", caught.join(" ")));
    }
    Ok(table)
}

/// The cases among C1–C7 that fail with `defect`.
pub fn caught_among_c1_to_c7(defect: &str) -> &'static [&'static str] {
    CAUGHT_AMONG_C1_TO_C7
        .iter()
        .find(|(d, _)| *d == defect)
        .map(|(_, cases)| *cases)
        .unwrap_or(&[])
}

/// A scratch PostgreSQL cluster for ledger-svc's databases.
async fn start_cluster(args: &SelfCheck) -> anyhow::Result<Cluster> {
    let mut options = ClusterOptions {
        pg_bin: args.pg_bin.clone(),
        server_user: args.server_user.clone(),
        ..ClusterOptions::default()
    };
    options.max_connections = 100;
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(options))
        .await?
        .context("starting the scratch cluster")?;
    Ok(cluster)
}

/// Creates `database` with the ledger's schema and seeded accounts.
async fn prepare_database(cluster: &Cluster, database: &str) -> anyhow::Result<()> {
    cluster.create_database(database, None).await?;
    let client = cluster.connect(database).await?;
    points_ledger::schema::install(&client).await?;
    points_ledger::schema::seed(&client).await?;
    Ok(())
}
