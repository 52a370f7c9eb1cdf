//! The run's record under `evidence/runs/<stamp>/` (not committed): per-case transcripts,
//! `results.json`, `environment.json`, the full transcript and the server log, plus the
//! stable pointer `evidence/latest` to the newest run.

use std::fs;
use std::path::{Path, PathBuf};

use cases::CaseReport;
use serde::Serialize;

/// The environment of a run, as written to `environment.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
    /// The harness command line.
    pub command: Vec<String>,
    /// The seed for random input.
    pub seed: u64,
    /// `git rev-parse HEAD` of the work tree, with `-dirty` when it has changes.
    pub git_commit: String,
    /// Server facts read from the running server.
    pub postgres: scratch_pg::ServerFacts,
    /// `postgres --version` and where the binaries came from.
    pub postgres_binaries: String,
    /// The OS user id the server ran as, when the harness dropped privileges.
    pub server_uid: Option<u32>,
    /// Milliseconds from launch until the cluster and template were ready.
    pub cluster_ready_ms: u128,
    /// Milliseconds for the whole run.
    pub total_ms: u128,
}

/// The folder of one run.
pub struct RunFolder {
    root: PathBuf,
    dir: PathBuf,
}

impl RunFolder {
    /// Creates `<evidence>/runs/<stamp>-<pid>/`.
    ///
    /// Errors: file system errors.
    pub fn create(evidence_dir: &Path, stamp: &str) -> std::io::Result<RunFolder> {
        let dir = evidence_dir
            .join("runs")
            .join(format!("{stamp}-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        Ok(RunFolder {
            root: evidence_dir.to_path_buf(),
            dir,
        })
    }

    /// The run's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes one case's transcript as `<id>.txt`.
    ///
    /// Errors: file system errors.
    pub fn write_case(&self, record: &CaseReport) -> std::io::Result<()> {
        fs::write(
            self.dir.join(format!("{}.txt", record.id)),
            record.transcript(),
        )
    }

    /// Writes `transcript.txt`, `results.json`, `environment.json`, and points
    /// `evidence/latest` at this run (atomically, so concurrent runs do not clash).
    ///
    /// Errors: file system or serialization errors.
    pub fn finish(
        &self,
        transcript: &str,
        records: &[CaseReport],
        environment: &Environment,
    ) -> anyhow::Result<()> {
        fs::write(self.dir.join("transcript.txt"), transcript)?;
        fs::write(
            self.dir.join("results.json"),
            serde_json::to_string_pretty(records)?,
        )?;
        fs::write(
            self.dir.join("environment.json"),
            serde_json::to_string_pretty(environment)?,
        )?;
        let relative = self.dir.strip_prefix(&self.root).unwrap_or(&self.dir);
        let staging = self.root.join(format!(".latest-{}", std::process::id()));
        let _ = fs::remove_file(&staging);
        std::os::unix::fs::symlink(relative, &staging)?;
        fs::rename(&staging, self.root.join("latest"))?;
        Ok(())
    }

    /// Copies the logs of the service processes started by cases (`*.log` in `dir`)
    /// into the run folder's `services/`.
    pub fn copy_service_logs(&self, dir: &Path) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        let target = self.dir.join("services");
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "log")
                && let Some(name) = path.file_name()
                && fs::create_dir_all(&target).is_ok()
            {
                let _ = fs::copy(&path, target.join(name));
            }
        }
    }

    /// Copies the server log into the run folder as `postgres.log`.
    pub fn copy_server_log(&self, log: &Path) {
        let _ = fs::copy(log, self.dir.join("postgres.log"));
    }
}

/// `git rev-parse HEAD` plus `-dirty` when `git status --porcelain` is not empty;
/// `unknown` outside a repository.
pub fn git_commit() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    match run(&["rev-parse", "HEAD"]) {
        Some(commit) => match run(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(status) if !status.is_empty() => format!("{commit}-dirty"),
            _ => commit,
        },
        None => "unknown".into(),
    }
}
