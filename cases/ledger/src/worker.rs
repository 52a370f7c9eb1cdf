//! What the crash-worker is to do for a ledger case: one transfer, stopping at a named
//! hook point (`crash-worker --help`). Launch it with
//! `launch::worker::CrashWorker::launch(spec.args())`.

use points_ledger::HookPoint;

/// One DEBIT of `amount` points from `account`, stopping at `stop_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Connection URL of the case's database (see `Ctx::database_url`).
    pub database_url: String,
    /// Client id of the request.
    pub client_id: String,
    /// Idempotency key of the request.
    pub idem_key: String,
    /// Account debited.
    pub account: String,
    /// Points debited.
    pub amount: i64,
    /// Where the worker stops and waits to be killed.
    pub stop_at: HookPoint,
    /// The worker's own bound on its pause, in milliseconds; `None` keeps the worker's
    /// default (`PAUSE_LIMIT_MS`, 60 s).
    pub pause_limit_ms: Option<u64>,
}

impl WorkerSpec {
    /// The worker's command-line arguments.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--database-url".to_string(),
            self.database_url.clone(),
            "--client-id".into(),
            self.client_id.clone(),
            "--key".into(),
            self.idem_key.clone(),
            "--account".into(),
            self.account.clone(),
            "--amount".into(),
            self.amount.to_string(),
            "--kind".into(),
            "DEBIT".into(),
            "--stop-at".into(),
            self.stop_at.as_str().into(),
        ];
        if let Some(limit_ms) = self.pause_limit_ms {
            args.push("--pause-limit-ms".into());
            args.push(limit_ms.to_string());
        }
        args
    }
}
