//! The pool's sessions: each opened and driven by `pg_session` (a session ends at the
//! server's first `WARNING`, so a COMMIT whose wait for the synchronous standby was
//! cancelled is never answered as committed: the request sees a closed connection and is
//! answered 503 `UNKNOWN`, SPEC §4). The pool never hands out a closed connection again.
//!
//! With `--planted-bug trust-cancelled-commit` (a negative control of R2 only) a warning
//! is logged and trusted, as the service did before.

use deadpool_postgres::Connect;
use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config, Error};

/// Opens the pool's sessions with `pg_session::connect`.
#[derive(Debug, Clone, Copy)]
pub struct WarningEndsSession {
    /// Keep driving a session after a warning (the planted bug of R2's control).
    pub trust_warnings: bool,
}

impl Connect for WarningEndsSession {
    fn connect(&self, config: &Config) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), Error>> {
        let config = config.clone();
        let trust_warnings = self.trust_warnings;
        Box::pin(async move { pg_session::connect(&config, "ledger-svc", trust_warnings).await })
    }
}
