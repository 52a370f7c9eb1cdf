//! P17 — SQLite WAL with `synchronous=FULL` under `garble`: what a torn or garbled
//! sector does to it.
//! Claim: P15's cuts under `garble` (test6.c's characteristics: a lost block that was
//! overwriting data may come back torn, each 512-byte sector new or old, or with
//! sectors of garbage), each cut's seed the first of its sequence that tears or
//! garbles a block over old data. The held 11th commit's first WAL write rewrites the
//! block holding the end of the 10th (a WAL frame is 4 KiB + 24 bytes, so commits do
//! not start on a block), which SQLite trusts the device not to damage: its unix VFS
//! declares `SQLITE_IOCAP_POWERSAFE_OVERWRITE` ("powersafe overwrite": a write changes
//! nothing outside the bytes written, even at a power loss; SQLite docs, "Powersafe
//! Overwrite"), so it does not pad the WAL to a sector. Every frame carries a checksum,
//! so garbage ends the log where it starts: the file stays consistent
//! (`integrity_check` ok, the units agree) in every cut; a cut whose blocks were only
//! torn at sectors (each sector new or old: the sector-atomic device) loses nothing;
//! the acknowledged changes lost in cuts with garbage are counted, not claimed either
//! way (each cut in the run record).
//! Fails if: a cut held no sync or garbled nothing (it would study nothing), a cut
//! leaves the file damaged, or a cut with torn sectors and no garbage loses anything.
//!
//! ```text
//! per cut   as P15 under garble+strict (seed forced to garble a block over old data)
//! checks    held ≥ 1 and garbled ≥ 1 per cut; integrity_check ok, reconcile clean;
//!           torn-only cuts lose nothing
//! counted   acknowledged changes lost in cuts with garbage (SQLite's assumption broken)
//! ```
//!
//! Rust, not a file: P15's loop (`models.rs`).

use futures_util::FutureExt;

use case_kit::{Case, Ctx};
use forgetful_fs::{Model, Names};

use crate::models::{self, System};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P17",
        "SQLite WAL synchronous=FULL under garble: the file stays consistent; what a garbled sector loses is counted",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let system = System::Sqlite {
        journal_mode: "wal",
        synchronous: "full",
    };
    let outcomes = models::run_cuts(ctx, system, Model::Garble, Names::Strict).await?;
    models::garble_preconditions(ctx, &outcomes);
    models::torn_only_claim(ctx, &outcomes);
    let damaged = outcomes.iter().filter(|o| !o.damage.is_empty()).count();
    ctx.check(
        "no cut leaves the file damaged (integrity_check ok, units agree)",
        damaged == 0,
        format!("cuts_damaged={damaged}"),
    );
    Ok(())
}
