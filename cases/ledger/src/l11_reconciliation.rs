//! L11 — reconciliation: the four invariant queries in one REPEATABLE READ snapshot.
//! Claim: every database of the family that is meant to be clean has no findings (I3, I4,
//! request/transaction links, global sum 0), and a balance changed behind the ledger's
//! back is found: stored = recomputed + 5 on acct-0001, global sum 5. The databases
//! covered are listed in the run record (`results.json`, `details`), not the transcript.
//! Fails if: a clean database has findings, or the tampering goes unnoticed or is
//! reported with other figures.

use futures_util::FutureExt;
use points_ledger::{Findings, debit_in, grant_in, reconcile};

use case_kit::{Case, Ctx, Schedule};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L11",
        "reconciliation: clean databases have no findings; tampering is found",
        |ctx| run(ctx).boxed(),
    )
    // Its own database ends tampered on purpose.
    .schedule(Schedule::Last)
    .not_clean()
    .connections(3)
}

const TAMPERED: &str = "acct-0001";
const TAMPER_POINTS: i64 = 5;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    // Every clean database of the family (none when L11 runs alone). The transcript
    // names only databases with findings, so another case's arrival never changes this
    // snapshot; the run record lists every database covered and what it showed.
    let databases = ctx.clean_databases();
    let mut covered = serde_json::Map::new();
    let mut with_findings = Vec::new();
    for database in &databases {
        let mut client = ctx.connect_to(database).await?;
        let findings = reconcile(&mut client).await?;
        covered.insert(database.clone(), findings.summary().into());
        if !findings.is_clean() {
            with_findings.push(format!("{database}: {}", findings.summary()));
        }
    }
    ctx.record("reconciled_databases", serde_json::Value::Object(covered));
    ctx.check(
        "every other clean database of the family: no findings",
        with_findings.is_empty(),
        with_findings.join("; "),
    );

    // Its own data: grants, debits, an INSUFFICIENT, a replay.
    let mut db = ctx.connect().await?;
    grant_in(mode, &mut db, "ops", "g-1101", "acct-0001", 500).await?;
    grant_in(mode, &mut db, "ops", "g-1102", "acct-0002", 50).await?;
    debit_in(mode, &mut db, "app-l11", "k-1101", "acct-0001", 120).await?;
    debit_in(mode, &mut db, "app-l11", "k-1102", "acct-0002", 80).await?; // INSUFFICIENT, recorded
    debit_in(mode, &mut db, "app-l11", "k-1101", "acct-0001", 120).await?; // replay
    let own = reconcile(&mut db).await?;
    ctx.check("own database: no findings", own.is_clean(), own.summary());

    // Tamper: add points to a balance without an entry.
    db.execute(
        "UPDATE account SET balance = balance + $1 WHERE account_id = $2",
        &[&TAMPER_POINTS, &TAMPERED],
    )
    .await?;
    let found = reconcile(&mut db).await?;
    ctx.note(format!("after tampering: {}", found.summary()));
    check_tamper_found(ctx, &found);
    Ok(())
}

fn check_tamper_found(ctx: &mut Ctx, found: &Findings) {
    ctx.check_eq(
        "accounts whose balance disagrees with entries",
        1,
        found.balance_mismatches.len(),
    );
    if let Some(mismatch) = found.balance_mismatches.first() {
        ctx.note(format!(
            "{} stored={} recomputed={}",
            mismatch.account_id, mismatch.stored, mismatch.recomputed
        ));
        ctx.check_eq("the finding names", TAMPERED, mismatch.account_id.as_str());
        ctx.check_eq(
            "stored - recomputed",
            TAMPER_POINTS,
            mismatch.stored - mismatch.recomputed,
        );
    }
    ctx.check_eq("global sum of balances", TAMPER_POINTS, found.global_sum);
    ctx.check(
        "no other kind of finding",
        found.unbalanced_txns.is_empty()
            && found.requests_without_txn.is_empty()
            && found.txns_without_request.is_empty()
            && found.pending_requests.is_empty(),
        found.summary(),
    );
}
