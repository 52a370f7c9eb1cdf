//! S8 — negative control, `INSERT OR REPLACE`: the event registered with REPLACE instead
//! of an upsert that does nothing.
//! Anomaly: REPLACE deletes the conflicting record and inserts the new one, and SQLite
//! counts that as one changed row, so the naive code takes a reused id for a new event:
//! `receive-1 +25` after `receive-1 +20` overwrites the record (+25) and moves the stock
//! again (100 → 120 → 145), and reconciliation no longer adds up (145 vs 125).
//! Guard: the store's `ON CONFLICT(event_id) DO NOTHING` refuses it as a Mismatch (120,
//! record +20).
//! Fails if: the naive code behaves (the control proved nothing), or the store does not
//! refuse.
//!
//! ```text
//! naive  receive-1 +20; receive-1 +25  -> applied, applied; 145; record +25
//! store  receive-1 +20; receive-1 +25  -> applied, mismatch; 120; record +20
//! ```

use futures_util::FutureExt;
use inventory_store::naive::apply_change_with_replace;
use inventory_store::{ChangeError, ChangeOutcome, Store, reconcile};

use case_kit::{Case, Ctx};

use super::{
    ITEM, START_UNITS, open_with_item, outcome_kind, seeded_store, sibling_file, units_of,
};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S8",
        "negative control, INSERT OR REPLACE: a reused id overwrites its record and applies again",
        |ctx| run(ctx).boxed(),
    )
    // Its own file ends broken on purpose.
    .not_clean()
}

const EVENT: &str = "receive-1";

/// How the control registers its event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// `INSERT OR REPLACE`: the naive design the control exposes.
    InsertOrReplace,
    /// The store's own upsert that does nothing on conflict: run in the control's slot,
    /// the control must report that it exposed nothing (a test does this).
    StoreUpsert,
}

impl Registration {
    fn apply(self, store: &Store, delta: i64) -> Result<ChangeOutcome, ChangeError> {
        match self {
            Registration::InsertOrReplace => apply_change_with_replace(store, EVENT, ITEM, delta),
            Registration::StoreUpsert => store.apply_change(EVENT, ITEM, delta),
        }
    }
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, Registration::InsertOrReplace).await
}

/// The case with `registration` in the naive slot.
///
/// Errors: database errors outside the story.
pub async fn run_with(ctx: &mut Ctx, registration: Registration) -> anyhow::Result<()> {
    // naive: on the case's own file.
    let naive = seeded_store(ctx)?;
    let first = outcome_kind(&registration.apply(&naive, 20));
    let second = outcome_kind(&registration.apply(&naive, 25));
    let units = units_of(&naive, ITEM)?;
    let record = naive.recorded_change(EVENT)?.map_or(0, |(_, delta)| delta);
    ctx.note(format!(
        "naive: +20 -> {first}; +25 -> {second}; units={units} recorded_delta={record}"
    ));
    ctx.exposes(
        "a reused id with another delta overwrites the record and applies again",
        second == "applied" && units == START_UNITS + 20 + 25 && record == 25,
        format!("second={second} units={units} recorded_delta={record}"),
    );
    let findings = reconcile(naive.connection())?;
    let findings: Vec<String> = findings.iter().map(ToString::to_string).collect();
    ctx.note(format!(
        "naive file reconciled: {}",
        if findings.is_empty() {
            "no findings".to_string()
        } else {
            findings.join("; ")
        }
    ));

    // guard: the store, the same story, on a second file.
    let store = open_with_item(&sibling_file(ctx, "store"), ITEM, START_UNITS)?;
    let first = outcome_kind(&store.apply_change(EVENT, ITEM, 20));
    let second = outcome_kind(&store.apply_change(EVENT, ITEM, 25));
    ctx.note(format!("store: +20 -> {first}; +25 -> {second}"));
    ctx.check_eq(
        "store: the reused id is refused",
        "mismatch".to_string(),
        second,
    );
    ctx.check_eq("store: units", START_UNITS + 20, units_of(&store, ITEM)?);
    ctx.check_eq(
        "store: the record keeps +20",
        20,
        store.recorded_change(EVENT)?.map_or(0, |(_, delta)| delta),
    );
    let findings = reconcile(store.connection())?;
    ctx.check(
        "store: the file reconciles",
        findings.is_empty(),
        format!("findings={}", findings.len()),
    );
    Ok(())
}
