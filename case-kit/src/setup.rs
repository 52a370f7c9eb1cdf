//! Making a run's [`Env`] from its [`Family`]s: the harness's run, and the test
//! environments of `cargo test` (a scratch cluster and a temporary folder of their own),
//! with a context per case body a test runs under another plan.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use scratch_pg::{Cluster, ClusterOptions};

use crate::case::Family;
use crate::ctx::Ctx;
use crate::env::{Env, EnvOptions};
use crate::options::Choices;
use crate::resource::fresh_resource;
use crate::server::Server;

/// Test environments made by this process, for unique folder names.
static TEST_ENVS: AtomicUsize = AtomicUsize::new(0);

/// Each family as its id prefix and engine, what [`Env::prepare_engines`] takes.
fn engines(families: &[&Family]) -> Vec<(&'static str, crate::Engine)> {
    families.iter().map(|f| (f.prefix, f.engine)).collect()
}

impl Env {
    /// Prepares what `families` need on the scratch `cluster` (or nothing, when no
    /// family needs PostgreSQL); see [`Env::prepare_engines`].
    ///
    /// Errors: a PostgreSQL family but no cluster; SQL errors while making a template.
    pub async fn prepare(
        cluster: Option<Cluster>,
        families: &[&Family],
        options: EnvOptions,
    ) -> anyhow::Result<Env> {
        let server = cluster.map(|cluster| Server::Scratch(Box::new(cluster)));
        Env::prepare_engines(server, &engines(families), options).await
    }

    /// [`Env::prepare`] on either kind of [`Server`] (the scratch cluster, or an existing
    /// server under a unique prefix).
    ///
    /// Errors: as [`Env::prepare`].
    pub async fn prepare_on(
        server: Option<Server>,
        families: &[&Family],
        options: EnvOptions,
    ) -> anyhow::Result<Env> {
        Env::prepare_engines(server, &engines(families), options).await
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
            TEST_ENVS.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir)?;
        let options = EnvOptions {
            seed,
            logs_dir: dir.join("logs"),
            files_dir: dir.join("files"),
            choices: Choices::default(),
        };
        let mut env = Env::prepare(cluster, families, options).await?;
        env.own_folder(dir);
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
    ) -> anyhow::Result<Ctx> {
        let database = format!("{}{name}", self.prefix());
        let resource = fresh_resource(self, family.prefix, &family.engine, name, &database).await?;
        Ok(Ctx::new(self.clone(), family.prefix, case_id, resource))
    }
}
