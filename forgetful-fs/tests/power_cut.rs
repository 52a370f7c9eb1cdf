//! The file system through a real mount (root only; as another user these tests say
//! why they did not run and pass): a cut drops what was not synced and keeps what was.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use forgetful_fs::{Mounted, Tear};

fn mounted(work: &Path) -> Option<Mounted> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not run: mounting FUSE needs root");
        return None;
    }
    for name in ["disk", "trash", "mnt"] {
        std::fs::create_dir(work.join(name)).unwrap();
    }
    Some(Mounted::mount(&work.join("disk"), &work.join("trash"), &work.join("mnt")).unwrap())
}

#[test]
fn a_cut_drops_unsynced_writes_and_names_and_keeps_synced_ones() {
    let work = tempfile::tempdir().unwrap();
    let Some(mount) = mounted(work.path()) else {
        return;
    };
    let mnt = mount.path().to_path_buf();
    let mut kept = std::fs::File::create(mnt.join("kept")).unwrap();
    kept.write_all(b"durable").unwrap();
    kept.sync_all().unwrap();
    kept.write_all(b" and more").unwrap();
    drop(kept);
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::write(mnt.join("dir/lost"), b"never synced").unwrap();
    assert_eq!(
        std::fs::read(mnt.join("kept")).unwrap(),
        b"durable and more"
    );
    let report = mount.cut_power(None);
    assert_eq!((report.files, report.bytes), (2, 21), "{report}");
    assert_eq!(report.name_operations, 2, "{report}");
    assert!(report.errors.is_empty(), "{report}");
    assert_eq!(std::fs::read(mnt.join("kept")).unwrap(), b"durable");
    assert!(!mnt.join("dir").exists());
    drop(mount);
    assert!(!forgetful_fs::is_mounted(&work.path().join("mnt")));
}

#[test]
fn an_unlink_and_a_rename_come_back_unless_a_sync_committed_them() {
    let work = tempfile::tempdir().unwrap();
    let Some(mount) = mounted(work.path()) else {
        return;
    };
    let mnt = mount.path().to_path_buf();
    for name in ["a", "b"] {
        let file = std::fs::File::create(mnt.join(name)).unwrap();
        file.write_all_at(name.as_bytes(), 0).unwrap();
        file.sync_all().unwrap();
    }
    std::fs::remove_file(mnt.join("a")).unwrap();
    std::fs::rename(mnt.join("b"), mnt.join("c")).unwrap();
    let report = mount.cut_power(None);
    assert_eq!(report.name_operations, 2, "{report}");
    assert_eq!(std::fs::read(mnt.join("a")).unwrap(), b"a");
    assert_eq!(std::fs::read(mnt.join("b")).unwrap(), b"b");
    assert!(!mnt.join("c").exists());
    std::fs::remove_file(mnt.join("a")).unwrap();
    std::fs::File::open(&mnt).unwrap().sync_all().unwrap();
    assert_eq!(mount.cut_power(None).name_operations, 0);
    assert!(!mnt.join("a").exists());
}

#[test]
fn a_tear_keeps_the_first_sector_of_the_last_write() {
    let work = tempfile::tempdir().unwrap();
    let Some(mount) = mounted(work.path()) else {
        return;
    };
    let mnt = mount.path().to_path_buf();
    let file = std::fs::File::create(mnt.join("page")).unwrap();
    file.write_all_at(&[b'o'; 8192], 0).unwrap();
    file.sync_all().unwrap();
    file.write_all_at(&[b'n'; 8192], 0).unwrap();
    drop(file);
    let tear = Tear {
        file: "page".into(),
        boundary_bytes: 512,
    };
    let report = mount.cut_power(Some(&tear));
    assert_eq!(report.torn_bytes_kept, 512, "{report}");
    let after = std::fs::read(mnt.join("page")).unwrap();
    let firsts: Vec<u8> = after.iter().step_by(512).copied().collect();
    assert!(
        after[..512].iter().all(|byte| *byte == b'n'),
        "{report} {:?}",
        String::from_utf8_lossy(&firsts)
    );
    assert!(after[..512].iter().all(|byte| *byte == b'n'));
    assert!(after[512..].iter().all(|byte| *byte == b'o'));
}

#[test]
fn a_file_renamed_inside_a_new_folder_opens_again() {
    let work = tempfile::tempdir().unwrap();
    let Some(mount) = mounted(work.path()) else {
        return;
    };
    let mnt = mount.path().to_path_buf();
    std::fs::create_dir(mnt.join("wal")).unwrap();
    std::fs::write(mnt.join("wal/tmp"), [0u8; 100]).unwrap();
    std::fs::File::open(mnt.join("wal/tmp"))
        .unwrap()
        .sync_all()
        .unwrap();
    std::fs::rename(mnt.join("wal/tmp"), mnt.join("wal/seg")).unwrap();
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("wal/seg"))
        .unwrap();
    std::fs::write(mnt.join("wal/tmp2"), [0u8; 100]).unwrap();
    std::fs::rename(mnt.join("wal/tmp2"), mnt.join("wal/seg")).unwrap();
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("wal/seg"))
        .unwrap();
    assert_eq!(std::fs::read_dir(mnt.join("wal")).unwrap().count(), 1);
}
