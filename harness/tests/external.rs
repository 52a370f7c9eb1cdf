//! `--database-url`: the harness binary against a PostgreSQL server it did not start.
//! Each test starts a scratch cluster and then treats it as someone else's: the harness
//! gets only a URL with an ordinary role (`LOGIN CREATEDB`, not superuser), and the test
//! reads the server's catalogue as its administrator to see what the run left.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use scratch_pg::{Cluster, ClusterOptions};

/// Longest wait for a case database of the run to appear before the interrupt, ms.
const DATABASE_APPEARS_MS: u64 = 60_000;

/// The other party's server, with a role for the harness.
struct TheirServer {
    cluster: Cluster,
    runtime: tokio::runtime::Runtime,
}

impl TheirServer {
    /// Starts it and creates `role` (`LOGIN CREATEDB`, plus `settings` such as
    /// `SET synchronous_commit = off`).
    fn start(roles: &[(&str, Option<&str>)]) -> TheirServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let cluster = Cluster::start(ClusterOptions {
            max_connections: 120,
            ..ClusterOptions::default()
        })
        .expect("their server starts");
        let server = TheirServer { cluster, runtime };
        for (role, setting) in roles {
            let mut sql = format!("CREATE ROLE {role} LOGIN CREATEDB NOSUPERUSER;");
            if let Some(setting) = setting {
                sql.push_str(&format!("ALTER ROLE {role} {setting};"));
            }
            server.sql(&sql);
        }
        server
    }

    fn url(&self, role: &str) -> String {
        format!(
            "postgresql://{role}@127.0.0.1:{}/postgres",
            self.cluster.port()
        )
    }

    fn sql(&self, sql: &str) {
        self.runtime.block_on(async {
            let admin = self.cluster.connect("postgres").await.unwrap();
            admin.batch_execute(sql).await.unwrap();
        });
    }

    /// The databases whose names start with `lh_` (any run's).
    fn run_databases(&self) -> Vec<String> {
        self.runtime.block_on(async {
            let admin = self.cluster.connect("postgres").await.unwrap();
            admin
                .query(
                    "SELECT datname::text FROM pg_database WHERE starts_with(datname, 'lh_') ORDER BY 1",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect()
        })
    }
}

/// An evidence folder with a copy of the committed snapshots, removed on drop.
struct Evidence {
    root: PathBuf,
}

impl Evidence {
    fn new(name: &str) -> Evidence {
        let root = std::env::temp_dir().join(format!(
            "ledger-harness-external-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../evidence/snapshots");
        copy_tree(&committed, &root.join("evidence/snapshots"));
        Evidence { root }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_harness"));
        command
            .args(["--evidence-dir", "evidence", "--seed", "11"])
            .args(args)
            .current_dir(&self.root)
            .env("CI", "true");
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("harness runs")
    }

    fn environment(&self) -> serde_json::Value {
        let text =
            std::fs::read_to_string(self.root.join("evidence/latest/environment.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Evidence {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else if entry.path().extension().is_some_and(|ext| ext == "snap") {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn cases_run_on_their_server_the_restarting_ones_are_listed_and_nothing_is_left() {
    let server = TheirServer::start(&[("outsider", None)]);
    let evidence = Evidence::new("run");
    let url = server.url("outsider");
    let output = evidence.run(&[
        "--database-url",
        &url,
        "L1",
        "L9",
        "L10",
        "L15",
        "L11",
        "F1",
        "S1",
    ]);
    let stdout = text(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let summary = lines.last().copied().unwrap_or_default();
    assert!(summary.starts_with("SUMMARY passed="), "{stdout}");
    assert!(summary.ends_with(" failed=0"), "{stdout}");
    assert!(!stdout.contains("\n  FAIL "), "{stdout}");
    let block = lines
        .iter()
        .position(|line| line.starts_with("not run on an existing server (2 cases"))
        .unwrap_or_else(|| panic!("the not-run block is printed:\n{stdout}"));
    assert!(
        lines[block + 1].starts_with("  L10 ") && lines[block + 2].starts_with("  L15 "),
        "{stdout}"
    );
    assert_eq!(
        block + 3,
        lines.len() - 1,
        "the block comes right before SUMMARY"
    );
    assert!(!stdout.contains("CASE L10 "), "L10 did not run:\n{stdout}");
    assert!(
        stdout.contains("CASE L9 "),
        "L9 kills a worker, not the server"
    );

    let environment = evidence.environment();
    let external = &environment["postgres"]["external"];
    let prefix = external["database_prefix"].as_str().unwrap();
    assert!(prefix.starts_with("lh_"), "{environment}");
    let dropped: Vec<&str> = external["dropped_databases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap())
        .collect();
    for made in [
        "case_l1",
        "case_l9",
        "case_f1",
        "ledger_template",
        "frozen_template",
    ] {
        assert!(
            dropped.contains(&format!("{prefix}{made}").as_str()),
            "{made} was made and dropped: {dropped:?}"
        );
    }
    assert_eq!(external["durability_check"], "passed");
    assert_eq!(environment["not_run"][0]["id"], "L10");
    assert!(environment["postgres"]["package"].is_null());
    assert_eq!(
        server.run_databases(),
        Vec::<String>::new(),
        "no database of the run is left"
    );
}

#[test]
fn weak_durability_is_refused_unless_overridden() {
    let server = TheirServer::start(&[("careless", Some("SET synchronous_commit = off"))]);
    let evidence = Evidence::new("weak");
    let url = server.url("careless");
    let refused = evidence.run(&["--database-url", &url, "L1"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stdout));
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("refusing the server: durability is off (synchronous_commit=off)")
            && stderr.contains("--allow-weak-durability"),
        "{stderr}"
    );
    assert_eq!(server.run_databases(), Vec::<String>::new());

    let allowed = evidence.run(&["--database-url", &url, "--allow-weak-durability", "L1"]);
    let stdout = text(&allowed.stdout);
    assert_eq!(allowed.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "durability check OVERRIDDEN (--allow-weak-durability): synchronous_commit=off"
        ),
        "{stdout}"
    );
    assert_eq!(
        evidence.environment()["postgres"]["external"]["durability_check"],
        "overridden (--allow-weak-durability): synchronous_commit=off"
    );
    assert_eq!(server.run_databases(), Vec::<String>::new());
}

#[test]
fn ctrl_c_drops_the_databases_of_the_run() {
    let server = TheirServer::start(&[("outsider", None)]);
    let evidence = Evidence::new("sigint");
    let url = server.url("outsider");
    let mut harness = evidence
        .command(&["--database-url", &url, "L13", "L14", "F8", "F9"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("harness starts");
    let mut stdout = BufReader::new(harness.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "ended early");
        if line.starts_with("databases of this run: ") {
            break;
        }
    }
    let deadline = Instant::now() + Duration::from_millis(DATABASE_APPEARS_MS);
    while !server
        .run_databases()
        .iter()
        .any(|name| name.contains("_case_"))
    {
        assert!(Instant::now() < deadline, "no case database appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(harness.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = harness.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut harness.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("dropped"), "{stderr}");
    assert_eq!(
        server.run_databases(),
        Vec::<String>::new(),
        "Ctrl-C left databases: {stderr}"
    );
}
