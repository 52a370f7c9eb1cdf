//! The service's database sessions: each is opened by [`WarningEndsSession`], whose driver
//! reads every message the server sends beside a query's result and ends the session at
//! the first `WARNING`, so that no query on it is answered after one.
//!
//! Why: a COMMIT that waits for the synchronous standby (`wait_event = 'SyncRep'`) and is
//! cancelled — the service's own CancelRequest at its request bound, a DBA's
//! `pg_cancel_backend`, `pg_terminate_backend` — is not rolled back. The wait ends and the
//! COMMIT reports success, after `WARNING: canceling wait for synchronous replication
//! due to user request` with `DETAIL: The transaction has already committed locally, but
//! might not have been replicated to the standby.` (PostgreSQL's
//! src/backend/replication/syncrep.c, `SyncRepWaitForLSN`; the termination's message
//! differs and the session then closes). That transaction exists only on the primary
//! until the standby catches up, and a failover takes it away: answered 201, it would be
//! an acknowledged debit that is lost. The same holds for the implicit transaction of a
//! single statement (the one-trip transfer, the replay's cover in `http::bound`), whose
//! commit is part of the statement.
//!
//! tokio-postgres hands such a notice over as [`AsyncMessage::Notice`] on the connection,
//! never on the query's result, so a caller that only reads the result cannot tell. Its
//! codec returns a notice alone, only after every message before it went to its query
//! (tokio-postgres 0.7, `src/codec.rs` and `src/connection.rs`). The driver here stops
//! at that notice and drops the connection before it polls again: the COMMIT's own reply,
//! which follows the notice, never reaches the request, which sees a closed connection and
//! is answered 503 `UNKNOWN` (its outcome is unknown; a retry with the same key learns it,
//! SPEC §4). The pool never hands out a closed connection again.
//!
//! Every `WARNING` ends the session, not only this one: the service's statements raise
//! none in normal operation (its own functions raise only errors), so a warning means
//! the server is telling the session something it did not ask for, and the one answer
//! that is sound without knowing what is "unknown". `NOTICE` and lower are ignored.
//!
//! With `--planted-bug trust-cancelled-commit` (a negative control of R2 only) the driver
//! logs the warning and goes on, as the service did before: COMMIT's success is trusted.

use deadpool_postgres::Connect;
use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::error::Severity;
use tokio_postgres::{AsyncMessage, Client, Config, Error, NoTls};

/// Opens the pool's sessions (plain TCP or a Unix socket, no TLS) and drives each one:
/// see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct WarningEndsSession {
    /// Keep driving a session after a warning (the planted bug of R2's control).
    pub trust_warnings: bool,
}

impl Connect for WarningEndsSession {
    fn connect(&self, config: &Config) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), Error>> {
        let config = config.clone();
        let trust_warnings = self.trust_warnings;
        Box::pin(async move {
            let (client, mut connection) = config.connect(NoTls).await?;
            let driver = tokio::spawn(async move {
                let mut messages =
                    futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
                    match message {
                        Ok(AsyncMessage::Notice(notice)) if is_warning(&notice) => {
                            let detail = notice.detail().unwrap_or("");
                            if trust_warnings {
                                eprintln!(
                                    "ledger-svc: database warning (trusted, planted bug): {} {detail}",
                                    notice.message()
                                );
                                continue;
                            }
                            eprintln!(
                                "ledger-svc: database warning, ending the session so that its \
                                 query is answered UNKNOWN: {} {detail}",
                                notice.message()
                            );
                            return;
                        }
                        Ok(_) => {}
                        Err(error) => {
                            eprintln!("ledger-svc: database session ended: {error}");
                            return;
                        }
                    }
                }
            });
            Ok((client, driver))
        })
    }
}

/// Whether `notice` is a `WARNING`: its unlocalized severity (field `V`, PostgreSQL docs
/// 55.8 "Error and Notice Message Fields"), or its localized one where the server sends
/// no `V` (before 9.6).
fn is_warning(notice: &tokio_postgres::error::DbError) -> bool {
    match notice.parsed_severity() {
        Some(severity) => severity == Severity::Warning,
        None => notice.severity() == "WARNING",
    }
}
