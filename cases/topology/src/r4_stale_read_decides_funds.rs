//! R4 — negative control, a stale read deciding funds (the authoritative write path
//! decides, never an asynchronous read model): with replay paused on the standby
//! (`pg_wal_replay_pause()` before the first debit, its state read back as `paused` —
//! forced, not timed), a
//! naive placement that checks the available balance on the standby and then takes the
//! amount on the primary without a condition overdraws the account; the product's
//! conditional debit on the primary refuses the same placement (`INSUFFICIENT`).
//!
//! The naive design has no CHECK on the balance (dropped on this case's own primary, as
//! in L5): its only guard is the read on the standby.
//!
//! Fails if: the product's debit is not refused, or the naive placement does not
//! overdraw (shown in a test: with replay running and the standby caught up, the read
//! is fresh and the naive check refuses).

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use points_ledger::{debit_in, grant_in};
use scratch_pg::Replication;

use crate::pair::{self, LEDGER_DATABASE};
use crate::wal;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "R4",
        "negative control, stale read on a standby decides funds: overdraft; the conditional debit on the primary refuses",
        |ctx| run_with(ctx, Replay::Paused).boxed(),
    )
    .not_clean()
}

/// The anomaly named by this control's `negative control exposes:` check.
pub const ANOMALY: &str = "overdraft decided on a standby's stale read";

/// What the standby's replay does while the placements run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Paused with `pg_wal_replay_pause()`: the fault the control shows.
    Paused,
    /// Running, and the standby caught up before the naive read: its read is fresh.
    Running,
}

const ACCOUNT: &str = "acct-0004";
const START_BALANCE: i64 = 100;
/// The debit that lands on the primary after the standby's replay stopped.
const FIRST_DEBIT: i64 = 80;
/// The placement both designs try.
const PLACEMENT: i64 = 50;
/// Longest wait for the standby to report replay `paused`, milliseconds (a hang bound).
const PAUSE_TIMEOUT_MS: u64 = 30_000;

/// R4 with `replay`: [`Replay::Paused`] in a run.
///
/// Errors: a node did not start; SQL errors.
// Long: the control's story in order, its fault step (`receiver`/`replay`) in the middle
// of it, so a reader sees where the fault lands.
pub async fn run_with(ctx: &mut Ctx, replay: Replay) -> anyhow::Result<()> {
    let mode = cases_ledger::modes::mode(ctx);
    let pair = pair::start_pair(ctx, Replication::Asynchronous).await?;
    let mut primary = pair.primary.connect(LEDGER_DATABASE).await?;
    primary
        .batch_execute("ALTER TABLE account DROP CONSTRAINT balance_non_negative")
        .await?;
    grant_in(mode, &mut primary, "ops", "g-r4", ACCOUNT, START_BALANCE).await?;
    wal::wait_replayed(&pair.primary, &pair.standby).await?;
    let standby = pair.standby.connect(LEDGER_DATABASE).await?;
    if replay == Replay::Paused {
        standby
            .batch_execute("SELECT pg_wal_replay_pause()")
            .await?;
    }
    let first = debit_in(
        mode,
        &mut primary,
        "app-r4",
        "k-r4-first",
        ACCOUNT,
        FIRST_DEBIT,
    )
    .await?;
    if replay == Replay::Paused {
        // The startup process pauses before it applies the next record: the first
        // debit's WAL arrives, and stays unapplied.
        wait_paused(&standby).await?;
        ctx.note("standby's replay paused (pg_get_wal_replay_pause_state() = paused)");
    }
    ctx.check_eq(
        "first debit on the primary",
        "Ok 20".to_string(),
        format!("{:?} {}", first.outcome, first.balance),
    );
    if replay == Replay::Running {
        wal::wait_replayed(&pair.primary, &pair.standby).await?;
    }
    let product = debit_in(
        mode,
        &mut primary,
        "app-r4",
        "k-r4-product",
        ACCOUNT,
        PLACEMENT,
    )
    .await?;
    ctx.check_eq(
        "product: the conditional debit on the primary refuses the placement",
        "Insufficient 20".to_string(),
        format!("{:?} {}", product.outcome, product.balance),
    );
    let read_on_standby: i64 = standby
        .query_one(
            "SELECT balance FROM account WHERE account_id = $1",
            &[&ACCOUNT],
        )
        .await?
        .get(0);
    let placed = read_on_standby >= PLACEMENT;
    if placed {
        primary
            .execute(
                "UPDATE account SET balance = balance - $1 WHERE account_id = $2",
                &[&PLACEMENT, &ACCOUNT],
            )
            .await?;
    }
    let balance: i64 = primary
        .query_one(
            "SELECT balance FROM account WHERE account_id = $1",
            &[&ACCOUNT],
        )
        .await?
        .get(0);
    ctx.note(format!(
        "naive: read {read_on_standby} on the standby, placed={placed}; balance on the primary {balance}"
    ));
    ctx.exposes(ANOMALY, balance < 0, format!("{ACCOUNT} balance={balance}"));
    Ok(())
}

/// Waits until the standby reports its replay `paused` (PostgreSQL 14+:
/// `pg_get_wal_replay_pause_state()`; `pause requested` until the startup process sees
/// the request).
async fn wait_paused(standby: &tokio_postgres::Client) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(PAUSE_TIMEOUT_MS);
    loop {
        let state: String = standby
            .query_one("SELECT pg_get_wal_replay_pause_state()", &[])
            .await?
            .get(0);
        if state == "paused" {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "replay not paused after {PAUSE_TIMEOUT_MS} ms: {state}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
