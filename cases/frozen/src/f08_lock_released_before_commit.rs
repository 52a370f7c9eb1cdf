//! F8 — a lock released before its transaction commits (the seed's pitfall).
//! Claim: a lock outside the database protects a read-then-write only while it is held
//! until COMMIT. Released before COMMIT (an application lock let go in a `finally` step
//! while the surrounding transaction commits later), or lost when its lease runs out
//! while the holder is paused, a second holder reads the balance the first is about to
//! overwrite, and both freeze; held through COMMIT, one freezes; the conditional UPDATE
//! needs no lock at all.
//! The lock: an in-process async lock per account with an optional lease, standing for
//! a lock service (what a Redis or ZooKeeper lock gives an application); see LIMITS.md.
//! Setup: per row a fresh account with 6000 USDT and 32 placements of BUY 1.0 @ 5000
//! (5005 each). The naive placement takes the lock, reads `available` and `frozen`
//! (a plain read), writes the values it computed, records operation, movement and order.
//! - released before COMMIT: holder 1 releases, then waits before COMMIT until holder 2
//!   (which takes the lock only once holder 1 has it) has read: forced by a hook, so
//!   holder 2 reads the uncommitted-away 6000.
//! - lease 100 ms, holder paused 300 ms: holder 1 reads, then pauses 300 ms and until
//!   holder 2, which got the lock when the lease ran out, has committed.
//! - released after COMMIT and no lock with the conditional UPDATE (the product's
//!   `place`): all 32 at once behind a barrier.
//!
//! In the first two rows the other 30 start after the pair is done.
//! Checks: rows 1 and 2 misbehave every run (2 OK, 5005 frozen against 10 010 that the
//! two orders hold); rows 3 and 4 give exactly 1 OK, 995 available, 5005 frozen, and
//! their accounts reconcile.
//! Fails if: a row's figures differ.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use case_kit::{Case, Ctx};
use frozen_balances::amount::format_units;
use frozen_balances::{Asset, Market, Outcome, PlaceRequest, Side};
use futures_util::FutureExt;
use tokio::sync::{Notify, watch};

use super::fixtures::{Plan, deposit, order};
use frozen_balances::naive;

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "F8",
        "lock released before commit: 32 placements of 5005 on 6000 under four designs",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .connections(PLACEMENTS as u32 + 2)
    .not_clean()
}

/// Placements per row.
pub const PLACEMENTS: usize = 32;
/// The lease of the lock in row 2, milliseconds.
pub const LEASE_MS: u64 = 100;
/// How long holder 1 of row 2 pauses (at least; it also waits for holder 2), ms.
pub const PAUSE_MS: u64 = 300;
/// How often a waiting acquirer looks at the lock again, milliseconds.
pub const ACQUIRE_POLL_MS: u64 = 1;

/// The four designs, one table row each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Design {
    ReleasedBeforeCommit,
    LeaseExpires,
    ReleasedAfterCommit,
    Conditional,
}

impl Design {
    const ALL: [Design; 4] = [
        Design::ReleasedBeforeCommit,
        Design::LeaseExpires,
        Design::ReleasedAfterCommit,
        Design::Conditional,
    ];

    fn label(self) -> &'static str {
        match self {
            Design::ReleasedBeforeCommit => "lock released before COMMIT",
            Design::LeaseExpires => "lease 100 ms expires, holder paused 300 ms",
            Design::ReleasedAfterCommit => "lock released after COMMIT",
            Design::Conditional => "no lock, conditional UPDATE",
        }
    }

    fn account(self) -> &'static str {
        match self {
            Design::ReleasedBeforeCommit => "erin",
            Design::LeaseExpires => "frank",
            Design::ReleasedAfterCommit => "grace",
            Design::Conditional => "heidi",
        }
    }

    /// Whether holders 1 and 2 play the forced interleaving.
    fn forced_pair(self) -> bool {
        matches!(self, Design::ReleasedBeforeCommit | Design::LeaseExpires)
    }
}

/// A lock on one account as a lock service hands it out: one holder at a time,
/// identified by a token; with a lease, the holder loses it when the lease runs out,
/// whether or not it is done (it is not told). Release by an old token does nothing.
struct LockService {
    lease: Option<Duration>,
    holder: Mutex<Option<(u64, Option<Instant>)>>,
    next: AtomicU64,
}

