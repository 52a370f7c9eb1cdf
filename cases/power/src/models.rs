//! The P cases under the persistence models (P13–P18): each runs a seeded set of cuts
//! (`./run.sh --cuts N`, 5 by default), each cut on a fresh disk of its own mounted
//! with the case's model (`forgetful_fs::Persistence`) and a seed of its own derived
//! from the run's seed, the case's id and the cut's number (so `--seed` replays every
//! cut's choices; which blocks are dirty at a cut still depends on the system's
//! timing). Every cut is taken the same way: the system's acknowledged work done, then
//! the disk's syncs held (`PowerDisk::hold_syncs`) while one more commit is under way,
//! so that a commit is certainly between its write and its sync (seen held, counted),
//! then the disk frozen (the moment the power goes), every process SIGKILLed, the cut.
//!
//! The transcript gives the totals over the cuts (counts end in `_n`: they vary with
//! `--cuts`); each cut's seed and outcome are in the run record (`cuts`) and, for a
//! cut that breaks a claim, in a note.

use std::path::{Path, PathBuf};
use std::time::Duration;

use case_kit::Ctx;
use forgetful_fs::{DropReport, Model, Names, Persistence};
use launch::power::{Cuts, PowerCluster, PowerDisk};
use launch::worker::CrashWorker;

use crate::ledger::{self, RunningLoad};

/// The inventory file of the SQLite cuts.
const FILE: &str = "inventory.db";
/// Changes acknowledged before the held one.
pub const CHANGES: usize = 10;
/// Longest wait for one line of a worker, or for a sync to be held, milliseconds (a
/// hang bound only).
const WAIT_MS: u64 = 30_000;
/// Clients of a PostgreSQL cut's load.
const PG_CLIENTS: usize = 16;
/// Debits acknowledged before the checkpoint under load, and before the cut.
const PG_ACKS: (usize, usize) = (24, 48);

/// What is cut.
#[derive(Debug, Clone, Copy)]
pub enum System {
    /// A PostgreSQL cluster running the ledger under a debit load, `fsync` as given.
    Postgres {
        /// `fsync=on` or `off`.
        fsync: bool,
    },
    /// The SQLite inventory applying changes through crash-workers.
    Sqlite {
        /// `wal` or `delete`.
        journal_mode: &'static str,
        /// `full`, `off`, …
        synchronous: &'static str,
    },
}

impl System {
    /// `postgres fsync=on`, `sqlite journal_mode=wal synchronous=full`.
    pub fn describe(&self) -> String {
        match self {
            System::Postgres { fsync } => {
                format!("postgres fsync={}", if *fsync { "on" } else { "off" })
            }
            System::Sqlite {
                journal_mode,
                synchronous,
            } => format!("sqlite journal_mode={journal_mode} synchronous={synchronous}"),
        }
    }
}

/// One cut's outcome.
#[derive(Debug, Default, Clone)]
pub struct CutOutcome {
    /// The cut's seed (the disk's `Persistence::seed`).
    pub seed: u64,
    /// Changes (or debits) acknowledged before the cut.
    pub acknowledged: usize,
    /// Acknowledged ones missing after recovery.
    pub lost: usize,
    /// What recovery or the checks found broken: recovery failed, an integrity or
    /// amcheck failure, a reconciliation finding, a key twice.
    pub damage: Vec<String>,
    /// What the disk dropped.
    pub dropped: DropReport,
}

impl CutOutcome {
    fn record(&self) -> serde_json::Value {
        serde_json::json!({
            "seed": self.seed,
            "acknowledged": self.acknowledged,
            "lost": self.lost,
            "damage": self.damage,
            "syncs_held": self.dropped.syncs_held,
            "unsynced_bytes": self.dropped.bytes,
            "blocks_kept": self.dropped.blocks_kept,
            "blocks_lost": self.dropped.blocks_lost,
            "blocks_torn": self.dropped.blocks_torn,
            "blocks_garbled": self.dropped.blocks_garbled,
            "name_operations": self.dropped.name_operations,
        })
    }

    /// `seed=… acknowledged=… lost=… held=… damage: …` for a note.
    pub fn line(&self, index: usize) -> String {
        format!(
            "cut {} seed={}: acknowledged={} lost={} syncs_held={} {}; {}",
            index + 1,
            self.seed,
            self.acknowledged,
            self.lost,
            self.dropped.syncs_held,
            self.dropped.model_words(),
            if self.damage.is_empty() {
                "no damage found".to_string()
            } else {
                self.damage.join("; ")
            }
        )
    }
}

