//! Child processes whose life is tied to ours.
//!
//! Linux delivers the parent-death signal (`prctl(PR_SET_PDEATHSIG)`, see prctl(2)) when
//! the *thread* that forked the child exits, not only the process. Tokio's blocking
//! threads come and go, so every tied child is forked from one dedicated thread that
//! lives as long as the process. The signal is set after `setuid`, because changing
//! credentials clears it.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

/// The credentials a child switches to before `exec`, used when we run as root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    /// Numeric user id.
    pub uid: u32,
    /// Numeric primary group id.
    pub gid: u32,
}

struct SpawnJob {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("scratch-pg-spawner".into())
            .spawn(move || {
                for mut job in receiver {
                    let _ = job.reply.send(job.command.spawn());
                }
                // The channel lives in a static, so this loop never ends while the
                // process runs: the thread, and with it the children's parent-death
                // link, lasts as long as the process.
            })
            .expect("spawn the scratch-pg spawner thread");
        Mutex::new(sender)
    })
}

/// Spawns `command` so that the child receives `death_signal` when this process dies
/// (also on SIGKILL), optionally after dropping to `credentials`.
///
/// Errors: the `io::Error` of `fork`/`exec`, or of `setgid`/`setuid`/`prctl` in the child.
pub fn spawn_tied(
    mut command: Command,
    credentials: Option<Credentials>,
    death_signal: libc::c_int,
) -> io::Result<Child> {
    let parent_pid = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // libc functions (setgroups, setgid, setuid, prctl, getppid); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if let Some(Credentials { uid, gid }) = credentials
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                death_signal as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent_pid {
                return Err(io::Error::other("parent died before exec"));
            }
            Ok(())
        });
    }
    let (reply, answer) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send(SpawnJob { command, reply })
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("spawner thread dropped the job"))?
}

/// The pids whose parent is `parent`, from `/proc/<pid>/stat` (field 4).
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<i32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Waits until `pid` is gone or a zombie (at most `within`).
pub fn wait_gone(pid: i32, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) if !stat.contains(") Z ") => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            _ => return,
        }
    }
}
