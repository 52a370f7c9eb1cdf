//! F9's deadlocks as spec operations (`spec_calls`): opposite settlements in the naive
//! form, and the product's fills met at a hook point in a race, with their attempts
//! counted.
//!
//! - `naive-settle order=request|sorted [pairs=N] [at-once=yes]` runs N pairs of opposite
//!   settlements on two connections of its own: trade 0 is alice buying from bob, trade 1
//!   the reverse; each locks the buyer's USDT row then the seller's (`order=request`), or
//!   both in account order (`order=sorted`), then bumps both rows' `version` (no amount
//!   moves) and commits, with `deadlock_timeout` at [`DEADLOCK_TIMEOUT_MS`] in its
//!   transaction so the detector runs at once. With `at-once=yes` both settlements of a
//!   pair run at once and meet at a barrier: between their two row locks in request order
//!   (both hold their first row, so the cycle is certain), before their first in sorted
//!   order; without it, one after the other. Prints `pairs=4 deadlocks_n=4 committed_n=4
//!   settled=8 deadlocked=yes` in request order (the split is the deadlock detector's, so
//!   its counts are redacted), `pairs=4 deadlocks=0 committed=8 settled=8 deadlocked=no`
//!   in sorted order; `settled` counts settlements that either committed or were the
//!   deadlock's victim (40P01). Another error fails the step.
//! - `fill … meet=registered` in a `race call:` holds each fill's first attempt at hook
//!   point `registered` until every racer's fill is there (the race's barrier; a retry
//!   passes), and counts each fill's attempts (each attempt passes `registered` once);
//!   `fill-attempts` prints what they took: `fills=8 retries_n=0 within_bound=true
//!   max_attempts=5` (`retries_n`: attempts beyond the first, redacted as it varies;
//!   `within_bound`: every fill took between 1 and the library's
//!   `MAX_DEADLOCK_ATTEMPTS`).

use std::sync::atomic::{AtomicBool, Ordering};

use case_kit::spec::Call;
use frozen_balances::events::{DEADLOCK_DETECTED, MAX_DEADLOCK_ATTEMPTS};
use frozen_balances::{EventKind, HookAbort, HookContext, HookPoint, Hooks};
use futures_util::future::BoxFuture;
use tokio::sync::Barrier;
use tokio_postgres::Client;

use super::fixtures::CountAttempts;
use super::spec_events;

/// `deadlock_timeout` of the naive settlements, milliseconds (PostgreSQL docs §19.12).
pub const DEADLOCK_TIMEOUT_MS: u64 = 10;

/// The tenant the naive settlements lock rows of.
const TENANT: &str = frozen_balances::DEFAULT_TENANT;

/// The deadlock operations of one case: where its database is, and the attempts of
/// its racing fills.
pub struct Deadlocks {
    database_url: String,
    attempts: CountAttempts,
}

impl Deadlocks {
    /// Nothing counted yet; the naive settlements connect to `database_url`.
    pub fn new(database_url: String) -> Deadlocks {
        Deadlocks {
            database_url,
            attempts: CountAttempts::default(),
        }
    }

    /// `naive-settle` or `fill-attempts` (see the module documentation).
    ///
    /// Errors: bad arguments; a connection failure; a settlement that failed otherwise
    /// than with 40P01.
    pub async fn run(&self, call: &Call) -> Result<String, String> {
        if call.op == "fill-attempts" {
            return Ok(self.attempts_shown());
        }
        let pairs: usize = call
            .arg("pairs")
            .unwrap_or("1")
            .parse()
            .map_err(|_| "pairs=N")?;
        let sorted = call.arg("order") == Some("sorted");
        let at_once = call.arg("at-once") == Some("yes");
        let (mut deadlocks, mut committed) = (0, 0);
        for _ in 0..pairs {
            let (d, c) = self.pair(sorted, at_once).await?;
            deadlocks += d;
            committed += c;
        }
        let settled = deadlocks + committed;
        let deadlocked = if deadlocks > 0 { "yes" } else { "no" };
        Ok(if sorted {
            format!(
                "pairs={pairs} deadlocks={deadlocks} committed={committed} settled={settled} deadlocked={deadlocked}"
            )
        } else {
            format!(
                "pairs={pairs} deadlocks_n={deadlocks} committed_n={committed} settled={settled} deadlocked={deadlocked}"
            )
        })
    }

