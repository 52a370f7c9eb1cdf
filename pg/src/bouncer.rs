//! PgBouncer as a scratch process: Debian 12's package (`pgbouncer` 1.18), fetched by
//! name with `apt-get download` with the two libraries a minimal Debian lacks
//! (`libc-ares2`, `libevent-2.1-7`) and unpacked with `dpkg -x` into the project's cache
//! ([`crate::binaries::default_cache_dir`]); no `apt-get install` (which would pull
//! `postgresql-common` and start a service). [`Bouncer::start`] writes its own
//! configuration and auth file into a folder of the caller's, takes a free loopback
//! port, and runs `pgbouncer` in the foreground with a parent-death signal (through
//! [`spawn_tied`]), so it never outlives the process that started it, even after
//! SIGKILL; as root it runs as the unprivileged server user (PgBouncer refuses root).
//! Dropping a [`Bouncer`] kills it and waits for it. Its pid is in [`PID_FILE`] in that
//! folder, so a watchdog can tell whether it is still alive.

use std::fs;
use std::io::Write as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ClusterError;
use crate::cluster::{free_port, lookup_user};
use crate::process::{Credentials, spawn_tied};

/// The Debian packages fetched: the program and the shared libraries it needs that a
/// minimal Debian 12 does not have.
pub const PACKAGES: [&str; 3] = ["pgbouncer", "libc-ares2", "libevent-2.1-7"];
/// The cache folder's name for the unpacked packages (Debian 12 ships PgBouncer 1.18).
pub const CACHE_FOLDER: &str = "pgbouncer-1.18";
/// The file in the bouncer's folder that holds its pid while it runs.
pub const PID_FILE: &str = "pgbouncer.pid";
/// How long [`Bouncer::start`] waits for the port to accept connections, milliseconds
/// (a hang bound).
pub const START_TIMEOUT_MS: u64 = 30_000;

/// What [`Bouncer::start`] runs.
#[derive(Debug, Clone)]
pub struct BouncerOptions {
    /// The folder for its configuration, auth file, log and pid file (created).
    pub dir: PathBuf,
    /// The PostgreSQL server it pools, on 127.0.0.1.
    pub server_port: u16,
    /// The database clients name, passed through under the same name.
    pub database: String,
    /// The role clients log in as (trusted; it is also the server login).
    pub user: String,
    /// `pool_mode`: `transaction`, `session` or `statement`.
    pub pool_mode: String,
    /// `default_pool_size`: server connections per database and user.
    pub pool_size: u32,
    /// `max_client_conn`.
    pub max_client_conn: u32,
    /// As root, the unprivileged user it runs as.
    pub server_user: String,
}

/// A running PgBouncer.
pub struct Bouncer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    version_text: String,
}

