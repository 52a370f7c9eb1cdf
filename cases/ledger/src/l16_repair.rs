//! L16 — repair as code: freeze, append adjustments, rewrite cached balances from the
//! entries, re-check, unfreeze (`points_ledger::repair`).
//! Setup: L11's tamper (acct-0001's balance +5 behind the ledger's back) and a planted
//! single-entry transaction (a debit of 10 from acct-0002 whose credit half to
//! sys-redeem is missing: one entry of -10, balance lowered, registration OK).
//! Claim: the repair freezes exactly the accounts the findings name; debits attempted
//! while frozen are refused (`AccountFrozen`) and record nothing; the tamper is undone by
//! rewriting the cached balance from the entries, the unbalanced transaction is completed
//! by an appended adjusting transaction on sys-suspense; reconciliation is then clean and
//! the accounts are unfrozen; no existing `ledger_entry` row changed; the refused debits
//! then succeed with the same keys. The repair log is printed.
//! Fails if: any of these does not hold.

use std::sync::Mutex;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use points_ledger::{
    LedgerError, RepairHooks, RepairReport, SYS_SUSPENSE, debit_in, grant_in, reconcile, repair,
};
use tokio_postgres::Client;

use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L16",
        "repair as code: freeze, adjust, rewrite from entries, re-check, unfreeze",
        |ctx| run(ctx).boxed(),
    )
    .connections(3)
}

const CLIENT: &str = "app-l16";
const TAMPERED: &str = "acct-0001";
const TAMPER_POINTS: i64 = 5;
const PLANTED: &str = "acct-0002";
const PLANTED_DEBIT: i64 = 10;
/// Not named by any finding: stays writable during the repair.
const BYSTANDER: &str = "acct-0003";
/// Debits attempted while the accounts are frozen: (key, account).
const DURING_REPAIR: [(&str, &str); 3] = [
    ("k-1601", TAMPERED),
    ("k-1602", PLANTED),
    ("k-1603", BYSTANDER),
];
const DEBIT: i64 = 20;

