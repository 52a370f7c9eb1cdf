//! L15 — `synchronous_commit=off`, measured: acknowledged debits lost in a database crash.
//! Claim: with `synchronous_commit=on` every debit answered OK survives an immediate stop
//! (no checkpoint) and WAL recovery; with it `off` (set on this case's own sessions only,
//! SPEC §5) the debits answered OK inside the WAL writer's window are gone after the
//! same crash, the ledger still reconciles clean (each lost debit vanished whole, key
//! registration included), and a same-key retry of a lost debit executes again as if new
//! (not replayed) — the client cannot tell. PostgreSQL docs 30.4 "Asynchronous Commit":
//! the commit returns before its WAL is flushed; docs 20.5.1 "Settings":
//! `wal_writer_delay` is how long the WAL writer sleeps between rounds.
//!
//! The window is made certain: the case sets `wal_writer_delay = 10s` (its maximum) with
//! `ALTER SYSTEM` before its first restart, so a freshly started WAL writer next wakes 10 s
//! after it starts; the asynchronous debits and the second crash come right after its
//! start (how long after, on the server's clock from `pg_stat_activity.backend_start`, is
//! a note and the run record, not a verdict; a CHECKPOINT first keeps recovery short),
//! no other commit runs meanwhile (the case is Exclusive and
//! commits nothing synchronously after them), they start on a fresh WAL segment
//! (`pg_switch_wal`) and their WAL fits on one WAL page (checked: PostgreSQL wakes the WAL
//! writer early only for a completed page or out of hibernation; `XLogSetAsyncXactLSN` in
//! PostgreSQL's `src/backend/access/transam/xlog.c`), and just before the crash the
//! server's WAL write position is checked to lie before the first asynchronous debit: none
//! of their WAL has left PostgreSQL's shared memory, so an immediate stop cannot keep them.
//! The setting is reset (`ALTER SYSTEM RESET`, reload) before the case ends, also on
//! failure.
//!
//! Fails if: an acknowledged debit is lost with `on`; none is lost with `off`; any of the
//! asynchronous debits' WAL was written before the crash or did not fit on one page; the
//! ledger does not reconcile; the retry replays; or the server setting is not restored.

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use points_ledger::{debit_in, grant_in, reconcile};
use tokio_postgres::Client;

use super::queries;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L15",
        "synchronous_commit=off measured: acknowledged debits lost in a crash",
        |ctx| run(ctx).boxed(),
    )
    // It restarts the cluster and changes a server setting for the time it runs
    // (Exclusive).
    .restarts_server(
        "changes a server setting with ALTER SYSTEM and crashes the server (immediate stop) twice to count lost commits",
    )
    .connections(4)
}

const CLIENT: &str = "app-l15";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 10;
/// Debits acknowledged under each setting.
const DEBITS: usize = 3;
/// The account of the `on` half and of the `off` half.
const ON_ACCOUNT: &str = "acct-0001";
const OFF_ACCOUNT: &str = "acct-0002";
/// `wal_writer_delay` while the case runs, milliseconds (the server's maximum, 10 s).
pub const WAL_WRITER_DELAY_MS: u64 = 10_000;
/// The asynchronous debits and the crash are expected within this much of the WAL
/// writer's start (`pg_stat_activity.backend_start`), milliseconds: well inside
/// [`WAL_WRITER_DELAY_MS`]. Recorded (`wal_writer_window` in the run record), not checked:
/// a clock reading decides nothing; the WAL write position checked just before the crash
/// and the count of lost debits do.
pub const WINDOW_BUDGET_MS: u64 = 8_000;
/// Longest time spent waiting for a reloaded setting to show in a new session, milliseconds
/// (a hang bound only).
const RELOAD_LIMIT_MS: u64 = 15_000;
/// Pause between those looks, milliseconds.
const RELOAD_PAUSE_MS: u64 = 50;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let admin = ctx.connect().await?;
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET wal_writer_delay = '{WAL_WRITER_DELAY_MS}ms'"
        ))
        .await?;
    ctx.note(format!(
        "server setting for this case: wal_writer_delay = {WAL_WRITER_DELAY_MS} ms (ALTER SYSTEM, \
         in effect from the next start; reset at the end)"
    ));
    let measured = measure(ctx).await;
    let restored = restore(ctx).await;
    measured?;
    let delay = restored?;
    ctx.check_eq(
        "wal_writer_delay restored to its default",
        "200ms".to_string(),
        delay,
    );
    Ok(())
}

