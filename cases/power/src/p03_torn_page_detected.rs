//! P3 — negative control: a torn data page with `full_page_writes=off` is detected.
//! Claim: on a cluster initialised with `--data-checksums` and run with
//! `full_page_writes=off`, a checkpoint is written back, then one acknowledged update
//! changes the rows of block 0 of a table (its WAL record holds no page image); the page
//! is forced out of shared buffers (the disk is seen holding it written and unsynced)
//! and the power is cut with the file's last write torn at 512 bytes. WAL recovery has
//! nothing to rebuild the page from: it reads the torn page, and the checksum catches it
//! (`invalid page in block 0`, SQLSTATE XX001 `data_corrupted`) — the damage is found,
//! not repaired (PostgreSQL docs 20.5.1, `full_page_writes`: turning it off "might lead
//! to either unrecoverable data corruption, or silent data corruption, after a system
//! failure").
//! Fails if: nothing detects the tear (the control proved nothing). A test runs the same
//! body without the tear and sees this check fail.
//!
//! ```text
//! setup    initdb --data-checksums; full_page_writes=off; CHECKPOINT; write back
//! update   UPDATE acct … block 0 (acknowledged)
//! evict    index scan of ballast until block 0 is written, unsynced, not dirty
//! cut      SIGKILL postgres; drop unsynced; tear acct's last write at 512 B; restart
//! check    recovery stops on, or a read fails with, a checksum failure
//! ```

use futures_util::FutureExt;

use case_kit::{Case, Ctx};

use crate::torn;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P3",
        "negative control: full_page_writes=off, a page torn at a power cut is caught by its checksum",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
    // Not exclusive: no load of its own (one client, its own mount and cluster), and
    // every step is forced, so other cases beside it only slow it down.
}

/// The body: the tear with `full_page_writes=off`.
///
/// Errors: as [`torn::run_with`].
pub async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, true).await
}

/// P3's checks, the page torn when `tear` (a test passes `false`: the control must fail).
///
/// Errors: as [`torn::run_with`].
pub async fn run_with(ctx: &mut Ctx, tear: bool) -> anyhow::Result<()> {
    torn::run_with(ctx, torn::Config::Detected, "off", tear).await
}
