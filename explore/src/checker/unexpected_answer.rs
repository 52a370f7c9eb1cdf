//! `unexpected-answer`: every answer stays in the contract.

use super::facts::Facts;
use super::finding::{Anchor, Finding};

/// Every answer stays in the service's contract: its status is 201, 404, 408, 409, 422
/// or a 5xx, and a 201, 409, 404 or 422 carries the outcome that goes with it (`OK`,
/// `INSUFFICIENT`, `NO_ACCOUNT`, `KEY_REUSED`). A violation (`unexpected-answer`, with
/// the answer's line) is any other status, or a mismatched outcome.
pub(super) fn answers_in_contract(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, op) in facts.ops.iter().enumerate() {
        for (n, (line, _, completion)) in op.completions().enumerate() {
            let Some(status) = completion.status else {
                continue;
            };
            let outcome = completion.body["outcome"].as_str().unwrap_or("");
            let in_contract = matches!(status, 201 | 404 | 408 | 409 | 422 | 500..=599);
            if in_contract && expected_outcome(status).is_none_or(|e| e == outcome) {
                continue;
            }
            found.push(Finding::new(
                Anchor::Op {
                    op: index,
                    step: n + 1,
                },
                "unexpected-answer",
                format!(
                    "{} key {}: status {status} with outcome {outcome:?}",
                    op.client_id, op.key
                ),
                vec![line],
            ));
        }
    }
    found
}

/// The outcome an answer with `status` carries, for the statuses that name one.
fn expected_outcome(status: u16) -> Option<&'static str> {
    match status {
        201 => Some("OK"),
        409 => Some("INSUFFICIENT"),
        404 => Some("NO_ACCOUNT"),
        422 => Some("KEY_REUSED"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::fixtures::{Script, debit, kinds, ledger, run};
    use super::*;

    #[test]
    fn answers_of_the_contract_pass() {
        let history = Script::new()
            .invoke(0, "k0", &debit(5))
            .answer(0, Some(503), false, Value::Null, None)
            .invoke(0, "k0", &debit(5))
            .insufficient(0);
        let found = run(answers_in_contract, &history, &ledger(&[]));
        assert_eq!(kinds(&found), Vec::<&str>::new());
    }

    #[test]
    fn a_status_outside_the_contract_is_caught() {
        let history =
            Script::new()
                .invoke(0, "k0", &debit(5))
                .answer(0, Some(418), false, Value::Null, None);
        let found = run(answers_in_contract, &history, &ledger(&[]));
        assert_eq!(kinds(&found), ["unexpected-answer"]);
        assert_eq!(found[0].lines, [3]);
    }

    #[test]
    fn a_refusal_with_the_wrong_outcome_is_caught() {
        let body = json!({"outcome": "OK", "balance": 0});
        let history =
            Script::new()
                .invoke(0, "k0", &debit(5))
                .answer(0, Some(409), false, body, None);
        let found = run(answers_in_contract, &history, &ledger(&[]));
        assert_eq!(kinds(&found), ["unexpected-answer"]);
        assert!(found[0].summary.contains("status 409 with outcome \"OK\""));
    }
}
