//! Where a run's PostgreSQL is: the scratch cluster the run started, or an existing
//! server someone else runs ([`ExternalServer`], `./run.sh --database-url URL`).
//!
//! On an existing server every database the run makes is named with the run's unique
//! prefix ([`unique_prefix`], e.g. `lh_3f2a_9c41e7_case_l3`), made from `template0` with
//! UTF8 and the C locale (so text sorts as on the scratch cluster), and dropped by
//! [`ExternalServer::drop_databases`] at the end, also after Ctrl-C. The server itself
//! is never stopped, restarted or reconfigured: cases that need that
//! ([`crate::Case::restarts_server`]) do not run there.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use scratch_pg::Cluster;

/// How long a connection to an existing server may take to open, milliseconds.
pub const EXTERNAL_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// How many databases [`ExternalServer::drop_databases`] drops at once, each on its own
/// connection. Every `DROP DATABASE` waits for a checkpoint; concurrent drops share one
/// (the checkpointer serves every request made before it starts), so dropping 50
/// databases takes a few checkpoints instead of 50.
pub const DROP_CONCURRENCY: usize = 16;
/// How long [`ExternalServer::drop_databases`] waits for a `CREATE DATABASE` of the
/// run's own still running, milliseconds.
pub const OWN_SESSIONS_END_MS: u64 = 10_000;
/// Rounds of listing and dropping in [`ExternalServer::drop_databases`].
pub const DROP_ROUNDS: usize = 3;
/// The start of every database name a run makes on an existing server (before the
/// run's own part).
pub const PREFIX_STEM: &str = "lh_";

/// The PostgreSQL server of a run, handed to [`crate::Env::prepare_on`].
pub enum Server {
    /// The run's own scratch cluster (restartable; dropped with the run).
    Scratch(Box<Cluster>),
    /// An existing server: databases only, under a prefix.
    External(std::sync::Arc<ExternalServer>),
}

/// An existing PostgreSQL server reached through a connection URL
/// (`postgresql://USER[:PASSWORD]@HOST:PORT/DB[?PARAMS]`, the libpq URI form that
/// tokio-postgres parses). `DB` is the maintenance database the run connects to for
/// `CREATE DATABASE` and `DROP DATABASE`; the user needs the `CREATEDB` attribute, not
/// superuser. No TLS: the connections are plain (`NoTls`).
#[derive(Debug, Clone)]
pub struct ExternalServer {
    url: String,
    config: tokio_postgres::Config,
    admin_database: String,
    prefix: String,
}

/// What a run reads from an existing server before it uses it (`SHOW`, as the URL's user
/// sees it in the maintenance database).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExternalFacts {
    /// `SELECT version()`.
    pub version: String,
    /// `SHOW server_version`, e.g. `16.4`.
    pub server_version: String,
    /// `SHOW server_version_num` divided by 10000, e.g. 16.
    pub major: u32,
    /// `SHOW fsync`.
    pub fsync: String,
    /// `SHOW synchronous_commit`.
    pub synchronous_commit: String,
    /// `SHOW full_page_writes`.
    pub full_page_writes: String,
}

/// A database name prefix no other run shares: [`PREFIX_STEM`], the process id and the
/// clock's nanoseconds in hex, and `_` (at most 24 bytes, leaving 39 of PostgreSQL's 63
/// for the case's own name).
pub fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!(
        "{PREFIX_STEM}{:x}_{:x}_",
        std::process::id(),
        nanos & 0xff_ffff_ffff
    )
}

impl ExternalServer {
    /// Parses `url` and names the run's databases with `prefix`.
    ///
    /// Errors: `url` is not a `postgresql://` or `postgres://` URL tokio-postgres
    /// accepts, or names no host.
    pub fn new(url: &str, prefix: String) -> anyhow::Result<ExternalServer> {
        if !(url.starts_with("postgresql://") || url.starts_with("postgres://")) {
            anyhow::bail!(
                "--database-url must be a URL such as postgresql://USER@HOST:PORT/DB, not {:?}",
                shown(url)
            );
        }
        let config = tokio_postgres::Config::from_str(url)
            .with_context(|| format!("parsing {}", shown(url)))?;
        if config.get_hosts().is_empty() {
            anyhow::bail!("{} names no host", shown(url));
        }
        let admin_database = config
            .get_dbname()
            .map(str::to_string)
            .or_else(|| config.get_user().map(str::to_string))
            .unwrap_or_else(|| "postgres".into());
        Ok(ExternalServer {
            url: url.to_string(),
            config,
            admin_database,
            prefix,
        })
    }

