//! The sync gate: a hook point that holds every `fsync` (and directory `fsync`) request
//! before it reaches the disk, so that a case can cut the power while a commit is
//! certainly between its write and its sync (seen: [`Gate::held`] ≥ 1), instead of
//! hoping a cut lands there. The daemon serves one request at a time, so while one
//! sync is held every other request of the mount waits behind it.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest a sync is held, milliseconds: a hang bound only (a case freezes and cuts
/// long before); past it the sync goes on, so a case that failed between holding and
/// cutting cannot leave its processes stuck in the mount.
pub const HOLD_LIMIT_MS: u64 = 60_000;

#[derive(Debug, Default)]
struct Inner {
    /// Whether syncs are held now.
    holding: bool,
    /// Syncs waiting at the gate now.
    held: u64,
    /// Bumped by each cut: a sync held across a cut fails and syncs nothing.
    cuts: u64,
}

/// Holds syncs while closed.
#[derive(Debug, Default)]
pub struct Gate {
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Holds every sync from now on (until [`Gate::release`] or a cut).
    pub fn hold(&self) {
        self.lock().holding = true;
    }

    /// Lets every held sync go on (each then syncs as it would have).
    pub fn release(&self) {
        self.lock().holding = false;
        self.changed.notify_all();
    }

    /// Syncs waiting at the gate now.
    pub fn held(&self) -> u64 {
        self.lock().held
    }

    /// A cut happened: the held syncs fail (EIO) without syncing, the gate opens.
    pub fn cut(&self) {
        let mut inner = self.lock();
        inner.cuts += 1;
        inner.holding = false;
        self.changed.notify_all();
    }

    /// Called by a sync before it syncs: waits while the gate holds (at most
    /// [`HOLD_LIMIT_MS`]); `false` when a cut came meanwhile (the sync must fail and do
    /// nothing).
    pub fn pass(&self) -> bool {
        let mut inner = self.lock();
        if !inner.holding {
            return true;
        }
        let cuts = inner.cuts;
        inner.held += 1;
        let deadline = Instant::now() + Duration::from_millis(HOLD_LIMIT_MS);
        while inner.holding && inner.cuts == cuts {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            inner = self
                .changed
                .wait_timeout(inner, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        inner.held -= 1;
        inner.cuts == cuts
    }
}