/// The two halves; the caller restores the server setting whatever happens here.
async fn measure(ctx: &mut Ctx) -> anyhow::Result<()> {
    let mode = super::modes::mode(ctx);
    let (on, mut after) = measure_on(ctx, mode).await?;
    let mut off = open_async_session(ctx, mode, &mut after).await?;
    let (first_async_start, off_acknowledged) =
        async_debits_on_one_page(ctx, mode, &after, &mut off).await?;
    look_before_crash(ctx, &off, &first_async_start).await?;
    ctx.restart_cluster_immediate().await?;
    let mut recovered = case_kit::spec::reconnect(ctx).await?;
    check_off_recovery(ctx, &mut recovered, &on, off_acknowledged).await?;
    retry_lost_debit(ctx, mode, &mut recovered).await
}

/// Acknowledged and lost debits of the `on` half.
struct Tally {
    acknowledged: usize,
    lost: usize,
}

/// Half 1: [`DEBITS`] debits with `synchronous_commit = on`, an immediate stop, and the
/// checks after recovery (none lost). Returns the half's tally and a connection opened
/// after the restart.
async fn measure_on(
    ctx: &mut Ctx,
    mode: points_ledger::TransferMode,
) -> anyhow::Result<(Tally, Client)> {
    // Half 1: synchronous_commit = on (the server's setting, SPEC §5).
    let mut on = ctx.connect().await?;
    // What the run did so far need not be replayed by the recoveries below.
    on.batch_execute("CHECKPOINT").await?;
    ctx.check_eq(
        "synchronous_commit of an ordinary session",
        "on".to_string(),
        setting(&on, "synchronous_commit").await?,
    );
    grant_in(mode, &mut on, "ops", "g-1501", ON_ACCOUNT, START_BALANCE).await?;
    let on_acknowledged = acknowledged_debits(mode, &mut on, "k-15-on", ON_ACCOUNT).await?;
    let flushed: bool = on
        .query_one(
            "SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()",
            &[],
        )
        .await?
        .get(0);
    ctx.check(
        "on: every acknowledged debit's WAL was flushed before the crash",
        flushed,
        format!("flushed={flushed}"),
    );
    ctx.restart_cluster_immediate().await?;
    let after = case_kit::spec::reconnect(ctx).await?;
    let on_lost = lost_debits(&after, "k-15-on").await?;
    ctx.note(format!(
        "synchronous_commit=on:  acknowledged={on_acknowledged} lost={on_lost}"
    ));
    ctx.check_eq("on: acknowledged debits lost", 0, on_lost);
    ctx.check_eq(
        "on: balance after recovery",
        START_BALANCE - DEBIT * DEBITS as i64,
        queries::existing_balance(&after, ON_ACCOUNT).await?,
    );
    ctx.check_eq(
        "wal_writer_delay after the restart",
        format!("{}s", WAL_WRITER_DELAY_MS / 1000),
        setting(&after, "wal_writer_delay").await?,
    );
    let on = Tally {
        acknowledged: on_acknowledged,
        lost: on_lost,
    };
    Ok((on, after))
}

/// Half 2's start, on `after` (a session opened right after the restart): the grant and
/// the warm-up debit, committed synchronously; then a new session with `synchronous_commit
/// = off`, returned.
async fn open_async_session(
    ctx: &mut Ctx,
    mode: points_ledger::TransferMode,
    after: &mut Client,
) -> anyhow::Result<Client> {
    // Half 2: synchronous_commit = off on this session only, right after the start of
    // the WAL writer (its next round is WAL_WRITER_DELAY_MS away). The grant and one
    // warm-up debit commit synchronously first: they flush the full-page images that
    // follow the end-of-recovery checkpoint, so the asynchronous debits write only
    // small records.
    grant_in(mode, after, "ops", "g-1502", OFF_ACCOUNT, START_BALANCE).await?;
    debit_in(mode, after, CLIENT, "k-15-warm", OFF_ACCOUNT, DEBIT).await?;
    let off = ctx.connect().await?;
    off.batch_execute("SET synchronous_commit = off").await?;
    ctx.note("synchronous_commit = off set on the case's own session only (SPEC §5)");
    ctx.check_eq(
        "synchronous_commit of the asynchronous session",
        "off".to_string(),
        setting(&off, "synchronous_commit").await?,
    );
    Ok(off)
}

