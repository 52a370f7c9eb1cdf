//! `executed-twice`: at most once per idempotency key.

use super::facts::{Facts, lines_of};
use super::finding::{Anchor, Finding};

/// At most once per idempotency key: a key executes fresh at most once (one answer
/// 201, 404 or 409 without `Idempotent-Replayed`; the others are replays) and has at
/// most one transaction. A violation (`executed-twice`, with every attempt under the
/// key) is a second fresh execution or a second transaction: a retry moved points again.
pub(super) fn at_most_once_per_key(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, ((client_id, key), key_ops)) in facts.keys.iter().enumerate() {
        let fresh = key_ops
            .iter()
            .flat_map(|op| op.completions())
            .filter(|(_, _, c)| matches!(c.status, Some(201 | 404 | 409)) && !c.replayed)
            .count();
        let txns = facts.effects((client_id, key));
        if fresh > 1 || txns.len() > 1 {
            found.push(Finding::new(
                Anchor::Key(index),
                "executed-twice",
                format!(
                    "{client_id} key {key} was executed fresh {fresh} times (answers without \
                     Idempotent-Replayed) and has {} transactions",
                    txns.len()
                ),
                lines_of(key_ops),
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
    fn a_retry_answered_as_a_replay_passes() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .timeout(0)
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, true);
        let found = run(
            at_most_once_per_key,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), Vec::<&str>::new());
    }

    #[test]
    fn a_retry_executed_fresh_again_is_caught() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false)
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false);
        let found = run(
            at_most_once_per_key,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), ["executed-twice"]);
        assert_eq!(found[0].lines, [2, 3, 4, 5]);
    }

    #[test]
    fn a_key_with_two_transactions_is_caught() {
        let history = Script::new().invoke(0, "k0", &grant(10)).timeout(0);
        let state = ledger(&[("k0", 7, &grant(10)), ("k0", 8, &grant(10))]);
        let found = run(at_most_once_per_key, &history, &state);
        assert_eq!(kinds(&found), ["executed-twice"]);
        assert!(
            found[0].summary.contains("fresh 0 times")
                && found[0].summary.ends_with("has 2 transactions")
        );
    }
}
