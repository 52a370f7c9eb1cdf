//! The P family's case files on InnoDB (`system: mariadb_on_forgetful_disk`): a MariaDB
//! of the case's own whose data directory (its tablespaces, doublewrite buffer and redo
//! log, `<case>-work/mnt/data`) is on a forgetful disk of the case's own, with the
//! frozen balances of seed 003 (`frozen_balances_innodb`) installed, as the spec
//! runner's engine ([`case_kit::spec::SpecEngine`]), and the power cut as a call.
//!
//! The server runs with `innodb_flush_method=fsync` (MariaDB KB, "InnoDB System
//! Variables", `innodb_flush_method`: on Unix `fsync`, `O_DSYNC`, `O_DIRECT` — the
//! default from 10.6 — and `O_DIRECT_NO_FSYNC`; with `fsync`, "fsync() is used to flush
//! data and logs"), so its writes go through the operating system's cache, which the
//! cut drops, as PostgreSQL's do. The disk and the server belong to the case: nothing
//! runs until a step calls `server`; they stop (the server, then the disk unmounted)
//! when the expectations' connection, the last one, ends. A session's SQL and events
//! run on the case's database, connected at its first statement and again after a cut
//! or a kill. The calls (`docs/specs.md`, "A power cut as one file"):
//!
//! | call | prints |
//! |---|---|
//! | `server database=D [set=NAME:VALUE …]` | mounts the disk, `mariadb-install-db` and `mariadbd` on it (the durable defaults [`DEFAULTS`], then each `set=`), the frozen balances' tables in `D`, and what the server says it runs with: `mariadb on the forgetful disk: innodb_flush_method=fsync innodb_flush_log_at_trx_commit=1 innodb_doublewrite=1; database placed` |
//! | `write-back` | `written back: the disk holds every write so far` |
//! | `placements count=N account=A side=S qty=Q price=P key=K [hold=POINT]` | N placements at once, each on a connection of its own (`{i}` in `key=` is its index): `acknowledged=N refused=0`; with `hold=`, the first to reach POINT is held there inside its transaction and the others wait for its lock on the balance row, seen in `INNODB_TRX`, and the call returns leaving all N in flight: `in_flight=4 held_at=balances-updated lock_waits=3` |
//! | `kill-server` | SIGKILL of `mariadbd` alone (the disk keeps everything written), a start with crash recovery: `killed signal=9; recovery ok` |
//! | `flush-pages [table=T]` | InnoDB writes its dirty pages until none is left and, with `table=`, the disk holds T's file written and unsynced (`dirty_pages=0 last_unsynced_write=49152+16384 unsynced_bytes=16384 lost_syncs_n=…`), or without it purge has emptied the history list (`dirty_pages=0 history_len=0`) |
//! | `lose-syncs table=T` | strace loses every sync of T's file and of the redo log from now to the cut ([`crate::lost_syncs`]): `syncs lost from now: …` |
//! | `power-cut [tear=T] [tear-bytes=N]` | SIGKILL of `mariadbd`, the disk's unsynced data dropped (T's last unsynced write torn, 512 bytes kept by default), a start with crash recovery: `power cut: SIGKILL of mariadbd; dropped files_n=… bytes_n=… writes_n=… name_operations_n=… redo_unsynced_bytes_n=…; recovery ok`, or `recovery FAILED` and where the server's log went; with `tear=`, what recovery made of the page from the server's log: `recovery=ok torn_bytes=512 doublewrite_restored=acct:3` or `recovery=failed torn_bytes=512 corrupted_page=acct:3` |
//! | the events (`deposit`, `place`, `balance`, `reconcile`) | as in family I, on the session's connection |

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use case_kit::spec::{self, Call, EngineSession, Reconciled, SessionFuture, SpecEngine};
use case_kit::{AbortOnDrop, Ctx};
use cases_frozen::fixtures::Gate;
use cases_frozen::spec_events;
use cases_innodb::fixtures::Db;
use cases_innodb::spec_engine::{OnInnoDb, reconciled, run_sql, shown};
use forgetful_fs::Tear;
use frozen_balances::{EventKind, NoHooks};
use launch::power::PowerDisk;
use scratch_mariadb::{Server, ServerOptions};

