//! The target as the suite was given it: a URL and optional commands. When a start
//! command is given the suite starts the target itself (`sh -c`, its own process group,
//! tied to the suite by a parent-death SIGKILL), restarts it after a kill, and kills its
//! group at the end, so nothing is left behind.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::http;

/// What the suite knows of a target.
#[derive(Debug, Clone, Default)]
pub struct TargetSpec {
    /// A short name for the evidence (`ledger-svc statements`, `python defect=…`).
    pub label: String,
    /// `http://HOST:PORT`, no trailing slash: where the debit contract is served.
    pub url: String,
    /// ledger-svc's admin listener: balances are granted there (`POST
    /// /accounts/{id}/grants`) when no setup command is given.
    pub admin_url: Option<String>,
    /// Starts the target (`sh -c`); run at the start and after each kill.
    pub start_command: Option<String>,
    /// Kills the target (`sh -c`, exit 0 expected); without it the suite SIGKILLs the
    /// process group it started, or [`TargetSpec::kill_pid`].
    pub kill_command: Option<String>,
    /// A pid to SIGKILL (a target the suite did not start).
    pub kill_pid: Option<u32>,
    /// `sh -c "<command> ACCOUNT AMOUNT"`: makes ACCOUNT exist and adds AMOUNT points.
    pub setup_command: Option<String>,
}

/// A target during a run.
pub struct Target {
    /// As given.
    pub spec: TargetSpec,
    http: reqwest::Client,
    child: Mutex<Option<Child>>,
    log: PathBuf,
    grants: AtomicU64,
    run_id: String,
}

impl Target {
    /// The target of `spec`, started and waited for when it has a start command and does
    /// not answer yet (one already running is used as it is; the start command then only
    /// brings it back after a kill); its output goes to `log`. `run_id` makes the setup's
    /// keys unique.
    ///
    /// Errors (as a reason): the URL has no host and port; the start failed or the
    /// target did not answer within [`crate::READY_TIMEOUT_MS`].
    pub async fn open(spec: TargetSpec, log: PathBuf, run_id: &str) -> Result<Target, String> {
        let target = Target {
            spec,
            http: http::client().map_err(|e| e.to_string())?,
            child: Mutex::new(None),
            log,
            grants: AtomicU64::new(0),
            run_id: run_id.to_owned(),
        };
        target.address()?;
        if target.spec.start_command.is_some() && !target.answers().await {
            target.start().await?;
        }
        Ok(target)
    }

