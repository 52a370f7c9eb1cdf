//! Throw-away MariaDB servers (InnoDB), the sibling of the scratch PostgreSQL cluster
//! (`scratch-pg`).
//!
//! [`binaries::resolve`] finds MariaDB 10.11 in the project's cache or fetches it by
//! package name from Debian's archive (`apt-get download mariadb-server-core
//! mariadb-client-core`, then `dpkg -x`; no `apt-get install`, which would pull perl,
//! galera and rsync and start a service). [`Server::start`] runs `mariadb-install-db`
//! into a temporary data directory and launches `mariadbd` directly on loopback with a
//! parent-death signal (through [`scratch_pg::process::spawn_tied`]), so no server
//! outlives the process that started it, even after SIGKILL. As root the server runs as
//! an unprivileged user (default `nobody`). [`Server::stop`] sends `mariadb -e shutdown`
//! (the client package has no `mariadb-admin`); [`Server::kill_and_restart`] kills it
//! with SIGKILL and starts it again on the same data (InnoDB crash recovery).
//!
//! ```no_run
//! # async fn demo() -> Result<(), scratch_mariadb::MariaError> {
//! let dir = std::env::temp_dir().join("mariadb-demo");
//! let mut server = scratch_mariadb::Server::start(scratch_mariadb::ServerOptions::new(dir))?;
//! server.create_database("case_i1").await?;
//! server.stop()?;
//! # Ok(()) }
//! ```

pub mod binaries;
mod server;

pub use binaries::MariaBinaries;
pub use server::{DEFAULT_SERVER_USER, PID_FILE, Server, ServerOptions};

/// Everything that can go wrong while fetching or running a scratch MariaDB server.
#[derive(Debug, thiserror::Error)]
pub enum MariaError {
    /// The binaries are not cached and could not be fetched (no root, no apt-get, no
    /// network to Debian's archive); the text says which.
    #[error("MariaDB binaries: {0}")]
    Binaries(String),
    /// The unprivileged user or folder setup failed (running as root).
    #[error("server user: {0}")]
    User(String),
    /// `mariadb-install-db` failed; the text carries its output.
    #[error("mariadb-install-db failed: {0}")]
    Install(String),
    /// The server did not become ready; the text carries the error log's tail.
    #[error("mariadbd did not start: {0}")]
    Start(String),
    /// The server did not stop.
    #[error("mariadbd did not stop: {0}")]
    Stop(String),
    /// A file system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A statement on the server failed.
    #[error("SQL: {0}")]
    Sql(#[from] mysql_async::Error),
}

impl MariaError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> MariaError {
        let context = context.into();
        move |source| MariaError::Io { context, source }
    }
}
