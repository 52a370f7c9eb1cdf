//! What all cases of one run share: the PostgreSQL server (the scratch cluster, or an
//! existing server, only when a selected family needs PostgreSQL), each PostgreSQL
//! family's template database, the folder for SQLite
//! files, the registry of clean databases and files per family, the seed, and the
//! connection budget.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Context as _;
use scratch_pg::Cluster;
use tokio::sync::Semaphore;

use crate::engine::Engine;
use crate::options::Choices;
use crate::server::{ExternalServer, Server};

/// Connections the runner keeps out of the case budget: its own connections (cloning
/// case databases, preparing templates) and a margin for sessions a case opens briefly
/// beyond what it declares.
pub const CONNECTION_HEADROOM: u32 = 10;

/// Where a run keeps what it shares.
#[derive(Debug, Clone)]
pub struct EnvOptions {
    /// The run's seed for random input.
    pub seed: u64,
    /// Folder for the logs of processes that cases start (ledger-svc, crash-worker).
    pub logs_dir: PathBuf,
    /// Folder for the SQLite files of [`Engine::SqliteFile`] families (created on
    /// demand; the caller removes it with the run).
    pub files_dir: PathBuf,
    /// The run's choices for the systems under test (the ledger's transfer mode, say;
    /// see [`crate::options`]), each recorded per case in the run record.
    pub choices: Choices,
}

/// The run's server as the cases share it.
enum Backend {
    Scratch(Arc<Mutex<Cluster>>),
    External(Arc<ExternalServer>),
}

/// Shared by all cases of one run.
pub struct Env {
    backend: Option<Backend>,
    templates: BTreeMap<String, String>,
    clean: Mutex<BTreeMap<String, Vec<String>>>,
    options: EnvOptions,
    connection_budget: u32,
    connections: Arc<Semaphore>,
    /// A folder this `Env` made itself (tests) and removes on drop.
    owned_dir: Option<PathBuf>,
}

impl Env {
    /// Prepares what the families of a run need, each given as its id prefix and
    /// [`Engine`]: for each [`Engine::Postgres`], its template database (schema and seeds
    /// installed by the family, then `IS_TEMPLATE true ALLOW_CONNECTIONS false` so no
    /// session lingers in it). The connection budget is the server's `max_connections`
    /// (on an existing server: what [`ExternalServer::connection_budget`] finds free)
    /// less [`CONNECTION_HEADROOM`]. On an existing server each template is
    /// `<prefix><template>`; the caller drops those databases at the end
    /// ([`ExternalServer::drop_databases`]). [`Env::prepare`] takes the families.
    ///
    /// Errors: a PostgreSQL family but no server; SQL errors while making a template.
    pub async fn prepare_engines(
        server: Option<Server>,
        engines: &[(&'static str, Engine)],
        options: EnvOptions,
    ) -> anyhow::Result<Env> {
        let backend = server.map(|server| match server {
            Server::Scratch(cluster) => Backend::Scratch(Arc::new(Mutex::new(*cluster))),
            Server::External(external) => Backend::External(external),
        });
        let mut env = Env {
            backend,
            templates: BTreeMap::new(),
            clean: Mutex::new(BTreeMap::new()),
            options,
            connection_budget: 0,
            connections: Arc::new(Semaphore::new(0)),
            owned_dir: None,
        };
        if env.backend.is_none() {
            if let Some((prefix, _)) = engines.iter().find(|(_, e)| e.needs_postgres()) {
                anyhow::bail!("family {prefix} needs PostgreSQL, but no cluster was started");
            }
            return Ok(env);
        }
        let admin = env.connect(env.admin_database()).await?;
        env.connection_budget = match &env.backend {
            Some(Backend::External(external)) => {
                external.connection_budget(CONNECTION_HEADROOM).await?
            }
            _ => {
                let max: String = admin
                    .query_one("SELECT current_setting('max_connections')", &[])
                    .await?
                    .get(0);
                let max: u32 = max.parse().context("reading max_connections")?;
                max.saturating_sub(CONNECTION_HEADROOM).max(1)
            }
        };
        env.connections = Arc::new(Semaphore::new(env.connection_budget as usize));
        for (prefix, engine) in engines {
            let Engine::Postgres(template) = engine else {
                continue;
            };
            let name = format!("{}{}", env.prefix(), template.template);
            match &env.backend {
                Some(Backend::External(external)) => external.create_database(&name).await?,
                _ => {
                    admin
                        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
                        .await?
                }
            }
            {
                let client = env.connect(&name).await?;
                (template.install)(&client)
                    .await
                    .with_context(|| format!("installing family {prefix} into {name}"))?;
            }
            admin
                .batch_execute(&format!(
                    "ALTER DATABASE \"{name}\" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
                ))
                .await?;
            env.templates.insert(prefix.to_string(), name);
        }
        Ok(env)
    }

    /// The prefix of every database the run makes: empty on the scratch cluster, the
    /// run's unique prefix on an existing server.
    pub fn prefix(&self) -> &str {
        match &self.backend {
            Some(Backend::External(external)) => external.prefix(),
            _ => "",
        }
    }

    /// The database the runner connects to for `CREATE DATABASE` and `DROP DATABASE`:
    /// `postgres` on the scratch cluster, the URL's database on an existing server.
    pub fn admin_database(&self) -> &str {
        match &self.backend {
            Some(Backend::External(external)) => external.admin_database(),
            _ => "postgres",
        }
    }

    /// Whether the run works on an existing server (no restarts, no server settings).
    pub fn is_external(&self) -> bool {
        matches!(self.backend, Some(Backend::External(_)))
    }

    /// The run's choices ([`EnvOptions::choices`]).
    pub fn choices(&self) -> &Choices {
        &self.options.choices
    }

    /// Drops `database` (ending its connections) and clones it from `template`.
    ///
    /// Errors: connection or SQL errors.
    pub async fn clone_database(&self, template: &str, database: &str) -> anyhow::Result<()> {
        let admin = self.connect(self.admin_database()).await?;
        // Two statements: DROP/CREATE DATABASE cannot run inside a transaction block, which
        // a multi-statement batch would be.
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
            ))
            .await?;
        admin
            .batch_execute(&format!(
                "CREATE DATABASE \"{database}\" TEMPLATE \"{template}\""
            ))
            .await?;
        Ok(())
    }

