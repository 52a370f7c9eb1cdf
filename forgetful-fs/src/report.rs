//! What a power cut dropped, and how to tear a write.

use std::fmt;
use std::path::PathBuf;

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
        if !self.errors.is_empty() {
            write!(f, ", errors: {}", self.errors.join("; "))?;
        }
        Ok(())
    }
}
