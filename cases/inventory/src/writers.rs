//! The `writers` call of the S family's case files (S6): N crash-worker processes in
//! SQLite mode (`crash-worker sqlite writers`), each with M connections open on the
//! session's file, released together by a start file (the barrier across processes:
//! every worker polls for it once it has printed READY), each connection applying one
//! distinct change in `BEGIN IMMEDIATE` with the store's busy timeout.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use inventory_store::BUSY_TIMEOUT_MS;
use launch::worker::CrashWorker;

/// How long each worker may take to open its connections and print READY.
const READY_WAIT_MS: u64 = 30_000;
/// How long the parent waits for each OUTCOME line once the writers are released: the
/// busy timeout plus a margin, since the last writer may wait that long for the lock.
const OUTCOME_WAIT_MS: u64 = BUSY_TIMEOUT_MS + 20_000;
/// How long a worker may take to exit after its last line.
const EXIT_WAIT_MS: u64 = 10_000;

/// What the race is: `processes` × `connections` writers, event ids `<prefix>pN-MM`.
pub struct Writers<'a> {
    /// The file.
    pub file: &'a Path,
    /// Worker processes.
    pub processes: usize,
    /// Connections (threads) per process.
    pub connections: usize,
    /// Event id prefix; process N uses `<prefix>pN-`.
    pub prefix: &'a str,
    /// The item.
    pub item: i64,
    /// Each writer's delta.
    pub delta: i64,
}

/// Runs the race and returns its line: `ready=4 applied=14 insufficient=18 other=0
/// distinct_event_ids=32 exits=0,0,0,0 writer_longest_ms=…` (the slowest writer's time
/// for its change, lock wait included: volatile, redacted in the transcript).
///
/// Errors: a worker cannot be launched or read, or does not exit in time.
pub async fn race(writers: &Writers<'_>) -> anyhow::Result<String> {
    let start_file = writers.file.with_extension("start");
    if start_file.exists() {
        std::fs::remove_file(&start_file)?;
    }
    let mut workers = Vec::new();
    for process in 0..writers.processes {
        workers.push(CrashWorker::launch([
            "sqlite".to_string(),
            "writers".into(),
            "--file".into(),
            writers.file.display().to_string(),
            "--connections".into(),
            writers.connections.to_string(),
            "--event-prefix".into(),
            format!("{}p{process}-", writers.prefix),
            "--item".into(),
            writers.item.to_string(),
            "--delta".into(),
            writers.delta.to_string(),
            "--start-file".into(),
            start_file.display().to_string(),
        ])?);
    }
    let mut ready = 0;
    let expected = format!("READY connections={}", writers.connections);
    for worker in &mut workers {
        let line = worker
            .next_line(Duration::from_millis(READY_WAIT_MS))
            .await?;
        ready += usize::from(line.as_deref() == Some(expected.as_str()));
    }
    // The start barrier across processes: every worker polls for this file.
    std::fs::write(&start_file, b"go\n")?;
    let counted = collect(&mut workers).await?;
    Ok(format!("ready={ready} {counted}"))
}

/// Reads every worker's OUTCOME lines until it ends and waits for its exit; returns
/// the counts.
///
/// Errors: a worker's output cannot be read or it does not exit.
async fn collect(workers: &mut [CrashWorker]) -> anyhow::Result<String> {
    let (mut applied, mut insufficient, mut other) = (0usize, 0usize, Vec::new());
    let mut event_ids = BTreeSet::new();
    let (mut longest_ms, mut exits) = (0u64, Vec::new());
    for worker in workers.iter_mut() {
        let wait = Duration::from_millis(OUTCOME_WAIT_MS);
        while let Some(line) = worker.next_line(wait).await? {
            if !line.starts_with("OUTCOME ") {
                continue;
            }
            let field = |key: &str| {
                let word = line.split_whitespace().find_map(|w| w.strip_prefix(key));
                word.unwrap_or("").to_string()
            };
            event_ids.insert(field("event_id="));
            longest_ms = longest_ms.max(field("elapsed_ms=").parse().unwrap_or(0));
            match field("outcome=").as_str() {
                "applied" => applied += 1,
                "insufficient" => insufficient += 1,
                outcome => other.push(format!("{outcome}/{}", field("code="))),
            }
        }
        let end = worker.wait(Duration::from_millis(EXIT_WAIT_MS)).await?;
        exits.push(end.shell_status().to_string());
    }
    let other = if other.is_empty() {
        "0".to_string()
    } else {
        other.join(",")
    };
    Ok(format!(
        "applied={applied} insufficient={insufficient} other={other} distinct_event_ids={} \
         exits={} writer_longest_ms={longest_ms}",
        event_ids.len(),
        exits.join(",")
    ))
}
