//! The S family's case files (`cases/inventory/specs/`): an SQLite file as the spec
//! runner's engine ([`case_kit::spec::SpecEngine`]), and the store's operations as calls.
//!
//! A session is a connection to an inventory file, opened when it is first used
//! (`Store::open`: WAL, `synchronous=FULL`, the busy timeout, the checked schema for a new
//! file); it starts on the case's own file (permutation N > 1: `<case>-pN.db`). SQL steps
//! run there as written (`ERROR <SQLite code name>: message` when SQLite refuses). The
//! calls (`docs/specs.md`, "The inventory's operations as calls"):
//!
//! | call | prints |
//! |---|---|
//! | `open [file=NAME] [schema=checked\|without-type-check]` | switches the session to `<case>-NAME.db` (or the case's own file) and opens it: `opened file=NAME schema=checked` |
//! | `add-item item=N units=N` | `units=N` (its opening figure too) |
//! | `change event=E item=N delta=N [policy=recorded]` | the store's outcome: `applied`, `replayed`, `mismatch: recorded item=1 delta=20`, `insufficient: units=120`, `invalid: …`; `policy=recorded`: the ledger's L2 rule instead (`inventory_store::recorded_refusals`) |
//! | `change-json json=OBJECT` | the same through the store's JSON entry point |
//! | `replace-change event=E item=N delta=N` | the naive `INSERT OR REPLACE` registration (S8's control) |
//! | `in-transaction` | `in_transaction=yes` or `no` (SQLite's autocommit flag) |
//! | `close` | closes the session's connection (`closed`); its next step opens it again |
//! | `worker change=E:N:D … [stop=POINT]` | a crash-worker in SQLite mode on the session's file: with `stop=`, paused at that hook point (`paused at before-commit`); without, run to its end (`answers: replayed replayed … exit=0`) |
//! | `kill-worker` | a real SIGKILL to the session's paused worker: `signal=9 shell_status=137` |
//! | `reconcile` | `findings=0`, or `findings=N` and each finding (`item=2 stored=45 recomputed=40`) |
//! | `writers processes=4 connections=8 prefix=ship- item=1 delta=-7` | that many crash-worker processes, each with that many connections open on the session's file, released together by a start file ([`crate::writers`]): `ready=4 applied=14 insufficient=18 other=0 distinct_event_ids=32 exits=0,0,0,0 writer_longest_ms=…` |
//! | `count-busy-handler` | replaces the session's busy timeout by a handler that counts its calls and never waits (`Store::count_busy_handler_calls`): `counting` |
//! | `busy-handler-calls` | how often SQLite called it since: `busy_handler_calls=0` |
//!
//! The expectations run on the case's own file with every other file of the case attached
//! under its name (`SELECT units FROM recorded.stock`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use inventory_store::recorded_refusals;
use inventory_store::rusqlite::fallible_iterator::FallibleIterator;
use inventory_store::rusqlite::types::ValueRef;
use inventory_store::rusqlite::{self, Batch, Connection};
use inventory_store::{ChangePoint, Schema, Store, reconcile};

use case_kit::Ctx;
use case_kit::spec::{
    self, Call, EngineSession, Reconciled, ReconciledOthers, SessionFuture, SpecEngine,
};
use launch::worker::CrashWorker;

use super::outcome_text;

/// What every file's `system:` says: the store's schema, which a new file gets.
pub const SYSTEM: &str = "inventory_store";
/// Longest a worker may take for each line it prints and to exit.
const WORKER_WAIT_MS: u64 = 30_000;

case_kit::spec_files!("S", "cases/inventory/specs", [Arc::new(SqliteEngine)]);

/// An inventory file per case as the spec runner's engine.
pub struct SqliteEngine;

/// `<case's file stem>-<name>.db` beside the case's own file.
pub fn sibling(own: &Path, name: &str) -> PathBuf {
    let stem = own.file_stem().unwrap_or_default().to_string_lossy();
    own.with_file_name(format!("{stem}-{name}.db"))
}

impl SpecEngine for SqliteEngine {
    case_kit::spec_declares!(SYSTEM, crate::verbs::ALL);

    /// The declarations ([`crate::verbs`]), then a worker's hook point.
    fn check(&self, call: &Call) -> Result<(), String> {
        spec::verbs::check(&self.verbs(), &call.op, &call.args)?;
        if let Some(stop) = call.arg("stop") {
            stop.parse::<ChangePoint>()?;
        }
        Ok(())
    }

