//! `reuse-executed`: a key reused with another payload is acknowledged at most once.

use std::collections::BTreeSet;

use super::facts::{Facts, lines_of};
use super::finding::{Anchor, Finding};
use super::recorded::Status;
use crate::plan::Payload;

/// One payload per key: when a client reuses a key with another payload, at most one
/// of the payloads is acknowledged (the other gets 422 `KEY_REUSED` or a replay of the
/// first). A violation (`reuse-executed`, with every attempt under the key) is two
/// different payloads under one key both acknowledged.
pub(super) fn one_payload_per_key(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, ((client_id, key), key_ops)) in facts.keys.iter().enumerate() {
        let acknowledged: BTreeSet<&Payload> = key_ops
            .iter()
            .filter(|op| op.status() == Status::Acknowledged)
            .map(|op| &op.payload)
            .collect();
        if acknowledged.len() > 1 {
            found.push(Finding::new(
                Anchor::Key(index),
                "reuse-executed",
                format!(
                    "{client_id} key {key} was acknowledged for {} different payloads",
                    acknowledged.len()
                ),
                lines_of(key_ops),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::fixtures::{Script, grant, kinds, ledger, run};
    use super::*;

    #[test]
    fn a_reused_key_refused_as_key_reused_passes() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false)
            .invoke(1, "k0", &grant(20))
            .answer(1, Some(422), false, json!({"outcome": "KEY_REUSED"}), None);
        let found = run(
            one_payload_per_key,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), Vec::<&str>::new());
    }

    #[test]
    fn a_reused_key_acknowledged_for_both_payloads_is_caught() {
        let history = Script::new()
            .invoke(0, "k0", &grant(10))
            .ok(0, 7, 10, false)
            .invoke(1, "k0", &grant(20))
            .ok(1, 8, 30, false);
        let found = run(
            one_payload_per_key,
            &history,
            &ledger(&[("k0", 7, &grant(10))]),
        );
        assert_eq!(kinds(&found), ["reuse-executed"]);
        assert_eq!(found[0].lines, [2, 3, 4, 5]);
    }
}
