//! What all cases of one run share: the PostgreSQL server (the scratch cluster, or an
//! existing server, only when a selected family needs PostgreSQL), each PostgreSQL
//! family's template database, the folder for SQLite
//! files, the registry of clean databases and files per family, the seed, and the
//! connection budget.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Context as _;
use scratch_pg::{Cluster, ClusterOptions};
use tokio::sync::Semaphore;

use crate::case::{Engine, Family};
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
    /// How the ledger's transfers reach the database in this run (see
    /// [`crate::TransferMode`]).
    pub transfer_mode: crate::TransferMode,
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
    /// Prepares what `families` need: for each [`Engine::Postgres`] family, its template
    /// database on `cluster` (schema and seeds installed by the family, then
    /// `IS_TEMPLATE true ALLOW_CONNECTIONS false` so no session lingers in it). The
    /// connection budget is the server's `max_connections` less [`CONNECTION_HEADROOM`].
    ///
    /// Errors: a PostgreSQL family but no cluster; SQL errors while making a template.
    pub async fn prepare(
        cluster: Option<Cluster>,
        families: &[&Family],
        options: EnvOptions,
    ) -> anyhow::Result<Env> {
        Env::prepare_on(
            cluster.map(|cluster| Server::Scratch(Box::new(cluster))),
            families,
            options,
        )
        .await
    }

    /// [`Env::prepare`] on either kind of [`Server`]. On an existing server each
    /// template is `<prefix><template>` (made by [`ExternalServer::create_database`]) and
    /// the connection budget is what [`ExternalServer::connection_budget`] finds free,
    /// less [`CONNECTION_HEADROOM`]. The caller drops the external databases at the end
    /// ([`ExternalServer::drop_databases`]).
    ///
    /// Errors: as [`Env::prepare`].
    pub async fn prepare_on(
        server: Option<Server>,
        families: &[&Family],
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
            if let Some(family) = families.iter().find(|f| f.engine.needs_postgres()) {
                anyhow::bail!(
                    "family {} needs PostgreSQL, but no cluster was started",
                    family.prefix
                );
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
        for family in families {
            let Engine::Postgres(template) = family.engine else {
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
                    .with_context(|| format!("installing family {} into {name}", family.prefix))?;
            }
            admin
                .batch_execute(&format!(
                    "ALTER DATABASE \"{name}\" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"
                ))
                .await?;
            env.templates.insert(family.prefix.to_string(), name);
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

    /// The run's transfer mode ([`EnvOptions::transfer_mode`]).
    pub fn transfer_mode(&self) -> crate::TransferMode {
        self.options.transfer_mode
    }

    /// For tests: a fresh cluster with default options (PG 16, fetched if needed) when a
    /// family needs one, prepared templates, and a temporary folder for logs and files
    /// that is removed when the `Env` is dropped. Blocks ~1 s while a cluster starts.
    ///
    /// Errors: the cluster did not start, or a template could not be made.
    pub async fn for_tests(seed: u64, families: &[&Family]) -> anyhow::Result<Arc<Env>> {
        Env::for_tests_with(ClusterOptions::default(), seed, families).await
    }

    /// [`Env::for_tests`] with the cluster's options chosen by the test (a small
    /// `max_connections`, say).
    ///
    /// Errors: as [`Env::for_tests`].
    pub async fn for_tests_with(
        cluster_options: ClusterOptions,
        seed: u64,
        families: &[&Family],
    ) -> anyhow::Result<Arc<Env>> {
        let cluster = if families.iter().any(|f| f.engine.needs_postgres()) {
            Some(tokio::task::spawn_blocking(move || Cluster::start(cluster_options)).await??)
        } else {
            None
        };
        let dir = std::env::temp_dir().join(format!(
            "case-kit-{}-{}",
            std::process::id(),
            TEST_ENVS.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir)?;
        let options = EnvOptions {
            seed,
            logs_dir: dir.join("logs"),
            files_dir: dir.join("files"),
            transfer_mode: crate::TransferMode::from_env()?,
        };
        let mut env = Env::prepare(cluster, families, options).await?;
        env.owned_dir = Some(dir);
        Ok(Arc::new(env))
    }

    /// For tests that run a case's body under another plan: a context for `case_id` of
    /// `family` on a fresh resource named `name` — a database cloned from the family's
    /// template, or the file `<name>.db` in [`Env::files_dir`] — so several runs of one
    /// case can sit side by side.
    ///
    /// Errors: the database cannot be created (it exists already, say).
    pub async fn test_ctx(
        self: &Arc<Env>,
        family: &Family,
        case_id: &str,
        name: &str,
    ) -> anyhow::Result<crate::Ctx> {
        let resource = match family.engine {
            Engine::None => crate::Resource::None,
            Engine::SqliteFile => {
                std::fs::create_dir_all(self.files_dir())?;
                crate::Resource::SqliteFile(self.files_dir().join(format!("{name}.db")))
            }
            Engine::Postgres(_) => {
                let template = self.template_of(family.prefix).ok_or_else(|| {
                    anyhow::anyhow!("family {} has no template in this run", family.prefix)
                })?;
                let admin = self.connect(self.admin_database()).await?;
                let name = format!("{}{name}", self.prefix());
                admin
                    .batch_execute(&format!(
                        "CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""
                    ))
                    .await?;
                crate::Resource::Database(name)
            }
        };
        Ok(crate::Ctx::new(
            self.clone(),
            family.prefix,
            case_id,
            resource,
        ))
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

/// Numbers the folders of test environments within one process.
static TEST_ENVS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(dir) = &self.owned_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
