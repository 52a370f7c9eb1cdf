//! R3 — negative control, asynchronous standby: acknowledged debits lost at failover.
//! Claim (about asynchronous replication): with the standby's WAL receiver stopped
//! (SIGSTOP, so the standby's WAL is certainly behind — forced, not timed), debits the
//! primary acknowledged are gone after a kill -9 of the primary and the standby's
//! promotion; each is counted and named, the promoted ledger still reconciles clean
//! (each lost debit vanished whole, its key record with it), and a lost debit's same-key
//! retry executes as new (not replayed), because its idempotency record was lost too.
//!
//! The standby is killed with the primary and started again before its promotion, so
//! that what it holds is what its WAL receiver wrote to its disk: WAL that sat unread in
//! its socket when the receiver stopped would otherwise arrive once it runs again.
//!
//! Fails if: no acknowledged debit is lost (shown in a test: with the receiver running
//! and the standby caught up, none is), the lost ones are not exactly those acknowledged
//! after the stop, the ledger does not reconcile, or the retry replays.

use futures_util::FutureExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use points_ledger::{Outcome, debit_in, grant_in, reconcile};
use scratch_pg::Replication;

use crate::pair::{self, LEDGER_DATABASE};
use crate::wal;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "R3",
        "negative control, asynchronous standby: acknowledged debits lost at failover",
        |ctx| run_with(ctx, Receiver::Stopped).boxed(),
    )
    .not_clean()
}

/// The anomaly named by this control's `negative control exposes:` check.
pub const ANOMALY: &str = "acknowledged debits lost at failover";

/// What the standby's WAL receiver does while the debits are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receiver {
    /// Stopped with SIGSTOP: the fault the control shows.
    Stopped,
    /// Left running, and the standby caught up before the kill: nothing can be lost.
    Running,
}

const CLIENT: &str = "app-r3";
const ACCOUNT: &str = "acct-0003";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 10;
/// Debits acknowledged before the receiver stops, and after.
const DEBITS_BEFORE: usize = 2;
const DEBITS_AFTER: usize = 3;

/// R3 with the receiver `receiver`: [`Receiver::Stopped`] in a run.
///
/// Errors: a node did not start or promote; SQL errors outside the counted debits.
// Long: the control's story in order, its fault step (`receiver`/`replay`) in the middle
// of it, so a reader sees where the fault lands.
pub async fn run_with(ctx: &mut Ctx, receiver: Receiver) -> anyhow::Result<()> {
    let mode = cases_ledger::modes::mode(ctx);
    let pair = pair::start_pair(ctx, Replication::Asynchronous).await?;
    let mut primary = pair.primary.connect(LEDGER_DATABASE).await?;
    grant_in(mode, &mut primary, "ops", "g-r3", ACCOUNT, START_BALANCE).await?;
    let mut acknowledged = Vec::new();
    for n in 1..=DEBITS_BEFORE {
        let key = format!("k-r3-before-{n}");
        debit_in(mode, &mut primary, CLIENT, &key, ACCOUNT, DEBIT).await?;
        acknowledged.push(key);
    }
    wal::wait_replayed(&pair.primary, &pair.standby).await?;
    if receiver == Receiver::Stopped {
        let pid = pair.standby.wal_receiver_pid().await?;
        kill(Pid::from_raw(pid), Signal::SIGSTOP)?;
        ctx.note("standby's WAL receiver stopped (SIGSTOP) after the first debits replayed");
    }
    let mut after = Vec::new();
    for n in 1..=DEBITS_AFTER {
        let key = format!("k-r3-after-{n}");
        let result = debit_in(mode, &mut primary, CLIENT, &key, ACCOUNT, DEBIT).await?;
        anyhow::ensure!(result.outcome == Outcome::Ok, "debit {key}: {result:?}");
        after.push(key);
    }
    if receiver == Receiver::Running {
        wal::wait_replayed(&pair.primary, &pair.standby).await?;
    }
    let last_flushed = wal::flushed(&pair.primary).await?;
    let all_received = wal::received_up_to(&pair.standby, &last_flushed).await?;
    if receiver == Receiver::Stopped {
        ctx.check(
            "forced: the last debits' WAL is not on the standby's disk before the kill",
            !all_received,
            format!("standby received up to the primary's flush position: {all_received}"),
        );
    }
    acknowledged.extend(after.iter().cloned());
    drop(primary);
    let _old = pair::kill_node(pair.primary).await?;
    let standby = pair::kill_node(pair.standby).await?;
    let standby = pair::start_again(standby).await?;
    standby.promote().await?;
    ctx.note("primary and standby killed (kill -9), standby started again and promoted");
    let mut promoted = standby.connect(LEDGER_DATABASE).await?;
    let lost = lost_keys(&promoted, &acknowledged).await?;
    ctx.note(format!(
        "acknowledged={} lost={}",
        acknowledged.len(),
        lost.len()
    ));
    ctx.exposes(
        ANOMALY,
        !lost.is_empty(),
        format!("lost: {}", lost.join(" ")),
    );
    ctx.check_eq(
        "lost debits are exactly those acknowledged after the receiver stopped",
        after.join(" "),
        lost.join(" "),
    );
    let findings = reconcile(&mut promoted).await?;
    ctx.check(
        "promoted ledger reconciles clean",
        findings.is_clean(),
        findings.summary(),
    );
    if let Some(key) = lost.first() {
        let retry = debit_in(mode, &mut promoted, CLIENT, key, ACCOUNT, DEBIT).await?;
        ctx.check(
            "a lost debit's same-key retry executes as new (its key record was lost with it)",
            retry.outcome == Outcome::Ok && !retry.replayed,
            format!(
                "{key}: outcome={:?} replayed={}",
                retry.outcome, retry.replayed
            ),
        );
    }
    Ok(())
}

/// The keys among `keys` with no `ledger_txn` on `node`, in the given order.
async fn lost_keys(node: &tokio_postgres::Client, keys: &[String]) -> anyhow::Result<Vec<String>> {
    let rows = node
        .query(
            "SELECT idem_key FROM ledger_txn WHERE client_id = $1",
            &[&CLIENT],
        )
        .await?;
    let present: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    Ok(keys
        .iter()
        .filter(|key| !present.contains(key))
        .cloned()
        .collect())
}
