//! L20 — reconciliation during writes.
//! Claim: L11's reconciliation (`points_ledger::reconcile`: four queries in one REPEATABLE
//! READ snapshot) run 20 times while 32 clients debit and grant never reports a finding,
//! even when, in every round, a debit commits between its first and second query: the
//! snapshot of 13.2.2 "Repeatable Read Isolation Level" (PostgreSQL docs) does not see it.
//! Load: 32 racers (`Ctx::race`), each granting 5 and debiting 5 on one of acct-0001 …
//! acct-0008 in a loop until both reconciliation phases are done. Forced interleaving:
//! in each round, between the reconciliation's first and second read, the case commits a
//! debit of 1 from acct-0010 (an account the load never touches), waits for it, and
//! waits for the load to commit one more transfer, so every round overlaps the writes.
//! Negative control: the same checks from separate READ COMMITTED statements
//! (`naive_reconcile`: stored balances, then entry sums, …), 20 rounds under the same load
//! and the same forced debit between its first and second read: false findings appear in
//! every round (at least acct-0010, stored one more than its entries), although the
//! ledger is consistent, as L11 and the same naive reconciler confirm once the writes
//! stop. `cases/ledger/tests/reconciliation_controls.rs` runs it without load and without the
//! forced debit, where the control's check must FAIL.
//! Fails if: L11 reports a finding in any round, the load fails, the forced debits do not
//! commit, the naive reconciler reports no false finding, or the quiet ledger has one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use points_ledger::{Findings, TransferMode, debit_in, grant_in, reconcile, reconcile_with};
use tokio::sync::Mutex;
use tokio_postgres::Client;

use super::queries;
use case_kit::{Case, Ctx};
use points_ledger::naive::reconcile::{BALANCES_READ, naive_reconcile};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L20",
        "reconciliation during writes: one snapshot finds nothing; separate statements find ghosts",
        |ctx| run(ctx).boxed(),
    )
    // The racers, the reconciler, the forced debit's writer and the naive reconciler.
    // Its ledger stays consistent (the naive reconciler only reads), so it stays clean.
    .connections(RACERS as u32 + 3)
}

/// Whether the faults of the control can happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadPlan {
    /// 32 writers and a debit forced between the first two reads (the case's plan).
    Forced,
    /// No writers and no forced debit: nothing changes between two reads, so the naive
    /// reconciler finds nothing and the control's check must FAIL.
    Quiet,
}

/// The anomaly the negative control's check names.
pub const ANOMALY: &str =
    "separate READ COMMITTED statements report findings in a consistent ledger under writes";

const RACERS: usize = 32;
/// Reconciliation rounds per phase (L11's, then the naive one).
const ROUNDS: usize = 20;
/// The accounts the load writes: acct-0001 … acct-0008.
const LOAD_ACCOUNTS: u32 = 8;
/// Points each load account starts with.
const LOAD_START: i64 = 1_000;
/// Points of each load grant and each load debit.
const LOAD_AMOUNT: i64 = 5;
/// The account of the forced debits (never touched by the load).
const FORCED_ACCOUNT: &str = "acct-0010";
const FORCED_START: i64 = 100;
/// Points of each forced debit.
const FORCED_DEBIT: i64 = 1;
/// Longest wait for every racer to have committed once before the first round,
/// milliseconds.
const LOAD_START_LIMIT_MS: u64 = 10_000;
/// A racer stops after this long even if the phases never end, milliseconds (the
/// phases take a fraction of it).
const LOAD_LIMIT_MS: u64 = 60_000;
/// Polling interval of the start wait, milliseconds.
const POLL_MS: u64 = 5;

/// What one phase of reconciliation rounds saw.
#[derive(Debug, Default)]
struct Phase {
    /// Rounds that reported at least one finding.
    rounds_with_findings: usize,
    /// All findings of all rounds.
    findings: usize,
    /// Rounds whose findings include acct-0010 with stored - recomputed = 1.
    forced_account_mismatches: usize,
    /// The first round's acct-0010 mismatch, as `stored=… recomputed=…`.
    first_forced: Option<String>,
    /// Forced debits that committed OK.
    forced_ok: u64,
    /// Load transfers committed while the phase ran.
    load_during: u64,
    /// Rounds in which a load transfer committed between the first two reads.
    rounds_overlapped: u64,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, LoadPlan::Forced).await
}

