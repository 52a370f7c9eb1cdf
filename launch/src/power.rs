//! The power cut (family P and the exploration's `power-cut` nemesis): a disk that
//! forgets what was never synced (`forgetful-fs`, mounted in the case's folder), a
//! PostgreSQL cluster whose data directory lives on it, and the step that cuts the
//! power: SIGKILL of the postmaster and every backend at once, the unsynced data
//! dropped, a start with crash recovery, and the drop report.
//!
//! Mounting needs root and `/dev/fuse` ([`unavailable`] says why not); the mount uses
//! `mount(2)` directly, so neither libfuse nor `fusermount3` is needed.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use forgetful_fs::{DropReport, Mounted, Persistence, Tear, UnsyncedFile};
use scratch_pg::{Cluster, ClusterOptions};

/// Why a power cut cannot be simulated here, or `None` when it can: root is needed to
/// mount (`/dev/fuse` is 0600 root), and the device must exist.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("mounting the forgetful file system (FUSE) needs root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse on this machine (the FUSE module is not loaded)".into());
    }
    None
}

/// A forgetful disk mounted at `<work>/mnt` over `<work>/disk`. Dropping it unmounts.
pub struct PowerDisk {
    mount: Mounted,
    backing: PathBuf,
}

impl PowerDisk {
    /// Mounts it in `work` (an existing folder of the case's own) under the `drop` model
    /// with journal-like names (`forgetful_fs::Persistence::default`).
    ///
    /// Errors: not root, no `/dev/fuse`, or the mount fails.
    pub fn mount(work: &Path) -> anyhow::Result<PowerDisk> {
        PowerDisk::mount_with(work, Persistence::default())
    }

    /// As [`PowerDisk::mount`], cut as `persistence` says (docs/power-cut.md, "Models").
    ///
    /// Errors: as [`PowerDisk::mount`].
    pub fn mount_with(work: &Path, persistence: Persistence) -> anyhow::Result<PowerDisk> {
        if let Some(reason) = unavailable() {
            anyhow::bail!("{reason}");
        }
        use std::os::unix::fs::PermissionsExt;
        for name in ["disk", "trash", "mnt"] {
            let folder = work.join(name);
            std::fs::create_dir_all(&folder)?;
            std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755))?;
        }
        let (disk, trash, mnt) = (work.join("disk"), work.join("trash"), work.join("mnt"));
        let mount = Mounted::mount_with(&disk, &trash, &mnt, persistence)
            .with_context(|| format!("mounting the forgetful file system in {}", work.display()))?;
        Ok(PowerDisk {
            mount,
            backing: work.join("disk"),
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.mount.path()
    }

    /// The backing folder: what the disk holds. The harness process reads and writes
    /// files there, never through the mount: the file system's daemon is a thread of
    /// this process, and a page fault of this process on a mapping of the mount (SQLite
    /// maps its `-shm` file) would wait for a daemon that waits for this process's
    /// memory map lock.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// What a cut now would drop.
    pub fn unsynced(&self) -> DropReport {
        self.mount.unsynced()
    }

    /// One file's unsynced data (`relative` to the mount point), `None` when it has none.
    pub fn unsynced_file(&self, relative: &Path) -> Option<UnsyncedFile> {
        self.mount.unsynced_file(relative)
    }

    /// Writes everything back (the kernel's periodic write-back, `sync(1)`).
    ///
    /// Errors: writing a backing file.
    pub fn sync_all(&self) -> anyhow::Result<()> {
        Ok(self.mount.sync_all()?)
    }

    /// Drops what was never synced (stop every process using the disk first).
    pub fn cut(&self, tear: Option<&Tear>) -> DropReport {
        self.mount.cut_power(tear)
    }

    /// Holds every sync from now on until the cut (`Mounted::hold_syncs`): a commit
    /// under way stays between its write and its sync.
    pub fn hold_syncs(&self) {
        self.mount.hold_syncs()
    }

    /// The moment the power goes (`Mounted::freeze`): every change refused until the
    /// cut, the held syncs failed; SIGKILL the disk's processes after it, then cut.
    pub fn freeze(&self) {
        self.mount.freeze()
    }

    /// Syncs held now (`Mounted::syncs_held`).
    pub fn syncs_held(&self) -> u64 {
        self.mount.syncs_held()
    }
}

/// How many seeded cuts each power-cut case of the models runs (`./run.sh --cuts N`,
/// [`Cuts::DEFAULT`] when not given): a run choice (`case_kit::Choices`), recorded per
/// case as `power_cuts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cuts(pub u32);

impl Cuts {
    /// Cuts per case in a default run (at least 5, so that the CI run stays under 20 minutes).
    pub const DEFAULT: u32 = 5;
    /// The choice's name in the run record.
    pub const RECORD_NAME: &'static str = "power_cuts";
}

impl std::fmt::Display for Cuts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What one power cut did.
#[derive(Debug, Clone)]
pub struct PowerCut {
    /// Processes SIGKILLed (postmaster and its children).
    pub killed: usize,
    /// What the disk dropped.
    pub dropped: DropReport,
    /// Whether the cluster came back (crash recovery), or the error and log tail.
    pub recovery: Result<(), String>,
}

