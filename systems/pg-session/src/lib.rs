//! A PostgreSQL session that ends at the server's first `WARNING`, so that no query on
//! it is answered after one: the database sessions of `ledger-svc` (its pool) and of the
//! `withdrawal-executor`.
//!
//! Why: a COMMIT that waits for the synchronous standby (`wait_event = 'SyncRep'`) and is
//! cancelled — a client's CancelRequest (`ledger-svc`'s at its request bound), a DBA's
//! `pg_cancel_backend`, `pg_terminate_backend` — is not rolled back. The wait ends and the
//! COMMIT reports success, after `WARNING: canceling wait for synchronous replication
//! due to user request` with `DETAIL: The transaction has already committed locally, but
//! might not have been replicated to the standby.` (PostgreSQL's
//! src/backend/replication/syncrep.c, `SyncRepWaitForLSN`; the termination's message
//! differs and the session then closes). That transaction exists only on the primary
//! until the standby catches up, and a failover takes it away: acknowledged, it is lost
//! money. The same holds for the implicit transaction of a single statement, whose commit
//! is part of the statement. (`statement_timeout` does not end the wait: the server
//! disables the statement timer before it commits, src/backend/tcop/postgres.c,
//! `finish_xact_command`.)
//!
//! tokio-postgres hands such a notice over as [`AsyncMessage::Notice`] on the connection,
//! never on the query's result, so a caller that only reads the result cannot tell. Its
//! codec returns a notice alone, only after every message before it went to its query
//! (tokio-postgres 0.7, `src/codec.rs` and `src/connection.rs`). [`drive`] stops at that
//! notice and drops the connection before it polls again: the COMMIT's own reply, which
//! follows the notice, never reaches the caller, which sees a closed connection (an
//! error without an SQLSTATE): the outcome is unknown, and the caller must treat it so.
//!
//! Every `WARNING` ends the session, not only this one: the systems' statements raise
//! none in normal operation (their functions raise only errors), so a warning means the
//! server is telling the session something it did not ask for, and the one answer that
//! is sound without knowing what is "unknown". `NOTICE` and lower are ignored.

use tokio::task::JoinHandle;
use tokio_postgres::error::{DbError, Severity};
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, Error, NoTls, Socket};

/// Connects with `config` (plain TCP or a Unix socket, no TLS) and spawns [`drive`] for
/// the connection on the current tokio runtime; `who` prefixes the driver's log lines.
///
/// Errors: the connection could not be made.
pub async fn connect(
    config: &Config,
    who: &'static str,
    trust_warnings: bool,
) -> Result<(Client, JoinHandle<()>), Error> {
    let (client, connection) = config.connect(NoTls).await?;
    Ok((client, tokio::spawn(drive(connection, who, trust_warnings))))
}

/// Drives `connection` until it ends, or until the server sends a `WARNING`: then it
/// logs the warning on stderr and drops the connection (see the crate docs). With
/// `trust_warnings` (a planted bug of `ledger-svc`, R2's negative control only) it logs
/// the warning and goes on, as a plain tokio-postgres connection does.
pub async fn drive(
    mut connection: Connection<Socket, NoTlsStream>,
    who: &'static str,
    trust_warnings: bool,
) {
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
        match message {
            Ok(AsyncMessage::Notice(notice)) if is_warning(&notice) => {
                let detail = notice.detail().unwrap_or("");
                if trust_warnings {
                    eprintln!(
                        "{who}: database warning (trusted, planted bug): {} {detail}",
                        notice.message()
                    );
                    continue;
                }
                eprintln!(
                    "{who}: database warning, ending the session so that its query is \
                     answered without an outcome: {} {detail}",
                    notice.message()
                );
                return;
            }
            Ok(_) => {}
            Err(error) => {
                eprintln!("{who}: database session ended: {error}");
                return;
            }
        }
    }
}

/// Whether `notice` is a `WARNING`: its unlocalized severity (field `V`, PostgreSQL docs
/// 55.8 "Error and Notice Message Fields"), or its localized one where the server sends
/// no `V` (before 9.6).
pub fn is_warning(notice: &DbError) -> bool {
    match notice.parsed_severity() {
        Some(severity) => severity == Severity::Warning,
        None => notice.severity() == "WARNING",
    }
}
