//! P7 — negative control: SQLite with a rollback journal and `synchronous=OFF` — what a
//! power cut does to the file.
//! Claim: with `journal_mode=DELETE` and `synchronous=OFF` SQLite never syncs (its docs:
//! "the database might become corrupted if the operating system crashes or the computer
//! loses power"). The worker applies 10 acknowledged changes and holds its connection;
//! after the SIGKILL and the cut, acknowledged changes are lost or the file is damaged;
//! the transcript says which (`integrity_check`, the count lost).
//! Fails if: every acknowledged change is there and the file is sound (a test runs the
//! body with `synchronous=EXTRA` and sees it fail; with FULL the last commit is still
//! lost here, since only EXTRA syncs the directory after the journal's unlink that
//! commits a transaction in DELETE mode).

use futures_util::FutureExt;

use case_kit::{Case, Ctx};

use crate::sqlite::{self, Pragmas};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P7",
        "negative control: SQLite rollback journal with synchronous=OFF loses acknowledged changes in a power cut",
        |ctx| run_with(ctx, "off").boxed(),
    )
    .not_clean()
}

/// What P7 shows.
pub const ANOMALY: &str = "acknowledged changes lost or the file damaged by a power cut";

/// The body with `journal_mode=DELETE` and `PRAGMA synchronous = <synchronous>`.
///
/// Errors: as [`sqlite::changes_then_cut`].
pub async fn run_with(ctx: &mut Ctx, synchronous: &'static str) -> anyhow::Result<()> {
    let pragmas = Pragmas {
        journal_mode: Some("delete"),
        synchronous: Some(synchronous),
    };
    let after = sqlite::changes_then_cut(ctx, pragmas).await?;
    sqlite::note_after(ctx, pragmas, &after);
    let damaged = after.integrity != "ok" || !after.consistent;
    ctx.exposes(
        ANOMALY,
        !after.lost.is_empty() || damaged,
        format!("lost={} damaged={damaged}", after.lost.len()),
    );
    Ok(())
}
