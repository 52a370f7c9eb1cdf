//! `refused-but-executed`: a refused or unsent operation leaves no trace.

use super::facts::Facts;
use super::finding::{Anchor, Finding};
use super::recorded::Status;

/// No refused operation (an attempt got 409, 404 or 422) and no unsent one (nothing
/// ever reached the service) took effect. A violation (`refused-but-executed`, with the
/// operation's attempts) is a transaction under the operation's key carrying its
/// payload: the client was told no, or never asked, and the points moved anyway.
pub(super) fn refused_took_no_effect(facts: &Facts) -> Vec<Finding> {
    let mut found = Vec::new();
    for (index, op) in facts.ops.iter().enumerate() {
        let was = match op.status() {
            Status::Refused => "refused",
            Status::Unsent => "never sent",
            Status::Acknowledged | Status::Unknown => continue,
        };
        let Some(txn) = facts.effect(op) else {
            continue;
        };
        found.push(Finding::new(
            Anchor::Op { op: index, step: 0 },
            "refused-but-executed",
            format!(
                "{} key {} {} {} {} was {} but took effect as txn {}",
                op.client_id,
                op.key,
                op.payload.kind.as_str(),
                op.payload.account,
                op.payload.amount,
                was,
                txn.txn_id
            ),
            op.lines(),
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Script, debit, kinds, ledger, run};
    use super::*;

    #[test]
    fn a_refused_debit_that_left_no_transaction_passes() {
        let history = Script::new().invoke(0, "k0", &debit(5)).insufficient(0);
        let found = run(refused_took_no_effect, &history, &ledger(&[]));
        assert_eq!(kinds(&found), Vec::<&str>::new());
    }

    #[test]
    fn a_refused_debit_that_took_effect_is_caught() {
        let history = Script::new().invoke(0, "k0", &debit(5)).insufficient(0);
        let found = run(
            refused_took_no_effect,
            &history,
            &ledger(&[("k0", 3, &debit(5))]),
        );
        assert_eq!(kinds(&found), ["refused-but-executed"]);
        assert!(
            found[0]
                .summary
                .contains("was refused but took effect as txn 3")
        );
    }

    #[test]
    fn an_unsent_debit_that_took_effect_is_caught() {
        let history = Script::new().invoke(0, "k0", &debit(5)).unsent(0);
        let found = run(
            refused_took_no_effect,
            &history,
            &ledger(&[("k0", 3, &debit(5))]),
        );
        assert_eq!(kinds(&found), ["refused-but-executed"]);
        assert!(found[0].summary.contains("was never sent"));
    }
}