    fn describe(&self, ctx: &mut Ctx) {
        let version = inventory_store::sqlite_version();
        ctx.record("sqlite_version", serde_json::Value::from(version));
    }

    fn connect<'a>(&'a self, ctx: &'a Ctx, opening: spec::Opening) -> SessionFuture<'a> {
        let permutation = opening.permutation;
        let own = ctx.sqlite_path();
        let path = match permutation {
            1 => own.clone(),
            n => sibling(&own, &format!("p{n}")),
        };
        let session = FileSession {
            own,
            path,
            store: None,
            worker: None,
            busy_calls: None,
        };
        async move { Ok(Box::new(session) as Box<dyn EngineSession>) }.boxed()
    }

    fn expectations<'a>(&'a self, ctx: &'a Ctx) -> SessionFuture<'a> {
        let own = ctx.sqlite_path();
        let attached = attach_siblings(&own);
        async move {
            let session = attached?;
            Ok(Box::new(session) as Box<dyn EngineSession>)
        }
        .boxed()
    }

    fn reconcile_others<'a>(&'a self, ctx: &'a Ctx) -> BoxFuture<'a, ReconciledOthers> {
        let reconciled = ctx
            .clean_sqlite_files()
            .into_iter()
            .map(|file| {
                let name = file.file_name().unwrap_or_default().to_string_lossy();
                let outcome = Store::open_existing(&file)
                    .map_err(|e| e.to_string())
                    .and_then(|store| summary(store.connection()));
                (name.into_owned(), outcome)
            })
            .collect();
        async move { Ok(reconciled) }.boxed()
    }
}

/// The case's own file with every other file of the case (`<stem>-NAME.db`) attached as
/// `NAME`.
///
/// Errors: the file cannot be opened or a sibling attached.
fn attach_siblings(own: &Path) -> anyhow::Result<FileSession> {
    let store = Store::open(own)?;
    let stem = own.file_stem().unwrap_or_default().to_string_lossy();
    let prefix = format!("{stem}-");
    let mut siblings: Vec<(String, PathBuf)> = std::fs::read_dir(own.parent().unwrap_or(own))?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let file = entry.file_name().to_string_lossy().into_owned();
            let name = file.strip_prefix(&prefix)?.strip_suffix(".db")?.to_string();
            Some((name, entry.path()))
        })
        .collect();
    siblings.sort();
    for (name, path) in siblings {
        store.connection().execute(
            &format!("ATTACH DATABASE ?1 AS \"{name}\""),
            [path.display().to_string()],
        )?;
    }
    Ok(FileSession {
        own: own.to_path_buf(),
        path: own.to_path_buf(),
        store: Some(store),
        worker: None,
        busy_calls: None,
    })
}

/// The reconciliation's answer as `(clean, "findings=N …")`.
fn summary(connection: &Connection) -> Result<(bool, String), String> {
    let findings = reconcile(connection).map_err(|e| e.to_string())?;
    let mut words = vec![format!("findings={}", findings.len())];
    words.extend(findings.iter().map(ToString::to_string));
    Ok((findings.is_empty(), words.join(" ")))
}

/// One connection to an inventory file and the worker it launched.
struct FileSession {
    /// The case's own file (siblings are named after it).
    own: PathBuf,
    /// The file this session is on.
    path: PathBuf,
    /// Opened at first use.
    store: Option<Store>,
    /// The last worker launched, killed and reaped when the session ends.
    worker: Option<CrashWorker>,
    /// Calls of the counting busy handler, once `count-busy-handler` installed it.
    busy_calls: Option<Arc<AtomicU32>>,
}

impl FileSession {
    fn store(&mut self) -> Result<&Store, String> {
        if self.store.is_none() {
            let store = Store::open(&self.path).map_err(|e| e.to_string())?;
            self.store = Some(store);
        }
        Ok(self.store.as_ref().expect("opened above"))
    }

    /// `open [file=NAME] [schema=…]`.
    fn open(&mut self, call: &Call) -> Result<String, String> {
        let schema = match call.arg("schema").unwrap_or("checked") {
            "checked" => Schema::Checked,
            "without-type-check" => Schema::WithoutTypeCheck,
            other => return Err(format!("schema {other:?}: checked or without-type-check")),
        };
        let file = call.arg("file");
        self.path = file.map_or_else(|| self.own.clone(), |name| sibling(&self.own, name));
        self.store = Some(Store::open_with(&self.path, schema).map_err(|e| e.to_string())?);
        Ok(format!(
            "opened file={} schema={}",
            file.unwrap_or("own"),
            call.arg("schema").unwrap_or("checked")
        ))
    }

