//! What each case of a family works on: a PostgreSQL database cloned from the family's
//! template, an SQLite file, or nothing.

use std::fmt;

use futures_util::future::BoxFuture;

/// Installs a family's schema and seed data into its template database.
pub type InstallFn = for<'a> fn(&'a tokio_postgres::Client) -> BoxFuture<'a, anyhow::Result<()>>;

/// A PostgreSQL family's template: every case database of the family is cloned from it
/// (`CREATE DATABASE … TEMPLATE`, PostgreSQL docs §23.3 "Template Databases").
#[derive(Clone, Copy)]
pub struct PgTemplate {
    /// Name of the template database, e.g. `ledger_template`.
    pub template: &'static str,
    /// Installs the schema and seeds into it (called once per run, on a connection to
    /// the new template database).
    pub install: InstallFn,
}

impl fmt::Debug for PgTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTemplate")
            .field("template", &self.template)
            .finish()
    }
}

/// What each case of a family gets to work on.
#[derive(Debug, Clone, Copy)]
pub enum Engine {
    /// Nothing: the case brings its own system. A run of such families boots no
    /// PostgreSQL.
    None,
    /// Its own PostgreSQL database (`case_<id>`), cloned from the family's template on
    /// the run's scratch cluster.
    Postgres(PgTemplate),
    /// Its own SQLite database file in the run's folder (`sqlite/<id>.db`, not yet
    /// created when the case starts; removed with the run). No PostgreSQL.
    SqliteFile,
}

impl Engine {
    /// Whether the engine needs the scratch PostgreSQL cluster.
    pub fn needs_postgres(&self) -> bool {
        matches!(self, Engine::Postgres(_))
    }
}
