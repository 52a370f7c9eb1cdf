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

use std::sync::Mutex;

use case_kit::spec::Call;
use launch::worker::CrashWorker;
use points_ledger::HookPoint;

use super::worker::WorkerSpec;

/// The client id of a call that names none (a worker's, a debit's or a grant's).
pub const DEFAULT_CLIENT: &str = "spec";

/// The crash-workers one spec case started, and their backends.
#[derive(Debug)]
pub struct Workers {
    /// The case's database, for the workers.
    pub database_url: String,
    paused: tokio::sync::Mutex<Vec<CrashWorker>>,
    backends: Mutex<Vec<i32>>,
}

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

impl Workers {
    /// No worker yet, for the case's database at `database_url`.
    pub fn new(database_url: String) -> Workers {
        Workers {
            database_url,
            paused: tokio::sync::Mutex::new(Vec::new()),
            backends: Mutex::new(Vec::new()),
        }
    }

    /// Kills and reaps every paused worker now (their handles' drop), when the case
    /// ends or is cancelled; a worker another task is still launching is left to that
    /// task's own drop.
    pub fn end(&self) {
        if let Ok(mut paused) = self.paused.try_lock() {
            paused.clear();
        }
    }

    /// Keeps a worker another module launched and saw paused (L22's split-registry
    /// worker, [`super::spec_split`]) for the next `kill-worker`, and for the case's end.
    pub async fn keep_paused(&self, worker: CrashWorker) {
        self.paused.lock().await.push(worker);
    }

    /// The backends of the workers started so far.
    pub fn backends(&self) -> Vec<i32> {
        self.backends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs a worker operation (see the module documentation).
    ///
    /// Errors: the worker cannot be launched or does not pause; no worker to kill.
    pub async fn run(&self, call: &Call) -> Result<String, String> {
        if call.op == "kill-worker" {
            let mut worker = self.paused.lock().await.pop().ok_or("no paused worker")?;
            let end = worker.kill().await.map_err(|e| format!("{e:#}"))?;
            let signal = end
                .signal()
                .map_or_else(|| "none".into(), |s| s.to_string());
            return Ok(format!(
                "signal={signal} shell_status={}",
                end.shell_status()
            ));
        }
        let spec = worker_spec(call, &self.database_url)?;
        let mut worker = CrashWorker::launch(spec.args()).map_err(|e| format!("{e:#}"))?;
        let paused = worker.wait_paused().await.map_err(|e| format!("{e:#}"))?;
        let backend = paused.backend_pid().map_err(|e| format!("{e:#}"))?;
        self.backends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(backend);
        self.paused.lock().await.push(worker);
        Ok(format!("paused at {}", spec.stop_at.as_str()))
    }
}
