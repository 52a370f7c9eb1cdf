//! One scratch `mariadbd`: install, start, stop, kill and restart.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use scratch_pg::process::{Credentials, spawn_tied};

use crate::MariaError;
use crate::binaries::{self, MariaBinaries};

/// The unprivileged user the server runs as when we are root.
pub const DEFAULT_SERVER_USER: &str = "nobody";

/// The server's pid file inside its folder (the janitor reads it).
pub const PID_FILE: &str = "mariadbd.pid";

/// Bound on waiting for the server to accept connections or to exit (a hang bound, not
/// a measurement).
const READY_WAIT_MS: u64 = 60_000;

/// Where and how to start a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The server's own folder (created; `data/`, the socket, the pid file and the error
    /// log go inside). Removed when the server is dropped.
    pub dir: PathBuf,
    /// The binaries' cache ([`scratch_pg::binaries::default_cache_dir`] by default).
    pub cache_dir: PathBuf,
    /// The user the server runs as when we are root.
    pub server_user: String,
    /// The data directory, when not `dir/data` (family P puts it on a forgetful disk);
    /// created and handed to the server's user. It is not removed with the server.
    pub data_dir: Option<PathBuf>,
    /// Server options passed as `--NAME=VALUE` after the defaults, in order (family P's
    /// `innodb_flush_method=fsync`, `innodb_flush_log_at_trx_commit=2`, …).
    pub settings: Vec<(String, String)>,
}

impl ServerOptions {
    /// A server in `dir`, binaries in the project's cache, run as `nobody` when root.
    pub fn new(dir: PathBuf) -> ServerOptions {
        ServerOptions {
            dir,
            cache_dir: scratch_pg::binaries::default_cache_dir(),
            server_user: DEFAULT_SERVER_USER.into(),
            data_dir: None,
            settings: Vec::new(),
        }
    }
}

/// A running scratch server on `127.0.0.1:<port>`, user `root` without a password.
/// Dropping it stops the server (SIGKILL if `shutdown` does not end it) and removes its
/// folder.
#[derive(Debug)]
pub struct Server {
    binaries: MariaBinaries,
    dir: PathBuf,
    port: u16,
    credentials: Option<Credentials>,
    child: Option<Child>,
    data_dir: PathBuf,
    settings: Vec<(String, String)>,
}

impl Server {
    /// Resolves the binaries, installs the system tables into `dir/data`
    /// (`mariadb-install-db --no-defaults --auth-root-authentication-method=normal
    /// --skip-test-db`) and starts the server.
    ///
    /// Errors: [`MariaError::Binaries`], [`MariaError::User`], [`MariaError::Install`],
    /// [`MariaError::Start`], [`MariaError::Io`].
    pub fn start(options: ServerOptions) -> Result<Server, MariaError> {
        let binaries = binaries::resolve(&options.cache_dir)?;
        let credentials = if nix::unistd::geteuid().is_root() {
            Some(lookup_user(&options.server_user)?)
        } else {
            None
        };
        let dir = std::path::absolute(&options.dir)
            .map_err(MariaError::io("resolving the server folder"))?;
        let mut server = Server {
            binaries,
            data_dir: options.data_dir.unwrap_or_else(|| dir.join("data")),
            dir,
            port: 0,
            credentials,
            child: None,
            settings: options.settings,
        };
        server.prepare_folder()?;
        server.install()?;
        server.launch()?;
        Ok(server)
    }

