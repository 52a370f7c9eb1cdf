//! The P family's case files on SQLite (`cases/power/specs/pNN_<what>.spec`, the case
//! `PNN`, `system: inventory_store`; a cluster's are [`crate::spec_cluster`]'s): the
//! inventory file of a case on a forgetful disk of its own, as the spec runner's engine
//! ([`case_kit::spec::SpecEngine`]), and the power cut as a call.
//!
//! The case's file is `inventory.db` on the disk: `<case>-work/disk/inventory.db` is
//! what the disk holds (its backing folder), `<case>-work/mnt/inventory.db` the same file
//! through the mount, where only a crash-worker writes. This process reads and writes
//! the backing folder alone, and only while nothing is mounted (`PowerDisk::backing`:
//! the daemon is a thread of this process). The calls (`docs/specs.md`, "A power cut as
//! one file"):
//!
//! | call | prints |
//! |---|---|
//! | `add-item item=N units=N` | `units=N`: the item and its opening figure, through the store (`Store::open`: WAL, `synchronous=FULL`, the checked schema), the connection closed at once, so the file is written back before the disk is mounted |
//! | `worker changes=N event=E item=N delta=N [journal-mode=M] [synchronous=S]` | mounts the disk, then a crash-worker in SQLite mode on the file through the mount applies N changes (`{i:02}` in `event=` is the change's index) with those pragmas and holds its connection open (`--hold-at-end`: no close, no checkpoint): `acknowledged=10 journal_mode=wal synchronous=full holding=yes` |
//! | `power-cut` | SIGKILL of the worker, the disk drops what was never synced and is unmounted: `power cut: SIGKILL of the worker holding its connection; dropped files_n=… bytes_n=… writes_n=… name_operations_n=…` |
//! | `reconcile` | the store's reconciliation of the file: `findings=0` |
//!
//! SQL steps and the expectations run on a plain connection to the backing file (no
//! pragma that writes), opened when first used, refused while the disk is mounted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use case_kit::spec::{self, Call, EngineSession, Reconciled, SessionFuture, SpecEngine};
use case_kit::{Ctx, PerCase};
use launch::power::PowerDisk;
use launch::worker::CrashWorker;

/// What every file's `system:` says: the inventory store's schema.
pub const SYSTEM: &str = "inventory_store";
/// The case's file on its disk.
const FILE: &str = "inventory.db";
/// Longest wait for one line of the worker, milliseconds (a hang bound only).
const WORKER_LINE_MS: u64 = 30_000;

// The family's case files, each on the engine its `system:` names: this one
// ([`SYSTEM`]), a cluster on the disk ([`crate::spec_cluster::SYSTEM`]) or a MariaDB
// on it ([`crate::spec_mariadb::SYSTEM`]).
case_kit::spec_files!(
    "P",
    "cases/power/specs",
    [
        Arc::new(PowerSqliteEngine::default()),
        Arc::new(crate::spec_cluster::PowerPgEngine::default()),
        Arc::new(crate::spec_mariadb::PowerMariaEngine::default()),
    ]
);

/// An inventory file on a forgetful disk per case.
#[derive(Default)]
pub struct PowerSqliteEngine {
    /// Each running case's work folder (`Ctx::work_dir`, made empty when it starts).
    work: PerCase<PathBuf>,
}

impl SpecEngine for PowerSqliteEngine {
    case_kit::spec_declares!(SYSTEM, crate::verbs::SQLITE);

    fn check(&self, call: &Call) -> Result<(), String> {
        if call.op == "power-cut" && call.args.iter().any(|(name, _)| name.starts_with("tear")) {
            return Err("a tear needs a cluster's relation: the SQLite disk tears nothing".into());
        }
        spec::verbs::check(&self.verbs(), &call.op, &call.args)
    }

    fn describe(&self, ctx: &mut Ctx) {
        let version = inventory_store::sqlite_version();
        ctx.record("sqlite_version", serde_json::Value::from(version));
        if let Ok(work) = ctx.work_dir() {
            self.work.insert(ctx, work);
        }
    }

    fn connect<'a>(&'a self, ctx: &'a Ctx, opening: spec::Opening) -> SessionFuture<'a> {
        let permutation = opening.permutation;
        let work = self.work.get(ctx);
        async move {
            let work = work.ok_or_else(|| anyhow::anyhow!("the case has no work folder"))?;
            anyhow::ensure!(
                permutation == 1,
                "one permutation only: the disk is the case's"
            );
            let session = DiskSession {
                work,
                plain: None,
                worker: None,
                disk: None,
            };
            Ok(Box::new(session) as Box<dyn EngineSession>)
        }
        .boxed()
    }
}

/// A session on the case's file, and the worker and disk it started. Fields drop in
/// order: the connection, the worker (killed and reaped), then the disk (unmounted).
struct DiskSession {
    /// `<case>-work`: `disk/` (backing), `mnt/` (mount point), `trash/`.
    work: PathBuf,
    /// A plain connection to the backing file, opened at the first SQL.
    plain: Option<inventory_store::rusqlite::Connection>,
    /// The worker holding its connection, until the cut.
    worker: Option<CrashWorker>,
    /// The mounted disk, from the first worker to the cut.
    disk: Option<PowerDisk>,
}

impl DiskSession {
    fn backing_file(&self) -> PathBuf {
        self.work.join("disk").join(FILE)
    }

