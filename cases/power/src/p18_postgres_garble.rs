//! P18 — PostgreSQL with `fsync=on` under `garble`: what a torn or garbled sector does
//! to it.
//! Claim: P13's cuts under `garble` (a lost block over old data may come back torn or
//! with sectors of garbage), each cut's seed the first of its sequence that tears or
//! garbles such a block. At the cut a commit's WAL flush is held: it rewrites the WAL
//! page that holds the latest acknowledged commits (PostgreSQL writes the partly filled
//! page again at every flush), and pages written since the checkpoint are unsynced.
//! PostgreSQL's documentation assumes a device that may tear a page at sector
//! boundaries but writes each 512-byte sector whole or not at all (docs, "Reliability
//! "Reliability": full-page writes guard against a write that fails "meaning some of
//! the 512-byte sectors were written while others were not"); every WAL record carries
//! a CRC, so garbage ends replay where it starts. Claimed: a cut whose blocks were only
//! torn at sectors (the device PostgreSQL documents) loses nothing acknowledged and
//! leaves no damage. Counted, not claimed either way: what the cuts with garbage lost
//! or damaged (each cut in the run record).
//! Fails if: a cut held no sync or garbled nothing (it would study nothing), or a cut
//! with torn sectors and no garbage loses or damages anything.
//!
//! ```text
//! per cut   as P13 under garble+strict (seed forced to garble a block over old data)
//! checks    held ≥ 1 and garbled ≥ 1 per cut; torn-only cuts lose and damage nothing
//! counted   in cuts with garbage: debits lost, recovery failures, amcheck findings
//! ```
//!
//! Rust, not a file: P13's loop (`models.rs`).

use futures_util::FutureExt;

use case_kit::{Case, Ctx};
use forgetful_fs::{Model, Names};

use crate::models::{self, System};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P18",
        "fsync=on under garble: what a garbled sector loses or damages is counted",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    .schedule(case_kit::Schedule::Exclusive)
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let system = System::Postgres { fsync: true };
    let outcomes = models::run_cuts(ctx, system, Model::Garble, Names::Strict).await?;
    models::garble_preconditions(ctx, &outcomes);
    models::torn_only_claim(ctx, &outcomes);
    Ok(())
}
