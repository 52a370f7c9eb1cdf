//! `reconcile-*`: the ledger's own invariants (SPEC §2 I3, I4, the request links, no
//! committed PENDING, a zero global sum), recomputed from the raw rows of the final
//! database. They need no history: every finding names no line.

use std::collections::HashMap;

use super::facts::{Facts, Key};
use super::finding::{Anchor, Finding};

/// Every transaction is balanced: at least two entries, summing to 0. A violation
/// (`reconcile-txn`) is a transaction with fewer entries or another sum.
pub(super) fn txns_balanced(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, txn) in facts.state.txns.iter().enumerate() {
        let total: i64 = txn.entries.iter().map(|(_, amount)| amount).sum();
        if txn.entries.len() < 2 || total != 0 {
            found.push(Finding::new(
                Anchor::TxnEntries(index),
                "reconcile-txn",
                format!(
                    "txn {} has {} entries summing to {total}",
                    txn.txn_id,
                    txn.entries.len()
                ),
                Vec::new(),
            ));
        }
    }
    found
}

/// Every account's stored balance is the sum of its entries. A violation
/// (`reconcile-balance`) is a balance its entries do not explain.
pub(super) fn balances_match_entries(facts: &Facts) -> Vec<Finding> {
    let mut sums: HashMap<&str, i64> = HashMap::new();
    for txn in &facts.state.txns {
        for (account, amount) in &txn.entries {
            *sums.entry(account.as_str()).or_default() += amount;
        }
    }
    let mut found = Vec::new();
    for (index, account) in facts.state.accounts.iter().enumerate() {
        let recomputed = sums.get(account.account_id.as_str()).copied().unwrap_or(0);
        if recomputed != account.balance {
            found.push(Finding::new(
                Anchor::AccountEntries(index),
                "reconcile-balance",
                format!(
                    "{}: stored balance {} but its entries sum to {recomputed}",
                    account.account_id, account.balance
                ),
                Vec::new(),
            ));
        }
    }
    found
}

/// Points are neither made nor destroyed: the balances of all accounts (system ones
/// included) sum to 0. A violation (`reconcile-sum`) names the sum.
pub(super) fn balances_sum_to_zero(facts: &Facts) -> Vec<Finding> {
    let global: i64 = facts.state.accounts.iter().map(|a| a.balance).sum();
    if global == 0 {
        return Vec::new();
    }
    vec![Finding::new(
        Anchor::GlobalSum,
        "reconcile-sum",
        format!("the balances of all accounts sum to {global}, not 0"),
        Vec::new(),
    )]
}

/// No request is committed half done: no idempotency record is left `PENDING`. A
/// violation (`reconcile-pending`) names the key.
pub(super) fn nothing_pending(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, request) in facts.state.requests.iter().enumerate() {
        if request.outcome == "PENDING" {
            found.push(Finding::new(
                Anchor::Request(index),
                "reconcile-pending",
                format!(
                    "{} key {} is committed as PENDING",
                    request.client_id, request.idem_key
                ),
                Vec::new(),
            ));
        }
    }
    found
}

/// Records and transactions name each other: every `OK` record names its key's
/// transaction, and every transaction has an `OK` record naming it. A violation
/// (`reconcile-link`) is a record naming no or another transaction, or a transaction
/// no record names.
pub(super) fn records_link_txns(facts: &Facts) -> Vec<Finding> {
    let txn_by_key: HashMap<Key, i64> = facts
        .state
        .txns
        .iter()
        .map(|t| ((t.client_id.as_str(), t.idem_key.as_str()), t.txn_id))
        .collect();
    let mut found = Vec::new();
    for (index, request) in facts.state.requests.iter().enumerate() {
        let key = (request.client_id.as_str(), request.idem_key.as_str());
        let linked = request.txn_id.is_some() && request.txn_id == txn_by_key.get(&key).copied();
        if request.outcome == "OK" && !linked {
            found.push(Finding::new(
                Anchor::Request(index),
                "reconcile-link",
                format!(
                    "{} key {} is recorded OK with txn {:?}, but the key's transaction is {:?}",
                    request.client_id,
                    request.idem_key,
                    request.txn_id,
                    txn_by_key.get(&key)
                ),
                Vec::new(),
            ));
        }
    }
    found.extend(unrecorded_txns(facts));
    found
}

