//! The ledger's library operations as spec steps (`call NAME: debit …`), and where the
//! L family's spec files live: `cases/ledger/specs/sN_<what>.spec`, each a case
//! `L-SN` found on disk at start-up (no registration line; see `case_kit::spec`).
//!
//! Operations, each one `points_ledger::transfer` (its own READ COMMITTED transaction, SPEC
//! §3) on the session's connection:
//! - `debit account=ID amount=N key=K [client=C]`: a DEBIT of N points into `sys-redeem`;
//! - `grant account=ID amount=N key=K [client=C]`: a GRANT of N points from `sys-issuer`.
//!
//! `client` defaults to [`DEFAULT_CLIENT`]. The outcome prints as
//! `outcome=OK balance=20` (`replayed=true` added for a replay); an error as its SQLSTATE
//! and the server's message, or the ledger's own error text.

use std::path::Path;
use std::sync::Arc;

use case_kit::Ctx;
use case_kit::spec::{self, Call, Calls};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use points_ledger::{NoHooks, TransferMode, TransferRequest, transfer_in};

use super::spec_workers::{self, Workers};
use tokio_postgres::Client;

/// The client id of a call that names none.
pub use super::spec_workers::DEFAULT_CLIENT;

/// Where the L family's spec files are (read when the family is built).
pub const SPEC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/specs");

/// The ledger's operations, in a transfer mode (a spec case runs them in its mode,
/// [`super::modes::mode`], through [`Calls::for_case`]).
#[derive(Debug, Clone, Default)]
pub struct LedgerCalls {
    /// How each `debit` and `grant` reaches the database.
    pub mode: TransferMode,
    /// The crash-workers of the case (`worker`, `kill-worker`; [`super::spec_workers`]);
    /// `None` until [`Calls::for_case`] gives the case's database.
    pub workers: Option<Arc<Workers>>,
}

fn request(call: &Call) -> Result<TransferRequest, String> {
    let account = call.arg("account").ok_or("needs account=ID")?;
    let key = call.arg("key").ok_or("needs key=K")?;
    let amount: i64 = call
        .arg("amount")
        .ok_or("needs amount=N")?
        .parse()
        .map_err(|_| "amount=N takes an integer number of points".to_string())?;
    let client = call.arg("client").unwrap_or(DEFAULT_CLIENT);
    for (name, _) in &call.args {
        if !["account", "key", "amount", "client"].contains(&name.as_str()) {
            return Err(format!("unknown argument {name:?}"));
        }
    }
    match call.op.as_str() {
        "debit" => Ok(TransferRequest::debit(client, key, account, amount)),
        "grant" => Ok(TransferRequest::grant(client, key, account, amount)),
        other => Err(format!("unknown operation {other:?} (debit, grant)")),
    }
}

impl Calls for LedgerCalls {
    fn check(&self, call: &Call) -> Result<(), String> {
        spec_workers::check(call).unwrap_or_else(|| request(call).map(|_| ()))
    }

    fn for_case(&self, ctx: &Ctx) -> Option<Arc<dyn Calls>> {
        let workers = ctx
            .database_url()
            .ok()
            .map(|url| Arc::new(Workers::new(url)));
        Some(Arc::new(LedgerCalls {
            mode: super::modes::mode(ctx),
            workers,
        }))
    }

    fn backends(&self) -> Vec<i32> {
        self.workers
            .as_ref()
            .map(|w| w.backends())
            .unwrap_or_default()
    }

    fn run<'a>(
        &'a self,
        client: &'a mut Client,
        call: &'a Call,
    ) -> BoxFuture<'a, Result<String, String>> {
        async move {
            if spec_workers::check(call).is_some() {
                let workers = self.workers.as_ref().ok_or("no database for a worker")?;
                return workers.run(call).await;
            }
            let request = request(call)?;
            match transfer_in(self.mode, client, &request, &NoHooks).await {
                Ok(result) => {
                    let mut text = format!(
                        "outcome={} balance={}",
                        result.outcome.as_str(),
                        result.balance
                    );
                    if result.replayed {
                        text.push_str(" replayed=true");
                    }
                    Ok(text)
                }
                Err(points_ledger::LedgerError::Db { code, source }) => {
                    Err(match (code, source.as_db_error()) {
                        (Some(code), Some(db)) => format!("{code}: {}", db.message()),
                        _ => format!("(no SQLSTATE): {source}"),
                    })
                }
                Err(other) => Err(other.to_string()),
            }
        }
        .boxed()
    }
}

/// The L family's spec cases, `L-S1`, `L-S2`, … from [`SPEC_DIR`].
pub fn cases() -> Vec<case_kit::Case> {
    spec::cases_in(
        "L",
        Path::new(SPEC_DIR),
        "cases/ledger/specs",
        super::TEMPLATE_DATABASE,
        Arc::new(LedgerCalls::default()),
    )
}
