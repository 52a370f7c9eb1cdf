//! F8's lock outside the database as spec operations (`spec_calls`): an in-process async
//! lock per account with an optional lease, standing for a lock service (what a Redis or
//! ZooKeeper lock gives an application; LIMITS.md, "F8's lock stands for a lock
//! service"), and the naive placement that relies on it.
//!
//! - `locked-place account=A side=BUY qty=1.0 price=5000 key=K
//!   release=before-commit|after-commit [lease-ms=N] [pause=after-read|before-commit]`
//!   takes the account's lock (with a lease of N ms: lost when it runs out, whether or
//!   not its holder is done, and it is not told), then on the session's connection, in
//!   one transaction: reads `available` and `frozen` (a plain read), and if the freeze
//!   fits writes the values it computed and records operation, movement and order
//!   (`frozen_balances::naive`); the lock is let go before COMMIT (`before-commit`, as a
//!   `finally` step would while the surrounding transaction commits later) or after it.
//!   With `pause=POINT` it stops there (after its read, or before its COMMIT once the
//!   lock is let go) until `resume-place key=K`; meanwhile its step is reported waiting
//!   ([`Locks::waiting`]), a wait neither PostgreSQL nor the runner sees. Prints
//!   `outcome=OK read_available=6000.000000 available=995.000000 frozen=5005.000000`
//!   (what it read, then the row after it ended), `outcome=INSUFFICIENT …` when the
//!   freeze did not fit what it read (its transaction rolled back).
//! - `locked-place … count=N` runs N such placements at once, each on a connection of
//!   its own, released together by a barrier (`{i}` in `key` is the placement's index,
//!   `{i+2:02}` and the like as in a race), and prints their outcomes counted:
//!   `placements=32 ok=1 insufficient=31` (`errors=N first_error=…` when any failed).
//! - `resume-place key=K` lets the placement paused under K go on: `resumed=1` (`0`
//!   when none is paused under K).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use case_kit::spec::{Call, with_index};
use frozen_balances::amount::format_units;
use frozen_balances::{Asset, PlaceRequest, naive};
use tokio::sync::{Barrier, Notify};
use tokio_postgres::Client;

use super::spec_events::{Args, EventEngine};
use super::spec_settle::connect_own;

/// How often a waiting acquirer looks at the lock again, milliseconds.
pub const ACQUIRE_POLL_MS: u64 = 1;

/// A lock on one account as a lock service hands it out: one holder at a time,
/// identified by a token; with a lease, the holder loses it when the lease runs out,
/// whether or not it is done (it is not told). Release by an old token does nothing.
#[derive(Default)]
struct LockService {
    holder: Mutex<Option<(u64, Option<Instant>)>>,
    next: AtomicU64,
}

impl LockService {
    /// Waits until the lock is free (or its holder's lease ran out), takes it for
    /// `lease` (for good when `None`) and returns its token.
    async fn acquire(&self, lease: Option<Duration>) -> u64 {
        loop {
            {
                let mut holder = self.holder.lock().unwrap_or_else(|p| p.into_inner());
                let free = match *holder {
                    None => true,
                    Some((_, Some(expires))) => Instant::now() >= expires,
                    Some((_, None)) => false,
                };
                if free {
                    let token = self.next.fetch_add(1, Ordering::SeqCst) + 1;
                    *holder = Some((token, lease.map(|lease| Instant::now() + lease)));
                    return token;
                }
            }
            tokio::time::sleep(Duration::from_millis(ACQUIRE_POLL_MS)).await;
        }
    }

    /// Lets the lock go if `token` still holds it.
    fn release(&self, token: u64) {
        let mut holder = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*holder, Some((current, _)) if current == token) {
            *holder = None;
        }
    }
}

/// Where a placement may pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    AfterRead,
    BeforeCommit,
}

/// How one locked placement runs: its lock, when it lets it go, its lease and pause.
struct Plan<'a> {
    lock: &'a LockService,
    before_commit: bool,
    lease: Option<Duration>,
    pause: Option<(Pause, &'a Locks)>,
}

/// The locks of one case, one per account, and the placements paused now.
pub struct Locks {
    database_url: String,
    locks: Mutex<BTreeMap<String, Arc<LockService>>>,
    paused: Mutex<BTreeMap<String, Arc<Notify>>>,
}

