//! `replay-mismatch`: a key always gets the same answer.

use std::collections::BTreeSet;

use super::facts::{Facts, lines_of};
use super::finding::{Anchor, Finding};
use crate::history::Completion;

/// Every answer for a key (201, 404 or 409, fresh or replayed) equals the first: same
/// status, outcome, txn id, balance, kind, account and amount. A violation
/// (`replay-mismatch`, with every attempt under the key, listing the different answers)
/// is a retry told something else than the first attempt.
pub(super) fn replays_equal_first_answer(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, ((client_id, key), key_ops)) in facts.keys.iter().enumerate() {
        let answers: BTreeSet<String> = key_ops
            .iter()
            .flat_map(|op| op.completions())
            .filter(|(_, _, c)| matches!(c.status, Some(201 | 404 | 409)))
            .map(|(_, _, c)| answer_text(c))
            .collect();
        if answers.len() > 1 {
            found.push(Finding::new(
                Anchor::Key(index),
                "replay-mismatch",
                format!(
                    "{client_id} key {key} got {} different answers: {}",
                    answers.len(),
                    answers.into_iter().collect::<Vec<_>>().join(" | ")
                ),
                lines_of(key_ops),
            ));
        }
    }
    found
}

/// What an answer says, as compared between answers: `status outcome txn=… balance=…
/// kind account amount`.
fn answer_text(completion: &Completion) -> String {
    let body = &completion.body;
    format!(
        "{} {} txn={} balance={} {} {} {}",
        completion.status.unwrap_or(0),
        body["outcome"].as_str().unwrap_or(""),
        body["txn_id"],
        body["balance"],
        body["kind"].as_str().unwrap_or(""),
        body["account_id"].as_str().unwrap_or(""),
        body["amount"]
    )
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Script, grant, kinds, ledger, run};
    use super::*;

    #[test]
    fn a_replay_equal_to_the_first_answer_passes() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false)
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, true);
        let found = run(
            replays_equal_first_answer,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), Vec::<&str>::new());
    }

    #[test]
    fn a_replay_with_another_balance_is_caught() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false)
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 20, true);
        let found = run(
            replays_equal_first_answer,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), ["replay-mismatch"]);
        assert!(found[0].summary.contains("got 2 different answers"));
    }

    #[test]
    fn a_refusal_after_a_201_is_caught() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false)
            .invoke(0, "k0", &grant(10))
            .insufficient(0);
        let found = run(
            replays_equal_first_answer,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), ["replay-mismatch"]);
    }
}
