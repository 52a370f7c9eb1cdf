//! What a power cut dropped, and how to tear a write.

use std::fmt;
use std::path::PathBuf;

use crate::cache::BlockCounts;
use crate::model::{Model, Persistence};

/// Tear the last unsynced write of one file at a power cut: the part of it up to the
/// first `boundary_bytes` boundary inside it reaches the disk, the rest does not (a disk
/// writes whole sectors, 512 B or 4 KiB, but not a whole page of a database at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tear {
    /// The file, relative to the mount point (`pgdata/base/5/16384`).
    pub file: PathBuf,
    /// 512 or 4096.
    pub boundary_bytes: u64,
}

/// One file's unsynced data (from [`crate::Mounted::unsynced_file`]): what a cut now
/// would drop of it, and the write a [`Tear`] of it would tear.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnsyncedFile {
    /// Bytes passed to `write` since the file's last sync.
    pub bytes: u64,
    /// Writes and truncations since the file's last sync.
    pub write_operations: u64,
    /// Offset and length in bytes of the last write (`None` after a truncation).
    pub last_write: Option<(u64, u64)>,
}

/// What a power cut dropped (or, from [`crate::Mounted::unsynced`], would drop now).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DropReport {
    /// Files that held unsynced data.
    pub files: u64,
    /// Bytes passed to `write` since each file's last sync.
    pub bytes: u64,
    /// Writes and truncations since each file's last sync.
    pub write_operations: u64,
    /// Creates, mkdirs, unlinks, rmdirs and renames not yet committed by an fsync.
    pub name_operations: u64,
    /// Bytes of a torn write that reached the disk (0 without a tear).
    pub torn_bytes_kept: u64,
    /// Undo steps that failed (none expected; shown so a failure is seen).
    pub errors: Vec<String>,
    /// The mount's persistence model (the cut's seed is [`DropReport::seed`]).
    pub persistence: Persistence,
    /// The seed this cut chose blocks with (mount again with it to replay the choices).
    pub seed: u64,
    /// Under `reorder` or `garble`: unsynced blocks (4 KiB) the cut wrote whole.
    pub blocks_kept: u64,
    /// Unsynced blocks the cut left out (under `drop`, 0: every one is, uncounted).
    pub blocks_lost: u64,
    /// Under `garble`: blocks written in part (some 512-byte sectors new, others old).
    pub blocks_torn: u64,
    /// Under `garble`: blocks with sectors of garbage.
    pub blocks_garbled: u64,
    /// Syncs held at the gate when the power went (`Mounted::hold_syncs`): each failed,
    /// its data left to the cut.
    pub syncs_held: u64,
}

impl DropReport {
    /// Adds one file's block counts.
    pub(crate) fn add_blocks(&mut self, counts: BlockCounts) {
        self.blocks_kept += counts.kept;
        self.blocks_lost += counts.lost;
        self.blocks_torn += counts.torn;
        self.blocks_garbled += counts.garbled;
    }

    /// The model's part of a transcript line: `model=drop names=journal`, and under
    /// another model its blocks, `model=reorder names=strict seed=5 blocks kept_n=3
    /// lost_n=4 torn_n=0 garbled_n=0` (the counts vary with the cut: `_n`).
    pub fn model_words(&self) -> String {
        if self.persistence.model == Model::Drop {
            return self.persistence.to_string();
        }
        format!(
            "{} seed={} blocks kept_n={} lost_n={} torn_n={} garbled_n={}",
            self.persistence,
            self.seed,
            self.blocks_kept,
            self.blocks_lost,
            self.blocks_torn,
            self.blocks_garbled
        )
    }
}

impl fmt::Display for DropReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dropped {} files, {} bytes unsynced, {} writes, {} name operations",
            self.files, self.bytes, self.write_operations, self.name_operations
        )?;
        if self.torn_bytes_kept > 0 {
            write!(f, ", torn write kept {} bytes", self.torn_bytes_kept)?;
        }
        write!(f, "; {}", self.model_words())?;
        if !self.errors.is_empty() {
            write!(f, ", errors: {}", self.errors.join("; "))?;
        }
        Ok(())
    }
}