    /// A store operation that needs no process.
    fn store_call(&mut self, call: &Call) -> Result<String, String> {
        let number = |name: &str| -> Result<i64, String> {
            let text = call.arg(name).unwrap_or_default();
            text.parse()
                .map_err(|_| format!("{name}={text} is not a number"))
        };
        let store = self.store()?;
        let event = call.arg("event").unwrap_or_default();
        Ok(match call.op.as_str() {
            "add-item" => {
                let units = number("units")?;
                store
                    .add_item(number("item")?, units)
                    .map_err(|e| e.to_string())?;
                format!("units={units}")
            }
            "change" if call.arg("policy") == Some("recorded") => {
                recorded_refusals::install(store).map_err(|e| e.to_string())?;
                let outcome = recorded_refusals::apply_change(
                    store,
                    event,
                    number("item")?,
                    number("delta")?,
                );
                outcome.map_or_else(|e| e.kind().to_string(), |o| o.as_str().to_string())
            }
            "change" => outcome_text(&store.apply_change(event, number("item")?, number("delta")?)),
            "change-json" => {
                let json = call.arg("json").unwrap_or_default();
                let value: serde_json::Value =
                    serde_json::from_str(json).map_err(|e| format!("json: {e}"))?;
                outcome_text(&store.apply_json(&value))
            }
            "replace-change" => outcome_text(&inventory_store::naive::apply_change_with_replace(
                store,
                event,
                number("item")?,
                number("delta")?,
            )),
            "in-transaction" => {
                let open = !store.connection().is_autocommit();
                format!("in_transaction={}", if open { "yes" } else { "no" })
            }
            "reconcile" => summary(store.connection())?.1,
            other => return Err(format!("no operation {other:?}")),
        })
    }

    /// `worker change=E:N:D … [stop=POINT]`: a crash-worker in SQLite mode on this
    /// session's file.
    async fn worker(&mut self, call: &Call) -> Result<String, String> {
        let mut arguments = vec!["sqlite".to_string(), "apply".into(), "--file".into()];
        arguments.push(self.path.display().to_string());
        for (_, change) in call.args.iter().filter(|(key, _)| key == "change") {
            let parts: Vec<&str> = change.split(':').collect();
            let [event, item, delta] = parts.as_slice() else {
                return Err(format!("change={change}: EVENT:ITEM:DELTA"));
            };
            let (item, delta): (i64, i64) = (
                item.parse().map_err(|_| format!("item {item}"))?,
                delta.parse().map_err(|_| format!("delta {delta}"))?,
            );
            let json = serde_json::json!({"event_id": event, "item": item, "delta": delta});
            arguments.extend(["--change".to_string(), json.to_string()]);
        }
        if let Some(stop) = call.arg("stop") {
            arguments.extend(["--stop-at".to_string(), stop.to_string()]);
        }
        let mut worker = CrashWorker::launch(arguments).map_err(|e| format!("{e:#}"))?;
        let shown = if call.arg("stop").is_some() {
            let paused = worker.wait_paused().await.map_err(|e| format!("{e:#}"))?;
            let point = paused.fields.get("point").cloned().unwrap_or_default();
            format!("paused at {point}")
        } else {
            run_to_end(&mut worker).await?
        };
        self.worker = Some(worker);
        Ok(shown)
    }

    /// `writers …`: the multi-process race on this session's file.
    async fn writers(&mut self, call: &Call) -> Result<String, String> {
        let number = |name: &str| -> Result<i64, String> {
            let text = call.arg(name).unwrap_or_default();
            text.parse()
                .map_err(|_| format!("{name}={text} is not a number"))
        };
        let count = |name: &str| number(name).map(|n| n.max(0) as usize);
        let writers = crate::writers::Writers {
            file: &self.path,
            processes: count("processes")?,
            connections: count("connections")?,
            prefix: call.arg("prefix").unwrap_or_default(),
            item: number("item")?,
            delta: number("delta")?,
        };
        crate::writers::race(&writers)
            .await
            .map_err(|e| format!("{e:#}"))
    }

    /// `kill-worker`: SIGKILL to the session's worker.
    async fn kill_worker(&mut self) -> Result<String, String> {
        let mut worker = self.worker.take().ok_or("no worker to kill")?;
        let end = worker.kill().await.map_err(|e| format!("{e:#}"))?;
        Ok(end.words())
    }
}

