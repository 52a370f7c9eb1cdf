//! Streaming replication between scratch clusters: a standby built from a hot base backup
//! taken through SQL, synchronous or asynchronous, its promotion, and a kill -9 of a
//! whole server (postmaster and every backend).
//!
//! The embedded binaries carry no `pg_basebackup`, so the backup is the low-level one of
//! PostgreSQL docs 26.3.3 "Making a Base Backup Using the Low Level API":
//! `pg_backup_start(label, fast => true)`, a copy of the data directory without `pg_wal`,
//! `pg_replslot` and `postmaster.pid`, then `pg_backup_stop(false)` in the same session,
//! whose `labelfile` becomes `backup_label`. The standby gets `standby.signal`,
//! `primary_conninfo` and a physical replication slot (docs 27.2 "Log-Shipping Standby
//! Servers"). A promoted standby may inherit `synchronous_standby_names` from the copy;
//! [`Cluster::promote`] clears it, or the new primary's first write waits on `SyncRep`
//! for a standby that does not exist.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::ClusterError;
use crate::cluster::{Cluster, ClusterOptions, SUPERUSER};
use crate::process::Credentials;

/// How long a standby may take to stream (and, when synchronous, to be the primary's
/// synchronous standby) after it starts, milliseconds. A bound against a hang only.
pub const STREAMING_TIMEOUT_MS: u64 = 30_000;
/// How long a promotion may take (`pg_promote(wait_seconds)`), seconds.
pub const PROMOTE_TIMEOUT_S: u32 = 60;
/// Pause between two looks at `pg_stat_replication`, milliseconds.
const POLL_MS: u64 = 10;

/// Whether the primary waits for the standby before it acknowledges a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'` on the primary, `synchronous_commit = on`: a
    /// commit returns once the standby has flushed its WAL (docs 27.2.8).
    Synchronous,
    /// No synchronous standby: a commit returns once the primary flushed its own WAL.
    Asynchronous,
}

/// Options of [`Cluster::start_standby`].
#[derive(Debug, Clone)]
pub struct StandbyOptions {
    /// The standby's folder; it must not exist yet.
    pub dir: PathBuf,
    /// Its name: the physical slot on the primary and its `application_name`.
    pub name: String,
    /// Synchronous or asynchronous.
    pub replication: Replication,
    /// The unprivileged user it runs as when we are root.
    pub server_user: String,
}

impl Cluster {
    /// Builds a standby of this (running) cluster from a hot base backup, starts it, and
    /// waits until it streams; with [`Replication::Synchronous`] also until the primary
    /// lists it as `sync` in `pg_stat_replication`.
    ///
    /// Errors: SQL errors on either server; copy errors; the standby does not start or
    /// stream within [`STREAMING_TIMEOUT_MS`]. Nothing is left running after an error.
    pub async fn start_standby(&self, options: StandbyOptions) -> Result<Cluster, ClusterError> {
        let primary = self.connect("postgres").await?;
        primary
            .query(
                "SELECT pg_create_physical_replication_slot($1)",
                &[&options.name],
            )
            .await?;
        let standby = Cluster::prepare(ClusterOptions {
            pg_bin: Some(self.binaries().bin_dir.clone()),
            dir: Some(options.dir.clone()),
            required_major: None,
            server_user: options.server_user.clone(),
            ..ClusterOptions::default()
        })?;
        primary
            .query("SELECT pg_backup_start($1, true)", &[&options.name])
            .await?;
        let copied = copy_data_dir(self.data_dir(), standby.data_dir(), standby.credentials);
        let row = primary
            .query_one(
                "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)",
                &[],
            )
            .await?;
        copied?;
        let label: String = row.get(0);
        let conninfo = format!(
            "host=127.0.0.1 port={} user={SUPERUSER} application_name={}",
            self.port(),
            options.name
        );
        standby.write_standby_files(&label, &conninfo, &options.name)?;
        if options.replication == Replication::Synchronous {
            // ALTER SYSTEM refuses a transaction block, so two round trips.
            primary
                .batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                .await?;
            primary.batch_execute("SELECT pg_reload_conf()").await?;
        }
        let standby = tokio::task::spawn_blocking(move || {
            let mut standby = standby;
            standby.start_server(true).map(|()| standby)
        })
        .await
        .map_err(|e| ClusterError::Start(format!("starting the standby: {e}")))??;
        self.wait_streaming(&options.name, options.replication)
            .await?;
        Ok(standby)
    }

