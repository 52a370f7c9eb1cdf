//! R1 in the batch transfer (`ledger-svc --transfer-mode batch`, docs/batch.md) through
//! the pooler: the L3 race, L8's same key at once and L7's lost response.
//!
//! The service hands every debit to its batcher, whose drainers
//! (`points_ledger::batcher::BATCH_DRAINERS`, 2) each drain one lane, one batch at a time on one pooled
//! connection: `BEGIN`, one call of `ledger_transfer_batch`, `COMMIT`. A request queues in
//! the lane of its system account (`points_ledger::batcher::lane_of`): every debit of
//! these cases credits the one sink, so all of them run in one lane, on one server
//! session at a time. Without fault injection (the service as deployed) the three
//! statements are pipelined in one round trip; PgBouncer keeps a client on its server
//! session until the server reports the transaction ended (ReadyForQuery idle, which
//! comes only after the `COMMIT`), so the three still reach one server session. The race
//! and the same key run on such a service; the lost response needs the `after-commit`
//! pause, so it runs on a second one with fault injection (there the batch stops at
//! `before-commit`: three round trips).
//!
//! The service then holds fewer server sessions for these debits than the pooler's
//! four: the queue of concurrent requests forms in the batcher, not in the pooler, and
//! filling the pool (the other modes' forcing) cannot happen. The race is forced in two
//! steps instead, each seen, never timed: with a holder straight to PostgreSQL locking
//! the account, the first request alone until one server session is seen waiting on a
//! lock (`pg_stat_activity`; the lane's batch of one), then the rest until the batcher's
//! queue (`GET /batch`, `queued`) holds them all. Released, the batch of one goes first
//! and the queue becomes one batch: the batch sizes (`GET /batch`, `sizes`) are 1 and
//! the rest, on any machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cases_ledger::http::LedgerReply;
use launch::service::{Reply, Service};
use points_ledger::TransferMode;
use scratch_pg::Cluster;
use scratch_pg::bouncer::Bouncer;

use crate::pair::LEDGER_DATABASE;
use crate::pooled::{
    self, ACCOUNT_LOCK_SQL, CLIENTS, Holder, POLL_MS, Pending, SERVICE_BOUND_MS, START_BALANCE,
    balance, count, debit, txns_for_key, waiting_on_lock,
};
use case_kit::Ctx;

const RACE_DEBIT: i64 = 7;
const SAME_KEY_REQUESTS: usize = 16;
const SAME_KEY_DEBIT: i64 = 10;
const MODE: TransferMode = TransferMode::Batch;
/// The batches one account's debits can hold at once: they all credit the one sink, so
/// they queue in one lane, drained by one drainer.
const LANE_BATCHES: usize = 1;

/// The three claims in the batch transfer, on accounts `first`, `first + 1`,
/// `first + 2` (seeded test accounts).
///
/// Errors: a service did not start or stop; SQL, transport or admin-route errors.
pub async fn through_batch(
    ctx: &mut Ctx,
    primary: &Cluster,
    bouncer: &Bouncer,
    first: u32,
) -> anyhow::Result<()> {
    let accounts: Vec<String> = (first..first + 3)
        .map(points_ledger::test_account)
        .collect();
    let options = pooled::service_options(false, &["--transfer-mode", MODE.as_str()]);
    let service = pooled::launch(ctx, bouncer, options, "ledger-svc-batch").await?;
    pooled::fund(&service, MODE.as_str(), &accounts[..2]).await?;
    race(ctx, primary, &service, &accounts[0]).await?;
    same_key(ctx, primary, &service, &accounts[1]).await?;
    pooled::stop(ctx, service).await?;

    let options = pooled::service_options(true, &["--transfer-mode", MODE.as_str()]);
    let service = pooled::launch(ctx, bouncer, options, "ledger-svc-batch-faults").await?;
    pooled::fund(&service, "batch-faults", &accounts[2..]).await?;
    pooled::lost_response(ctx, primary, &service, MODE, &accounts[2]).await?;
    pooled::stop(ctx, service).await
}

/// What [`stepwise`] saw.
struct Stepwise {
    /// The replies, in request order.
    replies: Vec<Reply>,
    /// Server sessions seen waiting on a lock once the lane's drainer had a batch.
    waiting: usize,
    /// Requests seen queued in the batcher then.
    queued: usize,
    /// The sizes of the batches that ran them, ascending.
    sizes: Vec<usize>,
}

/// Sends `total` requests (`request(n)` spawns the n-th) in the two seen steps of the
/// module's documentation while a holder locks `account`, then releases the holder.
///
/// Errors: SQL, transport or admin-route errors; a step not seen within the bound.
async fn stepwise(
    primary: &Cluster,
    service: &Service,
    account: &str,
    total: usize,
    request: impl Fn(usize) -> Pending,
) -> anyhow::Result<Stepwise> {
    let before = batch_sizes(service).await?;
    let holder = Holder::lock(primary, ACCOUNT_LOCK_SQL, &[&account]).await?;
    let mut requests = Vec::new();
    requests.extend((0..LANE_BATCHES).map(&request));
    let waiting = waiting_on_lock(primary, LANE_BATCHES).await?;
    requests.extend((LANE_BATCHES..total).map(&request));
    let queued = queued_reaches(service, total - LANE_BATCHES).await?;
    holder.release().await?;
    let replies = pooled::replies(requests).await?;
    let after = batch_sizes(service).await?;
    let mut sizes = Vec::new();
    for (size, (now, then)) in after.iter().zip(before.iter()).enumerate() {
        sizes.extend(std::iter::repeat_n(size, (now - then) as usize));
    }
    Ok(Stepwise {
        replies,
        waiting,
        queued,
        sizes,
    })
}