impl LockService {
    fn new(lease: Option<Duration>) -> LockService {
        LockService {
            lease,
            holder: Mutex::new(None),
            next: AtomicU64::new(1),
        }
    }

    async fn acquire(&self) -> u64 {
        loop {
            {
                let mut holder = self.holder.lock().unwrap_or_else(|p| p.into_inner());
                let free = match *holder {
                    None => true,
                    Some((_, Some(expires))) => Instant::now() >= expires,
                    Some((_, None)) => false,
                };
                if free {
                    let token = self.next.fetch_add(1, Ordering::SeqCst);
                    *holder = Some((token, self.lease.map(|lease| Instant::now() + lease)));
                    return token;
                }
            }
            tokio::time::sleep(Duration::from_millis(ACQUIRE_POLL_MS)).await;
        }
    }

    fn release(&self, token: u64) {
        let mut holder = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*holder, Some((current, _)) if current == token) {
            *holder = None;
        }
    }
}

/// What holders 1 and 2 of a forced row tell each other.
#[derive(Default)]
struct Pair {
    first_locked: Notify,
    second_read: Notify,
    second_committed: Notify,
    first_done: Notify,
}

/// The row's figures.
struct Row {
    ok: usize,
    insufficient: usize,
    errors: Vec<String>,
    available: i64,
    frozen: i64,
    mismatches: usize,
}

/// The case body; under [`Plan::Harmless`] holder 2 of rows 1 and 2 starts only after
/// holder 1 is done and nobody pauses, so the window never opens.
///
/// Errors: database errors, a racer that could not connect.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    ctx.note("design | OK | INSUFFICIENT | available | frozen | held by the OK orders");
    for design in Design::ALL {
        deposit(
            &mut db,
            &format!("dep-08-{}", design.account()),
            design.account(),
            Asset::Usdt,
            6_000,
        )
        .await?;
        let row = run_row(ctx, &mut db, design, plan).await?;
        let held = row.ok as i64 * 5_005 * Asset::Usdt.units_per_coin();
        ctx.note(format!(
            "{} | {} | {} | {} | {} | {}",
            design.label(),
            row.ok,
            row.insufficient,
            format_units(Asset::Usdt, row.available),
            format_units(Asset::Usdt, row.frozen),
            format_units(Asset::Usdt, held)
        ));
        ctx.check(
            format!("{}: no database errors", design.label()),
            row.errors.is_empty(),
            row.errors.first().cloned().unwrap_or_default(),
        );
        let seen = format!(
            "ok={} available={} frozen={} reconciliation_findings={}",
            row.ok,
            format_units(Asset::Usdt, row.available),
            format_units(Asset::Usdt, row.frozen),
            row.mismatches
        );
        if design.forced_pair() {
            ctx.exposes(
                format!(
                    "{}: two placements freeze on 6000, 5005 frozen against 10010 held",
                    design.label()
                ),
                row.ok == 2 && row.frozen == 5_005_000_000 && row.mismatches > 0,
                seen,
            );
        } else {
            ctx.check(
                format!(
                    "{}: exactly 1 OK, 995 available, 5005 frozen, the account reconciles",
                    design.label()
                ),
                row.ok == 1
                    && row.insufficient == PLACEMENTS - 1
                    && row.available == 995_000_000
                    && row.frozen == 5_005_000_000
                    && row.mismatches == 0,
                seen,
            );
        }
    }
    Ok(())
}

