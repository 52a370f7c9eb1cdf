//! The worker's SQLite mode (`crash-worker sqlite …`, SPEC §9): the same protocol as the
//! ledger mode, on an inventory file (`inventory_store`) instead of a PostgreSQL database.
//!
//! - `crash-worker sqlite apply --file F --change JSON [--change JSON …] [--stop-at P]`
//!   opens the file, applies the changes in order through the store's JSON entry point and
//!   prints one `RESULT index=<i> event_id=<id> outcome=<outcome> units=<units>` line per
//!   change. With `--stop-at`, the first change that reaches that hook point prints
//!   `PAUSED_IN_TX worker_pid=<pid> point=<point> event_id=<id>` there and waits to be
//!   killed, bounded by `--pause-limit-ms` (then it gives up: rolled back unless the point
//!   is `after-commit`, exit status 3). With `--hold-at-end` it prints `HOLDING
//!   worker_pid=<pid>` after the last change and waits to be killed with the connection
//!   open; `--synchronous` and `--journal-mode` set those pragmas after opening.
//! - `crash-worker sqlite writers --file F --connections N --event-prefix P --item I
//!   --delta D --start-file S` opens N connections, each on its own thread, prints
//!   `READY connections=<N>`, waits until the file S exists (the start barrier across
//!   processes: the parent creates it once every process is ready), then all N apply
//!   `<P><index>` at once. It prints one `OUTCOME connection=<index> event_id=<id>
//!   outcome=<outcome> code=<sqlite code or ->` line per connection and a final
//!   `DONE applied=… replayed=… insufficient=… other=…`.
//!
//! Everything is bounded by the pause limit plus [`crate::WORK_LIMIT_MS`]; past that the
//! worker exits [`crate::EXIT_WORK_LIMIT`]. Event ids are printed as they are; the cases
//! use ids without whitespace.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use inventory_store::{ChangeError, ChangeHooks, ChangeOutcome, ChangePoint, HookAbort, Store};

use crate::{EXIT_FAILED, EXIT_PAUSE_LIMIT, EXIT_WORK_LIMIT, PAUSE_LIMIT_MS, PAUSED_MARKER};

/// How often the start file is looked for, in milliseconds.
const START_POLL_MS: u64 = 1;
/// How long `writers` waits for its start file, in milliseconds.
const START_LIMIT_MS: u64 = 30_000;

/// The SQLite mode: one inventory file, one or many connections.
#[derive(Debug, Parser)]
#[command(
    name = "crash-worker sqlite",
    bin_name = "crash-worker sqlite",
    version
)]
struct SqliteArgs {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Apply changes on one connection, optionally stopping at a hook point.
    Apply {
        /// The inventory file (created with the store's schema if absent).
        #[arg(long)]
        file: PathBuf,
        /// A change as JSON, `{"event_id": …, "item": …, "delta": …}`; repeatable.
        #[arg(long = "change", required = true)]
        changes: Vec<String>,
        /// Hook point to stop at: event-written, stock-updated, before-commit,
        /// after-commit.
        #[arg(long)]
        stop_at: Option<ChangePoint>,
        /// How long to wait at the stop point before giving up, in milliseconds.
        #[arg(long, default_value_t = PAUSE_LIMIT_MS)]
        pause_limit_ms: u64,
        /// After every change, print `HOLDING worker_pid=<pid>` and wait to be killed
        /// (bounded by the pause limit) with the connection open: no close, so no
        /// checkpoint and no sync at close (a power cut's cases).
        #[arg(long)]
        hold_at_end: bool,
        /// `PRAGMA synchronous` after opening (`off`, `normal`, `full`), instead of the
        /// store's FULL.
        #[arg(long)]
        synchronous: Option<String>,
        /// `PRAGMA journal_mode` after opening (`delete`), instead of the store's WAL.
        #[arg(long)]
        journal_mode: Option<String>,
    },
    /// Open N connections and apply one change on each, all released together.
    Writers {
        /// The inventory file (must exist with its item).
        #[arg(long)]
        file: PathBuf,
        /// Connections (threads) in this process.
        #[arg(long)]
        connections: usize,
        /// Event ids are `<prefix><index>` with a two-digit index.
        #[arg(long)]
        event_prefix: String,
        /// The item every connection changes.
        #[arg(long)]
        item: i64,
        /// The delta every connection applies.
        #[arg(long, allow_hyphen_values = true)]
        delta: i64,
        /// The start barrier: all connections begin once this file exists.
        #[arg(long)]
        start_file: PathBuf,
        /// How long to wait for the start file, in milliseconds.
        #[arg(long, default_value_t = START_LIMIT_MS)]
        start_limit_ms: u64,
    },
}

