//! P4 — the same torn page with `full_page_writes=on`: WAL recovery repairs it.
//! Claim: as P3, but with `full_page_writes=on`: the update is the page's first change
//! since the checkpoint, so its WAL record carries the whole page (a full-page image).
//! The page is torn at the cut exactly as in P3 (512 bytes new, the rest old); WAL
//! recovery writes the image over it and replays what follows, so the server starts,
//! every row reads, the acknowledged update is there, and amcheck (`verify_heapam`,
//! `bt_index_check` with `heapallindexed`) finds nothing.
//! Fails if: the tear keeps no bytes (nothing was torn), recovery fails, a row is
//! missing or lacks the update, or amcheck finds something.
//!
//! ```text
//! setup    initdb --data-checksums; full_page_writes=on; CHECKPOINT; write back
//! update   UPDATE acct … block 0 (acknowledged; WAL holds the full-page image)
//! evict    index scan of ballast until block 0 is written, unsynced, not dirty
//! cut      SIGKILL postgres; drop unsynced; tear acct's last write at 512 B; restart
//! check    recovery ok; rows and update present; verify_heapam, bt_index_check clean
//! ```

use futures_util::FutureExt;

use case_kit::Case;

use crate::torn;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "P4",
        "full_page_writes=on: a page torn at a power cut is restored from its full-page image",
        |ctx| torn::run_with(ctx, torn::Config::Repaired, "on", true).boxed(),
    )
    .not_clean()
    // Not exclusive: no load of its own (one client, its own mount and cluster), and
    // every step is forced, so other cases beside it only slow it down.
}
