//! The points ledger on the cluster of a P case file ([`crate::spec_cluster`]): its
//! install, a debit load through `ledger-svc` cut by `power-cut`, what the clients saw
//! made readable to SQL after the cut, and `amcheck`. The code is P1's
//! ([`crate::ledger`]): the same install, clients, cut under load and index check.
//!
//! | call | prints |
//! |---|---|
//! | `install-ledger` | `ledger installed: 10 test accounts granted 1000000 points each` |
//! | `debit-load clients=N until-acknowledged=N` | `ledger-svc on the cluster; 32 clients debit through it; 96 debits answered 201 seen (the clients go on until the cut)` |
//! | `record-outcomes` | `client_outcome: rows_n=[n] (every key the clients sent and what they saw, also in <case>-client-outcomes.log)` |
//! | `amcheck` | `bt_index_check: indexes_n=[n] failures=0` and each failure |

use std::fmt::Write as _;

use case_kit::spec::Call;
use tokio_postgres::Client;

use crate::ledger::{self, RunningLoad};
use crate::spec_disk::DiskState;

/// Runs `call` (`install-ledger`, `debit-load`, `record-outcomes`, `amcheck`) on the
/// case's cluster.
///
/// Errors: what the call's step prints after `ERROR`.
pub(crate) async fn call(state: &mut DiskState, call: &Call) -> Result<String, String> {
    match call.op.as_str() {
        "install-ledger" => {
            let mut client = state.connect().await?;
            let accounts = ledger::install(&mut client).await;
            let accounts = accounts.map_err(|e| format!("{e:#}"))?;
            Ok(format!(
                "ledger installed: {accounts} test accounts granted {} points each",
                ledger::GRANT
            ))
        }
        "debit-load" => debit_load(state, call).await,
        "record-outcomes" => record_outcomes(state).await,
        _ => {
            let client = state.connect().await?;
            let (indexes, failures) = ledger::amcheck(&client).await.map_err(|e| e.to_string())?;
            let mut line = format!(
                "bt_index_check: indexes_n={indexes} failures={}",
                failures.len()
            );
            for failure in failures {
                let _ = write!(line, "\n{failure}");
            }
            Ok(line)
        }
    }
}

/// `debit-load clients=N until-acknowledged=N`: `ledger-svc` on the case's database,
/// then the clients; returns once N debits were answered 201, the clients still
/// debiting (the cut stops them).
async fn debit_load(state: &mut DiskState, call: &Call) -> Result<String, String> {
    if state.load.is_some() {
        return Err("a load runs already".into());
    }
    let number = |name: &str| {
        let text = call.arg(name).unwrap_or_default();
        (text.parse::<usize>()).map_err(|_| format!("{name}={text} is not a count"))
    };
    let (clients, until) = (number("clients")?, number("until-acknowledged")?);
    let log = state.log("ledger-svc")?;
    let service = ledger::service_on(state.power()?, &state.database, log).await;
    let service = service.map_err(|e| format!("{e:#}"))?;
    let running = RunningLoad::start(&service, clients);
    let seen = running.wait_acknowledged(until).await;
    state.load = Some((service, running));
    if seen < until {
        return Err(format!(
            "only {seen} debits answered 201 (the load stalled; the service's log has why)"
        ));
    }
    Ok(format!(
        "ledger-svc on the cluster; {clients} clients debit through it; {until} debits answered 201 seen (the clients go on until the cut)"
    ))
}

/// `record-outcomes`: after the cut, every key the load's clients sent and what they
/// saw (`acknowledged`, `unknown`, `refused`) into table `client_outcome` of the
/// recovered database, so the file's SQL reads them, and into the case's
/// `client-outcomes` log.
async fn record_outcomes(state: &mut DiskState) -> Result<String, String> {
    let seen = (state.seen.as_ref()).ok_or("no load was cut: `debit-load`, then `power-cut`")?;
    let mut keys: Vec<(&str, &str)> = Vec::new();
    keys.extend(
        seen.acknowledged
            .iter()
            .map(|k| (k.as_str(), "acknowledged")),
    );
    keys.extend(seen.unknown.iter().map(|k| (k.as_str(), "unknown")));
    keys.extend(seen.refused.iter().map(|k| (k.as_str(), "refused")));
    keys.sort();
    let client = state.connect().await?;
    write_outcomes(&client, &keys)
        .await
        .map_err(|e| e.to_string())?;
    let log = state.log("client-outcomes")?;
    let text: String = keys
        .iter()
        .map(|(key, seen)| format!("{key} {seen}\n"))
        .collect();
    std::fs::write(&log, text).map_err(|e| format!("{}: {e}", log.display()))?;
    let name = log.file_name().unwrap_or_default().to_string_lossy();
    Ok(format!(
        "client_outcome: rows_n={} (every key the clients sent and what they saw, also in {name})",
        keys.len()
    ))
}

/// Creates `client_outcome (key, outcome)` and writes `keys` into it.
async fn write_outcomes(
    client: &Client,
    keys: &[(&str, &str)],
) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute("CREATE TABLE client_outcome (key text PRIMARY KEY, outcome text NOT NULL)")
        .await?;
    let (names, outcomes): (Vec<&str>, Vec<&str>) = keys.iter().copied().unzip();
    let insert = "INSERT INTO client_outcome SELECT * FROM unnest($1::text[], $2::text[])";
    client.execute(insert, &[&names, &outcomes]).await?;
    Ok(())
}