    fn write_standby_files(
        &self,
        label: &str,
        conninfo: &str,
        slot: &str,
    ) -> Result<(), ClusterError> {
        let auto_conf = self.data_dir.join("postgresql.auto.conf");
        let mut settings = fs::read_to_string(&auto_conf).unwrap_or_default();
        settings.push_str(&format!(
            "primary_conninfo = '{conninfo}'\nprimary_slot_name = '{slot}'\n\
             recovery_target_timeline = 'latest'\nhot_standby = on\n"
        ));
        for (name, text) in [
            ("backup_label", label),
            ("standby.signal", ""),
            ("postgresql.auto.conf", settings.as_str()),
        ] {
            let path = self.data_dir.join(name);
            fs::write(&path, text).map_err(ClusterError::io(format!("writing {name}")))?;
            chown(&path, self.credentials)?;
        }
        Ok(())
    }

    /// Waits until `pg_stat_replication` on this primary shows `name` streaming (and
    /// `sync` when synchronous).
    async fn wait_streaming(
        &self,
        name: &str,
        replication: Replication,
    ) -> Result<(), ClusterError> {
        let client = self.connect("postgres").await?;
        let wanted = match replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let deadline = Instant::now() + Duration::from_millis(STREAMING_TIMEOUT_MS);
        loop {
            let rows = client
                .query(
                    "SELECT sync_state FROM pg_stat_replication \
                     WHERE application_name = $1 AND state = 'streaming'",
                    &[&name],
                )
                .await?;
            if rows.iter().any(|row| row.get::<_, String>(0) == wanted) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ClusterError::Start(format!(
                    "standby {name} not streaming ({wanted}) after {STREAMING_TIMEOUT_MS} ms"
                )));
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }

    /// Promotes this standby (`pg_promote(wait => true)`), then clears an inherited
    /// `synchronous_standby_names` (`ALTER SYSTEM RESET`, reload) so its first write
    /// does not wait on `SyncRep`.
    ///
    /// Errors: SQL errors; the promotion did not finish in [`PROMOTE_TIMEOUT_S`].
    pub async fn promote(&self) -> Result<(), ClusterError> {
        let client = self.connect("postgres").await?;
        let promoted: bool = client
            .query_one(
                "SELECT pg_promote(true, $1)",
                &[&(PROMOTE_TIMEOUT_S as i32)],
            )
            .await?
            .get(0);
        if !promoted {
            return Err(ClusterError::Sql(format!(
                "pg_promote did not finish within {PROMOTE_TIMEOUT_S} s"
            )));
        }
        client
            .batch_execute("ALTER SYSTEM RESET synchronous_standby_names")
            .await?;
        client.batch_execute("SELECT pg_reload_conf()").await?;
        Ok(())
    }

    /// Turns this stopped former primary into a standby of `primary` before it starts
    /// again: `standby.signal`, `primary_conninfo`, `recovery_target_timeline = 'latest'`
    /// and no `synchronous_standby_names` (docs 27.2.2 "Standby Server Operation").
    ///
    /// Errors: the server is running; file errors.
    pub fn make_standby_of(&mut self, primary: &Cluster, name: &str) -> Result<(), ClusterError> {
        if self.postmaster_pid().is_some() {
            return Err(ClusterError::Start(
                "make_standby_of needs a stopped server".into(),
            ));
        }
        let conninfo = format!(
            "host=127.0.0.1 port={} user={SUPERUSER} application_name={name}",
            primary.port()
        );
        let auto_conf = self.data_dir.join("postgresql.auto.conf");
        let kept: String = fs::read_to_string(&auto_conf)
            .unwrap_or_default()
            .lines()
            .filter(|line| !line.starts_with("synchronous_standby_names"))
            .map(|line| format!("{line}\n"))
            .collect();
        let settings =
            format!("{kept}primary_conninfo = '{conninfo}'\nrecovery_target_timeline = 'latest'\n");
        for (file, text) in [
            ("standby.signal", ""),
            ("postgresql.auto.conf", settings.as_str()),
        ] {
            let path = self.data_dir.join(file);
            fs::write(&path, text).map_err(ClusterError::io(format!("writing {file}")))?;
            chown(&path, self.credentials)?;
        }
        Ok(())
    }

