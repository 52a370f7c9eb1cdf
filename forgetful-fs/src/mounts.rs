//! Finding and removing mounts by path, for cleanup after a crash of the process that
//! served them (the janitor's job): a FUSE mount whose daemon died stays mounted and
//! answers "Transport endpoint is not connected" until it is unmounted.

use std::io;
use std::path::{Path, PathBuf};

/// Mount points at or under `folder`, deepest first, from `/proc/self/mountinfo`.
fn mounts_under(folder: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .filter(|point| point.starts_with(folder))
        .collect();
    found.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    found
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> PathBuf {
    let mut out = Vec::new();
    let bytes = field.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\'
            && index + 4 <= bytes.len()
            && let Ok(value) = u8::from_str_radix(&field[index + 1..index + 4], 8)
        {
            out.push(value);
            index += 4;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    PathBuf::from(std::ffi::OsString::from(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

/// Whether `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    mounts_under(path).iter().any(|point| point == path)
}

/// Detaches the mount at `path` (`umount2(MNT_DETACH)`).
///
/// Errors: the system call's (EINVAL when nothing is mounted there).
pub fn detach(path: &Path) -> io::Result<()> {
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
}

/// Detaches every mount at or under `folder`, deepest first; returns how many.
pub fn unmount_under(folder: &Path) -> usize {
    mounts_under(folder)
        .iter()
        .filter(|point| detach(point).is_ok())
        .count()
}
