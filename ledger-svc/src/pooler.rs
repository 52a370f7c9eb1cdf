//! Behind a transaction pooler (`--behind-transaction-pooler`): PgBouncer with
//! `pool_mode = transaction` hands each transaction whichever server session is free, so
//! nothing may live in a session between transactions. What that means here:
//!
//! - **Statements.** The service's own statements are unnamed (`query_typed`,
//!   `execute_typed`, `simple_query`): Parse, Bind and Execute travel in one message
//!   batch, so they run on one server session. A named prepared statement (tokio-postgres
//!   `query(&str)`) is prepared on one session and may be executed on another, where it
//!   does not exist (PgBouncer 1.18 has no prepared-statement support in transaction
//!   mode; 1.21 added it). Case R1's control shows that failure, counted.
//! - **Session bounds.** PgBouncer 1.18 refuses the startup packet's `options`
//!   ("unsupported startup parameter"), so the bounds the service otherwise sets there
//!   (`lock_timeout`, `statement_timeout`, `idle_in_transaction_session_timeout`,
//!   `default_transaction_isolation`) must be the database's or the role's own
//!   (`ALTER DATABASE … SET …`, PostgreSQL docs, ALTER DATABASE), in force on every server
//!   session the pooler opens. [`check_bounds`] reads them back through the pooler at
//!   start, and the service refuses to start when one differs.
//! - **Advisory locks, `SET`, `LISTEN`, temporary tables**: the service uses none.

use deadpool_postgres::Pool;
use tokio_postgres::SimpleQueryMessage;

/// The bounds the service needs on every session: (setting name, value as
/// `pg_settings.setting` shows it; milliseconds for the three timeouts).
pub fn wanted_bounds(
    lock_timeout_ms: u64,
    statement_timeout_ms: u64,
    idle_in_transaction_timeout_ms: u64,
) -> Vec<(&'static str, String)> {
    vec![
        ("default_transaction_isolation", "read committed".to_owned()),
        (
            "idle_in_transaction_session_timeout",
            idle_in_transaction_timeout_ms.to_string(),
        ),
        ("lock_timeout", lock_timeout_ms.to_string()),
        ("statement_timeout", statement_timeout_ms.to_string()),
    ]
}

/// Reads `wanted`'s settings through the pooler (one simple query on a pooled
/// connection) and compares.
///
/// Errors: the start-up line's text: the pooler or server cannot be reached, or the
/// settings that differ, each with the statement that sets it on `database`.
pub async fn check_bounds(
    pool: &Pool,
    database: &str,
    wanted: &[(&'static str, String)],
) -> Result<(), String> {
    let client = pool
        .get()
        .await
        .map_err(|error| format!("cannot reach the database through the pooler: {error}"))?;
    let names: Vec<String> = wanted.iter().map(|(name, _)| format!("'{name}'")).collect();
    let messages = client
        .simple_query(&format!(
            "SELECT name, setting FROM pg_settings WHERE name IN ({})",
            names.join(", ")
        ))
        .await
        .map_err(|error| format!("cannot read the session bounds through the pooler: {error}"))?;
    let seen: Vec<(String, String)> = messages
        .iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some((
                row.get(0).unwrap_or_default().to_owned(),
                row.get(1).unwrap_or_default().to_owned(),
            )),
            _ => None,
        })
        .collect();
    let wrong: Vec<String> = wanted
        .iter()
        .filter(|(name, value)| !seen.iter().any(|(n, v)| n == name && v == value))
        .map(|(name, value)| {
            let shown = seen
                .iter()
                .find(|(n, _)| n == name)
                .map_or("(not shown)", |(_, v)| v.as_str());
            format!("{name} is {shown:?}, not {value:?} (ALTER DATABASE \"{database}\" SET {name} = '{value}')")
        })
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    Err(format!(
        "--behind-transaction-pooler: a transaction pooler does not pass the startup packet's \
         options, so the service's session bounds must be the database's own; {}",
        wrong.join("; ")
    ))
}
