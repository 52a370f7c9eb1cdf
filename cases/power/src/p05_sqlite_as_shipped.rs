//! P5 — the SQLite inventory as shipped (WAL, `synchronous=FULL`) keeps every
//! acknowledged change through a power cut.
//! Claim: a crash-worker applies 10 changes (each acknowledged by its `RESULT` line),
//! then holds its connection open; it is SIGKILLed and the power is cut (unsynced data
//! dropped). SQLite's docs ("PRAGMA synchronous"): with FULL in WAL mode the WAL is
//! synced at every commit. After the cut every acknowledged change is in the file,
//! `integrity_check` says ok and the units agree with the recorded changes.
//! Fails if: an acknowledged change is lost, the file is damaged, or the units disagree.

use futures_util::FutureExt;

use case_kit::{Case, Ctx};

use crate::sqlite::{self, Pragmas};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P5",
        "SQLite WAL with synchronous=FULL (as shipped): every acknowledged change survives a power cut",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let pragmas = Pragmas {
        journal_mode: None,
        synchronous: None,
    };
    let after = sqlite::changes_then_cut(ctx, pragmas).await?;
    sqlite::note_after(ctx, pragmas, &after);
    ctx.check_eq(
        "changes acknowledged before the cut",
        sqlite::CHANGES,
        after.acknowledged.len(),
    );
    ctx.check_eq("acknowledged changes lost", 0, after.lost.len());
    ctx.check_eq("integrity_check", "ok".to_string(), after.integrity.clone());
    ctx.check(
        "units agree with the recorded changes",
        after.consistent,
        "",
    );
    Ok(())
}
