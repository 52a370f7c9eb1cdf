//! What every checker reads: the history's operations and the final database, indexed
//! by key, and the payload each transaction carries.

use std::collections::{BTreeMap, HashMap};

use super::Counts;
use super::recorded::{Op, Status};
use crate::plan::{Kind, Payload};
use crate::state::{FinalState, TxnRow};

/// A client id and an idempotency key.
pub(super) type Key<'a> = (&'a str, &'a str);

/// The history's operations and the final database, side by side.
pub(super) struct Facts<'a> {
    /// Every account's balance before the load, points.
    pub(super) initial: &'a BTreeMap<String, i64>,
    /// The operations, in `(client, op)` order.
    pub(super) ops: &'a [Op],
    /// The final database.
    pub(super) state: &'a FinalState,
    /// The operations of each key, in key order.
    pub(super) keys: BTreeMap<Key<'a>, Vec<&'a Op>>,
    /// The transactions of each key.
    effects: HashMap<Key<'a>, Vec<&'a TxnRow>>,
}

impl<'a> Facts<'a> {
    /// Indexes `ops` and `state` by key.
    pub(super) fn new(
        initial: &'a BTreeMap<String, i64>,
        ops: &'a [Op],
        state: &'a FinalState,
    ) -> Facts<'a> {
        let mut effects: HashMap<Key<'a>, Vec<&'a TxnRow>> = HashMap::new();
        for txn in &state.txns {
            effects
                .entry((txn.client_id.as_str(), txn.idem_key.as_str()))
                .or_default()
                .push(txn);
        }
        let mut keys: BTreeMap<Key<'a>, Vec<&'a Op>> = BTreeMap::new();
        for op in ops {
            keys.entry((op.client_id.as_str(), op.key.as_str()))
                .or_default()
                .push(op);
        }
        Facts {
            initial,
            ops,
            state,
            keys,
            effects,
        }
    }

    /// The transactions under `key` (none: empty).
    pub(super) fn effects(&self, key: Key<'a>) -> &[&'a TxnRow] {
        self.effects.get(&key).map_or(&[][..], Vec::as_slice)
    }

    /// The operations sent under `key` (none: empty).
    pub(super) fn key_ops(&self, key: Key<'a>) -> &[&'a Op] {
        self.keys.get(&key).map_or(&[][..], Vec::as_slice)
    }

    /// `op`'s effect: the transaction under its key that carries its payload, if any.
    pub(super) fn effect(&self, op: &'a Op) -> Option<&'a TxnRow> {
        self.effects((op.client_id.as_str(), op.key.as_str()))
            .iter()
            .find(|txn| effect_payload(txn).as_ref() == Some(&op.payload))
            .copied()
    }

    /// Counts the operations by how they ended (acknowledged, refused, unknown, unsent)
    /// and the unknown ones the database shows executed.
    pub(super) fn count_outcomes(&self, counts: &mut Counts) {
        for op in self.ops {
            match op.status() {
                Status::Acknowledged => counts.acknowledged += 1,
                Status::Refused => counts.refused += 1,
                Status::Unsent => counts.unsent += 1,
                Status::Unknown => {
                    counts.unknown += 1;
                    if self.effect(op).is_some() {
                        counts.unknown_executed += 1;
                    }
                }
            }
        }
    }
}

/// The payload an effect carries, read from its entries: a DEBIT takes `amount` from one
/// user account (to a system account), a GRANT gives it to one (from a system account).
/// `None` when the entries do not have that shape.
pub(super) fn effect_payload(txn: &TxnRow) -> Option<Payload> {
    let users: Vec<&(String, i64)> = txn
        .entries
        .iter()
        .filter(|(account, _)| !account.starts_with("sys-"))
        .collect();
    let [(account, amount)] = users.as_slice() else {
        return None;
    };
    let (kind, amount) = match txn.kind.as_str() {
        "DEBIT" if *amount < 0 => (Kind::Debit, -amount),
        "GRANT" if *amount > 0 => (Kind::Grant, *amount),
        _ => return None,
    };
    Some(Payload {
        kind,
        account: account.clone(),
        amount,
    })
}

/// The history lines of every attempt of `ops`, operation by operation.
pub(super) fn lines_of(ops: &[&Op]) -> Vec<usize> {
    ops.iter().flat_map(|op| op.lines()).collect()
}
