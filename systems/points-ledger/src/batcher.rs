//! The collector of the batch mode: concurrent requests queue here and a few drainers
//! execute them in batches ([`crate::batch::transfer_batch`]).
//!
//! A drainer never waits to fill a batch: when it is free it takes whatever is queued, up
//! to [`BatchLimits::max_requests`], and executes it at once; requests that arrive
//! meanwhile queue for the next free drainer. An idle system therefore adds no wait (a
//! lone request is a batch of one), and a loaded one makes batches as large as the
//! queue that builds during one batch's execution and commit. Before taking the next
//! batch, a drainer yields to the scheduler while that lets more requests in (never a
//! timer): the submitters it just answered, in a closed loop, join the next batch rather
//! than the one after it (`Shared::settle`). Few drainers
//! ([`BatchLimits::drainers`], default [`BATCH_DRAINERS`]) rather than one batch per
//! client: concurrent batches queue on the sink's row and on each other's rows, so more
//! of them only adds waits.
//!
//! **Lanes.** Each drainer drains its own lane, and a request queues in the lane of the
//! system account it names ([`lane_of`]): redemption stripe `sys-redeem-NN` in lane
//! `NN mod drainers`, any other account by a stable hash. So two drainers never lock
//! the same sink row, and never wait for each other's COMMIT on it; a debited account
//! always credits the same stripe, so its debits stay in one lane too. With one sink
//! (no stripes) every debit is in one lane: one drainer executes them (two would only
//! take turns on the sink's row); the others take the grants (the issuer's lane).
//!
//! A submitter is answered only after its batch's COMMIT returned (or failed); then its
//! own task passes [`HookPoint::AfterCommit`](crate::HookPoint::AfterCommit). A
//! submitter that stops waiting before a drainer took its request (its future dropped)
//! is left out of the batch and never executed.
//!
//! [`Batcher::hold`] stops the drainers from taking new requests (a batch under way goes
//! on), so a test can queue a known set, see it queued ([`Batcher::queued`]), and release
//! it as one batch; nothing else ever holds the queue.

use std::collections::VecDeque;
use std::ops::DerefMut;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::future::BoxFuture;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use crate::batch::{BatchAnswer, PreparedBatchCall, transfer_batch_prepared};
use crate::error::LedgerError;
use crate::schema::is_system_account;
use crate::striping::stripe_index;
use crate::transfer::{Hooks, TransferRequest, after_commit};

/// Most requests one batch takes from the queue.
pub const BATCH_MAX_REQUESTS: usize = 64;
/// Drainers (each with one database connection per batch) by default.
pub const BATCH_DRAINERS: usize = 2;

/// A connection a drainer uses for one batch, handed back when dropped.
pub type Lease = Box<dyn BatchConnection>;

/// A connection lent to one batch, with what it keeps between batches.
pub trait BatchConnection: DerefMut<Target = Client> + Send {
    /// The batch call prepared on this connection (prepared on its first batch, kept for
    /// the next: [`PreparedBatchCall`]), or `None` where the call must stay an unnamed
    /// statement (behind a transaction pooler) or could not be prepared. By default
    /// `None`.
    fn prepared_call(&mut self) -> BoxFuture<'_, Option<PreparedBatchCall>> {
        Box::pin(std::future::ready(None))
    }
}

/// Where drainers get their connections: a pool (the service), fixed connections (the
/// bench, tests: [`FixedConnections`]).
pub trait ConnectionSource: Send + Sync + 'static {
    /// A connection for one batch.
    ///
    /// Errors: [`LedgerError::Db`] or any error the source reports; the batch is then
    /// answered [`LedgerError::BatchFailed`].
    fn connection(&self) -> BoxFuture<'_, Result<Lease, LedgerError>>;
}

/// How batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most requests per batch (≥ 1).
    pub max_requests: usize,
    /// Drainers, each executing one batch at a time (≥ 1).
    pub drainers: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_requests: BATCH_MAX_REQUESTS,
            drainers: BATCH_DRAINERS,
        }
    }
}

/// Batch sizes seen so far: a histogram, one count per size.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatchSizes {
    /// `counts[n]`: batches of `n` requests.
    pub counts: Vec<u64>,
}

