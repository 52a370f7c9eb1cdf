//! The checker: reads the history (the file) and the final database
//! ([`crate::state::FinalState`], read with its own queries) and reports every violation
//! of the properties below, grouped by kind. It shares no code path with the service:
//! it never calls `points_ledger` and recomputes everything from raw rows.
//!
//! An operation is a key and a payload, tried in one or more attempts. It is
//! *acknowledged* when an attempt got 201, *refused* when one got a recorded refusal
//! (409, 404) or a key conflict (422), *unsent* when every attempt failed to connect or
//! got 408, and *unknown* otherwise (an attempt timed out, lost its connection or got a
//! 5xx, and none of the above followed). An *effect* is a `ledger_txn` row with its
//! entries; its payload is read from the entries (the user account and the amount).
//!
//! Kinds of violation:
//! - `lost-ack`: an acknowledged operation has no effect under its key with its payload.
//! - `refused-but-executed`: a refused or unsent operation's payload took effect.
//! - `phantom-effect`: an effect that no operation asked for (its key was never sent, or
//!   never with that payload).
//! - `executed-twice`: one key executed fresh more than once (two answers without
//!   `Idempotent-Replayed`, or two effects).
//! - `reuse-executed`: two different payloads under one key were both acknowledged.
//! - `replay-mismatch`: two answers for one key differ (status, outcome, txn id, balance).
//! - `answer-mismatch`: a 201 names another txn id than the key's effect, or another
//!   account, kind or amount than its request.
//! - `negative-balance`: an answer reported, or the final database holds, a negative
//!   balance on an account that does not allow one.
//! - `balance-mismatch`: an account's final balance differs from its initial balance
//!   plus the acknowledged operations and the unknown ones the database shows executed.
//! - `unexpected-answer`: a status outside the contract (not 201, 404, 408, 409, 422 or
//!   5xx), or an outcome that does not go with its status.
//! - `reconcile-balance`, `reconcile-txn`, `reconcile-link`, `reconcile-pending`,
//!   `reconcile-sum`: the ledger's invariants, recomputed from raw rows (balance = sum
//!   of entries; every transaction has ≥ 2 entries summing to 0; every OK record names a
//!   transaction and every transaction has its record; no committed PENDING; the sum of
//!   all balances is 0).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::history::{Completion, Event, Phase};
use crate::plan::{FaultKind, Kind, Payload};
use crate::state::{FinalState, TxnRow};

/// A violation: its kind, what is wrong, and the history lines that show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// One of the kinds in the module documentation.
    pub kind: &'static str,
    /// What is wrong, in one sentence with the figures.
    pub summary: String,
    /// When it first shows in the history (its earliest line), microseconds.
    pub t_us: u64,
    /// The history lines (1-based) of the excerpt that shows it: the operations
    /// involved and the faults overlapping them.
    pub lines: Vec<usize>,
}

/// The violations of one kind: how many, the first, and the one with the smallest excerpt.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// The kind.
    pub kind: &'static str,
    /// How many violations of this kind.
    pub count: usize,
    /// The earliest.
    pub first: Violation,
    /// The one with the fewest excerpt lines (the earliest among equals).
    pub smallest: Violation,
}

/// Counts of the history.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Operations invoked.
    pub ops: usize,
    /// Attempts sent.
    pub attempts: usize,
    /// Operations acknowledged.
    pub acknowledged: usize,
    /// Operations refused (409, 404, 422).
    pub refused: usize,
    /// Operations whose outcome the client could not know.
    pub unknown: usize,
    /// Operations of which nothing was sent.
    pub unsent: usize,
    /// Unknown operations the final database shows executed.
    pub unknown_executed: usize,
    /// Attempts that ended ok / fail / info.
    pub attempts_ok: usize,
    /// See `attempts_ok`.
    pub attempts_fail: usize,
    /// See `attempts_ok`.
    pub attempts_info: usize,
    /// Retries (attempts after the first).
    pub retries: usize,
    /// Operations that reused a key with another payload.
    pub key_reuses: usize,
    /// Answers marked `Idempotent-Replayed: true`.
    pub replays: usize,
    /// Faults that happened, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Faults planned and started but without effect (a pause no transfer passed).
    pub faults_without_effect: usize,
}

