//! The P family's case files on PostgreSQL (`system: postgres_on_forgetful_disk`): a
//! cluster of the case's own whose data directory is on a forgetful disk of the case's
//! own (`launch::power`), as the spec runner's engine ([`case_kit::spec::SpecEngine`]),
//! and its setup, a page's eviction and the power cut as calls.
//!
//! The disk and the cluster belong to the case: nothing runs until a step calls
//! `cluster`; they stop (the cluster, then the disk unmounted) when the expectations'
//! connection, the last one, ends; a case that ends before its expectations leaves
//! them to the run's cleanup (the janitor after a kill -9 of the harness). A session's
//! SQL runs on the case's database on the cluster, connected at its first statement and
//! again after a cut. The calls (`docs/specs.md`, "A power cut as one file"):
//!
//! | call | prints |
//! |---|---|
//! | `cluster database=D [checksums=yes] [set=NAME:VALUE …]` | `cluster on the forgetful disk: initdb --data-checksums; full_page_writes=off shared_buffers=256kB …; database torn` |
//! | `write-back` | `written back: the disk holds every write so far` |
//! | `evict table=T through=B` | `last_unsynced_write=0+8192 unsynced_bytes=8192 dirty_buffers=0 passes_n=1` |
//! | `power-cut [tear=T] [tear-bytes=N]` | the cut's line (`power cut: SIGKILL of every postgres process; dropped …; torn write kept 512 bytes; model=drop names=journal; recovery ok`), then `recovery=ok torn_bytes=512`, or `recovery=failed torn_bytes=512 invalid_page=acct:0 checksum_mismatch=yes` and where the server's log went; after a `debit-load` (its service killed with the cluster, its clients stopped), `before the cut: acknowledged_n=… unknown_n=… refused=0` |
//! | `reconcile` | the ledger's reconciliation of the session's database: `balance_mismatches=0 … global_sum=0` |
//!
//! The ledger's other calls (`install-ledger`, `debit-load`, `record-outcomes`,
//! `amcheck`) are [`crate::spec_ledger`]'s, on P1's code.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_postgres::Client;

use case_kit::Ctx;
use case_kit::spec::{self, Call, EngineSession, Layout, Reconciled, SessionFuture, SpecEngine};
use forgetful_fs::Tear;
use launch::power::{PowerCluster, PowerCut};

use crate::spec_disk::DiskState;

/// What a file on this engine says as its `system:`.
pub const SYSTEM: &str = "postgres_on_forgetful_disk";
/// Index scans of the `evict` table at most before the call gives up (a hang bound;
/// one has always been enough).
pub const MAX_EVICTION_PASSES: u32 = 5;
/// The boundary a tear keeps up to without `tear-bytes=`, bytes (a sector).
pub const TEAR_BYTES: u64 = 512;

/// A cluster on a forgetful disk per case.
#[derive(Default)]
pub struct PowerPgEngine {
    /// Each running case's disk, from its start to its expectations.
    disks: case_kit::PerCase<Arc<Disk>>,
}

/// One case's disk and what runs on it. Dropping it stops the cluster, then unmounts.
pub struct Disk {
    state: tokio::sync::Mutex<DiskState>,
}

impl SpecEngine for PowerPgEngine {
    case_kit::spec_declares!(SYSTEM, crate::verbs::CLUSTER);

    fn describe(&self, ctx: &mut Ctx) {
        // A disk left by an earlier run of the case (one that ended before its
        // expectations) goes now, before its folder is made empty.
        self.disks.remove(ctx);
        let Ok(work) = ctx.work_dir() else {
            return;
        };
        let names = ["recovery", "ledger-svc", "client-outcomes"];
        let logs = names
            .into_iter()
            .filter_map(|name| Some((name, ctx.log_file(name).ok()?)));
        let state = DiskState {
            work,
            logs: logs.collect(),
            database: String::new(),
            generation: 0,
            load: None,
            seen: None,
            power: None,
        };
        let state = tokio::sync::Mutex::new(state);
        self.disks.insert(ctx, Arc::new(Disk { state }));
    }

    fn connect<'a>(&'a self, ctx: &'a Ctx, opening: spec::Opening) -> SessionFuture<'a> {
        let disk = self.disks.get(ctx);
        crate::session_on_disk(disk, Some(opening.permutation), |disk| {
            Box::new(ClusterSession { disk, client: None })
        })
    }

    fn expectations<'a>(&'a self, ctx: &'a Ctx) -> SessionFuture<'a> {
        // The last connection: it holds the disk alone, which goes when it ends.
        crate::session_on_disk(self.disks.remove(ctx), None, |disk| {
            Box::new(ClusterSession { disk, client: None })
        })
    }
}

/// A session: a connection to the case's database, opened at its first statement,
/// with the generation (cut) it was opened in.
struct ClusterSession {
    disk: Arc<Disk>,
    client: Option<(u64, Client)>,
}

