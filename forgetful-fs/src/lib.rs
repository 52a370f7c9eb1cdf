//! A file system that forgets: a FUSE pass-through to a backing folder that holds every
//! file's written data in memory until that file is `fsync`ed (or `fdatasync`ed), and
//! journals creates, renames and unlinks until any `fsync` commits them, so that a
//! [`Mounted::cut_power`] can drop what the disk never got, the way a power cut drops
//! the operating system's page cache. The model follows Jepsen's LazyFS (its
//! `clear-cache` fault) and SQLite's crash simulation (`src/test6.c`): what reached the
//! disk stays; what was only written is gone, or with a [`Tear`] the last write of one
//! file reaches the disk up to a sector boundary.
//!
//! That is the `drop` model. A mount may take another ([`Persistence`]): `reorder`
//! (each unsynced 4 KiB block independently kept or lost at the cut, from the cut's
//! seed), `garble` (as `reorder`, and a lost block over old data may come back torn or
//! as garbage, test6.c's characteristics), and strict names (a name operation durable
//! only after an `fsync` of its directory) beside the journal-like default.
//!
//! Mounting needs root (`/dev/fuse`): the daemon runs as a thread of the caller, the
//! mount uses the `mount(2)` system call (fuser without libfuse), and files are created
//! in the name of the user who asks (PostgreSQL as `nobody` works through it). The
//! kernel caches no attribute and no name (time-to-live 0) and drops a file's cached
//! pages on each open, so after a cut every new reader sees what the cut left.
//!
//! What it does not model: the drive's own volatile cache (a synced write is on the
//! disk), reordering of synced writes, metadata other than names (modes, owners and times are applied at once),
//! hard links, symbolic links, `fallocate` (the kernel falls back to writing zeros).

mod cache;
mod fs;
mod gate;
mod model;
mod mounts;
mod report;
mod state;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use model::{Model, Names, Persistence};
pub use mounts::{is_mounted, unmount_under};
pub use report::{DropReport, Tear, UnsyncedFile};

use crate::state::State;

/// A mounted forgetful file system. Dropping it unmounts (lazily, so a process still
/// holding a file there does not keep it mounted) and leaves the backing folder.
pub struct Mounted {
    state: Arc<Mutex<State>>,
    gate: Arc<gate::Gate>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

impl Mounted {
    /// Mounts a forgetful view of `backing` at `mountpoint` (both existing folders;
    /// `trash` is created beside `backing` in `work`, and must be on its file system).
    /// Everyone may use the mount (`allow_other`); the kernel checks permissions
    /// (`default_permissions`).
    ///
    /// Errors: not root, no `/dev/fuse`, or the mount fails.
    pub fn mount(backing: &Path, trash: &Path, mountpoint: &Path) -> io::Result<Mounted> {
        Mounted::mount_with(backing, trash, mountpoint, Persistence::default())
    }

    /// As [`Mounted::mount`], cut as `persistence` says (the model, when names become
    /// durable, the seed of the first cut).
    ///
    /// Errors: as [`Mounted::mount`].
    pub fn mount_with(
        backing: &Path,
        trash: &Path,
        mountpoint: &Path,
        persistence: Persistence,
    ) -> io::Result<Mounted> {
        let backing = std::path::absolute(backing)?;
        let trash = std::path::absolute(trash)?;
        let mountpoint = std::path::absolute(mountpoint)?;
        let state = Arc::new(Mutex::new(State::new(backing, trash, persistence)));
        let options = [
            fuser::MountOption::FSName("forgetful".into()),
            fuser::MountOption::AllowOther,
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::RW,
        ];
        let gate = Arc::new(gate::Gate::default());
        let filesystem = fs::ForgetfulFs {
            state: state.clone(),
            gate: gate.clone(),
        };
        let session = fuser::spawn_mount2(filesystem, &mountpoint, &options)?;
        Ok(Mounted {
            state,
            gate,
            session: Some(session),
            mountpoint,
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// What a cut now would drop, without dropping it.
    pub fn unsynced(&self) -> DropReport {
        self.lock().unsynced()
    }

    /// The unsynced data of one file (`relative` to the mount point, as in a [`Tear`]),
    /// `None` when it has none: lets a case see that a write it forced is held unsynced
    /// before it cuts.
    pub fn unsynced_file(&self, relative: &Path) -> Option<UnsyncedFile> {
        self.lock().unsynced_file(relative)
    }

    /// Writes everything back now, as the kernel's periodic write-back or `sync(1)`
    /// would (a case uses it to make its setup durable before the part it tests).
    ///
    /// Errors: writing a backing file.
    pub fn sync_all(&self) -> io::Result<()> {
        self.lock().sync_all()
    }

    /// The power cut: forgets every file's unsynced data (or, under `reorder` and
    /// `garble`, writes back, tears or garbles each block as the cut's seed says) and
    /// undoes the names not yet committed (tearing the last write of `tear`'s file, if
    /// given), and reports what was dropped, with the model and the cut's seed. Stop every process using the mount first (SIGKILL): a process
    /// still running would go on from memory the disk no longer matches.
    pub fn cut_power(&self, tear: Option<&Tear>) -> DropReport {
        let held = self.gate.held();
        let mut report = self.lock().cut(tear);
        report.syncs_held = report.syncs_held.max(held);
        self.gate.cut();
        report
    }

    /// Holds every `fsync`, `fdatasync` and directory `fsync` from now on, before it
    /// reaches the disk, until [`Mounted::release_syncs`] or a cut (a sync held across a
    /// cut fails with EIO and syncs nothing): lets a case cut while a commit is certainly
    /// between its write and its sync. The daemon serves one request at a time, so every
    /// other request of the mount waits behind a held sync.
    pub fn hold_syncs(&self) {
        self.gate.hold();
    }

    /// The moment the power goes, before the processes using the mount are stopped:
    /// from now until [`Mounted::cut_power`] every write, truncation, name operation
    /// and sync is refused (EIO) and changes nothing, and the syncs held at the gate
    /// fail. A case freezes, then SIGKILLs (a process stuck in a held sync could not
    /// die before its request is answered), then cuts.
    pub fn freeze(&self) {
        let held = self.gate.held();
        let mut state = self.lock();
        state.frozen = true;
        state.syncs_held = state.syncs_held.max(held);
        drop(state);
        self.gate.cut();
    }

    /// Lets the held syncs go on.
    pub fn release_syncs(&self) {
        self.gate.release();
    }

    /// Syncs held at the gate now.
    pub fn syncs_held(&self) -> u64 {
        self.gate.held()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.gate.release();
        let _ = mounts::detach(&self.mountpoint);
        drop(self.session.take());
    }
}
