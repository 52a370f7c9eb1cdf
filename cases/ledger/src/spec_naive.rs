//! The naive debit the negative controls L4, L5 and L6 refute
//! (`points_ledger::naive::debit`, SPEC §6) as a spec operation, so a control is one file:
//!
//! - `naive-debit account=ID amount=N key=K client=C write=absolute|relative`: one
//!   READ COMMITTED transaction that reads the balance, checks it in the application,
//!   and writes `balance = <read> - N` (`absolute`, L4's lost update) or
//!   `balance = balance - N` (`relative`, L5 and L6). In a `race call:` every racer
//!   meets the others at the race's barrier between its read and its write
//!   ([`case_kit::spec::Calls::run_racing`]), so every read precedes every write; run as
//!   a plain step it meets no one.
//!
//! Printed as `outcome=OK read=100`, `outcome=REFUSED read=2` (the application's check),
//! `outcome=CHECK_VIOLATION read=100` (SQLSTATE 23514); another database error is an
//! error with its SQLSTATE.

use case_kit::spec::Call;
use points_ledger::naive::debit::{BalanceWrite, NaiveDebit, NaiveOutcome, naive_debit};
use tokio::sync::Barrier;
use tokio_postgres::Client;

fn request(call: &Call) -> Result<NaiveDebit, String> {
    for (name, _) in &call.args {
        if !["account", "amount", "key", "client", "write"].contains(&name.as_str()) {
            return Err(format!("naive-debit: unknown argument {name:?}"));
        }
    }
    let arg = |name: &str| call.arg(name).ok_or(format!("naive-debit needs {name}=…"));
    let write = match arg("write")? {
        "absolute" => BalanceWrite::AbsoluteFromRead,
        "relative" => BalanceWrite::Relative,
        other => return Err(format!("write={other}: absolute or relative")),
    };
    Ok(NaiveDebit {
        client_id: arg("client")?.into(),
        idem_key: arg("key")?.into(),
        account: arg("account")?.into(),
        amount: arg("amount")?
            .parse()
            .map_err(|_| "amount=N takes an integer number of points".to_string())?,
        write,
    })
}

/// Runs `call` on `client`, meeting the other racers at `barrier` between read and write
/// when there is one.
///
/// Errors: a database error other than 23514, as `SQLSTATE read=N`.
pub async fn run(
    client: &mut Client,
    call: &Call,
    barrier: Option<&Barrier>,
) -> Result<String, String> {
    let report = naive_debit(client, &request(call)?, barrier).await;
    let read = report
        .balance_read
        .map_or_else(|| "none".to_string(), |b| b.to_string());
    let outcome = match &report.outcome {
        NaiveOutcome::Committed => "OK",
        NaiveOutcome::RefusedByApplication => "REFUSED",
        outcome if outcome.is_check_violation() => "CHECK_VIOLATION",
        NaiveOutcome::DatabaseError { sqlstate } => {
            let code = sqlstate.as_deref().unwrap_or("(no SQLSTATE)");
            return Err(format!("{code} read={read}"));
        }
    };
    Ok(format!("outcome={outcome} read={read}"))
}
