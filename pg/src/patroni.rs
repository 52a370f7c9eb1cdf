//! A Patroni cluster as a scratch part (family R, part 2; docs/failover.md, "A failover
//! manager"): one etcd, [`PatroniOptions::nodes`] Patroni nodes each running a
//! PostgreSQL 15 from Debian's packages, and one HAProxy routing to the node whose
//! Patroni REST API answers `GET /primary` with 200, all on loopback. The programs are
//! Debian 12's packages (`etcd-server` 3.4, `postgresql-15`, `haproxy` 2.6 and the
//! libraries a minimal Debian lacks) unpacked into the project's cache with
//! `apt-get download` + `dpkg -x` ([`crate::debian`]), and Patroni
//! ([`PATRONI_REQUIREMENT`]) installed with `pip` into a virtual environment made there
//! with Debian's `/usr/bin/python3`; fetching needs root (else
//! [`ClusterError::Binaries`], and the cases are listed as not run). The embedded
//! PostgreSQL packages lack `pg_basebackup`, `pg_controldata` and `pg_rewind`, which
//! Patroni needs: hence Debian's PostgreSQL 15.
//!
//! As root every process runs as the unprivileged server user. etcd, Patroni and
//! HAProxy are spawned with a parent-death signal ([`spawn_tied`]), so they die with the
//! process that started them. Patroni starts its postmaster detached (its parent is
//! then init), so a postmaster outlives its Patroni: dropping a [`PatroniCluster`],
//! [`cleanup_all`] (the signal path) and [`kill_left_under`] (the janitor after a
//! kill -9 of the harness) each kill the postmasters found through the nodes'
//! `data/postmaster.pid` and every process listed in the cluster's [`MARKER`] file.
//!
//! The leader lease is as short as Patroni accepts (its `validator.py` and
//! `config.py`: `ttl` ≥ 20 s, `loop_wait` ≥ 1 s, `retry_timeout` ≥ 3 s and
//! `loop_wait + 2 × retry_timeout ≤ ttl`): after a kill -9 of the leader the standby
//! takes the lease once the old one expires, about 20 s. `retry_timeout` is the largest
//! that rule leaves (9 s), not the smallest: Patroni retries a PostgreSQL query for half
//! of it (`postgresql/__init__.py`, its `Retry(deadline=retry_timeout / 2)`), and with
//! 3 s a bootstrap on a loaded machine gave up on its first query to the server it had
//! just started ("connection problems", "Failed to bootstrap cluster") after 1.5 s.

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::ClusterError;
use crate::cluster::{free_port, lookup_user};
use crate::debian::{self, Fetch};
use crate::process::{Credentials, children_of, spawn_tied, wait_gone};

/// The Debian packages fetched: etcd, PostgreSQL 15 with its client programs
/// (`pg_basebackup`, `pg_rewind`, `pg_controldata`), HAProxy and the libraries HAProxy
/// needs that a minimal Debian 12 does not have.
pub const PACKAGES: [&str; 8] = [
    "etcd-server",
    "postgresql-15",
    "postgresql-client-15",
    "libpq5",
    "haproxy",
    "liblua5.3-0",
    "libopentracing-c-wrapper0",
    "libopentracing1",
];
/// The cache folder's name: the unpacked packages under `usr/`, Patroni's virtual
/// environment under `venv/`.
pub const CACHE_FOLDER: &str = "patroni-pg15";
/// What `pip` installs into the virtual environment (pinned: the runs' evidence names
/// this version).
pub const PATRONI_REQUIREMENT: &str = "patroni[etcd3,psycopg3]==4.1.5";
/// The file in the cluster's folder naming every process it started (`<name> <pid>` per
/// line), for the janitor.
pub const MARKER: &str = "patroni-cluster.pids";
/// The leader lease, seconds (Patroni's minimum).
pub const TTL_S: u64 = 20;
/// Patroni's loop, seconds (its minimum).
pub const LOOP_WAIT_S: u64 = 1;
/// Patroni's retry timeout for etcd and PostgreSQL, seconds: the largest that
/// `loop_wait + 2 × retry_timeout ≤ ttl` allows (see the module's doc).
pub const RETRY_TIMEOUT_S: u64 = 9;
/// How long [`PatroniCluster::start`] waits for each part (etcd listening, a leader, a
/// streaming standby), milliseconds (a hang bound).
pub const START_TIMEOUT_MS: u64 = 90_000;
/// How long a REST call may take, milliseconds (a paused node's API never answers).
pub const REST_TIMEOUT_MS: u64 = 1_000;
/// Pause between two looks at the REST API, milliseconds (pacing only).
const POLL_MS: u64 = 100;

