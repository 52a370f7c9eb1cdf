//! Reconciliation under a write load as spec steps (L20): writers that loop while the
//! reconciliation's rounds run, and the rounds, each with a debit forced between its
//! first and second read.
//!
//! - `load-writer account=ID amount=N key=PREFIX` (a `race call:`): waits until the
//!   case's rounds say whether to write (`reconcile-rounds`' `writes=`), then grants N
//!   and debits N on the account (client `load`, keys `g-PREFIX-k` and `d-PREFIX-k`), in
//!   the case's transfer mode, until the rounds end (at most [`LOAD_LIMIT_MS`], a hang
//!   bound). Prints `outcome=OK` when every transfer committed OK, else `outcome=FAILED
//!   failed=N`; the number of transfers varies and is not printed.
//! - `reconcile-rounds rounds=N forced=ACCOUNT amount=N writes=forced|none [warm-up=N]`
//!   (a `race alongside:`): with `writes=forced` it lets the writers go, waits until they
//!   have committed `warm-up` transfers, then runs N rounds of L11's reconciliation
//!   (`points_ledger::reconcile_with`, one REPEATABLE READ snapshot), then N rounds of the
//!   same checks as separate READ COMMITTED statements
//!   (`points_ledger::naive::reconcile::naive_reconcile`); after each round's first read
//!   (the stored balances) it commits a debit of `amount` from ACCOUNT (client `forced`,
//!   key `f-rr-<round>` / `f-rc-<round>`) on a connection of its own and waits until the
//!   writers commit one more transfer (bounded by [`STEP_LIMIT_MS`]), so every round
//!   overlaps the writes. With `writes=none` the writers stop at once and nothing is
//!   forced: nothing changes between two reads (the negative control's test). Each round
//!   is kept in the case's table `reconcile_round` (phase `snapshot` or `separate`,
//!   round, findings, whether ACCOUNT was found stored `amount` above its entries,
//!   whether the forced debit committed OK, whether a load transfer committed in the
//!   pause), for `rows:` and `exposes:`; then the writers are told to stop. Prints each
//!   phase's totals (`snapshot: rounds=20 with_findings=0 forced_mismatches=0
//!   forced_ok=20 overlapped=20 load_during_n=…`) and the separate phase's first
//!   mismatch of ACCOUNT, ` | ` between them (a `race alongside:` is noted on one line).
//! - `naive-reconcile`: the separate statements once, on the session's connection:
//!   `clean=true balance_mismatches=0 …`.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use case_kit::spec::Call;
use points_ledger::naive::reconcile::{BALANCES_READ, naive_reconcile};
use points_ledger::{Findings, Outcome, TransferMode, TransferRequest, reconcile_with};
use tokio_postgres::{Client, NoTls};

/// A writer stops after this long even if the rounds never end, milliseconds.
pub const LOAD_LIMIT_MS: u64 = 60_000;
/// Longest wait for the writers' warm-up, for one more load transfer in a round's
/// pause, or for a writer to hear whether to write, milliseconds; hang bounds only.
pub const STEP_LIMIT_MS: u64 = 10_000;
/// How often those waits look, milliseconds.
const POLL_MS: u64 = 5;

/// The case's table of rounds, made by the first `reconcile-rounds`.
const ROUND_TABLE: &str = "CREATE TABLE IF NOT EXISTS reconcile_round (phase text, \
    round int, findings int, forced_mismatch boolean, forced_ok boolean, overlapped boolean)";

const UNDECIDED: u8 = 0;
const WRITE: u8 = 1;
const STOP: u8 = 2;

/// The write load of one case, shared by its writers and its rounds.
#[derive(Debug, Default)]
pub struct Load {
    /// [`UNDECIDED`], [`WRITE`] or [`STOP`].
    state: AtomicU8,
    /// Load transfers committed OK so far.
    committed: AtomicU64,
}

