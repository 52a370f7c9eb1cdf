//! `phantom-effect`: every effect was asked for.

use super::facts::{Facts, effect_payload, lines_of};
use super::finding::{Anchor, Finding};
use crate::plan::Payload;
use crate::state::TxnRow;

/// Every effect was asked for: each transaction's key was sent by an operation with the
/// payload its entries carry. A violation (`phantom-effect`) is a transaction nobody
/// asked for; its excerpt is every attempt under its key, or — when the key was never
/// sent — this client's operations with the same payload (what could have produced it).
pub(super) fn every_effect_asked_for(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, txn) in facts.state.txns.iter().enumerate() {
        let key_ops = facts.key_ops((txn.client_id.as_str(), txn.idem_key.as_str()));
        let payload = effect_payload(txn);
        if key_ops
            .iter()
            .any(|op| Some(&op.payload) == payload.as_ref())
        {
            continue;
        }
        let lines = if key_ops.is_empty() {
            suspect_lines(facts, txn, payload.as_ref())
        } else {
            lines_of(key_ops)
        };
        found.push(Finding::new(
            Anchor::Txn(index),
            "phantom-effect",
            summary(txn, payload.as_ref(), key_ops.is_empty()),
            lines,
        ));
    }
    found
}

/// The lines of what could have produced `txn`: its client's operations with `payload`.
fn suspect_lines(facts: &Facts, txn: &TxnRow, payload: Option<&Payload>) -> Vec<usize> {
    facts
        .ops
        .iter()
        .filter(|op| op.client_id == txn.client_id && Some(&op.payload) == payload)
        .flat_map(|op| op.lines())
        .collect()
}

/// `txn … (client key …, payload) was asked for by no operation: why`.
fn summary(txn: &TxnRow, payload: Option<&Payload>, key_never_sent: bool) -> String {
    format!(
        "txn {} ({} key {}, {}) was asked for by no operation: {}",
        txn.txn_id,
        txn.client_id,
        txn.idem_key,
        payload.map_or("entries of another shape".to_owned(), |p| format!(
            "{} {} {}",
            p.kind.as_str(),
            p.account,
            p.amount
        )),
        if key_never_sent {
            "no operation sent this key (shown: this client's operations with the same payload)"
        } else {
            "its key was sent, never with this payload"
        }
    )
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Script, grant, kinds, ledger, run};
    use super::*;

    #[test]
    fn a_transaction_asked_for_under_its_key_passes() {
        let history = Script::new().invoke(0, "k0", &grant(10)).timeout(0);
        let found = run(
            every_effect_asked_for,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), Vec::<&str>::new());
    }

    #[test]
    fn a_transaction_under_a_key_never_sent_is_caught() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false);
        let state = ledger(&[("k0", 7, &grant(10)), ("k0+1", 8, &grant(10))]);
        let found = run(every_effect_asked_for, &history, &state);
        assert_eq!(kinds(&found), ["phantom-effect"]);
        assert_eq!(found[0].at, Anchor::Txn(1));
        // The suspects: this client's operations with the same payload.
        assert_eq!(found[0].lines, [2, 3]);
        assert!(found[0].summary.contains("no operation sent this key"));
    }

    #[test]
    fn a_transaction_with_another_payload_than_its_key_was_sent_with_is_caught() {
        let history = Script::new().invoke(0, "k0", &grant(10)).timeout(0);
        let found = run(
            every_effect_asked_for,
            &history,
            &ledger(&[("k0", 7, &grant(12))]),
        );
        assert_eq!(kinds(&found), ["phantom-effect"]);
        assert!(
            found[0]
                .summary
                .ends_with("its key was sent, never with this payload")
        );
    }
}
