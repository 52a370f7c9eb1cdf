//! What one checker finds, before the excerpt is completed with the faults under way.

/// Where in the checker's walk of the history and the database a finding belongs: the
/// operations (in `(client, op)` order), then the keys (in `(client id, key)` order), the
/// transactions, the accounts, and last the ledger's own invariants. Findings of equal
/// time are reported in this order, and among equals in the order of
/// [`super::CHECKERS`] — the order the checker has always reported them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Anchor {
    /// An operation (its index in `(client, op)` order): `step` 0 for the operation as a
    /// whole, `n` for its `n`-th answer.
    Op { op: usize, step: usize },
    /// A key (its index in `(client id, key)` order) with all its operations.
    Key(usize),
    /// A transaction of the final database (its index in `txn_id` order).
    Txn(usize),
    /// An account of the final database (its index in `account_id` order).
    Account(usize),
    /// A transaction's entries, for the ledger's reconciliation.
    TxnEntries(usize),
    /// An account's stored balance against its entries.
    AccountEntries(usize),
    /// The sum of all balances.
    GlobalSum,
    /// An idempotency record (its index in `(client_id, idem_key)` order).
    Request(usize),
    /// A transaction against the idempotency records.
    TxnRecord(usize),
}

/// A violation as a checker finds it: where, its kind, what is wrong (one sentence with
/// the figures) and the history lines that show it (1-based; the faults overlapping
/// them are added later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finding {
    pub(super) at: Anchor,
    pub(super) kind: &'static str,
    pub(super) summary: String,
    pub(super) lines: Vec<usize>,
}

impl Finding {
    /// A finding of `kind` at `at`.
    pub(super) fn new(
        at: Anchor,
        kind: &'static str,
        summary: String,
        lines: Vec<usize>,
    ) -> Finding {
        Finding {
            at,
            kind,
            summary,
            lines,
        }
    }
}
