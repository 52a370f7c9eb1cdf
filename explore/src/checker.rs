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
//!
//! Each property is one checker, in a file named after its kind (`checker/lost_ack.rs`,
//! …, `checker/reconcile.rs` for the five `reconcile-*`), reading the history's
//! operations and the final database side by side ([`facts`]); [`check`] runs them all
//! and merges their findings in history order.

mod answer_mismatch;
mod balance_mismatch;
mod executed_twice;
mod facts;
mod finding;
#[cfg(test)]
mod fixtures;
mod lost_ack;
mod negative_balance;
mod phantom_effect;
mod reconcile;
mod recorded;
mod refused_but_executed;
mod replay_mismatch;
mod reuse_executed;
mod unexpected_answer;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::history::Event;
use crate::state::FinalState;
use facts::Facts;
use finding::Finding;
use recorded::Recorded;

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

/// One checker: every violation of its property in the history and the final database.
type Checker = fn(&Facts) -> Vec<Finding>;

/// Every checker. Findings of one moment are reported in this order among findings of
/// one operation, key, transaction or account (see [`finding::Anchor`]).
const CHECKERS: [Checker; 15] = [
    lost_ack::acknowledged_took_effect,
    refused_but_executed::refused_took_no_effect,
    negative_balance::no_negative_balance,
    unexpected_answer::answers_in_contract,
    answer_mismatch::acknowledgements_match,
    executed_twice::at_most_once_per_key,
    replay_mismatch::replays_equal_first_answer,
    reuse_executed::one_payload_per_key,
    phantom_effect::every_effect_asked_for,
    balance_mismatch::balances_add_up,
    reconcile::txns_balanced,
    reconcile::balances_match_entries,
    reconcile::balances_sum_to_zero,
    reconcile::nothing_pending,
    reconcile::records_link_txns,
];

/// Checks `events` (the history, with line numbers) against `state` (the final
/// database): runs every checker and reports their violations in history order (the
/// earliest first; of one moment, in the checkers' walk order), grouped by kind.
pub fn check(events: &[(usize, Event)], state: &FinalState) -> Report {
    let recorded = Recorded::read(events);
    let facts = Facts::new(&recorded.initial, &recorded.ops, state);
    let mut counts = recorded.counts.clone();
    facts.count_outcomes(&mut counts);
    let mut findings: Vec<(usize, Finding)> = Vec::new();
    for (rank, checker) in CHECKERS.iter().enumerate() {
        findings.extend(checker(&facts).into_iter().map(|found| (rank, found)));
    }
    // Findings of one moment come in the walk order (operations, keys, transactions,
    // accounts, the ledger), then in the order of CHECKERS; both sorts are stable.
    findings.sort_by_key(|(rank, found)| (found.at, *rank));
    let mut violations: Vec<Violation> = findings
        .into_iter()
        .map(|(_, found)| recorded.violation(found))
        .collect();
    violations.sort_by_key(|v| v.t_us);
    let groups = group_by_kind(&violations);
    Report {
        counts,
        violations,
        groups,
    }
}

/// The violations by kind, in the order of their first occurrence in `violations`
/// (which are in history order): each with its count, first and smallest excerpt (the
/// earliest among equals).
fn group_by_kind(violations: &[Violation]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for violation in violations {
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
    groups
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
    use crate::plan::{Kind, Payload};
    use crate::state::{AccountRow, RequestRow, TxnRow};
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
                topology: None,
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
    fn findings_of_one_moment_come_in_the_walk_order() {
        // Two accounts without operations, both off: every finding names no line, so
        // all are at the history's end, and come account by account.
        let history = fixtures::Script::starting(&[("acct-0001", 0), ("acct-0002", 0)]);
        let mut final_state = fixtures::ledger(&[]);
        final_state.accounts[0].balance = 5;
        final_state.accounts.push(AccountRow {
            account_id: "acct-0002".into(),
            balance: -3,
            allow_negative: false,
        });
        let report = check(history.events(), &final_state);
        let found: Vec<(&str, &str)> = report
            .violations
            .iter()
            .map(|v| (v.kind, &v.summary[..9]))
            .collect();
        assert_eq!(
            found,
            [
                ("balance-mismatch", "acct-0001"),
                ("negative-balance", "acct-0002"),
                ("balance-mismatch", "acct-0002"),
                ("reconcile-balance", "acct-0001"),
                ("reconcile-balance", "acct-0002"),
                ("reconcile-sum", "the balan"),
            ]
        );
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
