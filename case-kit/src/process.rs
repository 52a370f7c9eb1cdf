//! Finding the workspace binaries that cases start as child processes.

use std::path::PathBuf;

/// Finds a workspace binary that a case starts as a child process (`ledger-svc`,
/// `crash-worker`): the path in the environment variable `env_override` if set, else
/// beside the running executable (`target/release/harness` → `target/release/<name>`),
/// else one folder up (test binaries live in `target/<profile>/deps/`).
///
/// Errors: the override names no file, or neither place has the binary (build it with
/// `cargo build --bins`).
pub fn locate_binary(name: &str, env_override: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env_override) {
        let path = PathBuf::from(path);
        anyhow::ensure!(
            path.is_file(),
            "{env_override} names {}, which is not a file",
            path.display()
        );
        return Ok(path);
    }
    let exe = std::env::current_exe()?;
    let tried: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|folder| folder.join(name))
        .collect();
    tried.iter().find(|path| path.is_file()).cloned().ok_or_else(|| {
        let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
        anyhow::anyhow!(
            "{name} not found (tried {}); build it with `cargo build --bins` or set {env_override}",
            tried.join(", ")
        )
    })
}