    /// The prefix of every database this run makes on the server.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The maintenance database named in the URL (else the user's name, as libpq does).
    pub fn admin_database(&self) -> &str {
        &self.admin_database
    }

    /// The URL with its password, if any, replaced by `***`, for printing.
    pub fn shown_url(&self) -> String {
        shown(&self.url)
    }

    /// The `application_name` of every session the harness itself opens on the server:
    /// `ledger-harness <prefix>`, so the server's administrator sees whose they are, and
    /// the cleanup can end the run's own sessions first.
    pub fn application_name(&self) -> String {
        format!("ledger-harness {}", self.prefix)
    }

    /// A tokio-postgres config for `database` on the server (its `application_name` is
    /// [`ExternalServer::application_name`]).
    pub fn config(&self, database: &str) -> tokio_postgres::Config {
        let mut config = self.config.clone();
        config
            .dbname(database)
            .application_name(self.application_name())
            .connect_timeout(Duration::from_millis(EXTERNAL_CONNECT_TIMEOUT_MS));
        config
    }

    /// The URL with `database` in place of the maintenance database (host, user,
    /// password and parameters kept), for child processes.
    pub fn url(&self, database: &str) -> String {
        let (scheme, rest) = self.url.split_once("://").unwrap_or(("postgresql", ""));
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let query = tail.find('?').map(|at| &tail[at..]).unwrap_or("");
        format!("{scheme}://{authority}/{database}{query}")
    }

    /// Connects to `database`, spawning the connection task on the current runtime.
    ///
    /// Errors: connection failures.
    pub async fn connect(&self, database: &str) -> anyhow::Result<tokio_postgres::Client> {
        crate::race::connect_with(self.config(database))
            .await
            .with_context(|| format!("connecting to {database} on {}", self.shown_url()))
    }

    /// Reads the version and the durability settings.
    ///
    /// Errors: connection or SQL failures.
    pub async fn facts(&self) -> anyhow::Result<ExternalFacts> {
        let client = self.connect(&self.admin_database).await?;
        let mut values = Vec::new();
        for sql in [
            "SELECT version()",
            "SHOW server_version",
            "SHOW server_version_num",
            "SHOW fsync",
            "SHOW synchronous_commit",
            "SHOW full_page_writes",
        ] {
            let messages = client.simple_query(sql).await?;
            let value = messages
                .iter()
                .find_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                    _ => None,
                })
                .unwrap_or_default();
            values.push(value);
        }
        let number: u32 = values[2]
            .parse()
            .with_context(|| format!("server_version_num {:?}", values[2]))?;
        Ok(ExternalFacts {
            version: values[0].clone(),
            server_version: values[1].clone(),
            major: number / 10_000,
            fsync: values[3].clone(),
            synchronous_commit: values[4].clone(),
            full_page_writes: values[5].clone(),
        })
    }

    /// The connections cases may hold together: `max_connections` less the reserved
    /// slots (`superuser_reserved_connections`, and `reserved_connections` from 16 on),
    /// less the sessions open now on the whole server, less `headroom`; at least 1.
    ///
    /// Errors: connection or SQL failures.
    pub async fn connection_budget(&self, headroom: u32) -> anyhow::Result<u32> {
        let client = self.connect(&self.admin_database).await?;
        let row = client
            .query_one(
                "SELECT current_setting('max_connections')::int \
                      - current_setting('superuser_reserved_connections')::int \
                      - coalesce(current_setting('reserved_connections', true)::int, 0) \
                      - (SELECT coalesce(sum(numbackends), 0)::int FROM pg_stat_database)",
                &[],
            )
            .await?;
        let free: i32 = row.get(0);
        Ok(u32::try_from(free)
            .unwrap_or(0)
            .saturating_sub(headroom)
            .max(1))
    }

    /// `CREATE DATABASE "<name>" TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER libc
    /// LOCALE 'C'` (PostgreSQL 15 and later; docs, "CREATE DATABASE"). `name` already
    /// carries the prefix.
    ///
    /// Errors: SQL failures (no `CREATEDB`, the name is taken).
    pub async fn create_database(&self, name: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            name.starts_with(&self.prefix),
            "{name} lacks the run's prefix {}",
            self.prefix
        );
        let admin = self.connect(&self.admin_database).await?;
        admin
            .batch_execute(&format!(
                "CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8' \
                 LOCALE_PROVIDER libc LOCALE 'C'"
            ))
            .await
            .with_context(|| format!("CREATE DATABASE {name}"))?;
        Ok(())
    }

    /// The databases on the server whose names start with the prefix, sorted.
    ///
    /// Errors: connection or SQL failures.
    pub async fn databases(&self) -> anyhow::Result<Vec<String>> {
        let admin = self.connect(&self.admin_database).await?;
        let mut names: Vec<String> = admin
            .query("SELECT datname::text FROM pg_database", &[])
            .await?
            .iter()
            .map(|row| row.get::<_, String>(0))
            .filter(|name| name.starts_with(&self.prefix))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Drops every database whose name starts with the prefix, [`DROP_CONCURRENCY`] at
    /// a time (templates are first made ordinary databases again; `WITH (FORCE)` ends
    /// sessions still connected), and returns their names. First it waits for any
    /// `CREATE DATABASE` of the harness's own still running (after an interrupt).
    ///
    /// Errors: connection or SQL failures (the first one); the other drops still run.
    pub async fn drop_databases(&self) -> anyhow::Result<Vec<String>> {
        let mut dropped = Vec::new();
        // A second round catches a CREATE DATABASE that reached the server only after
        // the first listing (sent just before an interrupt).
        for _ in 0..DROP_ROUNDS {
            self.wait_for_own_creates()
                .await
                .context("waiting for the run's own CREATE DATABASE")?;
            let names = self
                .databases()
                .await
                .context("listing the run's databases")?;
            if names.is_empty() {
                break;
            }
            self.drop_each(&names).await?;
            dropped.extend(names);
        }
        dropped.sort();
        Ok(dropped)
    }

    async fn drop_each(&self, names: &[String]) -> anyhow::Result<()> {
        use futures_util::StreamExt as _;
        let outcomes: Vec<anyhow::Result<()>> = futures_util::stream::iter(names.iter())
            .map(|name| async move {
                let admin = self.connect(&self.admin_database).await?;
                // A template cannot be dropped; an invalid database (a drop that was
                // interrupted) cannot be altered, only dropped: so this is best effort,
                // and the DROP reports what matters.
                let _ = admin
                    .batch_execute(&format!(
                        "ALTER DATABASE \"{name}\" WITH IS_TEMPLATE false ALLOW_CONNECTIONS true"
                    ))
                    .await;
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await
                    .with_context(|| format!("DROP DATABASE {name}"))?;
                Ok(())
            })
            .buffer_unordered(DROP_CONCURRENCY)
            .collect()
            .await;
        outcomes.into_iter().collect()
    }
}