/// What [`PatroniCluster::start`] runs.
#[derive(Debug, Clone)]
pub struct PatroniOptions {
    /// The cluster's folder (created): etcd's, each node's and HAProxy's folders.
    pub dir: PathBuf,
    /// Patroni's `scope` (the cluster's name in etcd).
    pub scope: String,
    /// Patroni nodes, 2 or more; the first one started is the first leader.
    pub nodes: usize,
    /// `synchronous_mode` (Patroni names one standby in `synchronous_standby_names`
    /// and promotes only it).
    pub synchronous_mode: bool,
    /// `maximum_lag_on_failover`, bytes (Patroni's default 1 MiB when `None`).
    pub maximum_lag_on_failover: Option<u64>,
    /// `max_connections` of each PostgreSQL.
    pub max_connections: u32,
    /// As root, the unprivileged user every process runs as.
    pub server_user: String,
}

/// One Patroni node: its Patroni process and the PostgreSQL it manages.
pub struct Node {
    /// Its name (`n1`, `n2`, …), Patroni's `name`.
    pub name: String,
    /// PostgreSQL's port on 127.0.0.1.
    pub pg_port: u16,
    /// Patroni's REST API port on 127.0.0.1.
    pub api_port: u16,
    dir: PathBuf,
    patroni: Option<Child>,
}

impl Node {
    /// The node's PostgreSQL data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The pid of its running postmaster (`data/postmaster.pid`), if any.
    pub fn postmaster_pid(&self) -> Option<i32> {
        pid_in(&self.data_dir().join("postmaster.pid"))
    }

    /// The pid of its Patroni, while it runs.
    pub fn patroni_pid(&self) -> Option<i32> {
        self.patroni.as_ref().map(|child| child.id() as i32)
    }
}

/// Everything the cluster's processes need from the cache.
struct Installed {
    usr: PathBuf,
    python: PathBuf,
}

/// A running Patroni cluster.
pub struct PatroniCluster {
    options: PatroniOptions,
    installed: Installed,
    credentials: Option<Credentials>,
    etcd: Option<Child>,
    etcd_port: u16,
    haproxy: Option<Child>,
    haproxy_port: u16,
    nodes: Vec<Node>,
}

fn registry() -> &'static Mutex<Vec<PathBuf>> {
    static REGISTRY: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    &REGISTRY
}

/// Kills every Patroni cluster of this process (its postmasters and the processes in
/// its [`MARKER`]) and removes its folder: for signal handlers about to exit without
/// running destructors; safe to call more than once.
pub fn cleanup_all() {
    let dirs: Vec<PathBuf> = registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
        .collect();
    for dir in dirs {
        kill_cluster_processes(&dir);
        let _ = fs::remove_dir_all(&dir);
    }
}

/// The janitor's part: every Patroni cluster folder directly under `parent` (one with
/// a [`MARKER`]) has its processes killed; the folders are left for the caller.
pub fn kill_left_under(parent: &Path) {
    if let Ok(entries) = fs::read_dir(parent) {
        for entry in entries.flatten() {
            if entry.path().join(MARKER).is_file() {
                kill_cluster_processes(&entry.path());
            }
        }
    }
}

/// SIGKILL to every process in `dir`'s [`MARKER`] (etcd, Patroni, HAProxy) first, so
/// nothing starts a postmaster again, then to each node's postmaster and its children,
/// and waits for them.
fn kill_cluster_processes(dir: &Path) {
    if let Ok(text) = fs::read_to_string(dir.join(MARKER)) {
        for pid in text
            .lines()
            .filter_map(|line| line.split_whitespace().nth(1))
        {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if let Some(pid) = pid_in(&entry.path().join("data/postmaster.pid")) {
                kill_postmaster(pid);
            }
        }
    }
}

/// kill -9 of a postmaster and every process it started (stopped first, so it forks
/// nothing between the look at its children and the kill); waits until all are gone.
fn kill_postmaster(pid: i32) {
    if !is_postgres(pid) {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
    let children = children_of(pid);
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    for child in &children {
        let _ = kill(Pid::from_raw(*child), Signal::SIGKILL);
    }
    for process in children.iter().chain([&pid]) {
        wait_gone(*process, Duration::from_millis(START_TIMEOUT_MS));
    }
}

/// Whether `pid` runs a `postgres` (a pid file may name a pid reused since).
fn is_postgres(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.starts_with("postgres"))
}