/// An existing entry: `(entry_id, txn_id, account_id, amount)`.
type EntryRow = (i64, i64, String, i64);

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut db = ctx.connect().await?;
    grant_in(mode, &mut db, "ops", "g-1601", TAMPERED, 500).await?;
    grant_in(mode, &mut db, "ops", "g-1602", PLANTED, 200).await?;
    grant_in(mode, &mut db, "ops", "g-1603", BYSTANDER, 100).await?;
    debit_in(mode, &mut db, CLIENT, "k-1600", TAMPERED, 120).await?;
    plant_faults(&db).await?;
    let before = reconcile(&mut db).await?;
    ctx.note(format!("before the repair: {}", before.summary()));
    let entries_before = all_entries(&db).await?;

    let attempts = DuringRepair {
        mode,
        client: tokio::sync::Mutex::new(ctx.connect().await?),
        seen: Mutex::new(Vec::new()),
    };
    let report = repair(&mut db, &attempts).await?;
    print_report(ctx, &report);
    check_during_repair(ctx, &db, &report, attempts).await?;
    check_append_only(ctx, &db, &entries_before).await?;
    retry_after_repair(ctx, mode, &mut db).await?;
    let findings = reconcile(&mut db).await?;
    ctx.check(
        "reconciliation at the end: no findings",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// Checks what happened while the repair ran: the frozen accounts, the `attempts`' debits
/// (refused on frozen accounts and recording nothing, the bystander's went through), and
/// that reconciliation after the repair is clean with the accounts unfrozen.
async fn check_during_repair(
    ctx: &mut Ctx,
    db: &Client,
    report: &RepairReport,
    attempts: DuringRepair,
) -> anyhow::Result<()> {
    ctx.check_eq(
        "frozen accounts",
        format!("{TAMPERED},{PLANTED},{SYS_SUSPENSE}"),
        report.frozen.join(","),
    );
    let seen = attempts
        .seen
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    for (key, account, outcome) in &seen {
        ctx.note(format!(
            "during the repair: debit {key} on {account}: {outcome}"
        ));
    }
    let refused = |key: &str| {
        seen.iter()
            .any(|(k, _, outcome)| k == key && outcome.starts_with("refused: frozen"))
    };
    ctx.check(
        "debits on frozen accounts were refused while the repair ran",
        refused("k-1601") && refused("k-1602"),
        "",
    );
    ctx.check(
        "a debit on an account no finding names went through meanwhile",
        seen.iter().any(|(k, _, o)| k == "k-1603" && o == "OK"),
        "",
    );
    for key in ["k-1601", "k-1602"] {
        ctx.check(
            format!("{key}: the refusal recorded nothing (no registration)"),
            queries::request_for_key(db, CLIENT, key).await?.is_none(),
            "",
        );
    }
    ctx.check(
        "reconciliation after the repair is clean, and the accounts were unfrozen",
        report.after.is_clean() && report.unfrozen,
        report.after.summary(),
    );
    Ok(())
}

/// Append-only: checks every entry of `entries_before` is still there, unchanged, that
/// three were added, and the rewritten and adjusted balances.
async fn check_append_only(
    ctx: &mut Ctx,
    db: &Client,
    entries_before: &[EntryRow],
) -> anyhow::Result<()> {
    let entries_after = all_entries(db).await?;
    let kept = entries_before
        .iter()
        .all(|entry| entries_after.contains(entry));
    ctx.check(
        "no existing ledger_entry row changed or disappeared",
        kept,
        format!("kept={kept}"),
    );
    ctx.check_eq(
        "entries added by the repair (the adjustment) and by the bystander's debit",
        3,
        entries_after.len() - entries_before.len(),
    );
    ctx.check_eq(
        "acct-0001 rewritten from its entries (500 - 120)",
        500 - 120,
        queries::existing_balance(db, TAMPERED).await?,
    );
    ctx.check_eq(
        "sys-suspense holds the missing counter-entry",
        PLANTED_DEBIT,
        queries::existing_balance(db, SYS_SUSPENSE).await?,
    );
    Ok(())
}

/// The same keys, after the repair: checks each refused debit now succeeds (not a replay).
async fn retry_after_repair(
    ctx: &mut Ctx,
    mode: points_ledger::TransferMode,
    db: &mut Client,
) -> anyhow::Result<()> {
    for (key, account) in &DURING_REPAIR[..2] {
        let result = debit_in(mode, db, CLIENT, key, account, DEBIT).await?;
        ctx.note(format!(
            "after the repair: debit {key} on {account}: outcome={} replayed={} balance={}",
            result.outcome, result.replayed, result.balance
        ));
        ctx.check_eq(
            format!("{key}: the same key succeeds after the repair"),
            "OK false".to_string(),
            format!("{} {}", result.outcome, result.replayed),
        );
    }
    Ok(())
}

/// L11's tamper and the planted single-entry transaction.
async fn plant_faults(db: &Client) -> anyhow::Result<()> {
    db.execute(
        "UPDATE account SET balance = balance + $1 WHERE account_id = $2",
        &[&TAMPER_POINTS, &TAMPERED],
    )
    .await?;
    db.batch_execute(&format!(
        "BEGIN;
         WITH txn AS (
             INSERT INTO ledger_txn (client_id, idem_key, kind)
             VALUES ('{CLIENT}', 'k-1690', 'DEBIT') RETURNING txn_id
         ), entry AS (
             INSERT INTO ledger_entry (txn_id, account_id, amount)
             SELECT txn_id, '{PLANTED}', -{PLANTED_DEBIT} FROM txn
         )
         INSERT INTO idem_request (client_id, idem_key, request_hash, outcome, txn_id, balance_after)
         SELECT '{CLIENT}', 'k-1690', 'planted', 'OK', txn_id, 190 FROM txn;
         UPDATE account SET balance = balance - {PLANTED_DEBIT} WHERE account_id = '{PLANTED}';
         COMMIT;"
    ))
    .await?;
    Ok(())
}

async fn all_entries(db: &Client) -> anyhow::Result<Vec<EntryRow>> {
    let rows = db
        .query(
            "SELECT entry_id, txn_id, account_id, amount FROM ledger_entry ORDER BY entry_id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect())
}

fn print_report(ctx: &mut Ctx, report: &RepairReport) {
    ctx.note("repair log:");
    for line in &report.log {
        let mut text = format!("  {}", line.step);
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
        text.push_str(&format!(": {}", line.note));
        ctx.note(text);
    }
}

/// Debits attempted while the repair holds the accounts frozen (in the case's mode).
struct DuringRepair {
    mode: points_ledger::TransferMode,
    client: tokio::sync::Mutex<Client>,
    /// `(key, account, what happened)`.
    seen: Mutex<Vec<(String, String, String)>>,
}

impl RepairHooks for DuringRepair {
    fn frozen<'a>(&'a self, _accounts: &'a [String]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            for (key, account) in DURING_REPAIR {
                let what = match debit_in(self.mode, &mut client, CLIENT, key, account, DEBIT).await
                {
                    Ok(result) => result.outcome.to_string(),
                    Err(LedgerError::AccountFrozen(frozen)) => {
                        format!("refused: frozen ({frozen})")
                    }
                    Err(error) => format!("error: {error}"),
                };
                self.seen.lock().unwrap_or_else(|p| p.into_inner()).push((
                    key.to_owned(),
                    account.to_owned(),
                    what,
                ));
            }
        })
    }
}