impl ExternalServer {
    /// Waits up to [`OWN_SESSIONS_END_MS`] until none of the harness's own sessions
    /// ([`ExternalServer::application_name`]) is running a `CREATE DATABASE`. After an
    /// interrupt one may still be running on the server, and would commit after the
    /// listing of the run's databases. Nothing is terminated.
    async fn wait_for_own_creates(&self) -> anyhow::Result<()> {
        let admin = self.connect(&self.admin_database).await?;
        let name = self.application_name();
        let deadline = std::time::Instant::now() + Duration::from_millis(OWN_SESSIONS_END_MS);
        loop {
            let running: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE application_name = $1 AND pid <> pg_backend_pid() \
                       AND state = 'active' AND query ILIKE 'CREATE DATABASE%'",
                    &[&name],
                )
                .await?
                .get(0);
            if running == 0 || std::time::Instant::now() > deadline {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `url` with the password of `user:password@` replaced by `***`.
fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".into();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_everything_but_the_database() {
        let server = ExternalServer::new(
            "postgresql://app:secret@db.example:5433/maint?application_name=x",
            "lh_1_2_".into(),
        )
        .unwrap();
        assert_eq!(server.admin_database(), "maint");
        assert_eq!(
            server.url("lh_1_2_case_l3"),
            "postgresql://app:secret@db.example:5433/lh_1_2_case_l3?application_name=x"
        );
        assert_eq!(
            server.shown_url(),
            "postgresql://app:***@db.example:5433/maint?application_name=x"
        );
        assert_eq!(server.config("d").get_dbname(), Some("d"));
        let bare = ExternalServer::new("postgres://bob@127.0.0.1:5432", "p_".into()).unwrap();
        assert_eq!(bare.admin_database(), "bob");
        assert_eq!(bare.url("x"), "postgres://bob@127.0.0.1:5432/x");
        assert!(ExternalServer::new("host=127.0.0.1 user=bob", "p_".into()).is_err());
    }

    #[test]
    fn prefixes_are_short_and_differ() {
        let first = unique_prefix();
        std::thread::sleep(Duration::from_millis(1));
        let second = unique_prefix();
        assert_ne!(first, second);
        assert!(first.starts_with(PREFIX_STEM) && first.ends_with('_'));
        assert!(first.len() <= 24, "{first}");
    }
}
