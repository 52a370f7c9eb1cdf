//! The file system's memory: which inode is which backing path, each file's unsynced
//! data ([`Dirty`]), and the journal of name operations (create, mkdir, unlink, rmdir,
//! rename) not yet made durable. Names are changed in the backing folder at once; the
//! journal says how to undo each. Under [`Names::Journal`] any `fsync`, `fdatasync` or
//! directory `fsync` commits the whole journal, as a journalling file system's commit
//! does (ext4 with `data=ordered`); under [`Names::Strict`] an entry is committed only
//! by an `fsync` of its directory (both, for a rename). A power cut writes back what
//! the mount's [`Model`] keeps and undoes the uncommitted names in reverse order.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use crate::cache::Dirty;
use crate::model::{Chooser, Model, Names, Persistence};
use crate::report::{DropReport, Tear, UnsyncedFile};

/// The root directory's inode number (FUSE's).
pub const ROOT_INODE: u64 = 1;

/// One name operation and how to undo it.
#[derive(Debug)]
enum Undo {
    /// A file or directory was created at this backing path: remove it.
    Created(PathBuf),
    /// What was at `path` moved to `trash`: move it back.
    Removed { path: PathBuf, trash: PathBuf },
    /// `from` was renamed to `to`: rename it back.
    Renamed { from: PathBuf, to: PathBuf },
}

/// A journal entry: the undo, and the directories whose `fsync` commits it under
/// [`Names::Strict`] (the entry is committed once none is left).
#[derive(Debug)]
struct Entry {
    undo: Undo,
    dirs: Vec<PathBuf>,
}

impl Entry {
    fn new(undo: Undo) -> Entry {
        let parent = |path: &PathBuf| path.parent().map(Path::to_path_buf);
        let mut dirs: Vec<PathBuf> = match &undo {
            Undo::Created(path) | Undo::Removed { path, .. } => parent(path).into_iter().collect(),
            Undo::Renamed { from, to } => parent(from).into_iter().chain(parent(to)).collect(),
        };
        dirs.dedup();
        Entry { undo, dirs }
    }

    /// Commits it: what was removed is gone for good.
    fn commit(self) {
        if let Undo::Removed { trash, .. } = self.undo {
            let _ = std::fs::remove_dir_all(&trash).or_else(|_| std::fs::remove_file(&trash));
        }
    }
}

/// A file or directory the kernel knows by inode number.
#[derive(Debug)]
pub struct Node {
    /// Where it is in the backing folder (absolute).
    pub path: PathBuf,
    /// The backing file, opened read-write, while it is open or dirty.
    pub file: Option<File>,
    /// Unsynced data.
    pub dirty: Option<Dirty>,
    /// Open handles the kernel holds.
    pub opens: u32,
}

/// Everything the file system remembers.
#[derive(Debug)]
pub struct State {
    backing: PathBuf,
    trash: PathBuf,
    nodes: HashMap<u64, Node>,
    by_path: HashMap<PathBuf, u64>,
    next_inode: u64,
    next_trash: u64,
    journal: Vec<Entry>,
    persistence: Persistence,
    /// Cuts so far (the next cut's seed is [`Persistence::cut_seed`] of it).
    cuts: u64,
    /// The power already went (`Mounted::freeze`): every change is refused until the cut.
    pub frozen: bool,
    /// Syncs held at the gate when the mount was frozen.
    pub syncs_held: u64,
}

impl State {
    /// A state over `backing` (the "disk"), with `trash` (same file system, outside
    /// `backing`) holding what was removed and is not yet durable, cut as
    /// `persistence` says.
    pub fn new(backing: PathBuf, trash: PathBuf, persistence: Persistence) -> State {
        let mut state = State {
            backing,
            trash,
            nodes: HashMap::new(),
            by_path: HashMap::new(),
            next_inode: ROOT_INODE,
            next_trash: 0,
            journal: Vec::new(),
            persistence,
            cuts: 0,
            frozen: false,
            syncs_held: 0,
        };
        let root = state.backing.clone();
        state.inode_of(&root);
        state
    }

    /// The inode number for the backing path `path`, allocated on first sight.
    pub fn inode_of(&mut self, path: &Path) -> u64 {
        if let Some(inode) = self.by_path.get(path) {
            return *inode;
        }
        let inode = self.next_inode;
        self.next_inode += 1;
        self.by_path.insert(path.to_path_buf(), inode);
        self.nodes.insert(
            inode,
            Node {
                path: path.to_path_buf(),
                file: None,
                dirty: None,
                opens: 0,
            },
        );
        inode
    }

