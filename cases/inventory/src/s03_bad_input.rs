//! S3 — bad input, through the store's JSON entry point (as a queue consumer receives a
//! change): empty and blank ids; deltas 0, +1001, −1001, `1.5`, `"5"`, `true`, `null`.
//! Then a connection with an open transaction, and ids that differ only in case.
//! Claim: each bad input is Invalid with its reason and stores nothing; a connection that
//! already has an open transaction is refused (InTransaction) and the caller's uncommitted
//! row survives and commits; `SHIP-1` after `ship-1` is a new event (ids are compared
//! exactly, not case-folded or trimmed).
//! Fails if: any bad input is accepted or stores a row, the caller's transaction is ended
//! or loses its row, or the two ids are taken for one.
//!
//! ```text
//! store   {"event_id": "", …} … {"delta": null}   -> invalid (each), nothing stored
//! caller  BEGIN; INSERT item 3 (uncommitted)
//! store   apply on the caller's connection          -> in-transaction
//! caller  still in its transaction; item 3 visible to it, not to others; COMMIT
//! store   ship-1 -1, SHIP-1 -1                      -> applied, applied
//! ```

use futures_util::FutureExt;
use inventory_store::Store;
use serde_json::json;

use case_kit::{Case, Ctx};

use super::{ITEM, START_UNITS, outcome_kind, outcome_text, seeded_store, units_of};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S3",
        "bad input is refused and stores nothing; an open transaction is left alone",
        |ctx| run(ctx).boxed(),
    )
}

/// The caller's own item, inserted in its own transaction.
const CALLER_ITEM: i64 = 3;
const CALLER_UNITS: i64 = 7;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let store = seeded_store(ctx)?;
    refuse_bad_input(ctx, &store)?;
    leave_open_transaction_alone(ctx, &store)?;

    // Ids are compared exactly.
    let lower = store.apply_change("ship-1", ITEM, -1);
    let upper = store.apply_change("SHIP-1", ITEM, -1);
    ctx.note(format!(
        "ship-1 -1 -> {}; SHIP-1 -1 -> {}",
        outcome_text(&lower),
        outcome_text(&upper)
    ));
    ctx.check_eq("ship-1", "applied".to_string(), outcome_kind(&lower));
    ctx.check_eq(
        "SHIP-1 after ship-1 is a new event",
        "applied".to_string(),
        outcome_kind(&upper),
    );
    ctx.check_eq("rows", 2, store.change_count()?);
    ctx.check_eq("units", START_UNITS - 2, units_of(&store, ITEM)?);
    Ok(())
}

/// Bad input: checks each is refused as Invalid, with its reason, and nothing is stored.
///
/// Errors: the store cannot be read.
fn refuse_bad_input(ctx: &mut Ctx, store: &Store) -> anyhow::Result<()> {
    let inputs = [
        json!({"event_id": "", "item": ITEM, "delta": 5}),
        json!({"event_id": "   ", "item": ITEM, "delta": 5}),
        json!({"event_id": "bad-1", "item": ITEM, "delta": 0}),
        json!({"event_id": "bad-1", "item": ITEM, "delta": 1001}),
        json!({"event_id": "bad-1", "item": ITEM, "delta": -1001}),
        json!({"event_id": "bad-1", "item": ITEM, "delta": 1.5}),
        json!({"event_id": "bad-1", "item": ITEM, "delta": "5"}),
        json!({"event_id": "bad-1", "item": ITEM, "delta": true}),
        json!({"event_id": "bad-1", "item": ITEM, "delta": null}),
    ];
    for input in &inputs {
        let result = store.apply_json(input);
        ctx.note(format!("{input} -> {}", outcome_text(&result)));
        ctx.check_eq(
            format!("{input} is refused"),
            "invalid".to_string(),
            outcome_kind(&result),
        );
    }
    ctx.check_eq("rows after the bad input", 0, store.change_count()?);
    ctx.check_eq(
        "units after the bad input",
        START_UNITS,
        units_of(store, ITEM)?,
    );
    Ok(())
}

/// caller: its own transaction on the store's connection, with an uncommitted row.
/// Checks the store refuses to apply on it (InTransaction), and that the caller's
/// transaction stays open, keeps its row and commits it.
///
/// Errors: the caller's statements fail, the store cannot be read or a second connection
/// opened.
fn leave_open_transaction_alone(ctx: &mut Ctx, store: &Store) -> anyhow::Result<()> {
    let connection = store.connection();
    connection.execute_batch("BEGIN")?;
    connection.execute(
        "INSERT INTO stock (item_id, units) VALUES (?1, ?2)",
        [CALLER_ITEM, CALLER_UNITS],
    )?;
    connection.execute(
        "INSERT INTO stock_opening (item_id, units) VALUES (?1, ?2)",
        [CALLER_ITEM, CALLER_UNITS],
    )?;
    let refused = store.apply_json(&json!({"event_id": "receive-3", "item": ITEM, "delta": 5}));
    ctx.note(format!(
        "receive-3 +5 on a connection with an open transaction -> {}",
        outcome_text(&refused)
    ));
    ctx.check_eq(
        "a connection with an open transaction is refused",
        "in-transaction".to_string(),
        outcome_kind(&refused),
    );
    ctx.check(
        "the caller's transaction is still open",
        !connection.is_autocommit(),
        if connection.is_autocommit() {
            "ended"
        } else {
            "open"
        },
    );
    ctx.check_eq(
        "the caller sees its uncommitted row",
        CALLER_UNITS,
        units_of(store, CALLER_ITEM)?,
    );
    let other = Store::open(&ctx.sqlite_path())?;
    ctx.check_eq(
        "another connection does not see it yet",
        -1,
        units_of(&other, CALLER_ITEM)?,
    );
    connection.execute_batch("COMMIT")?;
    ctx.check_eq(
        "after the caller's COMMIT another connection sees it",
        CALLER_UNITS,
        units_of(&other, CALLER_ITEM)?,
    );
    ctx.check_eq("rows after the refusal", 0, store.change_count()?);
    Ok(())
}
