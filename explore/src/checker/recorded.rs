//! The history as the checker reads it: the operations with their attempts, the fault
//! windows, the time of every line, and the history's counts. Also turns a checker's
//! [`Finding`] into a [`Violation`] whose excerpt shows the faults under way.

use std::collections::{BTreeMap, HashMap};

use super::Counts;
use super::Violation;
use super::finding::Finding;
use crate::history::{Completion, Event, Phase};
use crate::plan::{FaultKind, Payload};

/// How an operation ended, over all its attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// An attempt got 201.
    Acknowledged,
    /// An attempt got a recorded refusal (409, 404) or a key conflict (422).
    Refused,
    /// The client cannot know (a timeout, a lost connection, a 5xx, or still open).
    Unknown,
    /// Nothing was ever sent (every attempt failed to connect or got 408).
    Unsent,
}

/// One attempt: its `invoke` line and, once it ended, the completion's line, its type
/// (`ok`, `fail`, `info`) and the completion.
pub(super) struct Attempt {
    pub(super) invoke_line: usize,
    pub(super) completion: Option<(usize, &'static str, Completion)>,
}

/// One operation: a key and a payload, tried in one or more attempts.
pub(super) struct Op {
    pub(super) client_id: String,
    pub(super) key: String,
    pub(super) payload: Payload,
    pub(super) reuse_of: Option<u64>,
    pub(super) attempts: Vec<Attempt>,
}

impl Op {
    /// The attempts that ended: line, type (`ok`, `fail`, `info`) and completion.
    pub(super) fn completions(&self) -> impl Iterator<Item = (usize, &'static str, &Completion)> {
        self.attempts
            .iter()
            .filter_map(|a| a.completion.as_ref().map(|(l, t, c)| (*l, *t, c)))
    }

    /// How the operation ended (see [`Status`]).
    pub(super) fn status(&self) -> Status {
        let mut any_info = false;
        let mut refused = false;
        for (_, kind, completion) in self.completions() {
            match (kind, completion.status) {
                ("ok", _) => return Status::Acknowledged,
                ("fail", Some(404 | 409 | 422)) => refused = true,
                ("info", _) => any_info = true,
                _ => {}
            }
        }
        // An attempt still open when the history ended counts as unknown.
        let open = self.attempts.iter().any(|a| a.completion.is_none());
        if refused {
            Status::Refused
        } else if any_info || open {
            Status::Unknown
        } else {
            Status::Unsent
        }
    }

    /// The history lines of every attempt: each `invoke` and its completion.
    pub(super) fn lines(&self) -> Vec<usize> {
        let mut lines = Vec::new();
        for attempt in &self.attempts {
            lines.push(attempt.invoke_line);
            if let Some((line, _, _)) = &attempt.completion {
                lines.push(*line);
            }
        }
        lines
    }
}

/// A fault counts as under way at a moment this close to its window, microseconds.
const WINDOW_SLACK_US: u64 = 100_000;

/// A fault's window in the history: its start and end times (microseconds; `u64::MAX`
/// while it never ended) and lines.
pub(super) struct Window {
    start_t: u64,
    end_t: u64,
    start_line: usize,
    end_line: Option<usize>,
}

/// What the checker reads from the history.
pub(super) struct Recorded {
    /// Every account's balance before the load (the setup line), points.
    pub(super) initial: BTreeMap<String, i64>,
    /// The operations, in `(client, op)` order.
    pub(super) ops: Vec<Op>,
    /// The history's counts (those of the operations' outcomes still zero).
    pub(super) counts: Counts,
    /// The fault windows, in the order they started.
    windows: Vec<Window>,
    /// Each line's time, microseconds.
    line_t: HashMap<usize, u64>,
    /// The latest time in the history, microseconds.
    end_t: u64,
}

/// [`Recorded`] while the history is being read: operations by `(client, op)`, and the
/// windows still open by fault number.
#[derive(Default)]
struct Reading {
    initial: BTreeMap<String, i64>,
    ops: BTreeMap<(u32, u64), Op>,
    counts: Counts,
    windows: Vec<Window>,
    open_windows: HashMap<u32, usize>,
    line_t: HashMap<usize, u64>,
    end_t: u64,
}

impl Recorded {
    /// Reads `events` (the history, with line numbers).
    pub(super) fn read(events: &[(usize, Event)]) -> Recorded {
        let mut reading = Reading::default();
        for (line, event) in events {
            reading.line_t.insert(*line, event.t_us());
            reading.end_t = reading.end_t.max(event.t_us());
            match event {
                Event::Setup { balances, .. } => reading.initial = balances.clone(),
                Event::Invoke { .. } => reading.invoke(*line, event),
                Event::Ok(c) | Event::Fail(c) | Event::Info(c) => reading.complete(*line, event, c),
                Event::Nemesis { .. } => reading.nemesis(*line, event),
                Event::End { .. } => {}
            }
        }
        reading.finish()
    }