/// The case under `plan`.
///
/// Errors: setup failed, a racer could not connect, a reconciliation query failed.
pub async fn run_with(ctx: &mut Ctx, plan: LoadPlan) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let mut reconciler = ctx.connect().await?;
    grant_start_balances(mode, &mut reconciler).await?;
    let writer = Mutex::new(ctx.connect().await?);
    let naive = ctx.connect().await?;

    let (load, snapshot, separate) =
        load_and_phases(ctx, mode, plan, &mut reconciler, &writer, &naive).await?;
    let forced_expected = check_load_and_rounds(ctx, plan, &load, &snapshot, &separate);
    check_quiet_ledger(ctx, &mut reconciler, &naive, &separate, forced_expected).await
}

/// Grants [`LOAD_START`] to each load account and [`FORCED_START`] to the forced debits'
/// account, on `reconciler`.
async fn grant_start_balances(mode: TransferMode, reconciler: &mut Client) -> anyhow::Result<()> {
    for n in 1..=LOAD_ACCOUNTS {
        let account = points_ledger::test_account(n);
        grant_in(
            mode,
            reconciler,
            "ops",
            &format!("g-20{n:02}"),
            &account,
            LOAD_START,
        )
        .await?;
    }
    grant_in(
        mode,
        reconciler,
        "ops",
        "g-2099",
        FORCED_ACCOUNT,
        FORCED_START,
    )
    .await?;
    Ok(())
}

/// Runs the load (under [`LoadPlan::Forced`]; none under [`LoadPlan::Quiet`]) and both
/// reconciliation phases at once; the load stops when the phases end. Returns each racer's
/// (transfers committed OK, transfers that failed) and the two phases (L11's snapshot,
/// then the separate statements).
async fn load_and_phases(
    ctx: &Ctx,
    mode: TransferMode,
    plan: LoadPlan,
    reconciler: &mut Client,
    writer: &Mutex<Client>,
    naive: &Client,
) -> anyhow::Result<(Vec<(u64, u64)>, Phase, Phase)> {
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let load_racers = if plan == LoadPlan::Forced { RACERS } else { 0 };
    let load = async {
        if load_racers == 0 {
            return anyhow::Ok(Vec::new());
        }
        let (stop, committed) = (stop.clone(), committed.clone());
        ctx.race(load_racers, move |racer| {
            let (stop, committed) = (stop.clone(), committed.clone());
            async move { write_load(mode, racer, &stop, &committed).await }
        })
        .await
    };
    let phases = async {
        let phases = reconcile_phases(mode, plan, reconciler, writer, naive, &committed).await;
        // Whatever happened, the load ends now.
        stop.store(true, Ordering::SeqCst);
        phases
    };
    let (load, phases) = tokio::join!(load, phases);
    let load = load?;
    let (snapshot, separate) = phases?;
    Ok((load, snapshot, separate))
}

/// Notes the load and the rounds of both phases and checks them: no load transfer failed
/// and every round overlapped a load transfer (under [`LoadPlan::Forced`]), every forced
/// debit committed, L11 found nothing. Returns the forced debits expected per phase.
fn check_load_and_rounds(
    ctx: &mut Ctx,
    plan: LoadPlan,
    load: &[(u64, u64)],
    snapshot: &Phase,
    separate: &Phase,
) -> u64 {
    if plan == LoadPlan::Forced {
        let failures: u64 = load.iter().map(|racer| racer.1).sum();
        let transfers: u64 = load.iter().map(|racer| racer.0).sum();
        ctx.note(format!(
            "load: {RACERS} racers, load_transfers_n={transfers}"
        ));
        ctx.check_eq("load transfers that failed", 0, failures);
        ctx.note(format!(
            "load transfers during the phases: snapshot_phase_n={} separate_phase_n={}",
            snapshot.load_during, separate.load_during
        ));
        ctx.check_eq(
            "rounds in which a load transfer also committed between the first two reads",
            2 * ROUNDS as u64,
            snapshot.rounds_overlapped + separate.rounds_overlapped,
        );
    }
    let forced_expected = if plan == LoadPlan::Forced { ROUNDS } else { 0 } as u64;
    ctx.check_eq(
        "forced debits committed between the first two reads of the rounds",
        2 * forced_expected,
        snapshot.forced_ok + separate.forced_ok,
    );

    ctx.note(format!(
        "L11, one REPEATABLE READ snapshot: {} of {ROUNDS} rounds with findings",
        snapshot.rounds_with_findings
    ));
    ctx.check_eq(
        "L11's rounds with a finding",
        0,
        snapshot.rounds_with_findings,
    );
    ctx.note(format!(
        "separate READ COMMITTED statements: {} of {ROUNDS} rounds with findings, \
         {} with acct-0010 one point apart, false_findings_n={}",
        separate.rounds_with_findings, separate.forced_account_mismatches, separate.findings
    ));
    if let Some(first) = &separate.first_forced {
        ctx.note(format!("first round: {FORCED_ACCOUNT} {first}"));
    }
    forced_expected
}

