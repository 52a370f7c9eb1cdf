//! Races: N OS threads, each with its own runtime and its own PostgreSQL connection,
//! released together by a barrier; and a task handle that aborts on drop.

use std::future::Future;
use std::sync::Arc;

/// Why a racer did not run its body.
enum RaceError {
    /// This racer failed (could not connect, or panicked): the cause to report.
    Cause(String),
    /// Another racer failed to connect (how many), so no one started.
    Abandoned(usize),
}

/// One participant of [`crate::Ctx::race`]: its index, its own connection, and the barrier all
/// participants share (released when every participant has called `wait`).
pub struct Racer {
    /// 0-based index.
    pub index: usize,
    /// A connection of its own, opened before the race starts.
    pub client: tokio_postgres::Client,
    /// Shared by all participants; a naive design meets here between read and write.
    pub barrier: Arc<tokio::sync::Barrier>,
}

/// Empties `slot` now (drops what it holds: a child process's handle kills it, a task's
/// aborts it) unless a task holds its lock: what a case's `end` does with what its
/// steps started, called from a guard's drop, where it must not wait for other tasks
/// (one that holds the lock lets go of its own).
pub fn drop_if_free<T: Default>(slot: &tokio::sync::Mutex<T>) {
    if let Ok(mut held) = slot.try_lock() {
        drop(std::mem::take(&mut *held));
    }
}

/// A spawned task that is aborted when this handle is dropped, so a case that fails or is
/// cancelled midway leaves no task behind (a plain `JoinHandle` detaches on drop).
/// Awaiting it (also through `&mut`) yields the task's output or its `JoinError`.
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T: Send + 'static> AbortOnDrop<T> {
    /// Spawns `future` on the current runtime.
    pub fn spawn(future: impl Future<Output = T> + Send + 'static) -> AbortOnDrop<T> {
        AbortOnDrop(tokio::spawn(future))
    }
}

impl<T> AbortOnDrop<T> {
    /// Whether the task has finished (without waiting).
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Races `participants` OS threads on the database of `config`, each with its own runtime and its own connection
/// opened beforehand; all start `body` at the same moment (a barrier), and may meet
/// again at [`Racer::barrier`]. Returns the results in index order.
///
/// Errors: a participant could not connect (then no participant runs `body`, so none
/// waits at the barrier for one that never comes), or a participant panicked.
pub async fn race<T, F, Fut>(
    config: tokio_postgres::Config,
    participants: usize,
    body: F,
) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(Racer) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T>,
{
    let body = Arc::new(body);
    // A blocking barrier that needs no runtime: every thread reaches it, whatever
    // happened before, so a failure can never leave the others waiting.
    let start = Arc::new(std::sync::Barrier::new(participants));
    let unconnected = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let shared = Arc::new(tokio::sync::Barrier::new(participants));
    let mut threads = Vec::with_capacity(participants);
    for index in 0..participants {
        let (config, body, start, unconnected, shared) = (
            config.clone(),
            body.clone(),
            start.clone(),
            unconnected.clone(),
            shared.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("racer-{index}"))
            .spawn(move || racer_thread(index, config, body, start, unconnected, shared))?;
        threads.push(thread);
    }
    let joined: Vec<Result<T, RaceError>> = tokio::task::spawn_blocking(move || {
        threads
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(RaceError::Cause("a racer panicked".into())))
            })
            .collect()
    })
    .await?;
    gather(joined)
}

/// One racer's thread: its own runtime and connection, then the start line (a blocking
/// barrier every thread reaches, whatever happened before, so a failure never leaves the
/// others waiting); then `body`, unless a participant could not connect.
fn racer_thread<T, F, Fut>(
    index: usize,
    config: tokio_postgres::Config,
    body: Arc<F>,
    start: Arc<std::sync::Barrier>,
    unconnected: Arc<std::sync::atomic::AtomicUsize>,
    shared: Arc<tokio::sync::Barrier>,
) -> Result<T, RaceError>
where
    F: Fn(Racer) -> Fut,
    Fut: Future<Output = T>,
{
    let ready = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| {
            let client = runtime.block_on(connect_with(config))?;
            Ok((runtime, client))
        });
    if ready.is_err() {
        unconnected.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    start.wait();
    // After the start line the count is final. If anyone is missing, no one starts: a
    // body that waits at the shared barrier would wait for a participant that never comes.
    let (runtime, client) = ready
        .map_err(|error| RaceError::Cause(format!("racer {index} could not connect: {error:#}")))?;
    let missing = unconnected.load(std::sync::atomic::Ordering::SeqCst);
    if missing > 0 {
        return Err(RaceError::Abandoned(missing));
    }
    Ok(runtime.block_on(body(Racer {
        index,
        client,
        barrier: shared,
    })))
}

/// The racers' results in index order, or why the race did not run: a racer's cause
/// (first), or how many could not connect.
///
/// Errors: as [`race`].
fn gather<T>(joined: Vec<Result<T, RaceError>>) -> anyhow::Result<Vec<T>> {
    let mut results = Vec::with_capacity(joined.len());
    let mut abandoned = None;
    for outcome in joined {
        match outcome {
            Ok(value) => results.push(value),
            Err(RaceError::Cause(cause)) => anyhow::bail!("race not run: {cause}"),
            Err(RaceError::Abandoned(missing)) => abandoned = Some(missing),
        }
    }
    if let Some(missing) = abandoned {
        anyhow::bail!("race not run: {missing} racer(s) could not connect");
    }
    Ok(results)
}

/// Connects with `config`, spawning the connection task on the current runtime.
///
/// Errors: connection failures.
pub async fn connect_with(
    config: tokio_postgres::Config,
) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