impl ClusterSession {
    /// The session's connection, (re)opened when it has none from the current
    /// generation.
    async fn client(&mut self) -> Result<&Client, String> {
        let state = self.disk.state.lock().await;
        let fresh = matches!(&self.client, Some((g, _)) if *g == state.generation);
        if !fresh {
            self.client = Some((state.generation, state.connect().await?));
        }
        drop(state);
        Ok(&self.client.as_ref().expect("opened above").1)
    }

    /// `cluster database=D [checksums=yes] [set=NAME:VALUE …]`.
    async fn cluster(&mut self, call: &Call) -> Result<String, String> {
        let mut state = self.disk.state.lock().await;
        if state.power.is_some() {
            return Err("the case's cluster is running already".into());
        }
        let mut settings = Vec::new();
        for (name, value) in call.args.iter().filter(|(name, _)| name == "set") {
            let (setting, to) = (value.split_once(':'))
                .ok_or_else(|| format!("{name}={value}: a setting is written set=NAME:VALUE"))?;
            settings.push((setting.to_string(), to.to_string()));
        }
        let pairs: Vec<(&str, &str)> = (settings.iter())
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        let checksums = call.arg("checksums") == Some("yes");
        let initdb: &[&str] = if checksums {
            &["--data-checksums"]
        } else {
            &[]
        };
        let power = PowerCluster::start(&state.work, &pairs, initdb).await;
        let power = power.map_err(|e| format!("{e:#}"))?;
        let database = call.arg("database").unwrap_or_default().to_string();
        let made = power.cluster.create_database(&database, None).await;
        made.map_err(|e| format!("creating {database}: {e}"))?;
        state.power = Some(power);
        state.database = database.clone();
        let shown: Vec<String> = (settings.iter()).map(|(n, v)| format!("{n}={v}")).collect();
        Ok(format!(
            "cluster on the forgetful disk: initdb{}; {}; database {database}",
            if checksums { " --data-checksums" } else { "" },
            if shown.is_empty() {
                "the durable defaults".to_string()
            } else {
                shown.join(" ")
            }
        ))
    }

    /// `write-back`: every unsynced write written back.
    async fn write_back(&mut self) -> Result<String, String> {
        let state = self.disk.state.lock().await;
        state
            .power()?
            .disk
            .sync_all()
            .map_err(|e| format!("{e:#}"))?;
        Ok("written back: the disk holds every write so far".into())
    }

    /// `evict table=T through=B`: index scans of B until no shared buffer holds a
    /// dirty page of T and the disk holds T's file unsynced; what the disk holds of it.
    async fn evict(&mut self, call: &Call) -> Result<String, String> {
        let (table, through) = (call.arg("table"), call.arg("through"));
        let (table, through) = (table.unwrap_or_default(), through.unwrap_or_default());
        let state = self.disk.state.lock().await;
        let power = state.power()?;
        let client = state.connect().await?;
        let file = relation_file(&client, table).await?;
        let sql = |e: tokio_postgres::Error| e.to_string();
        let no_ring = "SET enable_seqscan = off; SET enable_bitmapscan = off";
        client.batch_execute(no_ring).await.map_err(sql)?;
        let scan = format!("SELECT sum(length(t::text)) FROM {through} AS t WHERE id > 0");
        let dirty = "SELECT count(*) FROM pg_buffercache b JOIN pg_database d \
                     ON d.oid = b.reldatabase WHERE d.datname = current_database() \
                     AND b.relfilenode = pg_relation_filenode($1::text::regclass) AND b.isdirty";
        let mut passes = 0;
        let mut dirty_buffers = -1;
        while passes < MAX_EVICTION_PASSES {
            passes += 1;
            client.query_one(&scan, &[]).await.map_err(sql)?;
            let row = client.query_one(dirty, &[&table]).await.map_err(sql)?;
            dirty_buffers = row.get::<_, i64>(0);
            if dirty_buffers == 0 && power.disk.unsynced_file(&file).is_some() {
                break;
            }
        }
        let held = power.disk.unsynced_file(&file);
        let last = held.and_then(|held| held.last_write);
        Ok(format!(
            "last_unsynced_write={} unsynced_bytes={} dirty_buffers={dirty_buffers} passes_n={passes}",
            last.map_or("none".to_string(), |(at, bytes)| format!("{at}+{bytes}")),
            held.map_or(0, |held| held.bytes)
        ))
    }