impl BatchSizes {
    /// Batches executed.
    pub fn batches(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Requests executed in them.
    pub fn requests(&self) -> u64 {
        self.counts
            .iter()
            .enumerate()
            .map(|(size, n)| size as u64 * n)
            .sum()
    }

    /// Mean requests per batch (0 without batches).
    pub fn mean(&self) -> f64 {
        match self.batches() {
            0 => 0.0,
            batches => self.requests() as f64 / batches as f64,
        }
    }

    /// The size at or below which 99% of batches were (0 without batches).
    pub fn p99(&self) -> usize {
        let batches = self.batches();
        let mut seen = 0;
        for (size, n) in self.counts.iter().enumerate() {
            seen += n;
            if batches > 0 && seen * 100 >= batches * 99 {
                return size;
            }
        }
        0
    }

    /// The sizes seen since `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &BatchSizes) -> BatchSizes {
        let counts = self
            .counts
            .iter()
            .enumerate()
            .map(|(size, n)| n - earlier.counts.get(size).copied().unwrap_or(0))
            .collect();
        BatchSizes { counts }
    }
}

/// A queued request and where its answer goes.
struct Pending {
    request: TransferRequest,
    answer: oneshot::Sender<BatchAnswer>,
}

/// The lane (`0..lanes`) where `request` queues: that of its system account (`to` if it
/// is one, else `from` if it is one, else `from`): redemption stripe `NN` in lane
/// `NN mod lanes`, any other account by its FNV-1a hash (stable across processes).
pub fn lane_of(request: &TransferRequest, lanes: usize) -> usize {
    if lanes <= 1 {
        return 0;
    }
    let account = if is_system_account(&request.to) {
        &request.to
    } else {
        &request.from
    };
    if let Some(stripe) = stripe_index(account) {
        return stripe as usize % lanes;
    }
    let hash = account
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    (hash % lanes as u64) as usize
}

/// The lanes (one per drainer) and the gate.
struct Queue {
    lanes: Vec<VecDeque<Pending>>,
    held: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// One per lane: its drainer waits here.
    wake: Vec<Notify>,
    sizes: Mutex<BatchSizes>,
    limits: BatchLimits,
    hooks: Arc<dyn Hooks>,
    source: Box<dyn ConnectionSource>,
}

/// The collector: submit requests, drainers execute them in batches. Dropping it stops
/// the drainers (a batch under way is cut off with its connection, and rolled back by
/// the server).
pub struct Batcher {
    shared: Arc<Shared>,
    drainers: Vec<JoinHandle<()>>,
}

impl Batcher {
    /// Starts `limits.drainers` drainers taking connections from `source`; `hooks` are
    /// passed at before-commit (in the drainer, per request) and after-commit (in the
    /// submitter's task). Must be called inside a Tokio runtime.
    pub fn start(
        source: Box<dyn ConnectionSource>,
        hooks: Arc<dyn Hooks>,
        limits: BatchLimits,
    ) -> Batcher {
        let limits = BatchLimits {
            max_requests: limits.max_requests.max(1),
            drainers: limits.drainers.max(1),
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                lanes: (0..limits.drainers).map(|_| VecDeque::new()).collect(),
                held: false,
            }),
            wake: (0..limits.drainers).map(|_| Notify::new()).collect(),
            sizes: Mutex::new(BatchSizes {
                counts: vec![0; limits.max_requests + 1],
            }),
            limits,
            hooks,
            source,
        });
        let drainers = (0..limits.drainers)
            .map(|lane| tokio::spawn(drain(shared.clone(), lane)))
            .collect();
        Batcher { shared, drainers }
    }

    /// Executes `request` in the next batch a drainer takes, then passes its after-commit
    /// point: the answer [`crate::transfer()`] would give alone (replay, fingerprint,
    /// outcome), or [`LedgerError::BatchFailed`] when its batch failed.
    pub async fn submit(&self, request: TransferRequest) -> BatchAnswer {
        let (answer, answered) = oneshot::channel();
        let lane = lane_of(&request, self.shared.limits.drainers);
        self.shared.lock_queue().lanes[lane].push_back(Pending {
            request: request.clone(),
            answer,
        });
        self.shared.wake[lane].notify_one();
        let result = answered.await.unwrap_or_else(|_| {
            Err(LedgerError::BatchFailed {
                code: None,
                message: String::from("the batcher stopped before answering"),
            })
        })?;
        after_commit(self.shared.hooks.as_ref(), &request, result).await
    }

    /// Requests queued (in all lanes) and not yet taken by a drainer.
    pub fn queued(&self) -> usize {
        self.shared
            .lock_queue()
            .lanes
            .iter()
            .map(VecDeque::len)
            .sum()
    }

    /// Holds (`true`) or releases (`false`) the queue: held, no drainer takes a new batch.
    pub fn hold(&self, held: bool) {
        self.shared.lock_queue().held = held;
        if !held {
            for wake in &self.shared.wake {
                wake.notify_one();
            }
        }
    }

    /// Whether the queue is held ([`Batcher::hold`]).
    pub fn is_held(&self) -> bool {
        self.shared.lock_queue().held
    }

    /// The batch sizes seen since the start.
    pub fn sizes(&self) -> BatchSizes {
        self.shared
            .sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The limits in force.
    pub fn limits(&self) -> BatchLimits {
        self.shared.limits
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        for drainer in &self.drainers {
            drainer.abort();
        }
    }
}