    /// One pair of opposite settlements, each on a connection of its own: at once
    /// (meeting at a barrier of two) or one after the other. Returns (settlements that
    /// failed with 40P01, settlements that committed).
    async fn pair(&self, sorted: bool, at_once: bool) -> Result<(usize, usize), String> {
        let url = &self.database_url;
        let (mut one, mut two) = (connect_own(url).await?, connect_own(url).await?);
        let results = if at_once {
            let barrier = Barrier::new(2);
            let (x, y) = tokio::join!(
                settle(&mut one, 0, sorted, Some(&barrier)),
                settle(&mut two, 1, sorted, Some(&barrier))
            );
            [x, y]
        } else {
            [
                settle(&mut one, 0, sorted, None).await,
                settle(&mut two, 1, sorted, None).await,
            ]
        };
        let mut counts = (0, 0);
        for result in results {
            match result? {
                true => counts.1 += 1,
                false => counts.0 += 1,
            }
        }
        Ok(counts)
    }

    /// `fill-attempts`'s line.
    fn attempts_shown(&self) -> String {
        let counts = self.attempts.attempts();
        let retries: u32 = counts.values().map(|a| a - 1).sum();
        let most = counts.values().copied().max().unwrap_or(0);
        let within = (1..=MAX_DEADLOCK_ATTEMPTS).contains(&most);
        format!(
            "fills={} retries_n={retries} within_bound={within} max_attempts={MAX_DEADLOCK_ATTEMPTS}",
            counts.len()
        )
    }

    /// `fill … meet=registered` as one racer of a `race call:`: the fill with its first
    /// attempt held at `registered` until every racer is there (`barrier`), its attempts
    /// counted for `fill-attempts`.
    ///
    /// Errors: as the `fill` event's.
    pub async fn fill_meeting(
        &self,
        client: &mut Client,
        call: &Call,
        barrier: &Barrier,
    ) -> Result<String, String> {
        let hooks = MeetOnce {
            counter: &self.attempts,
            barrier,
            met: AtomicBool::new(false),
        };
        spec_events::event(client, call, &hooks).await
    }
}

/// A connection of its own to the database at `database_url`, its task spawned (the
/// connections a step opens besides its session's: `naive-settle`'s pairs,
/// `locked-place … count=`).
///
/// Errors: the URL or the connection.
pub async fn connect_own(database_url: &str) -> Result<Client, String> {
    let config: tokio_postgres::Config = database_url.parse().map_err(|e| format!("{e}"))?;
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// One naive settlement: trade 0 is alice buying from bob, trade 1 the reverse; locks
/// the buyer's then the seller's USDT row (`sorted`: in account order), meeting the
/// other settlement at `barrier` if given (before the first lock when sorted, between
/// the two otherwise), then bumps both rows' `version`. Returns whether it committed
/// (`false`: it was the deadlock's victim).
///
/// Errors: any other database error.
async fn settle(
    client: &mut Client,
    trade: usize,
    sorted: bool,
    barrier: Option<&Barrier>,
) -> Result<bool, String> {
    let (buyer, seller) = if trade == 0 {
        ("alice", "bob")
    } else {
        ("bob", "alice")
    };
    let mut order = [buyer, seller];
    if sorted {
        order.sort();
    }
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    let settled = async {
        tx.batch_execute(&format!(
            "SET LOCAL deadlock_timeout = '{DEADLOCK_TIMEOUT_MS}ms'"
        ))
        .await?;
        if let (true, Some(barrier)) = (sorted, barrier) {
            barrier.wait().await;
        }
        for (i, account) in order.into_iter().enumerate() {
            tx.execute(
                "SELECT 1 FROM balance WHERE tenant_id = $1 AND account_id = $2 \
                 AND asset = 'USDT' FOR UPDATE",
                &[&TENANT, &account],
            )
            .await?;
            if let (0, false, Some(barrier)) = (i, sorted, barrier) {
                // Both hold their first row now: the cycle is certain.
                barrier.wait().await;
            }
        }
        tx.execute(
            "UPDATE balance SET version = version + 1 WHERE tenant_id = $1 \
             AND account_id = ANY($2) AND asset = 'USDT'",
            &[&TENANT, &vec![buyer, seller]],
        )
        .await?;
        Ok::<(), tokio_postgres::Error>(())
    }
    .await;
    match settled {
        Ok(()) => tx.commit().await.map(|()| true).map_err(|e| e.to_string()),
        Err(e) if e.code().map(|c| c.code()) == Some(DEADLOCK_DETECTED) => Ok(false),
        Err(e) => Err(format!("a naive settlement failed otherwise: {e}")),
    }
}

/// Counts a fill's attempts, and holds its first attempt at `registered` until every
/// racer's fill gets there (`barrier`); a retry passes.
struct MeetOnce<'a> {
    counter: &'a CountAttempts,
    barrier: &'a Barrier,
    met: AtomicBool,
}

impl Hooks for MeetOnce<'_> {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(async move {
            self.counter.at(ctx).await?;
            let here = ctx.event == EventKind::Fill && ctx.point == HookPoint::Registered;
            if here && !self.met.swap(true, Ordering::SeqCst) {
                self.barrier.wait().await;
            }
            Ok(())
        })
    }
}