fn pid_in(pid_file: &Path) -> Option<i32> {
    fs::read_to_string(pid_file)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The cache folder with the packages and Patroni's virtual environment
/// (`cache_dir/`[`CACHE_FOLDER`]), fetched first when missing.
///
/// Errors: [`ClusterError::Binaries`] (not cached and not root, `apt-get`, `dpkg`,
/// `venv` or `pip` failed).
pub fn fetch(cache_dir: &Path) -> Result<PathBuf, ClusterError> {
    resolve(cache_dir).map(|installed| {
        installed
            .usr
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    })
}

/// [`fetch`]'s folder as the programs the cluster runs.
///
/// Errors: [`ClusterError::Binaries`] (not cached and not root, `apt-get`, `dpkg`,
/// `venv` or `pip` failed).
fn resolve(cache_dir: &Path) -> Result<Installed, ClusterError> {
    let fetch = Fetch {
        folder: CACHE_FOLDER,
        packages: &PACKAGES,
        probe: "venv/pyvenv.cfg",
        finish: Some(&make_venv),
    };
    let folder = debian::resolve(cache_dir, &fetch)?;
    Ok(Installed {
        usr: folder.join("usr"),
        python: folder.join("venv/bin/python3"),
    })
}

/// `/usr/bin/python3 -m venv <staging>/venv` and `pip install` [`PATRONI_REQUIREMENT`]
/// into it. Patroni is run as `venv/bin/python3 -m patroni`, which finds the
/// environment by its `pyvenv.cfg` wherever the folder was renamed to.
fn make_venv(staging: &Path) -> Result<(), ClusterError> {
    let venv = staging.join("venv");
    let made = Command::new("/usr/bin/python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .map_err(|e| ClusterError::Binaries(format!("running /usr/bin/python3 -m venv: {e}")))?;
    if !made.status.success() {
        return Err(debian::failed("/usr/bin/python3 -m venv", &made));
    }
    let installed = Command::new(venv.join("bin/python3"))
        .args(["-m", "pip", "install", "-q", PATRONI_REQUIREMENT])
        .output()
        .map_err(|e| ClusterError::Binaries(format!("running pip: {e}")))?;
    if !installed.status.success() {
        return Err(debian::failed("pip install", &installed));
    }
    Ok(())
}

/// `GET path` on 127.0.0.1:`port`: the status and the body, or `None` when nothing
/// answered within [`REST_TIMEOUT_MS`] (a killed or paused node).
pub fn rest_get(port: u16, path: &str) -> Option<(u16, String)> {
    let timeout = Duration::from_millis(REST_TIMEOUT_MS);
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body)
        .to_owned();
    Some((status, body))
}

impl PatroniCluster {
    /// Fetches the programs if needed, starts etcd, the first node (waited for as the
    /// leader), the others (each waited for as a streaming standby; in
    /// `synchronous_mode` one of them the synchronous one) and HAProxy. Blocks about
    /// 10 s.
    ///
    /// Errors: [`ClusterError::Binaries`]; [`ClusterError::User`];
    /// [`ClusterError::Start`] with the log's tail of the part that did not come up
    /// within [`START_TIMEOUT_MS`].
    pub fn start(options: PatroniOptions) -> Result<PatroniCluster, ClusterError> {
        let installed = resolve(&crate::binaries::default_cache_dir())?;
        let credentials = if nix::unistd::geteuid().is_root() {
            Some(lookup_user(&options.server_user)?)
        } else {
            None
        };
        fs::create_dir_all(&options.dir).map_err(ClusterError::io(format!(
            "creating {}",
            options.dir.display()
        )))?;
        own(&options.dir, credentials)?;
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(options.dir.clone());
        let mut cluster = PatroniCluster {
            etcd_port: free_port()?,
            haproxy_port: 0,
            options,
            installed,
            credentials,
            etcd: None,
            haproxy: None,
            nodes: Vec::new(),
        };
        cluster.start_etcd()?;
        for n in 1..=cluster.options.nodes {
            cluster.add_node(n)?;
        }
        cluster.start_haproxy()?;
        // HAProxy counts a server up until its checks say otherwise: wait until only the
        // leader is, so no session of the caller's meets the standby.
        cluster.wait_routed_to(0, START_TIMEOUT_MS)?;
        Ok(cluster)
    }

    /// The nodes, in the order they were started (`n1` first).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// HAProxy's port on 127.0.0.1: connections go to the node whose `/primary`
    /// answered 200 at its last check.
    pub fn haproxy_port(&self) -> u16 {
        self.haproxy_port
    }

    /// The cluster's folder.
    pub fn dir(&self) -> &Path {
        &self.options.dir
    }

    /// The PostgreSQL binaries' folder (Debian's PostgreSQL 15).
    pub fn pg_bin(&self) -> PathBuf {
        self.installed.usr.join("lib/postgresql/15/bin")
    }

    /// `GET /patroni` of node `index`: its `role` (`primary`, `replica`), or `None`
    /// when its API does not answer.
    pub fn role(&self, index: usize) -> Option<String> {
        let (_, body) = rest_get(self.nodes[index].api_port, "/patroni")?;
        let value: serde_json::Value = serde_json::from_str(&body).ok()?;
        value.get("role")?.as_str().map(str::to_owned)
    }

    /// `GET /patroni` of node `index` as JSON, or `None` when its API does not answer.
    pub fn status(&self, index: usize) -> Option<serde_json::Value> {
        let (_, body) = rest_get(self.nodes[index].api_port, "/patroni")?;
        serde_json::from_str(&body).ok()
    }

    /// Each server of HAProxy's backend with its state (`UP`, `DOWN`, …), from
    /// `show stat` on its stats socket.
    pub fn routes(&self) -> Vec<(String, String)> {
        use std::os::unix::net::UnixStream;
        let socket = self.options.dir.join("haproxy/stats.sock");
        let Ok(mut stream) = UnixStream::connect(socket) else {
            return Vec::new();
        };
        let timeout = Some(Duration::from_millis(REST_TIMEOUT_MS));
        let _ = stream.set_read_timeout(timeout);
        let mut text = String::new();
        if stream.write_all(b"show stat\n").is_err() || stream.read_to_string(&mut text).is_err() {
            return Vec::new();
        }
        text.lines()
            .filter(|line| {
                line.starts_with("primary,")
                    && !line.contains("FRONTEND")
                    && !line.contains("BACKEND")
            })
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(',').collect();
                Some((fields.get(1)?.to_string(), fields.get(17)?.to_string()))
            })
            .collect()
    }

    /// Waits until HAProxy routes to node `index` only (it `UP`, every other not).
    ///
    /// Errors: [`ClusterError::Start`] when it does not within `within_ms`.
    pub fn wait_routed_to(&self, index: usize, within_ms: u64) -> Result<(), ClusterError> {
        let deadline = Instant::now() + Duration::from_millis(within_ms);
        loop {
            let routes = self.routes();
            let only = !routes.is_empty()
                && routes.iter().all(|(name, state)| {
                    (name == &self.nodes[index].name) == state.starts_with("UP")
                });
            if only {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ClusterError::Start(format!(
                    "HAProxy does not route to {} only within {within_ms} ms: {routes:?}",
                    self.nodes[index].name
                )));
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }

    /// The node whose `GET /primary` answers 200, if one does.
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&index| {
            rest_get(self.nodes[index].api_port, "/primary")
                .is_some_and(|(status, _)| status == 200)
        })
    }

    /// Waits until a node other than `other_than` answers `/primary` with 200; its index
    /// and how long that took, milliseconds (a note, never a claim).
    ///
    /// Errors: [`ClusterError::Start`] when none does within `within_ms`.
    pub fn wait_leader(
        &self,
        other_than: Option<usize>,
        within_ms: u64,
    ) -> Result<(usize, u64), ClusterError> {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(within_ms);
        loop {
            let found = (0..self.nodes.len()).find(|&index| {
                Some(index) != other_than
                    && rest_get(self.nodes[index].api_port, "/primary")
                        .is_some_and(|(status, _)| status == 200)
            });
            if let Some(index) = found {
                return Ok((index, started.elapsed().as_millis() as u64));
            }
            if Instant::now() > deadline {
                return Err(ClusterError::Start(format!(
                    "no leader but {other_than:?} within {within_ms} ms: {}",
                    self.log_tails()
                )));
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }

    /// Waits until node `index` reports itself a streaming replica (`GET /patroni`:
    /// `role` `replica`, `replication_state` `streaming`), and, when `synchronous`, the
    /// synchronous standby (`sync_standby`).
    ///
    /// Errors: [`ClusterError::Start`] when it does not within `within_ms`.
    pub fn wait_streaming(
        &self,
        index: usize,
        synchronous: bool,
        within_ms: u64,
    ) -> Result<(), ClusterError> {
        let deadline = Instant::now() + Duration::from_millis(within_ms);
        loop {
            let status = self.status(index).unwrap_or_default();
            let field = |name: &str| status.get(name).and_then(|v| v.as_str()).map(str::to_owned);
            let sync = status.get("sync_standby").and_then(|v| v.as_bool()) == Some(true);
            if field("role").as_deref() == Some("replica")
                && field("replication_state").as_deref() == Some("streaming")
                && (sync || !synchronous)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ClusterError::Start(format!(
                    "{} not a streaming{} standby within {within_ms} ms ({status}): {}",
                    self.nodes[index].name,
                    if synchronous { " synchronous" } else { "" },
                    self.log_tails()
                )));
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }

    /// kill -9 of node `index`'s Patroni and its postmaster with every process it
    /// started; returns once all are gone. The node stays in the list, stopped, until
    /// [`PatroniCluster::start_node`].
    pub fn kill_node(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        if let Some(mut child) = node.patroni.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = node.postmaster_pid() {
            kill_postmaster(pid);
        }
        self.write_marker();
    }

    /// SIGSTOP (`pause`) or SIGCONT to node `index`'s Patroni and postmaster: paused,
    /// its Patroni renews no lease and its postmaster accepts no connection, while the
    /// sessions already open (their backends) go on.
    ///
    /// Errors: [`ClusterError::Stop`] when the node has no Patroni or postmaster running.
    pub fn signal_node(&self, index: usize, pause: bool) -> Result<(), ClusterError> {
        let node = &self.nodes[index];
        let signal = if pause {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let (Some(patroni), Some(postmaster)) = (node.patroni_pid(), node.postmaster_pid()) else {
            return Err(ClusterError::Stop(format!("{} is not running", node.name)));
        };
        for pid in [patroni, postmaster] {
            kill(Pid::from_raw(pid), signal)
                .map_err(|e| ClusterError::Stop(format!("{signal} to {pid}: {e}")))?;
        }
        Ok(())
    }

    /// Starts node `index`'s Patroni again (after [`PatroniCluster::kill_node`]): it
    /// starts its PostgreSQL and rejoins as the leader's standby, through `pg_rewind`
    /// when its history diverged (`use_pg_rewind`).
    ///
    /// Errors: [`ClusterError::Start`] when Patroni cannot be spawned.
    pub fn start_node(&mut self, index: usize) -> Result<(), ClusterError> {
        let child = self.spawn_patroni(&self.nodes[index].dir)?;
        self.nodes[index].patroni = Some(child);
        self.write_marker();
        Ok(())
    }

    /// `patronictl switchover --leader <leader> --candidate <candidate> --force`, waited
    /// for: its output.
    ///
    /// Errors: [`ClusterError::Start`] when it fails.
    pub fn switchover(&self, leader: usize, candidate: usize) -> Result<String, ClusterError> {
        let config = self.nodes[leader].dir.join("patroni.yml");
        let mut command = Command::new(&self.installed.python);
        command
            .args(["-c", "from patroni.ctl import ctl; ctl()", "-c"])
            .arg(&config)
            .args(["switchover", &self.options.scope, "--leader"])
            .arg(&self.nodes[leader].name)
            .arg("--candidate")
            .arg(&self.nodes[candidate].name)
            .arg("--force")
            .env("HOME", &self.nodes[leader].dir);
        let output = command
            .output()
            .map_err(|e| ClusterError::Start(format!("running patronictl: {e}")))?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(ClusterError::Start(format!(
                "patronictl switchover ({}): {text} {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(text)
    }

    fn start_etcd(&mut self) -> Result<(), ClusterError> {
        let dir = self.options.dir.join("etcd");
        fs::create_dir_all(&dir).map_err(ClusterError::io("creating etcd's folder"))?;
        own(&dir, self.credentials)?;
        let peer_port = free_port()?;
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let mut command = Command::new(self.installed.usr.join("bin/etcd"));
        command
            .arg("--name=etcd")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
            ))
            .arg(format!(
                "--initial-cluster=etcd=http://127.0.0.1:{peer_port}"
            ));
        let child = self.spawn_logged(command, &dir.join("etcd.log"), "etcd")?;
        self.etcd = Some(child);
        self.write_marker();
        wait_port(self.etcd_port, &dir.join("etcd.log"), "etcd")
    }

    /// Writes node `n`'s configuration, starts its Patroni and waits until it leads
    /// (`n` = 1) or streams from the leader.
    fn add_node(&mut self, n: usize) -> Result<(), ClusterError> {
        let dir = self.options.dir.join(format!("n{n}"));
        fs::create_dir_all(&dir).map_err(ClusterError::io("creating a node's folder"))?;
        own(&dir, self.credentials)?;
        let (pg_port, api_port) = (free_port()?, free_port()?);
        let config = self.node_config(&format!("n{n}"), &dir, pg_port, api_port);
        write_owned(&dir.join("patroni.yml"), &config, self.credentials)?;
        let child = self.spawn_patroni(&dir)?;
        self.nodes.push(Node {
            name: format!("n{n}"),
            pg_port,
            api_port,
            dir,
            patroni: Some(child),
        });
        self.write_marker();
        if n == 1 {
            self.wait_leader(None, START_TIMEOUT_MS).map(|_| ())
        } else {
            self.wait_streaming(
                n - 1,
                self.options.synchronous_mode && n == 2,
                START_TIMEOUT_MS,
            )
        }
    }

    fn spawn_patroni(&self, dir: &Path) -> Result<Child, ClusterError> {
        let mut command = Command::new(&self.installed.python);
        command
            .args(["-m", "patroni"])
            .arg(dir.join("patroni.yml"))
            .env("HOME", dir);
        self.spawn_logged(command, &dir.join("patroni.stderr"), "patroni")
    }

    fn start_haproxy(&mut self) -> Result<(), ClusterError> {
        let dir = self.options.dir.join("haproxy");
        fs::create_dir_all(&dir).map_err(ClusterError::io("creating HAProxy's folder"))?;
        own(&dir, self.credentials)?;
        self.haproxy_port = free_port()?;
        let config = haproxy_config(self.haproxy_port, &self.nodes, &dir.join("stats.sock"));
        write_owned(&dir.join("haproxy.cfg"), &config, self.credentials)?;
        let mut command = Command::new(self.installed.usr.join("sbin/haproxy"));
        command.arg("-db").arg("-f").arg(dir.join("haproxy.cfg"));
        let child = self.spawn_logged(command, &dir.join("haproxy.log"), "haproxy")?;
        self.haproxy = Some(child);
        self.write_marker();
        wait_port(self.haproxy_port, &dir.join("haproxy.log"), "haproxy")
    }

    fn spawn_logged(
        &self,
        mut command: Command,
        log: &Path,
        what: &str,
    ) -> Result<Child, ClusterError> {
        let log =
            fs::File::create(log).map_err(ClusterError::io(format!("creating {what}'s log")))?;
        if let Some(Credentials { uid, gid }) = self.credentials {
            let _ = std::os::unix::fs::fchown(&log, Some(uid), Some(gid));
        }
        let err = log.try_clone().map_err(ClusterError::io("cloning a log"))?;
        command
            .env(
                "LD_LIBRARY_PATH",
                self.installed.usr.join("lib/x86_64-linux-gnu"),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        spawn_tied(command, self.credentials, libc::SIGKILL)
            .map_err(|e| ClusterError::Start(format!("spawning {what}: {e}")))
    }

    /// Patroni's configuration of one node (YAML; JSON is YAML).
    fn node_config(&self, name: &str, dir: &Path, pg_port: u16, api_port: u16) -> String {
        let mut dcs = serde_json::json!({
            "ttl": TTL_S,
            "loop_wait": LOOP_WAIT_S,
            "retry_timeout": RETRY_TIMEOUT_S,
            "synchronous_mode": self.options.synchronous_mode,
            "postgresql": {
                "use_pg_rewind": true,
                "use_slots": true,
                "parameters": {
                    "wal_log_hints": "on",
                    "max_connections": self.options.max_connections,
                    "fsync": "on",
                    "synchronous_commit": "on",
                },
            },
        });
        if let Some(lag) = self.options.maximum_lag_on_failover {
            dcs["maximum_lag_on_failover"] = lag.into();
        }
        let config = serde_json::json!({
            "scope": self.options.scope,
            "name": name,
            "log": {"level": "INFO", "dir": dir.display().to_string()},
            "restapi": {
                "listen": format!("127.0.0.1:{api_port}"),
                "connect_address": format!("127.0.0.1:{api_port}"),
            },
            "etcd3": {"hosts": format!("127.0.0.1:{}", self.etcd_port)},
            "bootstrap": {
                "dcs": dcs,
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
            },
            "postgresql": {
                "listen": format!("127.0.0.1:{pg_port}"),
                "connect_address": format!("127.0.0.1:{pg_port}"),
                "data_dir": dir.join("data").display().to_string(),
                "bin_dir": self.pg_bin().display().to_string(),
                "pgpass": dir.join("pgpass").display().to_string(),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "scratch"},
                    "replication": {"username": "replicator", "password": "scratch"},
                    "rewind": {"username": "postgres", "password": "scratch"},
                },
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
                "parameters": {"unix_socket_directories": dir.display().to_string()},
            },
        });
        config.to_string()
    }

    fn write_marker(&self) {
        let mut text = String::new();
        let named = [("etcd", &self.etcd), ("haproxy", &self.haproxy)];
        for (name, child) in named {
            if let Some(child) = child {
                text.push_str(&format!("{name} {}\n", child.id()));
            }
        }
        for node in &self.nodes {
            if let Some(pid) = node.patroni_pid() {
                text.push_str(&format!("patroni-{} {pid}\n", node.name));
            }
        }
        let _ = fs::write(self.options.dir.join(MARKER), text);
    }

    /// Node `index`'s Patroni log (`patroni.log` in its folder) as it is now: what the
    /// manager decided (`pg_rewind`, a refused leader race) in its own words.
    pub fn log_of(&self, index: usize) -> String {
        fs::read_to_string(self.nodes[index].dir.join("patroni.log")).unwrap_or_default()
    }

    /// The last lines of each node's Patroni log, for errors.
    pub fn log_tails(&self) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            for log in ["patroni.log", "patroni.stderr"] {
                if let Ok(content) = fs::read_to_string(node.dir.join(log)) {
                    let lines: Vec<&str> = content.lines().collect();
                    let tail = lines[lines.len().saturating_sub(6)..].join("\n");
                    text.push_str(&format!("\n[{} {log}]\n{tail}", node.name));
                }
            }
        }
        text
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        for child in [self.haproxy.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        for index in 0..self.nodes.len() {
            self.kill_node(index);
        }
        let _ = fs::remove_file(self.options.dir.join(MARKER));
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|dir| dir != &self.options.dir);
        let _ = fs::remove_dir_all(&self.options.dir);
    }
}