    fn prepare_folder(&self) -> Result<(), MariaError> {
        fs::create_dir_all(&self.dir)
            .map_err(MariaError::io(format!("creating {}", self.dir.display())))?;
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))
            .map_err(MariaError::io("chmod the server folder"))?;
        if let Some(Credentials { uid, gid }) = self.credentials {
            std::os::unix::fs::chown(&self.dir, Some(uid), Some(gid))
                .map_err(MariaError::io("chown the server folder"))?;
        }
        // The server's own temporary folder: a temporary table of the bootstrap in the
        // shared /tmp was once removed under it by someone else (install-db failed with
        // "Error on delete of '/tmp/#sql-temptable-…'").
        let tmp = self.dir.join("tmp");
        fs::create_dir_all(&tmp).map_err(MariaError::io(format!("creating {}", tmp.display())))?;
        if let Some(Credentials { uid, gid }) = self.credentials {
            std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))
                .map_err(MariaError::io("chown the server's temporary folder"))?;
        }
        if self.data_dir != self.dir.join("data") {
            fs::create_dir_all(&self.data_dir).map_err(MariaError::io(format!(
                "creating {}",
                self.data_dir.display()
            )))?;
            if let Some(Credentials { uid, gid }) = self.credentials {
                std::os::unix::fs::chown(&self.data_dir, Some(uid), Some(gid))
                    .map_err(MariaError::io("chown the data directory"))?;
            }
        }
        Ok(())
    }

    fn install(&self) -> Result<(), MariaError> {
        let mut command = Command::new(self.binaries.program("mariadb-install-db"));
        command
            .arg("--no-defaults")
            .arg(format!("--basedir={}", self.binaries.usr.display()))
            .arg(format!("--datadir={}", self.data_dir().display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .arg(format!("--tmpdir={}", self.dir.join("tmp").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = spawn_tied(command, self.credentials, libc::SIGKILL)
            .map_err(MariaError::io("running mariadb-install-db"))?;
        let output = child
            .wait_with_output()
            .map_err(MariaError::io("waiting for mariadb-install-db"))?;
        if !output.status.success() {
            return Err(MariaError::Install(format!(
                "{}: {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(())
    }

    /// Starts `mariadbd` on a free loopback port (the same one again on a restart) and waits until it accepts a
    /// connection (or exits: then the error log's tail is the error).
    fn launch(&mut self) -> Result<(), MariaError> {
        if self.port == 0 {
            self.port = free_port()?;
        }
        let usr = &self.binaries.usr;
        let mut command = Command::new(self.binaries.mariadbd());
        command
            .arg("--no-defaults")
            .arg(format!("--basedir={}", usr.display()))
            .arg(format!("--datadir={}", self.data_dir().display()))
            .arg(format!(
                "--lc-messages-dir={}",
                usr.join("share/mysql").display()
            ))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--port={}", self.port))
            .arg(format!(
                "--socket={}",
                self.dir.join("mariadbd.sock").display()
            ))
            .arg(format!("--pid-file={}", self.dir.join(PID_FILE).display()))
            .arg(format!("--log-error={}", self.log_path().display()))
            // Room for sixteen racers and their observers in every concurrent case.
            .arg("--max-connections=500")
            .arg(format!("--tmpdir={}", self.dir.join("tmp").display()))
            .args(
                self.settings
                    .iter()
                    .map(|(name, value)| format!("--{name}={value}")),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_tied(command, self.credentials, libc::SIGKILL)
            .map_err(MariaError::io("starting mariadbd"))?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), MariaError> {
        let deadline = Instant::now() + Duration::from_millis(READY_WAIT_MS);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(MariaError::Start(format!(
                    "exited ({status}): {}",
                    self.log_tail()
                )));
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(MariaError::Start(format!(
                    "no connection within {READY_WAIT_MS} ms: {}",
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the server with `mariadb -e shutdown` and waits for it to exit; SIGKILL if
    /// it has not exited within the hang bound. Does nothing when it is not running.
    ///
    /// Errors: [`MariaError::Stop`] when the client cannot be run.
    pub fn stop(&mut self) -> Result<(), MariaError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let sent = Command::new(self.binaries.program("mariadb"))
            .args(["--no-defaults", "-h127.0.0.1", "-uroot"])
            .arg(format!("-P{}", self.port))
            .args(["-e", "shutdown"])
            .stdin(Stdio::null())
            .output();
        let deadline = Instant::now() + Duration::from_millis(READY_WAIT_MS);
        while sent.is_ok() && Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        match sent {
            Ok(_) => Ok(()),
            Err(e) => Err(MariaError::Stop(format!(
                "running mariadb -e shutdown: {e}"
            ))),
        }
    }

    /// Kills the server with SIGKILL (no shutdown, no flush), waits for it to exit and
    /// starts it again on the same data: InnoDB's crash recovery replays its redo log.
    ///
    /// Errors: [`MariaError::Start`] and [`MariaError::Io`] from the restart.
    pub fn kill_and_restart(&mut self) -> Result<(), MariaError> {
        self.kill();
        self.launch()
    }

    /// Kills the server with SIGKILL (no shutdown, no flush) and waits for it to exit;
    /// returns whether one was running. [`Server::restart`] starts it again.
    pub fn kill(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let _ = child.kill();
        let _ = child.wait();
        true
    }

    /// Starts a killed server again on its data and port (InnoDB's crash recovery) and
    /// waits until it accepts a connection.
    ///
    /// Errors: [`MariaError::Start`] with the error log's tail when it exits first (a
    /// recovery that fails) or does not answer within the hang bound; [`MariaError::Io`].
    pub fn restart(&mut self) -> Result<(), MariaError> {
        if self.child.is_some() {
            return Ok(());
        }
        self.launch()
    }

    /// The process id of the running server.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone()
    }

    /// The error log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("mariadbd.err")
    }

    /// The binaries the server runs.
    pub fn binaries(&self) -> &MariaBinaries {
        &self.binaries
    }

    /// The last 20 lines of the error log (empty when unreadable).
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Connection options for `database` as `root` (`None`: no default database).
    pub fn opts(&self, database: Option<&str>) -> mysql_async::OptsBuilder {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(self.port)
            .user(Some("root"))
            .db_name(database)
            .prefer_socket(false)
    }

    /// Creates `name` (an identifier of letters, digits and `_`), dropping it first if it
    /// exists.
    ///
    /// Errors: [`MariaError::Sql`].
    pub async fn create_database(&self, name: &str) -> Result<(), MariaError> {
        use mysql_async::prelude::Queryable;
        let mut conn = mysql_async::Conn::new(self.opts(None)).await?;
        conn.query_drop(format!("DROP DATABASE IF EXISTS `{name}`"))
            .await?;
        conn.query_drop(format!("CREATE DATABASE `{name}`")).await?;
        conn.disconnect().await?;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> Result<u16, MariaError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(MariaError::io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(MariaError::io("finding a free port"))?
        .port())
}

fn lookup_user(name: &str) -> Result<Credentials, MariaError> {
    let user = nix::unistd::User::from_name(name)
        .map_err(|e| MariaError::User(format!("looking up {name}: {e}")))?
        .ok_or_else(|| MariaError::User(format!("{name:?} does not exist")))?;
    if user.uid.is_root() {
        return Err(MariaError::User(format!("{name} is root")));
    }
    Ok(Credentials {
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    })
}
