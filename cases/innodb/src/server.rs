//! The run's scratch MariaDB, shared by the family's cases: installed by the harness (or a
//! test) before the cases run, taken back and stopped after them.

use std::sync::Mutex;

use scratch_mariadb::Server;

static SERVER: Mutex<Option<Server>> = Mutex::new(None);

fn slot() -> std::sync::MutexGuard<'static, Option<Server>> {
    SERVER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Hands `server` to the family's cases (replacing and dropping, so stopping, any
/// earlier one).
pub fn install(server: Server) {
    *slot() = Some(server);
}

/// Takes the server back (the caller stops it by dropping it); `None` if none is
/// installed.
pub fn take() -> Option<Server> {
    slot().take()
}

/// Connection options for `database` on the installed server (`None`: no default
/// database).
///
/// Errors: no server installed (the family runs only when the harness started one).
pub fn opts(database: Option<&str>) -> anyhow::Result<mysql_async::OptsBuilder> {
    slot()
        .as_ref()
        .map(|server| server.opts(database))
        .ok_or_else(|| anyhow::anyhow!("no scratch MariaDB installed for family I"))
}

/// Kills the installed server with SIGKILL and starts it again on its data and port
/// (InnoDB crash recovery); returns the old and the new process ids.
///
/// Errors: no server installed; the restart failed.
pub fn kill_and_restart() -> anyhow::Result<(u32, u32)> {
    let mut guard = slot();
    let server = guard
        .as_mut()
        .ok_or_else(|| anyhow::anyhow!("no scratch MariaDB installed for family I"))?;
    let before = server.pid().unwrap_or_default();
    server.kill_and_restart()?;
    Ok((before, server.pid().unwrap_or_default()))
}