impl Shared {
    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets the submitters this drainer just answered, and every other runnable task, run
    /// before it takes `lane` again: yields to the scheduler (`tokio::task::yield_now`,
    /// never a timer) as long as each yield brought more requests into the lane, at most
    /// `max_requests` times. A submitter that answers its caller and submits the next
    /// request at once (a closed loop: the bench's clients, a caller's next debit) joins
    /// the next batch instead of the one after it; with nothing else runnable (an idle
    /// system) the first yield returns at once and nothing is added.
    async fn settle(&self, lane: usize) {
        for _ in 0..self.limits.max_requests {
            let before = self.lock_queue().lanes[lane].len();
            tokio::task::yield_now().await;
            if self.lock_queue().lanes[lane].len() <= before {
                break;
            }
        }
    }

    /// Waits until the queue is released and `lane` is not empty, then takes up to the
    /// maximum from it, leaving out requests whose submitter stopped waiting.
    async fn take(&self, lane: usize) -> Vec<Pending> {
        loop {
            {
                let mut queue = self.lock_queue();
                if !queue.held {
                    let waiting = &mut queue.lanes[lane];
                    waiting.retain(|pending| !pending.answer.is_closed());
                    if !waiting.is_empty() {
                        let count = waiting.len().min(self.limits.max_requests);
                        return waiting.drain(..count).collect();
                    }
                }
            }
            self.wake[lane].notified().await;
        }
    }
}

/// The drainer of `lane`: take, execute, answer, forever.
async fn drain(shared: Arc<Shared>, lane: usize) {
    loop {
        let batch = shared.take(lane).await;
        let (requests, answers): (Vec<TransferRequest>, Vec<_>) = batch
            .into_iter()
            .map(|pending| (pending.request, pending.answer))
            .unzip();
        let results = match shared.source.connection().await {
            Ok(mut lease) => {
                let prepared = lease.prepared_call().await;
                let hooks = shared.hooks.as_ref();
                transfer_batch_prepared(&mut lease, prepared.as_ref(), &requests, hooks).await
            }
            Err(error) => {
                let message = format!("no connection for the batch: {error}");
                requests
                    .iter()
                    .map(|_| {
                        Err(LedgerError::BatchFailed {
                            code: None,
                            message: message.clone(),
                        })
                    })
                    .collect()
            }
        };
        {
            let mut sizes = shared.sizes.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = sizes.counts.get_mut(requests.len()) {
                *count += 1;
            }
        }
        for (answer, result) in answers.into_iter().zip(results) {
            let _ = answer.send(result);
        }
        shared.settle(lane).await;
    }
}

/// A fixed set of connections handed out one per batch (the bench, tests): as many as
/// drainers, so a drainer never waits for one.
pub struct FixedConnections {
    free: Arc<Mutex<Vec<Kept>>>,
    prepare: bool,
}

/// A free connection with the batch call prepared on it, once it has been.
type Kept = (Client, Option<PreparedBatchCall>);