impl Locks {
    /// No lock taken yet; `count=` placements connect to `database_url`.
    pub fn new(database_url: String) -> Locks {
        Locks {
            database_url,
            locks: Mutex::new(BTreeMap::new()),
            paused: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock_of(&self, account: &str) -> Arc<LockService> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(account.to_owned()).or_default().clone()
    }

    /// Whether `call` is a `locked-place` paused now (see the module documentation).
    pub fn waiting(&self, call: &Call) -> bool {
        if call.op != "locked-place" || call.arg("pause").is_none() {
            return false;
        }
        let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        call.arg("key").is_some_and(|key| paused.contains_key(key))
    }

    /// Pauses the placement `key` until `resume-place key=K`.
    async fn pause(&self, key: &str) {
        let resumed = Arc::new(Notify::new());
        self.paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), resumed.clone());
        resumed.notified().await;
    }

    /// `locked-place` or `resume-place` (see the module documentation).
    ///
    /// Errors: bad arguments; a database error of a single placement; a connection
    /// failure of `count=`.
    pub async fn run(&self, client: &mut Client, call: &Call) -> Result<String, String> {
        let args = Args(call);
        if call.op == "resume-place" {
            let key = args.text("key")?;
            let paused = self
                .paused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(key);
            if let Some(resumed) = &paused {
                resumed.notify_one();
            }
            return Ok(format!("resumed={}", usize::from(paused.is_some())));
        }
        let req = args.place_request()?;
        let lock = self.lock_of(&req.account_id);
        let pause = match call.arg("pause") {
            None => None,
            Some("after-read") => Some((Pause::AfterRead, self)),
            Some(_) => Some((Pause::BeforeCommit, self)),
        };
        let lease = match call.arg("lease-ms") {
            Some(ms) => Some(Duration::from_millis(ms.parse().map_err(|_| "lease-ms=N")?)),
            None => None,
        };
        let plan = Plan {
            lock: &lock,
            before_commit: call.arg("release") == Some("before-commit"),
            lease,
            pause,
        };
        match call.arg("count") {
            Some(count) => {
                let count: usize = count.parse().map_err(|_| "count=N")?;
                if plan.pause.is_some() {
                    return Err("count= takes no pause=".into());
                }
                self.many(call, &req, count, &plan).await
            }
            None => {
                let (froze, read) = locked_place(client, &req, &plan)
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                let after =
                    EventEngine::balance(client, &req.tenant_id, &req.account_id, Asset::Usdt)
                        .await;
                let outcome = if froze { "OK" } else { "INSUFFICIENT" };
                let read = format_units(Asset::Usdt, read);
                Ok(format!("outcome={outcome} read_available={read} {after}"))
            }
        }
    }

    /// `count=` placements like `req` (business id `key` with `{i}` filled in) at once,
    /// each on a connection of its own, released together by a barrier; their outcomes
    /// counted.
    async fn many(
        &self,
        call: &Call,
        req: &PlaceRequest,
        count: usize,
        plan: &Plan<'_>,
    ) -> Result<String, String> {
        let mut clients = Vec::with_capacity(count);
        for _ in 0..count {
            clients.push(connect_own(&self.database_url).await?);
        }
        let barrier = Barrier::new(count);
        let key = call.arg("key").unwrap_or_default();
        let placements = clients.iter_mut().enumerate().map(|(index, client)| {
            let req = PlaceRequest {
                business_id: with_index(key, index),
                ..req.clone()
            };
            let barrier = &barrier;
            async move {
                barrier.wait().await;
                locked_place(client, &req, plan).await
            }
        });
        let outcomes = futures_util::future::join_all(placements).await;
        let ok = outcomes
            .iter()
            .filter(|o| matches!(o, Ok((true, _))))
            .count();
        let insufficient = outcomes
            .iter()
            .filter(|o| matches!(o, Ok((false, _))))
            .count();
        let mut shown = format!("placements={count} ok={ok} insufficient={insufficient}");
        let errors: Vec<String> = outcomes
            .iter()
            .filter_map(|o| o.as_ref().err().map(|e| format!("{e:#}")))
            .collect();
        if let Some(first) = errors.first() {
            shown.push_str(&format!(" errors={} first_error={first}", errors.len()));
        }
        Ok(shown)
    }
}

/// The naive placement under its account's lock, as `plan` says (see the module
/// documentation). Returns whether it froze, and the `available` it read.
///
/// Errors: database errors; a request the library refuses.
async fn locked_place(
    client: &mut Client,
    req: &PlaceRequest,
    plan: &Plan<'_>,
) -> anyhow::Result<(bool, i64)> {
    let paused_at = |point: Pause| match plan.pause {
        Some((at, locks)) if at == point => Some(locks),
        _ => None,
    };
    let amount = req.freeze()?.amount;
    let token = plan.lock.acquire(plan.lease).await;
    let tx = client.transaction().await?;
    let (available, frozen) = naive::read_balance(&tx, &req.account_id, "USDT").await?;
    if let Some(locks) = paused_at(Pause::AfterRead) {
        // A stop-the-world pause: a lease may run out meanwhile, and another holder
        // take the lock and commit.
        locks.pause(&req.business_id).await;
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
    if plan.before_commit {
        plan.lock.release(token);
    }
    if let Some(locks) = paused_at(Pause::BeforeCommit) {
        locks.pause(&req.business_id).await;
    }
    if froze {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    plan.lock.release(token);
    Ok((froze, available))
}