/// Runs the SQLite mode; `argv` is the whole command line (`crash-worker sqlite …`).
/// Returns the exit status.
pub fn main(argv: Vec<OsString>) -> i32 {
    let args = SqliteArgs::parse_from(argv.into_iter().skip(1));
    let bound_ms = match &args.mode {
        Mode::Apply { pause_limit_ms, .. } => *pause_limit_ms,
        Mode::Writers { start_limit_ms, .. } => *start_limit_ms,
    }
    .saturating_add(crate::WORK_LIMIT_MS);
    watchdog(bound_ms);
    let result = match args.mode {
        Mode::Apply {
            file,
            changes,
            stop_at,
            pause_limit_ms,
            hold_at_end,
            synchronous,
            journal_mode,
        } => {
            let settings = Settings {
                hold_at_end,
                synchronous,
                journal_mode,
            };
            apply(&file, &changes, stop_at, pause_limit_ms, &settings)
        }
        Mode::Writers {
            file,
            connections,
            event_prefix,
            item,
            delta,
            start_file,
            start_limit_ms,
        } => writers(
            &file,
            connections,
            &event_prefix,
            item,
            delta,
            &start_file,
            start_limit_ms,
        ),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("crash-worker: {error:#}");
            EXIT_FAILED
        }
    }
}

/// Ends the process with [`EXIT_WORK_LIMIT`] after `limit_ms`, whatever it is doing.
fn watchdog(limit_ms: u64) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(limit_ms));
        eprintln!("crash-worker: gave up after limit_ms={limit_ms}");
        std::process::exit(EXIT_WORK_LIMIT);
    });
}

