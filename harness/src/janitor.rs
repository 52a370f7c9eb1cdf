//! A watchdog process that removes the run's temporary folder when the harness dies
//! without cleaning up (SIGKILL). The harness re-executes itself as
//! `harness --janitor-for <folder>` with a pipe on its standard input; end of file on that
//! pipe means the harness is gone. By then every postgres, service and worker process
//! has received its parent-death signal; the janitor waits for the postmasters (the run's,
//! and those cases start under `files/`), a case's PgBouncer there, and the scratch
//! MariaDB's `mariadbd` to exit (a Patroni cluster's processes it kills first:
//! `scratch_pg::patroni::kill_left_under`), detaches any mount left under the folder (a power-cut
//! case's disk), removes the folder, and exits. It runs in its own process group so that a Ctrl-C
//! aimed at the harness does not kill it first.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the janitor waits for the postmaster to exit before removing the folder.
pub const POSTMASTER_EXIT_WAIT_MS: u64 = 15_000;

/// A running janitor; dropping it closes the pipe, which lets it finish.
pub struct Janitor {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Janitor {
    /// After a normal cleanup: close the pipe and reap the janitor (it finds nothing left
    /// to do and exits at once), so it does not linger as a zombie.
    pub fn finish(mut self) {
        drop(self.pipe.take());
        let deadline = Instant::now() + Duration::from_millis(2_000);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Starts the janitor for `run_dir`.
///
/// Errors: the harness binary cannot be re-executed.
pub fn spawn(run_dir: &Path) -> std::io::Result<Janitor> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--janitor-for")
        .arg(run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let pipe = child.stdin.take().expect("piped stdin");
    Ok(Janitor {
        child,
        pipe: Some(pipe),
    })
}

/// The janitor's body: wait for end of file on stdin, then clean `run_dir` up.
pub fn run(run_dir: &Path) -> ! {
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    // A Patroni cluster's postmasters are detached from their Patroni (their parent is
    // init), so no parent-death signal ends them: kill them, and whatever of etcd,
    // Patroni and HAProxy is still there.
    scratch_pg::patroni::kill_left_under(&run_dir.join("files"));
    let deadline = Instant::now() + Duration::from_millis(POSTMASTER_EXIT_WAIT_MS);
    while (postmaster_alive(run_dir) || crate::mariadb::alive(run_dir)) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // A power-cut case's disk (family P) stays mounted after its daemon thread died
    // with the harness; detach it before removing the folder under it.
    forgetful_fs::unmount_under(run_dir);
    // `initdb` (the run's cluster being made when the harness died) is no postmaster and
    // may still write into `pg/data` while the folder is removed: the removal then fails
    // on a folder that is not empty (seen: a kill -9 during the boot left `pg/data` and
    // `pg/sock`). Try again until the folder is gone, within the same bound.
    let deadline = Instant::now() + Duration::from_millis(POSTMASTER_EXIT_WAIT_MS);
    while std::fs::remove_dir_all(run_dir).is_err() && run_dir.exists() && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::process::exit(0);
}

/// Whether the run's postmaster, or one a case started under `files/` (a primary and
/// its standby), or a PgBouncer a case started there (family R), is still alive.
fn postmaster_alive(run_dir: &Path) -> bool {
    let mut pid_files = vec![run_dir.join("pg/data/postmaster.pid")];
    if let Ok(entries) = std::fs::read_dir(run_dir.join("files")) {
        for entry in entries.flatten() {
            pid_files.push(entry.path().join("data/postmaster.pid"));
            pid_files.push(entry.path().join(scratch_pg::bouncer::PID_FILE));
        }
    }
    pid_files.iter().any(|pid_file| alive_in(pid_file))
}

fn alive_in(pid_file: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(pid_file) else {
        return false;
    };
    let Some(pid) = text.lines().next().map(str::trim) else {
        return false;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.contains(") Z "),
        Err(_) => false,
    }
}