/// Once the writes stop, both reconcilers agree that the ledger is consistent: checks
/// that, the forced account's balance (`forced_expected` debits per phase), and the
/// negative control's verdict from the `separate` phase.
async fn check_quiet_ledger(
    ctx: &mut Ctx,
    reconciler: &mut Client,
    naive: &Client,
    separate: &Phase,
    forced_expected: u64,
) -> anyhow::Result<()> {
    let quiet = reconcile(reconciler).await?;
    ctx.check(
        "after the load: L11 finds nothing",
        quiet.is_clean(),
        quiet.summary(),
    );
    let quiet_naive = naive_reconcile(naive, |_| std::future::ready(())).await?;
    ctx.check(
        "after the load: the separate statements find nothing either",
        quiet_naive.is_clean(),
        quiet_naive.summary(),
    );
    ctx.check_eq(
        "acct-0010 after the forced debits",
        FORCED_START - 2 * forced_expected as i64 * FORCED_DEBIT,
        queries::existing_balance(reconciler, FORCED_ACCOUNT).await?,
    );

    ctx.exposes(
        ANOMALY,
        separate.rounds_with_findings >= 1 && quiet.is_clean() && quiet_naive.is_clean(),
        format!(
            "rounds_with_findings={} of {ROUNDS} forced_account_mismatches={}",
            separate.rounds_with_findings, separate.forced_account_mismatches
        ),
    );
    Ok(())
}

/// A racer: grants 5, then debits 5, on its account, until `stop` (or
/// [`LOAD_LIMIT_MS`]); returns (transfers committed OK, transfers that failed).
async fn write_load(
    mode: TransferMode,
    mut racer: case_kit::Racer,
    stop: &AtomicBool,
    committed: &AtomicU64,
) -> (u64, u64) {
    let account = points_ledger::test_account(racer.index as u32 % LOAD_ACCOUNTS + 1);
    let deadline = Instant::now() + Duration::from_millis(LOAD_LIMIT_MS);
    let (mut ok, mut failed) = (0u64, 0u64);
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        n += 1;
        let key = format!("l20-{}-{n}", racer.index);
        for result in [
            grant_in(
                mode,
                &mut racer.client,
                "load",
                &format!("g-{key}"),
                &account,
                LOAD_AMOUNT,
            )
            .await,
            debit_in(
                mode,
                &mut racer.client,
                "load",
                &format!("d-{key}"),
                &account,
                LOAD_AMOUNT,
            )
            .await,
        ] {
            match result {
                Ok(result) if result.outcome == points_ledger::Outcome::Ok => {
                    ok += 1;
                    committed.fetch_add(1, Ordering::SeqCst);
                }
                _ => failed += 1,
            }
        }
    }
    (ok, failed)
}