    /// The plain connection, refused while the disk is mounted.
    fn plain(&mut self) -> Result<&inventory_store::rusqlite::Connection, String> {
        if self.disk.is_some() {
            return Err(
                "the disk is mounted: SQL runs before the first worker or after the cut".into(),
            );
        }
        if self.plain.is_none() {
            let connection = inventory_store::rusqlite::Connection::open(self.backing_file());
            self.plain = Some(connection.map_err(|e| e.to_string())?);
        }
        Ok(self.plain.as_ref().expect("opened above"))
    }

    /// `add-item item=N units=N` through the store, closed at once.
    fn add_item(&mut self, call: &Call) -> Result<String, String> {
        if self.disk.is_some() {
            return Err("the disk is mounted: add items before the first worker".into());
        }
        let (item, units) = (number(call, "item")?, number(call, "units")?);
        std::fs::create_dir_all(self.work.join("disk")).map_err(|e| e.to_string())?;
        self.plain = None;
        let store =
            inventory_store::Store::open(&self.backing_file()).map_err(|e| e.to_string())?;
        store.add_item(item, units).map_err(|e| e.to_string())?;
        Ok(format!("units={units}"))
    }

    /// `worker changes=N event=E item=N delta=N …`: mounts the disk, runs the worker
    /// until it holds its connection, counts the acknowledged changes.
    async fn worker(&mut self, call: &Call) -> Result<String, String> {
        self.plain = None;
        if self.disk.is_none() {
            self.disk = Some(PowerDisk::mount(&self.work).map_err(|e| format!("{e:#}"))?);
        }
        let through = self.disk.as_ref().expect("mounted above").path().join(FILE);
        let mut args = vec!["sqlite".to_string(), "apply".into(), "--file".into()];
        args.push(through.display().to_string());
        let (item, delta) = (number(call, "item")?, number(call, "delta")?);
        for index in 0..number(call, "changes")?.max(0) as usize {
            let event = spec::with_index(call.arg("event").unwrap_or_default(), index);
            let change = serde_json::json!({"event_id": event, "item": item, "delta": delta});
            args.extend(["--change".to_string(), change.to_string()]);
        }
        args.push("--hold-at-end".into());
        let (mode, level) = (call.arg("journal-mode"), call.arg("synchronous"));
        if let Some(mode) = mode {
            args.extend(["--journal-mode".into(), mode.to_string()]);
        }
        if let Some(level) = level {
            args.extend(["--synchronous".into(), level.to_string()]);
        }
        let mut worker = CrashWorker::launch(&args).map_err(|e| format!("{e:#}"))?;
        let mut acknowledged = 0;
        loop {
            let wait = Duration::from_millis(WORKER_LINE_MS);
            let line = worker.next_line(wait).await.map_err(|e| format!("{e:#}"))?;
            let line = line.ok_or_else(|| format!("the worker ended: {}", worker.stderr()))?;
            if line.starts_with("HOLDING") {
                break;
            }
            acknowledged += usize::from(line.contains("outcome=applied"));
        }
        self.worker = Some(worker);
        Ok(format!(
            "acknowledged={acknowledged} journal_mode={} synchronous={} holding=yes",
            mode.unwrap_or("wal"),
            level.unwrap_or("full")
        ))
    }

    /// `power-cut`: SIGKILL of the worker, the unsynced data dropped, the disk unmounted.
    async fn power_cut(&mut self) -> Result<String, String> {
        let disk = self
            .disk
            .take()
            .ok_or("no disk mounted: start a worker first")?;
        let killed = match self.worker.take() {
            Some(mut worker) => {
                worker.kill().await.map_err(|e| format!("{e:#}"))?;
                "the worker holding its connection"
            }
            None => "no process (none running)",
        };
        let dropped = disk.cut(None);
        drop(disk);
        Ok(format!(
            "power cut: SIGKILL of {killed}; dropped files_n={} bytes_n={} writes_n={} name_operations_n={}",
            dropped.files, dropped.bytes, dropped.write_operations, dropped.name_operations
        ))
    }
}

/// Argument `name` of `call` as a number.
fn number(call: &Call, name: &str) -> Result<i64, String> {
    let text = call.arg(name).unwrap_or_default();
    text.parse()
        .map_err(|_| format!("{name}={text} is not a number"))
}

/// The store's reconciliation of `connection` as `(clean, "findings=N …")`.
fn summary(connection: &inventory_store::rusqlite::Connection) -> Reconciled {
    let findings = inventory_store::reconcile(connection).map_err(|e| e.to_string())?;
    let mut words = vec![format!("findings={}", findings.len())];
    words.extend(findings.iter().map(ToString::to_string));
    Ok((findings.is_empty(), words.join(" ")))
}

impl EngineSession for DiskSession {
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>> {
        let outcome = cases_inventory::spec_engine::sql_step(self.plain(), sql, "cannot run");
        async move { outcome }.boxed()
    }

    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>> {
        async move {
            match call.op.as_str() {
                "add-item" => self.add_item(call),
                "worker" => self.worker(call).await,
                "power-cut" => self.power_cut().await,
                "reconcile" => Ok(summary(self.plain()?)?.1),
                other => Err(format!("no operation {other:?}")),
            }
        }
        .boxed()
    }

    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        let outcome = self.plain().and_then(summary);
        async move { outcome }.boxed()
    }
}
