//! S10 — reconciliation, the family's last case: for every item, `units` = its opening
//! units + the sum of its applied deltas.
//! Claim: every clean file of the family's run (S1–S7; the negative controls S8 and S9 are
//! broken on purpose and left out) has no findings, and so has this case's own file after
//! applied, refused and replayed changes; then 5 units added to item 2 behind the store's
//! back are found and named: item 2, stored = recomputed + 5.
//! Fails if: a clean file has findings, or the tampering goes unnoticed or is reported
//! with other figures or another item.
//!
//! ```text
//! checker  each clean file of the run: reconcile       -> no findings
//! store    own file: items 1 (100) and 2 (50); changes  -> no findings
//! tamper   UPDATE stock SET units = units + 5 WHERE item_id = 2
//! checker  reconcile                                    -> item=2 stored=45 recomputed=40
//! ```

use futures_util::FutureExt;
use inventory_store::{Finding, Store, reconcile};

use case_kit::{Case, Ctx, Schedule};

use super::{ITEM, outcome_kind, seeded_store};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "S10",
        "reconciliation: units = opening + applied deltas; tampering is named",
        |ctx| run(ctx).boxed(),
    )
    .schedule(Schedule::Last)
    // Its own file ends tampered on purpose.
    .not_clean()
}

const SECOND_ITEM: i64 = 2;
const SECOND_START: i64 = 50;
const TAMPER_UNITS: i64 = 5;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    check_clean_files(ctx)?;

    // Its own file: two items, applied, refused and replayed changes.
    let store = seeded_store(ctx)?;
    store.add_item(SECOND_ITEM, SECOND_START)?;
    let steps = [
        ("receive-10", ITEM, 20),
        ("ship-10", ITEM, -70),
        ("ship-10", ITEM, -70),
        ("ship-11", SECOND_ITEM, -60),
        ("ship-12", SECOND_ITEM, -10),
    ];
    let outcomes: Vec<String> = steps
        .iter()
        .map(|(event, item, delta)| outcome_kind(&store.apply_change(event, *item, *delta)))
        .collect();
    ctx.note(format!("own changes: {}", outcomes.join(" ")));
    ctx.check_eq(
        "own changes",
        "applied applied replayed insufficient applied".to_string(),
        outcomes.join(" "),
    );
    let own = reconcile(store.connection())?;
    ctx.check(
        "own file before tampering: no findings",
        own.is_empty(),
        format!("findings={}", own.len()),
    );

    tamper_and_check(ctx, &store)?;
    Ok(())
}

/// Every other clean file of the family in this run (none when S10 runs alone): checks
/// none has findings. The list goes to the run record, not the transcript, so the
/// snapshot does not depend on which cases ran.
///
/// Errors: a file cannot be opened or reconciled.
fn check_clean_files(ctx: &mut Ctx) -> anyhow::Result<()> {
    let files = ctx.clean_sqlite_files();
    let mut findings_in_clean = Vec::new();
    for file in &files {
        let store = Store::open_existing(file)?;
        for finding in reconcile(store.connection())? {
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
            findings_in_clean.push(format!("{}: {finding}", name.unwrap_or_default()));
        }
    }
    ctx.record(
        "reconciled_databases",
        serde_json::Value::from(
            files
                .iter()
                .filter_map(|file| file.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect::<Vec<_>>(),
        ),
    );
    ctx.check(
        "every other clean file of the family: no findings",
        findings_in_clean.is_empty(),
        if findings_in_clean.is_empty() {
            "findings=0".to_string()
        } else {
            findings_in_clean.join("; ")
        },
    );
    Ok(())
}

/// Tamper: units added to item 2 without a change. Checks reconciliation names item 2,
/// stored = recomputed + 5, and not item 1.
///
/// Errors: the update or the reconciliation fails.
fn tamper_and_check(ctx: &mut Ctx, store: &Store) -> anyhow::Result<()> {
    store.connection().execute(
        "UPDATE stock SET units = units + ?1 WHERE item_id = ?2",
        [TAMPER_UNITS, SECOND_ITEM],
    )?;
    let tampered = reconcile(store.connection())?;
    for finding in &tampered {
        ctx.note(format!("finding: {finding}"));
    }
    let expected = vec![Finding::UnitsDisagree {
        item: SECOND_ITEM,
        stored: SECOND_START - 10 + TAMPER_UNITS,
        recomputed: i128::from(SECOND_START - 10),
    }];
    ctx.check(
        "the tampered item is named: item 2, stored = recomputed + 5",
        tampered == expected,
        tampered
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    );
    ctx.check_eq(
        "item 1 is not named",
        0,
        tampered.iter().filter(|f| f.item() == ITEM).count(),
    );
    Ok(())
}