    /// Hands the temporary folder of a test environment to this `Env`, which removes it
    /// on drop.
    pub(crate) fn own_folder(&mut self, dir: PathBuf) {
        self.owned_dir = Some(dir);
    }

    /// The temporary folder a test environment made itself (removed on drop), for a test
    /// process that keeps its `Env` in a static and so never drops it.
    pub fn test_folder(&self) -> Option<&Path> {
        self.owned_dir.as_deref()
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.options.seed
    }

    /// Whether the run has a PostgreSQL server (its scratch cluster or an existing one).
    pub fn has_cluster(&self) -> bool {
        self.backend.is_some()
    }

    /// The folder for the logs of processes that cases start (not created here).
    pub fn logs_dir(&self) -> &Path {
        &self.options.logs_dir
    }

    /// The folder for SQLite files (not created here).
    pub fn files_dir(&self) -> &Path {
        &self.options.files_dir
    }

    /// The most connections concurrent cases may declare together.
    pub fn connection_budget(&self) -> u32 {
        self.connection_budget
    }

    pub(crate) fn connection_permits(&self) -> Arc<Semaphore> {
        self.connections.clone()
    }

    /// The template database of the family with `prefix`, if it is a PostgreSQL family
    /// of this run.
    pub fn template_of(&self, prefix: &str) -> Option<&str> {
        self.templates.get(prefix).map(String::as_str)
    }

    /// The database name a case gets on the scratch cluster, e.g. `case_l3`
    /// ([`Env::database_name`] adds the run's prefix).
    pub fn database_for(case_id: &str) -> String {
        format!("case_{}", case_id.to_ascii_lowercase())
    }

    /// The database name a case gets in this run: [`Env::prefix`] and
    /// [`Env::database_for`], e.g. `case_l3` or `lh_3f2a_9c41e7_case_l3`.
    pub fn database_name(&self, case_id: &str) -> String {
        format!("{}{}", self.prefix(), Env::database_for(case_id))
    }

    /// The scratch cluster, locked (only to read its address or to restart it).
    ///
    /// Errors: the run has no scratch cluster (no selected family needs PostgreSQL, or
    /// the run works on an existing server).
    pub fn cluster(&self) -> anyhow::Result<MutexGuard<'_, Cluster>> {
        match &self.backend {
            Some(Backend::Scratch(cluster)) => Ok(cluster
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())),
            _ => Err(self.shared_cluster().expect_err("not a scratch cluster")),
        }
    }

    pub(crate) fn shared_cluster(&self) -> anyhow::Result<Arc<Mutex<Cluster>>> {
        match &self.backend {
            Some(Backend::Scratch(cluster)) => Ok(cluster.clone()),
            Some(Backend::External(external)) => anyhow::bail!(
                "this run works on an existing server ({}); it has no scratch cluster to restart",
                external.shown_url()
            ),
            None => anyhow::bail!("this run has no PostgreSQL cluster"),
        }
    }

    /// A tokio-postgres config for `database` on the run's server.
    ///
    /// Errors: the run has no PostgreSQL server.
    pub fn config(&self, database: &str) -> anyhow::Result<tokio_postgres::Config> {
        match &self.backend {
            Some(Backend::External(external)) => Ok(external.config(database)),
            _ => Ok(self.cluster()?.config(database)),
        }
    }

    /// A connection URL for `database`, for child processes such as the crash-worker:
    /// `postgresql://postgres@127.0.0.1:PORT/db` on the scratch cluster, the given URL
    /// with `database` in place of its own on an existing server.
    ///
    /// Errors: the run has no PostgreSQL server.
    pub fn url(&self, database: &str) -> anyhow::Result<String> {
        match &self.backend {
            Some(Backend::External(external)) => Ok(external.url(database)),
            _ => Ok(self.cluster()?.url(database)),
        }
    }

    /// Connects to `database`, spawning the connection task on the current runtime.
    ///
    /// Errors: no cluster; connection failures.
    pub async fn connect(&self, database: &str) -> anyhow::Result<tokio_postgres::Client> {
        crate::race::connect_with(self.config(database)?).await
    }

    /// Registers a clean database or file of family `prefix` (the runner does this when a
    /// clean case completes).
    pub fn register_clean(&self, prefix: &str, resource: String) {
        self.clean
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(prefix.to_string())
            .or_default()
            .push(resource);
    }

    /// The clean databases or files registered so far for family `prefix`, sorted.
    pub fn clean_of(&self, prefix: &str) -> Vec<String> {
        let mut names = self
            .clean
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(prefix)
            .cloned()
            .unwrap_or_default();
        names.sort();
        names
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(dir) = &self.owned_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
