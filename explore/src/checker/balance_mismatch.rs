//! `balance-mismatch`: conservation — the final balances are what the history says.

use super::facts::Facts;
use super::finding::{Anchor, Finding};
use super::recorded::{Op, Status};

/// Conservation: each user account's final balance is its initial balance plus the
/// acknowledged operations on it plus the unknown ones the database shows executed.
/// A violation (`balance-mismatch`, with every operation on the account) is a final
/// balance that differs: points appeared or vanished outside what the clients were told
/// (or could not know).
pub(super) fn balances_add_up(facts: &Facts) -> Vec<Finding> {
    let mut expected = facts.initial.clone();
    for op in facts.ops {
        if counts_toward_balance(facts, op) {
            *expected.entry(op.payload.account.clone()).or_default() += op.payload.delta();
        }
    }
    let mut found = Vec::new();
    for (index, account) in facts.state.accounts.iter().enumerate() {
        if account.account_id.starts_with("sys-") {
            continue;
        }
        let Some(want) = expected.get(&account.account_id) else {
            continue;
        };
        if *want == account.balance {
            continue;
        }
        let lines: Vec<usize> = facts
            .ops
            .iter()
            .filter(|op| op.payload.account == account.account_id)
            .flat_map(|op| op.lines())
            .collect();
        found.push(Finding::new(
            Anchor::Account(index),
            "balance-mismatch",
            format!(
                "{} ends at {} points; the history says {} (initial {} + acknowledged and \
                 executed unknown operations), a difference of {}",
                account.account_id,
                account.balance,
                want,
                facts.initial.get(&account.account_id).copied().unwrap_or(0),
                account.balance - want
            ),
            lines,
        ));
    }
    found
}

/// Whether `op` moved its account's balance as far as the history and the database
/// tell: it was acknowledged, or its outcome is unknown and the database holds its
/// effect.
fn counts_toward_balance<'a>(facts: &Facts<'a>, op: &'a Op) -> bool {
    match op.status() {
        Status::Acknowledged => true,
        Status::Unknown => facts.effect(op).is_some(),
        Status::Refused | Status::Unsent => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Script, debit, grant, kinds, ledger, run};
    use super::*;

    #[test]
    fn acknowledged_and_executed_unknown_operations_add_up() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 1, 10, false)
            .invoke(1, "k1", &debit(3))
            .timeout(1)
            .invoke(2, "k2", &debit(50))
            .insufficient(2);
        let state = ledger(&[("k0", 1, &grant(10)), ("k1", 2, &debit(3))]);
        assert_eq!(
            kinds(&run(balances_add_up, &history, &state)),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn a_balance_the_history_does_not_explain_is_caught() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 1, 10, false);
        let mut state = ledger(&[("k0", 1, &grant(10))]);
        state.accounts[0].balance = 15;
        let found = run(balances_add_up, &history, &state);
        assert_eq!(kinds(&found), ["balance-mismatch"]);
        assert!(found[0].summary.ends_with("a difference of 5"));
        assert_eq!(found[0].lines, [2, 3]);
    }
}