/// Every transaction whose key's record does not name it.
fn unrecorded_txns(facts: &Facts) -> Vec<Finding> {
    let recorded: HashMap<Key, Option<i64>> = facts
        .state
        .requests
        .iter()
        .map(|r| ((r.client_id.as_str(), r.idem_key.as_str()), r.txn_id))
        .collect();
    let mut found = Vec::new();
    for (index, txn) in facts.state.txns.iter().enumerate() {
        let key = (txn.client_id.as_str(), txn.idem_key.as_str());
        if recorded.get(&key).copied().flatten() != Some(txn.txn_id) {
            found.push(Finding::new(
                Anchor::TxnRecord(index),
                "reconcile-link",
                format!(
                    "txn {} ({} key {}) has no OK record naming it",
                    txn.txn_id, txn.client_id, txn.idem_key
                ),
                Vec::new(),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::Checker;
    use super::super::fixtures::{Script, debit, grant, kinds, ledger, run};
    use super::*;
    use crate::state::FinalState;

    const ALL: [Checker; 5] = [
        txns_balanced,
        balances_match_entries,
        balances_sum_to_zero,
        nothing_pending,
        records_link_txns,
    ];

    /// A ledger of a grant and a debit.
    fn two_txns() -> FinalState {
        ledger(&[("k0", 1, &grant(10)), ("k1", 2, &debit(4))])
    }

    #[test]
    fn a_consistent_ledger_passes_every_reconciliation() {
        let state = two_txns();
        for checker in ALL {
            assert_eq!(
                kinds(&run(checker, &Script::new(), &state)),
                Vec::<&str>::new()
            );
        }
    }

    #[test]
    fn a_transaction_with_one_entry_is_caught() {
        let mut state = two_txns();
        state.txns[1].entries.pop();
        let found = run(txns_balanced, &Script::new(), &state);
        assert_eq!(kinds(&found), ["reconcile-txn"]);
        assert_eq!(found[0].summary, "txn 2 has 1 entries summing to -4");
    }

    #[test]
    fn a_tampered_balance_is_caught_and_breaks_the_sum() {
        let mut state = two_txns();
        state.accounts[0].balance += 5;
        let found = run(balances_match_entries, &Script::new(), &state);
        assert_eq!(kinds(&found), ["reconcile-balance"]);
        assert_eq!(
            found[0].summary,
            "acct-0001: stored balance 11 but its entries sum to 6"
        );
        let found = run(balances_sum_to_zero, &Script::new(), &state);
        assert_eq!(kinds(&found), ["reconcile-sum"]);
        assert!(found[0].summary.contains("sum to 5, not 0"));
    }

    #[test]
    fn a_committed_pending_record_is_caught() {
        let mut state = two_txns();
        state.requests[0].outcome = "PENDING".into();
        let found = run(nothing_pending, &Script::new(), &state);
        assert_eq!(kinds(&found), ["reconcile-pending"]);
    }

    #[test]
    fn a_record_naming_another_transaction_is_caught_from_both_sides() {
        let mut state = two_txns();
        state.requests[0].txn_id = Some(99);
        let found = run(records_link_txns, &Script::new(), &state);
        assert_eq!(kinds(&found), ["reconcile-link", "reconcile-link"]);
        assert_eq!(
            found.iter().map(|f| f.at).collect::<Vec<_>>(),
            [Anchor::Request(0), Anchor::TxnRecord(0)]
        );
    }
}