impl PowerCut {
    /// The transcript's line: `power cut: SIGKILL of every postgres process; dropped
    /// files_n=… bytes_n=… writes_n=… name_operations_n=…; model=drop names=journal;
    /// recovery ok` (the figures vary and are redacted as `[n]`, the seed as `[seed]`;
    /// the run record keeps them; under `reorder` or `garble` the model's words add the
    /// cut's seed and its blocks, `forgetful_fs::DropReport::model_words`).
    pub fn line(&self) -> String {
        format!(
            "power cut: SIGKILL of every postgres process; dropped files_n={} bytes_n={} writes_n={} name_operations_n={}{}; {}; recovery {}",
            self.dropped.files,
            self.dropped.bytes,
            self.dropped.write_operations,
            self.dropped.name_operations,
            if self.dropped.torn_bytes_kept > 0 {
                format!("; torn write kept {} bytes", self.dropped.torn_bytes_kept)
            } else {
                String::new()
            },
            self.dropped.model_words(),
            if self.recovery.is_ok() {
                "ok"
            } else {
                "FAILED"
            }
        )
    }

    /// The figures for the run record.
    pub fn record(&self) -> serde_json::Value {
        serde_json::json!({
            "killed_processes": self.killed,
            "dropped_files": self.dropped.files,
            "dropped_bytes": self.dropped.bytes,
            "dropped_writes": self.dropped.write_operations,
            "dropped_name_operations": self.dropped.name_operations,
            "torn_bytes_kept": self.dropped.torn_bytes_kept,
            "undo_errors": self.dropped.errors,
            "model": self.dropped.persistence.model.to_string(),
            "names": self.dropped.persistence.names.to_string(),
            "seed": self.dropped.seed,
            "blocks_kept": self.dropped.blocks_kept,
            "blocks_lost": self.dropped.blocks_lost,
            "blocks_torn": self.dropped.blocks_torn,
            "blocks_garbled": self.dropped.blocks_garbled,
            "recovered": self.recovery.is_ok(),
        })
    }
}

/// A scratch PostgreSQL cluster with its data directory on a [`PowerDisk`]; its log,
/// socket and configuration-free folder stay off the disk (`<work>/pg`). Field order
/// matters: the cluster stops before the disk unmounts.
pub struct PowerCluster {
    /// The cluster (its `data_dir` is on the disk).
    pub cluster: Cluster,
    /// The forgetful disk.
    pub disk: PowerDisk,
    work: PathBuf,
}

impl PowerCluster {
    /// Mounts a disk in `work` and starts a cluster on it with `settings` (after the
    /// durable defaults, so `fsync=off` wins) and `initdb_args`.
    ///
    /// Errors: the mount, initdb or the start fail.
    pub async fn start(
        work: &Path,
        settings: &[(&str, &str)],
        initdb_args: &[&str],
    ) -> anyhow::Result<PowerCluster> {
        PowerCluster::start_with(work, settings, initdb_args, Persistence::default()).await
    }

    /// As [`PowerCluster::start`] on a disk cut as `persistence` says.
    ///
    /// Errors: as [`PowerCluster::start`].
    pub async fn start_with(
        work: &Path,
        settings: &[(&str, &str)],
        initdb_args: &[&str],
        persistence: Persistence,
    ) -> anyhow::Result<PowerCluster> {
        let disk = PowerDisk::mount_with(work, persistence)?;
        let options = ClusterOptions {
            dir: Some(work.join("pg")),
            data_dir: Some(disk.path().join("pgdata")),
            settings: settings
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            initdb_args: initdb_args.iter().map(|arg| arg.to_string()).collect(),
            max_connections: 100,
            ..ClusterOptions::default()
        };
        std::fs::create_dir(disk.path().join("pgdata"))?;
        let cluster = tokio::task::spawn_blocking(move || Cluster::start(options))
            .await?
            .context("starting PostgreSQL on the forgetful disk")?;
        Ok(PowerCluster {
            cluster,
            disk,
            work: work.to_path_buf(),
        })
    }

    /// The case's folder holding the disk and the cluster.
    pub fn work(&self) -> &Path {
        &self.work
    }

    /// The power cut: SIGKILL of the postmaster and every backend, the disk's unsynced
    /// data dropped (the last write of `tear`'s file torn), a start with crash
    /// recovery. A failed recovery is reported, not an error: for a negative control
    /// it is the finding.
    ///
    /// Errors: the blocking task panicked.
    pub async fn power_cut(&mut self, tear: Option<&Tear>) -> anyhow::Result<PowerCut> {
        let killed = self.kill_all().await?;
        let dropped = self.disk.cut(tear);
        let recovery = self.start_after_crash().await?;
        Ok(PowerCut {
            killed,
            dropped,
            recovery,
        })
    }

    /// SIGKILL of every postgres process (see [`Cluster::kill_all`]).
    ///
    /// Errors: the blocking task panicked.
    pub async fn kill_all(&mut self) -> anyhow::Result<usize> {
        let cluster = &mut self.cluster;
        Ok(tokio::task::block_in_place(|| cluster.kill_all()))
    }

    /// Starts the server after a crash; `Err` carries the start error (recovery
    /// failed, say a checksum failure during redo).
    ///
    /// Errors: the blocking task panicked.
    pub async fn start_after_crash(&mut self) -> anyhow::Result<Result<(), String>> {
        let cluster = &mut self.cluster;
        Ok(tokio::task::block_in_place(|| {
            cluster
                .start_after_crash()
                .map_err(|error| error.to_string())
        }))
    }
}