    /// kill -9 of the whole server: SIGKILL to the postmaster and to every process whose
    /// parent it is (backends, WAL sender, checkpointer…), at once, as a machine that
    /// loses power takes them all. No shutdown checkpoint, no goodbye to any client or
    /// standby. Reaps the postmaster.
    ///
    /// Errors: [`ClusterError::Stop`] when a killed backend still runs after
    /// [`STREAMING_TIMEOUT_MS`] (a hang bound). A server that is not running: a no-op.
    pub fn kill_server(&mut self) -> Result<(), ClusterError> {
        let Some(pid) = self.postmaster_pid() else {
            return Ok(());
        };
        // Stopped first, the postmaster forks no new backend between the look at its
        // children and the kill.
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
        let children = children_of(pid);
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        for child in &children {
            let _ = kill(Pid::from_raw(*child), Signal::SIGKILL);
        }
        self.forget_killed_postmaster();
        // Until every backend has exited, the shared memory block stays attached and a
        // new postmaster on this data directory refuses to start.
        let deadline = Instant::now() + Duration::from_millis(STREAMING_TIMEOUT_MS);
        while children.iter().any(|child| running(*child)) {
            if Instant::now() > deadline {
                return Err(ClusterError::Stop(format!(
                    "backends of the killed postmaster {pid} still run after {STREAMING_TIMEOUT_MS} ms"
                )));
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
        Ok(())
    }

    /// The pid of this standby's WAL receiver (`pg_stat_wal_receiver`), for a case that
    /// stops it (SIGSTOP) to hold the standby's WAL where it is.
    ///
    /// Errors: SQL errors; no WAL receiver runs.
    pub async fn wal_receiver_pid(&self) -> Result<i32, ClusterError> {
        let client = self.connect("postgres").await?;
        let row = client
            .query_opt("SELECT pid FROM pg_stat_wal_receiver", &[])
            .await?;
        row.map(|row| row.get(0))
            .ok_or_else(|| ClusterError::Sql("no WAL receiver runs on this server".into()))
    }

    /// Drops a physical replication slot of this server (`pg_drop_replication_slot`).
    ///
    /// Errors: SQL errors.
    pub async fn drop_slot(&self, name: &str) -> Result<(), ClusterError> {
        let client = self.connect("postgres").await?;
        client
            .query("SELECT pg_drop_replication_slot($1)", &[&name])
            .await?;
        Ok(())
    }
}

/// Whether `pid` exists and is not a zombie.
fn running(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, after)| after.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The children of `pid`, a single-threaded process such as the postmaster
/// (`/proc/<pid>/task/<pid>/children`, proc(5)): read from that one process, not from
/// every process's `stat`.
fn children_of(pid: u32) -> Vec<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|child| child.parse().ok())
        .collect()
}

/// Copies a running server's data directory for a base backup: everything but the
/// contents of `pg_wal` and `pg_replslot` and the `postmaster.pid`/`postmaster.opts`
/// files (docs 26.3.3). A file that vanishes during the copy (a temporary file) is
/// skipped, as the low-level API allows.
fn copy_data_dir(
    from: &Path,
    to: &Path,
    credentials: Option<Credentials>,
) -> Result<(), ClusterError> {
    for entry in
        fs::read_dir(from).map_err(ClusterError::io(format!("reading {}", from.display())))?
    {
        let entry = entry.map_err(ClusterError::io("reading the data directory"))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let target = to.join(&*name);
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            fs::create_dir_all(&target)
                .map_err(ClusterError::io(format!("creating {}", target.display())))?;
            fs::set_permissions(&target, fs::Permissions::from_mode(0o700))
                .map_err(ClusterError::io("folder mode"))?;
            chown(&target, credentials)?;
            if name == "pg_wal" || name == "pg_replslot" {
                if name == "pg_wal" {
                    let status = target.join("archive_status");
                    fs::create_dir_all(&status)
                        .map_err(ClusterError::io("pg_wal/archive_status"))?;
                    chown(&status, credentials)?;
                }
                continue;
            }
            copy_data_dir(&entry.path(), &target, credentials)?;
        } else if kind.is_file() {
            if from.join("PG_VERSION").exists()
                && (name == "postmaster.pid" || name == "postmaster.opts")
            {
                continue;
            }
            match fs::copy(entry.path(), &target) {
                Ok(_) => chown(&target, credentials)?,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(ClusterError::Io {
                        context: format!("copying {}", entry.path().display()),
                        source: error,
                    });
                }
            }
        }
    }
    Ok(())
}

fn chown(path: &Path, credentials: Option<Credentials>) -> Result<(), ClusterError> {
    if let Some(Credentials { uid, gid }) = credentials {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(ClusterError::io(format!("chown {}", path.display())))?;
    }
    Ok(())
}
