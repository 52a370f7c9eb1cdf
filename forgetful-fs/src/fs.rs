//! The FUSE side: each kernel request translated to the [`State`]. Attributes and
//! names are never cached by the kernel (time-to-live 0), so after a power cut every
//! reader sees the backing folder as the cut left it.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};

use crate::cache::Dirty;
use crate::state::State;

/// How long the kernel may cache an attribute or a name: never.
const TTL: Duration = Duration::ZERO;

/// The file system served to the kernel.
pub struct ForgetfulFs {
    /// Shared with the control ([`crate::Mounted`]).
    pub state: Arc<Mutex<State>>,
    /// The sync gate, shared with the control.
    pub gate: Arc<crate::gate::Gate>,
}

fn errno(error: &io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

fn attr_of(inode: u64, meta: &fs::Metadata, size: Option<u64>) -> FileAttr {
    let kind = if meta.is_dir() {
        FileType::Directory
    } else if meta.file_type().is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    };
    let time = |seconds: i64| UNIX_EPOCH + Duration::from_secs(seconds.max(0) as u64);
    FileAttr {
        ino: inode,
        size: size.unwrap_or(meta.len()),
        blocks: size.map_or(meta.blocks(), |size| size.div_ceil(512)),
        atime: time(meta.atime()),
        mtime: time(meta.mtime()),
        ctime: time(meta.ctime()),
        crtime: time(meta.ctime()),
        kind,
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl ForgetfulFs {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the power already went ([`crate::Mounted::freeze`]): every change is
    /// refused (EIO) until the cut.
    fn frozen(&self) -> bool {
        self.lock().frozen
    }

    /// The attributes of `inode` as readers see them (size from unsynced data).
    fn attr(&self, inode: u64) -> io::Result<FileAttr> {
        let mut state = self.lock();
        let node = state.node(inode)?;
        let meta = fs::symlink_metadata(&node.path)?;
        Ok(attr_of(inode, &meta, node.dirty.as_ref().map(|d| d.len)))
    }

    fn entry(&self, path: &Path) -> io::Result<FileAttr> {
        let meta = fs::symlink_metadata(path)?;
        let mut state = self.lock();
        let inode = state.inode_of(path);
        let size = state.node(inode)?.dirty.as_ref().map(|d| d.len);
        Ok(attr_of(inode, &meta, size))
    }

    /// Gives a new file or folder to the user who asked for it (the daemon runs as
    /// root) and journals its creation.
    fn adopt(&self, req: &Request<'_>, path: &Path) -> io::Result<FileAttr> {
        std::os::unix::fs::lchown(path, Some(req.uid()), Some(req.gid()))?;
        self.lock().created(path.to_path_buf());
        self.entry(path)
    }

    fn set_size(&self, inode: u64, size: u64) -> io::Result<()> {
        let mut state = self.lock();
        let backing_len = state.file(inode)?.metadata()?.len();
        let node = state.node(inode)?;
        node.dirty
            .get_or_insert_with(|| Dirty::new(backing_len))
            .truncate(size);
        Ok(())
    }

    fn do_setattr(
        &self,
        inode: u64,
        mode: Option<u32>,
        owner: (Option<u32>, Option<u32>),
        size: Option<u64>,
    ) -> io::Result<FileAttr> {
        let path = self.lock().node(inode)?.path.clone();
        if let Some(mode) = mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))?;
        }
        if owner.0.is_some() || owner.1.is_some() {
            std::os::unix::fs::lchown(&path, owner.0, owner.1)?;
        }
        if let Some(size) = size {
            self.set_size(inode, size)?;
        }
        self.attr(inode)
    }

    fn do_write(&self, inode: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        let file = state.file(inode)?.try_clone()?;
        let backing_len = file.metadata()?.len();
        let node = state.node(inode)?;
        node.dirty
            .get_or_insert_with(|| Dirty::new(backing_len))
            .write(&file, offset, data)
    }

    fn do_read(&self, inode: u64, offset: u64, size: u64) -> io::Result<Vec<u8>> {
        let mut state = self.lock();
        let file = state.file(inode)?.try_clone()?;
        let backing_len = file.metadata()?.len();
        match &state.node(inode)?.dirty {
            Some(dirty) => dirty.read(&file, offset, size),
            None => Dirty::new(backing_len).read(&file, offset, size),
        }
    }

    fn do_create(
        &self,
        req: &Request<'_>,
        path: &Path,
        mode: u32,
        flags: i32,
    ) -> io::Result<FileAttr> {
        let existed = fs::symlink_metadata(path).is_ok();
        if existed && flags & libc::O_EXCL != 0 {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        if !existed {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode & 0o7777)
                .open(path)?;
            return self.adopt(req, path);
        }
        let attr = self.entry(path)?;
        if flags & libc::O_TRUNC != 0 {
            self.set_size(attr.ino, 0)?;
        }
        self.attr(attr.ino)
    }

    fn do_readdir(&self, inode: u64, offset: i64, reply: &mut ReplyDirectory) -> io::Result<()> {
        let path = self.lock().node(inode)?.path.clone();
        let mut names: Vec<(std::ffi::OsString, FileType)> = vec![
            (".".into(), FileType::Directory),
            ("..".into(), FileType::Directory),
        ];
        let mut listed: Vec<_> = fs::read_dir(&path)?.collect::<Result<_, _>>()?;
        listed.sort_by_key(|entry| entry.file_name());
        for entry in listed {
            let kind = if entry.file_type()?.is_dir() {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            names.push((entry.file_name(), kind));
        }
        for (index, (name, kind)) in names.into_iter().enumerate().skip(offset as usize) {
            let child = self.lock().inode_of(&path.join(&name));
            if reply.add(child, index as i64 + 1, kind, &name) {
                break;
            }
        }
        Ok(())
    }
}