/// The cuts of a run of one case: how many, and each one's seed.
pub fn cut_seeds(ctx: &Ctx) -> Vec<u64> {
    let cuts = ctx.choice::<Cuts>().map_or(Cuts::DEFAULT, |cuts| cuts.0);
    let mut state = ctx.seed();
    for byte in ctx.case_id().bytes() {
        state = splitmix(state ^ u64::from(byte));
    }
    (0..cuts)
        .map(|_| {
            state = splitmix(state);
            state
        })
        .collect()
}

fn splitmix(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs every cut of the case on `system` under `model` and `names`; returns the
/// outcomes (also in the run record, `cuts`). A cut whose system could not be set up
/// is an error of the case.
///
/// Errors: the disk, the cluster, a worker or SQL fail outside what a cut checks.
pub async fn run_cuts(
    ctx: &mut Ctx,
    system: System,
    model: Model,
    names: Names,
) -> anyhow::Result<Vec<CutOutcome>> {
    let seeds = cut_seeds(ctx);
    let first = Persistence {
        model,
        names,
        seed: 0,
        force_garble: model == Model::Garble,
    };
    let syncs = match system {
        System::Postgres { fsync } => fsync,
        System::Sqlite { synchronous, .. } => synchronous != "off",
    };
    ctx.note(format!(
        "{}; disk {first}; cuts_n={} each on a fresh disk with a seed of its own (`--cuts N`; the run's seed replays them); {}{}",
        system.describe(),
        seeds.len(),
        if syncs {
            "at each cut a commit is under way with the disk's syncs held"
        } else {
            "nothing is ever synced, so no sync is held"
        },
        if first.force_garble {
            "; each cut takes the first seed of its own sequence that tears or garbles a block over old data"
        } else {
            ""
        }
    ));
    let mut outcomes = Vec::new();
    for (index, seed) in seeds.iter().enumerate() {
        let work = ctx.work_dir()?.join(format!("cut-{index}"));
        std::fs::create_dir_all(&work)?;
        let persistence = Persistence {
            seed: *seed,
            ..first
        };
        let outcome = match system {
            System::Postgres { fsync } => pg_cut(ctx, &work, persistence, fsync).await?,
            System::Sqlite {
                journal_mode,
                synchronous,
            } => sqlite_cut(&work, persistence, journal_mode, synchronous).await?,
        };
        let _ = std::fs::remove_dir_all(&work);
        outcomes.push(outcome);
    }
    let records: Vec<_> = outcomes.iter().map(CutOutcome::record).collect();
    ctx.record("cuts", serde_json::Value::from(records));
    Ok(outcomes)
}

/// The totals over the cuts, as a note: `cuts_n=… acknowledged_n=… lost_n=…
/// cuts_losing_n=… cuts_damaged_n=… syncs_held_n=… blocks kept_n=… …`.
pub fn totals(outcomes: &[CutOutcome]) -> String {
    let sum = |f: &dyn Fn(&CutOutcome) -> u64| outcomes.iter().map(f).sum::<u64>();
    format!(
        "over the cuts: cuts_n={} acknowledged_n={} lost_n={} cuts_losing_n={} cuts_damaged_n={} syncs_held_n={} blocks kept_n={} lost_n={} torn_n={} garbled_n={}",
        outcomes.len(),
        sum(&|o| o.acknowledged as u64),
        sum(&|o| o.lost as u64),
        outcomes.iter().filter(|o| o.lost > 0).count(),
        outcomes.iter().filter(|o| !o.damage.is_empty()).count(),
        sum(&|o| o.dropped.syncs_held),
        sum(&|o| o.dropped.blocks_kept),
        sum(&|o| o.dropped.blocks_lost),
        sum(&|o| o.dropped.blocks_torn),
        sum(&|o| o.dropped.blocks_garbled),
    )
}

/// Waits until the disk holds at least one sync (a commit between its write and its
/// sync); returns the count seen (0 when the bound passed).
async fn held_sync(disk: &PowerDisk) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        let held = disk.syncs_held();
        if held >= 1 || tokio::time::Instant::now() >= deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A crash-worker applying changes `p-m-<first>`… to item 1 through the mount; with
/// `hold`, waits until it holds its connection and returns the acknowledged count.
async fn sqlite_worker(
    through: &Path,
    range: std::ops::Range<usize>,
    pragmas: (&str, &str),
    hold: bool,
) -> anyhow::Result<(CrashWorker, usize)> {
    let mut args = vec!["sqlite".to_string(), "apply".into(), "--file".into()];
    args.push(through.display().to_string());
    for index in range {
        let change =
            serde_json::json!({"event_id": format!("p-m-{index:02}"), "item": 1, "delta": -1});
        args.extend(["--change".to_string(), change.to_string()]);
    }
    args.extend(["--hold-at-end".to_string(), "--journal-mode".into()]);
    args.extend([
        pragmas.0.to_string(),
        "--synchronous".into(),
        pragmas.1.into(),
    ]);
    let mut worker = CrashWorker::launch(&args)?;
    let mut acknowledged = 0;
    if hold {
        loop {
            let line = worker.next_line(Duration::from_millis(WAIT_MS)).await?;
            let line = line.ok_or_else(|| anyhow::anyhow!("worker ended: {}", worker.stderr()))?;
            if line.starts_with("HOLDING") {
                break;
            }
            acknowledged += usize::from(line.contains("outcome=applied"));
        }
    }
    Ok((worker, acknowledged))
}

/// One SQLite cut: the file made on the backing folder, the disk mounted, a worker
/// applies [`CHANGES`] acknowledged changes and holds its connection; with the syncs
/// held a second worker starts one more (seen held, unless the mode never syncs: then
/// it is acknowledged too); freeze, SIGKILL both, cut; then the file is read on the
/// backing folder: acknowledged changes present, `integrity_check`, reconciliation.
async fn sqlite_cut(
    work: &Path,
    persistence: Persistence,
    journal_mode: &str,
    synchronous: &str,
) -> anyhow::Result<CutOutcome> {
    std::fs::create_dir_all(work.join("disk"))?;
    let backing: PathBuf = work.join("disk").join(FILE);
    let store = inventory_store::Store::open(&backing)?;
    store.add_item(1, 100)?;
    drop(store);
    let disk = PowerDisk::mount_with(work, persistence)?;
    let through = disk.path().join(FILE);
    let pragmas = (journal_mode, synchronous);
    let (mut first, mut acknowledged) = sqlite_worker(&through, 0..CHANGES, pragmas, true).await?;
    let syncs = synchronous != "off";
    if syncs {
        disk.hold_syncs();
    }
    let one_more = CHANGES..CHANGES + 1;
    let (mut second, more) = sqlite_worker(&through, one_more, pragmas, !syncs).await?;
    acknowledged += more;
    if syncs {
        held_sync(&disk).await;
    }
    disk.freeze();
    first.kill().await?;
    second.kill().await?;
    let dropped = disk.cut(None);
    drop(disk);
    let mut outcome = CutOutcome {
        seed: persistence.seed,
        acknowledged,
        dropped,
        ..CutOutcome::default()
    };
    read_sqlite(&backing, &mut outcome);
    Ok(outcome)
}

/// Reads the file after a cut into `outcome`: the acknowledged changes missing, and
/// what `integrity_check` and the reconciliation find (or that it cannot be read).
fn read_sqlite(backing: &Path, outcome: &mut CutOutcome) {
    let read = || -> Result<(usize, String, usize), String> {
        let connection = inventory_store::rusqlite::Connection::open(backing)
            .map_err(|error| error.to_string())?;
        let present: i64 = connection
            .query_row(
                "SELECT count(*) FROM applied_change WHERE event_id LIKE 'p-m-%' AND event_id < $1",
                [format!("p-m-{:02}", outcome.acknowledged)],
                |row| row.get(0),
            )
            .map_err(|error| error.to_string())?;
        let integrity: String = connection
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .map_err(|error| error.to_string())?;
        let findings = inventory_store::reconcile(&connection).map_err(|e| e.to_string())?;
        Ok((present as usize, integrity, findings.len()))
    };
    match read() {
        Ok((present, integrity, findings)) => {
            outcome.lost = outcome.acknowledged.saturating_sub(present);
            if integrity != "ok" {
                outcome.damage.push(format!("integrity_check: {integrity}"));
            }
            if findings > 0 {
                outcome
                    .damage
                    .push(format!("reconciliation findings={findings}"));
            }
        }
        Err(error) => {
            outcome.lost = outcome.acknowledged;
            outcome
                .damage
                .push(format!("the file cannot be read: {error}"));
        }
    }
}

/// One PostgreSQL cut: a cluster on a fresh disk with the ledger (checkpointed,
/// written back), [`PG_CLIENTS`] clients debiting, a `CHECKPOINT` once [`PG_ACKS`]`.0`
/// were acknowledged (with `fsync=off` its page writes and `pg_control` stay unsynced),
/// the syncs held once `.1` were (seen held with `fsync=on`), freeze, SIGKILL, cut,
/// recovery; then what was lost or found damaged.
async fn pg_cut(
    ctx: &Ctx,
    work: &Path,
    persistence: Persistence,
    fsync: bool,
) -> anyhow::Result<CutOutcome> {
    let settings = [("fsync", if fsync { "on" } else { "off" })];
    let mut power = PowerCluster::start_with(work, &settings, &[], persistence).await?;
    power
        .cluster
        .create_database(ledger::DATABASE, None)
        .await?;
    let mut client = power.cluster.connect(ledger::DATABASE).await?;
    ledger::install(&mut client).await?;
    client.batch_execute("CHECKPOINT").await?;
    power.disk.sync_all()?;
    let log = ctx.log_file("ledger-svc")?;
    let service = ledger::service_on(&power, ledger::DATABASE, log).await?;
    let running = RunningLoad::start(&service, PG_CLIENTS);
    running.wait_acknowledged(PG_ACKS.0).await;
    client.batch_execute("CHECKPOINT").await?;
    running.wait_acknowledged(PG_ACKS.1).await;
    if fsync {
        power.disk.hold_syncs();
        held_sync(&power.disk).await;
    }
    power.disk.freeze();
    let (load, cut) = ledger::cut_under_load(&mut power, service, running, None).await?;
    drop(client);
    let mut outcome = CutOutcome {
        seed: persistence.seed,
        acknowledged: load.acknowledged.len(),
        dropped: cut.dropped.clone(),
        ..CutOutcome::default()
    };
    if let Err(error) = &cut.recovery {
        let first = error
            .lines()
            .find(|l| l.contains("FATAL") || l.contains("PANIC"));
        outcome
            .damage
            .push(format!("recovery failed: {}", first.unwrap_or(error)));
        outcome.lost = outcome.acknowledged;
        return Ok(outcome);
    }
    read_pg(&power, &load, &mut outcome).await?;
    Ok(outcome)
}

/// Reads the recovered cluster into `outcome`: acknowledged debits missing, keys with
/// two transactions, the reconciliation's findings, amcheck's failures.
async fn read_pg(
    power: &PowerCluster,
    load: &ledger::Load,
    outcome: &mut CutOutcome,
) -> anyhow::Result<()> {
    let mut client = power.cluster.connect(ledger::DATABASE).await?;
    outcome.lost = ledger::lost_keys(&client, load).await?.len();
    let doubled: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT 1 FROM ledger_txn WHERE client_id = $1 \
             GROUP BY idem_key HAVING count(*) > 1) AS d",
            &[&ledger::CLIENT_ID],
        )
        .await?
        .get(0);
    if doubled > 0 {
        outcome
            .damage
            .push(format!("keys with two transactions={doubled}"));
    }
    match points_ledger::reconcile(&mut client).await {
        Ok(findings) if findings.is_clean() => {}
        Ok(findings) => outcome
            .damage
            .push(format!("reconciliation: {}", findings.summary())),
        Err(error) => outcome
            .damage
            .push(format!("reconciliation failed: {error}")),
    }
    match ledger::amcheck(&client).await {
        Ok((_, failures)) if failures.is_empty() => {}
        Ok((_, failures)) => outcome
            .damage
            .push(format!("amcheck: {}", failures.join("; "))),
        Err(error) => outcome.damage.push(format!("amcheck failed: {error}")),
    }
    Ok(())
}

