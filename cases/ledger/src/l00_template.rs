//! L0 — template: copy this file to add a case (not in the default run; `./run.sh L0`).
//! Claim: debits of seeded random amounts, sent at the same moment on 8 connections to an
//! account that can cover them all, all succeed and are all recorded: the balance is the
//! grant minus their sum, and the entries say the same.
//! Fails if: a debit is not OK, or the balance or the entries disagree with the amounts.
//!
//! How to use it: copy to `lNN_<what>.rs`; set the id, title, schedule, `not_clean` and
//! connections; write the claim and the failure condition above; keep setup, steps and
//! checks in that order; add the module name as one line to `register_cases!` in
//! `lib.rs`; add its row to `docs/cases.md`; run `./run.sh --accept LNN` and review the new
//! `evidence/snapshots/L/LNN.snap`.
//!
//! Transcript rule: print only what is the same on every run — counts, balances of fixed
//! inputs, outcomes. Values drawn from the seed, txn ids, pids or timings vary: compare
//! them inside a check (as below) or print them as `name=value` for the redaction layer.

use futures_util::FutureExt;
use points_ledger::{Outcome, debit_in, grant_in};
use rand::RngExt;

use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L0",
        "template: 8 concurrent debits of seeded random amounts all succeed",
        |ctx| run(ctx).boxed(),
    )
    // Defaults: Schedule::Concurrent (it touches only its own database; Exclusive if it
    // restarts the cluster or kills shared processes, Last if it inspects the other
    // cases' databases) and clean (`.not_clean()` for a negative control, whose
    // database is broken on purpose). Declare the most connections held at once: the
    // racers and its own.
    .connections(10)
}

const ACCOUNT: &str = "acct-0009";
const GRANT: i64 = 1_000;
const RACERS: usize = 8;
/// Largest random debit; RACERS * MAX_DEBIT stays below GRANT, so every debit is covered.
const MAX_DEBIT: i64 = 50;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    // Setup: the case's own database, cloned from the seeded template.
    let mut db = ctx.connect().await?;
    grant_in(mode, &mut db, "ops", "g-0001", ACCOUNT, GRANT).await?;
    let mut rng = ctx.rng(); // seeded from the run's seed: `--seed N` replays these draws
    let amounts: Vec<i64> = (0..RACERS)
        .map(|_| rng.random_range(1..=MAX_DEBIT))
        .collect();
    let total: i64 = amounts.iter().sum();

    // Steps: RACERS connections, released together, each debits its amount.
    let shared = amounts.clone();
    let outcomes = ctx
        .race(RACERS, move |mut racer| {
            let amount = shared[racer.index];
            async move {
                let key = format!("k-00-{:02}", racer.index);
                debit_in(mode, &mut racer.client, "app-l0", &key, ACCOUNT, amount)
                    .await
                    .map(|result| result.outcome)
                    .map_err(|error| error.to_string())
            }
        })
        .await?;

    // Checks: deterministic figures are printed; seed-dependent ones are compared only.
    let ok = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Outcome::Ok)))
        .count();
    ctx.note(format!("debits={RACERS} ok={ok}"));
    ctx.check_eq("every debit succeeded", RACERS, ok);
    let balance = queries::existing_balance(&db, ACCOUNT).await?;
    ctx.check(
        "balance = grant - sum of the drawn amounts",
        balance == GRANT - total,
        "",
    );
    ctx.check(
        "balance recomputed from entries equals the stored balance",
        queries::sum_of_entries(&db, ACCOUNT).await? == balance,
        "",
    );
    ctx.check_eq(
        "debit transactions",
        RACERS as i64,
        queries::count_txns(&db, ACCOUNT, "DEBIT").await?,
    );
    Ok(())
}