/// The checker's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Figures of the history.
    pub counts: Counts,
    /// Every violation, in history order.
    pub violations: Vec<Violation>,
    /// The violations by kind, in the order of their first occurrence.
    pub groups: Vec<Group>,
}

impl Report {
    /// Faults that happened, all kinds.
    pub fn faults_total(&self) -> usize {
        self.counts.faults.values().sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Acknowledged,
    Refused,
    Unknown,
    Unsent,
}

struct Attempt {
    invoke_line: usize,
    completion: Option<(usize, &'static str, Completion)>,
}

struct Op {
    client_id: String,
    key: String,
    payload: Payload,
    reuse_of: Option<u64>,
    attempts: Vec<Attempt>,
}

impl Op {
    fn completions(&self) -> impl Iterator<Item = (usize, &'static str, &Completion)> {
        self.attempts
            .iter()
            .filter_map(|a| a.completion.as_ref().map(|(l, t, c)| (*l, *t, c)))
    }

    fn status(&self) -> Status {
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

    fn lines(&self) -> Vec<usize> {
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

/// The payload an effect carries, read from its entries: a DEBIT takes `amount` from one
/// user account (to a system account), a GRANT gives it to one (from a system account).
/// `None` when the entries do not have that shape.
fn effect_payload(txn: &TxnRow) -> Option<Payload> {
    let users: Vec<&(String, i64)> = txn
        .entries
        .iter()
        .filter(|(account, _)| !account.starts_with("sys-"))
        .collect();
    let [(account, amount)] = users.as_slice() else {
        return None;
    };
    let (kind, amount) = match txn.kind.as_str() {
        "DEBIT" if *amount < 0 => (Kind::Debit, -amount),
        "GRANT" if *amount > 0 => (Kind::Grant, *amount),
        _ => return None,
    };
    Some(Payload {
        kind,
        account: account.clone(),
        amount,
    })
}

/// A fault counts as under way at a moment this close to its window, microseconds.
const WINDOW_SLACK_US: u64 = 100_000;

/// A fault's window in the history.
struct Window {
    start_t: u64,
    end_t: u64,
    start_line: usize,
    end_line: Option<usize>,
}

struct Checker {
    end_t: u64,
    windows: Vec<Window>,
    line_t: HashMap<usize, u64>,
    violations: Vec<Violation>,
}

impl Checker {
    /// Records a violation whose excerpt is `lines` plus the faults overlapping them.
    fn flag(&mut self, kind: &'static str, summary: String, mut lines: Vec<usize>) {
        lines.sort_unstable();
        lines.dedup();
        let times: Vec<u64> = lines
            .iter()
            .filter_map(|l| self.line_t.get(l))
            .copied()
            .collect();
        let t_us = times.iter().copied().min().unwrap_or(self.end_t);
        // The faults under way at any of the excerpt's moments (and just before: an
        // answer lost to a fault arrives as the fault starts).
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
        self.violations.push(Violation {
            kind,
            summary,
            t_us,
            lines,
        });
    }
}

/// Checks `events` (the history, with line numbers) against `state` (the final
/// database).
pub fn check(events: &[(usize, Event)], state: &FinalState) -> Report {
    let mut counts = Counts::default();
    let mut initial: BTreeMap<String, i64> = BTreeMap::new();
    let mut ops: BTreeMap<(u32, u64), Op> = BTreeMap::new();
    let mut windows: Vec<Window> = Vec::new();
    let mut open_windows: HashMap<u32, usize> = HashMap::new();
    let mut line_t = HashMap::new();
    let mut end_t = 0;
    for (line, event) in events {
        line_t.insert(*line, event.t_us());
        end_t = end_t.max(event.t_us());
        match event {
            Event::Setup { balances, .. } => initial = balances.clone(),
            Event::Invoke {
                client,
                op,
                attempt,
                client_id,
                key,
                payload,
                reuse_of,
                ..
            } => {
                counts.attempts += 1;
                if *attempt > 1 {
                    counts.retries += 1;
                }
                let entry = ops.entry((*client, *op)).or_insert_with(|| Op {
                    client_id: client_id.clone(),
                    key: key.clone(),
                    payload: payload.clone(),
                    reuse_of: *reuse_of,
                    attempts: Vec::new(),
                });
                entry.attempts.push(Attempt {
                    invoke_line: *line,
                    completion: None,
                });
            }
            Event::Ok(c) | Event::Fail(c) | Event::Info(c) => {
                let kind = match event {
                    Event::Ok(_) => {
                        counts.attempts_ok += 1;
                        "ok"
                    }
                    Event::Fail(_) => {
                        counts.attempts_fail += 1;
                        "fail"
                    }
                    _ => {
                        counts.attempts_info += 1;
                        "info"
                    }
                };
                if c.replayed {
                    counts.replays += 1;
                }
                if let Some(op) = ops.get_mut(&(c.client, c.op))
                    && let Some(attempt) = op
                        .attempts
                        .iter_mut()
                        .rev()
                        .find(|a| a.completion.is_none())
                {
                    attempt.completion = Some((*line, kind, c.clone()));
                }
            }
            Event::Nemesis {
                fault,
                kind,
                phase,
                effective,
                t_us,
                ..
            } => match phase {
                Phase::Start => {
                    open_windows.insert(*fault, windows.len());
                    windows.push(Window {
                        start_t: *t_us,
                        end_t: u64::MAX,
                        start_line: *line,
                        end_line: None,
                    });
                }
                Phase::End => {
                    if let Some(index) = open_windows.remove(fault) {
                        windows[index].end_t = *t_us;
                        windows[index].end_line = Some(*line);
                    }
                    if *effective == Some(true) {
                        *counts.faults.entry(kind.as_str().to_owned()).or_default() += 1;
                    } else {
                        counts.faults_without_effect += 1;
                    }
                }
            },
            Event::End { .. } => {}
        }
    }
    for kind in FaultKind::ALL {
        counts.faults.entry(kind.as_str().to_owned()).or_default();
    }
    let mut checker = Checker {
        end_t,
        windows,
        line_t,
        violations: Vec::new(),
    };

    counts.ops = ops.len();
    counts.key_reuses = ops.values().filter(|op| op.reuse_of.is_some()).count();

    // Effects by key.
    let mut effects: HashMap<(&str, &str), Vec<&TxnRow>> = HashMap::new();
    for txn in &state.txns {
        effects
            .entry((txn.client_id.as_str(), txn.idem_key.as_str()))
            .or_default()
            .push(txn);
    }
    let mut by_key: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for op in ops.values() {
        by_key
            .entry((op.client_id.as_str(), op.key.as_str()))
            .or_default()
            .push(op);
    }

    // Per operation: acknowledged → its effect; refused or unsent → none.
    let mut executed_unknown: Vec<&Op> = Vec::new();
    for op in ops.values() {
        let status = op.status();
        let effect = effects
            .get(&(op.client_id.as_str(), op.key.as_str()))
            .and_then(|txns| {
                txns.iter()
                    .find(|txn| effect_payload(txn).as_ref() == Some(&op.payload))
            });
        match status {
            Status::Acknowledged => {
                counts.acknowledged += 1;
                if effect.is_none() {
                    checker.flag(
                        "lost-ack",
                        format!(
                            "{} key {} {} {} {} was acknowledged (201) but no transaction \
                             under that key carries it",
                            op.client_id,
                            op.key,
                            op.payload.kind.as_str(),
                            op.payload.account,
                            op.payload.amount
                        ),
                        op.lines(),
                    );
                }
            }
            Status::Refused | Status::Unsent => {
                if status == Status::Refused {
                    counts.refused += 1;
                } else {
                    counts.unsent += 1;
                }
                if let Some(txn) = effect {
                    checker.flag(
                        "refused-but-executed",
                        format!(
                            "{} key {} {} {} {} was {} but took effect as txn {}",
                            op.client_id,
                            op.key,
                            op.payload.kind.as_str(),
                            op.payload.account,
                            op.payload.amount,
                            if status == Status::Refused {
                                "refused"
                            } else {
                                "never sent"
                            },
                            txn.txn_id
                        ),
                        op.lines(),
                    );
                }
            }
            Status::Unknown => {
                counts.unknown += 1;
                if effect.is_some() {
                    counts.unknown_executed += 1;
                    executed_unknown.push(op);
                }
            }
        }
        // Every answer that carries a balance of a user account: never negative; a 201
        // names its own request and the key's effect.
        for (line, kind, completion) in op.completions() {
            let body = &completion.body;
            if let Some(balance) = body["balance"].as_i64()
                && balance < 0
            {
                checker.flag(
                    "negative-balance",
                    format!(
                        "an answer for {} key {} reported balance {balance} of {}",
                        op.client_id, op.key, op.payload.account
                    ),
                    vec![line],
                );
            }
            if let Some(status) = completion.status {
                let outcome = body["outcome"].as_str().unwrap_or("");
                let expected = match status {
                    201 => Some("OK"),
                    409 => Some("INSUFFICIENT"),
                    404 => Some("NO_ACCOUNT"),
                    422 => Some("KEY_REUSED"),
                    _ => None,
                };
                let in_contract = matches!(status, 201 | 404 | 408 | 409 | 422 | 500..=599);
                if !in_contract || expected.is_some_and(|e| e != outcome) {
                    checker.flag(
                        "unexpected-answer",
                        format!(
                            "{} key {}: status {status} with outcome {outcome:?}",
                            op.client_id, op.key
                        ),
                        vec![line],
                    );
                }
            }
            if kind == "ok" {
                let names_request = body["account_id"].as_str() == Some(&op.payload.account)
                    && body["amount"].as_i64() == Some(op.payload.amount)
                    && body["kind"].as_str() == Some(op.payload.kind.as_str());
                let txn_id = body["txn_id"].as_i64();
                let matches_effect = effect.is_none_or(|txn| Some(txn.txn_id) == txn_id);
                if !names_request || !matches_effect {
                    checker.flag(
                        "answer-mismatch",
                        format!(
                            "{} key {}: the 201 says {} {} {} txn {:?}; the request was {} {} \
                             {} and the key's effect is txn {:?}",
                            op.client_id,
                            op.key,
                            body["kind"].as_str().unwrap_or("?"),
                            body["account_id"].as_str().unwrap_or("?"),
                            body["amount"],
                            txn_id,
                            op.payload.kind.as_str(),
                            op.payload.account,
                            op.payload.amount,
                            effect.map(|txn| txn.txn_id)
                        ),
                        op.lines(),
                    );
                }
            }
        }
    }

    // Per key: one fresh execution, equal answers, one payload acknowledged, effects
    // that someone asked for.
    for ((client_id, key), key_ops) in &by_key {
        let lines: Vec<usize> = key_ops.iter().flat_map(|op| op.lines()).collect();
        let mut fresh = 0;
        let mut answers: BTreeSet<String> = BTreeSet::new();
        for op in key_ops {
            for (_, _, completion) in op.completions() {
                if matches!(completion.status, Some(201 | 404 | 409)) {
                    if !completion.replayed {
                        fresh += 1;
                    }
                    let body = &completion.body;
                    answers.insert(format!(
                        "{} {} txn={} balance={} {} {} {}",
                        completion.status.unwrap_or(0),
                        body["outcome"].as_str().unwrap_or(""),
                        body["txn_id"],
                        body["balance"],
                        body["kind"].as_str().unwrap_or(""),
                        body["account_id"].as_str().unwrap_or(""),
                        body["amount"]
                    ));
                }
            }
        }
        let txns = effects
            .get(&(*client_id, *key))
            .map_or(&[][..], Vec::as_slice);
        if fresh > 1 || txns.len() > 1 {
            checker.flag(
                "executed-twice",
                format!(
                    "{client_id} key {key} was executed fresh {fresh} times (answers without \
                     Idempotent-Replayed) and has {} transactions",
                    txns.len()
                ),
                lines.clone(),
            );
        }
        if answers.len() > 1 {
            checker.flag(
                "replay-mismatch",
                format!(
                    "{client_id} key {key} got {} different answers: {}",
                    answers.len(),
                    answers.into_iter().collect::<Vec<_>>().join(" | ")
                ),
                lines.clone(),
            );
        }
        let acknowledged: BTreeSet<&Payload> = key_ops
            .iter()
            .filter(|op| op.status() == Status::Acknowledged)
            .map(|op| &op.payload)
            .collect();
        if acknowledged.len() > 1 {
            checker.flag(
                "reuse-executed",
                format!(
                    "{client_id} key {key} was acknowledged for {} different payloads",
                    acknowledged.len()
                ),
                lines.clone(),
            );
        }
    }
    for txn in &state.txns {
        let key_ops = by_key
            .get(&(txn.client_id.as_str(), txn.idem_key.as_str()))
            .map_or(&[][..], Vec::as_slice);
        let payload = effect_payload(txn);
        if key_ops
            .iter()
            .any(|op| Some(&op.payload) == payload.as_ref())
        {
            continue;
        }
        // Show what could have produced it: this client's operations with that payload.
        let suspects: Vec<usize> = ops
            .values()
            .filter(|op| op.client_id == txn.client_id && Some(&op.payload) == payload.as_ref())
            .flat_map(|op| op.lines())
            .collect();
        let lines = if key_ops.is_empty() {
            suspects
        } else {
            key_ops.iter().flat_map(|op| op.lines()).collect()
        };
        checker.flag(
            "phantom-effect",
            format!(
                "txn {} ({} key {}, {}) was asked for by no operation: {}",
                txn.txn_id,
                txn.client_id,
                txn.idem_key,
                payload.as_ref().map_or("entries of another shape".to_owned(), |p| format!(
                    "{} {} {}",
                    p.kind.as_str(),
                    p.account,
                    p.amount
                )),
                if key_ops.is_empty() {
                    "no operation sent this key (shown: this client's operations with the same payload)"
                } else {
                    "its key was sent, never with this payload"
                }
            ),
            lines,
        );
    }

    // Balances: initial + acknowledged + executed unknown, per user account.
    let mut expected = initial.clone();
    for op in ops.values() {
        let counted = op.status() == Status::Acknowledged
            || executed_unknown
                .iter()
                .any(|other| std::ptr::eq(*other, op));
        if counted {
            *expected.entry(op.payload.account.clone()).or_default() += op.payload.delta();
        }
    }
    for account in &state.accounts {
        if account.balance < 0 && !account.allow_negative {
            checker.flag(
                "negative-balance",
                format!(
                    "{} ends with balance {} in the database",
                    account.account_id, account.balance
                ),
                Vec::new(),
            );
        }
        if account.account_id.starts_with("sys-") {
            continue;
        }
        let Some(want) = expected.get(&account.account_id) else {
            continue;
        };
        if *want != account.balance {
            let lines: Vec<usize> = ops
                .values()
                .filter(|op| op.payload.account == account.account_id)
                .flat_map(|op| op.lines())
                .collect();
            checker.flag(
                "balance-mismatch",
                format!(
                    "{} ends at {} points; the history says {} (initial {} + acknowledged and \
                     executed unknown operations), a difference of {}",
                    account.account_id,
                    account.balance,
                    want,
                    initial.get(&account.account_id).copied().unwrap_or(0),
                    account.balance - want
                ),
                lines,
            );
        }
    }

    reconcile(&mut checker, state);

    let mut violations = checker.violations;
    violations.sort_by_key(|v| v.t_us);
    let mut groups: Vec<Group> = Vec::new();
    for violation in &violations {
        match groups.iter_mut().find(|g| g.kind == violation.kind) {
            Some(group) => {
                group.count += 1;
                if violation.lines.len() < group.smallest.lines.len() {
                    group.smallest = violation.clone();
                }
            }
            None => groups.push(Group {
                kind: violation.kind,
                count: 1,
                first: violation.clone(),
                smallest: violation.clone(),
            }),
        }
    }
    Report {
        counts,
        violations,
        groups,
    }
}

/// The ledger's invariants (SPEC §2 I3, I4, the request links, no committed PENDING, a
/// zero global sum), from the raw rows.
fn reconcile(checker: &mut Checker, state: &FinalState) {
    let mut sums: HashMap<&str, i64> = HashMap::new();
    for txn in &state.txns {
        for (account, amount) in &txn.entries {
            *sums.entry(account.as_str()).or_default() += amount;
        }
        let total: i64 = txn.entries.iter().map(|(_, amount)| amount).sum();
        if txn.entries.len() < 2 || total != 0 {
            checker.flag(
                "reconcile-txn",
                format!(
                    "txn {} has {} entries summing to {total}",
                    txn.txn_id,
                    txn.entries.len()
                ),
                Vec::new(),
            );
        }
    }
    let mut global = 0i64;
    for account in &state.accounts {
        global += account.balance;
        let recomputed = sums.get(account.account_id.as_str()).copied().unwrap_or(0);
        if recomputed != account.balance {
            checker.flag(
                "reconcile-balance",
                format!(
                    "{}: stored balance {} but its entries sum to {recomputed}",
                    account.account_id, account.balance
                ),
                Vec::new(),
            );
        }
    }
    if global != 0 {
        checker.flag(
            "reconcile-sum",
            format!("the balances of all accounts sum to {global}, not 0"),
            Vec::new(),
        );
    }
    let txn_by_key: HashMap<(&str, &str), i64> = state
        .txns
        .iter()
        .map(|t| ((t.client_id.as_str(), t.idem_key.as_str()), t.txn_id))
        .collect();
    let mut recorded: HashMap<(&str, &str), Option<i64>> = HashMap::new();
    for request in &state.requests {
        let key = (request.client_id.as_str(), request.idem_key.as_str());
        recorded.insert(key, request.txn_id);
        match request.outcome.as_str() {
            "PENDING" => checker.flag(
                "reconcile-pending",
                format!(
                    "{} key {} is committed as PENDING",
                    request.client_id, request.idem_key
                ),
                Vec::new(),
            ),
            "OK" if request.txn_id.is_none() || request.txn_id != txn_by_key.get(&key).copied() => {
                checker.flag(
                    "reconcile-link",
                    format!(
                        "{} key {} is recorded OK with txn {:?}, but the key's transaction is {:?}",
                        request.client_id,
                        request.idem_key,
                        request.txn_id,
                        txn_by_key.get(&key)
                    ),
                    Vec::new(),
                )
            }
            _ => {}
        }
    }
    for txn in &state.txns {
        let key = (txn.client_id.as_str(), txn.idem_key.as_str());
        if recorded.get(&key).copied().flatten() != Some(txn.txn_id) {
            checker.flag(
                "reconcile-link",
                format!(
                    "txn {} ({} key {}) has no OK record naming it",
                    txn.txn_id, txn.client_id, txn.idem_key
                ),
                Vec::new(),
            );
        }
    }
}

/// The text of `lines` from the history file's `raw` lines (1-based), at most `max`,
/// each prefixed with its number.
pub fn excerpt(raw: &[String], lines: &[usize], max: usize) -> String {
    let mut text = String::new();
    for line in lines.iter().take(max) {
        if let Some(content) = raw.get(line - 1) {
            text.push_str(&format!("{line:>7}: {content}\n"));
        }
    }
    if lines.len() > max {
        text.push_str(&format!(
            "         … {} more lines (all numbers in violations.json)\n",
            lines.len() - max
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Completion;
    use crate::state::{AccountRow, RequestRow};
    use serde_json::json;

    fn invoke(line: usize, op: u64, attempt: u32, key: &str, amount: i64) -> (usize, Event) {
        (
            line,
            Event::Invoke {
                t_us: line as u64 * 1_000,
                client: 0,
                op,
                attempt,
                client_id: "c".into(),
                key: key.into(),
                payload: Payload {
                    kind: Kind::Grant,
                    account: "acct-0001".into(),
                    amount,
                },
                reuse_of: None,
            },
        )
    }

    fn done(
        line: usize,
        op: u64,
        attempt: u32,
        status: Option<u16>,
        replayed: bool,
        txn: i64,
        amount: i64,
    ) -> (usize, Event) {
        let completion = Completion {
            t_us: line as u64 * 1_000,
            client: 0,
            op,
            attempt,
            status,
            replayed,
            body: match status {
                Some(201) => json!({"outcome": "OK", "kind": "GRANT", "account_id": "acct-0001",
                                    "amount": amount, "txn_id": txn, "balance": amount}),
                _ => serde_json::Value::Null,
            },
            error: status.is_none().then(|| "timeout".to_owned()),
        };
        (
            line,
            if status == Some(201) {
                Event::Ok(completion)
            } else {
                Event::Info(completion)
            },
        )
    }

    fn setup() -> (usize, Event) {
        (
            1,
            Event::Setup {
                t_us: 0,
                seed: 1,
                clients: 1,
                duration_ms: 1,
                planted_bug: None,
                balances: [("acct-0001".to_owned(), 0)].into(),
            },
        )
    }

    /// A database holding `txns` grants to acct-0001 (key, txn id, amount), each recorded.
    fn state(txns: &[(&str, i64, i64)]) -> FinalState {
        let total: i64 = txns.iter().map(|t| t.2).sum();
        FinalState {
            accounts: vec![
                AccountRow {
                    account_id: "acct-0001".into(),
                    balance: total,
                    allow_negative: false,
                },
                AccountRow {
                    account_id: "sys-issuer".into(),
                    balance: -total,
                    allow_negative: true,
                },
            ],
            txns: txns
                .iter()
                .map(|(key, id, amount)| TxnRow {
                    txn_id: *id,
                    client_id: "c".into(),
                    idem_key: (*key).into(),
                    kind: "GRANT".into(),
                    entries: vec![
                        ("sys-issuer".into(), -amount),
                        ("acct-0001".into(), *amount),
                    ],
                })
                .collect(),
            requests: txns
                .iter()
                .map(|(key, id, _)| RequestRow {
                    client_id: "c".into(),
                    idem_key: (*key).into(),
                    outcome: "OK".into(),
                    txn_id: Some(*id),
                })
                .collect(),
        }
    }

    fn kinds(report: &Report) -> Vec<&'static str> {
        report.groups.iter().map(|g| g.kind).collect()
    }

    #[test]
    fn a_retry_replayed_after_a_lost_answer_is_clean() {
        let history = vec![
            setup(),
            invoke(2, 0, 1, "k0", 10),
            done(3, 0, 1, None, false, 0, 10),
            invoke(4, 0, 2, "k0", 10),
            done(5, 0, 2, Some(201), true, 7, 10),
        ];
        let report = check(&history, &state(&[("k0", 7, 10)]));
        assert_eq!(kinds(&report), Vec::<&str>::new());
        assert_eq!((report.counts.acknowledged, report.counts.replays), (1, 1));
    }

    #[test]
    fn a_second_execution_under_another_key_is_a_phantom_and_moves_the_balance() {
        let history = vec![
            setup(),
            invoke(2, 0, 1, "k0", 10),
            done(3, 0, 1, None, false, 0, 10),
            invoke(4, 0, 2, "k0", 10),
            done(5, 0, 2, Some(201), false, 8, 10),
        ];
        let report = check(&history, &state(&[("k0", 7, 10), ("k0+1", 8, 10)]));
        let found = kinds(&report);
        for kind in ["phantom-effect", "answer-mismatch", "balance-mismatch"] {
            assert!(found.contains(&kind), "{kind} in {found:?}");
        }
    }

    #[test]
    fn an_acknowledged_operation_without_effect_is_a_lost_ack() {
        let history = vec![
            setup(),
            invoke(2, 0, 1, "k0", 10),
            done(3, 0, 1, Some(201), false, 7, 10),
        ];
        let report = check(&history, &state(&[]));
        assert!(kinds(&report).contains(&"lost-ack"));
        assert!(kinds(&report).contains(&"balance-mismatch"));
    }

    #[test]
    fn a_tampered_balance_fails_reconciliation() {
        let history = vec![
            setup(),
            invoke(2, 0, 1, "k0", 10),
            done(3, 0, 1, Some(201), false, 7, 10),
        ];
        let mut final_state = state(&[("k0", 7, 10)]);
        final_state.accounts[0].balance += 5;
        let found = check(&history, &final_state);
        for kind in ["reconcile-balance", "reconcile-sum", "balance-mismatch"] {
            assert!(kinds(&found).contains(&kind), "{kind}");
        }
    }
}
