//! The history: one JSON object per line, in the order the events happened (as seen by
//! this process), each with `t_us`, microseconds on a monotonic clock since the run
//! started. The checker reads it back from the file, nothing else of the run's memory.
//!
//! An operation's attempt is an `invoke` followed by exactly one of `ok` (201: it took
//! effect), `fail` (it certainly did not take effect this time: a recorded refusal 409 /
//! 404, a 422 key conflict, a 408, or a connection that could not be made, so nothing
//! was sent) or `info` (the client cannot know: a timeout, a connection closed without an
//! answer, a 5xx). Nemesis faults are `nemesis` events with `phase` `start` and `end`.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::plan::{FaultKind, Payload};

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Event {
    /// First line: the run's parameters and the balances before any operation.
    Setup {
        /// Microseconds since the run started.
        t_us: u64,
        /// The seed.
        seed: u64,
        /// Concurrent clients.
        clients: u32,
        /// Planned load duration, milliseconds.
        duration_ms: u64,
        /// The planted bug the service runs with, if any.
        planted_bug: Option<String>,
        /// `patroni` for a run on a Patroni cluster (`--topology patroni`); absent for a
        /// single server.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topology: Option<String>,
        /// Every account's balance before the load, points.
        balances: std::collections::BTreeMap<String, i64>,
    },
    /// An attempt is sent.
    Invoke {
        /// Microseconds since the run started.
        t_us: u64,
        /// Client number.
        client: u32,
        /// Operation index within the client's schedule.
        op: u64,
        /// Attempt number, 1-based; > 1 is a retry with the same key.
        attempt: u32,
        /// `X-Client-Id`.
        client_id: String,
        /// `Idempotency-Key`.
        key: String,
        /// What it asks for.
        #[serde(flatten)]
        payload: Payload,
        /// For a key reuse: the earlier operation whose key this one takes.
        reuse_of: Option<u64>,
    },
    /// The attempt took effect (201).
    Ok(Completion),
    /// The attempt certainly did not take effect.
    Fail(Completion),
    /// The client cannot know whether the attempt took effect.
    Info(Completion),
    /// A fault starts or ends.
    Nemesis {
        /// Microseconds since the run started.
        t_us: u64,
        /// The fault's number in the schedule.
        fault: u32,
        /// What it does.
        kind: FaultKind,
        /// `start` or `end`.
        phase: Phase,
        /// Hook point, for a pause or a withhold.
        point: Option<String>,
        /// Down or hold time, milliseconds.
        hold_ms: u64,
        /// What happened (at `end`: e.g. `fired=1`, `exit=signal: 9 (SIGKILL)`).
        detail: Option<String>,
        /// At `end`: whether the fault happened (a pause or withhold that no transfer
        /// passed while armed did not); `null` at `start`.
        effective: Option<bool>,
    },
    /// Last line: the load and the faults are over.
    End {
        /// Microseconds since the run started.
        t_us: u64,
    },
}

/// `start` or `end` of a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The fault begins.
    Start,
    /// The fault is over (the process is back, the hold released).
    End,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Microseconds since the run started.
    pub t_us: u64,
    /// Client number.
    pub client: u32,
    /// Operation index.
    pub op: u64,
    /// Attempt number.
    pub attempt: u32,
    /// HTTP status, if a response arrived.
    pub status: Option<u16>,
    /// `Idempotent-Replayed: true` was present.
    #[serde(default)]
    pub replayed: bool,
    /// The JSON body (`null` if none or not JSON).
    #[serde(default)]
    pub body: Value,
    /// Transport error class without a response: `timeout`, `connect` (nothing sent),
    /// `closed` (the connection ended without an answer).
    pub error: Option<String>,
}

impl Event {
    /// The event's time, microseconds since the run started.
    pub fn t_us(&self) -> u64 {
        match self {
            Event::Setup { t_us, .. }
            | Event::Invoke { t_us, .. }
            | Event::Nemesis { t_us, .. }
            | Event::End { t_us } => *t_us,
            Event::Ok(c) | Event::Fail(c) | Event::Info(c) => c.t_us,
        }
    }
}

/// Appends events to `history.jsonl`, one line each, under a lock (so lines never
/// interleave and the file order is the order of the calls).
pub struct HistoryWriter {
    started: Instant,
    file: Mutex<BufWriter<File>>,
}

impl HistoryWriter {
    /// Creates the file; `started` is time zero.
    ///
    /// Errors: the file cannot be created.
    pub fn create(path: &Path, started: Instant) -> std::io::Result<HistoryWriter> {
        Ok(HistoryWriter {
            started,
            file: Mutex::new(BufWriter::new(File::create(path)?)),
        })
    }

    /// Microseconds since time zero.
    pub fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Writes the event built from the current time (taken under the lock, so times in
    /// the file never go backwards).
    pub fn record(&self, build: impl FnOnce(u64) -> Event) {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let event = build(self.now_us());
        let line = serde_json::to_string(&event).expect("events serialize");
        let _ = writeln!(file, "{line}");
    }

    /// Flushes the file.
    ///
    /// Errors: the write failed.
    pub fn flush(&self) -> std::io::Result<()> {
        self.file.lock().unwrap_or_else(|p| p.into_inner()).flush()
    }
}

/// Reads a history file: each event with its 1-based line number.
///
/// Errors: unreadable file, or a line that is not an event (its number is named).
pub fn read(path: &Path) -> anyhow::Result<Vec<(usize, Event)>> {
    let file = File::open(path)?;
    let mut events = Vec::new();
    for (number, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Event = serde_json::from_str(&line)
            .map_err(|error| anyhow::anyhow!("history line {}: {error}", number + 1))?;
        events.push((number + 1, event));
    }
    Ok(events)
}