/// Prints `line` and flushes; false when stdout is closed (the parent is gone).
fn say(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

/// What `apply` changes about the store as shipped, and whether it holds at the end.
struct Settings {
    hold_at_end: bool,
    synchronous: Option<String>,
    journal_mode: Option<String>,
}

/// Opens `file` as the store does, then applies the settings' pragmas (checked by
/// reading them back).
fn open_with_settings(file: &Path, settings: &Settings) -> anyhow::Result<Store> {
    let store = Store::open(file).with_context(|| format!("opening {}", file.display()))?;
    if let Some(mode) = &settings.journal_mode {
        let now: String =
            store
                .connection()
                .query_row(&format!("PRAGMA journal_mode = {mode}"), [], |row| {
                    row.get(0)
                })?;
        anyhow::ensure!(
            now.eq_ignore_ascii_case(mode),
            "journal_mode is {now}, not {mode}"
        );
    }
    if let Some(level) = &settings.synchronous {
        store
            .connection()
            .pragma_update(None, "synchronous", level)?;
    }
    Ok(store)
}

fn apply(
    file: &Path,
    changes: &[String],
    stop_at: Option<ChangePoint>,
    pause_limit_ms: u64,
    settings: &Settings,
) -> anyhow::Result<i32> {
    let store = open_with_settings(file, settings)?;
    for (index, text) in changes.iter().enumerate() {
        let change: serde_json::Value =
            serde_json::from_str(text).with_context(|| format!("--change {text:?} is not JSON"))?;
        let event_id = change
            .get("event_id")
            .and_then(|id| id.as_str())
            .unwrap_or("-")
            .to_string();
        let hooks = StopAt {
            point: stop_at,
            event_id: event_id.clone(),
            pause: Duration::from_millis(pause_limit_ms),
            waited_out: AtomicBool::new(false),
        };
        let outcome = store.apply_json_with_hooks(&change, &hooks);
        if let Err(ChangeError::HookAborted { point, .. }) = &outcome
            && hooks.waited_out.load(Ordering::SeqCst)
        {
            let state = if point.is_committed() {
                "the change stays committed"
            } else {
                "the transaction was rolled back"
            };
            eprintln!(
                "crash-worker: not killed within pause_limit_ms={pause_limit_ms} at {point}; {state}"
            );
            return Ok(EXIT_PAUSE_LIMIT);
        }
        if let Err(ChangeError::HookAborted { reason, .. }) = &outcome {
            anyhow::bail!("stopped: {reason}");
        }
        let item = change.get("item").and_then(|item| item.as_i64());
        let units = match item {
            Some(item) => store
                .units(item)
                .ok()
                .flatten()
                .map_or_else(|| "-".to_string(), |units| units.to_string()),
            None => "-".into(),
        };
        say(&format!(
            "RESULT index={index} event_id={event_id} outcome={} units={units}",
            outcome_name(&outcome)
        ));
    }
    if settings.hold_at_end {
        say(&format!("HOLDING worker_pid={}", std::process::id()));
        std::thread::sleep(Duration::from_millis(pause_limit_ms));
        eprintln!("crash-worker: not killed within pause_limit_ms={pause_limit_ms} while holding");
        drop(store);
        return Ok(EXIT_PAUSE_LIMIT);
    }
    Ok(0)
}

fn outcome_name(outcome: &Result<ChangeOutcome, ChangeError>) -> &'static str {
    match outcome {
        Ok(outcome) => outcome.as_str(),
        Err(error) => error.kind(),
    }
}

/// Hooks that stop at one point (if any): print the marker line, then wait up to `pause`.
struct StopAt {
    point: Option<ChangePoint>,
    event_id: String,
    pause: Duration,
    /// Set when the whole pause passed without the process being killed.
    waited_out: AtomicBool,
}

impl ChangeHooks for StopAt {
    fn at(&self, point: ChangePoint) -> Result<(), HookAbort> {
        if self.point != Some(point) {
            return Ok(());
        }
        let announced = say(&format!(
            "{PAUSED_MARKER} worker_pid={} point={point} event_id={}",
            std::process::id(),
            self.event_id
        ));
        // The parent closed our stdout: nobody is watching, so do not wait.
        if !announced {
            return Err(HookAbort::new("stdout closed; parent gone"));
        }
        std::thread::sleep(self.pause);
        self.waited_out.store(true, Ordering::SeqCst);
        Err(HookAbort::new("pause limit reached"))
    }
}

/// What one writer thread did: its index, its event id, the outcome and how long the
/// change took.
type Written = (usize, String, Result<ChangeOutcome, ChangeError>, Duration);
/// A writer thread, joined for what it did (`None`: it could not open the file).
type Writer = std::thread::JoinHandle<Option<Written>>;
/// Where each writer reports its connection opened, or why not.
type Opened = std::sync::mpsc::Receiver<Result<(), String>>;

/// The `writers` mode (see the module documentation); returns the exit status.
///
/// Errors: no connections asked for, a connection failed to open, a thread could not be
/// started or panicked, stdout closed before READY.
fn writers(
    file: &Path,
    connections: usize,
    event_prefix: &str,
    item: i64,
    delta: i64,
    start_file: &Path,
    start_limit_ms: u64,
) -> anyhow::Result<i32> {
    anyhow::ensure!(connections > 0, "--connections must be at least 1");
    // Every connection is open before READY; the threads and this one meet at `start`.
    let start = Arc::new(Barrier::new(connections + 1));
    let (threads, opened) = spawn_writers(file, connections, event_prefix, item, delta, &start)?;
    for _ in 0..connections {
        match opened.recv() {
            Ok(Ok(())) => {}
            Ok(Err(message)) => anyhow::bail!("opening: {message}"),
            Err(_) => anyhow::bail!("a writer thread ended before opening"),
        }
    }
    if !say(&format!("READY connections={connections}")) {
        anyhow::bail!("stdout closed; parent gone");
    }
    if !start_file_appeared(start_file, start_limit_ms) {
        return Ok(EXIT_WORK_LIMIT);
    }
    start.wait();
    report_writers(threads)?;
    Ok(0)
}

