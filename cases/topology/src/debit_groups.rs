//! Groups of debits sent at once through a `ledger-svc`, one per account, as R2 sends
//! them: in the batch mode with the service's queue held until every debit is seen
//! queued, so that the group is one batch; and what the group was answered.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cases_ledger::http::LedgerCalls;
use launch::service::{Reply, Service};
use points_ledger::{TransferMode, test_account};

use crate::syncrep::{OBSERVE_LIMIT_MS, seen_within};

/// Debits in a group, one per account, and the accounts debited.
pub const GROUP_SIZE: usize = 8;
/// The client every debit of R2 is sent as.
pub const CLIENT: &str = "app-r2";
/// Points each debit takes.
pub const DEBIT: i64 = 1;
/// Per-request timeout of R2's clients, milliseconds: above every bound of R2's services.
const REQUEST_TIMEOUT_MS: u64 = 90_000;

/// The keys of group `name`: `k-r2-<name>-<n>`, debiting account `n + 1`.
pub fn keys(name: &str) -> Vec<String> {
    (0..GROUP_SIZE)
        .map(|n| format!("k-r2-{name}-{n}"))
        .collect()
}

/// The account a key of a group debits: its position in the group, plus one.
pub fn account_of(position: usize) -> String {
    test_account((position % GROUP_SIZE + 1) as u32)
}

/// What one request was answered: `status outcome` (`201 OK`, `503 UNKNOWN`), with
/// ` replayed` for a replay, or `transport` when no answer came (the service died).
#[derive(Debug, Clone)]
pub struct Answer {
    /// The answer as text (see the type's docs).
    pub said: String,
    /// The `txn_id` a 201 named.
    pub txn_id: Option<i64>,
}

impl Answer {
    /// The answer a request got: its reply, or the transport's error.
    pub fn of(result: Result<Reply, reqwest::Error>) -> Answer {
        match result {
            Ok(reply) => Answer {
                said: if reply.replayed {
                    format!("{} replayed", reply.status_outcome())
                } else {
                    reply.status_outcome()
                },
                txn_id: (reply.status == 201)
                    .then(|| reply.integer("txn_id"))
                    .flatten(),
            },
            Err(_) => Answer {
                said: "transport".into(),
                txn_id: None,
            },
        }
    }

    /// Whether this is an acknowledgement (201, executed or replayed).
    pub fn acknowledged(&self) -> bool {
        self.said.starts_with("201")
    }
}

/// How many answers of each kind, as `201 OK=0 503 UNKNOWN=8`, in a stable order.
pub fn tally(answers: &[Answer]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for answer in answers {
        *counts.entry(answer.said.as_str()).or_default() += 1;
    }
    let counted: Vec<String> = counts
        .iter()
        .map(|(said, n)| format!("{said}={n}"))
        .collect();
    counted.join(" ")
}

/// Debits under `keys` sent through `service` at once, in flight: in the batch mode the
/// queue is held until all are seen queued, then released (one batch). Await the
/// handle for the answers, in the order of `keys`.
///
/// Errors: the queue could not be held, or the debits were not seen queued.
pub async fn send(
    service: &Arc<Service>,
    mode: TransferMode,
    keys: &[String],
) -> anyhow::Result<tokio::task::JoinHandle<Vec<Answer>>> {
    let batch = mode == TransferMode::Batch;
    if batch {
        service.hold_batches(true).await?;
    }
    let sending = tokio::spawn(answers_to(service.clone(), keys.to_vec()));
    if batch {
        let limit = Duration::from_millis(OBSERVE_LIMIT_MS);
        let queued = service.queued_within(keys.len() as u64, limit).await?;
        anyhow::ensure!(
            queued == keys.len() as u64,
            "only {queued} debits seen queued"
        );
        service.hold_batches(false).await?;
    }
    Ok(sending)
}

/// One debit per key, all at once; their answers in the order of `keys`.
async fn answers_to(service: Arc<Service>, keys: Vec<String>) -> Vec<Answer> {
    let timeout = Duration::from_millis(REQUEST_TIMEOUT_MS);
    let sent = keys.iter().enumerate().map(|(n, key)| {
        let service = service.clone();
        async move {
            let account = account_of(n);
            Answer::of(service.debit(CLIENT, key, &account, DEBIT, timeout).await)
        }
    });
    futures_util::future::join_all(sent).await
}

/// Each key of `keys` retried through `service` until it is answered 201 ([`seen_within`]
/// [`OBSERVE_LIMIT_MS`] per key, a hang bound); the 201 of each.
///
/// Errors: a key answered nothing but 503 `UNKNOWN` or a transport error until the
/// bound, or anything else (a 409, 422 or 500) at all.
pub async fn retry_until_acknowledged(
    service: &Service,
    keys: &[String],
) -> anyhow::Result<Vec<Answer>> {
    let timeout = Duration::from_millis(REQUEST_TIMEOUT_MS);
    let mut answers = Vec::new();
    for (n, key) in keys.iter().enumerate() {
        let account = account_of(n);
        let account = account.as_str();
        let look = move || async move {
            let answer = Answer::of(service.debit(CLIENT, key, account, DEBIT, timeout).await);
            anyhow::ensure!(
                answer.acknowledged() || answer.said == "503 UNKNOWN" || answer.said == "transport",
                "{key}: answered {} on its retry",
                answer.said
            );
            Ok(answer)
        };
        let (answer, acknowledged) =
            seen_within(OBSERVE_LIMIT_MS, look, Answer::acknowledged).await?;
        anyhow::ensure!(
            acknowledged,
            "{key}: not acknowledged within {OBSERVE_LIMIT_MS} ms"
        );
        answers.push(answer);
    }
    Ok(answers)
}