    /// The node of `inode`.
    ///
    /// Errors: ESTALE (forgotten at a power cut, or never known).
    pub fn node(&mut self, inode: u64) -> io::Result<&mut Node> {
        self.nodes
            .get_mut(&inode)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))
    }

    /// The backing path of `name` in directory `parent`.
    ///
    /// Errors: as [`State::node`].
    pub fn child_path(&mut self, parent: u64, name: &std::ffi::OsStr) -> io::Result<PathBuf> {
        Ok(self.node(parent)?.path.join(name))
    }

    /// The node's backing file, opened read-write on first use.
    ///
    /// Errors: the backing file cannot be opened.
    pub fn file(&mut self, inode: u64) -> io::Result<&File> {
        let node = self.node(inode)?;
        if node.file.is_none() {
            node.file = Some(OpenOptions::new().read(true).write(true).open(&node.path)?);
        }
        Ok(node.file.as_ref().expect("opened above"))
    }

    /// Records that `path` was just created in the backing folder.
    pub fn created(&mut self, path: PathBuf) {
        self.journal.push(Entry::new(Undo::Created(path)));
    }

    /// Moves what is at `path` to the trash (an unlink, rmdir, or a rename's victim),
    /// keeping its node (open handles stay valid).
    ///
    /// Errors: the move fails.
    pub fn remove(&mut self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(&self.trash)?;
        let trash = self.trash.join(self.next_trash.to_string());
        self.next_trash += 1;
        std::fs::rename(path, &trash)?;
        self.move_nodes(path, &trash);
        self.journal.push(Entry::new(Undo::Removed {
            path: path.to_path_buf(),
            trash,
        }));
        Ok(())
    }

    /// Renames `from` to `to` in the backing folder (moving what `to` held to the trash
    /// first).
    ///
    /// Errors: the rename fails.
    pub fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        if std::fs::symlink_metadata(to).is_ok() {
            self.remove(to)?;
        }
        std::fs::rename(from, to)?;
        self.move_nodes(from, to);
        self.journal.push(Entry::new(Undo::Renamed {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        }));
        Ok(())
    }

    /// Points every node at or under `from` to the same place under `to`.
    fn move_nodes(&mut self, from: &Path, to: &Path) {
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(path, _)| path.starts_with(from))
            .map(|(path, inode)| (path.clone(), *inode))
            .collect();
        for (old, inode) in moved {
            self.by_path.remove(&old);
            let rest = old.strip_prefix(from).expect("filtered on the prefix");
            // `join("")` would add a trailing slash, and a file's path would then fail
            // to open (ENOTDIR).
            let new = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            if let Some(node) = self.nodes.get_mut(&inode) {
                node.path = new.clone();
            }
            self.by_path.insert(new, inode);
        }
    }

    /// An `fsync` of the file `inode` (or, with `None`, of nothing but the journal):
    /// writes the file's unsynced data to the backing file and, under
    /// [`Names::Journal`], commits the name journal.
    ///
    /// Errors: writing the backing file.
    pub fn sync(&mut self, inode: Option<u64>) -> io::Result<()> {
        if let Some(inode) = inode
            && let Some(dirty) = self.node(inode)?.dirty.take()
        {
            let flushed = dirty.flush_to(self.file(inode)?);
            if let Err(error) = flushed {
                self.node(inode)?.dirty = Some(dirty);
                return Err(error);
            }
        }
        if inode.is_none() || self.persistence.names == Names::Journal {
            self.journal.drain(..).for_each(Entry::commit);
        }
        Ok(())
    }

    /// An `fsync` of the directory `inode`: under [`Names::Journal`] commits the whole
    /// journal; under [`Names::Strict`] only the entries whose every directory has now
    /// been synced.
    ///
    /// Errors: ESTALE (an unknown inode).
    pub fn sync_dir(&mut self, inode: u64) -> io::Result<()> {
        if self.persistence.names == Names::Journal {
            return self.sync(None);
        }
        let dir = self.node(inode)?.path.clone();
        let mut pending = Vec::new();
        for mut entry in self.journal.drain(..) {
            entry.dirs.retain(|pending_dir| pending_dir != &dir);
            if entry.dirs.is_empty() {
                entry.commit();
            } else {
                pending.push(entry);
            }
        }
        self.journal = pending;
        Ok(())
    }

    /// Writes every file's unsynced data back and commits the journal, as the kernel's
    /// periodic write-back (or `sync(1)`) would: after it a cut drops nothing.
    ///
    /// Errors: writing a backing file.
    pub fn sync_all(&mut self) -> io::Result<()> {
        let dirty: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, node)| node.dirty.is_some())
            .map(|(inode, _)| *inode)
            .collect();
        for inode in dirty {
            self.sync(Some(inode))?;
        }
        self.sync(None)
    }

    /// Drops a node's backing file when nothing holds it open or dirty.
    pub fn release(&mut self, inode: u64) {
        if let Some(node) = self.nodes.get_mut(&inode) {
            node.opens = node.opens.saturating_sub(1);
            if node.opens == 0 && node.dirty.is_none() {
                node.file = None;
            }
        }
    }

    /// Bytes and operations not yet synced, and files holding them (what a cut now
    /// would drop, without dropping it).
    pub fn unsynced(&self) -> DropReport {
        let mut report = DropReport::default();
        for node in self.nodes.values() {
            if let Some(dirty) = &node.dirty {
                report.files += 1;
                report.bytes += dirty.bytes;
                report.write_operations += dirty.operations;
            }
        }
        report.name_operations = self.journal.len() as u64;
        report
    }

    /// The unsynced data of the file at `relative` (to the backing folder), `None` when
    /// it has none or the file system has not seen it.
    pub fn unsynced_file(&self, relative: &Path) -> Option<UnsyncedFile> {
        let inode = self.by_path.get(&self.backing.join(relative))?;
        let dirty = self.nodes.get(inode)?.dirty.as_ref()?;
        Some(UnsyncedFile {
            bytes: dirty.bytes,
            write_operations: dirty.operations,
            last_write: dirty.last_write,
        })
    }

    /// The power cut: every file's unsynced data is forgotten, or under a model kept,
    /// torn or garbled block by block from the cut's seed (the last write of the file
    /// `tear` names is torn first), the uncommitted name operations are undone newest
    /// first, and every inode is forgotten (the kernel looks names up again).
    pub fn cut(&mut self, tear: Option<&Tear>) -> DropReport {
        let mut report = self.unsynced();
        report.persistence = self.persistence;
        report.seed = self.persistence.cut_seed(self.cuts);
        if self.persistence.force_garble && self.persistence.model == Model::Garble {
            report.seed = self.garbling_seed(report.seed);
        }
        report.syncs_held = std::mem::take(&mut self.syncs_held);
        self.cuts += 1;
        let torn_path = tear.map(|tear| self.backing.join(&tear.file));
        for node in self.nodes.values_mut() {
            let (Some(dirty), Some(file)) = (&node.dirty, &node.file) else {
                continue;
            };
            if let (Some(tear), Some(path)) = (tear, &torn_path)
                && &node.path == path
            {
                match dirty.tear_last_write(file, tear.boundary_bytes) {
                    Ok(kept) => report.torn_bytes_kept += kept,
                    Err(error) => report.errors.push(format!("tear: {error}")),
                }
            }
            if self.persistence.model != Model::Drop {
                let relative = node.path.strip_prefix(&self.backing).unwrap_or(&node.path);
                let chooser = Chooser::new(self.persistence.model, report.seed, relative);
                match dirty.cut_with(file, &chooser) {
                    Ok(counts) => report.add_blocks(counts),
                    Err(error) => report.errors.push(format!("write back: {error}")),
                }
            }
        }
        self.undo_journal(&mut report);
        self.forget_nodes();
        self.frozen = false;
        report
    }

    /// The first seed of `seed`'s sequence under which some dirty block over old data
    /// is torn or garbled (`seed` itself when none of the first 256 does).
    fn garbling_seed(&self, seed: u64) -> u64 {
        let garbles = |candidate: u64| {
            self.nodes.values().any(|node| {
                let (Some(dirty), Some(file)) = (&node.dirty, &node.file) else {
                    return false;
                };
                let disk_len = file.metadata().map_or(0, |meta| meta.len());
                let relative = node.path.strip_prefix(&self.backing).unwrap_or(&node.path);
                let chooser = Chooser::new(Model::Garble, candidate, relative);
                dirty.would_garble(disk_len, &chooser)
            })
        };
        (0..256u64)
            .map(|k| {
                if k == 0 {
                    seed
                } else {
                    crate::model::mix(seed ^ crate::model::mix(k))
                }
            })
            .find(|candidate| garbles(*candidate))
            .unwrap_or(seed)
    }

    /// Undoes the uncommitted name operations, newest first (a directory whose creation
    /// is undone goes with what is in it: its entry in its parent never reached the disk).
    fn undo_journal(&mut self, report: &mut DropReport) {
        for entry in self.journal.drain(..).rev() {
            let undone = match &entry.undo {
                Undo::Created(path) => {
                    std::fs::remove_file(path).or_else(|_| std::fs::remove_dir_all(path))
                }
                Undo::Removed { path, trash } => std::fs::rename(trash, path),
                Undo::Renamed { from, to } => std::fs::rename(to, from),
            };
            if let Err(error) = undone {
                report
                    .errors
                    .push(format!("undo {:?}: {error}", entry.undo));
            }
        }
    }

    fn forget_nodes(&mut self) {
        self.nodes.clear();
        self.by_path.clear();
        let root = self.backing.clone();
        self.by_path.insert(root.clone(), ROOT_INODE);
        self.nodes.insert(
            ROOT_INODE,
            Node {
                path: root,
                file: None,
                dirty: None,
                opens: 0,
            },
        );
    }
}