    /// The target's socket address (for the proxy), from its URL.
    ///
    /// Errors: not `http://HOST:PORT`, or the host does not resolve.
    pub fn address(&self) -> Result<SocketAddr, String> {
        let rest = self
            .spec
            .url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{:?} is not an http:// URL", self.spec.url))?;
        let authority = rest.split('/').next().unwrap_or(rest);
        authority
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| format!("{authority:?} is not HOST:PORT that resolves"))
    }

    /// Whether the suite can kill the target.
    pub fn can_kill(&self) -> bool {
        self.spec.kill_command.is_some()
            || self.spec.start_command.is_some()
            || self.spec.kill_pid.is_some()
    }

    /// Whether the suite can start the target again.
    pub fn can_restart(&self) -> bool {
        self.spec.start_command.is_some()
    }

    /// Whether the suite can give an account points.
    pub fn can_setup(&self) -> bool {
        self.spec.setup_command.is_some() || self.spec.admin_url.is_some()
    }

    /// Starts the target with its start command and waits until it answers.
    ///
    /// Errors: no start command; spawning failed; not ready in time.
    pub async fn start(&self) -> Result<(), String> {
        let command = self
            .spec
            .start_command
            .as_deref()
            .ok_or("no --start-command")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("opening {}: {e}", self.log.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut shell = Command::new("sh");
        shell
            .arg("-c")
            .arg(command)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0);
        let child = scratch_pg::process::spawn_tied(shell, None, nix::libc::SIGKILL)
            .map_err(|e| format!("starting {command:?}: {e}"))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.wait_ready().await
    }

    /// Whether a balance read answers now with a status below 500.
    async fn answers(&self) -> bool {
        let request = self
            .http
            .get(format!("{}/accounts/acct-0001", self.spec.url));
        http::read(request).await.is_ok_and(|a| a.status < 500)
    }

    /// Polls a balance read until any answer below 500 arrives.
    async fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_millis(crate::READY_TIMEOUT_MS);
        let mut last = String::new();
        while Instant::now() < deadline {
            let request = self
                .http
                .get(format!("{}/accounts/acct-0001", self.spec.url));
            match http::read(request).await {
                Ok(answer) if answer.status < 500 => return Ok(()),
                Ok(answer) => last = format!("answered {}", answer.status),
                Err(reason) => last = reason,
            }
            if let Some(status) = self.exited() {
                return Err(format!(
                    "the target exited ({status}); see {}",
                    self.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "the target did not answer within {} ms ({last})",
            crate::READY_TIMEOUT_MS
        ))
    }

    /// The exit status of the started target, when it has exited.
    fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kills the target (kill command, else SIGKILL of the started group, else of the
    /// given pid) and waits until it no longer accepts connections. Returns what was done.
    ///
    /// Errors: no way to kill; the kill command failed; still accepting after
    /// [`crate::KILL_WAIT_MS`].
    pub async fn kill(&self) -> Result<String, String> {
        let done = if let Some(command) = &self.spec.kill_command {
            let status = Command::new("sh")
                .arg("-c")
                .arg(command)
                .status()
                .map_err(|e| format!("running the kill command: {e}"))?;
            if !status.success() {
                return Err(format!("the kill command {command:?} ended with {status}"));
            }
            self.reap();
            "kill command exit 0".to_owned()
        } else if let Some(pid) = self.started_pid() {
            killpg(Pid::from_raw(pid as i32), Signal::SIGKILL)
                .map_err(|e| format!("SIGKILL of group {pid}: {e}"))?;
            self.reap();
            "SIGKILL of the target's process group".to_owned()
        } else if let Some(pid) = self.spec.kill_pid {
            kill(Pid::from_raw(pid as i32), Signal::SIGKILL)
                .map_err(|e| format!("SIGKILL of {pid}: {e}"))?;
            "SIGKILL of the given pid".to_owned()
        } else {
            return Err("no --kill-command, --kill-pid or --start-command".to_owned());
        };
        self.wait_refused().await?;
        Ok(done)
    }

    fn started_pid(&self) -> Option<u32> {
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        child.as_ref().map(Child::id)
    }

    /// Waits for the started child after a kill (it has been signalled).
    fn reap(&self) {
        if let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    async fn wait_refused(&self) -> Result<(), String> {
        let address = self.address()?;
        let deadline = Instant::now() + Duration::from_millis(crate::KILL_WAIT_MS);
        while Instant::now() < deadline {
            if tokio::net::TcpStream::connect(address).await.is_err() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "the target still accepted connections {} ms after the kill",
            crate::KILL_WAIT_MS
        ))
    }

    /// Makes `account` exist with at least `at_least` points: reads its balance and, when
    /// short, has the setup command (or the admin URL) add the difference. Returns the
    /// balance read afterwards.
    ///
    /// Errors: the balance cannot be read; it is short and the target was given no way to
    /// add points (the reason then starts with [`crate::NOT_GIVEN`]: the case is not
    /// run); the setup failed.
    pub async fn ensure_balance(&self, account: &str, at_least: i64) -> Result<i64, String> {
        let now = match http::balance(&self.http, &self.spec.url, account).await {
            Ok(balance) => balance,
            Err(reason) if reason.contains("(404)") => 0,
            Err(reason) => return Err(reason),
        };
        if now >= at_least {
            return Ok(now);
        }
        if !self.can_setup() {
            return Err(format!(
                "{}{account} has {now} points, fewer than the {at_least} needed, and no \
                 --setup-command or --admin-url was given",
                crate::NOT_GIVEN
            ));
        }
        self.grant(account, at_least - now).await?;
        http::balance(&self.http, &self.spec.url, account).await
    }

    async fn grant(&self, account: &str, amount: i64) -> Result<(), String> {
        if let Some(command) = &self.spec.setup_command {
            let status = Command::new("sh")
                .arg("-c")
                .arg(format!("{command} {account} {amount}"))
                .status()
                .map_err(|e| format!("running the setup command: {e}"))?;
            return if status.success() {
                Ok(())
            } else {
                Err(format!("the setup command ended with {status}"))
            };
        }
        let admin = self.spec.admin_url.as_deref().unwrap_or_default();
        let n = self.grants.fetch_add(1, Ordering::SeqCst);
        let key = format!("setup-{}-{n}", self.run_id);
        let request = self
            .http
            .post(format!("{admin}/accounts/{account}/grants"))
            .header("X-Client-Id", "conformance-setup")
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(format!("amount={amount}"));
        match http::read(request).await {
            Ok(answer) if answer.status == 201 => Ok(()),
            Ok(answer) => Err(format!("grant answered {}", answer.short())),
            Err(reason) => Err(format!("grant: {reason}")),
        }
    }

    /// Kills the target's process group when the suite started it.
    pub fn stop(&self) {
        self.reap();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.reap();
    }
}
