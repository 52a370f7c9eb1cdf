//! S2 — a refused change does not occupy its key (SPEC §9's policy, unlike the ledger's
//! L2).
//! Claim: at 120 units, `ship-1 −121` is Insufficient and leaves no row and 120 units; the
//! same id with `−120` then applies (0 units); once more at 0 units it is Replayed, not
//! checked against the stock again.
//! Fails if: the refusal stores a row or moves the stock, the corrected change is refused,
//! or the last call is re-checked (Insufficient) instead of replayed.
//!
//! ```text
//! store  receive-1 +20   -> applied, 120
//! store  ship-1 -121     -> insufficient, no row, 120
//! store  ship-1 -120     -> applied, 0
//! store  ship-1 -120     -> replayed at 0 units
//! ```

use futures_util::FutureExt;

use case_kit::{Case, Ctx};

use super::{ITEM, outcome_kind, outcome_text, rows_for, seeded_store, units_of};

/// The case's registration.
pub fn case() -> Case {
    Case::new("S2", "a refused change does not occupy its key", |ctx| {
        run(ctx).boxed()
    })
}

const SHIP: &str = "ship-1";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let store = seeded_store(ctx)?;
    let receive = store.apply_change("receive-1", ITEM, 20);
    ctx.check_eq(
        "receive-1 +20",
        "applied".to_string(),
        outcome_kind(&receive),
    );
    ctx.check_eq("units", 120, units_of(&store, ITEM)?);

    let refused = store.apply_change(SHIP, ITEM, -121);
    ctx.note(format!("{SHIP} -121 -> {}", outcome_text(&refused)));
    ctx.check_eq(
        "ship-1 -121 on 120 units",
        "insufficient".to_string(),
        outcome_kind(&refused),
    );
    ctx.check_eq(
        "rows for ship-1 after the refusal",
        0,
        rows_for(&store, SHIP)?,
    );
    ctx.check_eq("units after the refusal", 120, units_of(&store, ITEM)?);

    let corrected = store.apply_change(SHIP, ITEM, -120);
    ctx.note(format!("{SHIP} -120 -> {}", outcome_text(&corrected)));
    ctx.check_eq(
        "the same id with -120 (the key was free)",
        "applied".to_string(),
        outcome_kind(&corrected),
    );
    ctx.check_eq("units", 0, units_of(&store, ITEM)?);

    let again = store.apply_change(SHIP, ITEM, -120);
    ctx.note(format!(
        "{SHIP} -120 again at 0 units -> {}",
        outcome_text(&again)
    ));
    ctx.check_eq(
        "again at 0 units: replayed, not re-checked",
        "replayed".to_string(),
        outcome_kind(&again),
    );
    ctx.check_eq("units after the replay", 0, units_of(&store, ITEM)?);
    ctx.check_eq("rows for ship-1", 1, rows_for(&store, SHIP)?);
    Ok(())
}
