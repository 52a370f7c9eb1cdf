//! S4 — two key policies side by side on the same story: an order is refused for lack of
//! stock, the item is restocked, and the order is retried with the same event id.
//! Claim: under SPEC §9's policy (a failure leaves its key free) the retry applies and the
//! order ships (50 units left); under the ledger's L2 policy (a failure is recorded under
//! its key) the retry replays the refusal although there is stock now (200 units), and only
//! a new id can ship the order. One table shows the consequence of each.
//! Fails if: either policy answers otherwise at any step, or a file does not reconcile.
//!
//! ```text
//!              ship-4 -150 (100 units)   restock-4 +100   retry ship-4 -150
//! key free     insufficient              applied          applied            -> 50
//! recorded     insufficient (recorded)   applied          insufficient (replayed) -> 200
//! ```

use futures_util::FutureExt;
use inventory_store::reconcile;
use inventory_store::recorded_refusals::{self, RecordedOutcome};

use case_kit::{Case, Ctx};

use super::{
    ITEM, START_UNITS, open_with_item, outcome_kind, seeded_store, sibling_file, units_of,
};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S4",
        "two key policies side by side: a refused key left free vs recorded",
        |ctx| run(ctx).boxed(),
    )
}

const SHIP: &str = "ship-4";
const SHIP_UNITS: i64 = -150;
const RESTOCK: &str = "restock-4";
const RESTOCK_UNITS: i64 = 100;

/// One row of the table.
struct Story {
    policy: &'static str,
    first: String,
    restock: String,
    retry: String,
    units: i64,
    consequence: &'static str,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    // SPEC §9: the store of this crate, on the case's own file.
    let free = seeded_store(ctx)?;
    let first = outcome_kind(&free.apply_change(SHIP, ITEM, SHIP_UNITS));
    let restock = outcome_kind(&free.apply_change(RESTOCK, ITEM, RESTOCK_UNITS));
    let retry = outcome_kind(&free.apply_change(SHIP, ITEM, SHIP_UNITS));
    let key_free = Story {
        policy: "failure leaves the key free (S2)",
        first,
        restock,
        retry,
        units: units_of(&free, ITEM)?,
        consequence: "the retry ships the order",
    };

    // L2: the same story under the recording policy, on a second file.
    let recorded = open_with_item(&sibling_file(ctx, "recorded"), ITEM, START_UNITS)?;
    recorded_refusals::install(&recorded)?;
    let step = |event: &str, delta: i64| {
        recorded_refusals::apply_change(&recorded, event, ITEM, delta)
            .map_or_else(|error| error.kind().to_string(), |o| o.as_str().to_string())
    };
    let first = step(SHIP, SHIP_UNITS);
    let restock = step(RESTOCK, RESTOCK_UNITS);
    let retry = step(SHIP, SHIP_UNITS);
    let key_recorded = Story {
        policy: "failure is recorded (L2)",
        first,
        restock,
        retry,
        units: units_of(&recorded, ITEM)?,
        consequence: "the retry is refused again; only a new id ships it",
    };

    note_table(ctx, &key_free, &key_recorded);
    check_stories(ctx, &key_free, &key_recorded);
    let new_id = step("ship-4b", SHIP_UNITS);
    ctx.check_eq("recorded: a new id ships it", "applied".to_string(), new_id);

    for (name, store) in [("key free", &free), ("recorded", &recorded)] {
        let findings = reconcile(store.connection())?;
        ctx.check(
            format!("{name}: the file reconciles"),
            findings.is_empty(),
            format!("findings={}", findings.len()),
        );
    }
    Ok(())
}

/// The table: a header and one row per policy, as notes.
fn note_table(ctx: &mut Ctx, key_free: &Story, key_recorded: &Story) {
    ctx.note(format!(
        "{:<34} | {:<24} | {:<14} | {:<24} | {:<5} | consequence",
        "policy", "ship-4 -150 at 100 units", "restock-4 +100", "retry ship-4 -150", "units"
    ));
    for story in [key_free, key_recorded] {
        ctx.note(format!(
            "{:<34} | {:<24} | {:<14} | {:<24} | {:<5} | {}",
            story.policy, story.first, story.restock, story.retry, story.units, story.consequence
        ));
    }
}

/// Checks each step of both stories: key free (insufficient, applied, applied, 50 units)
/// and recorded (refused, applied, refusal replayed, 200 units).
fn check_stories(ctx: &mut Ctx, key_free: &Story, key_recorded: &Story) {
    ctx.check_eq(
        "key free: first attempt",
        "insufficient".to_string(),
        key_free.first.clone(),
    );
    ctx.check_eq(
        "key free: restock",
        "applied".to_string(),
        key_free.restock.clone(),
    );
    ctx.check_eq(
        "key free: retry with the same id",
        "applied".to_string(),
        key_free.retry.clone(),
    );
    ctx.check_eq(
        "key free: units",
        START_UNITS + RESTOCK_UNITS + SHIP_UNITS,
        key_free.units,
    );
    ctx.check_eq(
        "recorded: first attempt",
        RecordedOutcome::Refused.as_str().to_string(),
        key_recorded.first.clone(),
    );
    ctx.check_eq(
        "recorded: restock",
        "applied".to_string(),
        key_recorded.restock.clone(),
    );
    ctx.check_eq(
        "recorded: retry with the same id",
        RecordedOutcome::RefusalReplayed.as_str().to_string(),
        key_recorded.retry.clone(),
    );
    ctx.check_eq(
        "recorded: units",
        START_UNITS + RESTOCK_UNITS,
        key_recorded.units,
    );
}
