//! Syncs that never reach the disk, for InnoDB's torn page (P11, P12): `strace`
//! attached to `mariadbd` makes every `fsync` and `fdatasync` of chosen files succeed
//! without being made (`-e inject=fsync,fdatasync:retval=0`: strace's manual, "the
//! syscall is not executed"; `-P PATH` limits it to calls on those files), so what the
//! server writes to them after the attach stays unsynced on the forgetful disk, and the
//! cut drops or tears it, as a power cut in the middle of a page write would.
//!
//! Why a tool: InnoDB writes a page and syncs its file within one flush batch of the
//! page cleaner (and writes a checkpoint after it); no page write was ever seen unsynced
//! on this disk, so a torn page cannot be waited for, nor forced by the file system as
//! P3 forces PostgreSQL's (an eviction write PostgreSQL never syncs before a
//! checkpoint). With the table's file and the redo log's syncs lost from a chosen
//! moment, the disk holds at the cut what it would hold had the power failed during the
//! page's write: the redo synced before that moment, the doublewrite copy (`ibdata1`,
//! synced for real before the write in place), the page's write unsynced and the
//! checkpoint written after it unsynced too.
//!
//! `strace` is a program of the machine: [`unavailable`] installs it with `apt-get` as
//! root when it is missing (Debian's package `strace`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest wait for strace to have attached every thread of the server, milliseconds
/// (a hang bound only).
const ATTACH_WAIT_MS: u64 = 10_000;

/// Why syncs cannot be lost here, or `None` when they can: `strace` on the `PATH`, or
/// installed now with `apt-get install strace` (root; `apt-get update` once if the
/// package is not found).
pub fn unavailable() -> Option<String> {
    if found() {
        return None;
    }
    if let Some(reason) = launch::power::unavailable() {
        return Some(format!(
            "strace is not installed, and installing it needs root: {reason}"
        ));
    }
    let install = || {
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q"])
            .args(["--no-install-recommends", "strace"])
            .stdin(Stdio::null())
            .output()
    };
    let installed = install().is_ok_and(|out| out.status.success())
        || (Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "update", "-q"])
            .output()
            .is_ok()
            && install().is_ok_and(|out| out.status.success()));
    match installed && found() {
        true => None,
        false => Some("strace is not installed and apt-get install strace failed".into()),
    }
}

/// Whether `strace` runs.
fn found() -> bool {
    let ran = Command::new("strace").arg("-V").output();
    ran.is_ok_and(|out| out.status.success())
}

/// `strace` attached to a server, losing the syncs of some files until dropped (then
/// SIGKILLed and reaped: the server's syncs are made again).
pub struct LostSyncs {
    child: Child,
    log: PathBuf,
}

impl LostSyncs {
    /// Attaches to every thread of process `pid` (and the threads it starts) and loses
    /// every `fsync` and `fdatasync` of `files`; returns once every thread is traced
    /// (`TracerPid` in `/proc/<pid>/task/*/status`). The injected calls are written to
    /// `log`.
    ///
    /// Errors: strace cannot start, ends, or has not attached within the hang bound.
    pub fn attach(pid: u32, files: &[PathBuf], log: &Path) -> anyhow::Result<LostSyncs> {
        let mut command = Command::new("strace");
        command.args(["-f", "-qq", "-p", &pid.to_string()]);
        for file in files {
            command.arg("-P").arg(file);
        }
        command
            .args(["-e", "trace=fsync,fdatasync"])
            .args(["-e", "inject=fsync,fdatasync:retval=0"])
            .arg("-o")
            .arg(log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn()?;
        let mut lost = LostSyncs {
            child,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_millis(ATTACH_WAIT_MS);
        while !traced(pid, lost.child.id()) {
            if let Some(status) = lost.child.try_wait()? {
                anyhow::bail!("strace ended before it attached: {status}");
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "strace did not attach within {ATTACH_WAIT_MS} ms"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(lost)
    }

    /// The syncs lost so far (lines of strace's log marked `INJECTED`).
    pub fn lost(&self) -> usize {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|line| line.contains("INJECTED"))
            .count()
    }
}

/// Whether every thread of `pid` is traced by `tracer`.
fn traced(pid: u32, tracer: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let expected = format!("TracerPid:\t{tracer}");
    let mut any = false;
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if !status.lines().any(|line| line == expected) {
            return false;
        }
        any = true;
    }
    any
}

impl Drop for LostSyncs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
