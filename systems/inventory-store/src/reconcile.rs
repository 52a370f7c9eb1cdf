//! Reconciliation (SPEC §9, S10): for every item, the stored units must equal its opening
//! units plus the sum of its applied deltas. One checker, apart from the code that writes.

use std::collections::BTreeMap;
use std::fmt;

use rusqlite::types::Value;
use rusqlite::{Connection, Transaction, TransactionBehavior};

/// One thing reconciliation found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The stored units differ from opening + sum of applied deltas.
    UnitsDisagree {
        /// The item.
        item: i64,
        /// `stock.units`.
        stored: i64,
        /// `stock_opening.units + sum(applied_change.delta)`.
        recomputed: i128,
    },
    /// `stock.units` is not an integer (only possible without the `typeof` CHECK).
    NotAnInteger {
        /// The item.
        item: i64,
        /// SQLite's `typeof(units)`.
        stored_type: String,
        /// The value as text.
        stored: String,
    },
    /// A stock row without an opening figure.
    NoOpening {
        /// The item.
        item: i64,
    },
    /// An opening figure or applied changes for an item that has no stock row.
    NoStockRow {
        /// The item.
        item: i64,
    },
}

impl Finding {
    /// The item the finding names.
    pub fn item(&self) -> i64 {
        match self {
            Finding::UnitsDisagree { item, .. }
            | Finding::NotAnInteger { item, .. }
            | Finding::NoOpening { item }
            | Finding::NoStockRow { item } => *item,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::UnitsDisagree {
                item,
                stored,
                recomputed,
            } => {
                let difference = i128::from(*stored) - recomputed;
                write!(
                    f,
                    "item={item} stored={stored} recomputed={recomputed} (stored = recomputed {} {})",
                    if difference < 0 { '-' } else { '+' },
                    difference.unsigned_abs()
                )
            }
            Finding::NotAnInteger {
                item,
                stored_type,
                stored,
            } => write!(
                f,
                "item={item} units is {stored_type} {stored}, not an integer"
            ),
            Finding::NoOpening { item } => write!(f, "item={item} has no opening figure"),
            Finding::NoStockRow { item } => write!(f, "item={item} has changes but no stock row"),
        }
    }
}

#[derive(Default)]
struct ItemFigures {
    stored: Option<Value>,
    opening: Option<i64>,
    applied_sum: i128,
}

/// Reconciles every item of the file behind `connection`, reading all three tables in one
/// read transaction (one snapshot, so a concurrent writer cannot make it disagree with
/// itself). Sums are taken in i128 in Rust: SQLite's `sum()` raises an error on 64-bit
/// overflow, and an item may legitimately sit near the top of the range.
///
/// Errors: a database error (including an open transaction on `connection`).
pub fn reconcile(connection: &Connection) -> rusqlite::Result<Vec<Finding>> {
    let transaction = Transaction::new_unchecked(connection, TransactionBehavior::Deferred)?;
    let mut items: BTreeMap<i64, ItemFigures> = BTreeMap::new();
    {
        let mut statement = transaction.prepare("SELECT item_id, units FROM stock")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            items.entry(row.get(0)?).or_default().stored = Some(row.get(1)?);
        }
        let mut statement = transaction.prepare("SELECT item_id, units FROM stock_opening")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            items.entry(row.get(0)?).or_default().opening = Some(row.get(1)?);
        }
        let mut statement = transaction.prepare("SELECT item_id, delta FROM applied_change")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let figures = items.entry(row.get(0)?).or_default();
            figures.applied_sum += i128::from(row.get::<_, i64>(1)?);
        }
    }
    transaction.commit()?;

    let mut findings = Vec::new();
    for (item, figures) in items {
        let stored = match figures.stored {
            None => {
                findings.push(Finding::NoStockRow { item });
                continue;
            }
            Some(Value::Integer(units)) => units,
            Some(other) => {
                let (stored_type, stored) = describe(&other);
                findings.push(Finding::NotAnInteger {
                    item,
                    stored_type,
                    stored,
                });
                continue;
            }
        };
        let Some(opening) = figures.opening else {
            findings.push(Finding::NoOpening { item });
            continue;
        };
        let recomputed = i128::from(opening) + figures.applied_sum;
        if i128::from(stored) != recomputed {
            findings.push(Finding::UnitsDisagree {
                item,
                stored,
                recomputed,
            });
        }
    }
    Ok(findings)
}

fn describe(value: &Value) -> (String, String) {
    match value {
        Value::Null => ("null".into(), "NULL".into()),
        Value::Integer(integer) => ("integer".into(), integer.to_string()),
        Value::Real(real) => ("real".into(), format!("{real:e}")),
        Value::Text(text) => ("text".into(), format!("{text:?}")),
        Value::Blob(blob) => ("blob".into(), format!("{} bytes", blob.len())),
    }
}
