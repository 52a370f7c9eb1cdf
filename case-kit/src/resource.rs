//! What a case works on, made afresh for it from its family's [`Engine`]: its own
//! PostgreSQL database cloned from the family's template, its own SQLite file, or nothing.

use std::path::PathBuf;

use crate::engine::Engine;
use crate::env::Env;

/// What a case works on (from its family's [`crate::Engine`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    /// Nothing of its own.
    None,
    /// Its own PostgreSQL database, by name.
    Database(String),
    /// Its own SQLite file, by path (not yet created when the case starts).
    SqliteFile(PathBuf),
}

impl Resource {
    /// The name shown in reports: the database name, the file name, or `none`.
    pub fn name(&self) -> String {
        match self {
            Resource::None => "none".into(),
            Resource::Database(name) => name.clone(),
            Resource::SqliteFile(path) => path.display().to_string(),
        }
    }
}

/// Makes a resource afresh for `engine` of the family with `prefix`: the database
/// `database` dropped and cloned from the family's template, or the SQLite file
/// `<file_stem>.db` in [`Env::files_dir`] removed (with its WAL, shared-memory and journal
/// files) so the case creates it.
///
/// Errors: the family has no template in this run; SQL errors of the drop or clone; a
/// file that exists and cannot be removed.
pub async fn fresh_resource(
    env: &Env,
    prefix: &str,
    engine: &Engine,
    file_stem: &str,
    database: &str,
) -> anyhow::Result<Resource> {
    match engine {
        Engine::None => Ok(Resource::None),
        Engine::SqliteFile => {
            std::fs::create_dir_all(env.files_dir())?;
            let path = env.files_dir().join(format!("{file_stem}.db"));
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let mut file = path.clone().into_os_string();
                file.push(suffix);
                match std::fs::remove_file(&file) {
                    Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                        return Err(error.into());
                    }
                    _ => {}
                }
            }
            Ok(Resource::SqliteFile(path))
        }
        Engine::Postgres(_) => {
            let template = env
                .template_of(prefix)
                .ok_or_else(|| anyhow::anyhow!("family {prefix} has no template in this run"))?;
            env.clone_database(template, database).await?;
            Ok(Resource::Database(database.to_owned()))
        }
    }
}