/// HAProxy in front of the nodes as Patroni's documentation deploys it: TCP, each node
/// checked with `GET /primary` on its REST port every 500 ms, only the one answering
/// 200 in the backend, and the sessions to a node marked down shut; a stats socket
/// (`stats`) for [`PatroniCluster::routes`].
fn haproxy_config(port: u16, nodes: &[Node], stats: &Path) -> String {
    let mut text = format!(
        "global\n    maxconn 200\n    stats socket {stats}\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30m\n    timeout server 30m\n    timeout check 1s\n\
         listen primary\n    bind 127.0.0.1:{port}\n    option httpchk GET /primary\n    http-check expect status 200\n\
         \x20   default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n",
        stats = stats.display()
    );
    for node in nodes {
        text.push_str(&format!(
            "    server {} 127.0.0.1:{} maxconn 100 check port {}\n",
            node.name, node.pg_port, node.api_port
        ));
    }
    text
}

fn own(path: &Path, credentials: Option<Credentials>) -> Result<(), ClusterError> {
    if let Some(Credentials { uid, gid }) = credentials {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(ClusterError::io(format!("chown {}", path.display())))?;
    }
    Ok(())
}

fn write_owned(
    path: &Path,
    text: &str,
    credentials: Option<Credentials>,
) -> Result<(), ClusterError> {
    fs::write(path, text).map_err(ClusterError::io(format!("writing {}", path.display())))?;
    own(path, credentials)
}

fn wait_port(port: u16, log: &Path, what: &str) -> Result<(), ClusterError> {
    let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let tail = fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = tail.lines().collect();
            return Err(ClusterError::Start(format!(
                "{what} not listening on {port} within {START_TIMEOUT_MS} ms: {}",
                lines[lines.len().saturating_sub(6)..].join("\n")
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
