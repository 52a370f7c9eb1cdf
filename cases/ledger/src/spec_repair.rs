//! The ledger's repair as a spec step (`points_ledger::repair`: freeze, adjust, rewrite
//! cached balances from the entries, re-check, unfreeze), with debits attempted while
//! the accounts are frozen (L16).
//!
//! `call NAME: repair [client=C] [while-frozen=KEY:ACCOUNT:AMOUNT,…]` runs the repair on
//! the session's connection; once it has frozen the accounts its findings name, each
//! debit of `while-frozen` is attempted on a connection of its own (the library's
//! `RepairHooks::frozen`), in the case's transfer mode. Prints the repair log, one line
//! per step (`freeze acct-0001: writes refused`, `rewrite-balance acct-0001 before=385
//! after=380: …`), `frozen=…`, each attempt (`while frozen: debit k-1601 on acct-0001:
//! refused: frozen (acct-0001)`) and `after: clean=true unfrozen=true`.

use futures_util::future::BoxFuture;
use points_ledger::{LedgerError, RepairHooks, RepairReport, TransferMode, debit_in};
use tokio_postgres::Client;

use case_kit::spec::Call;

/// Whether `call` is a repair with known arguments; `None` for another op.
pub fn check(call: &Call) -> Option<Result<(), String>> {
    (call.op == "repair").then(|| {
        for (name, _) in &call.args {
            if !["client", "while-frozen"].contains(&name.as_str()) {
                return Err(format!("repair: unknown argument {name:?}"));
            }
        }
        attempts(call).map(|_| ())
    })
}

/// The debits of `while-frozen=KEY:ACCOUNT:AMOUNT,…`.
///
/// Errors: an item not of that shape.
fn attempts(call: &Call) -> Result<Vec<(String, String, i64)>, String> {
    let Some(list) = call.arg("while-frozen") else {
        return Ok(Vec::new());
    };
    list.split(',')
        .map(
            |item| match item.split(':').collect::<Vec<_>>().as_slice() {
                [key, account, amount] => amount
                    .parse()
                    .map(|amount| (key.to_string(), account.to_string(), amount))
                    .map_err(|_| format!("{item}: AMOUNT is an integer")),
                _ => Err(format!("while-frozen: KEY:ACCOUNT:AMOUNT, not {item:?}")),
            },
        )
        .collect()
}

/// The debits attempted once the accounts are frozen, and what each got.
struct WhileFrozen {
    mode: TransferMode,
    client_id: String,
    attempts: Vec<(String, String, i64)>,
    connection: tokio::sync::Mutex<Client>,
    seen: std::sync::Mutex<Vec<String>>,
}

impl RepairHooks for WhileFrozen {
    fn frozen<'a>(&'a self, _accounts: &'a [String]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let mut client = self.connection.lock().await;
            for (key, account, amount) in &self.attempts {
                let debit = debit_in(
                    self.mode,
                    &mut client,
                    &self.client_id,
                    key,
                    account,
                    *amount,
                );
                let what = match debit.await {
                    Ok(result) => result.outcome.to_string(),
                    Err(LedgerError::AccountFrozen(frozen)) => {
                        format!("refused: frozen ({frozen})")
                    }
                    Err(error) => format!("error: {error}"),
                };
                let line = format!("while frozen: debit {key} on {account}: {what}");
                self.seen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(line);
            }
        })
    }
}

/// Runs the repair on `client` (see the module documentation); `database_url` gives the
/// attempts their connection.
///
/// Errors: the arguments; a connection; the repair itself.
pub async fn run(
    client: &mut Client,
    call: &Call,
    mode: TransferMode,
    database_url: &str,
) -> Result<String, String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let (connection, task) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .map_err(|e| text(&e))?;
    tokio::spawn(task);
    let hooks = WhileFrozen {
        mode,
        client_id: call
            .arg("client")
            .unwrap_or(super::spec_workers::DEFAULT_CLIENT)
            .into(),
        attempts: attempts(call)?,
        connection: tokio::sync::Mutex::new(connection),
        seen: std::sync::Mutex::new(Vec::new()),
    };
    let report = points_ledger::repair(client, &hooks)
        .await
        .map_err(|e| text(&e))?;
    let mut lines = logged(&report);
    lines.push(format!("frozen={}", report.frozen.join(",")));
    lines.extend(hooks.seen.into_inner().unwrap_or_else(|p| p.into_inner()));
    lines.push(format!(
        "after: clean={} unfrozen={}",
        report.after.is_clean(),
        report.unfrozen
    ));
    Ok(lines.join("\n"))
}

/// The repair log, one line per step (no ids: they vary).
fn logged(report: &RepairReport) -> Vec<String> {
    report
        .log
        .iter()
        .map(|line| {
            let mut text = line.step.to_string();
            if let Some(account) = &line.account_id {
                text.push_str(&format!(" {account}"));
            }
            if line.txn_id.is_some() {
                text.push_str(" of the planted transaction");
            }
            if let Some(before) = line.before {
                text.push_str(&format!(" before={before}"));
            }
            if let Some(after) = line.after {
                text.push_str(&format!(" after={after}"));
            }
            format!("{text}: {}", line.note)
        })
        .collect()
}
