//! `negative-balance`: no overdraft.

use super::facts::Facts;
use super::finding::{Anchor, Finding};

/// No overdraft: no answer reports a negative balance, and no account that does not
/// allow one ends negative in the final database. A violation (`negative-balance`) is
/// such an answer (its line) or such an account (no history line: the database shows
/// it).
pub(super) fn no_negative_balance(facts: &Facts) -> Vec<Finding> {
    let mut found = negative_answers(facts);
    found.extend(negative_final_balances(facts));
    found
}

/// Every answer whose body reports a negative `balance`, at its operation's answer.
fn negative_answers(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, op) in facts.ops.iter().enumerate() {
        for (n, (line, _, completion)) in op.completions().enumerate() {
            let Some(balance) = completion.body["balance"].as_i64() else {
                continue;
            };
            if balance >= 0 {
                continue;
            }
            found.push(Finding::new(
                Anchor::Op {
                    op: index,
                    step: n + 1,
                },
                "negative-balance",
                format!(
                    "an answer for {} key {} reported balance {balance} of {}",
                    op.client_id, op.key, op.payload.account
                ),
                vec![line],
            ));
        }
    }
    found
}

/// Every account of the final database below 0 that does not allow it.
fn negative_final_balances(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, account) in facts.state.accounts.iter().enumerate() {
        if account.balance < 0 && !account.allow_negative {
            found.push(Finding::new(
                Anchor::Account(index),
                "negative-balance",
                format!(
                    "{} ends with balance {} in the database",
                    account.account_id, account.balance
                ),
                Vec::new(),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Script, debit, grant, kinds, ledger, run};
    use super::*;

    #[test]
    fn a_debit_within_the_balance_passes() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 1, 10, false)
            .invoke(1, "k1", &debit(4))
            .ok(1, 2, 6, false);
        let state = ledger(&[("k0", 1, &grant(10)), ("k1", 2, &debit(4))]);
        // The system accounts are below 0 too, and allowed to be.
        assert!(state.accounts.iter().any(|a| a.balance < 0));
        assert_eq!(
            kinds(&run(no_negative_balance, &history, &state)),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn an_answer_reporting_a_negative_balance_is_caught() {
        let history = Script::new().invoke(0, "k0", &debit(4)).ok(0, 1, -4, false);
        let found = run(no_negative_balance, &history, &ledger(&[]));
        assert_eq!(kinds(&found), ["negative-balance"]);
        assert_eq!(found[0].lines, [3]);
    }

    #[test]
    fn an_account_ending_below_zero_is_caught() {
        let history = Script::new().invoke(0, "k0", &debit(4)).timeout(0);
        let found = run(
            no_negative_balance,
            &history,
            &ledger(&[("k0", 1, &debit(4))]),
        );
        assert_eq!(kinds(&found), ["negative-balance"]);
        assert_eq!(found[0].at, Anchor::Account(0));
        assert!(found[0].summary.contains("acct-0001 ends with balance -4"));
    }
}