/// Reads a worker's answers until it ends: `answers: replayed … exit=N`.
///
/// Errors: its output cannot be read, or it does not exit in time.
async fn run_to_end(worker: &mut CrashWorker) -> Result<String, String> {
    let wait = Duration::from_millis(WORKER_WAIT_MS);
    let mut answers = Vec::new();
    while let Some(line) = worker.next_line(wait).await.map_err(|e| format!("{e:#}"))? {
        let outcome = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("outcome="));
        answers.extend(outcome.map(String::from));
    }
    let end = worker.wait(wait).await.map_err(|e| format!("{e:#}"))?;
    Ok(format!(
        "answers: {} exit={}",
        answers.join(" "),
        end.shell_status()
    ))
}

impl EngineSession for FileSession {
    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>> {
        let outcome = sql_step(self.store().map(Store::connection), sql, "cannot open");
        async move { outcome }.boxed()
    }

    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>> {
        async move {
            match call.op.as_str() {
                "open" => self.open(call),
                "close" => {
                    self.store = None;
                    Ok("closed".to_string())
                }
                "worker" => self.worker(call).await,
                "writers" => self.writers(call).await,
                "count-busy-handler" => {
                    self.store()?;
                    let store = self.store.as_mut().expect("opened above");
                    let calls = store.count_busy_handler_calls();
                    self.busy_calls = Some(calls.map_err(|e| e.to_string())?);
                    Ok("counting".to_string())
                }
                "busy-handler-calls" => {
                    let calls = self
                        .busy_calls
                        .as_ref()
                        .ok_or("no count-busy-handler before")?;
                    Ok(format!(
                        "busy_handler_calls={}",
                        calls.load(Ordering::SeqCst)
                    ))
                }
                "kill-worker" => self.kill_worker().await,
                _ => self.store_call(call),
            }
        }
        .boxed()
    }

    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        let outcome = self.store().and_then(|store| summary(store.connection()));
        async move { outcome }.boxed()
    }
}

/// A session's SQL step on its SQLite connection (`opened`): [`run_sql`], or when the
/// connection cannot be had, one line saying so (`ERROR (cannot open): why`, `failed`
/// naming what could not be done).
pub fn sql_step(opened: Result<&Connection, String>, sql: &str, failed: &str) -> Vec<String> {
    match opened {
        Ok(connection) => run_sql(connection, sql),
        Err(error) => vec![format!("ERROR ({failed}): {error}")],
    }
}

/// Runs `sql` statement by statement; rows as `column=value`, `(0 rows)`, or one
/// `ERROR <code name>: message` line (the rows before it dropped, as on PostgreSQL).
/// The P family's SQLite files print their rows with it too.
pub fn run_sql(connection: &Connection, sql: &str) -> Vec<String> {
    let error = |e: &rusqlite::Error| {
        let message = match e {
            rusqlite::Error::SqliteFailure(_, Some(message)) => message.clone(),
            other => other.to_string(),
        };
        vec![format!(
            "ERROR {}: {message}",
            inventory_store::code_name(e)
        )]
    };
    let mut out = Vec::new();
    let mut batch = Batch::new(connection, sql);
    loop {
        let mut statement = match batch.next() {
            Ok(Some(statement)) => statement,
            Ok(None) => return out,
            Err(e) => return error(&e),
        };
        if statement.column_count() == 0 {
            if let Err(e) = statement.raw_execute() {
                return error(&e);
            }
            continue;
        }
        let names: Vec<String> = statement.column_names().map(String::from).collect();
        let mut rows = statement.raw_query();
        let before = out.len();
        loop {
            match rows.next() {
                Ok(Some(row)) => out.push(print_row(&names, row)),
                Ok(None) => break,
                Err(e) => return error(&e),
            }
        }
        if out.len() == before {
            out.push("(0 rows)".to_string());
        }
    }
}

/// A row as `column=value …` (`null`, integers and reals as SQLite gives them, text as
/// is, a blob as `x'…'`).
fn print_row(names: &[String], row: &rusqlite::Row<'_>) -> String {
    let cells = names.iter().enumerate().map(|(index, name)| {
        let value = match row.get_ref(index) {
            Ok(ValueRef::Null) | Err(_) => "null".to_string(),
            Ok(ValueRef::Integer(n)) => n.to_string(),
            Ok(ValueRef::Real(x)) => x.to_string(),
            Ok(ValueRef::Text(text)) => String::from_utf8_lossy(text).into_owned(),
            Ok(ValueRef::Blob(blob)) => {
                let hex: String = blob.iter().map(|b| format!("{b:02x}")).collect();
                format!("x'{hex}'")
            }
        };
        format!("{name}={value}")
    });
    cells.collect::<Vec<_>>().join(" ")
}