impl Bouncer {
    /// Fetches the binaries if needed, writes the configuration, starts it and waits
    /// until its port accepts connections.
    ///
    /// Errors: [`ClusterError::Binaries`] (not cached and not root, `apt-get`/`dpkg`
    /// failed, the program does not run); [`ClusterError::User`]; [`ClusterError::Start`]
    /// with its log's tail when it exits or does not listen within [`START_TIMEOUT_MS`].
    pub fn start(options: BouncerOptions) -> Result<Bouncer, ClusterError> {
        let usr = resolve(&crate::binaries::default_cache_dir())?;
        let version_text = version(&usr)?;
        let credentials = if nix::unistd::geteuid().is_root() {
            Some(lookup_user(&options.server_user)?)
        } else {
            None
        };
        let port = free_port()?;
        let config = write_config(&options, port, credentials)?;
        let log = fs::File::create(options.dir.join("pgbouncer.stderr"))
            .map_err(ClusterError::io("creating pgbouncer.stderr"))?;
        let mut command = Command::new(usr.join("sbin/pgbouncer"));
        command
            .arg(&config)
            .env("LD_LIBRARY_PATH", usr.join("lib/x86_64-linux-gnu"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = spawn_tied(command, credentials, libc::SIGKILL)
            .map_err(ClusterError::io("spawning pgbouncer"))?;
        let mut bouncer = Bouncer {
            child: Some(child),
            port,
            dir: options.dir.clone(),
            version_text,
        };
        bouncer.wait_listening()?;
        Ok(bouncer)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `pgbouncer --version`'s first line, e.g. `PgBouncer 1.18.0`.
    pub fn version_text(&self) -> &str {
        &self.version_text
    }

    /// Its folder (configuration, `pgbouncer.log`, [`PID_FILE`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn wait_listening(&mut self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
        loop {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                return Err(ClusterError::Start(format!(
                    "pgbouncer ({}): {}",
                    exited.map_or("not listening".into(), |status| status.to_string()),
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        for name in ["pgbouncer.stderr", "pgbouncer.log"] {
            if let Ok(content) = fs::read_to_string(self.dir.join(name)) {
                let lines: Vec<&str> = content.lines().collect();
                text.push_str(&lines[lines.len().saturating_sub(10)..].join("\n"));
            }
        }
        text
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_file(self.dir.join(PID_FILE));
    }
}

/// Writes `pgbouncer.ini` and `userlist.txt` into `options.dir` (owned by the server
/// user when root) and returns the configuration's path.
fn write_config(
    options: &BouncerOptions,
    port: u16,
    credentials: Option<Credentials>,
) -> Result<PathBuf, ClusterError> {
    let dir = &options.dir;
    fs::create_dir_all(dir).map_err(ClusterError::io(format!("creating {}", dir.display())))?;
    let ini = format!(
        "[databases]\n\
         {db} = host=127.0.0.1 port={server} dbname={db} user={user}\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {dir}/userlist.txt\n\
         pool_mode = {mode}\n\
         default_pool_size = {pool}\n\
         min_pool_size = 0\n\
         reserve_pool_size = 0\n\
         max_client_conn = {clients}\n\
         pidfile = {dir}/{PID_FILE}\n\
         logfile = {dir}/pgbouncer.log\n\
         ignore_startup_parameters = extra_float_digits\n",
        db = options.database,
        server = options.server_port,
        user = options.user,
        dir = dir.display(),
        mode = options.pool_mode,
        pool = options.pool_size,
        clients = options.max_client_conn,
    );
    let config = dir.join("pgbouncer.ini");
    write(&config, &ini)?;
    write(
        &dir.join("userlist.txt"),
        &format!("\"{}\" \"\"\n", options.user),
    )?;
    if let Some(Credentials { uid, gid }) = credentials {
        for path in [dir.clone(), config.clone(), dir.join("userlist.txt")] {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .map_err(ClusterError::io(format!("chown {}", path.display())))?;
        }
    }
    Ok(config)
}

fn write(path: &Path, text: &str) -> Result<(), ClusterError> {
    let mut file =
        fs::File::create(path).map_err(ClusterError::io(format!("creating {}", path.display())))?;
    file.write_all(text.as_bytes())
        .map_err(ClusterError::io(format!("writing {}", path.display())))
}

fn version(usr: &Path) -> Result<String, ClusterError> {
    let output = Command::new(usr.join("sbin/pgbouncer"))
        .arg("--version")
        .env("LD_LIBRARY_PATH", usr.join("lib/x86_64-linux-gnu"))
        .output()
        .map_err(|e| ClusterError::Binaries(format!("running pgbouncer --version: {e}")))?;
    if !output.status.success() {
        return Err(ClusterError::Binaries(format!(
            "pgbouncer --version: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().next().unwrap_or_default().trim().to_owned())
}

/// The unpacked `usr` folder of `cache_dir/`[`CACHE_FOLDER`], fetched there first when
/// missing ([`crate::debian::resolve`]).
///
/// Errors: [`ClusterError::Binaries`] naming the step that failed, or that fetching
/// needs root.
pub fn resolve(cache_dir: &Path) -> Result<PathBuf, ClusterError> {
    let fetch = crate::debian::Fetch {
        folder: CACHE_FOLDER,
        packages: &PACKAGES,
        probe: "usr/sbin/pgbouncer",
        finish: None,
    };
    Ok(crate::debian::resolve(cache_dir, &fetch)?.join("usr"))
}
