//! Crash-workers as spec steps, so a kill case is one file:
//!
//! - `call NAME: worker account=ID amount=N key=K stop=HOOK [client=C]` launches a
//!   crash-worker child (`launch::worker::CrashWorker`) running that DEBIT up to hook
//!   point `HOOK` (`before-commit`, …) and returns once it says it is paused there;
//!   its backend counts as one of the spec's sessions when the runner asks whether a
//!   step is blocked (`Calls::backends`), so a step waiting on the worker's open
//!   transaction shows as `<waiting ...>`;
//! - `call NAME: kill-worker` sends the last paused worker a real SIGKILL and prints how
//!   it ended (`signal=9 shell_status=137`).
//!
//! A worker still alive when the case ends is killed and reaped by its handle's drop.

use case_kit::spec::Call;
use launch::worker::PausedWorkers;
use points_ledger::HookPoint;

use super::worker::WorkerSpec;

/// The client id of a call that names none (a worker's, a debit's or a grant's).
pub const DEFAULT_CLIENT: &str = "spec";

fn hook(name: &str) -> Result<HookPoint, String> {
    HookPoint::ALL
        .into_iter()
        .find(|point| point.as_str() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = HookPoint::ALL.iter().map(|p| p.as_str()).collect();
            format!("stop={name}: one of {}", names.join(", "))
        })
}

/// Whether `call` is a worker operation with what it needs; `None` for another op.
pub fn check(call: &Call) -> Option<Result<(), String>> {
    match call.op.as_str() {
        "kill-worker" if call.args.is_empty() => Some(Ok(())),
        "kill-worker" => Some(Err("kill-worker takes no argument".into())),
        "worker" => Some(worker_spec(call, "").map(|_| ())),
        _ => None,
    }
}

fn worker_spec(call: &Call, database_url: &str) -> Result<WorkerSpec, String> {
    let arg = |name: &str| call.arg(name).ok_or(format!("needs {name}=…"));
    for (name, _) in &call.args {
        if !["account", "amount", "key", "stop", "client"].contains(&name.as_str()) {
            return Err(format!("unknown argument {name:?}"));
        }
    }
    Ok(WorkerSpec {
        database_url: database_url.to_string(),
        client_id: call.arg("client").unwrap_or(DEFAULT_CLIENT).into(),
        idem_key: arg("key")?.into(),
        account: arg("account")?.into(),
        amount: arg("amount")?
            .parse()
            .map_err(|_| "amount=N takes an integer number of points".to_string())?,
        stop_at: hook(arg("stop")?)?,
        pause_limit_ms: None,
    })
}

/// Runs a worker operation (see the module documentation) of the case's `workers`.
///
/// Errors: the worker cannot be launched or does not pause; no worker to kill.
pub async fn run(workers: &PausedWorkers, call: &Call) -> Result<String, String> {
    let text = |e: anyhow::Error| format!("{e:#}");
    if call.op == "kill-worker" {
        let (end, _) = workers.kill_last().await.map_err(text)?;
        return Ok(end.words());
    }
    let spec = worker_spec(call, workers.database_url())?;
    workers.launch(spec.args()).await.map_err(text)?;
    Ok(format!("paused at {}", spec.stop_at.as_str()))
}
