//! `--power-cut`: the run's data directory on a disk that forgets what was never synced
//! (`launch::power::PowerDisk`, a `forgetful-fs` mount), so that the nemesis can cut the
//! power. The disk is cut under the `reorder` model with strict names ([`persistence`]):
//! each unsynced block kept or lost from the cut's seed, a name durable only once its
//! directory is synced (docs/power-cut.md, "Models"). The disk lives in `<temp>/explore-power-<pid>/` (`disk`, `mnt`, `trash`, and
//! the cluster's own folder `pg` beside it); [`cleanup`] detaches the mount and removes
//! the folder after the run or on Ctrl-C.

use std::path::PathBuf;

use forgetful_fs::{Model, Names, Persistence};
use launch::power::PowerDisk;

/// The folder of this process's forgetful disk.
pub fn work_dir() -> PathBuf {
    std::env::temp_dir().join(format!("explore-power-{}", std::process::id()))
}

/// The disk's model: `reorder` with strict names, the first cut's seed derived from the
/// run's `seed` (each later cut's from it, `Persistence::cut_seed`), so `--seed`
/// replays the choices.
pub fn persistence(seed: u64) -> Persistence {
    Persistence {
        model: Model::Reorder,
        names: Names::Strict,
        seed: seed ^ 0x7063_7574,
        force_garble: false,
    }
}

/// Mounts the disk in [`work_dir`] under [`persistence`] of the run's `seed`, says so,
/// and makes `pgdata` on it; returns the disk and the data directory.
///
/// Errors: not root, no `/dev/fuse` (`launch::power::unavailable` says which), or the
/// mount fails.
pub fn mount(seed: u64) -> anyhow::Result<(PowerDisk, PathBuf)> {
    if let Some(reason) = launch::power::unavailable() {
        anyhow::bail!("--power-cut: {reason}");
    }
    let work = work_dir();
    std::fs::create_dir_all(&work)?;
    let persistence = persistence(seed);
    let disk = PowerDisk::mount_with(&work, persistence)?;
    println!("power-cut disk: {persistence} (each cut's seed in the history's nemesis line)");
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
