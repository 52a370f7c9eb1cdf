//! The SQLite inventory on a forgetful disk, for P5–P7: a file set up and written back,
//! a crash-worker child applying acknowledged changes and then holding its connection
//! open (no close, so no checkpoint and no sync at close), the power cut (SIGKILL of the
//! worker, unsynced data dropped), and what the reopened file kept.

use std::path::{Path, PathBuf};
use std::time::Duration;

use case_kit::Ctx;
use launch::power::PowerDisk;
use launch::worker::CrashWorker;

/// The item every change ships from.
pub const ITEM: i64 = 1;
/// Units of [`ITEM`] before the changes.
pub const START_UNITS: i64 = 100;
/// Changes the worker applies (each ships one unit), all acknowledged before the cut.
pub const CHANGES: usize = 10;
/// Longest wait for one line of the worker, milliseconds (a hang bound only).
pub const LINE_LIMIT_MS: u64 = 30_000;

/// How the worker's connection is configured (the store as shipped: WAL, FULL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pragmas {
    /// `PRAGMA journal_mode` after opening, if not the store's `wal`.
    pub journal_mode: Option<&'static str>,
    /// `PRAGMA synchronous` after opening, if not the store's `full`.
    pub synchronous: Option<&'static str>,
}

impl Pragmas {
    /// `journal_mode=… synchronous=…` for the transcript.
    pub fn describe(&self) -> String {
        format!(
            "journal_mode={} synchronous={}",
            self.journal_mode.unwrap_or("wal"),
            self.synchronous.unwrap_or("full")
        )
    }
}

/// What the reopened file holds after the cut.
#[derive(Debug)]
pub struct AfterCut {
    /// Event ids acknowledged (`RESULT … outcome=applied`) before the cut.
    pub acknowledged: Vec<String>,
    /// Acknowledged event ids with no row after the cut.
    pub lost: Vec<String>,
    /// `PRAGMA integrity_check`'s first line, or the error opening or reading.
    pub integrity: String,
    /// Whether units = opening units + the sum of the recorded changes' deltas.
    pub consistent: bool,
    /// The cut's transcript line.
    pub line: String,
}

/// Mounts a disk in the case's folder, creates the inventory file on it with [`ITEM`]
/// at [`START_UNITS`] and writes it back; applies [`CHANGES`] changes in a crash-worker
/// with `pragmas`, SIGKILLs it while it holds its connection, cuts the power and reads
/// the file again.
///
/// Errors: the mount, the file, the worker fail outside the checked steps.
pub async fn changes_then_cut(ctx: &mut Ctx, pragmas: Pragmas) -> anyhow::Result<AfterCut> {
    let disk = PowerDisk::mount(&ctx.work_dir()?)?;
    // Set up and read back on the backing folder (the disk itself), never through the
    // mount from this process (see `PowerDisk::backing`); only the worker writes
    // through the mount.
    let on_disk = disk.backing().join("inventory.db");
    {
        let store = inventory_store::Store::open(&on_disk)?;
        store.add_item(ITEM, START_UNITS)?;
    }
    let path = disk.path().join("inventory.db");
    let acknowledged = run_worker(&path, pragmas).await?;
    let dropped = disk.cut(None);
    ctx.record(
        "power_cut",
        serde_json::json!({
            "dropped_files": dropped.files,
            "dropped_bytes": dropped.bytes,
            "dropped_writes": dropped.write_operations,
            "dropped_name_operations": dropped.name_operations,
        }),
    );
    let line = format!(
        "power cut: SIGKILL of the worker holding its connection; dropped files_n={} bytes_n={} writes_n={} name_operations_n={}",
        dropped.files, dropped.bytes, dropped.write_operations, dropped.name_operations
    );
    drop(disk);
    let after = read_back(&on_disk, acknowledged, line);
    Ok(after)
}

/// Runs the worker until it holds; returns the acknowledged event ids; SIGKILLs it.
async fn run_worker(path: &Path, pragmas: Pragmas) -> anyhow::Result<Vec<String>> {
    let mut args: Vec<String> = vec!["sqlite".into(), "apply".into(), "--file".into()];
    args.push(path.display().to_string());
    for n in 0..CHANGES {
        args.push("--change".into());
        args.push(
            serde_json::json!({"event_id": format!("p-ship-{n:02}"), "item": ITEM, "delta": -1})
                .to_string(),
        );
    }
    args.push("--hold-at-end".into());
    if let Some(mode) = pragmas.journal_mode {
        args.extend(["--journal-mode".into(), mode.into()]);
    }
    if let Some(level) = pragmas.synchronous {
        args.extend(["--synchronous".into(), level.into()]);
    }
    let mut worker = CrashWorker::launch(&args)?;
    let mut acknowledged = Vec::new();
    loop {
        let line = worker
            .next_line(Duration::from_millis(LINE_LIMIT_MS))
            .await?
            .ok_or_else(|| anyhow::anyhow!("the worker ended early: {}", worker.stderr()))?;
        if line.starts_with("HOLDING") {
            break;
        }
        if line.contains("outcome=applied")
            && let Some(id) = line
                .split(' ')
                .find_map(|word| word.strip_prefix("event_id="))
        {
            acknowledged.push(id.to_string());
        }
    }
    worker.kill().await?;
    Ok(acknowledged)
}

/// Opens the file with a plain connection (no pragma that writes) and reads what is
/// left.
fn read_back(path: &PathBuf, acknowledged: Vec<String>, line: String) -> AfterCut {
    let read = || -> rusqlite::Result<(Vec<String>, String, bool)> {
        let connection = rusqlite::Connection::open(path)?;
        let integrity: String =
            connection.query_row("PRAGMA integrity_check", [], |row| row.get(0))?;
        let mut lost = Vec::new();
        for id in &acknowledged {
            let rows: i64 = connection.query_row(
                "SELECT count(*) FROM applied_change WHERE event_id = ?1",
                [id],
                |row| row.get(0),
            )?;
            if rows == 0 {
                lost.push(id.clone());
            }
        }
        let consistent: bool = connection.query_row(
            "SELECT s.units = o.units + coalesce((SELECT sum(delta) FROM applied_change \
             WHERE item_id = s.item_id), 0) FROM stock s JOIN stock_opening o USING (item_id) \
             WHERE s.item_id = ?1",
            [ITEM],
            |row| row.get(0),
        )?;
        Ok((lost, integrity, consistent))
    };
    match read() {
        Ok((lost, integrity, consistent)) => AfterCut {
            acknowledged,
            lost,
            integrity,
            consistent,
            line,
        },
        Err(error) => AfterCut {
            lost: acknowledged.clone(),
            acknowledged,
            integrity: format!("unreadable: {error}"),
            consistent: false,
            line,
        },
    }
}

/// Notes the cut and the counts, records the lost ids.
pub fn note_after(ctx: &mut Ctx, pragmas: Pragmas, after: &AfterCut) {
    ctx.note(format!(
        "worker connection: {}; {} changes acknowledged, then the worker holds its connection open",
        pragmas.describe(),
        after.acknowledged.len()
    ));
    ctx.note(after.line.clone());
    ctx.note(format!(
        "after the cut: acknowledged={} lost={} integrity_check={} units consistent with the recorded changes={}",
        after.acknowledged.len(),
        after.lost.len(),
        after.integrity,
        after.consistent
    ));
    ctx.record("lost_event_ids", serde_json::json!(after.lost));
}
