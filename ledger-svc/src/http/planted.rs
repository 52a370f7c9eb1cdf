//! Planted bugs: deliberate faults in the service's own logic, off by default, that
//! `./run.sh explore --planted-bug …` switches on to prove that its history checker
//! catches what it claims (an explorer that never finds anything proves nothing), and
//! that R2's negative control switches on to show what the service's earlier rule lost.
//! Never meant for a real deployment.

use points_ledger::{Hooks, LedgerError, TransferRequest, TransferResult, transfer};

/// A bug the service can be started with (`--planted-bug NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlantedBug {
    /// A request whose idempotency key is already registered is executed again under a
    /// derived key (`<key>+<n>`) instead of being replayed (same payload) or refused with
    /// 422 (another payload): the bug of a service that treats a key conflict as an id
    /// collision to work around. Every retry of a committed request then moves points a
    /// second time, and reconciliation stays clean (each execution has its own record),
    /// so only a history of what clients asked for shows it.
    ReexecuteKnownKeys,
    /// The rule the service had before: a COMMIT that reports success after a `WARNING`
    /// is trusted (the session goes on, `crate::session`), so a COMMIT whose wait for the
    /// synchronous standby was cancelled is answered 201 although it exists only on the
    /// primary; and a replay is answered without its cover (`super::bound::cover`), so a
    /// same-key retry of it is too (R2's negative control and its test).
    TrustCancelledCommit,
}

/// How many derived keys the bug tries before it gives up and returns what it got.
pub const MAX_DERIVED_KEYS: u32 = 16;

/// With [`PlantedBug::ReexecuteKnownKeys`]: while `outcome` says the key was known (a
/// replay or `KeyReused`), executes `request` again under the next derived key.
pub async fn reexecute_known_keys(
    client: &mut tokio_postgres::Client,
    request: &TransferRequest,
    hooks: &dyn Hooks,
    mut outcome: Result<TransferResult, LedgerError>,
) -> Result<TransferResult, LedgerError> {
    for n in 1..=MAX_DERIVED_KEYS {
        let known = match &outcome {
            Ok(result) => result.replayed,
            Err(LedgerError::KeyReused { .. }) => true,
            Err(_) => false,
        };
        if !known {
            break;
        }
        let mut derived = request.clone();
        derived.idem_key = format!("{}+{n}", request.idem_key);
        outcome = transfer(client, &derived, hooks).await;
    }
    outcome
}
