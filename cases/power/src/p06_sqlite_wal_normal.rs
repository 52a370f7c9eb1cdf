//! P6 — negative control: SQLite WAL with `synchronous=NORMAL` rolls acknowledged
//! changes back in a power cut, and the file stays consistent.
//! Claim: SQLite's docs ("PRAGMA synchronous"): in WAL mode with NORMAL "a transaction
//! committed in WAL mode with synchronous=NORMAL might roll back following a power loss
//! or system crash" — the WAL is synced only at a checkpoint. Forced, not hoped for:
//! the 10 changes fit well within one automatic checkpoint (1000 pages), so no sync
//! happens between them and the cut; the worker is SIGKILLed holding its connection (no
//! checkpoint at close). After the cut acknowledged changes are gone (counted; their ids
//! in the run record), `integrity_check` says ok and the units agree with what remains:
//! durability lost, consistency kept.
//! Fails if: nothing acknowledged is lost (the control proved nothing; a test runs the
//! body with FULL and sees it fail), or the file is damaged or inconsistent.

use futures_util::FutureExt;

use case_kit::{Case, Ctx};

use crate::sqlite::{self, Pragmas};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P6",
        "negative control: SQLite WAL with synchronous=NORMAL rolls acknowledged changes back in a power cut",
        |ctx| run_with(ctx, "normal").boxed(),
    )
    .not_clean()
}

/// What P6 shows.
pub const ANOMALY: &str = "acknowledged changes rolled back by a power cut";

/// The body with `PRAGMA synchronous = <synchronous>` on the worker's WAL connection.
///
/// Errors: as [`sqlite::changes_then_cut`].
pub async fn run_with(ctx: &mut Ctx, synchronous: &'static str) -> anyhow::Result<()> {
    let pragmas = Pragmas {
        journal_mode: None,
        synchronous: Some(synchronous),
    };
    let after = sqlite::changes_then_cut(ctx, pragmas).await?;
    sqlite::note_after(ctx, pragmas, &after);
    ctx.exposes(
        ANOMALY,
        !after.lost.is_empty(),
        format!("lost={} of {}", after.lost.len(), after.acknowledged.len()),
    );
    ctx.check_eq(
        "integrity_check (consistency kept)",
        "ok".to_string(),
        after.integrity.clone(),
    );
    ctx.check(
        "units agree with the changes that remain",
        after.consistent,
        "",
    );
    Ok(())
}
