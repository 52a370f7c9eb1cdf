//! `answer-mismatch`: a 201 tells the truth about its request.

use super::facts::Facts;
use super::finding::{Anchor, Finding};

/// Every 201 names its own request (the account, kind and amount that were sent) and
/// the key's effect (the txn id of the transaction carrying the operation's payload,
/// when there is one). A violation (`answer-mismatch`, with the operation's attempts)
/// is a 201 that names another request or another transaction.
pub(super) fn acknowledgements_match(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, op) in facts.ops.iter().enumerate() {
        let effect = facts.effect(op);
        for (n, (_, kind, completion)) in op.completions().enumerate() {
            if kind != "ok" {
                continue;
            }
            let body = &completion.body;
            let names_request = body["account_id"].as_str() == Some(&op.payload.account)
                && body["amount"].as_i64() == Some(op.payload.amount)
                && body["kind"].as_str() == Some(op.payload.kind.as_str());
            let txn_id = body["txn_id"].as_i64();
            let matches_effect = effect.is_none_or(|txn| Some(txn.txn_id) == txn_id);
            if names_request && matches_effect {
                continue;
            }
            found.push(Finding::new(
                Anchor::Op {
                    op: index,
                    step: n + 1,
                },
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
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Script, grant, kinds, ledger, run};
    use super::*;

    #[test]
    fn a_201_naming_its_request_and_effect_passes() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false);
        let found = run(
            acknowledgements_match,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), Vec::<&str>::new());
    }

    #[test]
    fn a_201_naming_another_transaction_is_caught() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 8, 10, false);
        let found = run(
            acknowledgements_match,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), ["answer-mismatch"]);
        assert!(
            found[0]
                .summary
                .ends_with("the key's effect is txn Some(7)")
        );
    }

    #[test]
    fn a_201_naming_another_amount_is_caught() {
        let history = Script::new().invoke(0, "k0", &grant(10));
        let mut body = history.body(0, "OK", 7, 11);
        body["amount"] = 11.into();
        let history = history.answer(0, Some(201), false, body, None);
        let found = run(acknowledgements_match, &history, &ledger(&[]));
        assert_eq!(kinds(&found), ["answer-mismatch"]);
    }
}