/// One row: [`PLACEMENTS`] placements on the design's account at once, holders 1 and 2
/// of a forced row playing their interleaving and the others starting after them.
/// Returns the row's figures.
///
/// Errors: database errors, a racer that could not connect.
async fn run_row(
    ctx: &mut Ctx,
    db: &mut tokio_postgres::Client,
    design: Design,
    plan: Plan,
) -> anyhow::Result<Row> {
    let lock = Arc::new(LockService::new(
        (design == Design::LeaseExpires).then(|| Duration::from_millis(LEASE_MS)),
    ));
    let pair = Arc::new(Pair::default());
    let (pair_done_tx, pair_done) = watch::channel(0_usize);
    let pair_done_tx = Arc::new(pair_done_tx);
    let outcomes = ctx
        .race(PLACEMENTS, move |racer| {
            let (lock, pair, pair_done_tx, mut pair_done) = (
                lock.clone(),
                pair.clone(),
                pair_done_tx.clone(),
                pair_done.clone(),
            );
            async move {
                let mut client = racer.client;
                let account = design.account();
                let req = order(
                    &format!("place-08-{account}-{:02}", racer.index),
                    account,
                    Market::BtcUsdt,
                    Side::Buy,
                    "1.0",
                    "5000",
                )
                .map_err(|e| e.to_string())?;
                if design == Design::Conditional {
                    return frozen_balances::place(&mut client, &req, &frozen_balances::NoHooks)
                        .await
                        .map(|r| r.outcome == Outcome::Ok)
                        .map_err(|e| e.to_string());
                }
                let role = if design.forced_pair() {
                    racer.index.min(2)
                } else {
                    2
                };
                if design.forced_pair() && role == 2 {
                    let _ = pair_done.wait_for(|done| *done >= 2).await;
                }
                let result =
                    locked_place(&mut client, &lock, &pair, design, plan, role, &req).await;
                if design.forced_pair() && role < 2 {
                    pair_done_tx.send_modify(|done| *done += 1);
                }
                result.map_err(|e| e.to_string())
            }
        })
        .await?;
    read_row(db, design.account(), outcomes).await
}

/// The row's figures for `account` after its race: the OK and INSUFFICIENT counts and
/// errors of `outcomes` (whether each placement froze), the balance, and how many
/// reconciliation findings name the account.
///
/// Errors: database errors.
async fn read_row(
    db: &mut tokio_postgres::Client,
    account: &str,
    outcomes: Vec<Result<bool, String>>,
) -> anyhow::Result<Row> {
    let (available, frozen) = naive::read_balance(&*db, account, "USDT").await?;
    let findings = frozen_balances::reconcile(db).await?;
    let mismatches = findings
        .row_mismatches
        .iter()
        .filter(|m| m.account_id == account)
        .count()
        + findings
            .frozen_mismatches
            .iter()
            .filter(|m| m.account_id == account)
            .count();
    Ok(Row {
        ok: outcomes.iter().filter(|o| matches!(o, Ok(true))).count(),
        insufficient: outcomes.iter().filter(|o| matches!(o, Ok(false))).count(),
        errors: outcomes.into_iter().filter_map(Result::err).collect(),
        available,
        frozen,
        mismatches,
    })
}

/// The naive placement under `lock`; `role` 0 and 1 are holders 1 and 2 of a forced
/// row, 2 everybody else. Returns whether it froze.
async fn locked_place(
    client: &mut tokio_postgres::Client,
    lock: &LockService,
    pair: &Pair,
    design: Design,
    plan: Plan,
    role: usize,
    req: &PlaceRequest,
) -> anyhow::Result<bool> {
    let forced = plan == Plan::Forced && design.forced_pair();
    if role == 1 {
        match plan {
            Plan::Forced => pair.first_locked.notified().await,
            Plan::Harmless => pair.first_done.notified().await,
        }
    }
    let token = lock.acquire().await;
    if role == 0 {
        pair.first_locked.notify_one();
    }
    let amount = req.freeze()?.amount;
    let tx = client.transaction().await?;
    let (available, frozen) = naive::read_balance(&tx, &req.account_id, "USDT").await?;
    if forced && role == 1 {
        pair.second_read.notify_one();
    }
    if forced && role == 0 && design == Design::LeaseExpires {
        // The pause (a stop-the-world collection, a swapped-out process): the lease runs
        // out meanwhile and holder 2 takes the lock and commits.
        tokio::time::sleep(Duration::from_millis(PAUSE_MS)).await;
        pair.second_committed.notified().await;
    }
    let froze = available >= amount;
    if froze {
        naive::write_balance(
            &tx,
            &req.account_id,
            "USDT",
            available - amount,
            frozen + amount,
        )
        .await?;
        naive::record_placement(&tx, req).await?;
    }
    if design == Design::ReleasedBeforeCommit {
        lock.release(token);
        if forced && role == 0 {
            // Before COMMIT, the hook: holder 2 has the lock and reads meanwhile.
            pair.second_read.notified().await;
        }
    }
    if froze {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    if forced && role == 1 && design == Design::LeaseExpires {
        pair.second_committed.notify_one();
    }
    lock.release(token);
    if role == 0 {
        pair.first_done.notify_one();
    }
    Ok(froze)
}
