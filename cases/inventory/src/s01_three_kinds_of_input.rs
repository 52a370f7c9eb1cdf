//! S1 — three kinds of input: a first change, the same change again, and the same id with
//! another delta.
//! Claim: `receive-1 +20` on 100 units is Applied (120); the same again is Replayed (120);
//! `receive-1 +25` is a Mismatch, the stock stays 120 and one row records +20.
//! Fails if: any outcome differs, the stock moves on the replay or the mismatch, or the
//! record is overwritten.
//!
//! ```text
//! store  receive-1 +20  -> applied, 120
//! store  receive-1 +20  -> replayed, 120
//! store  receive-1 +25  -> mismatch, 120, one row (+20)
//! ```

use futures_util::FutureExt;

use case_kit::{Case, Ctx};

use super::{ITEM, outcome_text, rows_for, seeded_store, units_of};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S1",
        "three kinds of input: applied, replayed, mismatch",
        |ctx| run(ctx).boxed(),
    )
}

const EVENT: &str = "receive-1";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let store = seeded_store(ctx)?;

    let first = store.apply_change(EVENT, ITEM, 20);
    ctx.note(format!("{EVENT} +20 -> {}", outcome_text(&first)));
    ctx.check_eq("first change", "applied".to_string(), outcome_text(&first));
    ctx.check_eq("units after the first change", 120, units_of(&store, ITEM)?);

    let again = store.apply_change(EVENT, ITEM, 20);
    ctx.note(format!("{EVENT} +20 again -> {}", outcome_text(&again)));
    ctx.check_eq(
        "same change again",
        "replayed".to_string(),
        outcome_text(&again),
    );
    ctx.check_eq("units after the replay", 120, units_of(&store, ITEM)?);

    let other = store.apply_change(EVENT, ITEM, 25);
    ctx.note(format!("{EVENT} +25 -> {}", outcome_text(&other)));
    ctx.check_eq(
        "same id, other delta",
        "mismatch: recorded item=1 delta=20".to_string(),
        outcome_text(&other),
    );
    ctx.check_eq("units after the mismatch", 120, units_of(&store, ITEM)?);
    ctx.check_eq("rows for the id", 1, rows_for(&store, EVENT)?);
    ctx.check_eq(
        "the recorded delta is still the first one",
        "20".to_string(),
        store
            .recorded_change(EVENT)?
            .map_or_else(|| "none".into(), |(_, delta)| delta.to_string()),
    );
    Ok(())
}
