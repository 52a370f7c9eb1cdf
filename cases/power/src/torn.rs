//! The body P3 and P4 share: a torn data page. A cluster initialised with data
//! checksums; a checkpoint, written back; one update of the rows in block 0 of a known
//! relation (the first change of that page after the checkpoint: with
//! `full_page_writes=on` its WAL record carries the page's full image); the page forced
//! out of the tiny shared buffers by reading another relation through an index, so that
//! the disk holds it written and unsynced (seen on the disk, not assumed); the power cut
//! with a tear of that file's last write at 512 bytes (the page's header and first
//! bytes new, the rest old). What recovery makes of the page is the finding.

use case_kit::Ctx;
use forgetful_fs::Tear;
use launch::power::{PowerCluster, PowerCut};
use tokio_postgres::Client;

/// The database of P3 and P4.
pub const DATABASE: &str = "torn";
/// Rows of the relation whose page is torn.
pub const ROWS: i32 = 40;
/// Points added by the acknowledged update to each of the first [`UPDATED_ROWS`] rows
/// (all in block 0).
pub const BUMP: i64 = 100;
/// Rows the update changes: few enough that their new versions fit in block 0 (a HOT
/// update), so no other page of the table is dirtied.
pub const UPDATED_ROWS: i32 = 3;
/// Rows of the ballast table read to push the page out of shared buffers (about 600
/// heap pages, many times the 32 buffers: each page read takes a buffer from the clock
/// sweep, and an unpinned buffer survives at most six turns of it).
pub const BALLAST_ROWS: i32 = 4_200;
/// Index scans of the ballast at most before the setup gives up (a hang bound; one has
/// always been enough).
pub const MAX_EVICTION_PASSES: u32 = 5;
/// The boundary the tear keeps up to, bytes (a sector).
pub const TEAR_BYTES: u64 = 512;
/// PostgreSQL's block size, bytes.
const BLOCK_BYTES: u64 = 8192;

/// What one run is set up to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Config {
    /// P3's negative control: the torn page is detected (checksum failure).
    Detected,
    /// P4's claims: recovery repairs the page from its full-page image.
    Repaired,
}

/// What P3 shows.
pub const ANOMALY: &str = "a torn data page (checksum failure)";

/// Runs the setup, the forced unsynced page write and the cut with `full_page_writes` =
/// `full_page_writes`, tearing the page when `tear` (a test runs P3 without the tear,
/// or with `full_page_writes=on`, to see the control fail), then `config`'s checks.
///
/// Errors: the cluster, the disk or SQL fail outside the checked steps.
pub async fn run_with(
    ctx: &mut Ctx,
    config: Config,
    full_page_writes: &str,
    tear: bool,
) -> anyhow::Result<()> {
    let mut power = cluster(ctx, full_page_writes).await?;
    let client = power.cluster.connect(DATABASE).await?;
    let file = relation_file(&client).await?;
    let updated = client
        .execute(
            "UPDATE acct SET balance = balance + $1 WHERE id <= $2 AND (ctid::text::point)[0] = 0",
            &[&BUMP, &UPDATED_ROWS],
        )
        .await?;
    ctx.note(format!(
        "cluster on the forgetful disk: initdb --data-checksums, full_page_writes={full_page_writes}, shared_buffers=256kB; checkpoint written back; then one acknowledged update of {updated} rows in block 0 of acct (the page's first change since the checkpoint)"
    ));
    let passes = evict(&client, &power, &file).await?;
    ctx.record("eviction_passes", serde_json::Value::from(passes));
    let held = power.disk.unsynced_file(&file);
    let forced = held.and_then(|held| held.last_write) == Some((0, BLOCK_BYTES));
    if !ctx.check(
        "the page is written and unsynced: the disk holds acct's block 0 (8192 bytes at offset 0) as its file's last unsynced write, and no shared buffer holds it dirty",
        forced,
        format!("{held:?}"),
    ) {
        return Ok(());
    }
    drop(client);
    let tear = tear.then(|| Tear {
        file: file.clone(),
        boundary_bytes: TEAR_BYTES,
    });
    let cut = power.power_cut(tear.as_ref()).await?;
    ctx.note(cut.line());
    ctx.record("power_cut", cut.record());
    match config {
        Config::Detected => detected(ctx, &power, &cut, &file).await,
        Config::Repaired => repaired(ctx, &power, &cut, updated).await,
    }
}

/// A cluster with data checksums on the disk, the relation and the ballast, hint bits
/// set, checkpointed and written back.
async fn cluster(ctx: &Ctx, full_page_writes: &str) -> anyhow::Result<PowerCluster> {
    let settings = [
        ("full_page_writes", full_page_writes),
        ("shared_buffers", "256kB"),
        // Nothing writes a page or checkpoints on its own: the case decides.
        ("autovacuum", "off"),
        ("bgwriter_lru_maxpages", "0"),
        ("checkpoint_timeout", "1d"),
        ("max_wal_size", "10GB"),
    ];
    let power = PowerCluster::start(&ctx.work_dir()?, &settings, &["--data-checksums"]).await?;
    power.cluster.create_database(DATABASE, None).await?;
    let client = power.cluster.connect(DATABASE).await?;
    client
        .batch_execute(&format!(
            "CREATE EXTENSION pg_buffercache; CREATE EXTENSION amcheck;
             CREATE TABLE acct (id int PRIMARY KEY, balance bigint NOT NULL, pad text NOT NULL)
                 WITH (fillfactor = 50);
             INSERT INTO acct SELECT n, 1000, repeat('a', 100) FROM generate_series(1, {ROWS}) AS n;
             CREATE TABLE ballast (id int PRIMARY KEY, pad text NOT NULL);
             INSERT INTO ballast SELECT n, repeat('b', 1000) FROM generate_series(1, {BALLAST_ROWS}) AS n;
             SELECT count(*) FROM acct; SELECT count(*) FROM ballast;
             CHECKPOINT;"
        ))
        .await?;
    power.disk.sync_all()?;
    Ok(power)
}