/// Switches to a new WAL segment, runs the asynchronous debits on `off` and checks that
/// their WAL lies on one WAL page. Returns the insert position before the first of them
/// (an LSN as text) and how many were answered OK.
async fn async_debits_on_one_page(
    ctx: &mut Ctx,
    mode: points_ledger::TransferMode,
    after: &Client,
    off: &mut Client,
) -> anyhow::Result<(String, usize)> {
    // A new WAL segment (pg_switch_wal flushes the old one): the asynchronous debits
    // start at the beginning of a WAL page and, being small, end on that same page, so
    // no page is completed and the WAL writer is not woken to write one
    // (PostgreSQL wakes it early for a full page only).
    after.query_one("SELECT pg_switch_wal()", &[]).await?;
    let first_async_start = insert_lsn(off).await?;
    let off_acknowledged = acknowledged_debits(mode, off, "k-15-off", OFF_ACCOUNT).await?;
    let last_async_end = insert_lsn(off).await?;
    let one_page: bool = off
        .query_one(
            "SELECT floor(pg_wal_lsn_diff($1::text::pg_lsn, '0/0') / current_setting('wal_block_size')::numeric) \
                  = floor(pg_wal_lsn_diff($2::text::pg_lsn, '0/0') / current_setting('wal_block_size')::numeric)",
            &[&first_async_start, &last_async_end],
        )
        .await?
        .get(0);
    ctx.check(
        "off: the asynchronous debits' WAL lies on one WAL page (no full page for the WAL writer)",
        one_page,
        format!("one_page={one_page}"),
    );
    Ok((first_async_start, off_acknowledged))
}

/// The last look before the crash: checks that the server's WAL write position still lies
/// at or before `first_async_start`, and notes and records how long after the WAL writer's
/// start that was (`wal_writer_window`).
async fn look_before_crash(
    ctx: &mut Ctx,
    off: &Client,
    first_async_start: &str,
) -> anyhow::Result<()> {
    // The last look before the crash: how far PostgreSQL has handed WAL to the
    // operating system (`pg_current_wal_lsn`, the write position; docs 9.27.3).
    let unwritten: bool = off
        .query_one(
            "SELECT pg_current_wal_lsn() <= $1::text::pg_lsn",
            &[&first_async_start],
        )
        .await?
        .get(0);
    // The WAL writer starts after the postmaster (once recovery is done), so its first
    // timed round comes at least WAL_WRITER_DELAY_MS after the postmaster's start time.
    // The WAL writer's first round is at its start (pg_stat_activity's backend_start);
    // its next timed round comes WAL_WRITER_DELAY_MS later.
    let since_start_ms: i64 = off
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp() - backend_start) * 1000)::bigint \
             FROM pg_stat_activity WHERE backend_type = 'walwriter'",
            &[],
        )
        .await?
        .get(0);
    let in_window = since_start_ms < WINDOW_BUDGET_MS as i64;
    ctx.note(format!(
        "off: since_wal_writer_start_ms={since_start_ms} at the last look"
    ));
    ctx.check(
        "off: none of the asynchronous debits' WAL was written when the server stopped",
        unwritten,
        format!("unwritten={unwritten}"),
    );
    ctx.record(
        "wal_writer_window",
        serde_json::json!({
            "since_wal_writer_start_ms": since_start_ms,
            "budget_ms": WINDOW_BUDGET_MS,
            "in_window": in_window,
        }),
    );
    Ok(())
}

