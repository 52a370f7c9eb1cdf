//! S9 — negative control, integer affinity: an item at 9 223 372 036 854 775 000 units
//! receives +1000, which takes it past the 64-bit range (2^63 − 1 =
//! 9 223 372 036 854 775 807).
//! Anomaly: SQLite computes the overflowing `units + 1000` as a REAL, and a column of
//! INTEGER affinity keeps a REAL that does not fit an integer; without the `typeof`
//! CHECK the change is Applied and the stock silently becomes a floating-point number.
//! Guard: with `CHECK (typeof(units) = 'integer' …)` the UPDATE is refused
//! (SQLITE_CONSTRAINT_CHECK), the transaction rolls back and nothing is stored.
//! Fails if: the naive table keeps an integer (the control proved nothing), or the
//! checked store stores anything.
//!
//! ```text
//! naive  receive-9 +1000  -> applied; typeof(units) = real
//! store  receive-9 +1000  -> check-violation; units unchanged; no row
//! ```

use futures_util::FutureExt;
use inventory_store::{Schema, Store, reconcile};

use case_kit::{Case, Ctx};

use super::{ITEM, outcome_kind, rows_for, sibling_file, units_of};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S9",
        "negative control, integer affinity: without the typeof CHECK an overflow becomes a REAL",
        |ctx| run(ctx).boxed(),
    )
    // Its own file ends broken on purpose.
    .not_clean()
}

const NEAR_LIMIT: i64 = 9_223_372_036_854_775_000;
const EVENT: &str = "receive-9";
const DELTA: i64 = 1000;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, Schema::WithoutTypeCheck).await
}

/// The case with a `naive_schema` file in the naive slot ([`Schema::Checked`] there
/// makes the control report that it exposed nothing; a test does this).
///
/// Errors: database errors outside the story.
pub async fn run_with(ctx: &mut Ctx, naive_schema: Schema) -> anyhow::Result<()> {
    ctx.record(
        "sqlite_version",
        serde_json::Value::from(inventory_store::sqlite_version()),
    );
    // naive: the case's own file, without the typeof CHECK.
    let naive = Store::open_with(&ctx.sqlite_path(), naive_schema)?;
    naive.add_item(ITEM, NEAR_LIMIT)?;
    let outcome = outcome_kind(&naive.apply_change(EVENT, ITEM, DELTA));
    let (stored_type, stored) = naive
        .units_as_stored(ITEM)?
        .unwrap_or_else(|| ("none".into(), "none".into()));
    ctx.note(format!(
        "naive: {EVENT} +{DELTA} -> {outcome}; typeof(units)={stored_type} units={stored}"
    ));
    ctx.exposes(
        "an integer overflow is stored as a REAL without the typeof CHECK",
        outcome == "applied" && stored_type == "real",
        format!("outcome={outcome} typeof={stored_type}"),
    );
    for finding in reconcile(naive.connection())? {
        ctx.note(format!("naive file reconciled: {finding}"));
    }

    // guard: the checked store on a second file.
    let store = Store::open(&sibling_file(ctx, "store"))?;
    store.add_item(ITEM, NEAR_LIMIT)?;
    let result = store.apply_change(EVENT, ITEM, DELTA);
    ctx.note(format!(
        "store: {EVENT} +{DELTA} -> {}",
        outcome_kind(&result)
    ));
    ctx.check_eq(
        "store: the change is refused by the CHECK",
        "check-violation".to_string(),
        outcome_kind(&result),
    );
    ctx.check_eq(
        "store: units unchanged",
        NEAR_LIMIT,
        units_of(&store, ITEM)?,
    );
    ctx.check_eq("store: rows for the id", 0, rows_for(&store, EVENT)?);
    ctx.check_eq(
        "store: typeof(units)",
        "integer".to_string(),
        store
            .units_as_stored(ITEM)?
            .map_or_else(|| "none".into(), |(t, _)| t),
    );
    Ok(())
}