use crate::lost_syncs::LostSyncs;

/// What a file on this engine says as its `system:`.
pub const SYSTEM: &str = "mariadb_on_forgetful_disk";

/// The server's settings before a file's `set=`: writes through the operating system's
/// cache (`fsync`, not the default `O_DIRECT`), every commit's redo synced
/// (`innodb_flush_log_at_trx_commit=1`, the default), the doublewrite buffer on (the
/// default), and a buffer pool small enough for several cases at once.
pub const DEFAULTS: [(&str, &str); 4] = [
    ("innodb_flush_method", "fsync"),
    ("innodb_flush_log_at_trx_commit", "1"),
    ("innodb_doublewrite", "ON"),
    ("innodb_buffer_pool_size", "16M"),
];

/// The redo log, relative to the mount point.
const REDO_LOG: &str = "data/ib_logfile0";
/// Longest wait of `flush-pages` for InnoDB to have written every dirty page,
/// milliseconds (a hang bound only).
const FLUSH_WAIT_MS: u64 = 30_000;

/// Why the engine's cases cannot run here: the power cut's (root, `/dev/fuse`) or
/// MariaDB's binaries, neither cached nor fetchable (`scratch_mariadb::binaries`).
pub fn unavailable() -> Option<String> {
    if let Some(reason) = launch::power::unavailable() {
        return Some(reason);
    }
    let cache = scratch_pg::binaries::default_cache_dir();
    let resolved = scratch_mariadb::binaries::resolve(&cache);
    resolved
        .err()
        .map(|error| format!("MariaDB unavailable: {error}"))
}

/// Why the cases that lose syncs (`lose-syncs`) cannot run here: [`unavailable`], or
/// no `strace` ([`crate::lost_syncs::unavailable`]).
pub fn unavailable_with_strace() -> Option<String> {
    unavailable().or_else(crate::lost_syncs::unavailable)
}

/// The family's files on this engine (their `system:` says [`SYSTEM`]), which need
/// MariaDB besides the disk ([`unavailable`]), by id, each with whether it loses syncs
/// (a `lose-syncs` call: it needs strace too).
pub fn case_ids() -> HashMap<String, bool> {
    let dir = Path::new(crate::spec_engine::SPEC_DIR);
    let files = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let mut ids = HashMap::new();
    for file in files {
        let text = std::fs::read_to_string(file.path()).unwrap_or_default();
        if !text
            .lines()
            .any(|line| line.trim() == format!("system: {SYSTEM}"))
        {
            continue;
        }
        if let Some(id) = spec::spec_id("P", &file.file_name().to_string_lossy()) {
            ids.insert(id, text.contains("lose-syncs"));
        }
    }
    ids
}

/// A MariaDB on a forgetful disk per case.
#[derive(Default)]
pub struct PowerMariaEngine {
    /// Each running case's disk, from its start to its expectations.
    disks: case_kit::PerCase<Arc<MariaDisk>>,
}

/// One case's disk and server. Dropping it stops the server, then unmounts.
pub struct MariaDisk {
    state: tokio::sync::Mutex<MariaState>,
}

/// One case's server and what runs on it (fields drop in order: the placements in
/// flight, the server, the disk).
struct MariaState {
    /// `<case>-work`: `disk/`, `mnt/`, `trash/`, `mariadb/`.
    work: PathBuf,
    /// Where the server's log goes when a recovery fails (`<case>-recovery.log`).
    recovery_log: Option<PathBuf>,
    /// The database `server` made.
    database: String,
    /// Bumped at every kill and cut: a connection opened before it is gone.
    generation: u64,
    /// The placements `placements … hold=` left in flight, until the cut.
    in_flight: Vec<AbortOnDrop<Result<String, String>>>,
    /// Their gate, released never (the cut ends them).
    gate: Option<Arc<Gate>>,
    /// strace losing a table's and the redo log's syncs, from `lose-syncs` to the cut.
    lost_syncs: Option<LostSyncs>,
    /// The server, from `server` on.
    server: Option<Server>,
    /// The mounted disk, from `server` on.
    disk: Option<PowerDisk>,
}

impl MariaState {
    fn server(&self) -> Result<&Server, String> {
        (self.server.as_ref()).ok_or_else(|| "no server: a `server` step starts one".into())
    }

