//! Throw-away PostgreSQL clusters (SPEC §5): 16 by default, 15, 17 or 18 on request
//! ([`versions::PINNED`]).
//!
//! [`Cluster::start`] finds or fetches the binaries, runs `initdb`, and launches
//! `postgres` directly (not through `pg_ctl`, which detaches the server) with a
//! parent-death signal, so no server outlives the process that started it, even when
//! that process is killed with SIGKILL. Durability settings are stated explicitly as on.
//! As root, `initdb` and `postgres` run as an unprivileged user (default `nobody`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mut cluster = scratch_pg::Cluster::start(scratch_pg::ClusterOptions::default())?;
//! cluster.create_database("case_l1", None).await?;
//! let client = cluster.connect("case_l1").await?;
//! client.batch_execute("SELECT 1").await?;
//! cluster.restart_immediate()?; // immediate stop, start again, WAL recovery
//! # Ok(()) }
//! ```

pub mod binaries;
pub mod bouncer;
mod cluster;
pub mod debian;
pub mod patroni;
pub mod process;
mod replica;
pub mod versions;

pub use binaries::PgBinaries;
pub use cluster::{
    Cluster, ClusterOptions, DEFAULT_SERVER_USER, ServerFacts, StopMode, cleanup_all_clusters,
};
pub use replica::{PROMOTE_TIMEOUT_S, Replication, STREAMING_TIMEOUT_MS, StandbyOptions};

/// Everything that can go wrong while managing a scratch cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Binaries could not be found, fetched or run.
    #[error("PostgreSQL binaries: {0}")]
    Binaries(String),
    /// The binaries are not the PostgreSQL major version required.
    #[error(
        "PostgreSQL {found} found ({text}), {required} required; point PG_BIN (or --pg-bin) at PostgreSQL {required} binaries, or pass --any-version to accept {found}"
    )]
    WrongMajor {
        /// Major version found.
        found: u32,
        /// Major version required.
        required: u32,
        /// `postgres --version` output.
        text: String,
    },
    /// The unprivileged user or folder setup failed (running as root).
    #[error("server user: {0}")]
    User(String),
    /// `initdb` failed; the message carries its output.
    #[error("initdb failed: {0}")]
    Initdb(String),
    /// The server did not become ready; the message carries the log tail.
    #[error("postgres did not start: {0}")]
    Start(String),
    /// The server did not stop in time.
    #[error("postgres did not stop: {0}")]
    Stop(String),
    /// A file system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A SQL command on the cluster failed.
    #[error("SQL: {0}")]
    Sql(String),
}

impl ClusterError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
        let context = context.into();
        move |source| ClusterError::Io { context, source }
    }
}

impl From<tokio_postgres::Error> for ClusterError {
    fn from(error: tokio_postgres::Error) -> Self {
        match error.as_db_error() {
            Some(db) => {
                ClusterError::Sql(format!("{} (SQLSTATE {})", db.message(), db.code().code()))
            }
            None => ClusterError::Sql(error.to_string()),
        }
    }
}

/// A short suffix that differs between calls and processes (pid and a counter and the
/// clock), for folder names.
pub(crate) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}{:x}{:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos & 0xffff
    )
}
