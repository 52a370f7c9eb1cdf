//! A lost response, forced by events: the client gives up on its request at the moment
//! the service is seen holding the committed answer at a fault point (a `pause`), not
//! when a client timer happens to beat a server timer — on a loaded machine the commit
//! may come after any client timeout, or the server's hold end before it.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use crate::service::{FaultState, Service};

/// What [`give_up_once_held`] saw.
#[derive(Debug)]
pub struct GaveUp<T> {
    /// The request's own result when it ended before the service was seen holding (the
    /// response was then not lost); `None` when the client gave up on it.
    pub answered: Option<T>,
    /// The fault point at the moment the client gave up (or the request ended).
    pub state: FaultState,
}

/// Runs `request` until the service is seen holding a request at `point` (armed by the
/// caller with a `pause`, so the hold lasts until released), then gives up on it: the
/// request's future is dropped, which closes its connection, as a client timeout would.
/// `limit` only stops a hang: when the service never holds, the client gives up then and
/// the returned state says so (`holding` 0). The caller releases the pause afterwards.
///
/// Errors: the fault state could not be read.
pub async fn give_up_once_held<T>(
    service: &Service,
    point: impl Display,
    request: impl Future<Output = T>,
    limit: Duration,
) -> anyhow::Result<GaveUp<T>> {
    let point = point.to_string();
    let held = service.held_within(&point, limit);
    tokio::select! {
        answered = request => Ok(GaveUp {
            answered: Some(answered),
            state: service.fault_state(&point).await?,
        }),
        // Returning drops `request`: the client gives up and its connection closes.
        state = held => Ok(GaveUp { answered: None, state: state? }),
    }
}