/// The claims of a durable configuration over its cuts: every cut held a sync (a
/// commit was between its write and its sync), lost nothing acknowledged, and no check
/// found damage. A failing cut is noted with its seed.
pub fn durable_claims(ctx: &mut Ctx, outcomes: &[CutOutcome], what: &str) {
    ctx.note(totals(outcomes));
    for (index, outcome) in outcomes.iter().enumerate() {
        let unheld = outcome.dropped.syncs_held == 0 || outcome.dropped.bytes == 0;
        if outcome.lost > 0 || !outcome.damage.is_empty() || unheld {
            ctx.note(outcome.line(index));
        }
    }
    held_check(ctx, outcomes);
    let lost: usize = outcomes.iter().map(|o| o.lost).sum();
    ctx.check_eq(format!("acknowledged {what}s lost over every cut"), 0, lost);
    let damaged = outcomes.iter().filter(|o| !o.damage.is_empty()).count();
    ctx.check(
        "no cut leaves damage (recovery, integrity or amcheck, reconciliation)",
        damaged == 0,
        format!("cuts_damaged={damaged}"),
    );
}

/// Every cut was taken with a sync held and bytes unsynced (≥ 1 each, per cut; a mode
/// that never syncs holds none, and its controls do not check this).
fn held_check(ctx: &mut Ctx, outcomes: &[CutOutcome]) {
    let unforced = outcomes
        .iter()
        .filter(|o| o.dropped.syncs_held == 0 || o.dropped.bytes == 0)
        .count();
    ctx.check(
        "every cut was taken with a sync held and bytes unsynced (≥ 1 each, per cut)",
        !outcomes.is_empty() && unforced == 0,
        format!("cuts_without_held_sync_or_unsynced_bytes={unforced}"),
    );
}