/// The relation's main fork, relative to the mount point (`pgdata/base/…`).
async fn relation_file(client: &Client) -> anyhow::Result<std::path::PathBuf> {
    let path: String = client
        .query_one("SELECT pg_relation_filepath('acct')", &[])
        .await?
        .get(0);
    Ok(std::path::Path::new("pgdata").join(path))
}

/// Reads the ballast through its index (no ring buffer: every heap page takes a buffer
/// from the clock sweep) until no shared buffer holds a dirty page of acct and the disk
/// holds acct's file unsynced; returns the passes it took.
async fn evict(
    client: &Client,
    power: &PowerCluster,
    file: &std::path::Path,
) -> anyhow::Result<u32> {
    client
        .batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        .await?;
    for pass in 1..=MAX_EVICTION_PASSES {
        client
            .query_one("SELECT sum(length(pad)) FROM ballast WHERE id > 0", &[])
            .await?;
        let dirty: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_buffercache b JOIN pg_database d ON d.oid = b.reldatabase \
                 WHERE d.datname = current_database() AND b.relfilenode = pg_relation_filenode('acct') \
                 AND b.isdirty",
                &[],
            )
            .await?
            .get(0);
        if dirty == 0 && power.disk.unsynced_file(file).is_some() {
            return Ok(pass);
        }
    }
    Ok(MAX_EVICTION_PASSES + 1)
}

/// P3: the torn page is found — recovery stops on it, or a read of the relation fails
/// with `data_corrupted` (XX001).
async fn detected(
    ctx: &mut Ctx,
    power: &PowerCluster,
    cut: &PowerCut,
    file: &std::path::Path,
) -> anyhow::Result<()> {
    let relation = file.strip_prefix("pgdata")?.display().to_string();
    let found = match &cut.recovery {
        Err(error) => {
            ctx.record("recovery_error", serde_json::Value::from(error.clone()));
            let named = error.contains(&format!("invalid page in block 0 of relation {relation}"));
            ctx.note(format!(
                "crash recovery stopped: {}",
                if named {
                    "FATAL invalid page in block 0 of relation acct's file, in the WAL redo of the update (data_corrupted; the log warns first: page verification failed, calculated checksum … but expected …)"
                } else {
                    "for another reason (the run record has the log)"
                }
            ));
            named
        }
        Ok(()) => {
            let client = power.cluster.connect(DATABASE).await?;
            let read = client.query("SELECT * FROM acct", &[]).await;
            let code = read
                .as_ref()
                .err()
                .and_then(|e| e.code())
                .map(|c| c.code().to_owned());
            ctx.note(format!(
                "crash recovery ok; reading acct: {}",
                code.as_deref()
                    .map_or("ok".to_owned(), |code| format!("SQLSTATE {code}"))
            ));
            code.as_deref() == Some("XX001")
        }
    };
    ctx.exposes(ANOMALY, found, format!("detected={found}"));
    Ok(())
}

/// P4: recovery restores the page from its full-page image; nothing is lost and the
/// relation and its index check clean.
async fn repaired(
    ctx: &mut Ctx,
    power: &PowerCluster,
    cut: &PowerCut,
    updated: u64,
) -> anyhow::Result<()> {
    ctx.check_eq(
        "the tear kept bytes of the page write",
        TEAR_BYTES,
        cut.dropped.torn_bytes_kept,
    );
    let recovered = ctx.check(
        "crash recovery succeeds",
        cut.recovery.is_ok(),
        cut.recovery.as_ref().err().map_or("", String::as_str),
    );
    if !recovered {
        return Ok(());
    }
    let client = power.cluster.connect(DATABASE).await?;
    let rows = client
        .query("SELECT id, balance FROM acct ORDER BY id", &[])
        .await?;
    ctx.check_eq(
        "rows of acct read after recovery",
        ROWS as usize,
        rows.len(),
    );
    let bumped = rows
        .iter()
        .filter(|row| row.get::<_, i64>(1) == 1000 + BUMP)
        .count();
    ctx.check_eq(
        "rows with the acknowledged update",
        updated as usize,
        bumped,
    );
    let heap: i64 = client
        .query_one("SELECT count(*) FROM verify_heapam('acct')", &[])
        .await?
        .get(0);
    ctx.check_eq("amcheck: verify_heapam finds nothing in acct", 0, heap);
    let index = client
        .execute("SELECT bt_index_check('acct_pkey', true)", &[])
        .await;
    ctx.check(
        "amcheck: bt_index_check (heapallindexed) finds nothing in acct_pkey",
        index.is_ok(),
        index.err().map_or(String::new(), |e| e.to_string()),
    );
    Ok(())
}
