//! A database crash as a step (L15): `crash-server` stops the run's scratch cluster in
//! immediate mode (no checkpoint: a crash) and starts it again (WAL recovery), in the
//! middle of a permutation, so a file can crash the server more than once (its
//! `restart immediate:` crashes it once more after the permutations). The session that
//! ran it gets a new connection (every connection from before the crash is closed; the
//! file's other sessions are not reopened, so what follows runs on this session).
//!
//! The case must declare that it restarts the server (`restart immediate: REASON` in the
//! file, [`case_kit::Case::restarts_server`]): it runs alone, and a run on an existing
//! server lists it as not run. The restart is the one [`case_kit::Ctx`] makes
//! ([`case_kit::ServerRestart`], taken when the case starts).
//!
//! Prints `immediate stop and start: old_connection=closed restarted=true`: whether the
//! session's connection from before the crash was closed by it, and whether the
//! postmaster that answers started after it (`pg_postmaster_start_time()`).

use std::time::Duration;

use case_kit::ServerRestart;
use tokio_postgres::{Client, NoTls};

/// Longest time spent connecting after the restart (recovery may still refuse
/// connections), milliseconds; a hang bound only.
pub const RECONNECT_LIMIT_MS: u64 = 30_000;

/// Pause between connection attempts after the restart, milliseconds.
const RECONNECT_PAUSE_MS: u64 = 100;

/// `crash-server` on the session's connection `client` to the case's database at `url`
/// (see the module documentation); `client` is replaced by a new connection.
///
/// Errors: the case may not restart the server (`restart`: `None`); the restart
/// failed; no connection accepted within [`RECONNECT_LIMIT_MS`].
pub async fn run(
    restart: Option<&ServerRestart>,
    url: &str,
    client: &mut Client,
) -> Result<String, String> {
    let restart = restart.ok_or(
        "this case may not restart the server (a file that crashes it says `restart immediate:`)",
    )?;
    let sql = |e: tokio_postgres::Error| e.to_string();
    let started: String = client
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .map_err(sql)?
        .get(0);
    restart.immediate().await.map_err(|e| format!("{e:#}"))?;
    let closed = client.simple_query("SELECT 1").await.is_err();
    *client = reconnect(url).await?;
    let restarted: bool = client
        .query_one(
            "SELECT pg_postmaster_start_time() > $1::text::timestamptz",
            &[&started],
        )
        .await
        .map_err(sql)?
        .get(0);
    let old = if closed { "closed" } else { "still-open" };
    Ok(format!(
        "immediate stop and start: old_connection={old} restarted={restarted}"
    ))
}

/// A new connection to `url`, retried every [`RECONNECT_PAUSE_MS`] while recovery may
/// still refuse it.
///
/// Errors: none accepted within [`RECONNECT_LIMIT_MS`].
async fn reconnect(url: &str) -> Result<Client, String> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(RECONNECT_LIMIT_MS);
    loop {
        match tokio_postgres::connect(url, NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                return Ok(client);
            }
            Err(error) if tokio::time::Instant::now() >= deadline => {
                return Err(format!("no connection after the restart: {error}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(RECONNECT_PAUSE_MS)).await,
        }
    }
}
