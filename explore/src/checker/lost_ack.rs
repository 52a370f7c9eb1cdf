//! `lost-ack`: an acknowledged write is never lost.

use super::facts::Facts;
use super::finding::{Anchor, Finding};
use super::recorded::Status;

/// Every acknowledged operation (an attempt got 201) took effect: a transaction under
/// its key carries its payload. A violation (`lost-ack`, with the operation's attempts)
/// is a 201 with no such transaction: the ledger confirmed a write it does not hold.
pub(super) fn acknowledged_took_effect(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, op) in facts.ops.iter().enumerate() {
        if op.status() != Status::Acknowledged || facts.effect(op).is_some() {
            continue;
        }
        found.push(Finding::new(
            Anchor::Op { op: index, step: 0 },
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
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Script, grant, kinds, ledger, run};
    use super::*;

    #[test]
    fn an_acknowledged_grant_held_by_the_ledger_passes() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false);
        let found = run(
            acknowledged_took_effect,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), Vec::<&str>::new());
    }

    #[test]
    fn an_acknowledged_grant_missing_from_the_ledger_is_caught() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false);
        let found = run(acknowledged_took_effect, &history, &ledger(&[]));
        assert_eq!(kinds(&found), ["lost-ack"]);
        assert_eq!(found[0].lines, [2, 3]);
    }

    #[test]
    fn a_transaction_with_another_payload_does_not_count() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false);
        let found = run(
            acknowledged_took_effect,
            &history,
            &ledger(&[("k0", 7, &grant(11))]),
        );
        assert_eq!(kinds(&found), ["lost-ack"]);
    }
}
