//! Crash-workers placing an order as spec steps, so a kill inside a placement is one
//! file (F12):
//!
//! - `call NAME: worker account=A side=BUY qty=1.0 price=5000 key=K stop=HOOK` launches
//!   `crash-worker spot` (`launch::worker::CrashWorker`) running that placement (the
//!   library's `place`, SPEC §8) up to hook point `HOOK` (`before-commit`,
//!   `after-commit`, …) and returns once it says it is paused there: `paused at HOOK`;
//!   its backend counts as one of the spec's sessions (`Calls::backends`);
//! - `call NAME: kill-worker` sends the last paused worker a real SIGKILL, then waits
//!   (at most [`BACKEND_EXIT_LIMIT_MS`]) until its backend has left `pg_stat_activity`:
//!   `signal=9 shell_status=137 backend_gone=true`. So the next step never meets the
//!   dying backend's locks, and the transcript does not depend on how soon it goes.
//!
//! A worker still alive when the case ends is killed and reaped by its handle's drop.

use std::time::{Duration, Instant};

use case_kit::spec::Call;
use frozen_balances::HookPoint;
use launch::worker::PausedWorkers;
use tokio_postgres::Client;

/// Longest wait for a killed worker's backend to leave `pg_stat_activity`, ms (a hang
/// bound: the verdict is `backend_gone=`).
pub const BACKEND_EXIT_LIMIT_MS: u64 = 10_000;
/// Polling interval of that wait, milliseconds.
pub const POLL_MS: u64 = 5;

/// Whether `point` names one of the library's hook points (a worker's `stop=`, a
/// placement's `fail-at=`): what the verb declarations cannot say.
///
/// Errors: the library's, naming the points.
pub fn hook_point(point: &str) -> Result<(), String> {
    point
        .parse::<HookPoint>()
        .map(|_| ())
        .map_err(|e| format!("{e}"))
}

/// `crash-worker spot …` for `call` on the database at `database_url`.
fn worker_args(call: &Call, database_url: &str) -> Result<Vec<String>, String> {
    let arg = |name: &str| call.arg(name).ok_or(format!("needs {name}="));
    let stop: HookPoint = arg("stop")?.parse().map_err(|e| format!("{e}"))?;
    Ok([
        ("--database-url", database_url),
        ("--business-id", arg("key")?),
        ("--account", arg("account")?),
        ("--side", arg("side")?),
        ("--quantity", arg("qty")?),
        ("--price", arg("price")?),
        ("--stop-at", stop.as_str()),
    ]
    .into_iter()
    .fold(vec!["spot".to_string()], |mut args, (flag, value)| {
        args.extend([flag.to_string(), value.to_string()]);
        args
    }))
}

/// Whether backend `pid` has left `pg_stat_activity`, looking every [`POLL_MS`] for at
/// most [`BACKEND_EXIT_LIMIT_MS`].
async fn backend_gone(client: &Client, pid: i32) -> Result<bool, String> {
    let began = Instant::now();
    loop {
        let present = client
            .query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .await
            .map_err(|e| format!("{e}"))?
            .is_some();
        if !present || began.elapsed() > Duration::from_millis(BACKEND_EXIT_LIMIT_MS) {
            return Ok(!present);
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Runs a worker operation (see the module documentation) of the case's `workers` on
/// the session `client`.
///
/// Errors: the worker cannot be launched or does not pause; no worker to kill.
pub async fn run(workers: &PausedWorkers, client: &Client, call: &Call) -> Result<String, String> {
    let text = |e: anyhow::Error| format!("{e:#}");
    if call.op == "kill-worker" {
        let (end, backend) = workers.kill_last().await.map_err(text)?;
        let pid = backend.expect("launched by `worker`, its backend known");
        let gone = backend_gone(client, pid).await?;
        return Ok(format!("{} backend_gone={gone}", end.words()));
    }
    let args = worker_args(call, workers.database_url())?;
    workers.launch(args).await.map_err(text)?;
    let stop = call.arg("stop").unwrap_or_default();
    Ok(format!("paused at {stop}"))
}