    /// A new product connection (`CLIENT_FOUND_ROWS`) to the case's database.
    async fn connect(&self) -> Result<Conn, String> {
        let opts = self.server()?.opts(Some(&self.database));
        let conn = frozen_balances_innodb::conn::connect(opts).await;
        conn.map_err(|e| format!("cannot connect: {}", shown(e)))
    }
}

impl SpecEngine for PowerMariaEngine {
    case_kit::spec_declares!(SYSTEM, crate::verbs::MARIADB);

    /// The declarations, then what they cannot say: an event is neither held nor
    /// aborted here, so nothing is released (`placements … hold=` holds, the cut ends
    /// them), and a hold names a hook point.
    fn check(&self, call: &Call) -> Result<(), String> {
        spec::verbs::check(&self.verbs(), &call.op, &call.args)?;
        let event = spec_events::event_kind(&call.op).is_some();
        if event && (call.arg("hold").is_some() || call.arg("fail").is_some()) {
            return Err("an event on this engine takes no hold= or fail=".into());
        }
        if call.op == "release" {
            return Err("release: no event is held on this engine".into());
        }
        match call.arg("hold") {
            Some(point) => (point.parse::<frozen_balances::HookPoint>())
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    fn describe(&self, ctx: &mut Ctx) {
        // A disk left by an earlier run of the case goes now, before its folder is
        // made empty.
        self.disks.remove(ctx);
        let Ok(work) = ctx.work_dir() else {
            return;
        };
        let state = MariaState {
            work,
            recovery_log: ctx.log_file("recovery").ok(),
            database: String::new(),
            generation: 0,
            in_flight: Vec::new(),
            gate: None,
            lost_syncs: None,
            server: None,
            disk: None,
        };
        let state = tokio::sync::Mutex::new(state);
        self.disks.insert(ctx, Arc::new(MariaDisk { state }));
    }

    fn connect<'a>(&'a self, ctx: &'a Ctx, opening: spec::Opening) -> SessionFuture<'a> {
        let disk = self.disks.get(ctx);
        crate::session_on_disk(disk, Some(opening.permutation), |disk| {
            Box::new(MariaSession { disk, conn: None })
        })
    }

    fn expectations<'a>(&'a self, ctx: &'a Ctx) -> SessionFuture<'a> {
        // The last connection: it holds the disk alone, which goes when it ends.
        crate::session_on_disk(self.disks.remove(ctx), None, |disk| {
            Box::new(MariaSession { disk, conn: None })
        })
    }
}

/// A session: a product connection to the case's database, opened at its first
/// statement, with the generation (kill or cut) it was opened in.
struct MariaSession {
    disk: Arc<MariaDisk>,
    conn: Option<(u64, Conn)>,
}

impl MariaSession {
    /// The session's connection, (re)opened when it has none from the current
    /// generation.
    async fn conn(&mut self) -> Result<&mut Conn, String> {
        let state = self.disk.state.lock().await;
        let fresh = matches!(&self.conn, Some((g, _)) if *g == state.generation);
        if !fresh {
            self.conn = Some((state.generation, state.connect().await?));
        }
        drop(state);
        Ok(&mut self.conn.as_mut().expect("opened above").1)
    }

    /// `server database=D [set=NAME:VALUE …]`.
    async fn server(&mut self, call: &Call) -> Result<String, String> {
        let mut state = self.disk.state.lock().await;
        if state.server.is_some() {
            return Err("the case's server is running already".into());
        }
        let mut settings: Vec<(String, String)> = (DEFAULTS.iter())
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        for (name, value) in call.args.iter().filter(|(name, _)| name == "set") {
            let (setting, to) = (value.split_once(':'))
                .ok_or_else(|| format!("{name}={value}: a setting is written set=NAME:VALUE"))?;
            settings.push((setting.to_string(), to.to_string()));
        }
        let disk = PowerDisk::mount(&state.work).map_err(|e| format!("{e:#}"))?;
        let mut options = ServerOptions::new(state.work.join("mariadb"));
        options.data_dir = Some(disk.path().join("data"));
        options.settings = settings;
        state.disk = Some(disk);
        let started = tokio::task::spawn_blocking(move || Server::start(options)).await;
        let server = started.map_err(|e| e.to_string())?;
        state.server = Some(server.map_err(|e| e.to_string())?);
        let database = call.arg("database").unwrap_or_default().to_string();
        let made = state.server()?.create_database(&database).await;
        made.map_err(|e| format!("creating {database}: {e}"))?;
        state.database = database.clone();
        let mut conn = state.connect().await?;
        let installed = frozen_balances_innodb::schema::install(&mut conn).await;
        installed.map_err(shown)?;
        let shown_settings = run_sql(
            &mut conn,
            "SELECT @@innodb_flush_method AS innodb_flush_method, \
             @@innodb_flush_log_at_trx_commit AS innodb_flush_log_at_trx_commit, \
             @@innodb_doublewrite AS innodb_doublewrite",
        )
        .await;
        Ok(format!(
            "mariadb on the forgetful disk: {}; database {database}",
            shown_settings.join(" ")
        ))
    }

    /// `write-back`: every unsynced write written back.
    async fn write_back(&mut self) -> Result<String, String> {
        let state = self.disk.state.lock().await;
        let disk = state
            .disk
            .as_ref()
            .ok_or("no disk: a `server` step mounts one")?;
        disk.sync_all().map_err(|e| format!("{e:#}"))?;
        Ok("written back: the disk holds every write so far".into())
    }

    /// `kill-server`: SIGKILL of `mariadbd` alone, a start with crash recovery.
    async fn kill_server(&mut self) -> Result<String, String> {
        self.conn = None;
        let mut state = self.disk.state.lock().await;
        state.in_flight.clear();
        let server = state.server.as_mut().ok_or("no server running")?;
        let killed = tokio::task::block_in_place(|| server.kill());
        if !killed {
            return Err("the server was not running".into());
        }
        let recovery = tokio::task::block_in_place(|| server.restart());
        state.generation += 1;
        let recovery = recovery.map_err(|e| e.to_string());
        Ok(format!(
            "killed signal=9; recovery {}",
            recovery_words(&recovery, state.recovery_log.as_deref())
        ))
    }

    /// `power-cut [tear=T] [tear-bytes=N]`: SIGKILL of `mariadbd`, the unsynced data
    /// dropped (T's last unsynced write torn), a start with crash recovery.
    async fn power_cut(&mut self, call: &Call) -> Result<String, String> {
        self.conn = None;
        let mut state = self.disk.state.lock().await;
        let state = &mut *state;
        let tear = match call.arg("tear") {
            Some(table) => Some(tear(&state.database, table, call)?),
            None => None,
        };
        let server = state.server.as_mut().ok_or("no server running")?;
        let disk = state.disk.as_ref().ok_or("no disk mounted")?;
        tokio::task::block_in_place(|| server.kill());
        state.in_flight.clear();
        state.gate = None;
        state.lost_syncs = None;
        let redo = disk.unsynced_file(Path::new(REDO_LOG));
        let dropped = disk.cut(tear.as_ref());
        let log_before = std::fs::metadata(server.log_path()).map_or(0, |m| m.len());
        let recovery = tokio::task::block_in_place(|| server.restart());
        state.generation += 1;
        let recovery = recovery.map_err(|e| e.to_string());
        let mut lines = vec![format!(
            "power cut: SIGKILL of mariadbd; dropped files_n={} bytes_n={} writes_n={} name_operations_n={} redo_unsynced_bytes_n={}{}; recovery {}",
            dropped.files,
            dropped.bytes,
            dropped.write_operations,
            dropped.name_operations,
            redo.map_or(0, |redo| redo.bytes),
            match dropped.torn_bytes_kept {
                0 => String::new(),
                kept => format!("; torn write kept {kept} bytes"),
            },
            recovery_words(&recovery, state.recovery_log.as_deref())
        )];
        if let Some(table) = call.arg("tear") {
            let log = std::fs::read(server.log_path()).unwrap_or_default();
            let since = log.get(log_before as usize..).unwrap_or_default();
            let since = String::from_utf8_lossy(since);
            let torn = dropped.torn_bytes_kept;
            lines.push(torn_page(&recovery, torn, table, &since));
        }
        Ok(lines.join("\n"))
    }

    /// `lose-syncs table=T`: strace attached to `mariadbd`, losing every sync of T's
    /// file and of the redo log from now to the cut.
    async fn lose_syncs(&mut self, call: &Call) -> Result<String, String> {
        let table = call.arg("table").unwrap_or_default();
        let mut state = self.disk.state.lock().await;
        let server = state.server()?;
        let pid = server.pid().ok_or("the server is not running")?;
        let data = server.data_dir();
        let files = [
            data.join(&state.database).join(format!("{table}.ibd")),
            data.join("ib_logfile0"),
        ];
        let log = state.work.join("strace.log");
        let attached = tokio::task::block_in_place(|| LostSyncs::attach(pid, &files, &log));
        state.lost_syncs = Some(attached.map_err(|e| format!("{e:#}"))?);
        Ok(format!(
            "syncs lost from now: fsync and fdatasync of {}/{table}.ibd and ib_logfile0 succeed without reaching the disk (strace attached to every thread of mariadbd)",
            state.database
        ))
    }

    /// `flush-pages [table=T]`: InnoDB writes every dirty page
    /// (`innodb_max_dirty_pages_pct=0`, then back to its default) until
    /// `Innodb_buffer_pool_pages_dirty` is 0 and, with `table=`, the disk holds T's file
    /// written and unsynced, or without it purge has emptied the history list
    /// (`trx_rseg_history_len` is 0: nothing is left to change pages later).
    async fn flush_pages(&mut self, call: &Call) -> Result<String, String> {
        let state = self.disk.state.lock().await;
        let disk = state.disk.as_ref().ok_or("no disk mounted")?;
        let mut conn = state.connect().await?;
        let file = (call.arg("table"))
            .map(|table| PathBuf::from(format!("data/{}/{table}.ibd", state.database)));
        let sql = |e: mysql_async::Error| e.to_string();
        let set = "SET GLOBAL innodb_max_dirty_pages_pct = 0";
        conn.query_drop(set).await.map_err(sql)?;
        let bound = std::time::Duration::from_millis(FLUSH_WAIT_MS);
        let deadline = std::time::Instant::now() + bound;
        let (dirty, history) = loop {
            let (dirty, history) = dirty_and_history(&mut conn).await.map_err(sql)?;
            let done = match &file {
                Some(file) => dirty == 0 && disk.unsynced_file(file).is_some(),
                None => dirty == 0 && history == 0,
            };
            if done || std::time::Instant::now() > deadline {
                break (dirty, history);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let reset = "SET GLOBAL innodb_max_dirty_pages_pct = DEFAULT";
        conn.query_drop(reset).await.map_err(sql)?;
        let mut words = vec![format!("dirty_pages={dirty}")];
        match &file {
            None => words.push(format!("history_len={history}")),
            Some(file) => {
                let held = disk.unsynced_file(file);
                let last = held.and_then(|held| held.last_write);
                words.push(format!(
                    "last_unsynced_write={} unsynced_bytes={}",
                    last.map_or("none".to_string(), |(at, bytes)| format!("{at}+{bytes}")),
                    held.map_or(0, |held| held.bytes)
                ));
            }
        }
        if let Some(lost) = &state.lost_syncs {
            words.push(format!("lost_syncs_n={}", lost.lost()));
        }
        Ok(words.join(" "))
    }

    /// `placements count=N … key=K [hold=POINT]`.
    async fn placements(&mut self, call: &Call) -> Result<String, String> {
        let count = (call.arg("count").unwrap_or_default().parse::<usize>())
            .map_err(|_| "count= takes an integer")?;
        let hold = call.arg("hold");
        let mut state = self.disk.state.lock().await;
        if hold.is_some() && !state.in_flight.is_empty() {
            return Err("placements are in flight already".into());
        }
        let gate = match hold {
            Some(point) => {
                let point = point.parse().map_err(|e| format!("{e}"))?;
                Some(Arc::new(Gate::new(EventKind::Place, point)))
            }
            None => None,
        };
        let mut tasks = Vec::new();
        for index in 0..count {
            let mut conn = state.connect().await?;
            let one = one_placement(call, index);
            let gate = gate.clone();
            tasks.push(AbortOnDrop::spawn(async move {
                let mut engine = OnInnoDb::new(&mut conn);
                match &gate {
                    Some(gate) => spec_events::event(&mut engine, &one, gate.as_ref()).await,
                    None => spec_events::event(&mut engine, &one, &NoHooks).await,
                }
            }));
        }
        match (gate, hold) {
            (Some(gate), Some(point)) => {
                let waiting = hold_in_flight(&state, &gate, count).await?;
                state.in_flight = tasks;
                state.gate = Some(gate);
                Ok(format!(
                    "in_flight={count} held_at={point} lock_waits={waiting}"
                ))
            }
            _ => answered(tasks).await,
        }
    }
}

/// The buffer pool's dirty pages and the history list's length (undo logs purge has
/// yet to remove).
async fn dirty_and_history(conn: &mut Conn) -> Result<(u64, u64), mysql_async::Error> {
    let dirty: Option<(String, u64)> =
        (conn.query_first("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")).await?;
    let history: Option<u64> = (conn.query_first(
        "SELECT COUNT FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'",
    ))
    .await?;
    Ok((
        dirty.map_or(u64::MAX, |(_, n)| n),
        history.unwrap_or(u64::MAX),
    ))
}

/// The `place` call of placement `index` of `call`: its arguments but `count=` and
/// `hold=`, `{i}` in `key=` replaced by the index.
fn one_placement(call: &Call, index: usize) -> Call {
    let args = (call.args.iter())
        .filter(|(name, _)| name != "count" && name != "hold")
        .map(|(name, value)| match name.as_str() {
            "key" => (name.clone(), spec::with_index(value, index)),
            _ => (name.clone(), value.clone()),
        });
    Call {
        op: "place".into(),
        args: args.collect(),
        line: call.line,
    }
}

/// Waits until the first placement is held at the gate and the other `count - 1` wait
/// for its lock (`INNODB_TRX`, paced reads, [`cases_innodb::fixtures::LOCK_WAIT_MAX_MS`]
/// at most); returns the lock waits seen.
///
/// Errors: no placement reached the gate, or fewer waited.
async fn hold_in_flight(state: &MariaState, gate: &Gate, count: usize) -> Result<i64, String> {
    let bound = std::time::Duration::from_millis(cases_innodb::fixtures::LOCK_WAIT_MAX_MS);
    let reached = tokio::time::timeout(bound, gate.reached()).await;
    reached.map_err(|_| "no placement reached the hook point")?;
    let db = Db {
        name: state.database.clone(),
    };
    let mut observer = state.connect().await?;
    let others = i64::try_from(count.saturating_sub(1)).unwrap_or(i64::MAX);
    let waited = db.wait_for_lock_waiters(&mut observer, others).await;
    waited.map_err(|e| format!("{e:#}"))?;
    let seen = db.lock_waiters(&mut observer).await;
    seen.map_err(|e| format!("{e:#}"))
}

/// What the placements answered: `acknowledged=N refused=N`, or the first error.
async fn answered(tasks: Vec<AbortOnDrop<Result<String, String>>>) -> Result<String, String> {
    let (mut acknowledged, mut refused) = (0, 0);
    for task in tasks {
        let answer = task.await.map_err(|e| e.to_string())??;
        match answer.contains("outcome=OK") {
            true => acknowledged += 1,
            false => refused += 1,
        }
    }
    Ok(format!("acknowledged={acknowledged} refused={refused}"))
}

/// The tear of table `table`'s file at the cut (its last unsynced write kept up to
/// `tear-bytes=`, 512 by default).
fn tear(database: &str, table: &str, call: &Call) -> Result<Tear, String> {
    let bytes = call.arg("tear-bytes").map(str::parse).transpose();
    let bytes = bytes.map_err(|_| "tear-bytes= takes an integer")?;
    Ok(Tear {
        file: PathBuf::from(format!("data/{database}/{table}.ibd")),
        boundary_bytes: bytes.unwrap_or(crate::spec_cluster::TEAR_BYTES),
    })
}

/// What recovery made of a torn page of `table`, from the server's log since the
/// restart: `recovery=ok torn_bytes=512 doublewrite_restored=acct:3` (InnoDB's
/// "Recovered page [page id: space=N, page number=3] to './d/acct.ibd' from the
/// doublewrite buffer") or `recovery=failed torn_bytes=512 corrupted_page=acct:3`
/// ("Unable to apply log to corrupted page 3 in file ./d/acct.ibd").
fn torn_page(recovery: &Result<(), String>, torn: u64, table: &str, log: &str) -> String {
    let file = format!("/{table}.ibd");
    let mut words = vec![format!(
        "recovery={} torn_bytes={torn}",
        if recovery.is_ok() { "ok" } else { "failed" }
    )];
    for line in log.lines().filter(|line| line.contains(&file)) {
        if let Some(rest) = line.split("page number=").nth(1)
            && line.contains("from the doublewrite buffer")
            && line.contains("Recovered page")
        {
            let page = rest.split(']').next().unwrap_or_default();
            words.push(format!("doublewrite_restored={table}:{page}"));
        }
        if let Some(rest) = line.split("Unable to apply log to corrupted page ").nth(1) {
            let page = rest.split(' ').next().unwrap_or_default();
            words.push(format!("corrupted_page={table}:{page}"));
        }
    }
    words.join(" ")
}

/// `ok`, or `FAILED` and where the server's log went (written to `log`).
fn recovery_words(recovery: &Result<(), String>, log: Option<&Path>) -> String {
    let Err(error) = recovery else {
        return "ok".into();
    };
    let written = log.is_some_and(|log| std::fs::write(log, error).is_ok());
    match (written, log.and_then(Path::file_name)) {
        (true, Some(name)) => format!("FAILED (the server's log: {})", name.to_string_lossy()),
        _ => format!("FAILED: {error}"),
    }
}

impl EngineSession for MariaSession {
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>> {
        async move {
            match self.conn().await {
                Ok(conn) => run_sql(conn, sql).await,
                Err(error) => vec![format!("ERROR (cannot run): {error}")],
            }
        }
        .boxed()
    }

    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>> {
        async move {
            match call.op.as_str() {
                "server" => self.server(call).await,
                "write-back" => self.write_back().await,
                "placements" => self.placements(call).await,
                "kill-server" => self.kill_server().await,
                "power-cut" => self.power_cut(call).await,
                "lose-syncs" => self.lose_syncs(call).await,
                "flush-pages" => self.flush_pages(call).await,
                "reconcile" => Ok(self.reconcile().await?.1),
                _ => {
                    let conn = self.conn().await?;
                    spec_events::run(&mut OnInnoDb::new(conn), call, ";").await
                }
            }
        }
        .boxed()
    }

    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        async move { reconciled(self.conn().await?).await }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_page_is_read_from_the_servers_log() {
        // Lines as MariaDB 10.11.14 wrote them in P12's and P11's runs.
        let restored = "2026-12-05 11:10:59 0 [Note] InnoDB: Recovered page [page id: \
                        space=5, page number=3] to './torn/acct.ibd' from the doublewrite buffer.";
        let said = torn_page(&Ok(()), 512, "acct", restored);
        assert_eq!(
            said,
            "recovery=ok torn_bytes=512 doublewrite_restored=acct:3"
        );
        let corrupted = "2026-12-05 11:11:10 0 [ERROR] InnoDB: Unable to apply log to \
                         corrupted page 3 in file ./torn/acct.ibd";
        let failed = Err("did not start".to_string());
        let said = torn_page(&failed, 512, "acct", corrupted);
        assert_eq!(said, "recovery=failed torn_bytes=512 corrupted_page=acct:3");
        // Another table's page is not this one's.
        let said = torn_page(&failed, 512, "ballast", corrupted);
        assert_eq!(said, "recovery=failed torn_bytes=512");
    }

    #[test]
    fn each_placement_gets_its_key_and_no_count_or_hold() {
        let call = Call {
            op: "placements".into(),
            args: [
                ("count", "4"),
                ("account", "alice"),
                ("key", "p-{i}"),
                ("hold", "registered"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            line: 0,
        };
        let one = one_placement(&call, 2);
        assert_eq!(one.op, "place");
        assert_eq!(one.arg("key"), Some("p-2"));
        assert_eq!(one.arg("count"), None);
        assert_eq!(one.arg("hold"), None);
    }
}
