//! L11 — reconciliation: the four invariant queries in one REPEATABLE READ snapshot.
//! Claim: every database of the run that is meant to be clean has no findings (I3, I4,
//! request/transaction links, global sum 0), and a balance changed behind the ledger's
//! back is found: stored = recomputed + 5 on acct-0001, global sum 5.
//! Fails if: a clean database has findings, or the tampering goes unnoticed or is
//! reported with other figures.

use futures_util::FutureExt;
use ledger_svc::{Findings, debit, grant, reconcile};

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
    // Every clean database of the run (empty when L11 runs alone).
    let databases = ctx.clean_databases();
    if databases.is_empty() {
        ctx.note("no other clean databases in this run");
    }
    for database in databases {
        let mut client = ctx.connect_to(&database).await?;
        let findings = reconcile(&mut client).await?;
        ctx.check(
            format!("{database}: no findings"),
            findings.is_clean(),
            findings.summary(),
        );
    }

    // Its own data: grants, debits, an INSUFFICIENT, a replay.
    let mut db = ctx.connect().await?;
    grant(&mut db, "ops", "g-1101", "acct-0001", 500).await?;
    grant(&mut db, "ops", "g-1102", "acct-0002", 50).await?;
    debit(&mut db, "app-l11", "k-1101", "acct-0001", 120).await?;
    debit(&mut db, "app-l11", "k-1102", "acct-0002", 80).await?; // INSUFFICIENT, recorded
    debit(&mut db, "app-l11", "k-1101", "acct-0001", 120).await?; // replay
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