/// The L3 race in the batch transfer: [`CLIENTS`] debits of 7 from 100.
async fn race(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    account: &str,
) -> anyhow::Result<()> {
    let seen = stepwise(primary, service, account, CLIENTS, |c| {
        debit(
            service,
            format!("k-r1-{MODE}-race-{c:02}"),
            account,
            RACE_DEBIT,
        )
    })
    .await?;
    let (ok, insufficient) = (
        count(&seen.replies, "201 OK"),
        count(&seen.replies, "409 INSUFFICIENT"),
    );
    ctx.check_eq(
        format!("{MODE}: race: server sessions seen waiting on the holder's lock, requests queued in the batcher"),
        format!("{:?}", (LANE_BATCHES, CLIENTS - LANE_BATCHES)),
        format!("{:?}", (seen.waiting, seen.queued)),
    );
    ctx.check_eq(
        format!("{MODE}: race: 32 debits of 7 from 100 → OK, INSUFFICIENT, other"),
        format!("{:?}", (14, 18, 0)),
        format!("{:?}", (ok, insufficient, CLIENTS - ok - insufficient)),
    );
    ctx.check_eq(
        format!("{MODE}: race: sizes of the batches that ran it, balance after"),
        format!(
            "{:?}",
            (vec![1, CLIENTS - 1], START_BALANCE - 14 * RACE_DEBIT)
        ),
        format!(
            "{:?}",
            (
                seen.sizes,
                balance(&primary.connect(LEDGER_DATABASE).await?, account).await?
            )
        ),
    );
    Ok(())
}

/// L8 in the batch transfer: [`SAME_KEY_REQUESTS`] requests with one key.
async fn same_key(
    ctx: &mut Ctx,
    primary: &Cluster,
    service: &Arc<Service>,
    account: &str,
) -> anyhow::Result<()> {
    let key = format!("k-r1-{MODE}-same");
    let seen = stepwise(primary, service, account, SAME_KEY_REQUESTS, |_| {
        debit(service, key.clone(), account, SAME_KEY_DEBIT)
    })
    .await?;
    let created = seen
        .replies
        .iter()
        .filter(|r| r.status_outcome() == "201 OK");
    let executed = created.clone().filter(|r| !r.replayed).count();
    let replayed = created.clone().filter(|r| r.replayed).count();
    let txn_ids: std::collections::BTreeSet<Option<i64>> = created.map(|r| r.txn_id()).collect();
    ctx.check_eq(
        format!("{MODE}: same key: server sessions seen waiting on a lock, requests queued in the batcher"),
        format!("{:?}", (LANE_BATCHES, SAME_KEY_REQUESTS - LANE_BATCHES)),
        format!("{:?}", (seen.waiting, seen.queued)),
    );
    ctx.check_eq(
        format!("{MODE}: same key: 16 requests → executed, replayed, distinct txn ids"),
        format!("{:?}", (1, SAME_KEY_REQUESTS - 1, 1)),
        format!("{:?}", (executed, replayed, txn_ids.len())),
    );
    let db = primary.connect(LEDGER_DATABASE).await?;
    ctx.check_eq(
        format!("{MODE}: same key: batch sizes, transactions for the key, balance"),
        format!(
            "{:?}",
            (
                vec![1, SAME_KEY_REQUESTS - 1],
                1,
                START_BALANCE - SAME_KEY_DEBIT
            )
        ),
        format!(
            "{:?}",
            (
                seen.sizes,
                txns_for_key(&db, &key).await?,
                balance(&db, account).await?
            )
        ),
    );
    Ok(())
}

/// `GET /batch` on the admin listener.
///
/// Errors: transport errors; another status.
async fn batch_state(service: &Service) -> anyhow::Result<serde_json::Value> {
    let reply = service
        .send(service.http().get(service.admin_url("/batch")))
        .await?;
    anyhow::ensure!(reply.status == 200, "GET /batch answered {}", reply.status);
    Ok(reply.body)
}

/// `sizes` of `GET /batch`: batches of each size since the service started.
///
/// Errors: as [`batch_state`].
async fn batch_sizes(service: &Service) -> anyhow::Result<Vec<u64>> {
    let state = batch_state(service).await?;
    Ok(state["sizes"]
        .as_array()
        .map(|sizes| sizes.iter().filter_map(|n| n.as_u64()).collect())
        .unwrap_or_default())
}

/// Reads `GET /batch` every [`POLL_MS`] until `want` requests are queued; returns the
/// count seen then.
///
/// Errors: as [`batch_state`]; not seen within [`SERVICE_BOUND_MS`].
async fn queued_reaches(service: &Service, want: usize) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_millis(SERVICE_BOUND_MS);
    loop {
        let queued = batch_state(service).await?["queued"]
            .as_u64()
            .unwrap_or_default() as usize;
        if queued >= want {
            return Ok(queued);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {queued} of {want} requests seen queued in the batcher"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}