/// Starts one thread per connection: each opens its own connection to `file`, reports
/// the opening on the returned channel, waits at `start`, then applies
/// `<event_prefix><index>` (`delta` on `item`) once.
///
/// Errors: a thread could not be started.
fn spawn_writers(
    file: &Path,
    connections: usize,
    event_prefix: &str,
    item: i64,
    delta: i64,
    start: &Arc<Barrier>,
) -> anyhow::Result<(Vec<Writer>, Opened)> {
    let (opened_sender, opened) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..connections)
        .map(|index| {
            let file = file.to_path_buf();
            let start = start.clone();
            let opened = opened_sender.clone();
            let event_id = format!("{event_prefix}{index:02}");
            std::thread::Builder::new()
                .name(format!("writer-{index}"))
                .spawn(move || {
                    let store = match Store::open(&file) {
                        Ok(store) => store,
                        Err(error) => {
                            let _ = opened.send(Err(format!("connection {index}: {error}")));
                            return None;
                        }
                    };
                    let _ = opened.send(Ok(()));
                    start.wait();
                    let began = Instant::now();
                    let outcome = store.apply_change(&event_id, item, delta);
                    Some((index, event_id, outcome, began.elapsed()))
                })
        })
        .collect::<Result<_, _>>()
        .context("starting the writer threads")?;
    drop(opened_sender);
    Ok((threads, opened))
}

/// Waits, polling every [`START_POLL_MS`], until `start_file` exists; false (with a line
/// on stderr) when it did not appear within `start_limit_ms`.
fn start_file_appeared(start_file: &Path, start_limit_ms: u64) -> bool {
    let deadline = Instant::now() + Duration::from_millis(start_limit_ms);
    while !start_file.exists() {
        if Instant::now() > deadline {
            eprintln!(
                "crash-worker: start file {} did not appear within start_limit_ms={start_limit_ms}",
                start_file.display()
            );
            return false;
        }
        std::thread::sleep(Duration::from_millis(START_POLL_MS));
    }
    true
}

/// Joins the writer threads in order, printing one `OUTCOME` line each, then the `DONE`
/// line with the counts.
///
/// Errors: a writer panicked or could not open the file.
fn report_writers(threads: Vec<Writer>) -> anyhow::Result<()> {
    let mut counts = [0usize; 4];
    for thread in threads {
        let Some((index, event_id, outcome, elapsed)) = thread
            .join()
            .map_err(|_| anyhow::anyhow!("a writer panicked"))?
        else {
            anyhow::bail!("a writer could not open the file");
        };
        let slot = match &outcome {
            Ok(ChangeOutcome::Applied) => 0,
            Ok(ChangeOutcome::Replayed) => 1,
            Err(ChangeError::Insufficient { .. }) => 2,
            Err(_) => 3,
        };
        counts[slot] += 1;
        let code = match &outcome {
            Err(ChangeError::Database(error)) => inventory_store::code_name(error),
            _ => "-".into(),
        };
        say(&format!(
            "OUTCOME connection={index} event_id={event_id} outcome={} code={code} elapsed_ms={}",
            outcome_name(&outcome),
            elapsed.as_millis()
        ));
    }
    say(&format!(
        "DONE applied={} replayed={} insufficient={} other={}",
        counts[0], counts[1], counts[2], counts[3]
    ));
    Ok(())
}