/// After the second crash: checks that every asynchronous debit answered OK is lost, that
/// the balance agrees and that the ledger reconciles clean; records both halves' tallies.
async fn check_off_recovery(
    ctx: &mut Ctx,
    recovered: &mut Client,
    on: &Tally,
    off_acknowledged: usize,
) -> anyhow::Result<()> {
    let off_lost = lost_debits(recovered, "k-15-off").await?;
    ctx.note(format!(
        "synchronous_commit=off: acknowledged={off_acknowledged} lost={off_lost}"
    ));
    ctx.check_eq(
        "off: acknowledged debits lost in the crash (all of them: none had left memory)",
        off_acknowledged,
        off_lost,
    );
    ctx.record(
        "acknowledged_and_lost",
        serde_json::json!({
            "on": {"acknowledged": on.acknowledged, "lost": on.lost},
            "off": {"acknowledged": off_acknowledged, "lost": off_lost},
        }),
    );
    let balance = queries::existing_balance(recovered, OFF_ACCOUNT).await?;
    ctx.check_eq(
        "off: balance after recovery = 100 - warm-up - kept debits",
        START_BALANCE - DEBIT * (1 + off_acknowledged - off_lost) as i64,
        balance,
    );
    let findings = reconcile(recovered).await?;
    ctx.check(
        "off: the ledger reconciles clean (a lost debit vanished whole)",
        findings.is_clean(),
        findings.summary(),
    );
    Ok(())
}

/// The client that got 201 for a lost debit retries it with the same key: checks that it
/// executes again as if new (not replayed), once.
async fn retry_lost_debit(
    ctx: &mut Ctx,
    mode: points_ledger::TransferMode,
    recovered: &mut Client,
) -> anyhow::Result<()> {
    let lost_key = format!("k-15-off-{}", DEBITS - 1);
    let retry = debit_in(mode, recovered, CLIENT, &lost_key, OFF_ACCOUNT, DEBIT).await?;
    ctx.note(format!(
        "same-key retry of {lost_key}: outcome={} replayed={} balance={}",
        retry.outcome, retry.replayed, retry.balance
    ));
    ctx.check_eq(
        "off: the retry executes again as if new (not replayed)",
        false,
        retry.replayed,
    );
    ctx.check_eq(
        "off: transactions for the retried key",
        1,
        queries::txns_for_key(recovered, CLIENT, &lost_key).await?,
    );
    Ok(())
}

/// [`DEBITS`] debits of [`DEBIT`] from `account` on `client`, keys `<prefix>-<n>`; returns
/// how many were answered OK.
async fn acknowledged_debits(
    mode: points_ledger::TransferMode,
    client: &mut Client,
    prefix: &str,
    account: &str,
) -> anyhow::Result<usize> {
    let mut acknowledged = 0;
    for n in 0..DEBITS {
        let result = debit_in(
            mode,
            client,
            CLIENT,
            &format!("{prefix}-{n}"),
            account,
            DEBIT,
        )
        .await?;
        if result.outcome == points_ledger::Outcome::Ok {
            acknowledged += 1;
        }
    }
    Ok(acknowledged)
}

/// How many of the [`DEBITS`] keys `<prefix>-<n>` have no transaction after recovery.
async fn lost_debits(client: &Client, prefix: &str) -> anyhow::Result<usize> {
    let mut lost = 0;
    for n in 0..DEBITS {
        if queries::txns_for_key(client, CLIENT, &format!("{prefix}-{n}")).await? == 0 {
            lost += 1;
        }
    }
    Ok(lost)
}

async fn setting(client: &Client, name: &str) -> anyhow::Result<String> {
    Ok(client
        .query_one("SELECT current_setting($1)", &[&name])
        .await?
        .get(0))
}

async fn insert_lsn(client: &Client) -> anyhow::Result<String> {
    Ok(client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0))
}

/// Resets `wal_writer_delay` and reloads; returns the value a new session then sees.
async fn restore(ctx: &Ctx) -> anyhow::Result<String> {
    let client = case_kit::spec::reconnect(ctx).await?;
    client
        .batch_execute("ALTER SYSTEM RESET wal_writer_delay")
        .await?;
    client.query_one("SELECT pg_reload_conf()", &[]).await?;
    // The postmaster rereads the file on the signal; a session started after that sees
    // the new value.
    let deadline = Instant::now() + Duration::from_millis(RELOAD_LIMIT_MS);
    loop {
        let fresh = ctx.connect().await?;
        let value = setting(&fresh, "wal_writer_delay").await?;
        if value == "200ms" || Instant::now() > deadline {
            return Ok(value);
        }
        tokio::time::sleep(Duration::from_millis(RELOAD_PAUSE_MS)).await;
    }
}
