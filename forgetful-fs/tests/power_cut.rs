//! The file system through a real mount (root only; as another user these tests say
//! why they did not run and pass): a cut drops what was not synced and keeps what was.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use forgetful_fs::{Model, Mounted, Names, Persistence, Tear};

fn mounted(work: &Path) -> Option<Mounted> {
    mounted_with(work, Persistence::default())
}

fn mounted_with(work: &Path, persistence: Persistence) -> Option<Mounted> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not run: mounting FUSE needs root");
        return None;
    }
    for name in ["disk", "trash", "mnt"] {
        std::fs::create_dir_all(work.join(name)).unwrap();
    }
    let (disk, trash, mnt) = (work.join("disk"), work.join("trash"), work.join("mnt"));
    Some(Mounted::mount_with(&disk, &trash, &mnt, persistence).unwrap())
}

/// Writes `tmp`, syncs it, renames it to `final` (the atomic-replace idiom) and syncs
/// `final` again, but not the directory, then cuts; returns whether `final` is there
/// after the cut, and whether it is when the directory was synced after the rename.
fn write_rename_survives(names: Names) -> Option<(bool, bool)> {
    let persistence = Persistence {
        names,
        ..Persistence::default()
    };
    let mut seen = Vec::new();
    for sync_dir in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let mount = mounted_with(work.path(), persistence)?;
        let mnt = mount.path().to_path_buf();
        let file = std::fs::File::create(mnt.join("tmp")).unwrap();
        file.write_all_at(b"new content", 0).unwrap();
        file.sync_all().unwrap();
        drop(file);
        std::fs::rename(mnt.join("tmp"), mnt.join("final")).unwrap();
        std::fs::File::open(mnt.join("final"))
            .unwrap()
            .sync_all()
            .unwrap();
        if sync_dir {
            std::fs::File::open(&mnt).unwrap().sync_all().unwrap();
        }
        let report = mount.cut_power(None);
        assert!(report.errors.is_empty(), "{report}");
        seen.push(std::fs::read(mnt.join("final")).ok() == Some(b"new content".to_vec()));
    }
    Some((seen[0], seen[1]))
}

#[test]
fn a_write_rename_without_the_directory_fsync_loses_the_name_under_strict_names_only() {
    let Some(strict) = write_rename_survives(Names::Strict) else {
        return;
    };
    assert_eq!(
        strict,
        (false, true),
        "strict: (without, with) the dir fsync"
    );
    let journal = write_rename_survives(Names::Journal).unwrap();
    assert_eq!(
        journal,
        (true, true),
        "journal: the file's fsync commits the name"
    );
}

#[test]
fn under_strict_names_a_synced_file_in_an_unsynced_new_folder_is_gone() {
    let work = tempfile::tempdir().unwrap();
    let persistence = Persistence {
        names: Names::Strict,
        ..Persistence::default()
    };
    let Some(mount) = mounted_with(work.path(), persistence) else {
        return;
    };
    let mnt = mount.path().to_path_buf();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    let file = std::fs::File::create(mnt.join("dir/f")).unwrap();
    file.write_all_at(b"data", 0).unwrap();
    file.sync_all().unwrap();
    std::fs::File::open(mnt.join("dir"))
        .unwrap()
        .sync_all()
        .unwrap();
    let report = mount.cut_power(None);
    assert_eq!(report.name_operations, 1, "{report}");
    assert!(report.errors.is_empty(), "{report}");
    assert!(!mnt.join("dir").exists(), "the root was never synced");
}

/// 16 blocks written in order to a synced file of old blocks, then a cut under
/// `model` with `seed`: which blocks hold the new content afterwards.
fn blocks_after_cut(model: Model, seed: u64) -> Option<Vec<char>> {
    let work = tempfile::tempdir().unwrap();
    let persistence = Persistence {
        model,
        seed,
        ..Persistence::default()
    };
    let mount = mounted_with(work.path(), persistence)?;
    let mnt = mount.path().to_path_buf();
    let file = std::fs::File::create(mnt.join("f")).unwrap();
    file.write_all_at(&[b'o'; 16 * 4096], 0).unwrap();
    file.sync_all().unwrap();
    for block in 0..16u64 {
        file.write_all_at(&[b'n'; 4096], block * 4096).unwrap();
    }
    drop(file);
    let report = mount.cut_power(None);
    assert_eq!(report.seed, seed);
    if model != Model::Drop {
        assert!(
            report.to_string().contains(&format!("seed={seed}")),
            "{report}"
        );
    }
    let after = std::fs::read(work.path().join("disk/f")).unwrap();
    assert_eq!(after.len(), 16 * 4096);
    let fate = |block: &[u8]| match (
        block.iter().all(|b| *b == b'n'),
        block.iter().all(|b| *b == b'o'),
    ) {
        (true, _) => 'n',
        (_, true) => 'o',
        _ => '?',
    };
    Some(after.chunks(4096).map(fate).collect())
}

#[test]
fn reorder_can_keep_a_later_write_without_an_earlier_one_the_same_way_for_a_seed() {
    let Some(first) = blocks_after_cut(Model::Reorder, 42) else {
        return;
    };
    assert_eq!(blocks_after_cut(Model::Reorder, 42).unwrap(), first);
    let shown: String = first.iter().collect();
    let later_without_earlier = shown.find('o').is_some_and(|o| shown[o..].contains('n'));
    assert!(later_without_earlier, "{shown}");
    assert!(!shown.contains('?'), "reorder writes whole blocks: {shown}");
    assert_ne!(blocks_after_cut(Model::Reorder, 43).unwrap(), first);
    let dropped: String = blocks_after_cut(Model::Drop, 42).unwrap().iter().collect();
    assert_eq!(dropped, "o".repeat(16));
}

#[test]
fn garble_can_leave_a_block_neither_old_nor_new() {
    let found = (0..8).find_map(|seed| {
        let blocks = blocks_after_cut(Model::Garble, seed)?;
        blocks.contains(&'?').then_some(seed)
    });
    if nix::unistd::geteuid().is_root() {
        assert!(found.is_some(), "no seed of 0..8 tore or garbled a block");
    }
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

#[test]
fn a_sync_held_at_the_gate_when_the_power_goes_syncs_nothing() {
    let work = tempfile::tempdir().unwrap();
    let Some(mount) = mounted(work.path()) else {
        return;
    };
    let mnt = mount.path().to_path_buf();
    let file = std::fs::File::create(mnt.join("f")).unwrap();
    file.write_all_at(b"old", 0).unwrap();
    file.sync_all().unwrap();
    file.write_all_at(b"new", 0).unwrap();
    mount.hold_syncs();
    let syncing = std::thread::spawn(move || file.sync_all());
    while mount.syncs_held() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    mount.freeze();
    assert!(syncing.join().unwrap().is_err(), "the held sync fails");
    let refused = std::fs::OpenOptions::new().write(true).open(mnt.join("f"));
    assert!(
        refused.unwrap().write_all_at(b"after", 0).is_err(),
        "frozen"
    );
    let report = mount.cut_power(None);
    assert_eq!((report.syncs_held, report.bytes), (1, 3), "{report}");
    assert_eq!(std::fs::read(work.path().join("disk/f")).unwrap(), b"old");
    std::fs::write(mnt.join("g"), b"after the cut").unwrap();
}
