//! The run's scratch MariaDB for family I (`cases_innodb`): checked before the run
//! (binaries cached or fetchable, else the family is listed as not run with the
//! reason), started in `<run folder>/mariadb` only when a selected case needs it,
//! handed to the family, and stopped after the cases, on an error and on a signal. After
//! SIGKILL of the harness the server dies of its parent-death signal and the janitor
//! waits for it before removing the folder ([`alive`]).

use std::path::Path;

use crate::selection::Selection;

/// The folder of the scratch server inside the run folder.
pub const FOLDER: &str = "mariadb";

/// Whether `selection` needs the scratch MariaDB.
fn needed(selection: &Selection<'_>) -> bool {
    selection.has_family(cases_innodb::PREFIX)
}

/// Sets family I aside (not run, with the reason) when MariaDB's binaries are neither
/// cached nor fetchable here (no root for `apt-get download`, no apt, no archive). May
/// fetch them into the project's cache (about 8 MB).
pub fn set_aside_if_unavailable(selection: &mut Selection<'_>) {
    if !needed(selection) {
        return;
    }
    let cache = scratch_pg::binaries::default_cache_dir();
    match scratch_mariadb::binaries::resolve(&cache) {
        Ok(binaries) if binaries.source != "cache" => println!(
            "mariadb: fetched {} with {} into {}",
            scratch_mariadb::binaries::PACKAGES.join(" "),
            binaries.source,
            cache.display()
        ),
        Ok(_) => {}
        Err(error) => {
            let reason = format!("MariaDB unavailable: {error}");
            eprintln!("harness: family {} not run: {reason}", cases_innodb::PREFIX);
            selection.set_aside_family(cases_innodb::PREFIX, &reason);
        }
    }
}

/// Starts the scratch server in `run_dir/`[`FOLDER`] when the selection needs it, prints
/// what it is, and installs it for the family.
///
/// Errors: the server did not install or start.
pub async fn start(selection: &Selection<'_>, run_dir: &Path) -> anyhow::Result<()> {
    if !needed(selection) {
        return Ok(());
    }
    let options = scratch_mariadb::ServerOptions::new(run_dir.join(FOLDER));
    let server =
        tokio::task::spawn_blocking(move || scratch_mariadb::Server::start(options)).await??;
    println!(
        "mariadb: {} ({}), scratch server in {FOLDER}/ on 127.0.0.1, for family {}",
        server.binaries().version_text,
        server.binaries().source,
        cases_innodb::PREFIX
    );
    cases_innodb::server::install(server);
    Ok(())
}

/// Stops the installed server, if any (`mariadb -e shutdown`), and removes its folder.
pub fn stop() {
    drop(cases_innodb::server::take());
}

/// Whether the scratch server of `run_dir` still runs (its pid file names a live,
/// non-zombie process).
pub fn alive(run_dir: &Path) -> bool {
    let pid_file = run_dir.join(FOLDER).join(scratch_mariadb::PID_FILE);
    let Ok(text) = std::fs::read_to_string(pid_file) else {
        return false;
    };
    match std::fs::read_to_string(format!("/proc/{}/stat", text.trim())) {
        Ok(stat) => !stat.contains(") Z "),
        Err(_) => false,
    }
}
