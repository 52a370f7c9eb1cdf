//! `ledger-svc` as spec steps, so a case that talks to the service over HTTP is one
//! file. The service is a resource of the case: started by a step, used by the steps
//! after it on any session, stopped by a step or, at the latest, killed when the case
//! ends (the handle's drop).
//!
//! - `call NAME: service [clients=C1,C2] [fault-injection=yes] [args=--flag,value]`
//!   starts `ledger-svc` on the case's database, in the case's transfer mode, with those
//!   `X-Client-Id`s given tokens under `./run.sh --auth`, and returns once `/readyz`
//!   answers (`launch::service::Service::launch`); prints `ready`.
//! - `call NAME: post-debit account=ID amount=N key=K client=C` sends
//!   `POST /accounts/ID/debits` and prints the answer: `status=409
//!   outcome=INSUFFICIENT balance=0 replayed=false`, or for a problem (RFC 9457)
//!   `status=400 type=<problem type>`; a transport error is an error.
//! - `call NAME: post-grant account=ID amount=N key=K [client=ops]`: the admin
//!   listener's grant, printed the same way.
//! - `call NAME: arm-fault point=HOOK action=A [count=N]` (`PUT /faults/HOOK`; needs
//!   `fault-injection=yes`), `call NAME: release-fault point=HOOK` (prints
//!   `released=N`).
//! - `call NAME: stop-service` sends SIGTERM and prints `exit=0` (or the status);
//!   `call NAME: kill-service` sends SIGKILL and prints `signal=9`.

use std::path::PathBuf;

use case_kit::spec::Call;
use launch::service::{Reply, Service, ServiceOptions};
use points_ledger::TransferMode;

use super::http::LedgerCalls as _;

/// The operations of this module, with the arguments each takes.
const OPS: [(&str, &[&str]); 7] = [
    ("service", &["clients", "fault-injection", "args"]),
    ("post-debit", &["account", "amount", "key", "client"]),
    ("post-grant", &["account", "amount", "key", "client"]),
    ("arm-fault", &["point", "action", "count"]),
    ("release-fault", &["point"]),
    ("stop-service", &[]),
    ("kill-service", &[]),
];

/// Whether `call` is a service operation with known arguments; `None` for another op.
pub fn check(call: &Call) -> Option<Result<(), String>> {
    let (_, known) = OPS.iter().find(|(op, _)| *op == call.op)?;
    for (name, _) in &call.args {
        if !known.contains(&name.as_str()) {
            return Some(Err(format!("{}: unknown argument {name:?}", call.op)));
        }
    }
    let needs: &[&str] = match call.op.as_str() {
        "post-debit" => &["account", "amount", "key", "client"],
        "post-grant" => &["account", "amount", "key"],
        "arm-fault" => &["point", "action"],
        "release-fault" => &["point"],
        _ => &[],
    };
    Some(match needs.iter().find(|n| call.arg(n).is_none()) {
        Some(missing) => Err(format!("{} needs {missing}=…", call.op)),
        None => Ok(()),
    })
}

/// The service of one spec case, and what starting it needs.
pub struct Services {
    database_url: String,
    log_path: PathBuf,
    mode: TransferMode,
    service: tokio::sync::Mutex<Option<Service>>,
}

/// A reply as a step prints it: status, outcome, balance and replay flag; a problem's
/// type instead of an outcome.
fn shown(reply: &Reply) -> String {
    let mut text = format!("status={}", reply.status);
    if let Some(problem) = reply.body["type"].as_str() {
        text.push_str(&format!(" type={problem}"));
    }
    if !reply.outcome().is_empty() {
        text.push_str(&format!(" outcome={}", reply.outcome()));
    }
    if let Some(balance) = reply.integer("balance") {
        text.push_str(&format!(" balance={balance}"));
    }
    text.push_str(&format!(" replayed={}", reply.replayed));
    text
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("database_url", &self.database_url)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn amount(call: &Call) -> Result<i64, String> {
    let text = call.arg("amount").unwrap_or_default();
    text.parse()
        .map_err(|_| format!("amount={text}: an integer number of points"))
}

impl Services {
    /// No service yet, for the case's database; its log goes to `log_path`.
    pub fn new(database_url: String, log_path: PathBuf, mode: TransferMode) -> Services {
        Services {
            database_url,
            log_path,
            mode,
            service: tokio::sync::Mutex::new(None),
        }
    }

    /// Runs a service operation (see the module documentation).
    ///
    /// Errors: the service cannot start, is not running, or a request fails in transport.
    pub async fn run(&self, call: &Call) -> Result<String, String> {
        let text = |e: anyhow::Error| format!("{e:#}");
        let mut slot = self.service.lock().await;
        if call.op == "service" {
            if slot.is_some() {
                return Err("the service is already running".into());
            }
            *slot = Some(self.start(call).await.map_err(text)?);
            return Ok("ready".into());
        }
        let service = slot.as_ref().ok_or("no service running (call: service)")?;
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        match call.op.as_str() {
            "post-debit" => {
                let reply = service
                    .debit_once(arg("client"), arg("key"), arg("account"), amount(call)?)
                    .await
                    .map_err(|e| format!("transport: {e}"))?;
                Ok(shown(&reply))
            }
            "post-grant" => {
                let client = call.arg("client").unwrap_or("ops");
                let reply = service
                    .grant(client, arg("key"), arg("account"), amount(call)?)
                    .await
                    .map_err(text)?;
                Ok(shown(&reply))
            }
            "arm-fault" => {
                let mut fault = serde_json::json!({ "action": arg("action") });
                if let Some(count) = call.arg("count") {
                    let count: u32 = count.parse().map_err(|_| "count=N: a number")?;
                    fault["count"] = count.into();
                }
                service.arm_fault(arg("point"), fault).await.map_err(text)?;
                Ok(format!("armed at {}", arg("point")))
            }
            "release-fault" => {
                let released = service.release_fault(arg("point")).await.map_err(text)?;
                Ok(format!("released={released}"))
            }
            "stop-service" => {
                let status = slot.take().expect("running").stop().await.map_err(text)?;
                Ok(status
                    .code()
                    .map_or(status.to_string(), |c| format!("exit={c}")))
            }
            _ => {
                let status = slot.take().expect("running").kill().map_err(text)?;
                use std::os::unix::process::ExitStatusExt as _;
                let signal = status.signal().map_or("none".into(), |s| s.to_string());
                Ok(format!("signal={signal}"))
            }
        }
    }

    async fn start(&self, call: &Call) -> anyhow::Result<Service> {
        let list = |name: &str| -> Vec<String> {
            call.arg(name)
                .map(|v| v.split(',').map(String::from).collect())
                .unwrap_or_default()
        };
        let mut options = ServiceOptions {
            fault_injection: call.arg("fault-injection") == Some("yes"),
            extra_args: list("args"),
            ..ServiceOptions::default()
        };
        options.clients = list("clients");
        if self.mode != TransferMode::Statements
            && !options.extra_args.iter().any(|a| a == "--transfer-mode")
        {
            let mode = ["--transfer-mode".to_owned(), self.mode.as_str().to_owned()];
            options.extra_args.extend(mode);
        }
        Service::launch(&self.database_url, self.log_path.clone(), options).await
    }
}