impl Filesystem for ForgetfulFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let path = self.lock().child_path(parent, name);
        match path.and_then(|path| self.entry(&path)) {
            Ok(attr) => reply.entry(&TTL, &attr, 0),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.attr(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        match self.do_setattr(ino, mode, (uid, gid), size) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn mkdir(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        let path = self.lock().child_path(parent, name);
        let made = path.and_then(|path| {
            fs::create_dir(&path)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))?;
            self.adopt(req, &path)
        });
        match made {
            Ok(attr) => reply.entry(&TTL, &attr, 0),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        let mut state = self.lock();
        match state
            .child_path(parent, name)
            .and_then(|p| state.remove(&p))
        {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        let mut state = self.lock();
        let removed = state.child_path(parent, name).and_then(|path| {
            if fs::read_dir(&path)?.next().is_some() {
                return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
            }
            state.remove(&path)
        });
        match removed {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        if flags != 0 {
            return reply.error(libc::EINVAL);
        }
        let mut state = self.lock();
        let renamed = state.child_path(parent, name).and_then(|from| {
            let to = state.child_path(newparent, newname)?;
            state.rename(&from, &to)
        });
        match renamed {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let mut state = self.lock();
        match state.file(ino).map(|_| ()) {
            Ok(()) => {
                if let Ok(node) = state.node(ino) {
                    node.opens += 1;
                }
                reply.opened(0, 0)
            }
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        match self.do_read(ino, offset as u64, u64::from(size)) {
            Ok(data) => reply.data(&data),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        match self.do_write(ino, offset as u64, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().release(ino);
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        if !self.gate.pass() {
            return reply.error(libc::EIO);
        }
        match self.lock().sync(Some(ino)) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        match self.do_readdir(ino, offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        match self.lock().sync_dir(ino) {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let root = self
            .lock()
            .node(crate::state::ROOT_INODE)
            .map(|n| n.path.clone());
        match root.and_then(|root| nix::sys::statvfs::statvfs(&root).map_err(io::Error::from)) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                s.name_max() as u32,
                s.fragment_size() as u32,
            ),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if self.frozen() {
            return reply.error(libc::EIO);
        }
        let path = self.lock().child_path(parent, name);
        let made = path.and_then(|path| self.do_create(req, &path, mode, flags));
        match made {
            Ok(attr) => {
                let mut state = self.lock();
                let opened = state.file(attr.ino).map(|_| ());
                match opened {
                    Ok(()) => {
                        if let Ok(node) = state.node(attr.ino) {
                            node.opens += 1;
                        }
                        reply.created(&TTL, &attr, 0, 0, 0)
                    }
                    Err(error) => reply.error(errno(&error)),
                }
            }
            Err(error) => reply.error(errno(&error)),
        }
    }
}