    /// `power-cut [tear=T] [tear-bytes=N]`: SIGKILL of every postgres process, the
    /// unsynced data dropped (T's last write torn), the start with crash recovery.
    async fn power_cut(&mut self, call: &Call) -> Result<String, String> {
        self.client = None;
        let mut state = self.disk.state.lock().await;
        let mut tear = None;
        if let Some(table) = call.arg("tear") {
            let client = state.connect().await?;
            let bytes = call.arg("tear-bytes").map(str::parse).transpose();
            let bytes = bytes.map_err(|_| "tear-bytes= takes an integer")?;
            tear = Some((
                table.to_string(),
                Tear {
                    file: relation_file(&client, table).await?,
                    boundary_bytes: bytes.unwrap_or(TEAR_BYTES),
                },
            ));
        }
        let log = state.log("recovery")?;
        let load = state.load.take();
        let power = (state.power.as_mut()).ok_or("no cluster: a `cluster` step starts one")?;
        let torn = tear.as_ref().map(|(_, tear)| tear);
        let (seen, cut) = match load {
            Some((service, running)) => {
                let cut = crate::ledger::cut_under_load(power, service, running, torn).await;
                let (seen, cut) = cut.map_err(|e| format!("{e:#}"))?;
                (Some(seen), cut)
            }
            None => (
                None,
                power.power_cut(torn).await.map_err(|e| format!("{e:#}"))?,
            ),
        };
        state.generation += 1;
        let mut lines = vec![cut.line(), recovery(&cut, tear.as_ref(), &log)];
        if let Some(seen) = &seen {
            lines.push(format!(
                "before the cut: acknowledged_n={} unknown_n={} refused={}",
                seen.acknowledged.len(),
                seen.unknown.len(),
                seen.refused.len()
            ));
        }
        state.seen = seen;
        Ok(lines.join("\n"))
    }
}

/// What recovery made of the cut: `recovery=ok torn_bytes=N`, or `recovery=failed
/// torn_bytes=N`, the page the log names invalid (`invalid_page=TABLE:BLOCK`, the torn
/// relation named by its table), whether the log saw a checksum mismatch, and the log
/// written to `log`.
fn recovery(cut: &PowerCut, tear: Option<&(String, Tear)>, log: &Path) -> String {
    let torn = cut.dropped.torn_bytes_kept;
    let Err(error) = &cut.recovery else {
        return format!("recovery=ok torn_bytes={torn}");
    };
    let written = std::fs::write(log, error).is_ok();
    let mut words = vec![format!("recovery=failed torn_bytes={torn}")];
    if let Some((block, relation)) = invalid_page(error) {
        let torn_file = tear.and_then(|(table, tear)| {
            let file = tear.file.strip_prefix("pgdata").ok()?;
            (file == Path::new(&relation)).then_some(table)
        });
        let named = torn_file.cloned().unwrap_or(relation);
        words.push(format!("invalid_page={named}:{block}"));
    }
    let mismatch = error.contains("page verification failed");
    words.push(format!(
        "checksum_mismatch={}",
        if mismatch { "yes" } else { "no" }
    ));
    if written {
        let name = log.file_name().unwrap_or_default().to_string_lossy();
        words.push(format!("(the server's log: {name})"));
    }
    words.join(" ")
}

/// `(block, relation file)` of the server's `invalid page in block N of relation F`.
fn invalid_page(log: &str) -> Option<(u64, String)> {
    let rest = log.split("invalid page in block ").nth(1)?;
    let (block, rest) = rest.split_once(" of relation ")?;
    let relation = rest.split(|c: char| c.is_whitespace() || c == '"').next()?;
    Some((block.parse().ok()?, relation.to_string()))
}

/// Table `table`'s main fork, relative to the mount point (`pgdata/base/…`).
async fn relation_file(client: &Client, table: &str) -> Result<PathBuf, String> {
    let sql = "SELECT pg_relation_filepath($1::text::regclass)";
    let row = client.query_one(sql, &[&table]).await;
    let path: String = row.map_err(|e| format!("{table}: {e}"))?.get(0);
    Ok(Path::new("pgdata").join(path))
}

impl EngineSession for ClusterSession {
    fn reconcile(&mut self) -> BoxFuture<'_, Reconciled> {
        async move {
            self.client().await?;
            let (_, client) = self.client.as_mut().expect("opened above");
            let findings = points_ledger::reconcile(client).await;
            let findings = findings.map_err(|e| e.to_string())?;
            Ok((findings.is_clean(), findings.summary()))
        }
        .boxed()
    }

    fn sql<'a>(&'a mut self, sql: &'a str) -> BoxFuture<'a, Vec<String>> {
        async move {
            match self.client().await {
                Ok(client) => spec::run_sql(client, sql, Layout::Ours).await,
                Err(error) => vec![format!("ERROR (cannot run): {error}")],
            }
        }
        .boxed()
    }

    fn call<'a>(&'a mut self, call: &'a Call) -> BoxFuture<'a, Result<String, String>> {
        async move {
            match call.op.as_str() {
                "cluster" => self.cluster(call).await,
                "write-back" => self.write_back().await,
                "evict" => self.evict(call).await,
                "power-cut" => self.power_cut(call).await,
                "install-ledger" | "debit-load" | "record-outcomes" | "amcheck" => {
                    let mut state = self.disk.state.lock().await;
                    crate::spec_ledger::call(&mut state, call).await
                }
                "reconcile" => Ok(self.reconcile().await?.1),
                other => Err(format!("no operation {other:?}")),
            }
        }
        .boxed()
    }
}
