//! `--power-cut`: the run's data directory on a disk that forgets what was never synced
//! (`launch::power::PowerDisk`, a `forgetful-fs` mount), so that the nemesis can cut the
//! power. The disk lives in `<temp>/explore-power-<pid>/` (`disk`, `mnt`, `trash`, and
//! the cluster's own folder `pg` beside it); [`cleanup`] detaches the mount and removes
//! the folder after the run or on Ctrl-C.

use std::path::PathBuf;

use launch::power::PowerDisk;

/// The folder of this process's forgetful disk.
pub fn work_dir() -> PathBuf {
    std::env::temp_dir().join(format!("explore-power-{}", std::process::id()))
}

/// Mounts the disk in [`work_dir`] and makes `pgdata` on it; returns the disk and the
/// data directory.
///
/// Errors: not root, no `/dev/fuse` (`launch::power::unavailable` says which), or the
/// mount fails.
pub fn mount() -> anyhow::Result<(PowerDisk, PathBuf)> {
    if let Some(reason) = launch::power::unavailable() {
        anyhow::bail!("--power-cut: {reason}");
    }
    let work = work_dir();
    std::fs::create_dir_all(&work)?;
    let disk = PowerDisk::mount(&work)?;
    let data_dir = disk.path().join("pgdata");
    std::fs::create_dir(&data_dir)?;
    Ok((disk, data_dir))
}

/// Detaches a mount left in [`work_dir`] (the daemon is a thread of this process: after
/// an interruption nothing else unmounts it) and removes the folder.
pub fn cleanup() {
    let work = work_dir();
    if work.exists() {
        forgetful_fs::unmount_under(&work);
        let _ = std::fs::remove_dir_all(&work);
    }
}