/// The forced part of a garble case: every cut was taken with a sync held and bytes
/// unsynced, and tore or garbled at least one block over old data (each ≥ 1 per cut);
/// then the counts of what each cut lost or found damaged, noted and recorded, each
/// damaged or losing cut with its seed.
pub fn garble_preconditions(ctx: &mut Ctx, outcomes: &[CutOutcome]) {
    ctx.note(totals(outcomes));
    for (index, outcome) in outcomes.iter().enumerate() {
        ctx.record(
            format!("cut_{}", index + 1),
            serde_json::Value::from(outcome.line(index)),
        );
    }
    held_check(ctx, outcomes);
    let ungarbled = outcomes
        .iter()
        .filter(|o| o.dropped.blocks_torn + o.dropped.blocks_garbled == 0)
        .count();
    ctx.check(
        "every cut tore or garbled a block over old data (≥ 1 per cut)",
        !outcomes.is_empty() && ungarbled == 0,
        format!("cuts_without_torn_or_garbled_block={ungarbled}"),
    );
}

/// The sector-atomic device each engine documents: a cut whose blocks were torn at
/// sectors but none garbled (each 512-byte sector new or old) loses nothing
/// acknowledged and leaves no damage. Cuts with garbage are counted, not claimed.
pub fn torn_only_claim(ctx: &mut Ctx, outcomes: &[CutOutcome]) {
    let torn_only = |o: &&CutOutcome| o.dropped.blocks_garbled == 0;
    let broken = outcomes
        .iter()
        .filter(torn_only)
        .filter(|o| o.lost > 0 || !o.damage.is_empty())
        .count();
    let garbage = outcomes.len() - outcomes.iter().filter(torn_only).count();
    ctx.note(format!(
        "cuts with garbage in a sector cuts_garbage_n={garbage}, of them losing or damaged cuts_garbage_losing_n={}",
        outcomes
            .iter()
            .filter(|o| o.dropped.blocks_garbled > 0 && (o.lost > 0 || !o.damage.is_empty()))
            .count()
    ));
    ctx.check(
        "no cut whose blocks were only torn at sectors (no garbage) lost or damaged anything",
        broken == 0,
        format!("torn_only_cuts_losing_or_damaged={broken}"),
    );
}

/// The claim of a negative control over its cuts: at least one cut lost something
/// acknowledged or left damage (counted). The cuts that did are noted with their seeds.
pub fn control_claims(ctx: &mut Ctx, outcomes: &[CutOutcome], anomaly: &str) {
    ctx.note(totals(outcomes));
    let hit: Vec<usize> = (0..outcomes.len())
        .filter(|i| outcomes[*i].lost > 0 || !outcomes[*i].damage.is_empty())
        .collect();
    ctx.record(
        "cuts_shown",
        serde_json::Value::from(
            hit.iter()
                .map(|i| outcomes[*i].line(*i))
                .collect::<Vec<_>>(),
        ),
    );
    ctx.exposes(
        anomaly,
        !hit.is_empty(),
        format!("cuts_losing_or_damaged_n={}", hit.len()),
    );
}