    /// The violation `finding` shows: its excerpt is the finding's lines plus the
    /// windows of the faults under way at any of their moments (or just before them: an
    /// answer lost to a fault arrives as the fault starts); its time the excerpt's
    /// earliest (the history's end when it names no line).
    pub(super) fn violation(&self, finding: Finding) -> Violation {
        let mut lines = finding.lines;
        lines.sort_unstable();
        lines.dedup();
        let times: Vec<u64> = lines
            .iter()
            .filter_map(|l| self.line_t.get(l))
            .copied()
            .collect();
        let t_us = times.iter().copied().min().unwrap_or(self.end_t);
        let before = WINDOW_SLACK_US;
        for window in &self.windows {
            if times
                .iter()
                .any(|t| window.start_t <= t + before && *t <= window.end_t.saturating_add(before))
            {
                lines.push(window.start_line);
                lines.extend(window.end_line);
            }
        }
        lines.sort_unstable();
        lines.dedup();
        Violation {
            kind: finding.kind,
            summary: finding.summary,
            t_us,
            lines,
        }
    }
}

impl Reading {
    /// An `invoke` on `line`: a new attempt of its operation (the operation's first
    /// `invoke` names its key and payload).
    fn invoke(&mut self, line: usize, event: &Event) {
        let Event::Invoke {
            client,
            op,
            attempt,
            client_id,
            key,
            payload,
            reuse_of,
            ..
        } = event
        else {
            return;
        };
        self.counts.attempts += 1;
        if *attempt > 1 {
            self.counts.retries += 1;
        }
        let entry = self.ops.entry((*client, *op)).or_insert_with(|| Op {
            client_id: client_id.clone(),
            key: key.clone(),
            payload: payload.clone(),
            reuse_of: *reuse_of,
            attempts: Vec::new(),
        });
        entry.attempts.push(Attempt {
            invoke_line: line,
            completion: None,
        });
    }

    /// An `ok`, `fail` or `info` on `line`: it ends its operation's latest open attempt.
    fn complete(&mut self, line: usize, event: &Event, c: &Completion) {
        let kind = match event {
            Event::Ok(_) => {
                self.counts.attempts_ok += 1;
                "ok"
            }
            Event::Fail(_) => {
                self.counts.attempts_fail += 1;
                "fail"
            }
            _ => {
                self.counts.attempts_info += 1;
                "info"
            }
        };
        if c.replayed {
            self.counts.replays += 1;
        }
        if let Some(op) = self.ops.get_mut(&(c.client, c.op))
            && let Some(attempt) = op
                .attempts
                .iter_mut()
                .rev()
                .find(|a| a.completion.is_none())
        {
            attempt.completion = Some((line, kind, c.clone()));
        }
    }

    /// A `nemesis` line: a fault's window opens, or closes and the fault is counted (as
    /// its kind when it had an effect).
    fn nemesis(&mut self, line: usize, event: &Event) {
        let Event::Nemesis {
            fault,
            kind,
            phase,
            effective,
            t_us,
            ..
        } = event
        else {
            return;
        };
        match phase {
            Phase::Start => {
                self.open_windows.insert(*fault, self.windows.len());
                self.windows.push(Window {
                    start_t: *t_us,
                    end_t: u64::MAX,
                    start_line: line,
                    end_line: None,
                });
            }
            Phase::End => {
                if let Some(index) = self.open_windows.remove(fault) {
                    self.windows[index].end_t = *t_us;
                    self.windows[index].end_line = Some(line);
                }
                if *effective == Some(true) {
                    *self
                        .counts
                        .faults
                        .entry(kind.as_str().to_owned())
                        .or_default() += 1;
                } else {
                    self.counts.faults_without_effect += 1;
                }
            }
        }
    }

    /// The history read: every fault kind counted (zero if none happened), the
    /// operations and key reuses counted.
    fn finish(mut self) -> Recorded {
        for kind in FaultKind::ALL {
            self.counts
                .faults
                .entry(kind.as_str().to_owned())
                .or_default();
        }
        self.counts.ops = self.ops.len();
        self.counts.key_reuses = self.ops.values().filter(|op| op.reuse_of.is_some()).count();
        Recorded {
            initial: self.initial,
            ops: self.ops.into_values().collect(),
            counts: self.counts,
            windows: self.windows,
            line_t: self.line_t,
            end_t: self.end_t,
        }
    }
}