/// Waits for the load to start, then runs [`ROUNDS`] rounds of L11's reconciliation
/// and [`ROUNDS`] of the naive one, each with the forced debit after its first read.
async fn reconcile_phases(
    mode: TransferMode,
    plan: LoadPlan,
    reconciler: &mut Client,
    writer: &Mutex<Client>,
    naive: &Client,
    committed: &AtomicU64,
) -> anyhow::Result<(Phase, Phase)> {
    if plan == LoadPlan::Forced {
        let deadline = Instant::now() + Duration::from_millis(LOAD_START_LIMIT_MS);
        while committed.load(Ordering::SeqCst) < RACERS as u64 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }
    let forcing = Forcing {
        mode,
        plan,
        writer,
        forced_ok: AtomicU64::new(0),
        committed,
        overlapped: AtomicU64::new(0),
    };
    let mut snapshot = Phase::default();
    let before = committed.load(Ordering::SeqCst);
    for round in 0..ROUNDS {
        let findings = reconcile_with(reconciler, |n| forcing.pause(n, 1, "rr", round)).await?;
        tally(&mut snapshot, &findings);
    }
    snapshot.load_during = committed.load(Ordering::SeqCst) - before;
    snapshot.forced_ok = forcing.forced_ok.swap(0, Ordering::SeqCst);
    snapshot.rounds_overlapped = forcing.overlapped.swap(0, Ordering::SeqCst);

    let mut separate = Phase::default();
    let before = committed.load(Ordering::SeqCst);
    for round in 0..ROUNDS {
        let findings =
            naive_reconcile(naive, |n| forcing.pause(n, BALANCES_READ, "rc", round)).await?;
        tally(&mut separate, &findings);
    }
    separate.load_during = committed.load(Ordering::SeqCst) - before;
    separate.forced_ok = forcing.forced_ok.swap(0, Ordering::SeqCst);
    separate.rounds_overlapped = forcing.overlapped.swap(0, Ordering::SeqCst);
    Ok((snapshot, separate))
}

/// What the forced pauses of one run share.
struct Forcing<'a> {
    plan: LoadPlan,
    /// The case's transfer mode (its forced debits run in it).
    mode: TransferMode,
    /// The connection of the forced debits.
    writer: &'a Mutex<Client>,
    /// Forced debits that committed OK.
    forced_ok: AtomicU64,
    /// Load transfers committed so far (written by the racers).
    committed: &'a AtomicU64,
    /// Rounds in which a load transfer committed during the pause.
    overlapped: AtomicU64,
}

impl Forcing<'_> {
    /// The pause after read `n`: at read `at`, under [`LoadPlan::Forced`], commits a
    /// debit of [`FORCED_DEBIT`] from [`FORCED_ACCOUNT`] (key `f-<label>-<round>`), then
    /// waits (at most [`LOAD_START_LIMIT_MS`]) until the load has committed one more
    /// transfer, and counts the round in `overlapped` if it did.
    async fn pause(&self, n: usize, at: usize, label: &str, round: usize) {
        if self.plan != LoadPlan::Forced || n != at {
            return;
        }
        let load_before = self.committed.load(Ordering::SeqCst);
        let mut writer = self.writer.lock().await;
        let key = format!("f-{label}-{round}");
        if let Ok(result) = debit_in(
            self.mode,
            &mut writer,
            "forced",
            &key,
            FORCED_ACCOUNT,
            FORCED_DEBIT,
        )
        .await
            && result.outcome == points_ledger::Outcome::Ok
        {
            self.forced_ok.fetch_add(1, Ordering::SeqCst);
        }
        // And at least one of the load's transfers, so every round overlaps the load.
        let deadline = Instant::now() + Duration::from_millis(LOAD_START_LIMIT_MS);
        while self.committed.load(Ordering::SeqCst) == load_before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        if self.committed.load(Ordering::SeqCst) > load_before {
            self.overlapped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn tally(phase: &mut Phase, findings: &Findings) {
    if !findings.is_clean() {
        phase.rounds_with_findings += 1;
    }
    phase.findings += findings.count();
    if let Some(mismatch) = findings
        .balance_mismatches
        .iter()
        .find(|m| m.account_id == FORCED_ACCOUNT && m.stored - m.recomputed == FORCED_DEBIT)
    {
        phase.forced_account_mismatches += 1;
        phase.first_forced.get_or_insert_with(|| {
            format!(
                "stored={} recomputed={}",
                mismatch.stored, mismatch.recomputed
            )
        });
    }
}