fn number(call: &Call, name: &str) -> u64 {
    call.arg(name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Polls `done` until it holds or [`STEP_LIMIT_MS`] passed; returns whether it held.
async fn until(done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_millis(STEP_LIMIT_MS);
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    true
}

impl Load {
    /// `load-writer` on the racer's connection `client` (see the module documentation).
    pub async fn write(&self, mode: TransferMode, client: &mut Client, call: &Call) -> String {
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        let amount = number(call, "amount") as i64;
        until(|| self.state.load(Ordering::SeqCst) != UNDECIDED).await;
        let deadline = Instant::now() + Duration::from_millis(LOAD_LIMIT_MS);
        let (mut n, mut failed) = (0u64, 0u64);
        while self.state.load(Ordering::SeqCst) == WRITE && Instant::now() < deadline {
            n += 1;
            let prefix = arg("key");
            for request in [
                TransferRequest::grant("load", format!("g-{prefix}-{n}"), arg("account"), amount),
                TransferRequest::debit("load", format!("d-{prefix}-{n}"), arg("account"), amount),
            ] {
                match points_ledger::transfer_in(mode, client, &request, &points_ledger::NoHooks)
                    .await
                {
                    Ok(result) if result.outcome == Outcome::Ok => {
                        self.committed.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => failed += 1,
                }
            }
        }
        match failed {
            0 => "outcome=OK".into(),
            n => format!("outcome=FAILED failed={n}"),
        }
    }

    /// `reconcile-rounds` on the alongside connection `client` (see the module
    /// documentation); the writers are told to stop whatever happens.
    ///
    /// Errors: a connection or a reconciliation query failed.
    pub async fn rounds(
        &self,
        mode: TransferMode,
        url: &str,
        client: &mut Client,
        call: &Call,
    ) -> Result<String, String> {
        let forcing = call.arg("writes") == Some("forced");
        self.state
            .store(if forcing { WRITE } else { STOP }, Ordering::SeqCst);
        let result = self.run_rounds(mode, url, client, call, forcing).await;
        self.state.store(STOP, Ordering::SeqCst);
        result
    }

    async fn run_rounds(
        &self,
        mode: TransferMode,
        url: &str,
        client: &mut Client,
        call: &Call,
        forcing: bool,
    ) -> Result<String, String> {
        let sql = |e: tokio_postgres::Error| e.to_string();
        let warm_up = number(call, "warm-up");
        if forcing {
            until(|| self.committed.load(Ordering::SeqCst) >= warm_up).await;
        }
        let (writer, connection) = tokio_postgres::connect(url, NoTls).await.map_err(sql)?;
        tokio::spawn(connection);
        let round = Round {
            load: self,
            mode,
            writer: tokio::sync::Mutex::new(writer),
            forced: call.arg("forced").unwrap_or_default().to_string(),
            amount: number(call, "amount") as i64,
            forcing,
            forced_ok: AtomicBool::new(false),
            overlapped: AtomicBool::new(false),
        };
        client.batch_execute(ROUND_TABLE).await.map_err(sql)?;
        let mut lines = Vec::new();
        let mut first = None;
        for phase in ["snapshot", "separate"] {
            let before = self.committed.load(Ordering::SeqCst);
            let mut totals = [0u64; 4];
            for n in 0..number(call, "rounds") {
                let label = if phase == "snapshot" { "rr" } else { "rc" };
                let key = format!("f-{label}-{n}");
                let findings = if phase == "snapshot" {
                    let found = reconcile_with(client, |read| round.pause(read, 1, &key));
                    found.await.map_err(|e| format!("{e:#}"))?
                } else {
                    let pause = |read| round.pause(read, BALANCES_READ, &key);
                    naive_reconcile(client, pause).await.map_err(sql)?
                };
                let mismatch = round.mismatch(&findings);
                if phase == "separate" && first.is_none() {
                    first.clone_from(&mismatch);
                }
                let row = round.record(&*client, phase, n, &findings, mismatch.is_some());
                let flags = row.await.map_err(sql)?;
                for (total, flag) in totals.iter_mut().zip(flags) {
                    *total += u64::from(flag);
                }
            }
            let during = self.committed.load(Ordering::SeqCst) - before;
            let [with, mismatches, ok, overlapped] = totals;
            lines.push(format!(
                "{phase}: rounds={} with_findings={with} forced_mismatches={mismatches} \
                 forced_ok={ok} overlapped={overlapped} load_during_n={during}",
                number(call, "rounds")
            ));
        }
        if let Some(first) = first {
            lines.push(format!("first separate mismatch: {first}"));
        }
        Ok(lines.join(" | "))
    }
}

/// What one round's pause shares with the round.
struct Round<'a> {
    load: &'a Load,
    mode: TransferMode,
    writer: tokio::sync::Mutex<Client>,
    forced: String,
    amount: i64,
    forcing: bool,
    forced_ok: AtomicBool,
    overlapped: AtomicBool,
}

impl Round<'_> {
    /// After read `read`: at read `at`, when forcing, the forced debit under `key`, then
    /// the wait for one more load transfer.
    async fn pause(&self, read: usize, at: usize, key: &str) {
        if !self.forcing || read != at {
            return;
        }
        let before = self.load.committed.load(Ordering::SeqCst);
        let request = TransferRequest::debit("forced", key, self.forced.clone(), self.amount);
        let mut writer = self.writer.lock().await;
        let result =
            points_ledger::transfer_in(self.mode, &mut writer, &request, &points_ledger::NoHooks);
        if matches!(result.await, Ok(r) if r.outcome == Outcome::Ok) {
            self.forced_ok.store(true, Ordering::SeqCst);
        }
        let more = until(|| self.load.committed.load(Ordering::SeqCst) > before).await;
        self.overlapped.store(more, Ordering::SeqCst);
    }

    /// The forced account's mismatch of exactly `amount` (stored above its entries), as
    /// `ACCOUNT stored=… recomputed=…`.
    fn mismatch(&self, findings: &Findings) -> Option<String> {
        let found = findings
            .balance_mismatches
            .iter()
            .find(|m| m.account_id == self.forced && m.stored - m.recomputed == self.amount)?;
        Some(format!(
            "{} stored={} recomputed={}",
            self.forced, found.stored, found.recomputed
        ))
    }

    /// Keeps the round in `reconcile_round` and returns its flags: with findings, the
    /// forced mismatch, the forced debit OK, overlapped (and clears the last two).
    async fn record(
        &self,
        client: &Client,
        phase: &str,
        round: u64,
        findings: &Findings,
        mismatch: bool,
    ) -> Result<[bool; 4], tokio_postgres::Error> {
        let ok = self.forced_ok.swap(false, Ordering::SeqCst);
        let overlapped = self.overlapped.swap(false, Ordering::SeqCst);
        let count = findings.count() as i32;
        client
            .execute(
                "INSERT INTO reconcile_round VALUES ($1, $2, $3, $4, $5, $6)",
                &[&phase, &(round as i32), &count, &mismatch, &ok, &overlapped],
            )
            .await?;
        Ok([count > 0, mismatch, ok, overlapped])
    }
}

/// `naive-reconcile` on the session's connection: `clean=… <summary>`.
///
/// Errors: a query failed.
pub async fn naive_once(client: &Client) -> Result<String, String> {
    let findings = naive_reconcile(client, |_| std::future::ready(()))
        .await
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "clean={} {}",
        findings.is_clean(),
        findings.summary()
    ))
}