impl FixedConnections {
    /// The source of these connections; the batch call stays unnamed on them.
    pub fn new(clients: Vec<Client>) -> FixedConnections {
        FixedConnections {
            free: Arc::new(Mutex::new(
                clients.into_iter().map(|client| (client, None)).collect(),
            )),
            prepare: false,
        }
    }

    /// The same, with the batch call prepared once per connection ([`PreparedBatchCall`]):
    /// for connections of their own, not through a transaction pooler.
    pub fn prepared(clients: Vec<Client>) -> FixedConnections {
        FixedConnections {
            prepare: true,
            ..FixedConnections::new(clients)
        }
    }
}

/// A connection out of [`FixedConnections`], put back when dropped.
struct Borrowed {
    client: Option<Client>,
    prepared: Option<PreparedBatchCall>,
    prepare: bool,
    home: Arc<Mutex<Vec<Kept>>>,
}

impl std::ops::Deref for Borrowed {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("present until dropped")
    }
}

impl DerefMut for Borrowed {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().expect("present until dropped")
    }
}

impl BatchConnection for Borrowed {
    fn prepared_call(&mut self) -> BoxFuture<'_, Option<PreparedBatchCall>> {
        Box::pin(async move {
            if self.prepare && self.prepared.is_none() {
                let client = self.client.as_ref().expect("present until dropped");
                self.prepared = PreparedBatchCall::prepare(client).await.ok();
            }
            self.prepared.clone()
        })
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
        {
            self.home
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((client, self.prepared.take()));
        }
    }
}

impl ConnectionSource for FixedConnections {
    fn connection(&self) -> BoxFuture<'_, Result<Lease, LedgerError>> {
        let kept = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        Box::pin(async move {
            match kept {
                Some((client, prepared)) => Ok(Box::new(Borrowed {
                    client: Some(client),
                    prepared,
                    prepare: self.prepare,
                    home: self.free.clone(),
                }) as Lease),
                None => Err(LedgerError::BatchFailed {
                    code: None,
                    message: String::from(
                        "no free connection (fewer connections than drainers, or one was lost)",
                    ),
                }),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_queues_in_its_system_accounts_lane() {
        use crate::striping::{redeem_stripe, striped_debit};
        for stripe in 0..8 {
            let debit =
                TransferRequest::debit_into("c", "k", "acct-0001", redeem_stripe(stripe), 5);
            assert_eq!(lane_of(&debit, 4), stripe as usize % 4);
        }
        assert_eq!(lane_of(&striped_debit("c", "k", "acct-0001", 5, 4), 1), 0);
        let lanes: std::collections::BTreeSet<usize> = (1..=100)
            .map(|n| lane_of(&striped_debit("c", "k", &format!("acct-{n:04}"), 5, 2), 2))
            .collect();
        assert_eq!(lanes.len(), 2, "two stripes fill both lanes");
        let plain = TransferRequest::debit("c", "k", "acct-0001", 5);
        let other = TransferRequest::debit("d", "j", "acct-0002", 7);
        assert_eq!(lane_of(&plain, 3), lane_of(&other, 3), "one sink, one lane");
        let grant = TransferRequest::grant("c", "g", "acct-0001", 5);
        let issuer_lane = lane_of(&grant, 3);
        assert_eq!(
            issuer_lane,
            lane_of(&TransferRequest::grant("e", "h", "acct-0009", 1), 3)
        );
        assert!(issuer_lane < 3);
    }

    #[test]
    fn sizes_give_mean_and_p99() {
        let mut sizes = BatchSizes {
            counts: vec![0; 65],
        };
        sizes.counts[1] = 98;
        sizes.counts[10] = 1;
        sizes.counts[64] = 1;
        assert_eq!(sizes.batches(), 100);
        assert_eq!(sizes.requests(), 98 + 10 + 64);
        assert_eq!(sizes.p99(), 10);
        assert!((sizes.mean() - 1.72).abs() < 1e-9);
        let earlier = sizes.clone();
        sizes.counts[64] += 2;
        assert_eq!(sizes.since(&earlier).batches(), 2);
        assert_eq!(BatchSizes::default().p99(), 0);
    }
}
